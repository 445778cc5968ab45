"""Fault injection of our own: a SQLite VFS that fails chosen calls, and the same for
the plain file I/O of blob files and spool journals.

``faults`` (fixture, or ``install()`` in a child process): while it is active, every
SQLite connection this process opens goes through ``FaultyVFS``, registered as the
default VFS over ``unix``, so no product code needs a knob.  It passes every call
through until told otherwise::

    faults.fail("xWrite", "wal", nth=2, error="short")  # the 2nd WAL write from now
    faults.fail("xSync", "wal", error="ioerr")           # the next WAL sync

Calls are counted from the ``fail()`` that armed the rule; a rule fires *times* times
(0: every matching call from the *nth* on).  Errors: ``full`` (SQLITE_FULL, what the
unix VFS returns on ENOSPC), ``ioerr`` (SQLITE_IOERR_<call>, e.g. IOERR_FSYNC), and
``short`` (a write that stores the first half of its bytes, then SQLITE_FULL: what a
disk filling up mid-write does), and ``kill`` (SIGKILL this process at that call, before
it reaches the disk: a crash inside SQLite).  A child process that installs the VFS
imports this module: start it with ``importable_env()``.  Files: ``db``, ``wal``, ``journal``, ``any``.  The
``-shm`` file cannot be failed here: SQLite's unix VFS maps it itself (apsw passes the
xShm* calls through, they never reach Python).

``file_faults`` (fixture): the same for Python's own calls (``os.open``, ``write``,
``fsync``, ``replace``, ``rename``, ``ftruncate``) made by ``fleetstore.domain.blobs``
and ``fleetstore.store.spool``, on paths matching a pattern; errors ``full``
(ENOSPC), ``eio`` (EIO), ``short`` (half the bytes written and returned, then ENOSPC).
"""

from __future__ import annotations

import errno
import os
import re
import signal
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
import pytest

_VFS_NAME = "fleetstore-faults"
_IOERR = {
    "xRead": apsw.SQLITE_IOERR_READ,
    "xWrite": apsw.SQLITE_IOERR_WRITE,
    "xSync": apsw.SQLITE_IOERR_FSYNC,
    "xTruncate": apsw.SQLITE_IOERR_TRUNCATE,
    "xFileSize": apsw.SQLITE_IOERR_FSTAT,
    "xLock": apsw.SQLITE_IOERR_LOCK,
    "xUnlock": apsw.SQLITE_IOERR_UNLOCK,
}


def file_kind(name: str | None) -> str:
    if not name:
        return "temp"
    for suffix, kind in (("-wal", "wal"), ("-journal", "journal"), ("-shm", "shm")):
        if name.endswith(suffix):
            return kind
    return "db"


@dataclass(frozen=True, slots=True)
class Call:
    """One VFS call as a rule sees it."""

    method: str
    file: str  # db, wal, journal, temp
    offset: int = -1
    data: bytes = b""  # what an xWrite writes


@dataclass(slots=True)
class Rule:
    method: str
    file: str
    nth: int
    error: str
    times: int
    match: Callable[[Call], bool] | None
    seen: int = 0
    fired: int = 0

    def hit(self, call: Call) -> bool:
        if call.method != self.method or self.file not in ("any", call.file):
            return False
        if self.match is not None and not self.match(call):
            return False
        self.seen += 1
        if self.seen < self.nth or (self.times and self.fired >= self.times):
            return False
        self.fired += 1
        return True


@dataclass
class Faults:
    """The rules of the VFS, and every call it saw while ``recording``."""

    rules: list[Rule] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    recording: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(
        self,
        method: str,
        file: str = "any",
        *,
        nth: int = 1,
        error: str = "full",
        times: int = 1,
        match: Callable[[Call], bool] | None = None,
    ) -> Rule:
        """Fail the *nth* matching call from now on (and *times* - 1 after it)."""
        assert method in _IOERR, method
        assert error in ("full", "ioerr", "short", "kill")
        assert error != "short" or method == "xWrite"
        rule = Rule(method, file, nth, error, times, match)
        with self.lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self.lock:
            self.rules.clear()
            self.calls.clear()

    def check(self, call: Call) -> Rule | None:
        with self.lock:
            if self.recording:
                self.calls.append(call)
            for rule in self.rules:
                if rule.hit(call):
                    return rule
        return None


class FaultyFile(apsw.VFSFile):
    def __init__(self, faults: Faults, name: Any, flags: list[int]) -> None:
        self._faults = faults
        filename = name.filename() if hasattr(name, "filename") else name
        self._kind = file_kind(filename if isinstance(filename, str) else None)
        super().__init__("unix", name, flags)

    def _check(self, method: str, offset: int = -1, data: bytes = b"") -> Rule | None:
        rule = self._faults.check(Call(method, self._kind, offset, data))
        if rule is not None and rule.error == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if rule is not None and rule.error != "short":
            if rule.error == "full":
                raise apsw.FullError(f"injected: {method} on the {self._kind} file")
            raise apsw.exception_for(_IOERR[method])
        return rule

    def xRead(self, amount: int, offset: int) -> bytes:
        self._check("xRead", offset)
        return super().xRead(amount, offset)

    def xWrite(self, data: bytes, offset: int) -> None:
        if self._check("xWrite", offset, bytes(data)) is not None:  # a short write
            super().xWrite(bytes(data)[: len(data) // 2], offset)
            raise apsw.FullError("injected: a short write")
        super().xWrite(data, offset)

    def xSync(self, flags: int) -> None:
        self._check("xSync")
        super().xSync(flags)

    def xTruncate(self, newsize: int) -> None:
        self._check("xTruncate", newsize)
        super().xTruncate(newsize)

    def xFileSize(self) -> int:
        self._check("xFileSize")
        return int(super().xFileSize())

    def xLock(self, level: int) -> None:
        self._check("xLock")
        super().xLock(level)

    def xUnlock(self, level: int) -> None:
        self._check("xUnlock")
        super().xUnlock(level)


#: The default VFS before any test replaced it: with apsw-sqlite3mc, its encrypting
#: "multipleciphers-unix" over "unix" (a default set back to plain "unix" made every later
#: encrypted store in the process fail: "Encryption is not supported by the VFS").
_DEFAULT_VFS = apsw.vfs_names()[0]


class FaultyVFS(apsw.VFS):
    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        super().__init__(_VFS_NAME, _DEFAULT_VFS, makedefault=True)

    def xOpen(self, name: Any, flags: list[int]) -> FaultyFile:
        return FaultyFile(self.faults, name, flags)


#: Every VFS ever registered stays referenced: a connection opened through one may
#: outlive the test that made it, and SQLite keeps pointing at its structure.
_made: list[FaultyVFS] = []


def importable_env() -> dict[str, str]:
    """This environment with the repository on PYTHONPATH: a child process started
    with it can import ``tests.fix_faults``."""
    root = str(Path(__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


def install() -> Faults:
    """Route this process's new SQLite connections through a fresh ``FaultyVFS``."""
    faults = Faults()
    _made.append(FaultyVFS(faults))
    return faults


def uninstall() -> None:
    if _VFS_NAME in apsw.vfs_names():
        apsw.unregister_vfs(_VFS_NAME)
    apsw.set_default_vfs(_DEFAULT_VFS)


@pytest.fixture
def faults() -> Iterator[Faults]:
    """The VFS fault injector for this test (see the module doc); close every
    database the test opened before it ends."""
    found = install()
    try:
        yield found
    finally:
        found.clear()
        uninstall()


# -- Python file I/O: blob files and spool journals ------------------------------------------

_ERRNO = {"full": errno.ENOSPC, "eio": errno.EIO}


@dataclass(slots=True)
class FileRule:
    call: str
    pattern: re.Pattern[str]
    nth: int
    error: str
    times: int
    seen: int = 0
    fired: int = 0
    #: A short write happened: the next write to the same file fails with ENOSPC.
    then_full: str = ""


class FileFaults:
    """Fails chosen ``os`` calls of the blob and spool modules (see the module doc)."""

    CALLS = ("open", "write", "fsync", "replace", "rename", "ftruncate")

    def __init__(self) -> None:
        self.rules: list[FileRule] = []
        self.seen: list[tuple[str, str]] = []

    def fail(
        self, call: str, pattern: str, *, nth: int = 1, error: str = "full", times: int = 1
    ) -> FileRule:
        assert call in self.CALLS and error in ("full", "eio", "short")
        assert error != "short" or call == "write"
        rule = FileRule(call, re.compile(pattern), nth, error, times)
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        self.rules.clear()

    def _rule(self, call: str, path: str) -> FileRule | None:
        self.seen.append((call, path))
        for rule in self.rules:
            if rule.call != call or not rule.pattern.search(path):
                continue
            rule.seen += 1
            if rule.seen < rule.nth or (rule.times and rule.fired >= rule.times):
                continue
            rule.fired += 1
            return rule
        return None

    def _raise(self, rule: FileRule, path: str) -> None:
        code = _ERRNO.get(rule.error, errno.ENOSPC)
        raise OSError(code, f"{os.strerror(code)} (injected)", path)

    def proxy(self) -> types.SimpleNamespace:
        """An ``os`` for a module: the faulted calls wrapped, everything else as is."""
        real = os

        def fd_path(fd: int) -> str:
            try:
                return real.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                return ""

        def open_(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
            if (rule := self._rule("open", str(path))) is not None:
                self._raise(rule, str(path))
            return real.open(path, flags, mode, **kw)

        def write(fd: int, data: Any) -> int:
            path = fd_path(fd)
            for done in self.rules:
                if done.then_full and done.then_full == path:
                    done.then_full = ""
                    self._raise(done, path)
            rule = self._rule("write", path)
            if rule is not None:
                if rule.error == "short" and len(data) > 1:
                    rule.then_full = path
                    return real.write(fd, bytes(data)[: len(data) // 2])
                self._raise(rule, path)
            return real.write(fd, data)

        def fsync(fd: int) -> None:
            path = fd_path(fd)
            if (rule := self._rule("fsync", path)) is not None:
                self._raise(rule, path)
            real.fsync(fd)

        def ftruncate(fd: int, length: int) -> None:
            path = fd_path(fd)
            if (rule := self._rule("ftruncate", path)) is not None:
                self._raise(rule, path)
            real.ftruncate(fd, length)

        def move(name: str) -> Callable[..., None]:
            def moved(src: Any, dst: Any, **kw: Any) -> None:
                if (rule := self._rule(name, str(dst))) is not None:
                    self._raise(rule, str(dst))
                getattr(real, name)(src, dst, **kw)

            return moved

        wrapped = {
            "open": open_,
            "write": write,
            "fsync": fsync,
            "ftruncate": ftruncate,
            "replace": move("replace"),
            "rename": move("rename"),
        }
        ns = types.SimpleNamespace(
            **{k: getattr(real, k) for k in dir(real) if not k.startswith("__")}
        )
        for name, fn in wrapped.items():
            setattr(ns, name, fn)
        return ns


@pytest.fixture
def file_faults(monkeypatch: pytest.MonkeyPatch) -> FileFaults:
    """Faults for the blob and spool modules' own file calls (see the module doc)."""
    from fleetstore.domain import blobs
    from fleetstore.store import spool

    found = FileFaults()
    proxy = found.proxy()
    for module in (blobs, spool):
        monkeypatch.setattr(module, "os", proxy)
    return found
