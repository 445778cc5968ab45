"""The cross-process writer gate: an in-process lock plus ``flock`` on ``<db>.gate``.

The lock is the ``flock``: the kernel drops it when its holder dies, so a
``kill -9`` never wedges the fleet.  It is only ever taken with ``LOCK_NB`` by
the thread that will use it.  A writer that finds it taken retries for 100 µs
(a hold lasts tens of microseconds, and a lock taken while running costs no
wake-up: closed loop at 64 processes, 7.5k -> 16k writes/s), then sleeps in the
kernel on a futex in the gate file itself (a *doorbell*), which every release
rings, waking one waiter the moment the gate is free, with the waiter's own
deadline as the futex timeout.

Why not a blocking ``flock``: it has no timeout, so it must run in a helper
thread, and that thread then holds the gate while the caller's thread waits to
be scheduled: a convoy.  Measured at 64 processes with 10 ms think time on 2
cores (benchmarks/bench_engine.py), the helper-thread gate gave 4,010 writes/s
and a 40 ms p99 against 5,953 writes/s and 4.6 ms for a lock taken by the
running caller itself.  Where no futex is available, waiters poll every 0.5 ms.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import platform
import threading
import time
from collections.abc import Callable
from typing import Any

#: The gate file, every byte of it placed here (docs/design.md, "The gate file"); sparse:
#: only the pages processes touch take space.  The header page, [0, BOARD_OFFSET):
#:
#:   0      u32  the doorbell: rung by every release of the gate (this module)
#:   4      u32  the WAL's size in frames, as its last committer saw it (sqlite.py)
#:   8      u32  the combiner's barrier word, only ever FUTEX_WAKEd (combine.py)
#:   12     u32  the combiner's bell: waiters of the board sleep on it (combine.py)
#:   16     u32  the count of board slots ever quarantined (board.py)
#:   20     u32  the moved word: raised when a tool of ours moves the file (MOVED_AT)
#:   24     ...  free
#:   64     u32 x BOARD_SLOTS  the board's slot states (board.py)
#:   576    ...  free
#:   1024   u32 x NOTIFY_WORDS  the notification words of channels (notify.py)
#:   1056   ...  free
#:   2048   u8 x (BOARD_SLOTS + 1)  who sleeps on the doorbell (SLEEPERS_AT)
#:   2177   ...  free, to 4096
#:
#: then the group-commit board's slots (board.py), SLOT_BYTES each from BOARD_OFFSET.
BARRIER_AT = 8
BELL_AT = 12
QUARANTINED_AT = 16
STATES_AT = 64
BOARD_OFFSET = 4096
BOARD_SLOTS = 128
SLOT_BYTES = 64 * 1024
GATE_FILE_BYTES = BOARD_OFFSET + BOARD_SLOTS * SLOT_BYTES
#: Channels' notification words (engine/notify.py): a channel rings the word its name
#: hashes to; channels that share a word wake each other's waiters (who find nothing).
NOTIFY_AT = 1024
NOTIFY_WORDS = 8
#: A waiter re-checks the lock at least this often, so a holder killed before
#: it could ring the doorbell delays the next writer by this much at most.
_MAX_NAP = 0.05
_POLL = 0.0005
_SPIN = 0.0001
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_FUTEX_WAIT_BITSET, _FUTEX_WAKE_BITSET = 9, 10
_ALL_BITS = 0xFFFFFFFF
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "riscv64": 98}.get(platform.machine())
#: Where waiters say they sleep on the doorbell: one byte per board slot (a process
#: with a slot) and one for any process without (set once, never cleared).  A release
#: rings only when one is set: a FUTEX_WAKE per write with nobody asleep was 1-2 us of
#: every lone writer's (issue 24).
SLEEPERS_AT = 2048
#: Raised by a tool of ours that moves or removes the database (an archive, maintain):
#: a writer or reader that sees it change looks whether its file is still at the path
#: (``Database``: ``FileMoved``) instead of an ``os.stat`` per write.
MOVED_AT = 20
_ANONYMOUS = BOARD_SLOTS
#: x86 orders loads after loads and stores after stores; the one reordering that
#: matters here (a load before an earlier store) is ruled out by a locked instruction
#: between them, which releasing a threading.Lock is.  Elsewhere: always ring.
_RING_ALWAYS = platform.machine() not in ("x86_64", "AMD64", "i686")


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_syscall() -> Callable[..., int] | None:
    if _SYS_FUTEX is None or os.uname().sysname != "Linux":
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


_syscall = _load_syscall()


def futex_wait(addr: ctypes.c_void_p, value: int, seconds: float, spec: _Timespec) -> None:
    """Sleep while the 32-bit word at *addr* holds *value*, at most *seconds*."""
    if _syscall is None:
        time.sleep(min(seconds, _POLL))
        return
    spec.tv_sec = int(seconds)
    spec.tv_nsec = int((seconds % 1) * 1e9)
    _syscall(_SYS_FUTEX, addr, _FUTEX_WAIT, ctypes.c_uint32(value), ctypes.byref(spec), None, 0)


def futex_wake(addr: ctypes.c_void_p, count: int = 1) -> None:
    """Wake up to *count* sleepers on the word at *addr*."""
    if _syscall is not None:
        _syscall(_SYS_FUTEX, addr, _FUTEX_WAKE, count, None, None, 0)


def futex_wait_bits(
    addr: ctypes.c_void_p, value: int, bits: int, seconds: float, spec: _Timespec
) -> None:
    """``futex_wait`` that only a wake naming one of *bits* ends (FUTEX_WAIT_BITSET),
    so that many waiters can share one word and one syscall wakes a chosen few."""
    if _syscall is None:
        time.sleep(min(seconds, _POLL))
        return
    until = time.monotonic() + seconds  # the bitset wait's timeout is CLOCK_MONOTONIC, absolute
    spec.tv_sec = int(until)
    spec.tv_nsec = int((until % 1) * 1e9)
    _syscall(
        _SYS_FUTEX,
        addr,
        _FUTEX_WAIT_BITSET,
        ctypes.c_uint32(value),
        ctypes.byref(spec),
        None,
        ctypes.c_uint32(bits),
    )


def futex_wake_bits(addr: ctypes.c_void_p, bits: int) -> None:
    """Wake every sleeper on the word at *addr* whose bits meet *bits*."""
    if _syscall is not None and bits:
        _syscall(
            _SYS_FUTEX, addr, _FUTEX_WAKE_BITSET, 0x7FFFFFFF, None, None, ctypes.c_uint32(bits)
        )


def futex_available() -> bool:
    return _syscall is not None


def _allocated(fd: int, offset: int, length: int) -> bool:
    """Whether the bytes [offset, offset + length) of *fd* have blocks (no hole): then
    nothing is allocated, and the file is not changed (its mtime included).  A file
    system that cannot tell says it is all data."""
    try:
        return os.lseek(fd, offset, os.SEEK_HOLE) >= offset + length
    except OSError:
        return False


def announce_moved(gate_path: str | os.PathLike[str]) -> None:
    """Tell every process using the database of the gate file *gate_path* that the
    database was moved or removed (it was renamed by one of our tools): they look at
    their file's identity at their next write or read.  Nothing if there is no gate
    file (nobody uses it)."""
    try:
        fd = os.open(gate_path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        if os.fstat(fd).st_size >= BOARD_OFFSET and _allocated(fd, 0, BOARD_OFFSET):
            value = int.from_bytes(os.pread(fd, 4, MOVED_AT), "little")
            os.pwrite(fd, ((value + 1) & 0xFFFFFFFF).to_bytes(4, "little"), MOVED_AT)
    finally:
        os.close(fd)


def wipe_board(gate_path: str | os.PathLike[str]) -> None:
    """Zero the board of the gate file *gate_path* (its slot states and every slot
    holding data), for a caller that has the store to itself (``fleetstore rekey``):
    the slots kept the last operations posted in them, in the clear on a store that was
    not encrypted (tests/store/test_encryption.py, rekey of a plain store).  Holes stay
    holes."""
    try:
        fd = os.open(gate_path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        if os.fstat(fd).st_size < GATE_FILE_BYTES:
            return
        os.pwrite(fd, bytes(4 * BOARD_SLOTS), STATES_AT)
        for at in range(BOARD_OFFSET, GATE_FILE_BYTES, SLOT_BYTES):
            try:
                if os.lseek(fd, at, os.SEEK_DATA) < at + SLOT_BYTES:
                    os.pwrite(fd, bytes(SLOT_BYTES), at)
            except OSError:  # ENXIO: no data from here on
                break
        os.fsync(fd)
    finally:
        os.close(fd)


class GateTimeout(Exception):
    """The gate was not obtained before the deadline."""


class WriterGate:
    """One per Database per process.  ``acquire`` returns True if it had to wait."""

    def __init__(self, path: str, cross_process: bool = True) -> None:
        self.path = path
        self._mutex = threading.Lock()
        self._cross_process = cross_process
        self._closed = False
        self._fd = -1
        self._map: mmap.mmap | None = None
        #: The whole gate file mapped, for the group-commit board (None: not mapped),
        #: and the board's views of it (dropped before the mapping is closed).
        self.mapping: mmap.mmap | None = None
        self.board: Any = None
        self._bell: ctypes.c_uint32 | None = None
        self.moved_word: ctypes.c_uint32 | None = None
        self._wal_word: ctypes.c_uint32 | None = None
        self._bell_addr = ctypes.c_void_p(0)
        self._timeout = _Timespec(0, 0)
        self._timeout_ref = ctypes.byref(self._timeout)
        # Each ring writes a value no other ring is likely to write (see _ring).
        self._ring_value = (os.getpid() * 2654435761) & 0xFFFFFFFF
        #: This process's board slot (engine/combine.py sets it), whose byte in the
        #: sleepers' area it sets while it sleeps on the doorbell (-1: none yet).
        self.sleeper = -1
        if not cross_process:
            self._fd = 0
            return
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if _syscall is not None:
            try:
                if os.fstat(self._fd).st_size < GATE_FILE_BYTES:
                    os.ftruncate(self._fd, GATE_FILE_BYTES)
                # The file is sparse, and a store through a mapping into a page with no
                # block behind it on a full file system is SIGBUS, not an error (issue
                # 23: 5 of 6 writers killed): every page written through the mapping is
                # allocated first, these here and each board slot when it is claimed.
                # Where that fails the gate works unmapped (waiters poll).
                if not _allocated(self._fd, 0, BOARD_OFFSET):
                    os.posix_fallocate(self._fd, 0, BOARD_OFFSET)
                self._map = mmap.mmap(self._fd, GATE_FILE_BYTES, mmap.MAP_SHARED)
                self.mapping = self._map
                self._bell = ctypes.c_uint32.from_buffer(self._map)
                self._wal_word = ctypes.c_uint32.from_buffer(self._map, 4)
                self.moved_word = ctypes.c_uint32.from_buffer(self._map, MOVED_AT)
                self._bell_addr = ctypes.c_void_p(ctypes.addressof(self._bell))
            except (OSError, ValueError):
                self._map = self._bell = self._wal_word = self.moved_word = None

    def acquire(self, deadline: float) -> bool:
        if not self._mutex.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            raise GateTimeout("another thread of this process holds the gate")
        if not self._cross_process:
            return False
        contended = False
        try:
            while True:
                if self._fd < 0:
                    raise GateTimeout("gate closed")
                # Read the doorbell before trying: a release after this read
                # changes it, so the wait below cannot miss that release.
                rung = self._bell.value if self._bell is not None else 0
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return contended
                except BlockingIOError:
                    if not contended and self._spin():
                        return True
                    contended = True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    # A wake-up we may have taken belongs to the next waiter.
                    self._ring()
                    raise GateTimeout("gate held by another process")
                self._sleep(rung, min(remaining, _MAX_NAP))
        except BaseException:
            self._release_mutex()
            raise

    def try_acquire(self) -> bool:
        """The gate now, or False at once (no spin, no wait)."""
        if not self._mutex.acquire(blocking=False):
            return False
        if not self._cross_process:
            return True
        try:
            if self._fd < 0:
                raise GateTimeout("gate closed")
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            self._release_mutex()
            return False
        except BaseException:
            self._release_mutex()
            raise

    def _spin(self) -> bool:
        """Retry LOCK_NB for a moment before the first sleep (see the module doc)."""
        until = time.perf_counter() + _SPIN
        while time.perf_counter() < until:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                pass
        return False

    def _sleep(self, rung: int, seconds: float) -> None:
        """``_wait`` with this process's sleeper byte set (the futex syscall orders it
        before the kernel reads the doorbell)."""
        mm = self._map
        if mm is None:
            return self._wait(rung, seconds)
        mine = self.sleeper if self.sleeper >= 0 else _ANONYMOUS
        mm[SLEEPERS_AT + mine] = 1
        try:
            self._wait(rung, seconds)
        finally:
            if mine != _ANONYMOUS and self._map is not None:
                mm[SLEEPERS_AT + mine] = 0

    def _wait(self, rung: int, seconds: float) -> None:
        if self._bell is None or _syscall is None:
            time.sleep(min(seconds, _POLL))
            return
        self._timeout.tv_sec = int(seconds)
        self._timeout.tv_nsec = int((seconds % 1) * 1e9)
        _syscall(
            _SYS_FUTEX,
            self._bell_addr,
            _FUTEX_WAIT,
            ctypes.c_uint32(rung),
            self._timeout_ref,
            None,
            0,
        )

    def _ring(self) -> None:
        if self._bell is None or _syscall is None:
            return
        # A value of our own rather than an increment of the shared one: releasers
        # no longer hold the lock here, and a lost increment could leave the value
        # a waiter slept on, so that it missed this release.
        self._ring_value = (self._ring_value + 1) & 0xFFFFFFFF
        self._bell.value = self._ring_value
        _syscall(_SYS_FUTEX, self._bell_addr, _FUTEX_WAKE, 1, None, None, 0)

    def allocate(self, offset: int, length: int) -> bool:
        """Give the gate file's bytes [offset, offset + length) blocks on disk, so that
        the mapping can be written there without a fault (False: it cannot be)."""
        if self._fd <= 0 or self._map is None:
            return False
        try:
            if not _allocated(self._fd, offset, length):
                os.posix_fallocate(self._fd, offset, length)
        except OSError:
            return False
        return True

    def wal_frames(self) -> int | None:
        """The WAL's frames as its last committer saw them (None: not mapped)."""
        word = self._wal_word
        return None if word is None else word.value

    def swap_wal_frames(self, frames: int) -> int | None:
        """Store *frames* in the gate file and return the value stored by the
        previous writer; None where the file is not mapped.  Gate holders only."""
        word = self._wal_word
        if word is None:
            return None
        previous = word.value
        word.value = frames
        return previous

    def release(self) -> None:
        mm = None
        try:
            if self._cross_process and self._fd >= 0:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                if self._closed or _RING_ALWAYS:
                    self._ring()
                elif self._bell is not None:
                    self._ring_value = (self._ring_value + 1) & 0xFFFFFFFF
                    self._bell.value = self._ring_value
                    mm = self._map
        finally:
            # Whatever failed above, this process's other threads must not wait on
            # a mutex nobody holds any more.
            if self._closed:
                self._release_mutex()
            else:
                self._mutex.release()
        if mm is not None:
            # After the doorbell's new value and the mutex's release (a barrier):
            # a waiter that set its byte before it slept is seen here, or it read the
            # new value and does not sleep (tests/engine/test_engine.py::test_gate_*).
            try:
                sleeping = mm.find(b"\x01", SLEEPERS_AT, SLEEPERS_AT + _ANONYMOUS + 1) >= 0
            except ValueError:  # closed meanwhile by close() in another thread
                return
            if sleeping and _syscall is not None:
                _syscall(_SYS_FUTEX, self._bell_addr, _FUTEX_WAKE, 1, None, None, 0)

    def _release_mutex(self) -> None:
        # Called with the mutex held: a close() that came while a writer owned
        # the descriptor is finished here.
        if self._closed and self._fd >= 0:
            self._drop_descriptor()
        self._mutex.release()

    def _drop_descriptor(self) -> None:
        # ctypes views must go before the map can close
        self._bell = self._wal_word = self.moved_word = None
        if self.board is not None:
            self.board.detach()
            self.board = None
        if self._map is not None:
            self.mapping = None
            self._map.close()
            self._map = None
        if self._cross_process and self._fd >= 0:
            os.close(self._fd)
        self._fd = -1

    def close_inherited(self) -> None:
        """In a forked child: drop the descriptor whatever the copied in-process lock
        says (the thread that held it does not exist here)."""
        self._closed = True
        self._drop_descriptor()

    def close(self) -> None:
        """Close the descriptor.  Never LOCK_UN here: in a forked child the descriptor
        shares the parent's open file, and unlocking it would drop the parent's gate;
        closing only drops the lock once no process refers to that open file."""
        self._closed = True
        if self._mutex.acquire(blocking=False):
            self._release_mutex()


__all__ = [
    "BARRIER_AT",
    "BELL_AT",
    "BOARD_OFFSET",
    "MOVED_AT",
    "NOTIFY_AT",
    "NOTIFY_WORDS",
    "QUARANTINED_AT",
    "SLEEPERS_AT",
    "STATES_AT",
    "announce_moved",
    "BOARD_SLOTS",
    "GATE_FILE_BYTES",
    "SLOT_BYTES",
    "GateTimeout",
    "WriterGate",
    "futex_available",
    "futex_wait",
    "futex_wait_bits",
    "futex_wake",
    "futex_wake_bits",
]
