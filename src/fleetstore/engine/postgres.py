"""The PostgreSQL engine: a pool of psycopg 3 connections, snapshot-isolated write
transactions retried by SQLSTATE within the write budget, snapshot reads,
migrations under an advisory lock, LISTEN/NOTIFY wake-ups.

The write path::

    pool.getconn(budget)                 a connection of this process's pool
    BEGIN ISOLATION LEVEL REPEATABLE READ;  lock_timeout = what is left of the budget
    body(tx)                             may run again: see run_write
    COMMIT
    retried on 40001 / 40P01 (serialization failure, deadlock), on a lost connection
    (class 08, 57P01-57P03: the server restarted, the backend was terminated), on a
    server that takes no writes (25006: a standby, reached before a failover ended) and
    on a unique violation met under concurrency, until the budget ends: StoreBusy.

Connecting (``open()``, and the pool's new connections) waits within the write budget
for a server that cannot take a connection *now*: starting up, shutting down, out of
connection slots, a standby not yet promoted, nothing listening while it restarts
(``_unavailable``).  With a multi-host URL (``host1:port1,host2:port2`` and
``target_session_attrs=read-write``) libpq picks the server that takes writes, so
after a failover the next connection goes to the promoted standby
(tests/store/test_pg_failover.py).

SQLite's ``write()`` runs its body once; a PostgreSQL transaction may be told to
start over, so writers hand a function to ``run_write``.  A COMMIT whose
connection is lost has an unknown outcome: the body is run again with
``tx.uncertain`` set, and the operation's own idempotency (the ``applied_ops``
row, primary keys, a claim's ``claim_op``) makes a second run of a committed
operation change nothing.  The engine never guesses.

Parameters are written ``?`` and ``:name`` in the SQL files of both dialects; they
are rewritten here for psycopg, which binds them client-side (ClientCursor): values
become literals, so untyped ``? IS NULL`` needs no cast and no statement is prepared.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any, Self, TypeVar

from fleetstore import errors
from fleetstore.core.extras import requires
from fleetstore.core.metrics import WriteMetrics
from fleetstore.core.settings import Settings
from fleetstore.core.targets import redact
from fleetstore.engine.base import apply_steps, check_not_newer, ordered_migrations
from fleetstore.engine.notify import Hearing, check_channel
from fleetstore.engine.pg_notify import ListenSource

with requires("postgres", "a PostgreSQL store"):
    import psycopg
    import psycopg_pool

T = TypeVar("T")
Row = tuple[Any, ...]
Params = Sequence[Any] | dict[str, Any]

_MIGRATIONS_TABLE = "fleetstore_migrations"
#: Taken (transaction-scoped) by every migrating process: the first applies, the
#: others wait, then find the version current.  The number is "fleetsto" in ASCII.
_MIGRATION_LOCK = 0x666C65657473746F
_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_RETRY_BASE = 0.002
_RECONNECT_PAUSE = 0.05
_MAX_RECONNECT_PAUSE = 0.5
#: A write waits for a pooled connection in slices of this many seconds.  The pool
#: tries a failed connection once more after a moment (``reconnect_timeout``), then
#: stops; a waiter coming back for a new slice makes it try again.  Left to itself,
#: psycopg_pool backs off 1, 2, 4, 8... s: writers would find a promoted standby
#: seconds after it took writes (and past a short budget).
_POOL_SLICE = 0.25
#: Unique violations are retried this many times: two snapshot transactions that both
#: found no row and inserted it (the next seq of a session, a thread's head) meet as a
#: unique violation where one after the other would have seen the row; a retry reads
#: it.  The domain checks its own keys first, so a real clash raises its own error.
_UNIQUE_RETRIES = 8
#: Writes run REPEATABLE READ (snapshot isolation), not SERIALIZABLE: under
#: SERIALIZABLE every logged operation conflicted with every other, because each looks
#: up its time-ordered id in applied_ops and then inserts it, so all of them read and
#: write the same last index page (predicate locks are page-grained): 5-30 retries per
#: commit and 10-70x fewer writes/s than SQLite at 8-64 processes (bench_pg.py, first
#: run).  What snapshot isolation lets through (write skew) is closed where the domain
#: depends on it: concurrent updates of one row raise 40001, inserts of one key raise a
#: unique violation (both retried), and the outbox's queries touch a thread's head row
#: before they decide on a new effect's place (sql/postgresql/outbox.sql).
_ISOLATION = "REPEATABLE READ"

_LOST = ("08", "57P01", "57P02", "57P03")
_READ_ONLY = "25006"  # read_only_sql_transaction

#: psycopg has no SQLSTATE for a connection refused while it was being made (libpq
#: keeps the server's error to itself): the words tell.  These are libpq's and the
#: server's (English, the server's lc_messages) for a refusal that passes by waiting...
_UNAVAILABLE_WORDS = (
    "the database system is starting up",  # 57P03
    "the database system is shutting down",  # 57P03
    "the database system is not yet accepting connections",  # 57P03: a standby catching up
    "the database system is not accepting connections",  # 57P03
    "the database system is in recovery mode",  # 57P03: after a crash
    "too many clients already",  # 53300: max_connections
    "remaining connection slots are reserved",  # 53300
    "too many connections for",  # 53300: a role's or database's CONNECTION LIMIT
    "terminating connection",  # 57P01, 57P02
    "session is read-only",  # target_session_attrs=read-write met a standby
    "server is in hot standby mode",  # target_session_attrs=primary met a standby
    "connection refused",  # nothing listens (yet): a restart, a failover
    "no such file or directory",  # the Unix socket is not there (yet)
    "timeout expired",  # connect_timeout
    "server closed the connection unexpectedly",
    "connection reset by peer",
    "connection timed out",
    "no route to host",
    "network is unreachable",
    "could not receive data from server",
    "could not send data to server",
)
#: ... and for one that does not: the credentials or the database, the same on every
#: host.  Checked first: with several hosts, one refusing the password decides.  (Other
#: words not known, a host name that does not resolve among them, are for good too.)
_REFUSED_WORDS = (
    "authentication failed",  # 28P01
    "no pg_hba.conf entry",  # 28000
    "does not exist",  # 3D000 (database), 28000 (role)
    "permission denied",  # 42501
)


@lru_cache(maxsize=4096)
def to_psycopg(sql: str) -> str:
    """``?`` and ``:name`` placeholders as psycopg's ``%s`` and ``%(name)s``.

    >>> to_psycopg("SELECT ?, :a::text, '100%'")
    "SELECT %s, %(a)s::text, '100%%'"
    """
    sql = sql.replace("%", "%%")
    sql = _NAMED.sub(r"%(\1)s", sql)
    return sql.replace("?", "%s")


def _sqlstate(exc: BaseException) -> str:
    return getattr(exc, "sqlstate", None) or ""


def _connection_lost(exc: BaseException, conn: psycopg.Connection[Any] | None) -> bool:
    if conn is not None and (conn.closed or conn.broken):
        return True
    state = _sqlstate(exc)
    if state.startswith(_LOST) or (state[:2] == "08"):
        return True
    # No SQLSTATE: the connection could not be made or broke on the client side.
    return isinstance(exc, psycopg.OperationalError) and not state


def _unavailable(exc: BaseException) -> bool:
    """Whether a failed connection attempt may succeed if made again soon: the server
    is starting, shutting down, recovering, out of connection slots or not there yet,
    or only standbys answered.  Anything else (a wrong password, user, database or
    host name, a malformed URL, words not known) is for good."""
    state = _sqlstate(exc)
    if state:
        return state.startswith(_LOST) or state == "53300"
    text = str(exc).lower()
    if any(words in text for words in _REFUSED_WORDS):
        return False
    return any(words in text for words in _UNAVAILABLE_WORDS)


def _refusal(exc: BaseException) -> str:
    """A failed connection in one line: each host's answer when several were tried."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    # psycopg's list: "- host: 'h', port: 'p', hostaddr: 'a': connection failed: ..."
    tried = [line.rpartition("connection failed: ")[2] for line in lines if line.startswith("- ")]
    return "; ".join(tried) if tried else (lines[0] if lines else repr(exc))


def _translate(exc: psycopg.Error, where: str) -> errors.FleetstoreError:
    message = f"{where}: {exc}".strip()
    state = _sqlstate(exc)
    if isinstance(exc, psycopg.DataError) and "NUL" in str(exc):
        # psycopg refuses to send it: PostgreSQL text cannot hold U+0000 at all.
        return errors.InvalidInput(
            f"{where}: text containing NUL (U+0000) cannot be stored on PostgreSQL "
            "(message bodies can: they are bytes there)"
        )
    if state.startswith("23"):
        return errors.IntegrityError(message)
    if state == _READ_ONLY:
        return errors.ReadOnlyError(message)
    if state.startswith(("XX", "58")):
        return errors.CorruptStore(message) if state == "XX001" else errors.DatabaseError(message)
    return errors.DatabaseError(message)


def _connect_timeout(settings: Settings, left: float | None = None) -> int:
    """libpq's connect_timeout (whole seconds, per host; under 2 means 2): the write
    budget, at most 10 s, and at most what is *left* of it."""
    budget = settings.write_budget if left is None else min(left, settings.write_budget)
    return max(2, min(math.ceil(budget), 10))


class _PoolConnection(psycopg.Connection[Any]):
    """The pool's connections.  A connection attempt the pool makes is told to
    ``report`` (its error, or None once one succeeds): a write that ran out of budget
    waiting for the pool can then say what refused it."""

    @classmethod
    def connect(  # type: ignore[override]
        cls,
        conninfo: str = "",
        *,
        report: Callable[[BaseException | None], None] | None = None,
        **kwargs: Any,
    ) -> Self:
        try:
            conn = super().connect(conninfo, **kwargs)
        except psycopg.Error as exc:
            if report is not None:
                report(exc)
            raise
        if report is not None:
            report(None)
        return conn


class _Retry(Exception):
    """Internal: start the write over (the reason is counted, not raised)."""

    def __init__(self, reason: str, pause: float) -> None:
        super().__init__(reason)
        self.reason = reason
        self.pause = pause


class _Tx:
    __slots__ = ("_conn", "_notes", "_open", "_where", "now", "uncertain")

    def __init__(self, conn: psycopg.Connection[Any], where: str, now: float) -> None:
        self._conn = conn
        self._where = where
        self._open = True
        #: The database's clock (epoch seconds) at the start of the transaction.
        self.now = now
        #: Set when an earlier run of this body may have committed (its COMMIT lost
        #: the connection): the body must find its own earlier work.
        self.uncertain = False
        #: The channels to NOTIFY with the COMMIT (engine/notify.py).
        self._notes: set[str] | None = None

    def notify(self, channel: str) -> None:
        """NOTIFY *channel* with this transaction's COMMIT (delivered when it commits;
        identical notifications of one transaction are folded into one)."""
        if not self._open:
            raise errors.StoreClosed(
                "this transaction has ended; use a new db.write() or db.read()"
            )
        notes = self._notes
        if notes is None:
            self._notes = {check_channel(channel)}
        elif channel not in notes:
            notes.add(check_channel(channel))

    def commit_sql(self, commit: str) -> str:
        """*commit*, after the NOTIFY of every channel rung (one round trip)."""
        notes = self._notes
        if not notes:
            return commit
        return "".join(f"NOTIFY {channel}; " for channel in sorted(notes)) + commit

    def execute(self, sql: str, params: Params = ()) -> list[Row]:
        """Run *sql*; every row it produces, read whole."""
        cur = self._cursor()
        try:
            cur.execute(to_psycopg(sql), params or None)
            return list(cur.fetchall()) if cur.description is not None else []
        except psycopg.Error as exc:
            raise _translate(exc, self._where) from exc
        finally:
            cur.close()

    def executemany(self, sql: str, seq_of_params: Iterable[Params]) -> None:
        cur = self._cursor()
        try:
            cur.executemany(to_psycopg(sql), list(seq_of_params))
        except psycopg.Error as exc:
            raise _translate(exc, self._where) from exc
        finally:
            cur.close()

    def _cursor(self) -> psycopg.ClientCursor[Any]:
        if not self._open:
            raise errors.StoreClosed(
                "this transaction has ended; use a new db.write() or db.read()"
            )
        return psycopg.ClientCursor(self._conn)


class WriteTx(_Tx):
    __slots__ = ()


class ReadTx(_Tx):
    __slots__ = ()

    def notify(self, channel: str) -> None:
        raise errors.ReadOnlyError(f"{self._where}: a read transaction cannot notify")


_live: weakref.WeakSet[PgDatabase] = weakref.WeakSet()
#: Pools inherited through fork: never used nor closed by the child (closing would
#: end the parent's sessions on the shared sockets), kept referenced so no finaliser runs.
_inherited: list[Any] = []


def _after_fork_in_child() -> None:
    for db in list(_live):
        db._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class PgDatabase:
    """A PostgreSQL database that many processes on many hosts write at once."""

    dialect = "postgresql"
    # Tests point this at "COMMIT; SELECT pg_terminate_backend(pg_backend_pid())" to
    # lose the connection right after a commit took effect (an ambiguous COMMIT).
    _commit_sql = "COMMIT"

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.path = redact(url)  # what messages name
        self.settings = settings
        self._closed = False
        self._lock = threading.Lock()
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._listen_lock = threading.Lock()
        #: Each channel heard: a connection of its own that LISTENs (engine/notify.py).
        self._hearings: dict[str, Hearing] = {}
        self._metrics = WriteMetrics("postgresql")
        self._pid = os.getpid()
        self._write_owner: set[int] = set()
        #: The pool's last failed connection attempt (None since one succeeded).
        self._refused: BaseException | None = None
        _live.add(self)

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def open(cls, url: str, migrations: Sequence[Any] = (), **settings: Any) -> PgDatabase:
        config = Settings.load(**settings)
        db = cls(url, config)
        try:
            db._check_server()
            if migrations:
                db.migrate(migrations)
        except BaseException:
            db.close()
            raise
        return db

    def _check_server(self) -> None:
        """Connect once before anything else.  A server that cannot take the
        connection now (``_unavailable``: starting, shutting down, out of slots, only a
        standby answering, nothing listening while it restarts) is tried again within
        the write budget, then ``StoreBusy`` names its last refusal; a wrong URL, user,
        password or database fails at once, with the server's own words."""
        started = time.monotonic()
        deadline = started + self.settings.write_budget
        attempts = 0
        while True:
            attempts += 1
            try:
                with psycopg.connect(
                    self.url,
                    autocommit=True,
                    connect_timeout=_connect_timeout(self.settings, deadline - time.monotonic()),
                ) as conn:
                    version = conn.info.server_version
                break
            except psycopg.Error as exc:
                if not _unavailable(exc):
                    raise errors.DatabaseError(
                        f"{self.path}: cannot connect: {_refusal(exc)}"
                    ) from exc
                # Growing, jittered: a fleet restarting at once does not storm a server
                # that is out of connection slots.
                pause = min(_RECONNECT_PAUSE * attempts, _MAX_RECONNECT_PAUSE)
                pause *= 0.5 + random.random()
                if time.monotonic() + pause >= deadline:
                    raise errors.StoreBusy(
                        self.path,
                        time.monotonic() - started,
                        attempts,
                        stage="connection",
                        reason=_refusal(exc),
                    ) from exc
                time.sleep(pause)
        if version < 120000:
            raise errors.ConfigError(
                f"{self.path}: PostgreSQL {version // 10000} is too old; 12 or newer is needed"
            )

    def _pool_for_use(self) -> psycopg_pool.ConnectionPool[Any]:
        if self._closed:
            raise errors.StoreClosed(f"{self.path}: the database was closed")
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = psycopg_pool.ConnectionPool(
                        self.url,
                        connection_class=_PoolConnection,
                        kwargs={
                            "autocommit": True,
                            "cursor_factory": psycopg.ClientCursor,
                            "connect_timeout": _connect_timeout(self.settings),
                            "application_name": f"fleetstore pid {os.getpid()}",
                            "report": self._connect_report,
                        },
                        min_size=0,
                        max_size=self.settings.pool_size,
                        open=True,
                        timeout=self.settings.write_budget,
                        max_idle=300.0,
                        reconnect_timeout=_RECONNECT_PAUSE,
                        name=f"fleetstore-{os.getpid()}",
                    )
                pool = self._pool
        return pool

    def _after_fork(self) -> None:
        if self._pool is not None:
            _inherited.append(self._pool)
        for hearing in self._hearings.values():
            hearing.forget()  # (its connection is the parent's: kept, never used)
        self._pool = None
        self._hearings = {}
        self._lock = threading.Lock()
        self._listen_lock = threading.Lock()
        self._metrics = WriteMetrics("postgresql")
        self._pid = os.getpid()
        self._write_owner = set()
        self._refused = None

    def _connect_report(self, exc: BaseException | None) -> None:
        self._refused = exc

    def _getconn(self, deadline: float, started: float) -> psycopg.Connection[Any]:
        """A connection of the pool, waited for until *deadline* (see _POOL_SLICE);
        past it ``StoreBusy``, naming the server's refusal if the pool could not
        connect.  Not failed at once even on a refusal for good (a password changed
        under a running fleet): a write past its budget is spooled, and lands once
        the server takes it again."""
        pool = self._pool_for_use()
        while True:
            left = deadline - time.monotonic()
            try:
                conn: psycopg.Connection[Any] = pool.getconn(
                    timeout=max(min(left, _POOL_SLICE), 0.001)
                )
                return conn
            except psycopg_pool.PoolTimeout:
                if time.monotonic() < deadline:
                    continue
                refused = self._refused
                self._metrics.count("busy_timeouts")
                raise errors.StoreBusy(
                    self.path,
                    time.monotonic() - started,
                    1,
                    stage="pool" if refused is None else "connection",
                    reason="" if refused is None else _refusal(refused),
                ) from refused

    def _putconn(self, conn: psycopg.Connection[Any], discard: bool = False) -> None:
        pool = self._pool
        if discard and not conn.closed:
            with contextlib.suppress(Exception):
                conn.close()
        if pool is not None:
            with contextlib.suppress(Exception):
                pool.putconn(conn)

    # -- writing -----------------------------------------------------------------------------

    def run_write(self, fn: Callable[[WriteTx], T], *, single_statement: bool = False) -> T:
        """``fn(tx)`` in a write transaction, committed; run again from the start
        while PostgreSQL asks for it (see the module docstring), within
        ``write_budget`` seconds, then ``StoreBusy`` (nothing written).
        *single_statement*: *fn*'s one statement re-checks its own conditions (a claim
        with SKIP LOCKED): READ COMMITTED, where concurrent claimers skip each other's
        rows instead of failing."""
        return self._run(fn, "READ COMMITTED" if single_statement else _ISOLATION)

    def _run(self, fn: Callable[[WriteTx], T], isolation: str) -> T:
        me = threading.get_ident()
        if me in self._write_owner:
            raise errors.DatabaseError(
                f"{self.path}: db.write() inside a db.write() block of the same thread; "
                "do all the work in one block"
            )
        started = time.monotonic()
        deadline = started + self.settings.write_budget
        attempts = 0
        uncertain = False
        unique_retries = 0
        self._write_owner.add(me)
        try:
            while True:
                attempts += 1
                try:
                    return self._attempt(fn, started, deadline, uncertain, isolation)
                except _Retry as retry:
                    if retry.reason == "ambiguous_commits":
                        uncertain = True
                    if retry.reason == "unique_retries":
                        unique_retries += 1
                    self._metrics.count(retry.reason)
                    if time.monotonic() + retry.pause >= deadline:
                        self._metrics.count("busy_timeouts")
                        lost = "connection" in retry.reason
                        raise errors.StoreBusy(
                            self.path,
                            time.monotonic() - started,
                            attempts,
                            stage="connection" if lost else "statement",
                            reason=_refusal(retry.__cause__) if lost and retry.__cause__ else "",
                        ) from retry.__cause__
                    time.sleep(retry.pause * (0.5 + random.random()))
                except _UniqueViolation as exc:
                    if unique_retries >= _UNIQUE_RETRIES or time.monotonic() >= deadline:
                        raise exc.error from exc.__cause__
                    unique_retries += 1
                    self._metrics.count("unique_retries")
                    time.sleep(_RETRY_BASE * unique_retries * random.random())
        finally:
            self._write_owner.discard(me)

    def _attempt(
        self,
        fn: Callable[[WriteTx], T],
        started: float,
        deadline: float,
        uncertain: bool,
        isolation: str,
    ) -> T:
        try:
            conn = self._getconn(deadline, started)
        except errors.StoreBusy:
            raise
        except psycopg.Error as exc:
            raise _Retry("connection_retries", _RECONNECT_PAUSE) from exc
        discard = False
        stage = "begin"
        try:
            now = self._begin(conn, deadline, isolation)
            acquired = time.monotonic()
            tx = WriteTx(conn, self.path, now)
            tx.uncertain = uncertain
            stage = "body"
            try:
                result = fn(tx)
                stage = "commit"
                conn.execute(tx.commit_sql(self._commit_sql))
            finally:
                tx._open = False
            committed = time.monotonic()
            self._metrics.record_write(acquired - started, committed - acquired)
            return result
        except BaseException as exc:
            cause = exc.__cause__ if isinstance(exc, errors.FleetstoreError) else exc
            lost = isinstance(cause, psycopg.Error) and _connection_lost(cause, conn)
            discard = self._end_failed(conn, cause)
            if not isinstance(exc, Exception):
                raise
            self._metrics.count("write_errors")
            if lost:
                if stage == "commit":
                    raise _Retry("ambiguous_commits", _RETRY_BASE) from cause
                raise _Retry("connection_retries", _RECONNECT_PAUSE) from cause
            state = _sqlstate(cause) if cause is not None else ""
            if state == _READ_ONLY:  # thrown away by _end_failed; a new one finds the primary
                raise _Retry("connection_retries", _RECONNECT_PAUSE) from cause
            if state in ("40001", "40P01"):
                raise _Retry(
                    "serialization_retries" if state == "40001" else "deadlock_retries",
                    _RETRY_BASE,
                ) from cause
            if state == "55P03":  # lock_timeout: the budget is spent
                self._metrics.count("busy_timeouts")
                raise errors.StoreBusy(
                    self.path, time.monotonic() - started, 1, self._holders(), stage="statement"
                ) from cause
            if state == "23505" and isinstance(exc, errors.IntegrityError):
                raise _UniqueViolation(exc) from cause
            if isinstance(exc, psycopg.Error):
                raise _translate(exc, self.path) from exc
            raise
        finally:
            self._putconn(conn, discard)

    def _holders(self) -> list[errors.LockHolder]:
        """Sessions of other clients inside a transaction, oldest first (best effort):
        the likely holders of the lock this write waited for."""
        try:
            rows = self.read(
                lambda tx: tx.execute(
                    "SELECT pid, coalesce(application_name, ''), coalesce(host(client_addr), "
                    "'local'), left(query, 80) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND xact_start IS NOT NULL ORDER BY xact_start LIMIT 3"
                )
            )
        except errors.FleetstoreError:
            return []
        return [
            errors.LockHolder(
                int(pid), "postgresql", f"backend of {app or 'a client'} at {host}: {q}"
            )
            for pid, app, host, q in rows
        ]

    @contextlib.contextmanager
    def write(self) -> Iterator[WriteTx]:
        """A write transaction whose body runs once.  Unlike ``run_write`` nothing is
        retried: a serialization failure, deadlock or lost connection raises
        ``StoreBusy`` (a transient error).  For code that cannot be run again."""
        started = time.monotonic()
        deadline = started + self.settings.write_budget
        conn = self._getconn(deadline, started)
        discard = False
        try:
            now = self._begin(conn, deadline)
            acquired = time.monotonic()
            tx = WriteTx(conn, self.path, now)
            try:
                yield tx
                conn.execute(tx.commit_sql(self._commit_sql))
            finally:
                tx._open = False
            self._metrics.record_write(acquired - started, time.monotonic() - acquired)
        except BaseException as exc:
            cause = exc.__cause__ if isinstance(exc, errors.FleetstoreError) else exc
            discard = self._end_failed(conn, cause)
            self._metrics.count("write_errors")
            state = _sqlstate(cause) if cause is not None else ""
            if state == "55P03":  # lock_timeout: the budget is spent (as in _attempt)
                self._metrics.count("busy_timeouts")
            if discard or state in ("40001", "40P01", "55P03"):
                raise errors.StoreBusy(
                    self.path,
                    time.monotonic() - started,
                    1,
                    stage="connection" if discard else "statement",
                    reason=_refusal(cause) if discard and cause is not None else "",
                ) from cause
            if isinstance(exc, psycopg.Error):
                raise _translate(exc, self.path) from exc
            raise
        finally:
            self._putconn(conn, discard)

    def _begin(
        self, conn: psycopg.Connection[Any], deadline: float, isolation: str = _ISOLATION
    ) -> float:
        """BEGIN, the lock wait bounded by what is left of the budget, and the
        database clock, in one round trip."""
        left_ms = max(int((deadline - time.monotonic()) * 1000), 1)
        try:
            cur = psycopg.ClientCursor(conn)
            cur.execute(
                f"BEGIN ISOLATION LEVEL {isolation}; "
                f"SET LOCAL lock_timeout = {left_ms}; "
                "SELECT extract(epoch FROM transaction_timestamp())::float8"
            )
            while cur.nextset():  # the clock is the last statement's row
                pass
            row = cur.fetchone()
            cur.close()
        except psycopg.Error as exc:
            raise _translate(exc, self.path) from exc
        assert row is not None
        return float(row[0])

    def _end_failed(self, conn: psycopg.Connection[Any], cause: BaseException | None) -> bool:
        """Roll back after a failure; True if the connection must be thrown away: lost,
        left inside a transaction, or to a server that takes no writes (25006 in a
        write transaction: a standby, or a primary made read-only by a failover; a
        connection made now goes where ``target_session_attrs`` says)."""
        if isinstance(cause, psycopg.Error) and _connection_lost(cause, conn):
            return True
        if conn.closed or conn.broken:
            return True
        with contextlib.suppress(psycopg.Error):
            conn.execute("ROLLBACK")
        if cause is not None and _sqlstate(cause) == _READ_ONLY:
            return True
        return conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE

    # -- reading -----------------------------------------------------------------------------

    def read(self, fn: Callable[[ReadTx], T]) -> T:
        """``fn(tx)`` in a REPEATABLE READ, READ ONLY transaction (one snapshot).  A
        connection lost before *fn* returned is replaced and *fn* run again."""
        started = time.monotonic()
        deadline = started + self.settings.write_budget
        while True:
            conn = self._getconn(deadline, started)
            discard = False
            try:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                tx = ReadTx(conn, self.path, 0.0)
                try:
                    return fn(tx)
                finally:
                    tx._open = False
                    if not conn.closed and not conn.broken:
                        with contextlib.suppress(psycopg.Error):
                            conn.execute("ROLLBACK")
            except Exception as exc:
                cause = exc.__cause__ if isinstance(exc, errors.FleetstoreError) else exc
                if isinstance(cause, psycopg.Error) and _connection_lost(cause, conn):
                    discard = True
                    self._metrics.count("connection_retries")
                    if time.monotonic() + _RECONNECT_PAUSE < deadline:
                        time.sleep(_RECONNECT_PAUSE)  # a restarting server: not a hot loop
                        continue
                    raise errors.StoreBusy(
                        self.path,
                        time.monotonic() - started,
                        1,
                        stage="connection",
                        reason=_refusal(cause),
                    ) from cause
                if isinstance(exc, psycopg.Error):
                    raise _translate(exc, self.path) from exc
                raise
            finally:
                if conn.closed or conn.broken:
                    discard = True
                self._putconn(conn, discard)

    # -- notifications -----------------------------------------------------------------------

    #: A ring of another process wakes ``notify_wait`` (LISTEN/NOTIFY).
    notifies = True

    def _hearing(self, channel: str) -> Hearing:
        check_channel(channel)
        if self._closed:
            raise errors.StoreClosed(f"{self.path}: the database was closed")
        hearing = self._hearings.get(channel)
        if hearing is None:
            with self._listen_lock:
                hearing = self._hearings.get(channel)
                if hearing is None:
                    source = ListenSource(self.url, channel)
                    hearing = self._hearings[channel] = Hearing(channel, source)
        return hearing

    def notify_token(self, channel: str) -> int:
        """The token of ``notify_wait``: take it before looking for what a NOTIFY of
        *channel* announces, so that one between the look and the wait is not lost."""
        return self._hearing(channel).token()

    def notify_wait(self, channel: str, timeout: float, token: int | None = None) -> bool:
        """Wait up to *timeout* seconds for a NOTIFY on *channel* after *token* (from
        ``notify_token``; None: after this call); True if one came.  One listening
        connection per channel and process, outside the pool, shared by every thread
        (engine/notify.py)."""
        if not isinstance(timeout, int | float) or not 0 <= timeout <= 366 * 86400:
            raise errors.InvalidInput(f"timeout must be 0 to 366 days in seconds, not {timeout!r}")
        if token is not None and (not isinstance(token, int) or token < 0):
            raise errors.InvalidInput(f"token must be a count from notify_token, not {token!r}")
        return self._hearing(channel).wait(token, float(timeout))

    def listen(self, channel: str, fn: Callable[[], None]) -> Callable[[], None]:
        """Call *fn* (in the listener thread: it must return quickly) after each NOTIFY
        on *channel* heard from now on; returns the function that stops it."""
        if not callable(fn):
            raise errors.InvalidInput(f"fn must be callable, not {type(fn).__name__}")
        return self._hearing(channel).subscribe(fn)

    # -- migrations --------------------------------------------------------------------------

    def migrate(self, migrations: Sequence[Any]) -> list[int]:
        """Apply the migrations newer than the store's version, in one transaction
        under an advisory lock: processes starting at once apply each exactly once."""
        steps = ordered_migrations(migrations)
        if not steps:
            return []
        current = self.schema_version
        if current >= steps[-1].version:
            check_not_newer(self.path, current, steps)
            return []

        def apply(tx: WriteTx) -> list[int]:
            tx.execute(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
            tx.execute(
                f"CREATE TABLE IF NOT EXISTS {_MIGRATIONS_TABLE}("
                "version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
            version = self._version_in(tx)
            check_not_newer(self.path, version, steps)
            return apply_steps(
                tx,
                self.path,
                steps,
                version,
                f"INSERT INTO {_MIGRATIONS_TABLE}(version, name, applied_at) VALUES "
                "(?, ?, to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'))",
            )

        # READ COMMITTED, not a snapshot level: the snapshot is taken before the
        # advisory lock is granted, so a process that waited for another's migrations
        # would not see them and apply them again ("relation already exists":
        # tests/engine/test_pg_engine.py::test_eight_processes_migrating_*).  Read committed reads
        # the version after the lock.
        return self._run(apply, "READ COMMITTED")

    @staticmethod
    def _version_in(tx: _Tx) -> int:
        if not tx.execute("SELECT to_regclass(?)", (_MIGRATIONS_TABLE,))[0][0]:
            return 0
        return int(tx.execute(f"SELECT coalesce(max(version), 0) FROM {_MIGRATIONS_TABLE}")[0][0])

    @property
    def schema_version(self) -> int:
        return self.read(self._version_in)

    # -- observing ---------------------------------------------------------------------------

    def checkpoint(self, *, truncate: bool = False) -> tuple[int, int]:
        """Nothing to do: the server checkpoints its own WAL."""
        return (0, 0)

    def metrics(self) -> dict[str, Any]:
        pool = self._pool
        stats = pool.get_stats() if pool is not None else {}
        return {
            "pid": os.getpid(),
            "path": self.path,
            **self._metrics.snapshot(),
            "pool": {
                "max": self.settings.pool_size,
                "size": int(stats.get("pool_size", 0)),
                "idle": int(stats.get("pool_available", 0)),
                "waiting": int(stats.get("requests_waiting", 0)),
            },
        }

    def histograms(self) -> dict[str, Any]:
        return self._metrics.export()

    def connection_report(self) -> list[dict[str, Any]]:
        """One row per connection of this process's pool that is idle now."""
        if self._closed:
            raise errors.StoreClosed(f"{self.path}: the database was closed")
        report: list[dict[str, Any]] = []
        pool = self._pool
        if pool is None:
            return report
        stats = pool.get_stats()
        for _ in range(int(stats.get("pool_available", 0))):
            report.append({"role": "pooled", "in_transaction": False})
        return report

    # -- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        if os.getpid() != self._pid:
            self._after_fork()
            return
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(Exception):
                pool.close(timeout=5)
        hearings, self._hearings = list(self._hearings.values()), {}
        for hearing in hearings:
            hearing.close()

    def __enter__(self) -> PgDatabase:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<fleetstore.PgDatabase {self.path!r}{' closed' if self._closed else ''}>"


@contextlib.contextmanager
def outside_write_lock(url: str, *, exclusive: bool = False, wait: float = 30.0) -> Iterator[None]:
    """Every table of the database's schema locked ``IN EXCLUSIVE MODE`` (reads go on,
    every write waits) for the body of the ``with`` block, from a connection of its
    own, as another program could: ``fleetstore lock`` on a PostgreSQL store.
    *exclusive*: ``ACCESS EXCLUSIVE`` (reads wait too).  ``StoreBusy`` if not taken
    within *wait* seconds; ``FileNotFoundError`` if the database has no tables."""
    where = redact(url)
    started = time.monotonic()
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=max(2, min(int(wait), 10)))
    except psycopg.Error as exc:
        raise errors.DatabaseError(f"{where}: cannot connect: {exc}") from exc
    try:
        attempts = 0
        while True:
            attempts += 1
            left = started + wait - time.monotonic()
            # Each attempt waits a little longer, the last one all that is left.
            attempt_wait = min(left, 0.2 * 1.5 ** min(attempts - 1, 20))
            try:
                conn.execute("BEGIN")
                conn.execute(f"SET LOCAL lock_timeout = {max(int(attempt_wait * 1000), 1)}")
                tables = [
                    str(r[0])
                    for r in conn.execute(
                        "SELECT quote_ident(tablename) FROM pg_tables "
                        "WHERE schemaname = current_schema() ORDER BY tablename"
                    ).fetchall()
                ]
                if not tables:
                    raise FileNotFoundError(f"{where}: no tables there: not a store")
                mode = "ACCESS EXCLUSIVE" if exclusive else "EXCLUSIVE"
                # The tables are locked one after another: a writer that holds one and
                # waits for another is a deadlock, which PostgreSQL breaks only after
                # deadlock_timeout (1 s), mostly by failing this lock, the first to
                # wait; under steady writes that took the whole wait, attempt after
                # attempt (a 4.5 s lock in test_postgresql_target_passes_with_an_outside_lock
                # never taken).  A short lock_timeout per attempt lets go sooner; the
                # writers queued behind a waiting LOCK finish in milliseconds.
                conn.execute(f"LOCK TABLE {', '.join(tables)} IN {mode} MODE")
                break
            except psycopg.Error as exc:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
                state = _sqlstate(exc)
                if state in ("55P03", "40P01") and time.monotonic() < started + wait - 0.001:
                    time.sleep(0.001 * min(attempts, 50))
                    continue
                if state in ("55P03", "40P01"):
                    raise errors.StoreBusy(
                        where, time.monotonic() - started, attempts, stage="statement"
                    ) from None
                raise _translate(exc, where) from exc
        try:
            yield
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
    finally:
        conn.close()


class _UniqueViolation(Exception):
    def __init__(self, error: errors.FleetstoreError) -> None:
        super().__init__(str(error))
        self.error = error


__all__ = ["PgDatabase", "ReadTx", "WriteTx", "outside_write_lock", "to_psycopg"]
