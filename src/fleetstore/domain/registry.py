"""Every operation, collected from the modules that declare them, and the one
function that applies an operation inside a write transaction.

The registry is built by construction: it imports each declaring module by name
and takes its ``OPERATIONS``, so there is no registration by import side effect,
and an operation declared twice (in two modules) fails here at import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from fleetstore import errors
from fleetstore.core.validate import check_time
from fleetstore.domain import history_ops, imports, maintenance, outbox, state, streams
from fleetstore.domain.frameworks import adk, langgraph, openai_agents
from fleetstore.domain.operations import (
    Declarations,
    Operation,
    OpSpec,
    Queries,
    Result,
    Scope,
    check_effects,
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
        outbox.OPERATIONS,
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


def decode(data: object) -> Operation:
    """The operation a JSON record (spool journal, intent) holds, checked."""
    return Operation.from_json(data, REGISTRY)


def apply(tx: Tx, q: Queries, op: Operation, now: float) -> Result:
    """Apply *op* inside the write transaction *tx*.  Returns the operation's
    result, or ``{"duplicate": True}`` if it had been applied before."""
    spec = spec_of(op.name)
    if spec.logged:
        found = tx.execute(q["op_applied"], (op.op_id,))
        if found:
            return {**earlier_result(found[0][1]), "duplicate": True}
    if not isinstance(op.args, Mapping):
        raise errors.InvalidInput(f"operation {op.name}: arguments must be an object")
    args = dict(op.args)
    args.setdefault("now", now)
    check_time(args["now"], "now")  # an operation from a journal or a file may hold anything
    # The transactional outbox: effects named by a history operation commit
    # (or roll back) with it, and a duplicate of the operation adds none.
    effects = args.pop("effects", None)
    result = spec.fn(tx, q, args)
    if effects is not None and not result.get("duplicate"):
        for effect in check_effects(spec, effects):
            outbox.enqueue_effect(tx, q, {**effect, "now": args["now"]})
    if spec.logged:
        tx.execute(q["op_record"], (op.op_id, op.name, op.session_id, now, result_json(result)))
    return result


__all__ = ["REGISTRY", "TREE_FILE_OPS", "apply", "decode", "spec_of"]
