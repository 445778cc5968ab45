"""Every operation, collected from the modules that declare them, and the one
function that applies an operation inside a write transaction.

The registry is built by construction: it imports each declaring module by name
and takes its ``OPERATIONS``, so there is no registration by import side effect,
and an operation declared twice (in two modules) fails here at import.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from fleetstore import errors
from fleetstore.core.validate import check_time
from fleetstore.domain import (
    adk,
    history_ops,
    imports,
    langgraph,
    maintenance,
    openai_agents,
    outbox_ops,
    state,
    streams,
)
from fleetstore.domain.operations import (
    Declarations,
    Operation,
    OpSpec,
    Queries,
    Result,
    Scope,
    earlier_result,
    result_json,
)
from fleetstore.engine.base import Tx


def _collect(modules: Iterable[Declarations]) -> Mapping[str, OpSpec]:
    found: dict[str, OpSpec] = {}
    for declarations in modules:
        for spec in declarations.specs:
            if spec.name in found:
                raise ValueError(f"operation {spec.name!r} declared twice")
            found[spec.name] = spec
    return MappingProxyType(found)


#: Every operation by name.
REGISTRY: Mapping[str, OpSpec] = _collect(
    [
        history_ops.OPERATIONS,
        state.OPERATIONS,
        streams.OPERATIONS,
        outbox_ops.OPERATIONS,
        imports.OPERATIONS,
        maintenance.OPERATIONS,
        langgraph.OPERATIONS,
        openai_agents.OPERATIONS,
        adk.OPERATIONS,
    ]
)

#: The operations applied in a session tree's file on a sharded store.
TREE_FILE_OPS = frozenset(n for n, s in REGISTRY.items() if s.scope is not Scope.CATALOG)


def spec_of(name: str) -> OpSpec:
    """The declaration of operation *name* (``InvalidInput`` for an unknown name)."""
    spec = REGISTRY.get(name)
    if spec is None:
        raise errors.InvalidInput(f"unknown operation {name!r}")
    return spec


def envelope(data: object) -> Operation:
    """The operation a JSON record holds, its name known, its id and the shape of its
    arguments checked, not their values (a spool journal's line: one whose arguments
    are wrong is rejected when it is replayed, not taken for a damaged line)."""
    return Operation.from_json(data, REGISTRY)


def decode(data: object) -> Operation:
    """The operation a JSON record (spool journal, export file, group-commit post)
    holds, checked: the one decoder of operations from outside."""
    return checked(Operation.from_json(data, REGISTRY))


def checked(op: Operation) -> Operation:
    """*op* (its name known) with its arguments checked and put in the form its apply
    function reads; ``InvalidInput`` if they are not right."""
    if op.trusted:
        return op
    spec = REGISTRY[op.name]
    if spec.check is None:
        return op  # its apply function checks its arguments itself, each time
    given = op.args
    if not isinstance(given, Mapping):
        raise errors.InvalidInput(f"operation {spec.name}: arguments must be an object")
    if "now" not in given:
        # Applied later (a journal's replay): its time is when it comes in.
        given = {**given, "now": time.time()}
    args = dict(spec.check(given))
    if "effects" in op.args:
        if not spec.logged:
            raise errors.InvalidInput(f"{spec.name}: effects only go with a logged operation")
        args["effects"] = outbox_ops.check_effect_list(op.args["effects"])
    return Operation(op.name, args, op.op_id, trusted=True)


def apply(tx: Tx, q: Queries, op: Operation, now: float) -> Result:
    """Apply *op* inside the write transaction *tx*.  Returns the operation's
    result, or ``{"duplicate": True}`` if it had been applied before.  A trusted
    operation's arguments are not looked at again (``checked``)."""
    try:
        spec = REGISTRY[op.name]
    except KeyError:
        raise errors.InvalidInput(f"unknown operation {op.name!r}") from None
    if spec.logged:
        found = tx.execute(q["op_applied"], (op.op_id,))
        if found:
            return {**earlier_result(found[0][1]), "duplicate": True}
    args = op.args
    if not op.trusted:
        args = _unchecked_args(spec, args, now)
    elif "now" not in args:
        args = {**args, "now": now}
    # The transactional outbox: effects named by a history operation commit
    # (or roll back) with it, and a duplicate of the operation adds none.
    effects = args.get("effects")
    result = spec.fn(tx, q, args)
    if effects and not result.get("duplicate"):
        when = args["now"]
        for effect in effects:
            outbox_ops.insert_effect(tx, q, effect, when)
    if spec.logged:
        sid = args.get("session_id", args.get("id"))
        if sid.__class__ is not str:
            sid = None
        tx.execute(q["op_record"], (op.op_id, op.name, sid, now, result_json(result)))
    return result


def _unchecked_args(spec: OpSpec, given: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The arguments of an operation nobody checked, for an apply function that checks
    its own (``check`` None), or checked here by its ``check``."""
    if not isinstance(given, Mapping):
        raise errors.InvalidInput(f"operation {spec.name}: arguments must be an object")
    args = dict(given)
    args.setdefault("now", now)
    check_time(args["now"], "now")  # an operation from a journal or a file may hold anything
    if spec.check is not None:
        effects = args.get("effects")
        args = dict(spec.check(args))
        if effects is not None:
            args["effects"] = effects
    if "effects" in args:
        if not spec.logged:
            raise errors.InvalidInput(f"{spec.name}: effects only go with a logged operation")
        args["effects"] = outbox_ops.check_effect_list(args["effects"])
    return args


__all__ = ["REGISTRY", "TREE_FILE_OPS", "apply", "checked", "decode", "envelope", "spec_of"]
