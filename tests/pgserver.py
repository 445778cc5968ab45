"""A throwaway PostgreSQL server for the test suite: initdb + pg_ctl in a temporary
directory, listening on loopback only, trust authentication, no fsync (a test
server's durability is not under test; fleetstore's handling of a server that
restarts or drops connections is).

``replicated_pair()`` starts a primary and a streaming standby of it (pg_basebackup),
the standby synchronous by default: the failover tests kill the primary
(``kill9``: every process of it, as a lost host) and promote the standby.

``FLEETSTORE_TEST_PG_URL`` (a server URL whose user may CREATE DATABASE) replaces it.
As root, the server runs as the ``postgres`` user (initdb refuses root); the
binaries come from PATH or Debian's ``/usr/lib/postgresql/<version>/bin``.

Run as a script it starts a server and prints its URL (for benchmarks and by hand):
``python tests/pgserver.py``; it stops on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field


def _bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
    )
    if not candidates:
        raise RuntimeError(
            f"PostgreSQL's {name} was not found (PATH, /usr/lib/postgresql/*/bin): "
            "install it (apt-get install -y postgresql) or set FLEETSTORE_TEST_PG_URL"
        )
    return candidates[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgServer:
    """A running server; ``url(dbname)`` names a database on it."""

    host: str
    port: int
    user: str
    datadir: str | None = None
    owner: str | None = None  # the OS user the server runs as, when we started it
    _log: str = ""
    _dbs: list[str] = field(default_factory=list)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{dbname}"

    # -- server control (only for a server we started) --------------------------------------

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(argv)
        if self.owner is not None and os.geteuid() == 0:
            cmd = ["runuser", "-u", self.owner, "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)

    def start(self) -> None:
        assert self.datadir is not None, "a server given by URL is not ours to start"
        self._run(_bin("pg_ctl"), "-D", self.datadir, "-l", self._log, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        assert self.datadir is not None, "a server given by URL is not ours to stop"
        self._run(_bin("pg_ctl"), "-D", self.datadir, "-m", mode, "-w", "-t", "60", "stop")

    def running(self) -> bool:
        assert self.datadir is not None, "a server given by URL is not ours to ask"
        return self._run(_bin("pg_ctl"), "-D", self.datadir, "status", check=False).returncode == 0

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def promote(self) -> None:
        """A standby becomes a primary (``pg_ctl promote``, waiting until it accepts
        writes)."""
        assert self.datadir is not None, "a server given by URL is not ours to promote"
        self._run(_bin("pg_ctl"), "-D", self.datadir, "-w", "-t", "60", "promote")

    def kill9(self) -> list[int]:
        """SIGKILL every process of the server, as when its host dies: the postmaster
        is stopped first (so it forks nothing more and restarts nothing), then it and
        every child it had are killed.  Returns the pids killed."""
        assert self.datadir is not None, "a server given by URL is not ours to kill"
        with open(os.path.join(self.datadir, "postmaster.pid")) as f:
            lines = f.read().splitlines()
        postmaster = int(lines[0])
        os.kill(postmaster, signal.SIGSTOP)
        children = [postmaster] + [
            int(entry)
            for entry in os.listdir("/proc")
            if entry.isdigit() and _parent(int(entry)) == postmaster
        ]
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in children):
            if time.monotonic() > deadline:
                raise RuntimeError(f"server processes {children} outlived SIGKILL")
            time.sleep(0.005)
        # The postmaster's System V segment outlives it (line 7: key and id): a killed
        # server is never started again here, so the segment is removed, not leaked.
        if len(lines) > 6 and len(lines[6].split()) == 2 and shutil.which("ipcrm"):
            subprocess.run(["ipcrm", "-m", lines[6].split()[1]], capture_output=True, check=False)
        return children

    @property
    def ours(self) -> bool:
        return self.datadir is not None

    def log_count(self, text: str) -> int:
        """How many lines of the server's log contain *text* (a FATAL it sent a client
        it refused is logged there too): evidence that a client tried."""
        assert self.datadir is not None, "a server given by URL has no log of ours"
        try:
            with open(self._log, errors="replace") as f:
                return sum(text in line for line in f)
        except FileNotFoundError:
            return 0

    # -- databases --------------------------------------------------------------------------

    def admin(self, sql: str) -> list[tuple[object, ...]]:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            cur = conn.execute(sql)
            return list(cur.fetchall()) if cur.description else []

    def create_database(self, prefix: str = "t", template: str | None = None) -> str:
        """A new database (empty, or a copy of the database *template*); returns its URL.
        Dropped by ``drop_all``."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        copy = f' TEMPLATE "{template}"' if template else ""
        self.admin(f'CREATE DATABASE "{name}"{copy}')
        self._dbs.append(name)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def drop_all(self) -> None:
        for name in self._dbs:
            with contextlib.suppress(Exception):
                self.drop_database(name)
        self._dbs.clear()


def _server_user() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root and no 'postgres' or 'nobody' user to run a server as")


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _alive(pid: int) -> bool:
    """Still a process (a zombie counts as gone: it holds no port or file)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


#: Every server's settings (after initdb's); ``start_server(settings=...)`` adds to them.
BASE_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "128MB",
}


def _new_server() -> PgServer:
    """A PgServer in a new empty directory owned by the server's user (not started)."""
    owner = _server_user()
    base = tempfile.mkdtemp(prefix="fleetstore-pg-")
    datadir = os.path.join(base, "data")
    log = os.path.join(base, "server.log")
    if owner is not None:
        pw = pwd.getpwnam(owner)
        os.chown(base, pw.pw_uid, pw.pw_gid)
    os.chmod(base, 0o700)
    return PgServer("127.0.0.1", _free_port(), "postgres", datadir, owner, log)


def _configure_and_start(server: PgServer, settings: dict[str, str]) -> PgServer:
    """Append *settings* (and this server's port and socket directory) to its
    postgresql.conf and start it.  The free port can be taken between the probe and
    the start (pytest -n runs one server per worker): then another is tried."""
    assert server.datadir is not None
    conf_path = os.path.join(server.datadir, "postgresql.conf")
    with open(conf_path) as conf:
        pristine = conf.read()
    base = os.path.dirname(server.datadir)
    for attempt in range(5):
        lines = {**settings, "port": str(server.port), "unix_socket_directories": f"'{base}'"}
        with open(conf_path, "w") as conf:
            conf.write(pristine + "\n" + "".join(f"{k} = {v}\n" for k, v in lines.items()))
        try:
            server.start()
            return server
        except subprocess.CalledProcessError:
            if attempt == 4:
                raise
            server.port = _free_port()
    raise AssertionError("unreachable")


def start_server(settings: dict[str, str] | None = None) -> PgServer:
    """A new server (initdb, then started), with *settings* over ``BASE_SETTINGS``."""
    server = _new_server()
    assert server.datadir is not None
    server._run(
        _bin("initdb"),
        "-D",
        server.datadir,
        "-U",
        "postgres",
        "--auth=trust",
        "--no-sync",
        "-E",
        "UTF8",
        "--locale=C",
    )
    return _configure_and_start(server, {**BASE_SETTINGS, **(settings or {})})


STANDBY_NAME = "standby1"


def start_standby(primary: PgServer, synchronous: bool = False) -> PgServer:
    """A streaming standby of *primary* (ours): a base backup of it, ``standby.signal``
    and a ``primary_conninfo`` whose ``application_name`` is ``STANDBY_NAME`` (the name
    a primary's ``synchronous_standby_names`` lists), started on a port of its own.
    Returns once it streams from the primary (and, if *synchronous*, once the primary
    counts it as its synchronous standby)."""
    assert primary.ours, "a standby is made of a server we started"
    standby = _new_server()
    assert standby.datadir is not None
    # From pg_ctl's directory: /usr/bin/pg_basebackup is Debian's pg_wrapper, which may
    # pick another installed version than the servers'.
    basebackup = os.path.join(os.path.dirname(_bin("pg_ctl")), "pg_basebackup")
    standby._run(
        basebackup if os.path.exists(basebackup) else _bin("pg_basebackup"),
        "-h",
        primary.host,
        "-p",
        str(primary.port),
        "-U",
        primary.user,
        "-D",
        standby.datadir,
        "-X",
        "stream",
        "--no-sync",
    )
    standby._run("touch", os.path.join(standby.datadir, "standby.signal"))
    conninfo = (
        f"host={primary.host} port={primary.port} user={primary.user} "
        f"application_name={STANDBY_NAME}"
    )
    try:
        # The base backup copied the primary's settings: promoted, with no standby
        # of its own, it must not wait for one at every commit.
        standby_settings = {
            "primary_conninfo": f"'{conninfo}'",
            "hot_standby": "on",
            "synchronous_standby_names": "''",
        }
        _configure_and_start(standby, standby_settings)
        deadline = time.monotonic() + 60
        wanted = "sync" if synchronous else "async"
        while not primary.admin(
            f"SELECT 1 FROM pg_stat_replication WHERE application_name = '{STANDBY_NAME}' "
            f"AND state = 'streaming' AND sync_state = '{wanted}'"
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby was not streaming ({wanted}) within 60 s")
            time.sleep(0.05)
    except BaseException:
        stop_server(standby)
        raise
    return standby


@contextlib.contextmanager
def replicated_pair(synchronous: bool = True) -> Iterator[tuple[PgServer, PgServer]]:
    """A primary and a streaming standby of it, both ours; with *synchronous*, a commit
    returns only once the standby has flushed its WAL (``synchronous_commit = on``,
    ``synchronous_standby_names`` naming the standby).  Both are removed at the end."""
    settings = {"wal_level": "replica", "max_wal_senders": "10"}
    if synchronous:
        settings |= {
            "synchronous_commit": "on",
            "synchronous_standby_names": f"'FIRST 1 ({STANDBY_NAME})'",
        }
    primary = start_server(settings)
    standby: PgServer | None = None
    try:
        standby = start_standby(primary, synchronous)
        yield primary, standby
    finally:
        if standby is not None:
            stop_server(standby)
        stop_server(primary)


def stop_server(server: PgServer) -> None:
    if not server.ours:
        server.drop_all()
        return
    with contextlib.suppress(Exception):
        server.stop("immediate")
    assert server.datadir is not None
    shutil.rmtree(os.path.dirname(server.datadir), ignore_errors=True)


def from_env() -> PgServer | None:
    url = os.environ.get("FLEETSTORE_TEST_PG_URL")
    if not url:
        return None
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return PgServer(parts.hostname or "127.0.0.1", parts.port or 5432, parts.username or "postgres")


@contextlib.contextmanager
def server() -> Iterator[PgServer]:
    srv = from_env() or start_server()
    try:
        yield srv
    finally:
        stop_server(srv)


if __name__ == "__main__":
    with server() as srv:
        print(srv.url(), flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            sys.exit(0)
