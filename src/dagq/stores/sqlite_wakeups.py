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
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from dagq.stores.common import Wakeups, new_token

log = logging.getLogger("dagq.stores.sqlite")

#: Longest socket path ``bind``/``sendto`` take (``sun_path`` is 108 bytes with its NUL);
#: a longer one goes through ``/proc/self/fd`` (a descriptor of its folder).
_MAX_PATH = 100
_RING = b"\x01"
#: A folder's listing is used again for at most this long while it looks unchanged.
_RELIST_S = 1.0


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
        #: Wake-ups sent to other processes, and sockets of dead ones removed (for tests).
        self.rung = 0
        self.removed = 0

    @property
    def available(self) -> bool:
        """False once listening failed here (waits are plain sleeps then)."""
        return not self._failed

    # --- receiving ----------------------------------------------------------------

    def listen(self, queue: str) -> bool:
        """Listen for sends to ``queue`` on the running loop (idempotent); False when
        the channel is unavailable here and waits are plain sleeps."""
        if self._failed or self._closed:
            return False
        loop = asyncio.get_running_loop()
        held = self._listening.get(queue)
        if held is not None:
            if held[2] is loop and held[3] == os.getpid():
                return True
            self._unlisten(queue)  # another loop (it may be closed), or a forked child
        try:
            sock, path = self._bind(queue)
        except OSError as exc:
            self._failed = True
            log.info("no wake-ups across processes in %s (%s): waits poll", self._root, exc)
            return False
        loop.add_reader(sock.fileno(), self._readable, sock, queue)
        self._listening[queue] = (sock, path, loop, os.getpid())
        return True

    def _bind(self, queue: str) -> tuple[socket.socket, Path]:
        folder = _queue_dir(self._root, queue)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{own_prefix()}{new_token()[:8]}"
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
        # Drain every ring that piled up: one wake-up says it all.
        with contextlib.suppress(OSError):
            while sock.recv(64):
                pass
        self._wakeups.notify(queue)

    def _unlisten(self, queue: str) -> None:
        sock, path, loop, pid = self._listening.pop(queue)
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

    def ring(self, queues: set[str]) -> None:
        """Tell the other processes listening on ``queues`` that they may have messages.

        Called after the send committed, from any thread; never raises.
        """
        if self._closed:
            return
        for queue in queues:
            folder = _queue_dir(self._root, queue)
            names = self._others(folder)
            if names:
                self._ring_all(folder, names)

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

    def _ring_all(self, folder: Path, names: list[str]) -> None:
        with self._lock:
            if self._sender is None:
                self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sender.setblocking(False)
            sender = self._sender
        for name in names:
            path = folder / name
            try:
                with _address(path) as address:
                    sender.sendto(_RING, address)
                self.rung += 1
            except OSError as exc:
                if exc.errno == errno.ECONNREFUSED:  # its process is gone
                    with contextlib.suppress(OSError):
                        path.unlink()
                        self.removed += 1
                # EAGAIN: its buffer is full, a wake-up is pending there already;
                # ENOENT: it stopped listening meanwhile. Neither needs anything.

    def close(self) -> None:
        """Stop listening and remove this store's sockets."""
        with self._lock:
            self._closed = True
            for queue in list(self._listening):
                self._unlisten(queue)
            if self._sender is not None:
                self._sender.close()
                self._sender = None


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
