"""The operations maintenance needs: batched deletes of session trees, of blob rows
no row refers to, and of old ``applied_ops`` rows.

Each operation does a bounded amount of work in one transaction (at most
``limit`` rows), so deleting a 20,000-message session, or pruning millions of
applied operations, never holds the write lock for long: the caller
(``fleetstore.admin.maintain``) calls it again until it reports ``done``.  A
single transaction deleting a 20,000-message session held the lock 0.25 s.

None of them is logged in ``applied_ops``: each is idempotent by nature
(deleting what is no longer there deletes nothing), and logging maintenance
would grow the very table it prunes.  None is ever spooled (maintenance calls
``Store.apply``): past the budget it raises ``StoreBusy`` and maintenance stops.
"""

from __future__ import annotations

from typing import Any

from fleetstore import errors
from fleetstore.core.ids import is_valid_id
from fleetstore.core.validate import arg_int, arg_when
from fleetstore.domain.blobs import check_sha
from fleetstore.domain.operations import Args, Declarations, Queries, Result, Scope
from fleetstore.engine.base import Tx

OPERATIONS = Declarations()

#: Most rows one maintenance operation may touch.
MAX_LIMIT = 100_000


@OPERATIONS.declare("mnt_delete_tree", scope=Scope.TREE, session_args=("id",), logged=False)
def _delete_tree(tx: Tx, q: Queries, a: Args) -> Result:
    """Delete up to ``limit`` rows of the session tree under ``id`` (the session and
    its subagents): messages first (their parts, chunks and usage cascade), then
    state values, then, once both are gone, the sessions.  With ``written_before``,
    nothing is deleted (``skipped``) if any session or state value of the tree was
    written at or after it: retention re-checks, in every batch, that the tree it
    archived has not been written to since."""
    sid = a.get("id")
    if not is_valid_id(sid):
        raise errors.InvalidInput(f"id must be a session id, not {sid!r}")
    limit = arg_int(a, "limit", False, 1, MAX_LIMIT)
    before = arg_when(a, "written_before", optional=True)
    count, newest_session, newest_state = tx.execute(q["mnt_tree_freshness"], {"id": sid})[0]
    if not count:
        return {"id": sid, "messages": 0, "states": 0, "sessions": 0, "done": True, "gone": True}
    if before is not None:
        newest = max(newest_session or 0.0, newest_state or 0.0)
        if newest >= before:
            return {"id": sid, "skipped": True, "newest": newest, "done": False}
    params = {"id": sid, "limit": limit}
    messages = len(tx.execute(q["mnt_tree_delete_messages"], params))
    states = sessions = 0
    if messages < limit:
        states = len(tx.execute(q["mnt_tree_delete_state"], {"id": sid, "limit": limit - messages}))
        if messages + states < limit:
            tx.execute(q["mnt_tree_delete_sessions"], {"id": sid})
            sessions = count
    return {
        "id": sid,
        "messages": messages,
        "states": states,
        "sessions": sessions,
        "done": bool(sessions),
    }


def blob_referrers(tx: Tx, q: Queries) -> list[tuple[str, str]]:
    """Every (table, column) whose foreign key names ``blobs``: parts, state, effects,
    graph checkpoints, and any table a later migration adds, found in the schema so
    that a new kind of reference can never be collected as garbage."""
    return [(str(t), str(c)) for t, c in tx.execute(q["mnt_blob_referrers"])]


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def referenced(tx: Tx, q: Queries, shas: list[str]) -> set[str]:
    """Which of *shas* some row refers to (one indexed or scanning query per referrer)."""
    import json

    found: set[str] = set()
    if not shas:
        return found
    doc = json.dumps(shas)
    for table, column in blob_referrers(tx, q):
        col = _ident(column)
        rows = tx.execute(
            f"SELECT DISTINCT {col} FROM {_ident(table)} WHERE {col} IN ({q['mnt_json_ids']})",
            (doc,),
        )
        found.update(str(r[0]) for r in rows)
    return found


@OPERATIONS.declare("mnt_delete_blobs", scope=Scope.CATALOG, logged=False)
def _delete_blobs(tx: Tx, q: Queries, a: Args) -> Result:
    """Delete the rows of the blobs in ``shas`` that no row refers to, re-checked
    inside this transaction; returns the hashes deleted (their files may go after
    the commit, see fleetstore.admin.maintain) and those kept."""
    shas = a.get("shas")
    if not isinstance(shas, list) or len(shas) > MAX_LIMIT:
        raise errors.InvalidInput(f"shas must be a list of at most {MAX_LIMIT} blob hashes")
    wanted = sorted({check_sha(s) for s in shas})
    keep = referenced(tx, q, wanted)
    deleted = []
    for sha in wanted:
        if sha in keep:
            continue
        if tx.execute(q["mnt_blob_delete"], (sha,)):
            deleted.append(sha)
    return {"deleted": deleted, "kept": sorted(keep)}


@OPERATIONS.declare("mnt_prune_ops", scope=Scope.CATALOG, logged=False)
def _prune_ops(tx: Tx, q: Queries, a: Args) -> Result:
    """Delete the ``applied_ops`` rows applied before ``applied_before`` among the next
    ``limit`` rows in key order after ``after`` and below ``below`` (operation ids are
    time-ordered, so ``below`` bounds the scan); returns the last key looked at."""
    horizon = arg_when(a, "applied_before")
    after, below = a.get("after", ""), a.get("below")
    if not isinstance(after, str) or not isinstance(below, str):
        raise errors.InvalidInput("after and below must be strings (operation id bounds)")
    rows = tx.execute(q["mnt_ops_page"], (after, below, arg_int(a, "limit", False, 1, MAX_LIMIT)))
    deleted = 0
    for op_id, applied_at in rows:
        if applied_at < horizon:
            deleted += len(tx.execute(q["mnt_ops_delete"], (op_id, horizon)))
    last: Any = rows[-1][0] if rows else None
    return {
        "deleted": deleted,
        "scanned": len(rows),
        "last": last,
        "done": len(rows) < arg_int(a, "limit", False, 1, MAX_LIMIT),
    }


__all__ = ["MAX_LIMIT", "blob_referrers", "referenced"]
