"""The test suite's plugins (fixtures live in tests/fix_*.py, psycopg's style) and the
order tests are handed to the workers in."""

from __future__ import annotations

import pytest

pytest_plugins = ("tests.fix_procs", "tests.fix_pg", "tests.fix_stores", "tests.fix_faults")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The fleet and slow tests first, the longest (the largest timeout marker: the 70 s
    outside-lock fleets) before the others, stable otherwise: a long test started last
    stretches the run.  The Makefile's --maxschedchunk 2 makes pytest-xdist hand them
    out two at a time; its default first chunk (a quarter of a worker's share, in
    order) gave one worker every slow test."""

    def key(item: pytest.Item) -> tuple[bool, float]:
        timeout = item.get_closest_marker("timeout")
        longest = float(timeout.args[0]) if timeout is not None and timeout.args else 0.0
        heavy = any(item.get_closest_marker(m) for m in ("fleet", "slow"))
        return (not heavy, -longest)

    items.sort(key=key)
