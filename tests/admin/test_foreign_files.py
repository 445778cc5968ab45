"""``fleetstore doctor`` and ``maintain`` on another program's database (issue 28): a
file written as opencode writes its own (tests/agents/opencode_agent.py, a process of
its own), measured per table and index, the busy-timeout advice, findings in order of
urgency, exit codes that tell problems from bad usage, and a maintenance that leaves
no file of ours beside it while that program keeps writing.

Doctor and maintain run as their own processes, as an operator runs them; the test
process never opens the database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetstore.admin import doctor
from fleetstore.admin.doctor import findings
from tests.agents import script
from tests.fix_procs import Proc

AGENT = script("opencode_agent.py")
SQLITE_OWN = {"-wal", "-shm"}


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}


def fleetstore_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetstore", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )


def doctor_json(path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    done = fleetstore_cli("doctor", str(path), "--json", "--interval", "0.3", *args)
    assert done.stdout, f"exit {done.returncode}: {done.stderr}"
    return done.returncode, json.loads(done.stdout)


def fill(path: Path, turns: int) -> None:
    done = subprocess.run(
        [sys.executable, AGENT, "fill", str(path), str(turns)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    try:
        yield started
    finally:
        for proc in started:
            proc.kill()


def start(procs: list[Proc], *args: str, ready: str) -> Proc:
    proc = Proc([sys.executable, AGENT, *args], args[0])
    procs.append(proc)
    proc.wait_line(ready, timeout=120)
    return proc


def beside(path: Path) -> set[str]:
    """What is in the database's directory besides the database."""
    return {p.name.removeprefix(path.name) for p in path.parent.iterdir()} - {""}


def test_doctor_measures_every_table_and_names_where_the_file_grows(tmp_path: Path) -> None:
    db = tmp_path / "opencode.db"
    fill(db, 150)
    rc, report = doctor_json(db)
    sizes = report["database"]["sizes"]
    pages = report["database"]["page_count"] * report["database"]["page_size"]
    assert sizes["total_bytes"] == pages  # every page: b-trees plus free pages
    assert sum(o["bytes"] for o in sizes["objects"]) + sizes["free_bytes"] == pages
    by_table = {t["table"]: t for t in sizes["tables"]}
    assert set(by_table) == {"session", "message", "part", "event", "sqlite_schema"}
    assert by_table["part"]["indexes"] == 2  # its primary key's and part_message_idx
    part = by_table["part"]
    assert part["bytes"] == part["table_bytes"] + part["index_bytes"]
    # The event rows carry the whole part of every update: most of the file.
    assert sizes["tables"][0]["table"] == "event" and sizes["tables"][0]["share"] > 0.5
    largest = next(f for f in report["findings"] if f["code"] == "largest-table")
    assert largest["severity"] == "ok" and "table event holds" in largest["message"]
    # Another program's file: what its writers' busy timeout should be, and why.
    advice = next(f for f in report["findings"] if f["code"] == "busy-timeout")
    assert "5 s" in advice["message"] and "BEGIN IMMEDIATE" in advice["fix"]
    assert rc == doctor.EXIT_HEALTHY, report["findings"]

    text = fleetstore_cli("doctor", str(db), "--interval", "0")
    assert "Sizes (dbstat" in text.stdout and "advice: in each program" in text.stdout

    skipped = fleetstore_cli("doctor", str(db), "--json", "--interval", "0", "--no-sizes")
    assert json.loads(skipped.stdout)["database"]["sizes"] is None


def test_a_big_file_mostly_one_table_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The threshold (256 MB) lowered in this process, which runs diagnose() itself
    on a file no process has open."""
    db = tmp_path / "opencode.db"
    fill(db, 60)
    monkeypatch.setattr(findings, "LARGEST_TABLE_MIN_BYTES", 1024)
    report = doctor.diagnose(db, interval=0).to_json()
    largest = next(f for f in report["findings"] if f["code"] == "largest-table")
    assert largest["severity"] == "warning" and "VACUUM" in largest["fix"]
    assert report["exit_code"] == doctor.EXIT_WARNINGS


def test_a_store_gets_sizes_but_no_busy_timeout_advice(tmp_path: Path) -> None:
    import fleetstore

    db = tmp_path / "store.db"
    with fleetstore.open(db) as store:
        s = store.sessions.create(title="x")
        store.messages.append(s.id, "user", "hello " * 200)
    rc, report = doctor_json(db)
    assert {t["table"] for t in report["database"]["sizes"]["tables"]} >= {"messages", "parts"}
    codes = {f["code"] for f in report["findings"]}
    assert "busy-timeout" not in codes and "largest-table" in codes
    assert rc == doctor.EXIT_HEALTHY


def test_a_lock_holder_is_listed_before_a_file_mode_and_problems_exit_3(
    tmp_path: Path, procs: list[Proc]
) -> None:
    db = tmp_path / "opencode.db"
    fill(db, 20)
    db.chmod(0o644)  # another program's file others can read: a warning
    start(procs, "hold", str(db), "120", ready="holding")
    rc, report = doctor_json(db)
    order = [f["code"] for f in report["findings"]]
    assert "world-readable" in order and "write-lock-held" in order
    # Both warnings; the holder stops every writer now, the mode is a risk.
    assert order.index("write-lock-held") < order.index("world-readable")
    assert rc == doctor.EXIT_WARNINGS == report["exit_code"]
    held = next(f for f in report["findings"] if f["code"] == "write-lock-held")
    assert "busy timeout" in held["message"]

    db.chmod(0o646)  # writable by every user: a problem, exit 3 (bad usage is 2)
    rc, report = doctor_json(db)
    assert report["findings"][0]["code"] == "world-writable"
    assert rc == doctor.EXIT_PROBLEMS == 3 == report["exit_code"]
    assert report["report_version"] == 2


def test_bad_usage_exits_2_and_says_so_apart_from_problems(tmp_path: Path) -> None:
    bad = fleetstore_cli("doctor", str(tmp_path / "x.db"), "--interval", "-1")
    assert bad.returncode == doctor.EXIT_USAGE == 2 and "Usage" in bad.stderr
    notes = tmp_path / "notes.db"
    notes.write_text("not a database\n" * 20)
    done = fleetstore_cli("doctor", str(notes))
    assert done.returncode == 2 and done.stdout == "" and "not a SQLite database" in done.stderr


def test_maintain_leaves_no_file_of_ours_beside_a_live_foreign_database(
    tmp_path: Path, procs: list[Proc]
) -> None:
    """maintain --yes left ``opencode.db.gate`` beside opencode's database (issue 28).
    Now: the generic steps through a plain connection while that program writes; the
    directory holds nothing but its database and SQLite's own -wal and -shm, the
    program goes on writing, and the file is whole."""
    db = tmp_path / "opencode.db"
    writer = start(procs, "live", str(db), "30", ready="ready")
    assert beside(db) == SQLITE_OWN

    dry = fleetstore_cli("maintain", str(db), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert beside(db) == SQLITE_OWN

    done = fleetstore_cli("maintain", str(db), "--yes", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["kind"] == "foreign"
    assert [s["name"] for s in report["steps"]] == ["optimize", "vacuum", "checkpoint"]
    checkpoint = report["steps"][2]
    assert checkpoint["status"] in ("done", "skipped"), checkpoint
    assert beside(db) == SQLITE_OWN, sorted(beside(db))

    # The program was not stopped: it keeps committing turns after the maintenance.
    _, line = writer.wait_line("turns", timeout=60)
    before = int(line.split()[1])
    _, line = writer.wait_line("turns", timeout=60)
    assert int(line.split()[1]) > before
    writer.kill()
    _, report = doctor_json(db)
    assert report["database"]["quick_check"] == ["ok"]
    assert beside(db) <= SQLITE_OWN


def test_maintain_of_a_closed_foreign_file_returns_its_free_pages(tmp_path: Path) -> None:
    """An online incremental vacuum where the file allows it (auto_vacuum=INCREMENTAL),
    and nothing left beside it once done."""
    db = tmp_path / "app.db"
    make = (
        "import sys, apsw\n"
        "c = apsw.Connection(sys.argv[1])\n"
        "c.execute('PRAGMA auto_vacuum=INCREMENTAL'); c.execute('PRAGMA journal_mode=WAL')\n"
        "c.execute('CREATE TABLE t(x)')\n"
        "with c:\n"
        "    for i in range(2000): c.execute('INSERT INTO t VALUES (randomblob(900))')\n"
        "c.execute('DELETE FROM t WHERE rowid > 500')\n"
        "c.close()\n"
    )
    subprocess.run([sys.executable, "-c", make, str(db)], check=True, timeout=120)
    _, report = doctor_json(db)
    assert report["database"]["freelist_count"] > 100
    done = fleetstore_cli("maintain", str(db), "--yes", "--json")
    assert done.returncode == 0, done.stderr
    steps = {s["name"]: s for s in json.loads(done.stdout)["steps"]}
    assert steps["vacuum"]["detail"]["freed_pages"] > 100
    assert beside(db) == set()  # the last connection closed: SQLite removed its -wal, -shm
    _, report = doctor_json(db)
    assert report["database"]["freelist_count"] == 0
    assert report["database"]["quick_check"] == ["ok"]


def test_maintain_truncates_the_wal_a_killed_foreign_writer_left(tmp_path: Path) -> None:
    """A program killed with frames in its WAL: maintain's checkpoint copies them and
    truncates the WAL while nobody reads (``OutsideFile.checkpoint(truncate=True)``;
    a passive checkpoint alone leaves the file its size)."""
    db = tmp_path / "app.db"
    make = (
        "import os, signal, sys, apsw\n"
        "c = apsw.Connection(sys.argv[1])\n"
        "c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA wal_autocheckpoint=0')\n"
        "c.execute('CREATE TABLE t(x)')\n"
        "with c:\n"
        "    for i in range(200): c.execute('INSERT INTO t VALUES (randomblob(900))')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", make, str(db)], timeout=120)
    assert killed.returncode == -9
    assert os.path.getsize(f"{db}-wal") > 100_000
    done = fleetstore_cli("maintain", str(db), "--yes", "--json")
    assert done.returncode == 0, done.stderr
    step = {s["name"]: s for s in json.loads(done.stdout)["steps"]}["checkpoint"]
    assert step["detail"]["wal_bytes_before"] > 100_000
    assert step["detail"]["wal_bytes_after"] == 0, step
    _, report = doctor_json(db)
    assert report["database"]["quick_check"] == ["ok"]
