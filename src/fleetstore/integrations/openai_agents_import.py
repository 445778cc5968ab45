"""``fleetstore import --from openai-agents-sqlite FILE``: bring the histories an
Agents SDK ``SQLiteSession`` kept (tables ``agent_sessions`` and
``agent_messages``) into a fleetstore store, where ``FleetstoreSession`` reads them.

Does not need the SDK installed.  The file is read strictly read-only, in one
read transaction (``fleetstore.engine.foreign``: no journal mode switch, no
``-wal``/``-shm`` created), so the SDK's own processes may keep using it.

Three steps:

1. Check, writing nothing: the file is SQLite with the SDK's tables; every row's
   ``message_data`` is a JSON object the store accepts; and for each session
   already in the store, its items are exactly the first items of the file's
   (imported before, by this importer).  Anything else, and nothing is written.
2. Append, per session, the rows the store does not have yet, in row order, in
   batches (one transaction each, all or none), each only if the session still
   ends with the item before it.  Message ids derive from (session id, row id),
   so importing twice changes nothing, and a file that grew imports only its new
   rows.  A session that has no rows is created empty.
3. Verify: read every imported session back and compare its item count and each
   item's SHA-256 (of its canonical JSON) with the file's.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetstore import errors
from fleetstore.core.ids import derived_id, new_id
from fleetstore.domain.frameworks import openai_agents as agents_ops
from fleetstore.domain.operations import Operation
from fleetstore.engine import foreign, inspect

if TYPE_CHECKING:
    from fleetstore.store.facade import Store

#: Items appended per transaction (the lock is held for one batch at a time).
BATCH = 200
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_SDK_TIME = "%Y-%m-%d %H:%M:%S"


class ImportNotVerified(errors.PermanentError):
    """After the import, the store does not read back what the file holds."""


@dataclass(frozen=True, slots=True)
class ImportSummary:
    """What an import did: sessions and items in the file, items written now,
    items already there, and how many items were read back and matched."""

    sessions: int
    items: int
    inserted: int
    unchanged: int
    verified: int
    skipped_rows: tuple[int, ...] = ()

    def describe(self) -> str:
        skipped = f", {len(self.skipped_rows)} invalid rows skipped" if self.skipped_rows else ""
        return (
            f"{self.sessions} sessions, {self.items} items: {self.inserted} new, "
            f"{self.unchanged} already there; {self.verified} items verified{skipped}"
        )


@dataclass
class _Plan:
    """One session of the file: its rows, and how many the store already has."""

    session_id: str
    created_at: float | None
    row_ids: list[int] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    present: int = 0


def item_hash(item: object) -> str:
    """SHA-256 of an item's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(item, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def imported_id(session_id: str, row_id: int) -> str:
    """The message id of row *row_id* of *session_id* (the same on every import)."""
    return derived_id("openai-agents-import", json.dumps([session_id, row_id]))


def _sdk_time(value: object) -> float | None:
    """A SQLite ``CURRENT_TIMESTAMP`` (UTC text) as seconds since the epoch."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.datetime.strptime(value[:19], _SDK_TIME)
    except ValueError:
        return None
    return parsed.replace(tzinfo=datetime.UTC).timestamp()


def _check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise errors.InvalidInput(f"{what} must be an SQL table name, not {name!r}")
    return name


def _bad(path: str, why: str) -> errors.InvalidArchive:
    return errors.InvalidArchive(
        f"{path}: not an Agents SDK SQLiteSession database ({why}); nothing was imported"
    )


class _Source:
    """The SDK file, open read-only inside one read transaction."""

    def __init__(self, db: inspect.ReadOnlyDatabase, sessions: str, messages: str) -> None:
        self.db, self.sessions, self.messages = db, sessions, messages

    def session_ids(self) -> list[tuple[str, float | None]]:
        rows = self.db.query(
            f"SELECT session_id, created_at FROM {self.sessions} "
            f"UNION ALL SELECT DISTINCT session_id, NULL FROM {self.messages} "
            f"WHERE session_id NOT IN (SELECT session_id FROM {self.sessions})"
        )
        return [(r[0], _sdk_time(r[1])) for r in rows]

    def rows(self, session_id: str, after: int = -(2**63)) -> Iterator[tuple[Any, ...]]:
        """(row id, message_data, created_at) of the session's rows after *after*, in order."""
        last = after
        while True:
            page = self.db.query(
                f"SELECT id, message_data, created_at FROM {self.messages} "
                "WHERE session_id = ? AND id > ? ORDER BY id LIMIT 1000",
                (session_id, last),
            )
            yield from page
            if len(page) < 1000:
                return
            last = page[-1][0]


def _parse(data: Any) -> dict[str, Any] | None:
    """The item a row holds, or None if it holds none (not JSON, not an object)."""
    try:
        item = json.loads(data)
    except (TypeError, ValueError):
        return None
    return item if isinstance(item, dict) else None


def _open_source(path: str) -> foreign.ForeignFile:
    """*path*, resolved, ready to be read read-only."""
    real = os.path.realpath(path)
    if not os.path.isfile(real):
        raise errors.NotFound(f"{path}: no such file")
    try:
        source = foreign.ForeignFile(real)
    except inspect.InspectFailed as exc:
        if exc.reason == "empty":
            raise _bad(path, "an empty file") from None
        raise _bad(path, "not a SQLite file") from exc
    if source.mode is None:
        raise errors.DatabaseError(
            f"{path}: cannot be read without changing it: {source.why}; open it once with "
            "the SDK (or any SQLite program) and import again; nothing was imported"
        )
    return source


def import_sqlite(
    store: Store,
    path: str | os.PathLike[str],
    *,
    sessions_table: str = "agent_sessions",
    messages_table: str = "agent_messages",
    skip_invalid: bool = False,
    batch: int = BATCH,
) -> ImportSummary:
    """Import every session of the SDK SQLite file *path* into *store*; see the
    module docstring.  ``InvalidArchive``: not an SDK file, or a row that is not
    a JSON object (unless *skip_invalid*, which skips such rows as the SDK's own
    reads do); ``AlreadyExists``: a session the store holds differently; both
    with nothing written.  ``StoreBusy`` (past the write budget): the import
    stopped between two batches; importing again is safe.  ``ImportNotVerified``
    if a session does not read back as in the file."""
    path = os.fspath(path)
    sessions_table = _check_name(sessions_table, "sessions_table")
    messages_table = _check_name(messages_table, "messages_table")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise errors.InvalidInput(f"batch must be a positive integer, not {batch!r}")
    if os.path.isfile(path) and os.path.samefile(path, store.path):
        raise errors.InvalidInput(f"{path} is the store itself, not an Agents SDK file")
    file = _open_source(path)

    def read(db: inspect.ReadOnlyDatabase) -> tuple[list[_Plan], tuple[int, ...], int]:
        tables = {str(r[0]) for r in db.query("SELECT name FROM sqlite_schema")}
        for table, columns in (
            (sessions_table, {"session_id", "created_at"}),
            (messages_table, {"id", "session_id", "message_data", "created_at"}),
        ):
            if table not in tables:
                raise _bad(path, f"no table {table}")
            have = {str(r[1]) for r in db.query(f"PRAGMA table_info({table})")}
            if not columns <= have:
                missing = ", ".join(sorted(columns - have))
                raise _bad(path, f"table {table} has no column {missing}")
        source = _Source(db, sessions_table, messages_table)
        plans, skipped = _check(store, source, path, skip_invalid)
        return plans, skipped, _append(store, source, plans, batch)

    try:
        plans, skipped, inserted = file.read(read)
    except foreign.FileChanged as exc:
        # Batches were written during the read: each is whole, and a rerun continues.
        raise foreign.FileChanged(
            path, f"{path} changed while it was read; import it again"
        ) from exc.__cause__
    except inspect.InspectFailed as exc:
        if exc.reason in ("not-a-database", "corrupt"):
            raise _bad(path, exc.reason) from exc
        raise
    verified = _verify(store, plans)
    items = sum(len(p.row_ids) for p in plans)
    return ImportSummary(len(plans), items, inserted, items - inserted, verified, skipped)


def _check(
    store: Store, source: _Source, path: str, skip_invalid: bool
) -> tuple[list[_Plan], tuple[int, ...]]:
    """Step 1: every row checked, every session compared with the store.  Writes nothing."""
    plans: list[_Plan] = []
    skipped: list[int] = []
    for session_id, created_at in source.session_ids():
        if not isinstance(session_id, str):
            raise _bad(path, f"a session_id that is not text: {session_id!r}")
        try:
            agents_ops.check_session_id(session_id)
        except errors.InvalidInput as exc:
            raise _bad(path, str(exc)) from None
        plan = _Plan(session_id, created_at)
        for row_id, data, _at in source.rows(session_id):
            item = _parse(data)
            if item is None:
                if skip_invalid:
                    skipped.append(row_id)
                    continue
                raise _bad(path, f"row {row_id} of {source.messages} is not a JSON object")
            try:
                agents_ops.encode_item(item, row_id)
            except errors.InvalidInput as exc:
                raise _bad(path, f"row {row_id}: {exc}") from None
            plan.row_ids.append(row_id)
            plan.hashes.append(item_hash(item))
        # The store may hold what an earlier import wrote (and items added after it):
        # its first items must be this file's first rows, imported before.
        stored = agents_ops.stored_message_ids(store, session_id)
        common = min(len(stored), len(plan.row_ids))
        if stored[:common] != [imported_id(session_id, r) for r in plan.row_ids[:common]]:
            raise errors.AlreadyExists(
                f"session {session_id!r} is in the store with items that are not the rows "
                f"of {path} imported before; nothing was imported"
            )
        plan.present = common
        plans.append(plan)
    return plans, tuple(skipped)


def _append(store: Store, source: _Source, plans: Sequence[_Plan], batch: int) -> int:
    """Step 2: the rows the store lacks, a batch per transaction, in order."""
    inserted = 0
    for plan in plans:
        if not plan.row_ids:
            _create_empty(store, plan)
            continue
        if plan.present == len(plan.row_ids):
            continue
        wanted = set(plan.row_ids[plan.present :])
        last = (
            imported_id(plan.session_id, plan.row_ids[plan.present - 1]) if plan.present else None
        )
        after = plan.row_ids[plan.present - 1] if plan.present else -(2**63)
        pending: list[tuple[int, dict[str, Any], float | None]] = []
        for row_id, data, at in source.rows(plan.session_id, after):
            if row_id not in wanted:
                continue  # an invalid row skipped in step 1
            item = _parse(data)
            assert item is not None  # checked in step 1, same read transaction
            pending.append((row_id, item, _sdk_time(at)))
            if len(pending) == batch:
                last = _write(store, plan, pending, last)
                inserted += len(pending)
                pending = []
        if pending:
            _write(store, plan, pending, last)
            inserted += len(pending)
    return inserted


def _write(
    store: Store,
    plan: _Plan,
    rows: Sequence[tuple[int, dict[str, Any], float | None]],
    last: str | None,
) -> str:
    ids = [imported_id(plan.session_id, r) for r, _, _ in rows]
    times = [at if at is not None else (plan.created_at or 0.0) for _, _, at in rows]
    # Not spooled: the import reports what it did, and a rerun continues from here.
    agents_ops.add_items(
        store,
        plan.session_id,
        [item for _, item, _ in rows],
        ids=ids,
        created_at=times,
        expect_last=last,
        session_created_at=plan.created_at,
        spool=False,
    )
    return ids[-1]


def _create_empty(store: Store, plan: _Plan) -> None:
    sid = agents_ops.session_key(plan.session_id)
    if store.read(lambda tx: tx.execute(store.queries["session_exists"], (sid,))):
        return
    args: dict[str, Any] = {
        "id": sid,
        "metadata": {agents_ops.META_KEY: {"session_id": plan.session_id}},
    }
    if plan.created_at is not None:
        args["created_at"] = plan.created_at
    store.submit(Operation("create_session", args, new_id()), spool=False)


def _verify(store: Store, plans: Sequence[_Plan]) -> int:
    """Step 3: each session reads back as the file holds it."""
    verified = 0
    for plan in plans:
        items = agents_ops.get_items(store, plan.session_id)
        head = [item_hash(i) for i in items[: len(plan.hashes)]]
        if len(items) < len(plan.hashes) or head != plan.hashes:
            bad = next(
                (i for i, (a, b) in enumerate(zip(head, plan.hashes, strict=False)) if a != b),
                len(head),
            )
            raise ImportNotVerified(
                f"session {plan.session_id!r}: the store holds {len(items)} items; item {bad} "
                f"of the {len(plan.hashes)} imported does not read back as in the file"
            )
        verified += len(plan.hashes)
    return verified


def run_cli(file: str, store: str | None, *, skip_invalid: bool = False) -> int:
    """The body of ``fleetstore import --from openai-agents-sqlite FILE`` (see
    ``run_import``); it stops, if the store stays locked, between two batches."""
    from fleetstore.integrations import run_import

    return run_import(
        store,
        lambda opened: import_sqlite(opened, file, skip_invalid=skip_invalid),
        lambda summary: f"fleetstore import: {summary.describe()}",
        stopped="the import stopped between two batches",
    )


__all__ = [
    "BATCH",
    "ImportNotVerified",
    "ImportSummary",
    "import_sqlite",
    "imported_id",
    "run_cli",
]
