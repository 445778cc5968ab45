"""The cross-process writer gate: an in-process lock plus ``flock`` on ``<db>.gate``.

Writers queue in the kernel: a blocked ``flock`` sleeps at no CPU cost and is
woken the moment the holder releases, where SQLite's busy handler naps up to
100 ms (DESIGN.md, "The write path": 0.06 ms hand-over against a 13 ms median
nap).  ``flock`` has no timeout, so a contended wait runs in a helper thread
and the caller waits on an event with its deadline; a gate the kernel grants
after its waiter gave up is released at once by that thread
(tests/test_engine.py::test_gate_obtained_after_waiter_gave_up_is_released).
"""

from __future__ import annotations

import fcntl
import os
import queue
import threading
import time


class GateTimeout(Exception):
    """The gate was not obtained before the deadline."""


class _Attempt:
    __slots__ = ("abandoned", "error", "event", "granted", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.event = threading.Event()
        self.granted = False
        self.abandoned = False
        self.error: OSError | None = None


class WriterGate:
    """One per Database per process.  ``acquire`` returns True if it had to wait."""

    def __init__(self, path: str, cross_process: bool = True) -> None:
        self.path = path
        self._mutex = threading.Lock()
        self._cross_process = cross_process
        self._fd = (
            os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600) if cross_process else 0
        )
        self._closed = False
        self._requests: queue.SimpleQueue[_Attempt | None] = queue.SimpleQueue()
        self._waiter: threading.Thread | None = None

    def acquire(self, deadline: float) -> bool:
        if not self._mutex.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            raise GateTimeout("another thread of this process holds the gate")
        handed_over = False
        try:
            if self._fd < 0:
                raise GateTimeout("gate closed")
            if not self._cross_process:
                handed_over = True
                return False
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                handed_over = True
                return False
            except BlockingIOError:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise GateTimeout("gate held by another process")
            attempt = _Attempt()
            if self._waiter is None:
                self._waiter = threading.Thread(
                    target=self._waiter_loop, name="fleetstore-gate", daemon=True
                )
                self._waiter.start()
            self._requests.put(attempt)
            attempt.event.wait(remaining)
            with attempt.lock:
                if attempt.granted:
                    handed_over = True
                    return True
                if attempt.error is not None:
                    raise attempt.error
                # From here the waiting thread owns the mutex and releases it,
                # with the flock, when the kernel finally grants the gate.
                attempt.abandoned = True
                handed_over = True
            raise GateTimeout("gate held by another process")
        finally:
            if not handed_over:
                self._release_mutex()

    def _waiter_loop(self) -> None:
        # One long-lived thread per gate: starting a thread for every contended
        # acquire cost about a fifth of the throughput at 32 processes.
        while True:
            attempt = self._requests.get()
            if attempt is None:
                return
            self._wait_in_kernel(attempt)

    def _wait_in_kernel(self, attempt: _Attempt) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError as exc:
            with attempt.lock:
                attempt.error = exc
                abandoned = attempt.abandoned
                attempt.event.set()
            if abandoned:
                self._release_mutex()
            return
        with attempt.lock:
            if not attempt.abandoned:
                attempt.granted = True
                attempt.event.set()
                return
        self.release()

    def release(self) -> None:
        if self._cross_process and self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._release_mutex()

    def _release_mutex(self) -> None:
        # Called with the mutex held: a close() that came while a writer or an
        # abandoned waiter owned the descriptor is finished here.
        if self._closed and self._fd >= 0:
            if self._cross_process:
                os.close(self._fd)
            self._fd = -1
            self._requests.put(None)
        self._mutex.release()

    def close_inherited(self) -> None:
        """In a forked child: drop the descriptor whatever the copied in-process lock
        says (the thread that held it does not exist here)."""
        if self._fd >= 0 and self._cross_process:
            os.close(self._fd)
        self._fd = -1
        self._closed = True

    def close(self) -> None:
        """Close the descriptor.  Never LOCK_UN here: in a forked child the descriptor
        shares the parent's open file, and unlocking it would drop the parent's gate;
        closing only drops the lock once no process refers to that open file."""
        self._closed = True
        if self._mutex.acquire(blocking=False):
            self._release_mutex()


__all__ = ["GateTimeout", "WriterGate"]
