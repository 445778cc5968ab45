"""Every write is a named operation with JSON arguments, declared where it is defined.

An operation carries client-chosen ids (its own ``op_id``, and the ids of the
rows it creates) and, where it matters, an expected version.  Applying it twice
has the effect of applying it once: logged operations record their ``op_id``
in ``applied_ops`` inside the same transaction and are skipped when found
there; the others (stream chunks, hot and many) are idempotent by their primary
keys.  Retries, the spool, export/import and metrics all go through ``apply``.

Arguments are checked once, where they come in (issue 24: they were checked three
times, at the API, by the facade and inside the transaction).  The API checks its
callers' values and builds an operation whose arguments are already in the form its
apply function reads (``trusted``); an operation from outside (a spool journal, an
export file, another process's group-commit post, ``Store.apply``) is decoded by
``registry.decode``, which runs its declaration's ``check``.  Apply functions trust
what they are given; a bad operation raises ``InvalidInput`` (or ``NotFound``,
``AlreadyExists``, ``VersionConflict``) and changes nothing.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fleetstore import errors
from fleetstore.core.ids import is_valid_id
from fleetstore.core.validate import to_json
from fleetstore.engine.base import Tx

Args = Mapping[str, Any]
Result = dict[str, Any]
Queries = Mapping[str, str]


class Scope(enum.Enum):
    """Where an operation applies on a layout with more than one file (sharded): the
    router derives its routing from this, so every operation declares it."""

    #: Rows of one session (messages, parts, state, SDK items): the file of its tree.
    SESSION = "session"
    #: Sessions rows themselves (create, fork, update, archive, delete): the file of
    #: the tree, then the catalog's index of it (the intent protocol, store/sharded/router.py).
    TREE = "tree"
    #: Store-wide rows (the outbox, checkpoints, ADK sessions, maintenance): the catalog.
    CATALOG = "catalog"


class Delivery(enum.Enum):
    """How ``Store.submit`` delivers an operation when the store is busy past the write
    budget, or when earlier writes of this process wait in its spool."""

    #: The default: in order behind this process's spooled writes; past the budget
    #: spooled (``on_busy="spool"``) or ``StoreBusy`` (``on_busy="raise"``).
    SPOOLABLE = "spoolable"
    #: The caller needs the outcome now (a conditional write, an import's create):
    #: applied within the budget or an error, never spooled; with writes waiting in the
    #: spool, ``SpoolPending`` rather than overtaking them.
    NOW = "now"
    #: An effect's settlement: like ``SPOOLABLE``, but spooled past the budget even with
    #: ``on_busy="raise"`` (a settlement lost leaves its effect's thread stuck).
    MUST_LAND = "must_land"
    #: Claims, heartbeats, sweeps, the deletes' and forks' jobs: they neither depend on
    #: this process's spooled writes nor these on them, so they are applied now even
    #: while the spool holds writes, and never spooled (``StoreBusy`` past the budget).
    INDEPENDENT = "independent"


@dataclass(frozen=True, slots=True)
class Operation:
    """One write: ``name`` in the registry, JSON ``args``, a unique ``op_id``.
    *trusted*: the arguments were made by the API, checked, in the form the apply
    function reads (never serialised: a journal's or a file's operation is decoded and
    checked again by ``registry.decode``)."""

    name: str
    args: Mapping[str, Any]
    op_id: str
    trusted: bool = field(default=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.name, "id": self.op_id, "args": dict(self.args)}

    @classmethod
    def from_json(cls, data: object, known: Container[str]) -> Operation:
        """The operation a record holds; ``InvalidInput`` unless it is well formed and
        names an operation in *known* (the registry)."""
        if not isinstance(data, dict) or set(data) != {"op", "id", "args"}:
            raise errors.InvalidInput(f"not an operation record: {str(data)[:200]}")
        name, op_id, args = data["op"], data["id"], data["args"]
        if not isinstance(name, str) or name not in known:
            raise errors.InvalidInput(f"unknown operation {str(name)[:80]!r}")
        if not is_valid_id(op_id):
            raise errors.InvalidInput(f"operation {name}: bad id {str(op_id)[:80]!r}")
        if not isinstance(args, dict):
            raise errors.InvalidInput(f"operation {name}: arguments must be an object")
        return cls(name, args, op_id)

    @property
    def session_id(self) -> str | None:
        value = self.args.get("session_id", self.args.get("id"))
        return value if isinstance(value, str) else None


Apply = Callable[[Tx, Queries, Args], Result]
#: An operation's arguments from outside, checked and put in the form its apply
#: function reads (``InvalidInput`` otherwise).
Check = Callable[[Args], dict[str, Any]]
_F = TypeVar("_F", bound=Apply)


@dataclass(frozen=True, slots=True)
class OpSpec:
    """An operation's declaration: its apply function and what the store must know."""

    name: str
    fn: Apply
    scope: Scope
    #: Recorded in applied_ops (and skipped when found there).
    logged: bool = True
    #: One statement that re-checks its own conditions (a claim): the engine may run
    #: it at a weaker isolation (PostgreSQL: READ COMMITTED with SKIP LOCKED).
    single_statement: bool = False
    #: The arguments that may name the session whose tree holds the write, the first
    #: one given wins (a subagent's create names its parent first).
    session_args: tuple[str, ...] = ("session_id", "id")
    #: The argument naming a session this operation creates, if it creates one.
    creates: str | None = None
    #: Applying it again after an outcome nobody learned changes nothing more (logged,
    #: or idempotent by its keys): so another process may apply it for this one (group
    #: commit) and apply it again if that process died.  Not so for a claim.
    retry_safe: bool = True
    #: Checks arguments from outside (None: *fn* checks them itself, each time).
    check: Check | None = None


class Declarations:
    """The operations one domain module defines::

        OPERATIONS = Declarations()

        @OPERATIONS.declare("put_state", scope=Scope.SESSION)
        def put_state(tx, q, args): ...

    ``domain/registry.py`` collects every module's declarations by name, so importing
    the package registers every operation by construction.  *scope* is required: a
    declaration without one fails when its module is imported."""

    def __init__(self) -> None:
        self.specs: list[OpSpec] = []

    def declare(
        self,
        name: str,
        *,
        scope: Scope,
        logged: bool = True,
        single_statement: bool = False,
        session_args: tuple[str, ...] = ("session_id", "id"),
        creates: str | None = None,
        retry_safe: bool = True,
        check: Check | None = None,
    ) -> Callable[[_F], _F]:
        if not isinstance(scope, Scope):
            raise TypeError(f"operation {name!r}: scope must be a Scope, not {scope!r}")
        if any(s.name == name for s in self.specs):
            raise ValueError(f"operation {name!r} declared twice")

        def decorate(fn: _F) -> _F:
            self.specs.append(
                OpSpec(
                    name,
                    fn,
                    scope,
                    logged,
                    single_statement,
                    session_args,
                    creates,
                    retry_safe,
                    check,
                )
            )
            return fn

        return decorate


#: Results longer than this are not kept (a duplicate then returns only its flag);
#: every result of the registry's logged operations is far smaller.
MAX_KEPT_RESULT = 4096


def result_json(result: Result) -> str | None:
    try:
        text = to_json(result)
    except (TypeError, ValueError):
        return None
    return text if len(text) <= MAX_KEPT_RESULT else None


def earlier_result(text: object) -> Result:
    if not isinstance(text, str):
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


__all__ = [
    "Apply",
    "Args",
    "Check",
    "Declarations",
    "Delivery",
    "OpSpec",
    "Operation",
    "Queries",
    "Result",
    "Scope",
    "earlier_result",
    "result_json",
]
