"""``fleetstore.open()`` of a PostgreSQL store meets a server that cannot take a
connection yet (issue 23, cause 11): it waits, within the write budget, for a server
that is shutting down and then starting again, or whose ``max_connections`` are all
taken, and past the budget raises ``StoreBusy`` naming what it waited for; a wrong
password fails at once.

The servers are this module's own (tests/pgserver.py), to stop and to fill: the
suite's may be shared with tests running at the same time.  Each wait for a refusal is
shown by the server's own log (every refused connection logs its FATAL there), not by
time.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fleetstore
from fleetstore import errors
from fleetstore.engine.postgres import _unavailable
from tests import pgserver
from tests.engine.test_pg_faults import wait_for

WAIT = 60.0
#: A budget no step of these tests comes near: open() must not give up before the
#: server comes back.
BUDGET = 120.0
SHUTTING_DOWN = "the database system is shutting down"
NO_SLOTS = "sorry, too many clients already"
MAX_CONNECTIONS = 8


@pytest.fixture(scope="module")
def small_server() -> Iterator[pgserver.PgServer]:
    """A server of this module's own, with few connection slots, none of them kept
    for superusers (the tests connect as one)."""
    srv = pgserver.start_server(
        {"max_connections": str(MAX_CONNECTIONS), "superuser_reserved_connections": "0"}
    )
    try:
        yield srv
    finally:
        pgserver.stop_server(srv)


@pytest.fixture
def small(small_server: pgserver.PgServer) -> pgserver.PgServer:
    """The module's server, running (a test that failed half way may have left it
    stopped)."""
    if not small_server.running():
        small_server.start()
    return small_server


class Opener:
    """``fleetstore.open(url)`` in a thread: what it returned or raised."""

    def __init__(self, url: str, local: Path, **settings: Any) -> None:
        self.result: Any = None
        self.thread = threading.Thread(target=self._run, args=(url, local, settings))
        self.thread.start()

    def _run(self, url: str, local: Path, settings: dict[str, Any]) -> None:
        try:
            self.result = fleetstore.open(url, local_dir=str(local), **settings)
        except BaseException as exc:
            self.result = exc

    def store(self) -> fleetstore.Store:
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "open() still waiting"
        assert isinstance(self.result, fleetstore.Store), self.result
        return self.result


def refused(url: str, words: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            psycopg.connect(url, connect_timeout=5).close()
        except psycopg.OperationalError as exc:
            return words in str(exc)
        return False

    return check


def test_open_waits_for_a_server_shutting_down_then_stopped_then_started(
    small: pgserver.PgServer, tmp_path: Path
) -> None:
    """A session keeps a smart shutdown waiting, so new connections are refused with
    "shutting down" (57P03); open() starts then, is refused (the server logs it), goes
    on waiting while the server stops and is refused outright, and opens the store
    once the server is started again."""
    url = small.create_database()
    fleetstore.open(url, local_dir=str(tmp_path / "first")).close()  # the schema exists
    holder = psycopg.connect(url)
    stopper = threading.Thread(target=small.stop, args=("smart",))
    stopper.start()
    try:
        wait_for("new connections refused", refused(url, SHUTTING_DOWN))
        before = small.log_count(SHUTTING_DOWN)
        opener = Opener(url, tmp_path / "local", write_budget=BUDGET)
        wait_for("open() refused", lambda: small.log_count(SHUTTING_DOWN) > before)
    finally:
        holder.close()  # the smart shutdown completes
        stopper.join(WAIT)
    assert not stopper.is_alive()
    # Stopped: open() is refused at the TCP level now, and still waits.
    assert opener.thread.is_alive(), opener.result
    small.start()
    store = opener.store()
    try:
        sid = store.sessions.create(title="after the restart").id
        assert store.messages.append(sid, "user", "hello").seq == 1
    finally:
        store.close()


def test_open_waits_for_a_free_connection_slot(small: pgserver.PgServer, tmp_path: Path) -> None:
    """Every slot of ``max_connections`` taken: open() is refused ("too many clients",
    53300) and waits; once the slots are freed it opens the store."""
    url = small.create_database()
    fleetstore.open(url, local_dir=str(tmp_path / "first")).close()
    holders: list[psycopg.Connection[Any]] = []
    try:
        while True:
            try:
                holders.append(psycopg.connect(url))
            except psycopg.OperationalError as exc:
                assert NO_SLOTS in str(exc), exc
                break
            assert len(holders) <= MAX_CONNECTIONS, "the server took more than its slots"
        before = small.log_count(NO_SLOTS)
        opener = Opener(url, tmp_path / "local", write_budget=BUDGET)
        wait_for("open() refused", lambda: small.log_count(NO_SLOTS) > before)
        assert opener.thread.is_alive(), opener.result
    finally:
        for conn in holders:
            conn.close()
    store = opener.store()
    try:
        assert store.effects.enqueue("t", "fx", {"n": 1})
    finally:
        store.close()


def test_a_wrong_password_fails_at_once_without_a_second_attempt(
    small: pgserver.PgServer, tmp_path: Path
) -> None:
    """A permanent refusal (28P01) is not waited for: one attempt (the server logs
    one failure), ``DatabaseError`` with the server's words, no password in them,
    nothing created on this host."""
    url = small.create_database()
    role = f"pw_{os.getpid()}"
    small.admin(f"CREATE ROLE {role} LOGIN PASSWORD 'right'")
    hba = os.path.join(str(small.datadir), "pg_hba.conf")
    with open(hba) as f:
        rules = f.read()
    with open(hba, "w") as f:  # rewritten in place: owner and mode stay the server's
        f.write(f"host all {role} 127.0.0.1/32 scram-sha-256\n{rules}")
    small.admin("SELECT pg_reload_conf()")
    wrong = url.replace("postgres@", f"{role}:wrong@")
    failed = f'password authentication failed for user "{role}"'
    wait_for("the new rule in force", refused(wrong, failed))
    before = small.log_count(failed)
    with pytest.raises(errors.DatabaseError, match="password authentication failed") as info:
        fleetstore.open(wrong, local_dir=str(tmp_path / "local"), write_budget=BUDGET)
    assert "wrong" not in str(info.value)
    assert small.log_count(failed) == before + 1
    assert not (tmp_path / "local").exists()


REFUSED_AT = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
TWO_HOSTS = (
    "{last}\nMultiple connection attempts failed. All failures were:\n"
    "- host: 'a', port: '1', hostaddr: '127.0.0.1': " + REFUSED_AT + "{first}\n"
    "- host: 'b', port: '2', hostaddr: '127.0.0.1': " + REFUSED_AT + "{last}"
)


@pytest.mark.parametrize(
    ("message", "wait"),
    [
        (REFUSED_AT + "FATAL:  the database system is starting up", True),
        (REFUSED_AT + "FATAL:  the database system is not yet accepting connections", True),
        (REFUSED_AT + "FATAL:  sorry, too many clients already", True),
        (REFUSED_AT + 'FATAL:  too many connections for role "agent"', True),
        (REFUSED_AT + "Connection refused\n\tIs the server running on that host?", True),
        ("connection timeout expired", True),
        (TWO_HOSTS.format(first="Connection refused", last="session is read-only"), True),
        (REFUSED_AT + 'FATAL:  password authentication failed for user "agent"', False),
        (REFUSED_AT + 'FATAL:  database "fleet" does not exist', False),
        (REFUSED_AT + 'FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "agent"', False),
        ("failed to resolve host 'db.invalid': [Errno -2] Name or service not known", False),
        ('invalid connection option "hots"', False),
        # One host refusing the password decides: the others would too.
        (
            TWO_HOSTS.format(
                first="Connection refused",
                last='FATAL:  password authentication failed for user "agent"',
            ),
            False,
        ),
        # Words not known (a server answering in another language): for good.
        (REFUSED_AT + "FATAL:  das Datenbanksystem fährt herunter", False),
    ],
)
def test_which_refusals_are_waited_for(message: str, wait: bool) -> None:
    assert _unavailable(psycopg.OperationalError(message)) is wait


def test_open_past_the_budget_raises_store_busy_naming_the_refusal(tmp_path: Path) -> None:
    """Nothing listens on the port: open() tries again and again within its budget,
    then raises ``StoreBusy`` (a transient error) that says what refused it."""
    url = f"postgresql://postgres@127.0.0.1:{pgserver._free_port()}/nothing_here"
    with pytest.raises(errors.StoreBusy) as info:
        fleetstore.open(url, local_dir=str(tmp_path / "local"), write_budget=1.0)
    busy = info.value
    assert isinstance(busy, errors.TransientError)
    assert busy.stage == "connection" and busy.attempts > 1, busy
    assert "Connection refused" in str(busy), busy
    assert not (tmp_path / "local").exists()
