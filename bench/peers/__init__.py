"""Peers: the same workloads on another engine, in the same run (``--peers dbos``).

A peer runs in a virtual environment of its own (``~/.cache/dagq-bench/PEER-venv``,
or ``$DAGQ_BENCH_PEERS/PEER-venv``), made and filled from PyPI on first use, so
nothing of it enters dagq's environment. Its script (``bench/peers/PEER_peer.py``)
runs the workload ``runs`` times and prints one JSON line a run, with the final value
checked as dagq's are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.workloads import SHAPES, final

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
#: What each peer installs.
REQUIREMENTS = {"dbos": "dbos>=3.4,<4"}


class PeerUnavailable(Exception):
    """The peer cannot be installed or started here; the message says why, in one line."""


def venv_python(peer: str) -> Path:
    """The python of the peer's virtual environment, made and filled if need be."""
    base = Path(os.environ.get("DAGQ_BENCH_PEERS") or Path.home() / ".cache" / "dagq-bench")
    venv = base / f"{peer}-venv"
    python = venv / "bin" / "python"
    module = peer.replace("-", "_")
    if python.exists() and _runs(python, f"import {module}"):
        return python
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "-q", REQUIREMENTS[peer]],
    ]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900, check=False)
        except subprocess.TimeoutExpired:
            raise PeerUnavailable(f"{' '.join(step[:4])} … took over 900 s") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise PeerUnavailable(f"{' '.join(step[:4])} … failed: {last}")
    if not _runs(python, f"import {module}"):
        raise PeerUnavailable(f"{REQUIREMENTS[peer]} installed in {venv} but does not import")
    return python


def _runs(python: Path, code: str) -> bool:
    done = subprocess.run([str(python), "-c", code], capture_output=True, timeout=120, check=False)
    return done.returncode == 0


def measure(
    peer: str,
    *,
    workloads: list[str],
    sizes: list[str],
    runs: int,
    workers: int,
    summarise: Callable[[list[dict[str, Any]]], dict[str, Any]],
) -> tuple[list[dict[str, Any]], str | None]:
    """Each workload on ``peer``: the summaries, and a one-line note if it could not run."""
    if peer not in REQUIREMENTS:
        raise SystemExit(
            f"error: unknown peer {peer!r} in --peers (known: {', '.join(REQUIREMENTS)})"
        )
    try:
        python = venv_python(peer)
    except PeerUnavailable as exc:
        return [], f"peer {peer}: not measured — {exc}"
    summaries = []
    for workload in workloads:
        for size in sizes:
            shape, count = SHAPES[workload][size]
            task, expected = final(workload, size)
            spec = {
                "workload": workload,
                "size": size,
                "shape": list(shape),
                "count": count,
                "task": task,
                "expected": expected,
                "workers": workers,
                "runs": runs,
            }
            command = [str(python), str(HERE / f"{peer}_peer.py"), json.dumps(spec)]
            try:
                done = subprocess.run(
                    command, cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False
                )
            except subprocess.TimeoutExpired:
                return summaries, f"peer {peer}: {workload} {size} took over an hour; stopped"
            results = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
            if done.returncode != 0 or len(results) != runs:
                last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                return summaries, f"peer {peer}: {workload} {size} failed: {last}"
            for result in results:
                print(json.dumps(result), flush=True)
            summaries.append(summarise(results))
    return summaries, None
