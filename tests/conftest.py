"""Process fixtures for the fleet tests: real OS processes, real files, no mocks.

``spawn`` starts a child (``tests/fleet_agent.py COMMAND ...`` or ``-m fleetstore ...``)
whose stdout lines are collected with their arrival time; every child a test started
is killed (SIGKILL) and reaped when the test ends, whatever happened.
"""

from __future__ import annotations

import fcntl
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetstore
import pgserver
from fleetstore import Store
from pgserver import PgServer

AGENT = str(Path(__file__).with_name("fleet_agent.py"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow fleet tests first, the longest (the largest timeout marker: the 70 s
    outside-lock fleets) before the others, stable otherwise: pytest -n hands the first
    tests round-robin to its workers, and a long test started last stretches the run."""

    def key(item: pytest.Item) -> tuple[bool, float]:
        timeout = item.get_closest_marker("timeout")
        longest = float(timeout.args[0]) if timeout is not None and timeout.args else 0.0
        return (item.get_closest_marker("slow") is None, -longest)

    items.sort(key=key)


class Proc:
    """A child process whose stdout lines arrive, timestamped (``time.time()``), in a queue."""

    def __init__(self, argv: list[str], name: str) -> None:
        self.name = name
        self.argv = argv
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.pid = self.popen.pid
        self.lines: queue.Queue[tuple[float, str | None]] = queue.Queue()
        self.seen: list[tuple[float, str]] = []
        self.stderr_lines: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump_stdout, daemon=True),
            threading.Thread(target=self._pump_stderr, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _pump_stdout(self) -> None:
        stream = self.popen.stdout
        assert stream is not None
        try:
            for line in stream:
                self.lines.put((time.time(), line.rstrip("\n")))
        except (OSError, ValueError):
            pass
        self.lines.put((time.time(), None))

    def _pump_stderr(self) -> None:
        stream = self.popen.stderr
        assert stream is not None
        try:
            for line in stream:
                self.stderr_lines.append(line.rstrip("\n"))
        except (OSError, ValueError):
            pass

    def wait_line(self, prefix: str, timeout: float) -> tuple[float, str]:
        """The first not-yet-consumed stdout line starting with *prefix*, and when it arrived."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{self.name}: no line starting {prefix!r} within {timeout}s; "
                    f"stdout so far {self.seen!r}; stderr {self.stderr_tail()!r}"
                )
            try:
                at, line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self.lines.put((at, None))  # keep the end marker for later callers
                self.popen.wait(timeout=10)
                raise AssertionError(
                    f"{self.name}: exited (rc={self.popen.returncode}) before a line starting "
                    f"{prefix!r}; stdout {self.seen!r}; stderr {self.stderr_tail()!r}"
                )
            self.seen.append((at, line))
            if line.startswith(prefix):
                return at, line

    def finish(self, timeout: float) -> int:
        """Wait for the exit; returns the exit code (collected stdout stays readable)."""
        try:
            rc = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running after {timeout}s; stdout {self.seen!r}; "
                f"stderr {self.stderr_tail()!r}"
            ) from None
        for t in self._threads:
            t.join(timeout=5)
        while True:
            try:
                at, line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.seen.append((at, line))
        return rc

    def last_line(self) -> str:
        return self.seen[-1][1] if self.seen else ""

    def stderr_tail(self, n: int = 20) -> str:
        return "\n".join(self.stderr_lines[-n:])

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


Spawn = Callable[..., Proc]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """``spawn(*args, name=...)`` runs ``python tests/fleet_agent.py *args``;
    ``spawn(*args, module="fleetstore")`` runs ``python -m fleetstore *args``."""
    procs: list[Proc] = []

    def _spawn(*args: str, name: str = "", module: str | None = None) -> Proc:
        head = [sys.executable, "-m", module] if module else [sys.executable, AGENT]
        argv = [*head, *args]
        proc = Proc(argv, name or " ".join(args[:2]))
        procs.append(proc)
        return proc

    try:
        yield _spawn
    finally:
        for proc in procs:
            proc.kill()


def start_lock(spawn: Spawn, path: str, hold: float, timeout: float = 30.0) -> tuple[Proc, float]:
    """``fleetstore lock PATH --hold HOLD`` in its own process; returns it and the time its
    ``locked PATH pid=PID`` line arrived (the lock is held from at most that instant)."""
    proc = spawn("lock", path, "--hold", str(hold), module="fleetstore", name="fleetstore lock")
    at, line = proc.wait_line("locked", timeout=timeout)
    assert line == f"locked {path} pid={proc.pid}", line
    return proc, at


class Barrier:
    """A start line for many processes: the test holds an exclusive flock on a file, the
    processes block on a shared flock of it, and all wake together on ``release()``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self.released_at: float | None = None

    def release(self) -> float:
        self.released_at = time.time()
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        return self.released_at

    def close(self) -> None:
        os.close(self._fd)


@pytest.fixture
def barrier(tmp_path: Path) -> Iterator[Barrier]:
    b = Barrier(tmp_path / "start.barrier")
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Processes a test starts; whatever happens, each is killed and reaped at the end."""
    started: list[Proc] = []
    try:
        yield started
    finally:
        for p in started:
            p.kill()


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """FLEETSTORE_DATA_DIR under tmp_path, inherited by child processes: where a
    PostgreSQL store keeps this host's spool journals and published figures."""
    path = tmp_path / "data"
    monkeypatch.setenv("FLEETSTORE_DATA_DIR", str(path))
    return path


@pytest.fixture
def store_path(tmp_path: Path) -> str:
    """A store with the fleet schema (tests/fleet_agent.py SCHEMA) already applied; the
    Database used to create it is closed again."""
    from fleet_agent import SCHEMA
    from fleetstore import Database

    path = str(tmp_path / "fleet.db")
    db = Database.open(path, migrations=SCHEMA)
    db.close()
    return path


# -- the store contract fixtures: every contract test opens stores through these, so the
# suite runs unchanged on each engine.

OpenStore = Callable[..., Store]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A throwaway PostgreSQL server (tests/pgserver.py), one per test process, or the
    one FLEETSTORE_TEST_PG_URL names.  Never skipped: a machine without PostgreSQL
    fails these tests (.ci/run installs it)."""
    with pgserver.server() as srv:
        yield srv


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A fresh, empty database on the test server; dropped after the test."""
    url = pg_server.create_database()
    yield url
    pg_server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture(scope="session")
def pg_template(pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The name of a database holding a freshly migrated, empty store: contract tests
    get copies of it (CREATE DATABASE … TEMPLATE), which skips running every
    migration for each of a few hundred tests."""
    url = pg_server.create_database("template")
    fleetstore.open(url, local_dir=str(tmp_path_factory.mktemp("template"))).close()
    return url.rsplit("/", 1)[1]


@pytest.fixture(params=["sqlite", "postgresql", "sharded"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def open_store(tmp_path: Path, engine: str, request: pytest.FixtureRequest) -> Iterator[OpenStore]:
    """``open_store(name="s.db", **settings)``: a store (a file under tmp_path, or a
    database of its own on the test server, one per name), closed when the test ends."""
    opened: list[Store] = []
    databases: dict[str, str] = {}

    def _open(name: str = "s.db", **settings: Any) -> Store:
        if engine == "sqlite":
            store = fleetstore.open(tmp_path / name, **settings)
        elif engine == "sharded":
            store = fleetstore.open(f"sqlite+sharded://{tmp_path / name}", **settings)
        else:
            server: PgServer = request.getfixturevalue("pg_server")
            if name not in databases:
                template = request.getfixturevalue("pg_template")
                databases[name] = server.create_database(template=template)
            settings.setdefault("local_dir", str(tmp_path / f"{name}.local"))
            store = fleetstore.open(databases[name], **settings)
        opened.append(store)
        return store

    yield _open
    for store in reversed(opened):
        store.close()
    if databases:
        server = request.getfixturevalue("pg_server")
        for url in databases.values():
            server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture
def store(open_store: OpenStore) -> Store:
    return open_store()


def read_everywhere(store: Store, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    """Raw rows of *sql* from the whole store: a sharded store's catalog and then
    each shard, concatenated (the catalog's index rows of sharded sessions left out,
    so each session counts once); a ``SELECT count(*)`` is summed into one row."""
    if store.router is None:
        return [tuple(r) for r in store.read(lambda tx: tx.execute(sql, params))]
    found: list[tuple[Any, ...]] = []

    def collect(key: str | None, db: Any) -> None:
        if key is None and " sessions" in sql:
            # the catalog's index rows are copies of the shards' rows
            text = sql.replace(
                " sessions",
                " (SELECT * FROM sessions WHERE id NOT IN "
                "(SELECT session_id FROM shard_sessions)) AS sessions",
                1,
            )
            found.extend(tuple(r) for r in db.read(lambda tx: tx.execute(text, params)))
            return
        found.extend(tuple(r) for r in db.read(lambda tx: tx.execute(sql, params)))

    store.router.each(collect)
    if sql.lstrip().lower().startswith("select count(*)"):
        return [(sum(int(r[0]) for r in found),)]
    return found
