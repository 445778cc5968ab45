"""The fork guard: ``os.fork`` waits until no other thread is inside SQLite.

A forked child closes every connection it inherited (engine/sqlite.py,
``Database._after_fork``); that is only safe if none of them was inside SQLite,
holding its mutex, at the instant of the fork.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class _Depth(threading.local):
    #: How deep this thread is inside SQLite calls (guards nest).
    n = 0


class ForkGuard:
    """Threads count themselves in while they run SQLite code; ``os.fork`` waits
    (in a before-fork hook) until no *other* thread is inside.

    A child inherits every connection, and one that another parent thread was
    using at the instant of the fork may be inside SQLite, holding its mutex: the
    child could neither close it (deadlock) nor keep it (its in-process lock state
    makes the child's own connections take no real lock, and the child's writes
    were lost: tests/store/test_spool.py::test_forked_child_neither_writes_nor_keeps_the_parents_journal).
    With this guard no connection is ever inside SQLite at a fork, so the child
    closes them all.  Waiting for the gate or between BEGIN attempts does not count.
    """

    def __init__(self) -> None:
        # A plain lock for the way in and out (a Condition's own __enter__ is Python
        # code, twice per write); the condition on it only while a fork waits.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._inside = 0
        self._forking = 0  # the thread ident that is forking
        self._depth = _Depth()

    def enter(self) -> None:
        with self._mutex:
            if self._forking and self._forking != threading.get_ident():
                while self._forking and self._forking != threading.get_ident():
                    self._cond.wait()
            self._inside += 1
        self._depth.n += 1

    def exit(self) -> None:
        self._depth.n -= 1
        with self._mutex:
            self._inside -= 1
            if self._forking:
                self._cond.notify_all()

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.exit()

    def before_fork(self) -> None:
        mine = getattr(self._depth, "n", 0)
        with self._cond:
            while self._forking:  # another thread is forking: let it finish first
                self._cond.wait()
            self._forking = threading.get_ident()
            while self._inside > mine:
                self._cond.wait()

    def after_fork_in_parent(self) -> None:
        with self._cond:
            self._forking = 0
            self._cond.notify_all()

    def after_fork_in_child(self) -> None:
        # Only the forking thread exists here; its own count carries over.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._inside = getattr(self._depth, "n", 0)
        self._forking = 0


#: The one guard of every database of this process (a fork must wait for all of them).
GUARD = ForkGuard()

__all__ = ["GUARD", "ForkGuard"]
