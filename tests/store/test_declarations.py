"""Operations declare themselves completely (domain/operations.py): every registered
operation routes, on the sharded layout, to the file its declared scope says, and a
declaration without a scope fails when its module is imported."""

from __future__ import annotations

from pathlib import Path

import pytest

import fleetstore
from fleetstore.core.ids import new_id
from fleetstore.domain.operations import Declarations, Operation, Scope
from fleetstore.domain.registry import REGISTRY
from fleetstore.store.sharded.shards import shard_key


@pytest.fixture
def sharded(tmp_path: Path) -> fleetstore.Store:
    store = fleetstore.open(f"sqlite+sharded://{tmp_path / 'store'}")
    yield store
    store.close()


def test_every_registered_operation_routes_where_its_scope_says(sharded: fleetstore.Store) -> None:
    router = sharded.router
    assert router is not None
    root = sharded.sessions.create(title="tree")
    key = router.home(root.id)
    assert key is not None and sharded.router.shards.exists(key)
    seen = set()
    for name, spec in REGISTRY.items():
        # Every argument that may name the session names the tree's root.
        op = Operation(name, {a: root.id for a in spec.session_args}, new_id())
        target, cross = router.route(op)
        if spec.scope is Scope.CATALOG:
            assert (target, cross) == (None, False), name
        elif spec.scope is Scope.TREE:
            assert (target, cross) == (key, True), name
        else:
            assert spec.scope is Scope.SESSION
            assert (target, cross) == (key, False), name
            # A session write that enqueues effects also writes the catalog (the outbox).
            with_effects = Operation(name, {**op.args, "effects": [{}]}, new_id())
            assert router.route(with_effects) == (key, True), name
        seen.add(spec.scope)
    assert seen == set(Scope)


def test_an_operation_that_creates_a_session_of_no_tree_starts_a_new_one(
    sharded: fleetstore.Store,
) -> None:
    router = sharded.router
    assert router is not None
    creators = [s for s in REGISTRY.values() if s.creates is not None]
    assert {s.name for s in creators} >= {"create_session", "import_session", "agt_add_items"}
    for spec in creators:
        fresh = new_id()
        args = {spec.creates: fresh}
        if spec.name == "fork_session":
            continue  # a fork stays in its source's tree (no source here: the catalog)
        assert router.route(Operation(spec.name, args, new_id())) == (shard_key(fresh), True)


def test_a_subagent_routes_to_its_parents_tree(sharded: fleetstore.Store) -> None:
    router = sharded.router
    assert router is not None
    root = sharded.sessions.create(title="tree")
    child = sharded.sessions.create(title="sub", parent_id=root.id)
    op = Operation("create_session", {"id": new_id(), "parent_id": child.id}, new_id())
    assert router.route(op) == (router.home(root.id), True)
    assert router.home(child.id) == router.home(root.id)


def test_a_declaration_without_a_scope_fails_at_import() -> None:
    ops = Declarations()
    with pytest.raises(TypeError):
        ops.declare("no_scope")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="scope must be a Scope"):
        ops.declare("string_scope", scope="session")  # type: ignore[arg-type]
    ops.declare("ok", scope=Scope.CATALOG)(lambda tx, q, a: {})
    with pytest.raises(ValueError, match="declared twice"):
        ops.declare("ok", scope=Scope.CATALOG)
    assert [s.name for s in ops.specs] == ["ok"]
