"""Same-host bulk transfer: a large message is written into shared memory and only its name
travels over gRPC.

On this machine (gVisor) fresh memory costs about 1 ms per MB to fault in, which is why a
segment per message would buy little: the sender keeps a `Pool` of segments that it reuses, and
the receiver maps each segment once (`Reader`) and decodes the message as views into it -- no
copy on that side, and the callee may keep what it was given, because the sender writes into a
segment again only once the receiver has let go of every view (a finalizer on the message's
buffer says so in the segment's header).

Each segment's 64-byte header holds int64 words, written by one side each:

    SENT      sender:   the generation of the message in it now
    CLAIMED   receiver: the generation it mapped
    RELEASED  receiver: the generation whose views are all gone
    EXPIRY    sender:   monotonic ns by which the receiver must claim it, or never will
    HOLDER    receiver: its pid, written as it claims

A segment is free for the sender when RELEASED == SENT, or when the message was never claimed
and its expiry passed (the call was abandoned), or when the process holding it has died.

Nothing leaks after a crash: segments are named ``jaxdist-<pid namespace>-<creator pid>-<random>``;
a dying sender's are unlinked by whoever `sweep`s next in its pid namespace (servers do at start
and periodically, and pools when they grow), and a dying receiver's are reused by their sender
once it sees the peer gone.

/dev/shm is shared with every local user, so nothing found there is trusted: segments are
created 0600, and a name is opened only when it is this user's regular file, open to no one else
(never through a symlink); the sweep removes nothing else, and nothing of another pid namespace,
where a pid means another process. A message is claimed once, by the first reader. The token
still guards it all, and a server answers through shared memory only to a client that proved it
shares this host's (see `jaxdist.courier.server`).

Linux only (``/dev/shm``); elsewhere `available()` is False and messages take the socket.
"""

from __future__ import annotations

import functools
import mmap
import os
import re
import secrets
import stat
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent import futures

import numpy as np

from jaxdist.courier import wire

DIRECTORY = "/dev/shm"
PREFIX = "jaxdist-"
HEADER_BYTES = 64
SENT, CLAIMED, RELEASED, EXPIRY, HOLDER = range(5)
MIN_SEGMENT_BYTES = 1 << 20
RECLAIM_MARGIN_NS = 5_000_000_000  # after the expiry, before an unclaimed segment is reused
PROBE_BYTES = 16  # a probe file holds a nonce of this size, and nothing else is read back
_NAME = re.compile(rf"{PREFIX}(\d+)-(\d+)-[0-9a-f]{{16}}")  # pid namespace, creator pid, random
_MAPPINGS_KEPT = 256


def available() -> bool:
    return sys.platform.startswith("linux") and os.path.isdir(DIRECTORY)


@functools.cache
def pid_namespace() -> int:
    """Which pid namespace this process is in (0 where Linux does not say): pids name the
    peer holding a segment, so two processes share memory only when their pids mean the same
    processes, and the sweep judges only the segments of its own namespace."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _path(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a courier shared-memory segment")
    return os.path.join(DIRECTORY, name)


def unlink(name: str) -> None:
    """Remove a segment's name (its memory goes with the last mapping); gone already is fine."""
    try:
        os.unlink(_path(name))
    except FileNotFoundError:
        pass


def _create() -> tuple[str, int]:
    """A new segment of this process, named after it, open for its owner alone: (name, fd)."""
    name = f"{PREFIX}{pid_namespace()}-{os.getpid()}-{secrets.token_hex(8)}"
    return name, os.open(_path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)


def _open_own(name: str, flags: int) -> tuple[int, os.stat_result]:
    """The segment `name`, opened only if it is this user's regular file that no one else may
    open: any local user can plant a name in /dev/shm (a symlink to a private file, a file of
    their own to rewrite or truncate under us, a FIFO). ValueError otherwise."""
    try:
        descriptor = os.open(_path(name), flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ValueError(f"no shared-memory segment {name} on this host") from None
    except OSError as error:  # ELOOP: a symlink
        raise ValueError(f"{name} is not a shared-memory segment: {error.strerror}") from None
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid() or status.st_mode & 0o077:
        os.close(descriptor)
        raise ValueError(f"{name} is not a segment of this user (another user's file, or open to others)")
    return descriptor, status


def sweep() -> None:
    """Unlink the segments whose creator has died (a SIGKILLed node's): only this user's files
    of this pid namespace; whatever else carries a segment's name is skipped, never an error."""
    try:
        names = os.listdir(DIRECTORY)
    except OSError:
        return
    for name in names:
        match = _NAME.fullmatch(name)
        if match and int(match.group(1)) == pid_namespace() and not _alive(int(match.group(2))):
            _unlink_if_own(name)


def _unlink_if_own(name: str) -> None:
    path = _path(name)
    try:
        status = os.lstat(path)
        if stat.S_ISREG(status.st_mode) and status.st_uid == os.geteuid():
            os.unlink(path)
    except OSError:  # gone already, or turned into something we may not remove
        pass


def _header(memory: mmap.mmap) -> np.ndarray:
    return np.ndarray((HOLDER + 1,), np.int64, buffer=memory)


class _Segment:
    __slots__ = ("name", "capacity", "memory", "header")

    def __init__(self, capacity: int) -> None:
        self.name, descriptor = _create()
        self.capacity = capacity
        try:
            os.posix_fallocate(descriptor, 0, HEADER_BYTES + capacity)  # ENOSPC now, not SIGBUS later
            self.memory = mmap.mmap(descriptor, HEADER_BYTES + capacity)
        except OSError:
            unlink(self.name)
            raise
        finally:
            os.close(descriptor)
        self.header = _header(self.memory)

    def is_free(self, now_ns: int) -> bool:
        sent, claimed, released, expiry, holder = self.header.tolist()
        if released == sent:
            return True
        if claimed != sent:
            return now_ns > expiry + RECLAIM_MARGIN_NS
        return not _alive(holder)

    def close(self) -> None:
        unlink(self.name)
        self.header = None
        try:
            self.memory.close()
        except BufferError:  # a view of ours still exists; the mapping goes with it
            pass


class Pool:
    """The sender's segments, reused once the receiver has let go. At most `max_bytes` in all;
    a message that finds no room goes by the socket instead."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._segments: list[_Segment] = []
        self._lock = threading.Lock()
        _POOLS.add(self)

    def send(self, parts: Sequence[bytes | memoryview], size: int, expires_in: float) -> bytes | None:
        """Write the frame `parts` (of `size` bytes) into a segment, for a receiver that claims
        it within `expires_in` seconds; its reference, or None when there is no room."""
        segment = self._acquire(size, time.monotonic_ns() + int(expires_in * 1e9))
        if segment is None:
            return None
        try:
            _copy_into(segment.memory, HEADER_BYTES, parts)
        except BaseException:
            segment.header[RELEASED] = segment.header[SENT]
            raise
        return wire.shared_frame(segment.name, int(segment.header[SENT]), size)

    def close(self) -> None:
        with self._lock:
            segments, self._segments = self._segments, []
        for segment in segments:
            segment.close()

    def _acquire(self, size: int, expiry_ns: int) -> _Segment | None:
        now = time.monotonic_ns()
        with self._lock:
            fitting = [s for s in self._segments if s.capacity >= size and s.is_free(now)]
            segment = min(fitting, key=lambda s: s.capacity) if fitting else self._grow(size, now)
            if segment is None:
                return None
            segment.header[EXPIRY] = expiry_ns
            segment.header[SENT] = segment.header[SENT] + 1  # busy from here: RELEASED != SENT
            return segment

    def _grow(self, size: int, now: int) -> _Segment | None:
        granule = max(MIN_SEGMENT_BYTES, (1 << (size.bit_length() - 1)) // 8)  # 12.5% spare at most
        capacity = -(-size // granule) * granule
        if capacity > self._max_bytes:
            return None
        held = sum(s.capacity for s in self._segments)
        for idle in sorted((s for s in self._segments if s.is_free(now)), key=lambda s: s.capacity):
            if held + capacity <= self._max_bytes:
                break
            self._segments.remove(idle)
            idle.close()
            held -= idle.capacity
        if held + capacity > self._max_bytes:
            return None
        sweep()
        try:
            segment = _Segment(capacity)
        except OSError:  # /dev/shm full or missing: the socket still works
            return None
        self._segments.append(segment)
        return segment


def _copy_into(memory: mmap.mmap, offset: int, parts: Sequence[bytes | memoryview]) -> None:
    """The parts written one after another from `offset`; a large part is copied by several
    threads at once (numpy lets go of the GIL), since one core's copy falls well short of the
    memory's bandwidth: 16 MB took 3.3 ms on one thread here, 1.3 ms on two."""
    target = np.frombuffer(memory, np.uint8)
    pending = []
    for part in parts:
        source = np.frombuffer(wire.as_bytes_view(part), np.uint8)
        destination = target[offset:offset + len(source)]
        pieces = min(_COPIERS, len(source) // _COPY_PIECE_BYTES)
        if pieces > 1:
            bounds = np.linspace(0, len(source), pieces + 1).astype(int)
            pending += [_copier().submit(np.copyto, destination[a:b], source[a:b])
                        for a, b in zip(bounds[1:-1], bounds[2:])]
            np.copyto(destination[:bounds[1]], source[:bounds[1]])
        else:
            np.copyto(destination, source)
        offset += len(source)
    for copy in pending:
        copy.result()


_COPIERS = min(4, os.cpu_count() or 1)
_COPY_PIECE_BYTES = 2 << 20
_copier_pool: futures.ThreadPoolExecutor | None = None
_copier_lock = threading.Lock()


def _copier() -> futures.ThreadPoolExecutor:
    global _copier_pool
    with _copier_lock:
        if _copier_pool is None:
            _copier_pool = futures.ThreadPoolExecutor(_COPIERS - 1, thread_name_prefix="courier-copy")
        return _copier_pool


class Reader:
    """The receiver's side: segments mapped once, messages handed out as views into them."""

    def __init__(self) -> None:
        self._mappings: OrderedDict[str, mmap.mmap] = OrderedDict()
        self._lock = threading.Lock()

    def claim(self, frame: memoryview) -> np.ndarray:
        """The message a shared frame names, as a uint8 array; the segment is released to its
        sender when the array and every view of it are gone. ValueError when the frame names no
        segment of ours or a message no longer there."""
        name, generation, size = wire.parse_shared(frame)
        mapping = self._mapping(name)
        if size > len(mapping) - HEADER_BYTES:
            raise ValueError(f"segment {name} holds {len(mapping) - HEADER_BYTES} bytes, not {size}")
        header = _header(mapping)
        if int(header[SENT]) != generation:
            raise ValueError(f"segment {name} no longer holds that message")
        if int(header[CLAIMED]) == generation:  # its reader releases it: a second would free it under the first
            raise ValueError(f"the message in segment {name} was claimed already")
        if time.monotonic_ns() > int(header[EXPIRY]):
            raise ValueError(f"the message in segment {name} expired before it was read")
        header[HOLDER] = os.getpid()
        header[CLAIMED] = generation
        message = np.frombuffer(mapping, np.uint8, size, HEADER_BYTES)
        weakref.finalize(message, header.__setitem__, RELEASED, generation)
        return message

    def forget_unlinked(self) -> None:
        """Drop the mappings of segments their sender has unlinked (it closed or died), so
        their memory goes once the views still using it are gone."""
        with self._lock:
            for name in [name for name in self._mappings if not os.path.exists(os.path.join(DIRECTORY, name))]:
                del self._mappings[name]

    def _mapping(self, name: str) -> mmap.mmap:
        with self._lock:
            mapping = self._mappings.get(name)
            if mapping is not None:
                self._mappings.move_to_end(name)
                return mapping
        descriptor, status = _open_own(name, os.O_RDWR)
        try:
            if status.st_size < HEADER_BYTES:
                raise ValueError(f"{name} is too small to be a shared-memory segment")
            mapping = mmap.mmap(descriptor, status.st_size)
        finally:
            os.close(descriptor)
        with self._lock:
            self._mappings[name] = mapping
            while len(self._mappings) > _MAPPINGS_KEPT:
                self._mappings.popitem(last=False)
        return mapping


def probe_segment(nonce: bytes) -> str:
    """A segment holding `nonce` (`PROBE_BYTES`), for a peer to read back: proof that it shares
    this host's shared memory. The caller unlinks it (`unlink`). OSError when /dev/shm is full."""
    name, descriptor = _create()
    try:
        if os.write(descriptor, nonce) != PROBE_BYTES:
            raise OSError(f"a probe holds {PROBE_BYTES} bytes")
    except OSError:
        unlink(name)
        raise
    finally:
        os.close(descriptor)
    return name


def read_probe(name: str) -> bytes:
    """What a caller's probe file holds. Only a probe is read: a file of this user, open to no
    one else, of exactly `PROBE_BYTES` (a segment's header is not one). ValueError otherwise."""
    descriptor, status = _open_own(name, os.O_RDONLY)
    try:
        if status.st_size != PROBE_BYTES:
            raise ValueError(f"{name} is not a probe")
        return os.read(descriptor, PROBE_BYTES)
    finally:
        os.close(descriptor)


READER = Reader()
_POOLS: "weakref.WeakSet[Pool]" = weakref.WeakSet()


def _close_pools() -> None:
    for pool in list(_POOLS):
        pool.close()


if available():
    import atexit

    atexit.register(_close_pools)
