"""The web console in headless Firefox: Debian's ``firefox-esr`` driven over WebDriver
BiDi by ``puppeteer-core`` (an npm package under ``.ci``, run by Node), against a real
``dagq server``, ``dagq coordinator`` and ``dagq worker`` on one store.

Playwright's Firefox is a patched build that cannot be installed here, so the checks are
in ``console_firefox.mjs`` beside this file: the runs list loads and follows the stream
(a new run appears and completes without a reload), a run's DAG is drawn with its nodes
coloured by state as it progresses, its timeline has a bar per task, and a task's panel
shows its logs as they are written. The Chromium tests (``test_console.py``) check the
rest. Without Firefox, Node or puppeteer-core these tests skip here, and fail on CI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.cli_harness import ROOT, DagqCli
from tests.integration.test_console import ConsoleServer

pytestmark = pytest.mark.timeout(240)

FIREFOX = Path(os.environ.get("DAGQ_FIREFOX", "/usr/bin/firefox-esr"))
SCRIPT = Path(__file__).with_name("console_firefox.mjs")
PUPPETEER = ROOT / ".ci" / "node_modules" / "puppeteer-core"
#: How long a condition in the page may take to hold (a run's task on a loaded machine).
WAIT_MS = 30_000


def _firefox_or_skip() -> str:
    """The ``node`` executable; skips (fails on CI) when something is missing."""
    node = shutil.which("node")
    missing = None
    if not FIREFOX.exists():
        missing = f"{FIREFOX} is missing (apt-get install firefox-esr)"
    elif node is None:
        missing = "node is missing (apt-get install nodejs)"
    elif not PUPPETEER.is_dir():
        missing = "puppeteer-core is missing (npm ci --prefix .ci)"
    if node is not None and missing is None:
        return node
    if os.environ.get("CI") == "true":
        pytest.fail(f"the Firefox console test needs it on CI: {missing}")
    pytest.skip(f"the Firefox console test needs it: {missing}")


def test_the_console_works_in_firefox(tmp_path: Path) -> None:
    node = _firefox_or_skip()
    given = os.environ.get("DAGQ_TEST_ARTEFACTS")
    artefacts = Path(given) / "console" if given else tmp_path / "screenshots"
    artefacts.mkdir(parents=True, exist_ok=True)
    print(f"console screenshots: {artefacts}")
    (tmp_path / "run").mkdir()
    with DagqCli(tmp_path / "run") as cli:
        cli.start_coordinator(timeout_s=60)
        cli.start_worker("-c", "4", timeout_s=60)
        server = ConsoleServer(cli)
        server.start()
        go = cli.workdir / "go-firefox"
        held = {
            "name": "firefox-held",
            "tasks": [
                {  # runs until the browser lets it finish, so the page sees it running
                    "name": "prepare",
                    "cmd": f"echo first line; while [ ! -f {go} ]; do sleep 0.05; done; "
                    "echo second line",
                },
                {"name": "report", "depends_on": ["prepare"], "cmd": "echo reported"},
            ],
        }
        answer = httpx.post(
            f"{server.url}/v1/workflows",
            content=yaml.safe_dump(held, sort_keys=False),
            headers={"content-type": "application/yaml"},
            timeout=20,
        )
        assert answer.status_code == 202, answer.text
        config = {
            "url": server.url,
            "firefox": str(FIREFOX),
            "artefacts": str(artefacts),
            "held": {"id": answer.json()["id"], "go": str(go)},
            "submit": {
                "name": "firefox-list",
                "tasks": [
                    {"name": "fetch", "cmd": "echo fetched"},
                    {"name": "report", "depends_on": ["fetch"], "cmd": "echo reported"},
                ],
            },
            "waitMs": WAIT_MS,
        }
        try:
            code, out, err = _drive(node, config)
        finally:
            go.touch()  # the held task ends even if the script stopped before it let it
            assert server.stop() == 0
    print(out)
    assert code == 0, f"{out}\n{err}"
    assert "ok: no script error" in out


def _drive(node: str, config: dict[str, object]) -> tuple[int, str, str]:
    """Runs the script in a session of its own: on a timeout, it and the Firefox it
    started are killed together."""
    script = subprocess.Popen(
        [node, str(SCRIPT), json.dumps(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = script.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        os.killpg(script.pid, signal.SIGKILL)
        out, err = script.communicate()
        pytest.fail(f"the Firefox script did not finish in 200 s:\n{out}\n{err}")
    return script.returncode, out, err
