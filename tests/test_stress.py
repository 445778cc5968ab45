"""``fleetstore stress``: real agent processes, a real file, and a verdict that can fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fleetstore.cli import main
from fleetstore.ops.stress import ExternalLock


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
        [sys.executable, "-m", "fleetstore", "stress", "--json", "--seed", "1", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(tmp_path),
    )
    try:
        report = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"no JSON on stdout (exit {done.returncode}): {done.stdout}\n{done.stderr}")
    return done.returncode, report, done.stderr


@pytest.mark.slow
def test_short_run_passes_with_every_write_on_disk_once(tmp_path: Path) -> None:
    db = tmp_path / "stress.db"
    code, report, stderr = stress(tmp_path, "--agents", "3", "--duration", "2", "--path", str(db))
    assert code == 0, (report["problems"], stderr)
    assert report["verdict"] == "pass"
    assert report["acknowledged"] > 0
    assert report["rows"] == report["acknowledged"]
    assert report["failed"] == report["lost"] == report["duplicated"] == 0
    assert report["integrity"] == "ok"
    assert report["agents_crashed"] == 0
    assert len(report["per_agent"]) == 3
    assert all(a["acknowledged"] > 0 for a in report["per_agent"])
    assert 2 <= report["elapsed_s"] < 10
    assert report["path"] == str(db) and db.exists()
    assert str(db) in stderr  # where the database is, said up front


@pytest.mark.slow
def test_budget_shorter_than_an_outside_lock_fails_the_verdict(tmp_path: Path) -> None:
    code, report, stderr = stress(
        tmp_path,
        "--agents", "3",
        # The lock outlasts the run's end by a margin: on a loaded machine its process
        # may take seconds to start, and a run that ended first would see no failure.
        "--duration", "5",
        "--write-budget", "0.5",
        "--external-lock", "6@0.5",
        "--path", str(tmp_path / "busy.db"),
    )  # fmt: skip
    assert code == 1, stderr
    assert report["verdict"] == "fail"
    assert report["failed"] > 0
    assert set(report["failures_by_type"]) == {"StoreBusy"}
    for failure in report["samples"]["failures"]:
        assert 0.4 <= failure["waited"] < 3
    # Failed writes were never acknowledged; what was acknowledged is all there.
    assert report["lost"] == report["duplicated"] == report["failed_but_present"] == 0
    assert report["integrity"] == "ok"
    (lock,) = report["external_locks"]
    assert lock["spec"] == "6@0.5"
    assert lock["locked_at"] is not None and lock["locked_at"] >= 0.5
    assert lock["exit_code"] == 0


def test_default_path_is_under_the_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetstore.ops.stress import default_path

    monkeypatch.setenv("FLEETSTORE_DATA_DIR", str(tmp_path))
    path = default_path()
    assert path.parent == tmp_path / "stress"
    assert path.name.startswith("stress-") and path.suffix == ".db"


@pytest.mark.parametrize("text", ["3", "3@", "@1", "x@1", "0@1", "3@-1", "nan@1", "3@inf"])
def test_invalid_external_lock_exits_2(text: str, tmp_path: Path) -> None:
    result = runner(tmp_path).invoke(main, ["stress", "--external-lock", text])
    assert result.exit_code == 2, result.output
    assert "HOLD@AT" in result.output
    assert not (tmp_path / "data").exists()  # nothing was started or created


def test_external_lock_after_the_end_of_the_run_exits_2(tmp_path: Path) -> None:
    result = runner(tmp_path).invoke(main, ["stress", "--duration", "2", "--external-lock", "1@2"])
    assert result.exit_code == 2
    assert "after the run ends" in result.output


@pytest.mark.parametrize(
    "args", [["--agents", "0"], ["--duration", "0"], ["--large-rate", "1.5"], ["--think-ms", "-1"]]
)
def test_out_of_range_options_exit_2(args: list[str], tmp_path: Path) -> None:
    result = runner(tmp_path).invoke(main, ["stress", *args])
    assert result.exit_code == 2, result.output


def test_external_lock_parse() -> None:
    assert ExternalLock.parse("3@0.5") == ExternalLock(hold=3.0, at=0.5)
    assert str(ExternalLock.parse(" 2.5@0 ")) == "2.5@0"


def test_read_back_finds_lost_duplicated_and_unacknowledged_rows(tmp_path: Path) -> None:
    """The checker itself can see each kind of damage (in-process: apsw only, no sqlite3)."""
    from fleetstore import Database
    from fleetstore.ops.stress import INSERT_SQL, STRESS_MIGRATIONS, _read_back

    path = tmp_path / "damaged.db"
    with Database.open(path, migrations=STRESS_MIGRATIONS) as db, db.write() as tx:
        # agent 0 acknowledged 1-4 and saw 5 fail; agent 1 acknowledged 1-2.
        rows = [(0, 1), (0, 2), (0, 2), (0, 4), (0, 5), (1, 1), (1, 2), (1, 9)]
        tx.executemany(INSERT_SQL, [(a, s, b"", 0.0) for a, s in rows])
    agents = [
        {"agent": 0, "acked_runs": [[1, 4]], "acked_count": 4, "failed_runs": [[5, 5]]},
        {"agent": 1, "acked_runs": [[1, 2]], "acked_count": 2, "failed_runs": []},
    ]
    check = _read_back(path, 0, agents)
    assert check.rows == 8
    assert check.acked_present == 5  # (0, 3) is lost
    assert check.lost_samples == [[0, 3]]
    assert check.duplicated == 1 and check.duplicated_samples == [[0, 2, 2]]
    assert check.failed_present == 1  # (0, 5) raised yet was committed
    assert check.unacknowledged == 1  # (1, 9) was never attempted
    assert check.integrity == ["ok"]
