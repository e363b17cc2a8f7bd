"""``python -m bench.console``: how fast the web console draws a large DAG.

    python -m bench.console                     # 2,000 tasks, 3 times
    python -m bench.console --tasks 500 --repeat 1

A real ``dagq server`` (on a scratch SQLite store) and headless Debian chromium
(``/usr/bin/chromium``, driven by Playwright). The console's Preview page sends a
definition of ``--tasks`` tasks in layers of 50 (each task depends on two of the layer
above) to ``POST /v1/graph`` and draws it; the page's own performance marks give:

* **first paint** — from the graph's arrival (``dag-start``) to the frame after its
  nodes were inserted (``dag-first-paint``): the quick layered layout, drawn;
* **layout** — to ``dag-layout``: dagre's layout (in a Web Worker) drawn in its place.

Prints one JSON line with every figure (milliseconds), then the medians.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

CHROMIUM = "/usr/bin/chromium"
#: What a browser in a sandboxed CI container needs (no user namespaces, no GPU, no
#: network beyond 127.0.0.1); the console's tests launch it so too.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def layered_definition(tasks: int, width: int = 50) -> dict[str, Any]:
    """``tasks`` tasks in layers of ``width``, each depending on two of the layer above."""
    found: list[dict[str, Any]] = []
    for i in range(tasks):
        task: dict[str, Any] = {"name": f"step-{i:04d}", "cmd": "true"}
        if i >= width:
            above = i - width
            other = max(0, above + i % 3 - 1)
            task["depends_on"] = sorted({f"step-{above:04d}", f"step-{other:04d}"})
        found.append(task)
    return {"name": "console-big", "tasks": found}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _serve(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    store = f"sqlite:///{folder / 'dagq.db'}"
    server = subprocess.Popen(
        [sys.executable, "-m", "dagq", "server", "--store", store, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        if server.poll() is not None:
            break
        time.sleep(0.1)
    server.kill()
    raise SystemExit("error: dagq server did not start")


def measure(url: str, tasks: int, repeat: int) -> list[dict[str, float]]:
    """First paint and final layout, in milliseconds, once per repeat (a fresh page)."""
    from playwright.sync_api import sync_playwright

    text = json.dumps(layered_definition(tasks))
    found = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for _ in range(repeat):
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{url}/#/preview")
            page.get_by_label("Workflow definition (YAML or JSON)").fill(text)
            page.get_by_role("button", name="Preview graph").click()
            page.wait_for_function(
                "performance.getEntriesByName('dag-layout').length > 0", timeout=300_000
            )
            found.append(
                page.evaluate(
                    """() => ({
                        first_paint_ms: performance.measure(
                            'p', 'dag-start', 'dag-first-paint').duration,
                        layout_ms: performance.measure('l', 'dag-start', 'dag-layout').duration,
                        nodes: document.querySelectorAll('svg.dag g.node').length,
                    })"""
                )
            )
            page.close()
        browser.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.console", description=__doc__)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"error: {CHROMIUM} is missing (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as folder:
        server, url = _serve(Path(folder))
        try:
            runs = measure(url, args.tasks, args.repeat)
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(json.dumps({"tasks": args.tasks, "runs": runs}))
    for figure in ("first_paint_ms", "layout_ms"):
        values = [r[figure] for r in runs]
        print(f"{figure:>15}: median {statistics.median(values):7.0f}  max {max(values):7.0f}")


if __name__ == "__main__":
    main()
