"""A throwaway PostgreSQL server for the test suite: initdb + pg_ctl in a temporary
directory, listening on loopback only, trust authentication, no fsync (a test
server's durability is not under test; fleetstore's handling of a server that
restarts or drops connections is).

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

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    @property
    def ours(self) -> bool:
        return self.datadir is not None

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


def start_server() -> PgServer:
    owner = _server_user()
    base = tempfile.mkdtemp(prefix="fleetstore-pg-")
    datadir = os.path.join(base, "data")
    log = os.path.join(base, "server.log")
    if owner is not None:
        pw = pwd.getpwnam(owner)
        os.chown(base, pw.pw_uid, pw.pw_gid)
    os.chmod(base, 0o700)
    port = _free_port()
    server = PgServer("127.0.0.1", port, "postgres", datadir, owner, log)
    server._run(
        _bin("initdb"),
        "-D",
        datadir,
        "-U",
        "postgres",
        "--auth=trust",
        "--no-sync",
        "-E",
        "UTF8",
        "--locale=C",
    )
    conf_path = os.path.join(datadir, "postgresql.conf")
    with open(conf_path) as conf:
        pristine = conf.read()
    # The free port can be taken between the probe and the start (pytest -n runs one
    # server per worker): try another.
    for attempt in range(5):
        with open(conf_path, "w") as conf:
            conf.write(
                pristine + f"\nlisten_addresses = '127.0.0.1'\nport = {server.port}\n"
                f"unix_socket_directories = '{base}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                "max_connections = 300\nshared_buffers = 128MB\n"
            )
        try:
            server.start()
            return server
        except subprocess.CalledProcessError:
            if attempt == 4:
                raise
            server.port = _free_port()
    raise AssertionError("unreachable")


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
