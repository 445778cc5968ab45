"""``fleetstore stress`` (run here as ``python -m fleetstore_stress``, its own package's
entry): real agent processes living sessions, and a verdict that can fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fleetstore_stress.cli import stress_command
from fleetstore_stress.fleet import ExternalLock
from fleetstore_stress.procs import RestartPolicy


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    env["FLEETSTORE_DATA_DIR"] = str(tmp_path / "data")
    return env


def runner(tmp_path: Path) -> CliRunner:
    """In-process, for usage errors: they are reported before any process starts."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("FLEETSTORE_")}
    env["FLEETSTORE_DATA_DIR"] = str(tmp_path / "data")
    return CliRunner(env=env)


def stress(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-m", "fleetstore_stress", "--json", "--seed", "1", *args],
        capture_output=True,
        text=True,
        # A safety net only (runs take 20-85 s): a hung-worker run on a loaded machine
        # went past 150 s once, its worker frozen by SIGSTOP while it held the gate.
        timeout=270,  # (within pytest-timeout's 300 s)
        env=clean_env(tmp_path),
    )
    try:
        report = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"no JSON on stdout (exit {done.returncode}): {done.stdout}\n{done.stderr}")
    return done.returncode, report, done.stderr


@pytest.mark.fleet
def test_run_under_faults_passes_with_every_turn_read_back(tmp_path: Path) -> None:
    """Kills, maintenance and an outside lock: restarted agents go on after the turn
    they were killed in, and everything acknowledged is there, once, in order."""
    code, report, stderr = stress(
        tmp_path,
        "--agents", "3", "--duration", "5", "--workers", "2",
        "--kill-rate", "0.6", "--maintain",
        "--external-lock", "2@0.5",
        "--large-rate", "0.05", "--large-bytes", "300000",
        "--dir", str(tmp_path / "run"),
    )  # fmt: skip
    (fs,) = report["targets"]
    assert code == 0, (report["problems"], fs["crashed"], stderr)
    assert report["verdict"] == "pass" and fs["target"] == "fleetstore"
    assert fs["acknowledged"] > 0
    assert fs["failed"] == fs["lost"] == fs["duplicated"] == fs["out_of_order"] == 0
    assert fs["corrupt"] == fs["stuck_effects"] == 0 and fs["integrity"] == "ok"
    assert fs["kills"], "no process was killed"
    assert fs["effects"].get("succeeded", 0) > 0
    # The run waited for the two workers to settle the backlog before stopping them.
    assert fs["outbox"]["drain"]["left"] == 0, fs["outbox"]
    assert fs["outbox"]["settled"] == fs["outbox"]["enqueued"], fs["outbox"]
    (lock,) = fs["external_locks"]
    assert lock["locked_at"] is not None and lock["exit_code"] == 0, json.dumps(lock)
    (maint,) = fs["maintenance"]
    assert maint["exit_code"] == 0, maint["output"]
    assert len(fs["per_agent"]) == 3
    assert Path(fs["url"]).parent == tmp_path / "run" / "fleetstore"
    assert str(tmp_path / "run") in stderr  # where the results are, said up front


@pytest.mark.fleet
def test_sharded_target_passes_under_kills_and_an_outside_lock(tmp_path: Path) -> None:
    """``--url sqlite+sharded:///DIR``: the agents' trees in shard files, effects in the
    catalog; the read-back checks every file and the catalog's index against them.
    (6 s: the outside lock takes the catalog and then each shard while the agents
    write; on a loaded machine that took more than the 2.5 s a 3 s run left it.)"""
    store = tmp_path / "sharded"
    code, report, stderr = stress(
        tmp_path, "--url", f"sqlite+sharded://{store}", "--agents", "4", "--duration", "6",
        "--workers", "1", "--kill-rate", "0.4", "--external-lock", "1@0.3",
        "--dir", str(tmp_path / "run"),
    )  # fmt: skip
    (fs,) = report["targets"]
    assert code == 0, (report["problems"], fs["crashed"], stderr)
    assert fs["url"] == f"sqlite+sharded://{store}" and fs["layout"] == "sharded"
    assert fs["acknowledged"] > 0 and fs["failed"] == fs["lost"] == fs["duplicated"] == 0
    assert fs["integrity"] == "ok" and fs["index_problems"] == 0
    assert fs["files_checked"] == 1 + 4  # the catalog and a shard per agent's session
    assert len(list((store / "shards").glob("*/*.db"))) == 4
    assert fs["effects"].get("succeeded", 0) > 0 and fs["kills"]
    assert fs["engine"]["agent_writes"] > 0 and fs["engine"]["lock_wait_ms"]["p99"] > 0
    (lock,) = fs["external_locks"]
    assert lock["locked_at"] is not None and lock["exit_code"] == 0, json.dumps(lock)


@pytest.mark.fleet
def test_writes_spooled_during_an_outside_lock_are_counted_whoever_was_killed(
    tmp_path: Path,
) -> None:
    """An outside lock longer than the write budget makes every agent spool; kills
    restart agents and workers meanwhile.  The run reports what spooled, was replayed
    and recovered, counting the processes that were killed (issue 23: 0 spooled), and
    every kill's replacement was started."""
    code, report, stderr = stress(
        tmp_path, "--agents", "3", "--duration", "6", "--workers", "1",
        "--write-budget", "0.3", "--external-lock", "2@0.5", "--kill-rate", "0.8",
        "--dir", str(tmp_path / "run"),
    )  # fmt: skip
    (fs,) = report["targets"]
    assert code == 0, (report["problems"], fs["crashed"], stderr)
    assert fs["lost"] == fs["duplicated"] == fs["out_of_order"] == 0
    engine, restarts = fs["engine"], fs["restarts"]
    assert engine["spooled"] > 0 and engine["replayed"] + engine["recovered"] > 0, engine
    assert engine["rejected"] == 0
    assert fs["kills"] and restarts["attempts"] == len(fs["kills"]) + restarts["failed"]
    # One file per process that began its run: the originals and every replacement
    # that got that far; those killed are in it, unfinished.
    assert engine["processes"] >= 3 + 1 and engine["processes"] > engine["finished"]


@pytest.mark.fleet
def test_a_target_that_drops_every_100th_write_fails_the_run(tmp_path: Path) -> None:
    code, report, stderr = stress(
        tmp_path, "--agents", "3", "--duration", "3", "--think-ms", "2", "--workers", "1",
        "--drop-every", "100", "--dir", str(tmp_path / "run"),
    )  # fmt: skip
    (fs,) = report["targets"]
    assert fs["acknowledged"] > 150, "too few writes to drop any"
    assert code == 1, stderr
    assert report["verdict"] == "fail"
    assert fs["lost"] > 0
    assert any("acknowledged writes are missing" in p for p in report["problems"])
    assert fs["samples"]["lost"]
    assert fs["failed"] == 0  # every call "succeeded": only the read-back can tell


@pytest.mark.parametrize("text", ["3", "3@", "@1", "x@1", "0@1", "3@-1", "nan@1", "3@inf"])
def test_invalid_external_lock_exits_2(text: str, tmp_path: Path) -> None:
    result = runner(tmp_path).invoke(stress_command, ["--external-lock", text])
    assert result.exit_code == 2, result.output
    assert "HOLD@AT" in result.output
    assert not (tmp_path / "data").exists()  # nothing was started or created


def test_external_lock_after_the_end_of_the_run_exits_2(tmp_path: Path) -> None:
    result = runner(tmp_path).invoke(stress_command, ["--duration", "2", "--external-lock", "1@2"])
    assert result.exit_code == 2
    assert "after the run ends" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["--agents", "0"],
        ["--duration", "0"],
        ["--large-rate", "1.5"],
        ["--think-ms", "-1"],
        ["--kill-rate", "-1"],
        ["--output-bytes", "0"],
        ["--drop-every", "-1"],
    ],
)
def test_out_of_range_options_exit_2(args: list[str], tmp_path: Path) -> None:
    result = runner(tmp_path).invoke(stress_command, [*args])
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "data").exists()


def test_external_lock_parse() -> None:
    assert ExternalLock.parse("3@0.5") == ExternalLock(hold=3.0, at=0.5)
    assert str(ExternalLock.parse(" 2.5@0 ")) == "2.5@0"


def test_sequence_check_sees_lost_duplicated_and_reordered_writes() -> None:
    from fleetstore_stress.verify import _Check, _check_sequence

    check = _Check()
    expected = [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
    found = _check_sequence(check, 0, expected, ["a", "c", "b", "x", "c"])
    assert check.counts == {"lost": 1, "duplicated": 1, "out_of_order": 1}
    assert check.lost == [[0, 4, "d"]]
    assert check.duplicated == [[0, 3, "c", 2]]
    assert check.out_of_order == [[0, 3, "c"]]  # c came before b
    assert set(found) == {"a", "b", "c"}
    clean = _Check()
    _check_sequence(clean, 0, expected, ["a", "z", "b", "c", "d"])  # extra rows are fine
    assert not clean.counts


def test_a_restart_that_fails_before_it_is_ready_is_tried_again_until_the_run_ends() -> None:
    """Issue 23: a restarted agent whose open() met a full disk exited before it was
    ready and was never restarted (a soak lost 5 of 16 agents for good); one still
    starting after a deadline equal to the write budget was dropped (a 70 s outside
    lock).  The policy, without processes: again after a growing pause, until the end;
    no deadline for an attempt that is alive."""
    policy = RestartPolicy(first=0.5, cap=4.0)
    agent = ("agent", 3)
    end = 1000.0
    policy.killed(agent, 10.0)
    assert policy.due(10.0, end) == [agent]
    policy.launched(agent)
    # Starting for as long as it takes (an open() waiting out a 70 s lock): never due,
    # never dropped.
    assert policy.due(10_000.0, 20_000.0) == [] and policy.pending() == 1
    pauses = []
    now = 100.0
    for _ in range(6):  # each attempt exits before it is ready: a full disk
        pauses.append(policy.exited(agent, now, "StorageFull: disk full"))
        assert policy.due(now, end) == []
        now += pauses[-1]
        assert policy.due(now, end) == [agent]
        policy.launched(agent)
    assert pauses == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    report = policy.report()
    assert report["attempts"] == 7 and report["failed"] == 6
    assert report["not_back"] == [
        {"role": "agent", "index": 3, "attempts": 7, "failed": 6,
         "last_error": "StorageFull: disk full"}
    ]  # fmt: skip
    policy.ready(agent)  # the disk was freed: it is back
    assert policy.pending() == 0 and policy.report()["not_back"] == []
    # A kill close to the end: its attempt fails, and the next one is not started
    # once the run is over; it is reported as not back.
    worker = ("worker", 0)
    policy.killed(worker, 998.0)
    policy.launched(worker)
    policy.exited(worker, 999.8, "exit 1")
    assert policy.due(1000.3, end) == [] and policy.pending() == 1
    assert [w["role"] for w in policy.report()["not_back"]] == ["worker"]


FIGURES = r"""
import json, sys, time
from fleetstore_stress.agent import Figures
from fleetstore.core.metrics import Histogram

cfg, index, mode = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
waits = Histogram()
waits.add(0.004)
now = {"writes": 10, "busy_timeouts": 1, "spooled": 0, "replayed": 0, "recovered": 0,
       "rejected": 0}
def engine():
    return {**now, "histograms": {"lock_wait": waits.export(), "lock_hold": waits.export()}}
figures = Figures(cfg, "agent", index, engine)
figures.start()  # the run begins: an original process's baseline
now.update(json.loads(sys.argv[4]))  # what it did during the run
figures.write(finished=False)  # as its thread does every half second
print("written", flush=True)
if mode == "kill":
    time.sleep(600)  # killed here, before it could finish
figures.stop()
"""


def test_the_run_sums_the_figures_of_every_process_killed_ones_included(tmp_path: Path) -> None:
    """Issue 23: the run's JSON said 0 spooled although writes spooled and were
    replayed: only the processes alive at the end reported, and in a soak with 254
    kills those had not spooled.  Each process keeps its figures in a file of its own,
    rewritten as it goes; the run sums them all, a SIGKILLed one's included."""
    from fleetstore_stress.agent import figures_dir, read_figures
    from fleetstore_stress.fleet import sum_figures

    def run(index: int, mode: str, restart: bool, did: dict[str, int]) -> subprocess.Popen[str]:
        cfg = {"figures": str(figures_dir(tmp_path)), "restart": restart}
        args = [json.dumps(cfg), str(index), mode, json.dumps(did)]
        return subprocess.Popen(
            [sys.executable, "-c", FIGURES, *args], stdout=subprocess.PIPE, text=True
        )

    killed = run(0, "kill", False, {"writes": 30, "spooled": 7, "replayed": 2})
    assert killed.stdout is not None and killed.stdout.readline() == "written\n"
    killed.kill()
    killed.wait(30)
    killed.stdout.close()
    # Its replacement (a whole life in the run) recovered what the killed one spooled;
    # another agent ran to the end.
    for proc in (run(0, "end", True, {"recovered": 5}), run(1, "end", False, {"writes": 13})):
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and out == "written\n"

    rows = read_figures(tmp_path)
    assert sorted((r["index"], r["finished"]) for r in rows) == [(0, False), (0, True), (1, True)]
    out = sum_figures(rows, 10.0)
    assert out["processes"] == 3 and out["finished"] == 2
    assert (out["spooled"], out["replayed"], out["recovered"]) == (7, 2, 5)
    # An original process's part begins at the start; a restarted one's is its life.
    assert out["agent_writes"] == (30 - 10) + 10 + (13 - 10)
    assert out["busy_timeouts"] == 1 and out["lock_wait_ms"]["p99"] > 0


def test_the_workload_is_the_same_for_every_target() -> None:
    from fleetstore_stress.agent import Turn

    cfg = {"seed": 7, "think_ms": 10.0, "large_rate": 0.5, "large_bytes": 3 << 20,
           "output_bytes": 500}  # fmt: skip
    turns = [Turn(cfg, 1, n) for n in range(1, 200)]
    again = [Turn(cfg, 1, n) for n in range(1, 200)]
    assert [(t.user, t.deltas, t.output_size) for t in turns] == [
        (t.user, t.deltas, t.output_size) for t in again
    ]
    sizes = [t.output_size for t in turns]
    assert max(sizes) > 1 << 20 and min(sizes) < 5000  # heavy-tailed: bytes to megabytes
    assert max(sizes) <= 3 << 20
    assert turns[0].output(cfg, 1) == again[0].output(cfg, 1)
    assert len(turns[0].output(cfg, 1)) == turns[0].output_size


@pytest.mark.fleet
def test_postgresql_target_passes_with_an_outside_lock(tmp_path: Path, pg_url: str) -> None:
    code, report, stderr = stress(
        tmp_path, "--url", pg_url, "--agents", "2", "--duration", "5", "--workers", "1",
        "--external-lock", "1@0.5", "--dir", str(tmp_path / "run"),
    )  # fmt: skip
    (fs,) = report["targets"]
    assert code == 0, (report["problems"], stderr)
    assert fs["url"] == pg_url and fs["acknowledged"] > 0
    assert fs["failed"] == fs["lost"] == fs["duplicated"] == fs["stuck_effects"] == 0
    (lock,) = fs["external_locks"]
    assert lock["locked_at"] is not None and lock["exit_code"] == 0, json.dumps(lock)


@pytest.mark.fleet
def test_langgraph_peer_checkpoints_turns_and_its_verifier_sees_loss(tmp_path: Path) -> None:
    """The LangGraph peer through the agent module's own processes (stdlib sqlite3 never
    enters this one): its turns read back intact; a forged acknowledgement is lost and a
    wrong output hash corrupt."""
    import time

    db, journal = tmp_path / "langgraph.db", tmp_path / "agent-0.jsonl"
    cfg: dict[str, Any] = {
        "target": "langgraph", "url": str(db), "run_id": "t", "seed": 4, "think_ms": 1.0,
        "output_bytes": 300, "large_rate": 0.0, "large_bytes": 0, "settings": {},
        "synchronous": None, "drop_every": 0,
    }  # fmt: skip
    module = [sys.executable, "-m", "fleetstore_stress.child"]
    env = clean_env(tmp_path)
    prep = subprocess.run(
        [*module, "--verify", json.dumps({**cfg, "prepare": True})],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert prep.returncode == 0, prep.stderr
    with subprocess.Popen(
        [*module, "--agent", json.dumps({**cfg, "agent": 0, "journal": str(journal),
                                         "restart": False})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    ) as agent:  # fmt: skip
        assert agent.stdout is not None and agent.stdin is not None
        assert agent.stdout.readline().strip() == "ready"
        start = time.monotonic()
        agent.stdin.write(f"start {start!r} {start + 1.5!r}\n")
        agent.stdin.close()
        assert agent.wait(60) == 0, agent.stderr.read() if agent.stderr else ""
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    assert len(lines) >= 3 and all("sha" in e for e in lines), lines

    def verify() -> dict[str, Any]:
        done = subprocess.run(
            [*module, "--verify", json.dumps({**cfg, "journals": [str(journal)]})],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
        return result

    clean = verify()
    assert clean["acked_turns"] == len(lines) and clean["integrity"] == "ok"
    assert clean["lost"] == clean["duplicated"] == clean["out_of_order"] == clean["corrupt"] == 0
    forged = {**lines[-1], "n": lines[-1]["n"] + 1}
    tampered = {**lines[0], "sha": "0" * 64}
    journal.write_text("\n".join(json.dumps(e) for e in [tampered, *lines[1:], forged]) + "\n")
    broken = verify()
    assert broken["lost"] == 2  # the forged turn's user message and reply
    assert broken["corrupt"] == 2  # the forged turn and the wrong hash
    assert broken["samples"]["corrupt"][0][1] == lines[0]["n"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--url", "http://nope/x"], "unsupported store URL scheme 'http'"),
        (["--url", "sqlite://relative.db"], "three slashes"),
    ],
)
def test_bad_store_url_or_dir_exits_2_before_any_process_starts(
    args: list[str], says: str, tmp_path: Path
) -> None:
    """Issue 18, item 11: these exited 1 with a child's traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "fleetstore_stress", "--duration", "1", "--agents", "1", *args],
        capture_output=True, text=True, timeout=60, env=clean_env(tmp_path),
    )  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert says in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists()  # nothing was started or created


@pytest.mark.fleet
def test_kill_rate_is_kept_on_a_clock_whatever_the_restarts_take(tmp_path: Path) -> None:
    """Issue 18, item 12: each kill waited for the replacement to be ready, so
    ``--kill-rate 2`` killed at about a third of that.  Kills are scheduled on a
    clock: their count is close to rate x duration (a count, not a timing)."""
    rate, duration = 2.0, 8.0
    code, report, stderr = stress(
        tmp_path, "--agents", "3", "--duration", f"{duration:g}", "--workers", "1",
        "--kill-rate", f"{rate:g}", "--dir", str(tmp_path / "run"),
    )  # fmt: skip
    (fs,) = report["targets"]
    assert code == 0, (report["problems"], fs["crashed"], stderr)
    expected = rate * duration
    assert 0.6 * expected <= len(fs["kills"]) <= 1.5 * expected, fs["kills"]
    assert fs["kill_rate_achieved"] == round(len(fs["kills"]) / duration, 3)
    assert fs["lost"] == fs["duplicated"] == fs["failed"] == 0


def test_unknown_target_exits_2_with_the_list_of_names(tmp_path: Path) -> None:
    result = runner(tmp_path).invoke(stress_command, ["--targets", "t3code,nope"])
    assert result.exit_code == 2, result.output
    assert "unknown target 'nope'" in result.output
    for name in ("fleetstore", "t3code", "opencode", "zcode", "agents-sdk", "langgraph"):
        assert name in result.output
    assert not (tmp_path / "data").exists()


def _files_bytes(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        if p.is_dir():
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        elif p.exists():
            total += p.stat().st_size
    return total


@pytest.mark.fleet
def test_bytes_rows_are_the_files_on_disk(tmp_path: Path) -> None:
    """Each target's kept bytes, summed here from the files the run left (after the
    run's own checkpoint there is no WAL), and per acknowledged turn; fleetstore
    within a small factor of its compressed payload under --long-replies."""
    run = tmp_path / "run"
    code, report, stderr = stress(
        tmp_path, "--targets", "t3code,opencode", "--agents", "2", "--duration", "3",
        "--workers", "1", "--long-replies", "--large-rate", "0.5",
        "--large-bytes", "1500000", "--dir", str(run),
    )  # fmt: skip
    assert code == 0, (report["problems"], stderr)
    by = {t["target"]: t for t in report["targets"]}
    assert set(by) == {"fleetstore", "t3code", "opencode"}
    files = {
        "fleetstore": [run / "fleetstore" / "fleetstore.db", run / "fleetstore" / "fleetstore.db.blobs"],
        "t3code": [run / "t3code" / "t3code.db"],
        "opencode": [run / "opencode" / "opencode.db"],
    }  # fmt: skip
    for name, paths in files.items():
        b = by[name]["bytes"]
        wal = [Path(f"{p}-wal") for p in paths]
        assert _files_bytes(wal) == 0 and b["after_checkpoint"]["wal"] == 0
        on_disk = _files_bytes(paths)
        assert b["after_checkpoint"]["total"] == on_disk > 0, name
        assert b["per_turn"] == round(on_disk / by[name]["acknowledged"])
        assert b["after_checkpoint"]["db"] == paths[0].stat().st_size
    assert by["fleetstore"]["bytes"]["after_run"]["blobs"] > 0
    # The search index (FTS5 words and trigrams, about 1.3x the text it covers:
    # docs/benchmarks.md) is part of what fleetstore keeps: 3.4x here with it, 1.1x without.
    assert by["fleetstore"]["bytes"]["vs_compressed_payload"] <= 4.5
    # Whole parts rewritten with a full snapshot logged per update: many times more.
    assert by["opencode"]["bytes"]["per_turn"] > 5 * by["fleetstore"]["bytes"]["per_turn"]


@pytest.mark.fleet
def test_a_hung_worker_blocks_a_t3code_lane_for_good_and_no_fleetstore_lane(
    tmp_path: Path,
) -> None:
    """--hang-worker: fleetstore's worker 0 freezes (SIGSTOP) on its first effect, its
    lease runs out and the other worker's sweep hands the effect on; t3code's agent
    0's server never returns from its first effect's execution, and nothing recovers
    a lease at run time: the effect stays running past its 30 s lease, its thread's
    later effects wait behind it."""
    code, report, stderr = stress(
        tmp_path, "--targets", "t3code", "--agents", "2", "--duration", "34",
        "--think-ms", "50", "--workers", "2", "--hang-worker", "--dir", str(tmp_path / "run"),
    )  # fmt: skip
    fs, t3 = report["targets"]
    assert t3["target"] == "t3code"
    assert code == 0, (report["problems"], fs["crashed"], stderr)
    assert fs["hung"] == [{"role": "worker", "index": 0}]
    assert fs["outbox"]["stuck"] == 0 and fs["outbox"]["lanes_blocked_at_end"] == 0
    # The frozen worker's lease ran out and its lane went on: blocked for about a lease
    # (5 s), not for the run.  The lane may end a few effects behind on a loaded machine
    # (653 acknowledged, 649 settled in one CI run); blocked for good, it would settle
    # about half.
    assert fs["outbox"]["lane_blocked_max_s"] < 20
    assert fs["outbox"]["settled"] >= 0.9 * fs["acknowledged"]
    assert t3["outbox"]["stuck"] == 1
    assert t3["outbox"]["lanes_blocked_at_end"] == 1
    assert t3["outbox"]["lane_blocked_max_s"] > 20
    assert any("stuck running past their lease" in p for p in t3["problems"])
    stuck = [p[3] for p in t3["outbox"]["series"]]
    assert stuck[0] == 0 and stuck[-1] == 1  # the chart's stuck line rises at the lease's end


def test_outbox_summary_sees_stuck_effects_and_blocked_lanes() -> None:
    from fleetstore_stress.effects import Row, summarize

    rows = [
        # thread a: the first effect runs past its lease; two wait behind it
        Row("a", 1, "running", created=10.0, claimed=10.1, finished=None, lease_expires=40.1),
        Row("a", 2, "pending", created=11.0, claimed=None, finished=None, lease_expires=None),
        Row("a", 3, "pending", created=12.0, claimed=None, finished=None, lease_expires=None),
        # thread b: settled in order, the second waited 0.5 s for the first
        Row("b", 1, "succeeded", created=10.0, claimed=10.0, finished=11.5, lease_expires=None),
        Row("b", 2, "succeeded", created=11.0, claimed=11.5, finished=11.6, lease_expires=None),
        # thread c: running within its lease, nothing behind it
        Row("c", 1, "running", created=49.0, claimed=49.0, finished=None, lease_expires=79.0),
    ]
    out = summarize(rows, now=50.0, start=10.0)
    assert out["enqueued"] == 6 and out["settled"] == 2 and out["stuck"] == 1
    assert out["lanes_blocked_at_end"] == 1
    assert out["lane_blocked_max_s"] == 39.0  # a's second effect, from 11 s to the end
    assert out["settle_p50_ms"] == 600.0 and out["settle_p99_ms"] == 1500.0
    series = out["series"]
    assert series[0] == [0.0, 2, 0, 0] and series[-1] == [40.0, 6, 2, 1]
    assert next(p for p in series if p[3] == 1)[0] == 30.5  # stuck once a's lease ran out


def test_the_read_back_sees_a_catalog_index_that_disagrees_with_the_shards(
    tmp_path: Path,
) -> None:
    """The read-back of a sharded target names an index row gone, an index row for a
    session its shard lacks, and one naming a shard file that does not exist (as
    tests/store/test_sharded.py's ``check_consistent`` does)."""
    import apsw

    import fleetstore
    from fleetstore.core.targets import CATALOG
    from fleetstore_stress.verify import _index_problems

    root = tmp_path / "store"
    with fleetstore.open(f"sqlite+sharded://{root}") as store:
        store.sessions.create("a", id="tree-a")
        store.sessions.create("b", id="tree-b")
        store.sessions.create("b's subagent", id="sub-b", parent_id="tree-b")
        assert _index_problems(store) == []
    conn = apsw.Connection(str(root / CATALOG), flags=apsw.SQLITE_OPEN_READWRITE)
    try:
        with conn:
            conn.execute("DELETE FROM shard_sessions WHERE session_id = 'sub-b'")
            conn.execute("INSERT INTO shard_sessions VALUES ('ghost', 'tree-a')")
            conn.execute("INSERT INTO shard_sessions VALUES ('lost', 'gone-zz')")
    finally:
        conn.close()
    with fleetstore.open(f"sqlite+sharded://{root}") as store:
        assert sorted(_index_problems(store)) == [
            "gone-zz: shard file missing",
            "tree-a: indexed session ghost missing",
            "tree-b: session sub-b not in the index",
        ]


def test_the_env_vars_are_read() -> None:
    result = CliRunner(env={"FLEETSTORE_STRESS_AGENTS": "0"}).invoke(stress_command, [])
    assert result.exit_code == 2
    assert "FLEETSTORE_STRESS_AGENTS" in result.output


def test_help_and_docs_name_every_option_env_var_and_exit_code() -> None:
    """What tests/cli/test_cli.py checks of every command fleetstore ships, for this
    one (there, only where fleetstore-stress is installed)."""
    import re

    import click

    result = CliRunner().invoke(stress_command, ["--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "Exit codes" in result.output
    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    match = re.search(r"^## `fleetstore stress`\s*$(.*?)^## ", text, re.M | re.S)
    assert match, "docs/cli.md has no section for fleetstore stress"
    section = match[1]
    assert "Exit code" in section
    opts = [p for p in stress_command.params if isinstance(p, click.Option) and not p.hidden]
    assert len(opts) > 20
    for opt in opts:
        if opt.name == "help":
            continue
        assert isinstance(opt.envvar, str) and opt.envvar in result.output, opt.name
        assert max(opt.opts, key=len) in section and opt.envvar in section, opt.name
