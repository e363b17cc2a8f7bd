"""The fault-injection store wrapper: rules parsed strictly, faults fired at the N-th call."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dagq.errors import StoreUnavailable, ValidationError
from dagq.stores.faults import FAULTS_ENV, Fault, parse_faults, with_faults
from dagq.stores.memory import open_memory_store

pytestmark = pytest.mark.timeout(30)


def test_a_plan_is_parsed_into_rules() -> None:
    assert parse_faults("batch.commit@3=kill-after, queues.receive@2+=fail,") == [
        Fault("batch.commit", 3, "kill-after"),
        Fault("queues.receive", 2, "fail", onwards=True),
    ]
    assert parse_faults("documents.put@1=delay:0.5") == [
        Fault("documents.put", 1, "delay", seconds=0.5)
    ]
    assert parse_faults("queues.receive@2-4=fail") == [Fault("queues.receive", 2, "fail", last=4)]


@pytest.mark.parametrize(
    "bad",
    ["put@1=fail", "documents.put@0=fail", "documents.put@1=explode", "documents.put@3-2=fail"],
)
def test_a_malformed_rule_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(f"{FAULTS_ENV}: {bad!r}")):
        parse_faults(bad)


async def test_a_failure_fires_at_the_nth_call_only_or_from_it_onwards() -> None:
    store = with_faults(
        open_memory_store(),
        parse_faults("documents.put@2=fail,index.get@2+=fail,documents.get@1-2=fail"),
    )
    await store.documents.put("a", b"1")
    with pytest.raises(StoreUnavailable, match=r"injected fault: documents\.put call 2"):
        await store.documents.put("b", b"2")
    await store.documents.put("c", b"3")
    for _ in range(2):  # an outage of two calls, then back
        with pytest.raises(StoreUnavailable):
            await store.documents.get("b")
    assert await store.documents.get("b") is None  # a failed call writes nothing
    await store.index.get("x")
    for _ in range(3):
        with pytest.raises(StoreUnavailable):
            await store.index.get("x")


@pytest.mark.parametrize(("action", "written"), [("kill", False), ("kill-after", True)])
def test_a_kill_ends_the_process_before_or_after_the_call(
    tmp_path: Path, action: str, written: bool
) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    script = (
        "import asyncio\n"
        "from dagq.stores import open_store\n"
        f"store = open_store({url!r})\n"
        "asyncio.run(store.documents.put('k', b'v'))\n"
    )
    env = {**os.environ, FAULTS_ENV: f"documents.put@1={action}"}
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=20, check=False)
    assert done.returncode == -9

    import asyncio

    from dagq.stores import open_store

    async def look() -> bool:
        store = open_store(url)
        try:
            return await store.documents.get("k") is not None
        finally:
            await store.close()

    assert asyncio.run(look()) is written
