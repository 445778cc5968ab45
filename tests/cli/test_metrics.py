"""``fleetstore metrics`` (issue 27): the whole store's figures from real processes,
read with ``prometheus_client``'s own parser; counters that do not fall when a process
exits or is killed; the same figures as JSON; ``--serve`` on a loopback port; the
group's logging options.  A real Prometheus server scraping it is in
test_metrics_prometheus.py."""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import fleetstore
from fleetstore.core import telemetry
from fleetstore.store.procstats import procs_dir
from tests.agents import script
from tests.cli.test_cli import clean_env, run_cli
from tests.fix_procs import Proc, Spawn, start_lock

AGENT = script("telemetry_agent.py")


def scrape(path: Path) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``fleetstore metrics`` parsed by prometheus_client: sample name -> labels -> value."""
    done = run_cli("metrics", "--store", str(path))
    assert done.returncode == 0, done.stderr
    return parse(done.stdout)


def parse(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("fleetstore_"), family.name
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def one(figures: dict[str, Any], name: str, **labels: str) -> float:
    return float(figures[name][tuple(sorted(labels.items()))])


@pytest.fixture
def launch() -> Iterator[Callable[..., Proc]]:
    """The telemetry agent in processes of its own, killed at the end."""
    procs: list[Proc] = []

    def start(*args: str) -> Proc:
        proc = Proc([sys.executable, AGENT, *args], f"telemetry {args[0]}")
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            proc.kill()


def test_the_exposition_is_the_sum_of_every_process_and_reads_as_prometheus(
    tmp_path: Path, launch: Callable[..., Proc]
) -> None:
    path = tmp_path / "fleet.db"
    fleetstore.open(path).close()
    procs = [launch("write", str(path), str(n), "30") for n in (7, 11)]
    for proc in procs:
        proc.wait_line("wrote", timeout=60)
    done = run_cli("metrics", "--store", str(path))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    figures = parse(text)
    families = {f.name: f for f in text_string_to_metric_families(text)}

    assert one(figures, "fleetstore_operations_total", operation="put_state") == 18
    assert one(figures, "fleetstore_operations_total", operation="enqueue_effect") == 2
    assert one(figures, "fleetstore_effects_enqueued_total") == 2
    assert one(figures, "fleetstore_processes") == 2
    assert one(figures, "fleetstore_outbox_effects", state="pending") == 2
    assert one(figures, "fleetstore_outbox_effects", state="succeeded") == 0
    assert one(figures, "fleetstore_outbox_oldest_available_age_seconds") > 0
    assert one(figures, "fleetstore_spool_pending") == 0
    # Base units, _total counters, the declared types.
    assert families["fleetstore_lock_wait_seconds"].type == "histogram"
    assert families["fleetstore_commits"].type == "counter"  # the parser drops _total
    assert families["fleetstore_spool_pending"].type == "gauge"
    assert families["fleetstore_wal_size_bytes"].type == "gauge"
    commits = one(figures, "fleetstore_commits_total")
    assert commits >= 18 + 2 + 2  # puts, enqueues, session creates (and migrations)
    buckets = figures["fleetstore_lock_wait_seconds_bucket"]
    counts = [buckets[(("le", le),)] for le in [*map(_le, telemetry.BUCKETS), "+Inf"]]
    assert counts == sorted(counts) and counts[-1] == commits
    assert one(figures, "fleetstore_lock_wait_seconds_count") == commits
    # Every family is a documented figure (docs/telemetry.md lists FIGURES).
    assert {f.prom.removesuffix("_total") for f in telemetry.FIGURES} >= set(families)


def test_a_process_that_closes_a_store_and_opens_it_again_keeps_both_counts(
    tmp_path: Path,
) -> None:
    """Each opening of a store is folded on its own: keyed by the process alone, the
    second's counts were dropped as "folded before", and while it was open its figures
    were skipped as the first's."""
    path = tmp_path / "s.db"
    puts = {"operation": "put_state"}
    for n in (3, 4):
        with fleetstore.open(path, publish_interval=0.05) as store:
            sid = store.sessions.create().id
            for i in range(n):
                store.state.put(sid, "k", i)
            deadline = time.monotonic() + 30  # the second, open: counted beside the first
            while n == 4 and one(scrape(path), "fleetstore_operations_total", **puts) != 7:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    assert one(scrape(path), "fleetstore_operations_total", **puts) == 7


def test_the_search_index_lag_and_the_secrets_redacted_are_figures(tmp_path: Path) -> None:
    """What an operator watches of the search index (its queue and lag, read from the
    store; what the indexers wrote) and of redaction (secrets replaced, by kind), kept
    when the processes that counted them have closed."""
    path = tmp_path / "s.db"
    token = "ghp_" + "A1b2" * 9
    with fleetstore.open(path, search_index=False) as store:  # nothing indexes it
        sid = store.sessions.create(title="queued").id
        for i in range(5):
            store.messages.append(sid, "user", f"message {i} with {token}")
    behind = scrape(path)
    assert one(behind, "fleetstore_search_queued") == 6  # the session and 5 messages
    assert one(behind, "fleetstore_search_lag_seconds") > 0
    assert one(behind, "fleetstore_redacted_total", kind="github-token") == 5
    assert one(behind, "fleetstore_search_sections_total") == 0

    with fleetstore.open(path, search_interval=0.05) as store:
        store.search.catch_up()  # (its indexer thread starts with a write: none here)
        store.messages.append(sid, "user", "one more")  # its indexer takes this one
        deadline = time.monotonic() + 60  # only an indexer that never runs
        while store.search.status().queued:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    caught_up = scrape(path)
    assert one(caught_up, "fleetstore_search_queued") == 0
    assert one(caught_up, "fleetstore_search_lag_seconds") == 0
    assert one(caught_up, "fleetstore_search_sections_total") >= 1
    assert one(caught_up, "fleetstore_search_batches_total") >= 1
    assert one(caught_up, "fleetstore_search_errors_total") == 0
    assert one(caught_up, "fleetstore_redacted_total", kind="github-token") == 5


def _le(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else repr(bound)


def test_counters_do_not_fall_when_a_process_closes_or_is_killed(
    tmp_path: Path, launch: Callable[..., Proc]
) -> None:
    """A store's counters are over its life: a process that closes folds its counts
    into the retired totals before its file goes; one killed leaves its file, which
    maintain folds before removing it.  (Summed over the live files alone, they fell,
    and Prometheus's rate() read each fall as a reset.)"""
    path = tmp_path / "fleet.db"
    fleetstore.open(path).close()
    closing = launch("write", str(path), "5", "1")
    killed = launch("write", str(path), "9", "60")
    closing.wait_line("wrote", timeout=60)
    killed.wait_line("wrote", timeout=60)
    both = scrape(path)
    assert one(both, "fleetstore_operations_total", operation="put_state") == 14
    closing.wait_line("closed", timeout=60)
    assert closing.finish(30) == 0
    after_close = scrape(path)
    killed.kill()
    after_kill = scrape(path)
    done = run_cli("maintain", "--store", str(path))
    assert done.returncode == 0, done.stderr + done.stdout
    after_maintain = scrape(path)

    for figures in (after_close, after_kill, after_maintain):
        assert one(figures, "fleetstore_operations_total", operation="put_state") == 14
        assert one(figures, "fleetstore_effects_enqueued_total") == 2
        for name in ("fleetstore_commits_total", "fleetstore_lock_wait_seconds_count"):
            assert one(figures, name) >= one(both, name), name
    assert one(after_close, "fleetstore_processes") == 1
    assert one(after_kill, "fleetstore_processes") == 0
    assert sorted(p.name for p in procs_dir(path).glob("[0-9]*.json")) == []


def test_json_gives_the_same_figures_and_json_with_prometheus_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "one.db"
    with fleetstore.open(path) as store:
        session = store.sessions.create(title="t")
        store.state.put(session.id, "k", {"v": 1})
        store.effects.enqueue("th", "k", {})
    text = run_cli("metrics", "--store", str(path))
    as_json = run_cli("metrics", "--store", str(path), "--format", "json")
    flag = run_cli("metrics", "--store", str(path), "--json")
    assert text.returncode == as_json.returncode == flag.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    # (the ages grow between the runs)
    ages = {"fleetstore_outbox_oldest_available_age_seconds", "fleetstore_search_lag_seconds"}
    assert {k: v for k, v in json.loads(flag.stdout)["metrics"].items() if k not in ages} == {
        k: v for k, v in data["metrics"].items() if k not in ages
    }
    assert data["store"] == str(path) and data["error"] is None
    flat = {
        (name, tuple(sorted(s["labels"].items()))): s["value"]
        for name, family in data["metrics"].items()
        if family["type"] != "histogram"
        for s in family["samples"]
    }
    for name, series in parse(text.stdout).items():
        for labels, value in series.items():
            if (name, labels) in flat and name not in ages:
                assert flat[(name, labels)] == value, name
    assert flat[("fleetstore_operations_total", (("operation", "put_state"),))] == 1
    assert data["metrics"]["fleetstore_lock_wait_seconds"]["unit"] == "s"
    refused = run_cli("metrics", "--store", str(path), "--json", "--format", "prometheus")
    assert refused.returncode == 2 and "--json is --format json" in refused.stderr


def test_no_store_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    done = run_cli("metrics", "--store", str(tmp_path / "absent.db"))
    assert done.returncode == 2
    assert list(tmp_path.iterdir()) == []


def test_serve_answers_metrics_on_a_loopback_port_until_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "served.db"
    with fleetstore.open(path) as store:
        store.effects.enqueue("th", "k", {})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleetstore",
            "metrics",
            "--store",
            str(path),
            "--serve",
            "127.0.0.1:0",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=clean_env(),
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("fleetstore metrics: serving http://127.0.0.1:"), line
        url = line.split()[-1]
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            figures = parse(response.read().decode())
        assert one(figures, "fleetstore_outbox_effects", state="pending") == 1
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(url.removesuffix("/metrics") + "/other", timeout=10)
        assert missing.value.code == 404
        missing.value.close()  # its response's socket (else a ResourceWarning, later)
        # Read afresh at every scrape.
        with fleetstore.open(path) as store:
            store.effects.enqueue("th", "k", {})
        with urllib.request.urlopen(url, timeout=10) as response:
            again = parse(response.read().decode())
        assert one(again, "fleetstore_outbox_effects", state="pending") == 2
        # Scrapers that go before their answer (reset at close): no traceback for them.
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", port)) as early:
                early.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                early.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200  # (and after them, it still answers)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_serve_on_a_bad_address_is_bad_usage(tmp_path: Path) -> None:
    path = tmp_path / "one.db"
    fleetstore.open(path).close()
    done = run_cli("metrics", "--store", str(path), "--serve", "nonsense")
    assert done.returncode == 2 and "HOST:PORT" in done.stderr


def test_the_log_says_what_happened_as_json_lines_with_its_fields(
    tmp_path: Path, spawn: Spawn, launch: Callable[..., Proc]
) -> None:
    """A write spooled by a process that then died; ``recover -v --log-format json``
    logs the replay once, as one JSON object with its fields (without -v, recover is
    quiet: its report says it all)."""
    path = tmp_path / "spooled.db"
    with fleetstore.open(path) as store:
        session = store.sessions.create(title="t")
    locker, _at = start_lock(spawn, str(path), hold=2.0)
    dead = launch("spool", str(path), session.id)
    assert dead.wait_line("spooled", timeout=60)[1] == "spooled"
    assert dead.finish(30) == -signal.SIGKILL
    assert locker.finish(30) == 0
    done = run_cli("-v", "--log-format", "json", "recover", "--store", str(path))
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    recovered = [r for r in records if r.get("event") == "recovered"]
    assert len(recovered) == 1, done.stderr
    assert recovered[0]["replayed"] == 1 and recovered[0]["store"] == str(path)
    assert recovered[0]["level"] == "info" and recovered[0]["logger"] == "fleetstore"
    with fleetstore.open(path) as store:
        assert store.state.get(session.id, "k").value == {"v": 1}


def test_quiet_leaves_the_warnings_out(tmp_path: Path, spawn: Spawn) -> None:
    """A command's write spooled (the store locked past its budget): the library's
    warning is on stderr by default, and not with -q (errors only)."""
    path = tmp_path / "locked.db"
    fleetstore.open(path).close()
    env = {**clean_env(), "FLEETSTORE_WRITE_BUDGET": "0.2"}

    def enqueue(*group: str) -> subprocess.CompletedProcess[str]:
        # Held until the command is done (held 1.5 s, the lock was gone before a
        # command slow to start on a loaded machine wrote: nothing spooled).
        locker, _at = start_lock(spawn, str(path), hold=120)
        try:
            return subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "fleetstore",
                    *group,
                    "effects",
                    "enqueue",
                    "--store",
                    str(path),
                    "th",
                    "k",
                ],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
        finally:
            locker.popen.terminate()  # (SIGTERM releases the lock)
            locker.finish(30)

    loud, quiet = enqueue(), enqueue("-q")
    assert loud.returncode == quiet.returncode == 0, loud.stderr + quiet.stderr
    assert [line for line in loud.stderr.splitlines() if " WARNING " in line and "spooled" in line]
    assert not [line for line in quiet.stderr.splitlines() if " WARNING " in line]


def test_a_postgresql_store_s_figures_are_this_host_s_and_its_outbox(
    tmp_path: Path, pg_url: str
) -> None:
    """On PostgreSQL the processes publish under this host's local_dir; the outbox is
    read from the server."""
    env = {**clean_env(), "FLEETSTORE_LOCAL_DIR": str(tmp_path / "local")}
    with fleetstore.open(
        pg_url, local_dir=str(tmp_path / "local"), publish_interval=0.1, search_index=False
    ) as store:
        session = store.sessions.create(title="t")
        store.state.put(session.id, "k", {"v": 1})
        store.effects.enqueue("th", "k", {})
    done = subprocess.run(
        [sys.executable, "-m", "fleetstore", "metrics", "--store", pg_url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["error"] is None
    samples = {
        (name, tuple(sorted(s["labels"].items()))): s.get("value")
        for name, family in data["metrics"].items()
        for s in family["samples"]
    }
    assert samples[("fleetstore_operations_total", (("operation", "put_state"),))] == 1
    assert samples[("fleetstore_outbox_effects", (("state", "pending"),))] == 1
    assert samples[("fleetstore_wal_size_bytes", ())] == 0
    # The search index's queue, read from the server: the session's title, not indexed.
    assert samples[("fleetstore_search_queued", ())] == 1
    assert samples[("fleetstore_search_lag_seconds", ())] > 0
    assert "password" not in data["store"]


MALFORMED = [
    '{"pid": 4242, "published_at": null}',
    '{"pid": 4243, "published_at": 1.0, "metrics": {"commits": NaN}}',
    '{"pid": 4244, "published_at": 1.0, "metrics": {"outbox": 5, "commits": "x"},'
    ' "histograms": {"lock_wait": {"buckets": {"a": "b"}, "n": "x"}, "lock_hold": 7}}',
    "[1, 2]",
]


def test_malformed_figures_files_are_left_out_not_a_crash(tmp_path: Path) -> None:
    """Files in ``<db>.procs/`` that no publisher writes (a null time, a NaN counter,
    a histogram that is a number) crashed metrics, top, doctor and maintain with a raw
    traceback; so did such a ``retired.json``.  They are left out."""
    path = tmp_path / "s.db"
    with fleetstore.open(path) as store:
        store.sessions.create("a")
    procs = procs_dir(path)
    assert one(scrape(path), "fleetstore_commits_total") >= 1
    for n, text in enumerate(MALFORMED):
        (procs / f"{4242 + n}.json").write_text(text)
    for argv in (["metrics"], ["top", "--json", "--count", "1"], ["doctor"], ["maintain"]):
        done = run_cli(*argv, "--store", str(path))
        assert "Traceback" not in done.stderr, (argv, done.stderr)
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
    (procs / "retired.json").write_text(
        '{"counters": {"commits": "y", "operations": {"x": "z"}},'
        ' "histograms": {"lock_wait": 5}, "folded": {"1:2": "x"}}'
    )
    for argv in (["metrics"], ["maintain"]):
        done = run_cli(*argv, "--store", str(path))
        assert done.returncode == 0 and "Traceback" not in done.stderr, (argv, done.stderr)
