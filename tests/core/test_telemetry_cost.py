"""What telemetry costs an operation (issue 27): nothing until an SDK is installed.
Without one, fleetstore never imports ``opentelemetry`` (not even when the application
imported the API alone, whose providers are no-op proxies) and binds nothing, so the
hot path reads one attribute (tests/store/test_cost.py's ceilings hold unchanged).  An
SDK installed after a store was opened is found by the store's publisher within an
interval.  With an SDK, what it adds per operation is counted here and measured in
docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

import fleetstore
from fleetstore.core import telemetry
from tests.agents import script
from tests.store.test_cost import _least, _operations

AGENT = script("telemetry_agent.py")


def run_agent(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, AGENT, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_without_an_sdk_nothing_of_opentelemetry_is_loaded_or_bound(tmp_path: Path) -> None:
    seen = json.loads(run_agent("cost", str(tmp_path / "cost.db")))
    assert seen == {
        "after_import": False,
        "after_writes": False,
        "bound_without_sdk": False,
        "bound_with_the_api_alone": False,
    }


def test_an_sdk_installed_after_the_store_was_opened_is_found(tmp_path: Path) -> None:
    spans = json.loads(run_agent("global", str(tmp_path / "global.db")))
    # The write before the SDK was installed made no span; the one after did.
    assert [s["name"].split()[0] for s in spans] == ["put_state"]
    assert spans[0]["kind"] == "CLIENT"
    assert spans[0]["attributes"]["db.system.name"] == "sqlite"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[fleetstore.Store]:
    with fleetstore.open(tmp_path / "cost.db") as s:
        yield s


def test_an_sdk_is_on_the_path_while_bound_and_off_it_after(store: fleetstore.Store) -> None:
    make = _operations(store)["state.put"]
    before = _least(store, make)
    tracer_provider = TracerProvider()
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    telemetry.bind(tracer_provider, meter_provider)
    try:
        traced = _least(store, make)
    finally:
        telemetry.bind()
        tracer_provider.shutdown()
        meter_provider.shutdown()
    after = _least(store, make)
    assert traced[0] > before[0] + 50  # a span and a measurement: docs/benchmarks.md
    assert traced[1] == before[1]  # no SQL of its own
    assert after == before
