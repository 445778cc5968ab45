"""The write-path benchmark still runs: it lives turns through ``fleetstore stress``'s
modules, so a move there broke it without any other test noticing (the full run
aborted on its first cell with an ImportError after the stress package was split)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.fleet
@pytest.mark.timeout(240)
def test_the_write_path_benchmark_runs_every_target_and_verifies_it(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [
            sys.executable, str(ROOT / "benchmarks" / "bench_write_path.py"),
            "--agents", "1,4", "--think", "0", "--sync", "NORMAL", "--seconds", "0.5",
            "--rounds", "1", "--json", str(out), "--workdir", str(tmp_path / "cells"),
        ],
        capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert not doc.get("aborted")
    cells = doc["cells"]
    targets = {"fleetstore", "fleetstore-natural", "opencode", "zcode", "raw-1", "raw-batched"}
    assert {(c["agents"], c["target"]) for c in cells} == {(n, t) for n in (1, 4) for t in targets}
    for cell in cells:
        assert cell["turns"] > 0 and not cell["problems"], cell["label"]
        assert cell["verify"]["ok"], (cell["label"], cell["verify"])
    fleetstore = [c for c in cells if c["target"] == "fleetstore"]
    # Its own figures: two commits a turn for a lone agent (the stream's end carries
    # the turn's state and effect), every turn's effect pending for a worker.
    lone = next(c for c in fleetstore if c["agents"] == 1)
    assert 1.9 < lone["commits_per_turn"] < 2.2, lone["commits_per_turn"]
    assert lone["verify"]["effects"]["pending"] == lone["verify"]["acked_turns"]


@pytest.mark.fleet
@pytest.mark.timeout(240)
def test_the_search_benchmark_runs_and_its_queries_find_what_was_written(tmp_path: Path) -> None:
    out = tmp_path / "search.json"
    done = subprocess.run(
        [
            sys.executable, str(ROOT / "benchmarks" / "bench_search.py"),
            "--messages", "1500", "--queries", "3", "--json", str(out),
        ],
        capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["build"]["messages"] == 1500 and doc["indexing"]["sections"] >= 1500
    assert doc["sizes"]["index_bytes"] > 0 and doc["text_bytes"] > 0
    kinds = doc["latency"]
    assert all(k["p50_ms"] > 0 for k in kinds.values()) and len(kinds) == 27
    # picked from what every store holds (the rest from the corpus: a small store may lack them)
    for kind in ("word (common)", "substring (error code)", "substring (path)"):
        assert kinds[kind]["none_found"] == 0, (kind, kinds[kind])


@pytest.mark.fleet
@pytest.mark.timeout(120)
def test_the_flaky_kind_benchmark_drains_every_configuration(tmp_path: Path) -> None:
    """bench_outbox_failures.py (issue 25's figures in docs/outbox.md): every effect of
    every configuration ends final, the same failures are met with or without lanes (the
    script fails otherwise), and a cap on the attempts makes fewer of them."""
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_outbox_failures.py"), "--quick",
         "--json", str(out), "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = {r["config"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"before", "policy", "lanes", "lanes+policy", "cap"}
    assert all(r["effects"] == 60 and r["not_final"] == 0 for r in results.values())
    assert results["policy"]["attempts"] == results["before"]["attempts"]
    assert results["cap"]["attempts"] < results["before"]["attempts"]
    assert results["cap"]["dead"] >= results["before"]["dead"]
