"""Wake-ups across processes for the sqlite store: datagrams in a directory beside the file.

Processes sharing one sqlite file are on one host, so they can ring each other
directly. A process that waits on a queue binds a Unix datagram socket in that
queue's folder of ``<file>-wake/`` (one folder per queue, one socket per waiting
store, named ``PID-PROCESS-SOCKET``: its process id and a token drawn once per process,
so processes of different PID namespaces — containers sharing the file — never take
each other's sockets for their own); a store that commits a send to the queue lists the
folder and sends each socket of another process one byte, from the writer thread,
right after the commit. The receiver's event loop reads it and wakes the queue's
waiters (:class:`~dagq.stores.common.Wakeups`), so a chain of tasks across processes
is not paced by a polling interval.

It is only a hint, never the truth: a waiter still polls with its own interval, so
a wake-up that never comes costs one poll and loses nothing. That covers a send
made before the receiver first listened, a folder that cannot be made (a read-only
directory: then nothing listens, and waits are plain sleeps), and a full socket
buffer (the receiver has a wake-up pending already). A dead process leaves its
socket file behind; a sender finds nobody bound there (``ECONNREFUSED``) and
removes it. See docs/architecture.md, "Wake-ups across processes".
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from dagq.stores.common import Wakeups, new_token
from dagq.stores.sqlite_handover import (
    DATAGRAM_BYTES,
    Delivery,
    Handed,
    Target,
    decode,
    encode,
    vt_ms_of,
    vt_suffix,
)

log = logging.getLogger("dagq.stores.sqlite")

#: Longest socket path ``bind``/``sendto`` take (``sun_path`` is 108 bytes with its NUL);
#: a longer one goes through ``/proc/self/fd`` (a descriptor of its folder).
_MAX_PATH = 100
_RING = b"\x01"
#: A folder's listing is used again for at most this long while it looks unchanged.
_RELIST_S = 1.0
#: Set on a socket's file while a wait on its queue is under way: a sender may hand
#: it a message (:mod:`dagq.stores.sqlite_handover`). It changes no permission.
_WAITING = stat.S_ISVTX


#: The prefix of this process's socket names, by pid (a forked child draws its own).
_OWN: dict[int, str] = {}


def own_prefix() -> str:
    """``PID-TOKEN-``: what the names of this process's sockets start with."""
    pid = os.getpid()
    found = _OWN.get(pid)
    if found is None:
        found = _OWN[pid] = f"{pid}-{new_token()[:8]}-"
    return found


def wake_dir(file: Path) -> Path:
    """The folder of a store file's wake-up sockets: ``<file>-wake``, beside it."""
    return file.with_name(file.name + "-wake")


def _queue_dir(root: Path, queue: str) -> Path:
    # A digest keeps any queue name short and safe as a file name.
    return root / hashlib.blake2b(queue.encode(), digest_size=8).hexdigest()


class WakeChannel:
    """One store's end of the channel: it listens on the queues it waits on, and rings
    the other processes' listeners of the queues it sends to."""

    def __init__(self, file: Path, wakeups: Wakeups) -> None:
        self._root = wake_dir(file)
        self._wakeups = wakeups
        self._lock = threading.Lock()
        #: queue -> (socket, its path, the loop that reads it, the process that bound it)
        self._listening: dict[str, tuple[socket.socket, Path, asyncio.AbstractEventLoop, int]] = {}
        self._failed = False
        self._closed = False
        self._sender: socket.socket | None = None
        #: By queue folder: its version (mtime, size, inode; the pid), when listed, the names.
        self._listed: dict[Path, tuple[tuple[int, int, int, int], float, list[str]]] = {}
        #: Waits under way on each queue (its socket is marked waiting while any is).
        self._waits: dict[str, int] = {}
        #: The mode of each socket that takes hand-overs, when not waiting.
        self._modes: dict[str, int] = {}
        #: Turns of the targets a send hands to (several waiters share the messages).
        self._turn = 0
        #: Told of the messages handed to this process, by queue (from the loop).
        self.on_handed: Callable[[str, list[Handed]], None] | None = None
        #: Wake-ups sent to other processes, and sockets of dead ones removed (for tests).
        self.rung = 0
        self.removed = 0

    @property
    def available(self) -> bool:
        """False once listening failed here (waits are plain sleeps then)."""
        return not self._failed

    # --- receiving ----------------------------------------------------------------

    def listen(self, queue: str, vt_s: float | None = None) -> bool:
        """Listen for sends to ``queue`` on the running loop (idempotent); False when
        the channel is unavailable here and waits are plain sleeps. ``vt_s``: the
        visibility timeout this process's receives ask for there, if known; senders
        then hand it messages while it waits (:meth:`waiting`)."""
        if self._failed or self._closed:
            return False
        loop = asyncio.get_running_loop()
        held = self._listening.get(queue)
        if held is not None:
            if held[2] is loop and held[3] == os.getpid():
                return True
            self._unlisten(queue)  # another loop (it may be closed), or a forked child
        try:
            sock, path = self._bind(queue, vt_s)
        except OSError as exc:
            self._failed = True
            log.info("no wake-ups across processes in %s (%s): waits poll", self._root, exc)
            return False
        loop.add_reader(sock.fileno(), self._readable, sock, queue)
        self._listening[queue] = (sock, path, loop, os.getpid())
        if vt_s is not None:  # it takes hand-overs: its mode says when it waits
            with contextlib.suppress(OSError):
                self._modes[queue] = stat.S_IMODE(os.lstat(path).st_mode) & ~_WAITING
        return True

    def _bind(self, queue: str, vt_s: float | None) -> tuple[socket.socket, Path]:
        folder = _queue_dir(self._root, queue)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{own_prefix()}{new_token()[:8]}{vt_suffix(vt_s)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            with _address(path) as address:
                sock.bind(address)
        except BaseException:
            sock.close()
            raise
        return sock, path

    def _readable(self, sock: socket.socket, queue: str) -> None:
        # Drain every ring that piled up: one wake-up says it all (with the messages
        # handed over, kept for the next receive before its waiters wake).
        handed = _drain(sock)
        if handed and self.on_handed is not None:
            self.on_handed(queue, handed)
        self._wakeups.notify(queue)

    def waiting(self, queue: str, on: bool) -> None:
        """A wait on ``queue`` begins (``on``) or ends: while any is under way, this
        process's socket says so, and senders may hand it messages."""
        before = self._waits.get(queue, 0)
        now = before + (1 if on else -1)
        self._waits[queue] = max(0, now)
        if (before == 0) == (now == 0):
            return
        mode = self._modes.get(queue)
        held = self._listening.get(queue)
        if mode is not None and held is not None and held[3] == os.getpid():
            with contextlib.suppress(OSError):
                os.chmod(held[1], mode | _WAITING if now else mode)

    def seal(self) -> list[tuple[str, Handed]]:
        """Take no more hand-overs (the store closes): this process's sockets are
        removed, so a sender finds nobody there and gives its message back itself;
        what was handed over before and not read yet, to give back."""
        left: list[tuple[str, Handed]] = []
        with self._lock:
            for queue, (sock, path, _, pid) in self._listening.items():
                if pid != os.getpid():
                    continue
                with contextlib.suppress(OSError):
                    path.unlink()
                left += [(queue, h) for h in _drain(sock)]
        return left

    def _unlisten(self, queue: str) -> None:
        sock, path, loop, pid = self._listening.pop(queue)
        self._modes.pop(queue, None)
        if pid != os.getpid():
            # Inherited from the parent across a fork: the socket, its file and the
            # loop's selector (an epoll set fork shares) are still the parent's.
            sock.close()
            return
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError, ValueError):
                loop.remove_reader(sock.fileno())
        sock.close()
        with contextlib.suppress(OSError):
            path.unlink()

    # --- sending ------------------------------------------------------------------

    def ring(self, queues: set[str], *, skip: frozenset[Path] = frozenset()) -> None:
        """Tell the other processes listening on ``queues`` that they may have messages
        (but those at ``skip``: handed some already).

        Called after the send committed, from any thread; never raises.
        """
        if self._closed:
            return
        for queue in queues:
            folder = _queue_dir(self._root, queue)
            names = self._others(folder)
            if skip:
                names = [n for n in names if folder / n not in skip]
            if names:
                self._ring_all(folder, names)

    def targets(self, queue: str) -> list[Target]:
        """The sockets of other processes waiting on ``queue`` now that take messages
        handed over, in turns (the first is handed the first message). From the writer
        thread, inside the transaction that sends."""
        if self._closed:
            return []
        folder = _queue_dir(self._root, queue)
        found: list[Target] = []
        for name in self._others(folder):
            vt_ms = vt_ms_of(name)
            if vt_ms is None:
                continue
            path = folder / name
            try:
                if not os.lstat(path).st_mode & _WAITING:
                    continue
            except OSError:
                continue
            found.append(Target(path, vt_ms))
        if len(found) > 1:
            self._turn += 1
            turn = self._turn % len(found)
            found = found[turn:] + found[:turn]
        return found

    def hand(self, deliveries: list[Delivery]) -> list[Delivery]:
        """Send each handed message to its target, after the commit that took it for
        it; those that could not be sent (to make visible again). Never raises."""
        sender = self._sending()
        failed: list[Delivery] = []
        for delivery in deliveries:
            if not self._send(sender, delivery.target.path, encode(delivery.handed)):
                failed.append(delivery)
        return failed

    def _others(self, folder: Path) -> list[str]:
        """The sockets of other processes in ``folder``: listed again only when the
        folder changed (a socket bound or removed), or a second after the last listing
        (a timestamp too coarse to show two changes in a row). Most commits then cost
        one ``stat``, not a listing (three system calls and the names)."""
        try:
            st = os.stat(folder)
        except OSError:
            return []  # nobody ever listened on this queue (or no folder at all)
        version = (st.st_mtime_ns, st.st_size, st.st_ino, os.getpid())  # a fork lists anew
        now = time.monotonic()
        listed = self._listed.get(folder)
        if listed is not None and listed[0] == version and now - listed[1] < _RELIST_S:
            return listed[2]
        mine = own_prefix()
        try:
            names = [e.name for e in os.scandir(folder) if not e.name.startswith(mine)]
        except OSError:
            return []
        self._listed[folder] = (version, now, names)
        return names

    def _sending(self) -> socket.socket:
        with self._lock:
            if self._sender is None:
                self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sender.setblocking(False)
            return self._sender

    def _ring_all(self, folder: Path, names: list[str]) -> None:
        sender = self._sending()
        for name in names:
            self._send(sender, folder / name, _RING)

    def _send(self, sender: socket.socket, path: Path, data: bytes) -> bool:
        """One datagram; whether it went."""
        try:
            with _address(path) as address:
                sender.sendto(data, address)
            self.rung += 1
            return True
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED:  # its process is gone
                with contextlib.suppress(OSError):
                    path.unlink()
                    self.removed += 1
            # EAGAIN: its buffer is full, a wake-up is pending there already;
            # ENOENT: it stopped listening meanwhile. Neither needs more for a ring.
            return False

    def close(self) -> None:
        """Stop listening and remove this store's sockets."""
        with self._lock:
            self._closed = True
            for queue in list(self._listening):
                self._unlisten(queue)
            if self._sender is not None:
                self._sender.close()
                self._sender = None


def _drain(sock: socket.socket) -> list[Handed]:
    """Read every datagram waiting on ``sock``: the messages handed over in them."""
    handed: list[Handed] = []
    with contextlib.suppress(OSError):
        while data := sock.recv(DATAGRAM_BYTES):
            found = decode(data)
            if found is not None:
                handed.append(found)
    return handed


@contextlib.contextmanager
def _address(path: Path) -> Iterator[str]:
    """The address to bind or send to for ``path``; a path too long for a socket
    address goes through a descriptor of its folder."""
    text = str(path)
    if len(os.fsencode(text)) <= _MAX_PATH:
        yield text
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)
