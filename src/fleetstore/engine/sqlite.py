"""The SQLite engine: connection discipline, writer gate, budgeted lock wait, hygiene.

The write path (DESIGN.md, "The write path (SQLite)")::

    gate.acquire(deadline)        in-process lock + flock on <db>.gate
    BEGIN IMMEDIATE               retried every ~1 ms until the deadline, before the body
    body                          runs once
    COMMIT                        any error: ROLLBACK (discard the connection if that fails)
    gate.release(); checkpoint    outside the gate, when the WAL has grown
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import apsw

from fleetstore import errors
from fleetstore.core.files import check_private_file, private_dirs
from fleetstore.core.keys import keyring_of
from fleetstore.core.logs import logger
from fleetstore.core.metrics import WriteMetrics
from fleetstore.core.settings import Settings
from fleetstore.core.validate import check_bool, check_path, check_str
from fleetstore.engine import cipher
from fleetstore.engine.base import (
    Applier,
    Item,
    Migration,
    Tx,
    apply_steps,
    check_not_newer,
    ordered_migrations,
)
from fleetstore.engine.checkpoints import CatchUp, Checkpointer, Checkpoints
from fleetstore.engine.combine import Combiner
from fleetstore.engine.forkguard import GUARD
from fleetstore.engine.gate import GateTimeout, WriterGate
from fleetstore.engine.notify import Notifications, Notifier
from fleetstore.engine.proclocks import lock_holders
from fleetstore.engine.translate import translate
from fleetstore.engine.tx import ReadTx, WriteTx, _Tx

T = TypeVar("T")

log = logger("fleetstore")

_MIGRATIONS_TABLE = "fleetstore_migrations"
_BEGIN_RETRY_SLEEP = 0.001
#: The first retries of a BEGIN that met SQLite's lock: this process's own checkpoint
#: holds its locks for microseconds (a flat 1 ms nap cost a lone agent 90 ms per
#: 6,000 writes); an outside holder (``fleetstore lock``) is napped for at 1 ms.
_BEGIN_FIRST_RETRIES = (0.0, 0.00005, 0.0001, 0.0002, 0.0005)
_MAX_IDLE_READERS = 4
_LEVELS = {"OFF": 0, "NORMAL": 1, "FULL": 2, "EXTRA": 3}
#: How often (seconds) a write or read looks whether the file at the path is still
#: the one opened, when nothing announced a move (``FileMoved``: a file moved by hand).
IDENTITY_EVERY = 0.1


def _callable(fn: object) -> None:
    if not callable(fn):
        raise errors.InvalidInput(f"fn must be a function of the transaction, not {fn!r:.80}")


def _pragma(conn: apsw.Connection, name: str) -> int:
    value = conn.execute(f"PRAGMA {name}").fetchall()[0][0]
    return int(value) if isinstance(value, int | str) else 0


_guard = GUARD
_live: weakref.WeakSet[Database] = weakref.WeakSet()


def _own_file(path: str, foreign: bool) -> tuple[os.stat_result, bytes]:
    """Make or check the file at *path* before anything is made beside it: its
    ``fstat`` and its header (page 1 if encrypted: the key is tried on a copy).  Made
    0600 (SQLite would make it 0644, and -wal/-shm alike) in 0700 directories; one that
    exists must be empty or a SQLite database (SQLite wrote over a 1-byte file, and left
    a gate and journal beside a text file) and this user's alone (issue 23)."""
    try:
        found: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        found = None
    except OSError as exc:
        raise errors.DatabaseError(f"{path}: cannot open: {exc.strerror}") from exc

    def check(st: os.stat_result) -> None:
        if not (foreign and stat.S_ISREG(st.st_mode)):
            check_private_file(path, st)

    if found is not None and not stat.S_ISREG(found.st_mode):
        check(found)  # a link, a FIFO, a device: not even opened
    try:
        if found is None:
            private_dirs(os.path.dirname(os.path.abspath(path)))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if found is not None:
            check(found)  # another user's file we may not open: say so
        raise errors.DatabaseError(f"{path}: cannot open: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        head = os.pread(fd, cipher.HEADER_BYTES, 0) if st.st_size else b""
        if cipher.looks_encrypted(head):
            head = os.pread(fd, cipher.page_size(head), 0)
    finally:
        os.close(fd)
    known = head.startswith(cipher.SQLITE_MAGIC) or cipher.looks_encrypted(head)
    if st.st_size and not known and not os.path.lexists(path + "-journal"):
        # (A -journal beside it: a first write was cut short, page 1 perhaps torn;
        # SQLite rolls it back, or says what the file is.)
        raise errors.CorruptStore(
            f"{path}: file is not a database (it does not begin with SQLite's header: "
            f"{head[:16]!r}); it was not opened and nothing was made beside it"
        )
    check(st)  # what was opened: another process may have made it
    return st, head


def _after_fork_in_child() -> None:
    _guard.after_fork_in_child()
    for db in list(_live):
        if not db._closed:
            db._after_fork()


os.register_at_fork(
    before=_guard.before_fork,
    after_in_parent=_guard.after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)


class Database(Checkpoints, Notifications):
    """A SQLite file that many processes can write at once without "database is locked".

    >>> import tempfile, os
    >>> db = Database.open(os.path.join(tempfile.mkdtemp(), "app.db"),
    ...                    migrations=[Migration(1, "t", "CREATE TABLE t(v)")])
    >>> with db.write() as tx:
    ...     tx.execute("INSERT INTO t(v) VALUES (?) RETURNING v", (1,))
    [(1,)]
    >>> db.read(lambda tx: tx.execute("SELECT v FROM t"))
    [(1,)]
    >>> db.close()
    """

    dialect = "sqlite"
    # Tests point this at a statement that fails, to drive the discard path.
    _rollback_sql = "ROLLBACK"

    def __init__(self, path: str, settings: Settings) -> None:
        self.path = os.path.abspath(path)
        self.gate_path = self.path + ".gate"
        self.settings = settings
        self._lock = threading.Lock()  # guards the connection slots below
        self._checkpoint_lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        #: (st_dev, st_ino) of the file opened: a write or read that finds another
        #: file (or none) at the path raises FileMoved instead of using a moved file.
        self._identity: tuple[int, int] | None = None
        #: Set by a ShardSet: the figures of all its files in one place.
        self.shared_metrics: WriteMetrics | None = None
        #: Group commit (engine/combine.py): what applies other processes' items, and
        #: the tag that says which code they must have been made by (``serve``).
        self._applier: Applier | None = None
        self._tag = ""
        #: Run before every checkpoint: what the rows about to become durable refer to
        #: must be durable first (the store's blob files under synchronous=NORMAL).
        self._before_checkpoint: Callable[[], None] | None = None
        #: synchronous as a number (OFF 0 .. EXTRA 3): group commit carries it with each
        #: item, and a holder commits at the most durable level of its batch.
        self._level = _LEVELS[settings.synchronous.upper()]
        #: The raw key every connection is given first (None: not encrypted).
        self._key: bytes | None = None
        self._reset_process_state()
        _live.add(self)

    def _reset_process_state(self) -> None:
        self._writer: apsw.Connection | None = None
        self._checkpointer: apsw.Connection | None = None
        self._idle_readers: list[apsw.Connection] = []
        self._busy_readers: set[apsw.Connection] = set()
        self._gate = WriterGate(self.gate_path, cross_process=self.settings.gate)
        #: Channels rung after COMMIT, heard by listener threads (engine/notify.py).
        self._notifier = Notifier(self._gate)
        self._moved_seen = 0 if self._gate.moved_word is None else self._gate.moved_word.value
        self._identity_due = 0.0
        self._metrics = self.shared_metrics if self.shared_metrics is not None else WriteMetrics()
        self._wal_frames = 0
        self._checkpoint_due = False
        #: A checkpoint that could not copy the whole WAL while writers went on asks
        #: the next writer of this process to copy the rest before it releases the gate.
        self._catch_up = CatchUp()
        self._frame_bytes = 4096 + 24
        self._checkpoint_step = max(self.settings.checkpoint_bytes // self._frame_bytes, 1)
        self._write_owner = 0  # thread inside write(), to refuse nesting
        self._cursor: apsw.Cursor | None = None  # the writer's, from one write to the next
        self._cursor_of: apsw.Connection | None = None  # ... of this connection
        self._tx_level = self._level  # synchronous of the writer connection now
        # Checkpoints run in a thread of their own: a passive checkpoint fsyncs the WAL
        # and the database (8-12 ms measured), which the writer whose commit crossed
        # the line used to wait out before its write returned.
        self._checkpoints = Checkpointer(self)
        self._combiner = Combiner(
            self, self._applier, self._tag, self.settings.write_budget, self._level
        )

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        migrations: Sequence[Migration] = (),
        *,
        foreign: bool = False,
        **settings: Any,
    ) -> Database:
        """Open (creating if needed, mode 0600, in directories made 0700) the database
        at *path*, switch it to WAL if it is not already, and apply the *migrations* it
        lacks, exactly once across every process opening it at the same time.  A file
        that is not this user's alone is refused (``UnsafeFile``), one that is neither
        empty nor a SQLite database too (``CorruptStore``), before anything is made
        beside it.  *foreign*: the file is another program's, opened to maintain what
        it holds, not to write secrets into: who may read it is that program's business,
        and only its kind is checked (the gate file is still made beside it: ``fleetstore
        maintain`` uses ``files.outside.OutsideFile`` instead).
        *settings* are ``Settings`` fields, each also readable from
        ``FLEETSTORE_<NAME>``."""
        check_bool(foreign, "foreign")
        config = Settings.load(**settings)
        path = check_path(path)
        ordered_migrations(migrations)  # checked before the file is made
        if path in ("", ":memory:") or path.startswith("file:"):
            raise errors.ConfigError(
                f"a file path is required, not {path!r}: processes share files"
            )
        keyring = keyring_of(config.encryption_key_file)
        st, head = _own_file(path, foreign)
        # Before the gate or anything else is made beside it: a wrong key changes nothing.
        key = cipher.choose_key(path, head, keyring, lambda: _own_file(path, foreign)[1])
        db = cls(path, config)
        db._identity = (st.st_dev, st.st_ino)
        db._key = key
        try:
            fresh = st.st_size == 0
            db._wait_for_space(lambda: db._prepare(fresh, migrations))
            if fresh and key is not None:
                cipher.check_encrypted(db.path)
        except BaseException:
            db.close()
            raise
        return db

    def _prepare(self, fresh: bool, migrations: Sequence[Migration]) -> None:
        self._prepare_file(fresh)
        if migrations:
            self.migrate(migrations)

    def _wait_for_space(self, step: Callable[[], None]) -> None:
        """*step*, run again while the disk is full, within the write budget (a full
        disk is waited out like an outside lock: issue 23, agents restarted during one
        exited at open), then ``StorageFull``."""
        deadline = time.monotonic() + self.settings.write_budget
        pause = 0.005
        while True:
            try:
                return step()
            except errors.StorageFull:
                if time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.25)

    def _prepare_file(self, fresh: bool) -> None:
        conn = self._writer_connection()
        try:
            with _guard.inside():
                # (A first read may meet another process recovering the WAL: wait.)
                conn.setbusytimeout(self.settings.busy_timeout_ms)
                try:
                    page_size = _pragma(conn, "page_size")
                    mode = self._journal_mode(conn)
                finally:
                    conn.setbusytimeout(0)
        except apsw.Error as exc:
            raise translate(exc, self.path) from exc
        self._frame_bytes = page_size + 24
        self._checkpoint_step = max(self.settings.checkpoint_bytes // self._frame_bytes, 1)
        if mode == "wal" and not fresh:
            return
        # The switch needs the file to itself and fails at once (or silently keeps
        # the old mode) while another process holds a lock: do it under the gate,
        # only when needed, and check the mode it reports.
        started = time.monotonic()
        deadline = started + self.settings.write_budget
        self._acquire_gate(started, deadline)
        try:
            if fresh:
                with contextlib.suppress(apsw.Error), _guard.inside():
                    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            while True:
                try:
                    with _guard.inside():
                        switched = self._journal_mode(conn, "WAL") == "wal"
                    if switched:
                        return
                except apsw.BusyError:
                    pass
                except apsw.Error as exc:
                    raise translate(exc, self.path) from exc
                if time.monotonic() >= deadline:
                    raise errors.StoreBusy(
                        self.path,
                        time.monotonic() - started,
                        1,
                        lock_holders(self.path, self.gate_path),
                        stage="journal mode switch",
                    )
                time.sleep(_BEGIN_RETRY_SLEEP)
        finally:
            self._gate.release()

    @staticmethod
    def _journal_mode(conn: apsw.Connection, new: str | None = None) -> str:
        sql = "PRAGMA journal_mode" + (f"={new}" if new else "")
        return str(conn.execute(sql).fetchall()[0][0]).lower()

    def _connect(
        self, role: str, outcome: str = "the connection was not opened; nothing was written"
    ) -> apsw.Connection:
        conn: apsw.Connection | None = None
        try:
            with _guard.inside():
                conn = cipher.connect(
                    self.path, apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW, self._key
                )
                self._configure(conn, role)
        except apsw.Error as exc:
            # Translated before the close: the connection's errno tells a full disk.
            failed = translate(exc, self.path, conn, outcome=outcome)
            if conn is not None:
                with contextlib.suppress(apsw.Error):
                    conn.close(True)
            raise failed from exc
        return conn

    def _configure(self, conn: apsw.Connection, role: str) -> None:
        """Every connection, on open and again after migrations: busy timeout (the
        backstop), synchronous, foreign keys; writers also hand checkpoints to us."""
        conn.setbusytimeout(self.settings.busy_timeout_ms)
        conn.execute(f"PRAGMA synchronous={self.settings.synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        if role == "reader":
            conn.execute("PRAGMA query_only=ON")
        if role == "writer":
            # Pages reach the WAL only at COMMIT: a rollback never has to undo
            # frames in the shared WAL index (see _after_fork).
            conn.execute("PRAGMA cache_spill=OFF")
            # SQLite's auto-checkpoint runs inside COMMIT, i.e. while the gate is
            # held; a WAL hook of our own replaces it and counts the frames so we
            # checkpoint after release (DESIGN.md: 1.3-1.56x).
            conn.execute("PRAGMA wal_autocheckpoint=0")
            conn.set_wal_hook(self._on_wal_commit)
            # The writer keeps no busy timeout once configured (these pragmas may meet
            # another process making the file): its BEGIN IMMEDIATE is the only statement
            # of a write that can wait, and fleetstore retries it itself, 1 ms steps,
            # gate holder only (setting it and back around every BEGIN was 1-2 us a
            # write: issue 24).
            conn.setbusytimeout(0)

    def _on_wal_commit(self, _conn: apsw.Connection, _name: str, frames: int) -> int:
        # Runs inside COMMIT, once the commit is in the WAL, gate held: an error
        # returned (or raised) here would make COMMIT raise for a committed
        # transaction.  The gate file carries the WAL size the previous committer saw,
        # so exactly one process (the one whose commit crosses a multiple of
        # checkpoint_bytes) checkpoints, where a count per process made a fleet of 64
        # checkpoint 64 times as often (benchmarks).
        try:
            # (No local name for the view: a logged error's traceback keeping this frame
            # would keep the gate's mapping from being closed.)
            gate = self._gate
            if gate._wal_word is None:
                before = self._wal_frames
            else:
                before = gate._wal_word.value
                gate._wal_word.value = frames
            if frames <= before:  # the WAL was started over since (a commit adds frames)
                before = 0
                self._metrics.count("wal_restarts")
            self._wal_frames = frames
            step = self._checkpoint_step
            if frames // step > before // step:
                self._checkpoint_due = True
        except Exception as exc:
            self._background_error("WAL size count", exc)
        return apsw.SQLITE_OK

    def _check_process(self) -> None:
        # (A forked child was already dealt with by the at-fork hook.)
        if self._closed:
            raise errors.StoreClosed(f"{self.path}: the database was closed")

    def _after_fork(self) -> None:
        """In a forked child, before it runs any code of its own (os.register_at_fork).

        SQLite keeps lock state per file in process memory, shared by every
        connection of the process.  A child that merely stopped using the inherited
        connections would open new ones that believe the locks are held and take no
        real lock: a parent closing its last connection then deletes the WAL under the
        child's acknowledged commits.  So the child closes the inherited connections
        (its unlocks are no-ops: POSIX locks are not inherited) and opens its own.  The
        writer never spills to the WAL before COMMIT (cache_spill=OFF), so closing it
        mid-transaction has nothing in the shared WAL index to undo.  Connections in
        use by other parent threads are closed too: the fork guard (_ForkGuard) made
        the fork wait until none of them was inside SQLite.
        The inherited gate descriptor shares the parent's open file: it is closed, never
        unlocked, or a parent killed while holding the gate would leave it held by us.
        tests/engine/test_fleet.py: test_fork_child_*, test_kill9_of_writer_whose_forked_child_*
        """
        # (No self._lock here: a parent thread may have held it at fork time.)
        inherited = [*self._idle_readers, *self._busy_readers, self._writer, self._checkpointer]
        for conn in inherited:
            if conn is not None:
                with contextlib.suppress(apsw.Error):
                    conn.close(True)
        self._notifier.forget()
        self._gate.close_inherited()
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        self._reset_process_state()

    def _writer_connection(self) -> apsw.Connection:
        if self._writer is None:
            with _guard.inside():
                self._writer = self._connect("writer")
        return self._writer

    def _discard(self, conn: apsw.Connection) -> None:
        self._metrics.count("discarded_connections")
        if self._cursor_of is conn:
            self._cursor = self._cursor_of = None
        if conn is self._writer:
            self._writer = None
        with contextlib.suppress(apsw.Error), _guard.inside():
            conn.close(True)

    # -- writing ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def write(self) -> Iterator[WriteTx]:
        """A write transaction: gate, then ``BEGIN IMMEDIATE``, both waited for within
        ``write_budget`` seconds (``StoreBusy`` past it, nothing written).  The body runs
        once; if it raises, the transaction is rolled back and the error re-raised."""
        if self._closed:
            raise errors.StoreClosed(f"{self.path}: the database was closed")
        if self._write_owner == threading.get_ident():
            # The gate is not re-entrant: without this check the inner write
            # would wait out the whole budget on its own thread.
            raise errors.DatabaseError(
                f"{self.path}: db.write() inside a db.write() block of the same thread; "
                "do all the work in one block"
            )
        started = time.monotonic()
        gate = self._gate  # a child forked inside the block releases the old one
        self._acquire_gate(started, started + self.settings.write_budget)
        try:
            tx = self._open_write(started, started + self.settings.write_budget)
            acquired = time.monotonic()
            # A block of code of its own may read another database attached to the
            # writer, whose locks can be busy: it gets the busy timeout back (the store's
            # operations take no other lock, and their writes set none).
            conn = tx._conn
            conn.setbusytimeout(self.settings.busy_timeout_ms)
            try:
                yield tx
            except BaseException:
                self._end_write(tx, commit=False)
                raise
            finally:
                with contextlib.suppress(apsw.Error):
                    conn.setbusytimeout(0)
            self._end_write(tx, commit=True)
        finally:
            self._hand_on(gate)
        self._after_commit(acquired - started, time.monotonic() - acquired)

    def _hand_on(self, gate: WriterGate) -> None:
        """Release the gate after a transaction, committed or not, waking the next
        writer.  Never raises: an error here must not turn a commit into a failure
        (nor hide the error a failed block raises); it is logged and counted."""
        combiner = self._combiner
        for step, fn in (
            ("gate hand-off", combiner.hand_off),
            ("gate release", gate.release),
            ("gate wake-up", combiner.woken),
        ):
            try:
                fn()
            except Exception as exc:
                self._background_error(step, exc)

    def _after_commit(self, wait: float, hold: float, items: int = 0, served: int = 0) -> None:
        """What follows a commit: figures, and a checkpoint if due.  Never raises (the
        commit stands whatever happens here: tests/engine/test_faults.py)."""
        try:
            self._metrics.record_write(wait, hold, items, served)
            if self._checkpoint_due:
                self._checkpoint_due = False
                self._checkpoints.request()
        except Exception as exc:
            self._background_error("after commit", exc)

    def _background_error(self, what: str, exc: BaseException) -> None:
        """A failure of work that follows a commit (or runs beside the writers): the
        commit stands; logged, counted, and shown in ``metrics()`` and by doctor."""
        counter = "checkpoint_errors" if what == "checkpoint" else "post_commit_errors"
        self._metrics.note_error(counter, what, exc)
        log.error(
            "%s: %s failed (committed writes stand): %s: %s",
            self.path,
            what,
            type(exc).__name__,
            exc,
            extra={
                "event": "checkpoint_failed" if what == "checkpoint" else "post_commit_error",
                "store": self.path,
                "step": what,
                "error": f"{type(exc).__name__}: {exc}",
            },
        )

    def before_checkpoint(self, fn: Callable[[], None]) -> None:
        """Call *fn* before every checkpoint of this database (a checkpoint makes
        durable whatever the WAL's frames say; *fn* makes durable what they refer to).
        If *fn* raises, that checkpoint does not run."""
        if not callable(fn):
            raise errors.InvalidInput(f"fn must be callable, not {type(fn).__name__}")
        self._before_checkpoint = fn

    # -- group commit ----------------------------------------------------------------------

    def serve(self, tag: str, applier: Applier) -> None:
        """Take part in group commit across processes (engine/combine.py): while this
        process holds the gate it applies, in its own transaction, the items other
        processes of the same *tag* posted, with *applier*; and its own ``submit``
        items may be applied by theirs.  *tag* names the code that may apply an item
        (an item posted under another tag is left to its own process)."""
        self._check_process()
        check_str(tag, "tag", limit=256, empty=False)
        if not callable(applier):
            raise errors.InvalidInput(f"applier must be callable, not {type(applier).__name__}")
        self._applier, self._tag = applier, tag
        self._combiner = Combiner(self, applier, tag, self.settings.write_budget, self._level)

    def submit(self, item: Item) -> object:
        """Apply *item* in a write transaction, committed with whatever else is written
        at the same moment: the items of this process's other threads, and, once
        ``serve`` was called, those of other processes waiting for the gate (each in
        its own savepoint: one that raises fails alone).  Returns what ``item.run``
        (or the applier, through ``item.result``) returned; raises what it raised, or
        ``StoreBusy`` past the write budget with nothing written.  An item whose COMMIT
        failed syncing is applied once more if it may run again (``payload()`` is not
        None), within its budget; else, or if that does not succeed in time, it raises
        ``CommitUncertain``.  A full disk is waited out within the budget, then
        ``StorageFull``."""
        if self._closed:
            raise errors.StoreClosed(f"{self.path}: the database was closed")
        if self._write_owner and self._write_owner == threading.get_ident():
            raise errors.DatabaseError(
                f"{self.path}: db.submit() inside a db.write() block of the same thread"
            )
        try:
            return self._combiner.submit(item, time.monotonic())
        except AttributeError:
            # Looked at here, not per write (a check per write was 12 Python calls).
            if not all(callable(getattr(item, n, None)) for n in ("run", "payload", "result")):
                raise errors.InvalidInput(
                    f"item must have run(), payload() and result() (engine.base.Item), not "
                    f"{type(item).__name__}"
                ) from None
            raise

    def _open_write(self, started: float, deadline: float, level: int = -1) -> WriteTx:
        """The gate held: BEGIN IMMEDIATE on the writer connection within *deadline*
        (``StoreBusy`` past it), committed at durability *level* (-1: this connection's;
        SQLite reads ``synchronous`` when a transaction begins, so it is set before);
        inside the fork guard until ``_end_write``.  The one way every write of this
        engine begins (``write()``, group commit's rounds and its lone writes)."""
        conn = self._writer or self._writer_connection()
        if level >= 0:
            self._set_level(conn, level)
        try:
            self._begin_immediate(conn, started, deadline)  # returns inside the fork guard
        except BaseException:
            if level >= 0:
                self._set_level(conn, self._level)
            raise
        # (No local name for the gate's view: a traceback keeping this frame would keep
        # the mapping from being closed by a caller that drops the file.)
        gate = self._gate
        if (
            started >= self._identity_due
            or (gate.moved_word is not None and gate.moved_word.value != self._moved_seen)
        ) and not self._still_here(started):
            self._rollback(conn)
            _guard.exit()
            raise errors.FileMoved(f"{self.path}: the file was moved or removed")
        self._write_owner = threading.get_ident()
        tx = WriteTx(conn, self.path, time.time())
        # The writer's cursor is kept from one transaction to the next (a cursor per
        # transaction was 4 Python calls a write): every statement is read whole, so
        # none is left active; a transaction that failed drops it (engine/tx.py).
        if self._cursor_of is conn:
            tx._cursor_ = self._cursor
        return tx

    def _end_write(self, tx: Tx, commit: bool) -> None:
        """COMMIT (*commit*) or roll back the transaction of ``_open_write``; a COMMIT
        that fails is rolled back and raised as its fleetstore error (one mapping for
        every path).  Then, gate still held, the WAL's last frames are copied if a
        checkpoint asked for it."""
        conn = tx._conn  # type: ignore[attr-defined]
        self._cursor, tx._cursor_ = tx._cursor_, None  # type: ignore[attr-defined]
        self._cursor_of = conn if self._cursor is not None else None
        try:
            if commit:
                try:
                    conn.execute("COMMIT")
                except apsw.Error as exc:
                    self._metrics.count("write_errors")
                    failed = translate(exc, self.path, conn, commit=True)
                    self._rollback(conn)
                    raise failed from exc
                notes = tx._notes  # type: ignore[attr-defined]
                if notes:
                    # After COMMIT, never before: a waiter woken looks at once, and must
                    # find what was rung about (tests/engine/test_notify.py).  Never
                    # raises: the commit stands.
                    try:
                        self._notifier.ring(notes)
                    except Exception as exc:
                        self._background_error("notification", exc)
                if self._catch_up.wanted:
                    self._catch_up_if_asked()
            else:
                self._metrics.count("write_errors")
                self._rollback(conn)
        finally:
            tx._open = False  # type: ignore[attr-defined]
            self._write_owner = 0
            if self._tx_level != self._level:
                self._set_level(conn, self._level)
            _guard.exit()

    def _set_level(self, conn: apsw.Connection, level: int) -> None:
        with contextlib.suppress(apsw.Error):
            conn.execute(f"PRAGMA synchronous={level}")
            self._tx_level = level

    def _in_transaction(self) -> bool:
        writer = self._writer
        return writer is not None and bool(writer.in_transaction)

    def _committed(self, started: float, acquired: float, items: int, served: int) -> None:
        """Group commit's figures after a COMMIT; never raises (see ``_after_commit``)."""
        self._after_commit(acquired - started, time.monotonic() - acquired, items, served)

    #: (The combiner's lone writes call ``_after_commit`` themselves.)

    def _handed_over(self) -> None:
        self._metrics.count("handed_over")

    def _count(self, name: str) -> None:
        self._metrics.count(name)

    def run_write(self, fn: Callable[[WriteTx], T], *, single_statement: bool = False) -> T:
        """``fn(tx)`` in one write transaction (``write()``), committed; the engines'
        common way to write (on PostgreSQL *fn* may run more than once).  SQLite's
        writers are serial: *single_statement* changes nothing here."""
        _callable(fn)
        check_bool(single_statement, "single_statement")
        with self.write() as tx:
            return fn(tx)

    def _acquire_gate(self, started: float, deadline: float) -> None:
        try:
            if self._gate.acquire(deadline):
                self._metrics.count("gate_contended")
        except GateTimeout:
            self._metrics.count("busy_timeouts")
            raise errors.StoreBusy(
                self.path,
                time.monotonic() - started,
                1,
                lock_holders(self.path, self.gate_path),
                stage="gate",
            ) from None

    def _begin_immediate(self, conn: apsw.Connection, started: float, deadline: float) -> None:
        """BEGIN IMMEDIATE, retried every ~1 ms while a process outside the gate holds
        the SQLite lock.  Never deferred BEGIN: its later upgrade to a write lock
        returns BUSY at once without calling any busy handler.  Returns inside the
        fork guard (the caller exits it); sleeps between attempts outside it."""
        _guard.enter()
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except apsw.BusyError:
            pass
        except apsw.Error as exc:
            if not conn.in_transaction:
                _guard.exit()
                raise translate(exc, self.path) from exc
        except BaseException:
            _guard.exit()
            raise
        self._begin_waiting(conn, started, deadline)

    def _begin_waiting(self, conn: apsw.Connection, started: float, deadline: float) -> None:
        """``_begin_immediate``'s first attempt met a lock (an outside holder, or this
        process's checkpoint) or a transaction left open: try again until *deadline*."""
        attempts = 0
        try:
            while True:
                attempts += 1
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except apsw.BusyError:
                    pass
                except apsw.Error as exc:
                    if conn.in_transaction and attempts == 1:
                        # Left behind by a failure we could not see ("cannot start
                        # a transaction within a transaction"): roll it back and
                        # try once more; a connection that cannot roll back is
                        # discarded.
                        self._rollback(conn)
                        if self._writer is conn:
                            continue
                    raise translate(exc, self.path) from exc
                self._metrics.count("begin_busy_retries")
                if time.monotonic() >= deadline:
                    self._metrics.count("busy_timeouts")
                    raise errors.StoreBusy(
                        self.path,
                        time.monotonic() - started,
                        attempts,
                        # We hold the gate ourselves; name the outside holder.
                        [
                            h
                            for h in lock_holders(self.path, self.gate_path)
                            if h.pid != os.getpid()
                        ],
                        stage="sqlite",
                    )
                # A fork need not wait for an outside holder of the lock.
                _guard.exit()
                try:
                    if attempts <= len(_BEGIN_FIRST_RETRIES):
                        time.sleep(_BEGIN_FIRST_RETRIES[attempts - 1])
                    else:
                        time.sleep(_BEGIN_RETRY_SLEEP)
                finally:
                    _guard.enter()
        except BaseException:
            _guard.exit()
            raise

    def _rollback(self, conn: apsw.Connection) -> None:
        """After any error: roll back; a connection that cannot is thrown away, so no
        later BEGIN meets "cannot start a transaction within a transaction"."""
        try:
            if conn.in_transaction:
                conn.execute(self._rollback_sql)
            if not conn.in_transaction:
                return
        except apsw.Error:
            pass
        self._discard(conn)

    # -- reading ---------------------------------------------------------------------------

    def _still_here(self, now: float) -> bool:
        """Whether the file at the path is still the one opened: looked at (an
        ``os.stat``) when a tool of ours announced a move in the gate file, and every
        ``IDENTITY_EVERY`` seconds for a file moved by hand (a stat per write and read
        was a tenth of the engine's own cost of a write: issue 24).  A file moved or
        removed is refused (``FileMoved``): a fresh one made at its path would lose the
        writes made here."""
        gate = self._gate
        moved = gate.moved_word is not None and gate.moved_word.value != self._moved_seen
        if now < self._identity_due and not moved:
            return True
        self._identity_due = now + IDENTITY_EVERY
        if moved and gate.moved_word is not None:
            self._moved_seen = gate.moved_word.value
        if self._identity is None or self._same_file():
            return True
        self._identity_due = float("inf")  # gone for good: every later write and read
        self._moved_seen = -1
        return False

    def _same_file(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self._identity

    def read(self, fn: Callable[[ReadTx], T]) -> T:
        """Call ``fn(tx)`` inside a read transaction (one snapshot) on a read connection,
        without the gate, and return what it returns."""
        _callable(fn)
        self._check_process()
        if not self._still_here(time.monotonic()):
            raise errors.FileMoved(f"{self.path}: the file was moved or removed")
        # Inside the fork guard from before the connection leaves the idle list until
        # it is back: at a fork every connection is in a list the child closes.
        _guard.enter()
        try:
            return self._read(fn)
        finally:
            _guard.exit()

    def _read(self, fn: Callable[[ReadTx], T]) -> T:
        with self._lock:
            conn = self._idle_readers.pop() if self._idle_readers else None
        if conn is None:
            conn = self._connect("reader")
        self._busy_readers.add(conn)
        tx = ReadTx(conn, self.path, time.time())
        healthy = False
        try:
            try:
                conn.execute("BEGIN")
                result = fn(tx)
            except apsw.Error as exc:
                raise translate(exc, self.path) from exc
            finally:
                tx._open = False
                tx._drop_cursor()
                try:
                    if conn.in_transaction:
                        conn.execute(self._rollback_sql)
                    healthy = not conn.in_transaction
                except apsw.Error:
                    healthy = False
            return result
        finally:
            self._busy_readers.discard(conn)
            if not healthy:
                self._discard(conn)
            else:
                with self._lock:
                    if len(self._idle_readers) < _MAX_IDLE_READERS and not self._closed:
                        self._idle_readers.append(conn)
                        conn = None
                if conn is not None:
                    conn.close()

    # -- migrations ------------------------------------------------------------------------

    def migrate(self, migrations: Sequence[Migration]) -> list[int]:
        """Apply, in one write transaction, the migrations newer than the store's
        version; the version is read again inside the transaction, so processes
        starting together apply each migration once.  Returns the versions applied."""
        steps = ordered_migrations(migrations)
        version = self.schema_version
        if not steps or version >= steps[-1].version:
            check_not_newer(self.path, version, steps)
            return []
        applied: list[int] = []
        try:
            with self.write() as tx:
                tx.execute(
                    f"CREATE TABLE IF NOT EXISTS {_MIGRATIONS_TABLE}("
                    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
                )
                current = self._version_in(tx)
                check_not_newer(self.path, current, steps)
                applied = apply_steps(
                    tx,
                    self.path,
                    steps,
                    current,
                    f"INSERT INTO {_MIGRATIONS_TABLE}(version, name, applied_at) "
                    "VALUES (?, ?, strftime('%Y-%m-%dT%H:%M:%fZ','now'))",
                )
        finally:
            # Migration SQL may change pragmas (foreign_keys, busy_timeout...):
            # re-assert them on the connection that ran it, failure or not.
            if self._writer is not None:
                with contextlib.suppress(apsw.Error):
                    self._configure(self._writer, "writer")
        return applied

    @staticmethod
    def _version_in(tx: _Tx) -> int:
        exists = tx.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (_MIGRATIONS_TABLE,)
        )
        if not exists:
            return 0
        return int(tx.execute(f"SELECT coalesce(max(version), 0) FROM {_MIGRATIONS_TABLE}")[0][0])

    @property
    def schema_version(self) -> int:
        """The newest migration applied to this store (0 for none)."""
        return self.read(self._version_in)

    # -- observing -------------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """This process's write figures for this database (JSON-serialisable)."""
        return {"pid": os.getpid(), "path": self.path, **self._metrics.snapshot()}

    def histograms(self) -> dict[str, Any]:
        """The raw ``lock_wait`` and ``lock_hold`` histograms of ``metrics()``, to be
        merged with other processes' (``fleetstore.core.metrics.Histogram.from_buckets``)."""
        return self._metrics.export()

    def connection_report(self) -> list[dict[str, Any]]:
        """The settings each open connection of this process reports now."""
        self._check_process()
        with _guard.inside():
            return self._connection_report()

    def _connection_report(self) -> list[dict[str, Any]]:
        with self._lock:
            conns = [("writer", self._writer), ("checkpointer", self._checkpointer)]
            conns += [("reader", c) for c in self._idle_readers]
        report = []
        for role, conn in conns:
            if conn is None:
                continue
            sync = _pragma(conn, "synchronous")
            report.append(
                {
                    "role": role,
                    "journal_mode": self._journal_mode(conn),
                    "busy_timeout": _pragma(conn, "busy_timeout"),
                    "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[sync],
                    "foreign_keys": bool(_pragma(conn, "foreign_keys")),
                    "wal_autocheckpoint": _pragma(conn, "wal_autocheckpoint"),
                    # A connection left inside a transaction would hold the lock
                    # (a writer) or pin the WAL (a reader) for ever.
                    "in_transaction": bool(conn.in_transaction),
                }
            )
        return report

    # -- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close every connection of this process.  Idempotent."""
        if self._closed:
            return
        if os.getpid() != self._pid:
            self._after_fork()
        self._checkpoints.stop()
        self._closed = True
        _live.discard(self)
        self._combiner.close()
        self._notifier.close()
        with _guard.inside():
            with self._lock:
                conns = [*self._idle_readers, self._checkpointer, self._writer]
                self._idle_readers = []
                self._writer = self._checkpointer = None
            for conn in conns:
                if conn is not None:
                    with contextlib.suppress(apsw.Error):
                        conn.close(True)
        self._gate.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<fleetstore.Database {self.path!r}{' closed' if self._closed else ''}>"


__all__ = ["Database", "Migration", "ReadTx", "WriteTx"]
