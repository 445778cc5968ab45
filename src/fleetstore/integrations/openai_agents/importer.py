"""``fleetstore import --from openai-agents-sqlite FILE``: bring the histories an
Agents SDK ``SQLiteSession`` kept (tables ``agent_sessions`` and
``agent_messages``) into a fleetstore store, where ``FleetstoreSession`` reads them.

Does not need the SDK installed.  The file is read strictly read-only, in one
read transaction (``fleetstore.integrations.openai_agents.reader``: no journal mode
switch, no ``-wal``/``-shm`` created), so the SDK's own processes may keep using it.

Three steps, the first two inside that read transaction:

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

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetstore import errors
from fleetstore.core.ids import derived_id, new_id
from fleetstore.domain import openai_agents as agents_ops
from fleetstore.domain.operations import Delivery, Operation
from fleetstore.integrations.openai_agents.reader import (
    AgentsSession,
    AgentsSource,
    check_table_name,
    item_hash,
    read_agents_source,
)

if TYPE_CHECKING:
    from fleetstore.store.facade import Store

#: Items appended per transaction (the lock is held for one batch at a time).
BATCH = 200


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


@dataclass(frozen=True, slots=True)
class _Plan:
    """One session of the file, and how many of its rows the store already has."""

    session: AgentsSession
    present: int = 0


def imported_id(session_id: str, row_id: int) -> str:
    """The message id of row *row_id* of *session_id* (the same on every import)."""
    return derived_id("openai-agents-import", json.dumps([session_id, row_id]))


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
    sessions_table = check_table_name(sessions_table, "sessions_table")
    messages_table = check_table_name(messages_table, "messages_table")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise errors.InvalidInput(f"batch must be a positive integer, not {batch!r}")
    if os.path.isfile(path) and os.path.samefile(path, store.path):
        raise errors.InvalidInput(f"{path} is the store itself, not an Agents SDK file")

    def read(source: AgentsSource) -> tuple[list[_Plan], tuple[int, ...], int]:
        plans, skipped = _check(store, source, path)
        return plans, skipped, _append(store, source, plans, batch)

    plans, skipped, inserted = read_agents_source(
        path,
        read,
        sessions_table=sessions_table,
        messages_table=messages_table,
        skip_invalid=skip_invalid,
    )
    verified = _verify(store, plans)
    items = sum(len(p.session.row_ids) for p in plans)
    return ImportSummary(len(plans), items, inserted, items - inserted, verified, skipped)


def _check(store: Store, source: AgentsSource, path: str) -> tuple[list[_Plan], tuple[int, ...]]:
    """Step 1: every row checked (by the reading), every session compared with the
    store.  Writes nothing."""
    plans: list[_Plan] = []
    skipped: list[int] = []
    for session in source.sessions():
        skipped.extend(session.skipped)
        session_id, row_ids = session.session_id, session.row_ids
        # The store may hold what an earlier import wrote (and items added after it):
        # its first items must be this file's first rows, imported before.
        stored = agents_ops.stored_message_ids(store, session_id)
        common = min(len(stored), len(row_ids))
        if stored[:common] != [imported_id(session_id, r) for r in row_ids[:common]]:
            raise errors.AlreadyExists(
                f"session {session_id!r} is in the store with items that are not the rows "
                f"of {path} imported before; nothing was imported"
            )
        plans.append(_Plan(session, common))
    return plans, tuple(skipped)


def _append(store: Store, source: AgentsSource, plans: Sequence[_Plan], batch: int) -> int:
    """Step 2: the rows the store lacks, a batch per transaction, in order."""
    inserted = 0
    for plan in plans:
        session, present = plan.session, plan.present
        if not session.row_ids:
            _create_empty(store, session)
            continue
        if present == len(session.row_ids):
            continue
        wanted = set(session.row_ids[present:])
        last = imported_id(session.session_id, session.row_ids[present - 1]) if present else None
        after = session.row_ids[present - 1] if present else -(2**63)
        pending: list[tuple[int, dict[str, Any], float | None]] = []
        for row in source.rows(session.session_id, after):
            if row.row_id not in wanted:
                continue  # an invalid row skipped in step 1
            assert row.item is not None  # checked in step 1, same read transaction
            pending.append((row.row_id, row.item, row.created_at))
            if len(pending) == batch:
                last = _write(store, session, pending, last)
                inserted += len(pending)
                pending = []
        if pending:
            _write(store, session, pending, last)
            inserted += len(pending)
    return inserted


def _write(
    store: Store,
    session: AgentsSession,
    rows: Sequence[tuple[int, dict[str, Any], float | None]],
    last: str | None,
) -> str:
    ids = [imported_id(session.session_id, r) for r, _, _ in rows]
    times = [at if at is not None else (session.created_at or 0.0) for _, _, at in rows]
    # Not spooled: the import reports what it did, and a rerun continues from here.
    agents_ops.add_items(
        store,
        session.session_id,
        [item for _, item, _ in rows],
        ids=ids,
        created_at=times,
        expect_last=last,
        session_created_at=session.created_at,
        delivery=Delivery.NOW,
    )
    return ids[-1]


def _create_empty(store: Store, session: AgentsSession) -> None:
    sid = agents_ops.session_key(session.session_id)
    if store.read(lambda tx: tx.execute(store.queries["session_exists"], (sid,))):
        return
    args: dict[str, Any] = {
        "id": sid,
        "metadata": {agents_ops.META_KEY: {"session_id": session.session_id}},
    }
    if session.created_at is not None:
        args["created_at"] = session.created_at
    store.submit(Operation("create_session", args, new_id()), Delivery.NOW)


def _verify(store: Store, plans: Sequence[_Plan]) -> int:
    """Step 3: each session reads back as the file holds it."""
    verified = 0
    for plan in plans:
        session_id, hashes = plan.session.session_id, list(plan.session.hashes)
        items = agents_ops.get_items(store, session_id)
        head = [item_hash(i) for i in items[: len(hashes)]]
        if len(items) < len(hashes) or head != hashes:
            bad = next(
                (i for i, (a, b) in enumerate(zip(head, hashes, strict=False)) if a != b),
                len(head),
            )
            raise ImportNotVerified(
                f"session {session_id!r}: the store holds {len(items)} items; item {bad} "
                f"of the {len(hashes)} imported does not read back as in the file"
            )
        verified += len(hashes)
    return verified


def run_cli(
    file: str, store: str | None, *, skip_invalid: bool = False, as_json: bool = False
) -> int:
    """The body of ``fleetstore import --from openai-agents-sqlite FILE`` (see
    ``run_import``); it stops, if the store stays locked, between two batches."""
    from fleetstore.integrations import run_import

    return run_import(
        store,
        lambda opened: import_sqlite(opened, file, skip_invalid=skip_invalid),
        lambda summary: f"fleetstore import: {summary.describe()}",
        stopped="the import stopped between two batches",
        as_json=as_json,
    )


__all__ = [
    "BATCH",
    "ImportNotVerified",
    "ImportSummary",
    "import_sqlite",
    "imported_id",
    "item_hash",
    "run_cli",
]
