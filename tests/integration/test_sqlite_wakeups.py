"""Wake-ups between real processes sharing one sqlite file (``dagq.stores.sqlite_wakeups``).

The peer is this file run as a script: it opens the store, does what it is told
(listen on a queue, or send to it when a line arrives on stdin) and says ``ready``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagq.stores.sqlite
from dagq.stores.base import Message, OutgoingMessage, Store, wakes_across_processes
from dagq.stores.sqlite import open_sqlite_store
from dagq.stores.sqlite_wakeups import own_prefix, wake_dir

SRC = Path(dagq.stores.sqlite.__file__).resolve().parents[2]
QUEUE = "jobs"
#: The waits below would last this long without a wake-up: far beyond any test's patience.
LONG_POLL_S = 60.0


# --- the peer (run in a child process) ------------------------------------------------


async def _peer(mode: str, db: str) -> None:
    store = open_sqlite_store(db)
    try:
        if mode == "listen":  # wait on the queue for ever (until killed)
            await store.queues.wait(QUEUE, 0.001)
            print("ready", flush=True)
            while True:
                await store.queues.wait(QUEUE, LONG_POLL_S)
        else:  # send one message per line read (commit: in a batch, as the runtime does)
            await store.queues.depth(QUEUE)  # opened: the sends below are quick
            print("ready", flush=True)
            loop = asyncio.get_running_loop()
            while await loop.run_in_executor(None, sys.stdin.readline):
                if mode.startswith("commit"):  # commit2: two messages at once
                    batch = store.batch()
                    messages = [OutgoingMessage(b"x")] * (2 if mode == "commit2" else 1)
                    if mode == "commitlong":  # the largest body handed, with a long id
                        messages = [OutgoingMessage(b"b" * 16_000, id="i" * 3_000)]
                    batch.send(QUEUE, messages)
                    await batch.commit()
                else:
                    await store.queues.send(QUEUE, [OutgoingMessage(b"x")])
                print("sent", flush=True)
    finally:
        await store.close()


# --- the tests ------------------------------------------------------------------------


@contextmanager
def peer(mode: str, db: Path) -> Iterator[subprocess.Popen[str]]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        [sys.executable, __file__, mode, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line == "ready", process.communicate(timeout=10)[1]
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def send_one(sender: subprocess.Popen[str]) -> None:
    assert sender.stdin is not None and sender.stdout is not None
    sender.stdin.write("send\n")
    sender.stdin.flush()
    assert sender.stdout.readline().strip() == "sent"


async def test_a_send_in_another_process_wakes_a_waiter_long_before_its_poll(
    tmp_path: Path,
) -> None:
    db = tmp_path / "store.db"
    store = open_sqlite_store(db)
    try:
        await store.queues.wait(QUEUE, 0.001)  # listening from here on
        assert wakes_across_processes(store.queues)  # so workers poll only as a fallback
        with peer("send", db) as sender:
            for _ in range(3):  # each wait is woken, not only the first
                assert (
                    await store.queues.receive(QUEUE, max_messages=10, visibility_timeout_s=30)
                    == []
                )
                waiter = asyncio.create_task(store.queues.wait(QUEUE, LONG_POLL_S))
                started = time.monotonic()
                await asyncio.to_thread(send_one, sender)
                await asyncio.wait_for(waiter, 10)
                assert time.monotonic() - started < 5  # a wake-up, not the 60 s poll
                got = await store.queues.receive(QUEUE, max_messages=10, visibility_timeout_s=30)
                assert [m.body for m in got] == [b"x"]
    finally:
        await store.close()


async def test_a_listener_that_comes_after_sends_is_rung_too(tmp_path: Path) -> None:
    """A sender keeps the listing of a queue's sockets while the folder is unchanged:
    one bound after its first sends is seen at the next (its folder changed)."""
    db = tmp_path / "store.db"
    store = open_sqlite_store(db)
    try:
        await store.queues.wait(QUEUE, 0.001)  # the queue's folder exists, with ours only
        for _ in range(3):  # nobody else listens: the listing is kept
            await store.queues.send(QUEUE, [OutgoingMessage(b"before")])
        channel = store.queues._channel  # type: ignore[attr-defined]
        assert channel.rung == 0
        with peer("listen", db):
            await store.queues.send(QUEUE, [OutgoingMessage(b"after")])
            assert channel.rung == 1  # the new listener was rung at once
    finally:
        await store.close()


async def test_without_the_channel_polling_still_delivers(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    wake_dir(db).write_text("not a folder")  # the sockets' folder cannot be made
    store = open_sqlite_store(db)
    try:
        with peer("send", db) as sender:
            await asyncio.to_thread(send_one, sender)  # before anyone listens
            delivered: list[bytes] = []
            deadline = time.monotonic() + 10
            while not delivered and time.monotonic() < deadline:
                got = await store.queues.receive(QUEUE, max_messages=10, visibility_timeout_s=30)
                delivered += [m.body for m in got]
                if not got:
                    await store.queues.wait(QUEUE, 0.05)  # a poll: a plain sleep here
            assert delivered == [b"x"]
            # Nothing rings: a wait lasts its whole timeout, even with a send meanwhile.
            waiter = asyncio.create_task(store.queues.wait(QUEUE, 1.0))
            started = time.monotonic()
            await asyncio.to_thread(send_one, sender)
            await waiter
            assert time.monotonic() - started >= 0.9
            assert not wakes_across_processes(store.queues)  # so workers poll soon
            got = await store.queues.receive(QUEUE, max_messages=10, visibility_timeout_s=30)
            assert [m.body for m in got] == [b"x"]
    finally:
        await store.close()
    assert wake_dir(db).is_file()


async def test_a_dead_listener_does_not_break_the_sender_and_its_socket_goes(
    tmp_path: Path,
) -> None:
    db = tmp_path / "store.db"
    store = open_sqlite_store(db)
    try:
        await store.queues.wait(QUEUE, 0.001)  # a live listener: this test
        with peer("listen", db) as dead:
            sockets = {p.name for p in wake_dir(db).glob("*/*")}
            assert any(name.startswith(f"{dead.pid}-") for name in sockets)
            dead.send_signal(signal.SIGKILL)
            dead.wait(timeout=10)
        left = [p for p in wake_dir(db).glob("*/*") if p.name.startswith(f"{dead.pid}-")]
        assert len(left) == 1  # killed: nobody removed it

        with peer("send", db) as sender:
            waiter = asyncio.create_task(store.queues.wait(QUEUE, LONG_POLL_S))
            await asyncio.to_thread(send_one, sender)
            await asyncio.wait_for(waiter, 10)  # the live listener was still rung
            await asyncio.to_thread(send_one, sender)  # and the sender goes on
        assert not left[0].exists()  # the sender removed the dead one's socket
        got = await store.queues.receive(QUEUE, max_messages=10, visibility_timeout_s=30)
        assert [m.body for m in got] == [b"x", b"x"]
    finally:
        await store.close()


async def test_a_closed_store_leaves_no_socket_behind(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    store = open_sqlite_store(db)
    await store.queues.wait(QUEUE, 0.001)
    mine = [p for p in wake_dir(db).glob("*/*") if p.name.startswith(own_prefix())]
    assert len(mine) == 1
    await store.close()
    assert not mine[0].exists()


async def test_a_forked_child_leaves_its_parents_wake_ups_alone(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    store = open_sqlite_store(db)
    try:
        await store.queues.wait(QUEUE, 0.001)  # the parent listens
        [mine] = [p for p in wake_dir(db).glob("*/*") if p.name.startswith(f"{os.getpid()}-")]
        pid = os.fork()
        if pid == 0:  # the child waits on the same queue in a loop of its own, and ends
            code = 1
            try:
                asyncio.run(store.queues.wait(QUEUE, 0.001))
                code = 0
            finally:
                os._exit(code)
        _, status = await asyncio.to_thread(os.waitpid, pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert mine.exists()  # the parent's socket is still there
        with peer("send", db) as sender:  # and a send elsewhere still wakes the parent
            waiter = asyncio.create_task(store.queues.wait(QUEUE, LONG_POLL_S))
            await asyncio.to_thread(send_one, sender)
            await asyncio.wait_for(waiter, 10)
    finally:
        await store.close()


async def _wait_woken(store: Store, sender: subprocess.Popen[str]) -> None:
    """Wait on the queue while ``sender`` commits one message; woken long before the poll."""
    waiter = asyncio.create_task(store.queues.wait(QUEUE, LONG_POLL_S))
    await asyncio.sleep(0)  # waiting: the socket says so
    await asyncio.to_thread(send_one, sender)
    await asyncio.wait_for(waiter, 10)


async def test_a_waiter_is_handed_the_message_another_process_commits(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    store = open_sqlite_store(db)
    try:
        assert await store.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=30) == []
        await store.queues.wait(QUEUE, 0.001)  # listening from here on
        with peer("commit", db) as sender:
            for _ in range(2):
                await _wait_woken(store, sender)
                # The message came in the wake-up: held here, received for this process.
                assert store.queues.claims.holding()  # type: ignore[attr-defined]
                assert (await store.queues.depth(QUEUE)).visible == 0
                [got] = await store.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=30)
                assert (got.body, got.dequeue_count) == (b"x", 1)
                assert await store.queues.delete(QUEUE, [got.receipt]) == 1
                assert (
                    await store.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=30) == []
                )
    finally:
        await store.close()


async def test_a_message_whose_id_and_body_overflow_a_datagram_is_received_as_before(
    tmp_path: Path,
) -> None:
    """A datagram holds the message's id beside its body: a long id on a body just under
    the bound made one the reader cut short and dropped, the message hidden (taken for
    the waiter) until its visibility timeout, the waiter never rung (review, session 28)."""
    db = tmp_path / "store.db"
    store = open_sqlite_store(db)
    try:
        assert await store.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=30) == []
        await store.queues.wait(QUEUE, 0.001)  # listening from here on
        with peer("commitlong", db) as sender:
            await _wait_woken(store, sender)
            [got] = await store.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=30)
            assert (got.id, len(got.body), got.dequeue_count) == ("i" * 3_000, 16_000, 1)
    finally:
        await store.close()


async def test_messages_sent_together_are_left_for_a_receive_to_take_together(
    tmp_path: Path,
) -> None:
    db = tmp_path / "store.db"
    store = open_sqlite_store(db)
    try:
        assert await store.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=30) == []
        await store.queues.wait(QUEUE, 0.001)
        with peer("commit2", db) as sender:
            await _wait_woken(store, sender)  # rung, handed nothing
            assert not store.queues.claims.holding()  # type: ignore[attr-defined]
            got = await store.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=30)
            assert [(m.body, m.dequeue_count) for m in got] == [(b"x", 1), (b"x", 1)]
    finally:
        await store.close()


async def test_a_message_handed_to_a_dead_waiter_is_visible_again_at_once() -> None:
    with tempfile.TemporaryDirectory(prefix="dq", dir="/tmp") as short:  # short socket paths
        db = Path(short) / "store.db"
        store = open_sqlite_store(db)
        try:
            await store.queues.wait(QUEUE, 0.001)  # makes the queue's folder
            (folder,) = wake_dir(db).iterdir()
            dead = folder / "1-0123abcd-dead-v30000"  # a waiter killed while waiting
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            listener.bind(str(dead))
            listener.close()
            dead.chmod(dead.stat().st_mode | stat.S_ISVTX)
            batch = store.batch()
            batch.send(QUEUE, [OutgoingMessage(b"x")])
            await batch.commit()
            assert not dead.exists()  # the sender found nobody there and removed it
            [got] = await store.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=30)
            assert (got.body, got.dequeue_count) == (b"x", 1)  # that delivery not counted
        finally:
            await store.close()


async def test_a_waiter_handed_a_message_it_cannot_use_gives_it_back(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    store = open_sqlite_store(db)
    try:
        assert await store.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=30) == []
        await store.queues.wait(QUEUE, 0.001)  # its socket says it takes messages for 30 s
        assert await store.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=5) == []
        with peer("commit", db) as sender:
            await _wait_woken(store, sender)  # handed for 30 s, while it now asks for 5
            deadline = time.monotonic() + 10
            got: list[Message] = []
            while not got and time.monotonic() < deadline:  # given back, then received
                got = await store.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=5)
                await asyncio.sleep(0.01)
            assert [(m.body, m.dequeue_count) for m in got] == [(b"x", 1)]
    finally:
        await store.close()


async def test_a_closing_store_gives_back_what_it_was_handed(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    store = open_sqlite_store(db)
    closed = False
    try:
        assert await store.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=30) == []
        await store.queues.wait(QUEUE, 0.001)
        with peer("commit", db) as sender:
            await _wait_woken(store, sender)
        assert (await store.queues.depth(QUEUE)).visible == 0  # held here
        await store.close()
        closed = True
        other = open_sqlite_store(db)
        try:
            [got] = await other.queues.receive(QUEUE, max_messages=4, visibility_timeout_s=30)
            assert (got.body, got.dequeue_count) == (b"x", 1)
        finally:
            await other.close()
    finally:
        if not closed:
            await store.close()


if __name__ == "__main__":
    asyncio.run(_peer(sys.argv[1], sys.argv[2]))


async def test_a_listener_with_this_pid_in_another_pid_namespace_is_rung() -> None:
    # Containers sharing the file: another process may have this very pid. Its socket
    # carries another process token, so a send here still rings it.
    with tempfile.TemporaryDirectory(prefix="dq", dir="/tmp") as short:  # short socket paths
        await _ring_a_twin(Path(short) / "store.db")


async def _ring_a_twin(db: Path) -> None:
    store = open_sqlite_store(db)
    try:
        await store.queues.wait(QUEUE, 0.001)  # makes the queue's folder
        (folder,) = wake_dir(db).iterdir()
        twin = folder / f"{os.getpid()}-0123abcd-twin"
        assert not twin.name.startswith(own_prefix())
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            listener.bind(str(twin))
            listener.settimeout(10)
            await store.queues.send(QUEUE, [OutgoingMessage(b"x")])
            assert await asyncio.to_thread(listener.recv, 64) == b"\x01"
        finally:
            listener.close()
    finally:
        await store.close()
