"""A real Prometheus server (Debian's ``prometheus``; .ci/run installs it) scrapes
``fleetstore metrics --serve`` on loopback ports, and its HTTP query API returns the
store's figures, including the queries docs/telemetry.md tells an operator to alert on
(issue 27)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from tests.cli.test_cli import clean_env

pytestmark = pytest.mark.slow

PROMETHEUS = shutil.which("prometheus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


def query(api: str, promql: str) -> list[dict[str, Any]]:
    url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def wait_for(api: str, promql: str, timeout: float = 90.0) -> list[dict[str, Any]]:
    """The query's result once it has one (the server needs a scrape or two)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = query(api, promql)
        except OSError:
            result = []  # the server still starting
        if result:
            return result
        assert time.monotonic() < deadline, f"no result for {promql} within {timeout}s"
        time.sleep(0.5)


def test_a_prometheus_server_scrapes_the_store_s_figures(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    # Never skipped (a skip would pass unseen wherever CI is not set): .ci/run
    # installs the package on a fresh machine.
    if PROMETHEUS is None:
        pytest.fail("prometheus is not installed: apt-get install prometheus (.ci/run does)")
    path = tmp_path / "scraped.db"
    with fleetstore.open(path, publish_interval=0.1) as store:
        session = store.sessions.create(title="t")
        for i in range(6):
            store.state.put(session.id, "k", {"i": i})
        for i in range(3):
            store.effects.enqueue(f"thread-{i}", "mail", {"i": i})

    command = ["metrics", "--store", str(path), "--serve", "127.0.0.1:0"]
    served = subprocess.Popen(
        [sys.executable, "-m", "fleetstore", *command],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=clean_env(),
    )
    processes.append(served)
    assert served.stderr is not None
    line = served.stderr.readline()
    target = line.split("http://")[-1].split("/")[0]
    assert target.startswith("127.0.0.1:"), line

    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: fleetstore\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    web = free_port()
    prometheus = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    processes.append(prometheus)
    api = f"http://127.0.0.1:{web}"

    (up,) = wait_for(api, 'up{job="fleetstore"} == 1')
    assert up["metric"]["instance"] == target
    pending = wait_for(api, 'fleetstore_outbox_effects{state="pending"}')
    assert [float(r["value"][1]) for r in pending] == [3.0]
    puts = wait_for(api, 'fleetstore_operations_total{operation="put_state"}')
    assert [float(r["value"][1]) for r in puts] == [6.0]
    # docs/telemetry.md's alert queries evaluate (the spool is not in use; the oldest
    # available effect has waited a while).
    assert float(wait_for(api, "sum(fleetstore_spool_pending)")[0]["value"][1]) == 0.0
    (lag,) = wait_for(api, "max(fleetstore_outbox_oldest_available_age_seconds)")
    assert float(lag["value"][1]) > 0
    assert wait_for(
        api, "histogram_quantile(0.99, sum by (le) (fleetstore_lock_wait_seconds_bucket))"
    )
