"""pytest plugin: LangGraph's own graph tests, on fleetstore's checkpointer.

LangGraph's ``tests/conftest.py`` builds its checkpointers with helpers of
``tests/conftest_checkpointer.py``; with ``NO_DOCKER=true`` the ``sync_checkpointer``
fixture offers ``memory``, ``sqlite`` and ``sqlite_aes``, ``async_checkpointer``
``memory`` and ``sqlite_aio``.  This plugin makes the ``sqlite`` ones a
``FleetstoreSaver`` on a fresh store (a file in a temporary folder) and keeps only
the tests that take a checkpointer, once each, on it: their ids still say
``[sqlite]`` / ``[sqlite_aio]``.  Nothing of LangGraph's files is changed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import Any

import pytest
from expected import deselect, mark_expected

from fleetstore.integrations.langgraph import FleetstoreSaver

SWAPPED = {"sync_checkpointer": "sqlite", "async_checkpointer": "sqlite_aio"}


@contextlib.contextmanager
def fleetstore_saver() -> Iterator[FleetstoreSaver]:
    with (
        tempfile.TemporaryDirectory(prefix="fleetstore-langgraph-") as folder,
        FleetstoreSaver(os.path.join(folder, "checkpoints.db")) as saver,
    ):
        yield saver


@contextlib.asynccontextmanager
async def fleetstore_saver_aio() -> AsyncIterator[FleetstoreSaver]:
    with tempfile.TemporaryDirectory(prefix="fleetstore-langgraph-") as folder:
        async with FleetstoreSaver(os.path.join(folder, "checkpoints.db")) as saver:
            yield saver


def pytest_plugin_registered(plugin: Any, manager: Any) -> None:
    # The fixtures call these helpers by their global names in tests/conftest.py.
    if isinstance(plugin, ModuleType) and plugin.__name__ == "tests.conftest":
        plugin._checkpointer_sqlite = fleetstore_saver
        plugin._checkpointer_sqlite_aio = fleetstore_saver_aio


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        params = getattr(item, "callspec", None)
        given = params.params if params is not None else {}
        taken = [name for name in SWAPPED if name in given]
        if taken and all(given[name] == SWAPPED[name] for name in taken):
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
    deselect("langgraph", config, items)
    mark_expected("langgraph", items)
