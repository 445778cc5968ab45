"""Versioned per-session state: (session, namespace, key) → value.

Every put raises the version by one.  A put or delete with ``expected_version``
applies only if the current version is that one (0 for "does not exist yet")
and otherwise raises ``VersionConflict``; such conditional writes are never
spooled, since their outcome must be known when the call returns.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from fleetstore import errors
from fleetstore.core.ids import new_id
from fleetstore.core.validate import (
    STATE_KEY_MAX,
    STATE_NAMESPACE_MAX,
    arg_id,
    arg_int,
    arg_str,
    arg_time,
    check_id,
    check_int,
    check_str,
)
from fleetstore.domain.codec import check_encoded, columns, decode_value, value_payload
from fleetstore.domain.history_ops import session_row
from fleetstore.domain.operations import (
    Args,
    Declarations,
    Delivery,
    Operation,
    Queries,
    Result,
    Scope,
)
from fleetstore.domain.outbox import prepare_effects
from fleetstore.domain.ports import StorePort
from fleetstore.engine.base import Tx
from fleetstore.models import NewEffect, StateValue

OPERATIONS = Declarations()


class State:
    """``store.state``: versioned values per session."""

    def __init__(self, store: StorePort) -> None:
        self._store = store

    def get(self, session_id: str, key: str, *, namespace: str = "default") -> StateValue | None:
        """The value under *key*, or None."""
        _check_key(session_id, key, namespace)
        self._store.check_visible(session_id)
        q = self._store.queries
        rows = self._store.read(
            lambda tx: _in_session(tx, q, session_id, q["state_get"], (session_id, namespace, key)),
            session_id=session_id,
        )
        if not rows:
            return None
        version, enc, body, sha, size, updated = rows[0]
        value = decode_value(self._store, enc, body, sha, size)
        return StateValue(session_id, key, value, version, namespace, updated)

    def put(
        self,
        session_id: str,
        key: str,
        value: Any,
        *,
        namespace: str = "default",
        expected_version: int | None = None,
        effects: Sequence[NewEffect] = (),
    ) -> StateValue:
        """Store *value* (JSON-serialisable, or bytes) under *key*; returns it with
        its new version (``None`` while the write waits in this process's spool).
        *effects* are enqueued in the same transaction (the transactional outbox)."""
        # Every argument checked before a blob file is written; once, here.
        if expected_version is not None:
            check_int(expected_version, "expected_version")
        check_id(session_id, "session_id")
        # The usual key and namespace accepted here; anything else goes to _check_key
        # for its error (a check function each was 4 of a put's 100 Python calls).
        if (
            key.__class__ is not str
            or namespace.__class__ is not str
            or not 0 < len(key) <= STATE_KEY_MAX
            or not 0 < len(namespace) <= STATE_NAMESPACE_MAX
            or not (key + namespace).isascii()
            or "\x00" in key
            or "\x00" in namespace
        ):
            _check_key(session_id, key, namespace)
        store = self._store
        if effects:
            prepared = prepare_effects(store, effects)  # every one checked, nothing written
        now = time.time()
        args: dict[str, Any] = {
            "namespace": namespace,
            "key": key,
            "value": value_payload(store, value, f"state value {key!r}"),
            "session_id": session_id,
            "expected_version": expected_version,
            "now": now,
        }
        if effects:
            args["effects"] = prepared.write()
        result = store.submit(
            Operation("put_state", args, new_id(), True),
            Delivery.SPOOLABLE if expected_version is None else Delivery.NOW,
        )
        if result is None:
            return StateValue(session_id, key, value, None, namespace, now)
        if result.get("duplicate"):
            current = self.get(session_id, key, namespace=namespace)
            if current is None:
                raise errors.NotFound(
                    f"state {namespace}/{key} of session {session_id!r} was deleted"
                )
            return current
        return StateValue(session_id, key, value, result["version"], namespace, now)

    def delete(
        self,
        session_id: str,
        key: str,
        *,
        namespace: str = "default",
        expected_version: int | None = None,
        effects: Sequence[NewEffect] = (),
    ) -> bool:
        """Remove *key*; True if it existed (also True if the delete was spooled).
        *effects* are enqueued in the same transaction."""
        _check_key(session_id, key, namespace)
        _check_expected(expected_version)
        effect_list = prepare_effects(self._store, effects).write()
        args: dict[str, Any] = {
            "session_id": session_id,
            "namespace": namespace,
            "key": key,
            "expected_version": expected_version,
            "now": time.time(),
        }
        if effect_list:
            args["effects"] = effect_list
        result = self._store.submit(
            Operation("delete_state", args, new_id(), True),
            Delivery.SPOOLABLE if expected_version is None else Delivery.NOW,
        )
        return True if result is None else bool(result.get("deleted", True))

    def keys(self, session_id: str, *, namespace: str = "default") -> list[str]:
        """The keys stored in *namespace* of the session, sorted."""
        _check_key(session_id, "-", namespace)
        self._store.check_visible(session_id)
        q = self._store.queries
        rows = self._store.read(
            lambda tx: _in_session(tx, q, session_id, q["state_keys"], (session_id, namespace)),
            session_id=session_id,
        )
        return [r[0] for r in rows]


def _in_session(
    tx: Tx, q: Mapping[str, str], session_id: str, sql: str, params: tuple[Any, ...]
) -> list[tuple[Any, ...]]:
    """*sql*'s rows; ``NotFound`` (not an empty answer) when the session does not exist,
    or is being deleted (its state values may be half purged)."""
    if not tx.execute(q["session_exists"], (session_id,)):
        raise errors.NotFound(f"no session {session_id!r}")
    return list(tx.execute(sql, params))


def _check_key(session_id: object, key: object, namespace: object) -> None:
    check_id(session_id, "session_id")
    check_str(key, "a state key", limit=STATE_KEY_MAX, empty=False)
    check_str(namespace, "a state namespace", limit=STATE_NAMESPACE_MAX, empty=False)


def _check_expected(expected: object) -> None:
    if expected is not None:
        check_int(expected, "expected_version")


# -- the operations ----------------------------------------------------------------------------


def _state_key(a: Args) -> dict[str, Any]:
    return {
        "session_id": arg_id(a, "session_id"),
        "namespace": arg_str(
            a, "namespace", optional=False, limit=STATE_NAMESPACE_MAX, empty=False
        ),
        "key": arg_str(a, "key", optional=False, limit=STATE_KEY_MAX, empty=False),
        "expected_version": arg_int(a, "expected_version", minimum=0),
        "now": arg_time(a, "now"),
    }


def _check_version(current: int | None, expected: int | None, what: str) -> None:
    if expected is None:
        return
    if (current or 0) != expected:
        raise errors.VersionConflict(
            f"{what} is at version {current or 0}, not {expected}", expected, current or 0
        )


def _check_put(a: Args) -> dict[str, Any]:
    args = _state_key(a)
    args["value"] = check_encoded(
        a.get("value"), f"state {args['namespace']}/{args['key']}", ("json", "bytes")
    )
    return args


@OPERATIONS.declare("put_state", scope=Scope.SESSION, check=_check_put)
def write_state(tx: Tx, q: Queries, a: Args, *, check_session: bool = True) -> Result:
    """``put_state``'s work, its arguments checked; *check_session* False when the
    caller's transaction already found the session (a stream that made its message in
    it)."""
    sid, ns, key, now = a["session_id"], a["namespace"], a["key"], a["now"]
    enc, body, sha, size = columns(tx, q, a["value"], now)
    if check_session:
        session_row(tx, q, sid)
    rows = tx.execute(q["state_version"], (sid, ns, key))
    current = rows[0][0] if rows else None
    expected = a.get("expected_version")
    if expected is not None:
        _check_version(current, expected, f"state {ns}/{key} of session {sid!r}")
    version = (current or 0) + 1
    tx.execute(q["state_upsert"], (sid, ns, key, version, enc, body, sha, size, now))
    return {"version": version, "updated_at": now}


@OPERATIONS.declare("delete_state", scope=Scope.SESSION, check=_state_key)
def delete_state(tx: Tx, q: Queries, a: Args) -> Result:
    sid, ns, key = a["session_id"], a["namespace"], a["key"]
    rows = tx.execute(q["state_version"], (sid, ns, key))
    if not rows:
        session_row(tx, q, sid)  # an unknown session is NotFound, as for put_state
    current = rows[0][0] if rows else None
    _check_version(current, a["expected_version"], f"state {ns}/{key} of session {sid!r}")
    if current is not None:
        tx.execute(q["state_delete"], (sid, ns, key))
    return {"deleted": current is not None}


__all__ = ["State"]
