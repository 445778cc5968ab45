"""``fleetstore doctor``: names lock holders and hazards, and never changes a byte.

Every database here is held by separate OS processes (tests/agents/doctor_agent.py,
``fleetstore lock``), and doctor runs as its own process, as an operator would run it:
the test process only hashes files, and never has a database open while a child uses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

import fleetstore
from fleetstore.admin import doctor
from fleetstore.admin.doctor import findings
from fleetstore.admin.doctor.report import ORDER
from fleetstore.core.ids import new_id
from fleetstore.domain.operations import Operation
from fleetstore.files import inspect
from fleetstore.store.spool import encode_line
from tests.agents import script
from tests.fix_faults import importable_env
from tests.fix_procs import Proc, Spawn, start_lock

AGENT = script("doctor_agent.py")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "doctor.md"
DOCTOR = [sys.executable, "-m", "fleetstore", "doctor"]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}


def run_doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DOCTOR, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env or clean_env(),
        stdin=subprocess.DEVNULL,
    )


def doctor_json(path: Path | str, *args: str) -> tuple[int, dict[str, Any]]:
    done = run_doctor(str(path), "--json", "--interval", "0.2", *args)
    assert done.stdout, f"no output (exit {done.returncode}): {done.stderr}"
    return done.returncode, json.loads(done.stdout)


def codes(report: dict[str, Any], severity: str | None = None) -> set[str]:
    return {f["code"] for f in report["findings"] if severity is None or f["severity"] == severity}


def finding(report: dict[str, Any], code: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [f for f in report["findings"] if f["code"] == code]
    assert found, f"no {code!r} finding in {[f['code'] for f in report['findings']]}"
    return found[0]


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under *directory* and the sha256 of its bytes; except the figures that
    live fleetstore processes publish (``<db>.procs/``), rewritten by them every second."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.parent.name.endswith(".procs")
    }


@pytest.fixture
def agents() -> Iterator[list[Proc]]:
    procs: list[Proc] = []
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()


def agent(procs: list[Proc], *args: str, ready: str) -> Proc:
    proc = Proc([sys.executable, AGENT, *args], " ".join(args[:1]))
    procs.append(proc)
    _, line = proc.wait_line(ready, timeout=60)
    assert line == f"{ready} pid={proc.pid}", line
    return proc


def make_foreign(path: Path, *, wal: bool, rows: int = 10) -> None:
    """A database of another program (a table ``t``), mode 0600, closed cleanly."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    conn = apsw.Connection(str(path))
    if wal:
        conn.execute("PRAGMA journal_mode=WAL").fetchall()
    conn.execute("CREATE TABLE t(v)")
    with conn:
        for _ in range(rows):
            conn.execute("INSERT INTO t(v) VALUES (randomblob(1000))")
    conn.close()


def make_store(path: Path, sessions: int = 3) -> None:
    with fleetstore.open(path) as store:
        for i in range(sessions):
            store.sessions.create(title=f"s{i}")


# -- the test ----------------------------------------------------------------------


@pytest.mark.slow
def test_doctor_names_outside_writer_and_long_reader_and_changes_no_byte(
    tmp_path: Path, spawn: Spawn, agents: list[Proc]
) -> None:
    db = tmp_path / "app.db"
    # A fleetstore process whose commits sit in the WAL (not checkpointed: it stays open).
    agent(agents, "store", str(db), "40", ready="stored")
    reader = agent(agents, "read", str(db), ready="reading")
    writer, _ = start_lock(spawn, str(db), float("inf"))
    before = snapshot(tmp_path)
    assert {"app.db", "app.db-wal", "app.db-shm"} <= set(before)

    rc, report = doctor_json(db)

    assert snapshot(tmp_path) == before  # db, -wal, -shm, gate: not a byte changed
    assert rc == doctor.EXIT_WARNINGS
    held = finding(report, "write-lock-held")
    assert held["severity"] == "warning"
    assert f"pid {writer.pid} " in held["message"] and "fleetstore lock" in held["message"]
    pinned = finding(report, "wal-reset-blocked")
    assert f"pid {reader.pid} " in pinned["message"]
    assert "WAL cannot be reset" in pinned["message"] and pinned["fix"]
    procs = {p["pid"]: p for p in report["processes"]}
    assert any("wal-write" in lk["names"] for lk in procs[writer.pid]["locks"])
    assert any(
        lk["mode"] == "READ" and any(n.startswith("wal-read-") for n in lk["names"])
        for lk in procs[reader.pid]["locks"]
    )
    assert {"database", "wal", "shm"} <= set(procs[reader.pid]["open"])
    assert report["wal"]["frames"] > 0
    assert report["database"]["quick_check"] == ["ok"]
    assert report["database"]["open_mode"] == "ro"
    assert report["fleetstore"]["sessions"] == 40
    # The same facts in the text a person reads.
    text = run_doctor(str(db), "--interval", "0.2")
    assert text.returncode == doctor.EXIT_WARNINGS
    assert f"pid {writer.pid}" in text.stdout and f"pid {reader.pid}" in text.stdout
    assert "wal-reset-blocked" in text.stdout and "fix:" in text.stdout
    assert snapshot(tmp_path) == before


def test_fleetstore_writer_inside_a_long_write_is_named_as_gate_holder(
    tmp_path: Path, agents: list[Proc]
) -> None:
    db = tmp_path / "store.db"
    make_store(db)
    writer = agent(agents, "gate", str(db), ready="writing")
    before = snapshot(tmp_path)

    rc, report = doctor_json(db)

    assert snapshot(tmp_path) == before
    assert f"pid {writer.pid} " in finding(report, "gate-held")["message"]
    assert f"pid {writer.pid} " in finding(report, "write-lock-held")["message"]
    assert "wal-reset-blocked" not in codes(report)  # a writer's own snapshot is not a reader
    assert rc == doctor.EXIT_WARNINGS


# -- read-only, whatever state the files are in ---------------------------------------------


def test_wal_left_by_a_killed_writer_is_read_without_changing_or_creating_files(
    tmp_path: Path, agents: list[Proc]
) -> None:
    db = tmp_path / "foreign.db"
    make_foreign(db, wal=True)
    writer = agent(agents, "write", str(db), "50", ready="wrote")
    writer.kill()  # SIGKILL: its frames stay in the -wal, its -shm stays behind
    before = snapshot(tmp_path)
    assert before["foreign.db-wal"] and before["foreign.db-shm"]

    rc, report = doctor_json(db)

    # A plain read-only open would have run recovery into the -shm here (measured).
    assert snapshot(tmp_path) == before
    assert report["database"]["quick_check"] == ["ok"]
    assert report["database"]["page_count"] > os.path.getsize(db) // 4096  # pages in the WAL
    assert report["fleetstore"] is None
    assert "foreign-database" in codes(report, "ok")
    assert rc == doctor.EXIT_HEALTHY, report["findings"]


def test_cleanly_closed_wal_database_gets_no_wal_or_shm(tmp_path: Path) -> None:
    db = tmp_path / "clean.db"
    make_foreign(db, wal=True)
    before = snapshot(tmp_path)
    assert set(before) == {"clean.db"}

    rc, report = doctor_json(db)

    # A read-only open of a WAL database creates -wal and -shm and leaves them (measured).
    assert snapshot(tmp_path) == before
    assert report["database"]["open_mode"] == "immutable"
    assert report["database"]["journal_mode"] == "wal"
    assert report["database"]["quick_check"] == ["ok"]
    assert rc == doctor.EXIT_HEALTHY, report["findings"]


def test_wal_with_frames_but_no_shm_is_not_opened(tmp_path: Path, agents: list[Proc]) -> None:
    db = tmp_path / "orphan.db"
    make_foreign(db, wal=True)
    writer = agent(agents, "write", str(db), "20", ready="wrote")
    writer.kill()
    os.unlink(str(db) + "-shm")
    before = snapshot(tmp_path)

    rc, report = doctor_json(db)

    assert snapshot(tmp_path) == before  # no -shm created
    assert report["database"]["not_read_reason"] == "wal-without-shm"
    assert report["database"]["quick_check"] is None
    assert finding(report, "wal-without-shm")["severity"] == "warning"
    assert rc == doctor.EXIT_WARNINGS


def test_rollback_journal_database_warns_wal_not_enabled(tmp_path: Path) -> None:
    db = tmp_path / "legacy.db"
    make_foreign(db, wal=False)
    before = snapshot(tmp_path)

    rc, report = doctor_json(db)

    assert snapshot(tmp_path) == before
    assert report["database"]["journal_mode"] == "rollback"
    assert report["wal"] is None
    assert finding(report, "wal-not-enabled")["severity"] == "warning"
    assert rc == doctor.EXIT_WARNINGS


@pytest.mark.slow
def test_exclusive_holder_of_a_rollback_database_is_named(
    tmp_path: Path, agents: list[Proc]
) -> None:
    db = tmp_path / "legacy.db"
    make_foreign(db, wal=False)
    holder = agent(agents, "rollback", str(db), "1", ready="exclusive")
    before = snapshot(tmp_path)

    rc, report = doctor_json(db)

    assert snapshot(tmp_path) == before
    busy = finding(report, "not-read-busy")
    assert f"pid {holder.pid} " in busy["message"]
    assert f"pid {holder.pid} " in finding(report, "write-lock-held")["message"]
    procs = {p["pid"]: p for p in report["processes"]}
    assert any("exclusive" in lk["names"] for lk in procs[holder.pid]["locks"])
    assert rc == doctor.EXIT_WARNINGS


def test_hot_journal_of_a_killed_writer_is_a_problem(tmp_path: Path, agents: list[Proc]) -> None:
    db = tmp_path / "legacy.db"
    make_foreign(db, wal=False)
    holder = agent(agents, "rollback", str(db), "300", ready="exclusive")
    holder.kill()
    before = snapshot(tmp_path)
    assert "legacy.db-journal" in before

    rc, report = doctor_json(db)

    assert snapshot(tmp_path) == before  # the journal is not rolled back by doctor
    assert finding(report, "hot-journal")["severity"] == "problem"
    assert "never delete" in finding(report, "hot-journal")["fix"]
    assert rc == doctor.EXIT_PROBLEMS


# -- findings ------------------------------------------------------------------------------


def test_world_readable_store_file_is_a_problem(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    make_store(db)
    os.chmod(db, 0o644)

    rc, report = doctor_json(db)

    bad = finding(report, "world-readable")
    assert bad["severity"] == "problem" and str(db) in bad["message"]
    assert bad["fix"].startswith("chmod")
    assert report["files"]["database"]["world_readable"] is True
    assert rc == doctor.EXIT_PROBLEMS


def test_a_store_file_its_group_can_read_is_a_problem_open_refuses(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    make_store(db)
    os.chmod(db, 0o640)
    rc, report = doctor_json(db)
    bad = finding(report, "group-access")
    assert bad["severity"] == "problem" and "UnsafeFile" in bad["message"]
    assert rc == doctor.EXIT_PROBLEMS
    with pytest.raises(fleetstore.errors.UnsafeFile):
        fleetstore.open(db)


def test_world_readable_foreign_file_is_a_warning(tmp_path: Path) -> None:
    db = tmp_path / "foreign.db"
    make_foreign(db, wal=True)
    os.chmod(db, 0o644)
    rc, report = doctor_json(db)
    assert finding(report, "world-readable")["severity"] == "warning"
    assert rc == doctor.EXIT_WARNINGS


def test_fleetstore_store_reports_schema_settings_and_stuck_effects(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    with fleetstore.open(db) as store:
        store.sessions.create(title="x")
        store.effects.enqueue("thread-1", "notify", {"n": 1})
        store.effects.enqueue("thread-2", "notify", {"n": 2})
        claims = store.effects.claim("worker-that-dies", lease=0.001)
        assert len(claims) == 1
    env = {**clean_env(), "FLEETSTORE_WRITE_BUDGET": "7"}

    done = run_doctor(str(db), "--json", "--interval", "0", env=env)
    report = json.loads(done.stdout)

    store_json = report["fleetstore"]
    assert store_json["schema_version"] == store_json["known_schema_version"] > 0
    assert store_json["settings"]["write_budget"] == 7.0
    assert store_json["outbox"]["by_state"]["running"] == 1
    assert store_json["outbox"]["stuck_running"] == 1
    assert finding(report, "effects-stuck")["severity"] == "warning"
    assert "schema" in codes(report, "ok")
    assert done.returncode == doctor.EXIT_WARNINGS


def test_effects_running_long_past_their_deadline_or_with_none_are_reported(
    tmp_path: Path,
) -> None:
    """The soak's hung handler: its worker renewed the lease, so no lease expired and
    doctor said nothing.  A running effect whose lease is alive but whose deadline
    (claim time + its handler timeout) is long past, or which has run longer than the
    default timeout with no deadline at all, is now reported."""
    db = tmp_path / "store.db"
    with fleetstore.open(db) as store:
        store.effects.enqueue("thread-1", "timed")
        store.effects.enqueue("thread-2", "untimed")
        claims = store.effects.claim("hung-worker", limit=2, lease=3600, timeouts={"timed": 60})
        assert len(claims) == 2
        # Two hours ago (the test cannot wait for it): the lease is renewed, still alive.
        with store.db.write() as tx:
            tx.execute(
                "UPDATE effects SET started_at = started_at - 7200, deadline = deadline - 7200"
            )

    rc, report = doctor_json(db)

    outbox = report["fleetstore"]["outbox"]
    assert outbox["stuck_running"] == 0
    assert (outbox["overdue_running"], outbox["long_running"]) == (1, 1)
    assert finding(report, "effects-overdue")["severity"] == "warning"
    assert "no handler timeout" in finding(report, "effects-long-running")["message"]
    assert "outbox" not in codes(report, "ok")
    assert rc == doctor.EXIT_WARNINGS


def test_invalid_fleetstore_environment_is_reported(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    make_store(db)
    env = {**clean_env(), "FLEETSTORE_SYNCHRONOUS": "sometimes"}
    done = run_doctor(str(db), "--json", "--interval", "0", env=env)
    report = json.loads(done.stdout)
    assert "sometimes" in finding(report, "settings-invalid")["message"]
    assert done.returncode == doctor.EXIT_WARNINGS


def test_spool_journal_of_a_dead_process_suggests_recover(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    make_store(db)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead_pid = int(gone.stdout)
    spool = tmp_path / "store.db.spool"
    spool.mkdir(mode=0o700)
    journal = spool / f"{dead_pid}-{os.urandom(6).hex()}.jsonl"
    ops = [Operation("create_session", {"id": new_id(), "title": "t"}, new_id()) for _ in range(3)]
    journal.write_bytes(b"".join(encode_line(op) for op in ops))
    journal.chmod(0o600)
    before = snapshot(tmp_path)

    rc, report = doctor_json(db)

    assert snapshot(tmp_path) == before  # doctor reports; recover replays
    stale = finding(report, "spool-stale")
    assert "3 acknowledged write(s)" in stale["message"]
    assert stale["fix"] == f"fleetstore recover --store {db}"
    [entry] = report["fleetstore"]["spool"]["journals"]
    assert entry["pid"] == dead_pid and entry["operations"] == 3 and entry["live"] is False
    assert rc == doctor.EXIT_WARNINGS


def test_freelist_share_high_suggests_reclaiming_space(tmp_path: Path) -> None:
    db = tmp_path / "bloated.db"
    make_foreign(db, wal=False, rows=3000)
    conn = apsw.Connection(str(db))
    conn.execute("DELETE FROM t WHERE rowid > 300")
    conn.close()

    rc, report = doctor_json(db)

    high = finding(report, "freelist-high")
    assert high["severity"] == "warning" and "maintain" in high["fix"]
    assert report["database"]["freelist_share"] > findings.FREELIST_SHARE
    assert rc == doctor.EXIT_WARNINGS


def test_wal_deleted_under_a_live_process_is_a_problem(tmp_path: Path, agents: list[Proc]) -> None:
    db = tmp_path / "foreign.db"
    make_foreign(db, wal=True)
    writer = agent(agents, "write", str(db), "5", ready="wrote")
    os.unlink(str(db) + "-wal")  # what an operator "cleaning up" does

    rc, report = doctor_json(db)

    bad = finding(report, "deleted-file-open")
    assert bad["severity"] == "problem" and f"pid {writer.pid} " in bad["message"]
    assert not (tmp_path / "foreign.db-wal").exists()  # doctor created none
    assert rc == doctor.EXIT_PROBLEMS


def test_process_running_another_sqlite_is_checked_for_the_wal_reset_bug(
    tmp_path: Path, agents: list[Proc]
) -> None:
    db = tmp_path / "foreign.db"
    make_foreign(db, wal=True)
    # The stdlib module links the system's SQLite (Debian 12: 3.40.1), in its own process.
    code = (
        "import sqlite3, sys, time\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN'); c.execute('SELECT count(*) FROM t').fetchall()\n"
        "print('reading', sqlite3.sqlite_version, flush=True); time.sleep(3600)\n"
    )
    proc = Proc([sys.executable, "-c", code, str(db)], "stdlib reader")
    agents.append(proc)
    _, line = proc.wait_line("reading", timeout=60)
    version = line.split()[1]

    rc, report = doctor_json(db)

    [me] = [p for p in report["processes"] if p["pid"] == proc.pid]
    assert [lib["version"] for lib in me["sqlite_libraries"]] == [version]
    flagged = "process-sqlite-wal-reset-bug" in codes(report, "warning")
    assert flagged == inspect.wal_reset_bug(version)
    assert f"pid {proc.pid} " in finding(report, "wal-reset-blocked")["message"]
    assert rc == doctor.EXIT_WARNINGS


# -- errors and output ---------------------------------------------------------------------


def test_missing_file_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "absent.db"
    done = run_doctor(str(missing))
    assert done.returncode == doctor.EXIT_USAGE == 2
    assert "no such file" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_file_that_is_not_sqlite_exits_2_unchanged(tmp_path: Path) -> None:
    notes = tmp_path / "notes.db"
    notes.write_text("these are not the pages you are looking for\n" * 10)
    before = snapshot(tmp_path)
    done = run_doctor(str(notes), "--json")
    assert done.returncode == doctor.EXIT_USAGE
    assert "not a SQLite database" in done.stderr
    assert done.stdout == ""
    assert snapshot(tmp_path) == before


def test_json_report_has_the_documented_shape(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    make_store(db)
    rc, report = doctor_json(db)
    assert report["report_version"] == doctor.REPORT_VERSION
    assert set(report) == {
        "report_version",
        "path",
        "verdict",
        "exit_code",
        "checked_at",
        "sqlite",
        "files",
        "database",
        "wal",
        "processes",
        "locks_interval",
        "board",
        "fleetstore",
        "findings",
    }
    assert report["path"] == str(db) and report["exit_code"] == rc
    assert report["sqlite"]["library_version"] == apsw.sqlite_lib_version()
    assert report["files"]["database"]["mode"] == "0600"
    for f in report["findings"]:
        assert set(f) == {"severity", "code", "message", "fix"}
        assert f["severity"] in ("ok", "warning", "problem")
    severities = [f["severity"] for f in report["findings"]]
    assert severities == sorted(severities, key=("problem", "warning", "ok").index)
    assert report["verdict"] == "ok" and rc == doctor.EXIT_HEALTHY


def test_doctor_refuses_a_database_its_own_process_has_open(tmp_path: Path) -> None:
    # A second descriptor's close would drop this process's SQLite locks on the file.
    db = tmp_path / "store.db"
    with fleetstore.open(db) as store:
        store.sessions.create(title="x")
        with pytest.raises(fleetstore.errors.PermanentError, match="this process has the file"):
            doctor.diagnose(db, interval=0)


@pytest.mark.parametrize(
    ("version", "affected"),
    [
        ("3.6.23", False),
        ("3.7.0", True),
        ("3.40.1", True),
        ("3.44.5", True),
        ("3.44.6", False),
        ("3.50.6", True),
        ("3.50.7", False),
        ("3.51.2", True),
        ("3.51.3", False),
        ("3.54.1", False),
        ("3.54.1.0", False),
        ("not a version", False),
    ],
)
def test_wal_reset_bug_versions(version: str, affected: bool) -> None:
    assert inspect.wal_reset_bug(version) is affected


def test_every_finding_code_is_documented_and_no_other() -> None:
    # Every module of the doctor package (findings.py writes them, today).
    source = "".join(
        p.read_text(encoding="utf-8") for p in sorted(Path(doctor.__file__).parent.glob("*.py"))
    )
    in_code = set(re.findall(r'Severity\.(?:OK|WARNING|PROBLEM)[^"\n]*,\s*"([a-z0-9-]+)"', source))
    assert {"wal-reset-blocked", "write-lock-held", "world-readable", "hot-journal"} <= in_code
    table = DOCS.read_text(encoding="utf-8").split("| Code | Severity", 1)[1].split("\n#", 1)[0]
    in_docs = set(re.findall(r"^\| `([a-z0-9-]+)`(?: / `([a-z0-9-]+)`)?", table, re.M))
    documented = {code for pair in in_docs for code in pair if code}
    assert documented == in_code
    # Each has its place in the order within a severity (issue 28), and only those.
    assert sorted(ORDER) == sorted(in_code) and len(set(ORDER)) == len(ORDER)


def test_blob_rows_without_their_file_are_a_problem(tmp_path: Path) -> None:
    """What a power cut under synchronous=NORMAL can leave: a committed row whose blob
    file the kernel had not written back (docs/design.md, "Blobs")."""
    db = tmp_path / "store.db"
    with fleetstore.open(db, blob_threshold=1024) as store:
        s = store.sessions.create(title="x")
        store.messages.append(s.id, "tool", [fleetstore.ToolResult("c1", "a" * 5000)])
        store.messages.append(s.id, "tool", [fleetstore.ToolResult("c2", "b" * 5000)])
    files = sorted(p for p in (tmp_path / "store.db.blobs").rglob("*") if p.is_file())
    assert len(files) == 2
    _, clean = doctor_json(db)
    assert "blob-files-missing" not in codes(clean)
    assert clean["fleetstore"]["blobs"] == {"checked": 2, "missing": 0, "missing_shas": []}
    files[0].unlink()
    code, report = doctor_json(db)
    found = finding(report, "blob-files-missing")
    assert found["severity"] == "problem" and files[0].name in found["message"]
    assert report["fleetstore"]["blobs"]["missing_shas"] == [files[0].name]
    assert code == doctor.EXIT_PROBLEMS


def _child(script: str, db: Path, name: str, agents: list[Proc]) -> Proc:
    """*script* in a process of its own that can import tests.fix_faults."""
    child = Proc([sys.executable, "-c", script, str(db)], name, env=importable_env())
    agents.append(child)
    return child


FAILING_CHECKPOINTS = r"""
import sys, time
from tests.fix_faults import install
import fleetstore
faults = install()
store = fleetstore.open(sys.argv[1], checkpoint_bytes=8192, publish_interval=0.05)
s = store.sessions.create()
faults.fail("xWrite", "db", error="full", times=0)  # no checkpoint copies a page back
deadline = time.monotonic() + 60
while store.metrics()["checkpoint_errors"] == 0 and time.monotonic() < deadline:
    store.messages.append(s.id, "user", "x" * 5000)
    time.sleep(0.01)
time.sleep(0.3)  # published
print("failing", store.metrics()["checkpoint_errors"], flush=True)
time.sleep(600)
"""


def test_checkpoints_failing_in_another_process_are_reported(
    tmp_path: Path, agents: list[Proc]
) -> None:
    """A process learns of its own failed checkpoints only in its figures (they are
    never raised: the commits stand); doctor reads them where it publishes them."""
    db = tmp_path / "store.db"
    make_store(db)
    writer = _child(FAILING_CHECKPOINTS, db, "failing checkpoints", agents)
    writer.wait_line("failing", timeout=60)

    rc, report = doctor_json(db)

    found = finding(report, "checkpoint-failing")
    assert f"pid {writer.pid}" in found["message"] and "StorageFull" in found["message"]
    assert found["severity"] == "warning" and rc >= doctor.EXIT_WARNINGS


def test_a_dead_process_s_figures_are_history_not_a_warning_and_maintain_removes_them(
    tmp_path: Path, agents: list[Proc]
) -> None:
    """Issue 23: after a full disk the soak's doctor kept 19 checkpoint-failing warnings
    naming processes that had died, read from their leftover <db>.procs/ files, and
    maintain never removed one (276 after the soak).  A dead process's figures are
    history (an OK finding); `fleetstore maintain` removes them, a live one's stays."""
    db = tmp_path / "store.db"
    make_store(db)
    writer = _child(FAILING_CHECKPOINTS, db, "failing checkpoints", agents)
    writer.wait_line("failing", timeout=60)
    live = _child(IDLE_PUBLISHER, db, "an idle store", agents)
    live.wait_line("published", timeout=60)
    folder = Path(f"{db}.procs")
    assert (folder / f"{writer.pid}.json").exists()
    os.kill(writer.pid, signal.SIGKILL)
    writer.popen.wait(timeout=30)
    # A file naming a live PID (this test's) with another start time: a reused PID.
    reused = folder / f"{os.getpid()}.json"
    reused.write_text(json.dumps({"pid": os.getpid(), "start_time": -5, "published_at": 1.0}))

    rc, report = doctor_json(db)

    assert "checkpoint-failing" not in codes(report)
    history = finding(report, "procs-gone")
    assert history["severity"] == "ok" and f"pid {writer.pid}" in history["message"]
    assert "2 process(es) that are gone" in history["message"]
    assert rc == doctor.EXIT_HEALTHY, report["findings"]
    shown = {p["pid"]: p["alive"] for p in report["fleetstore"]["processes"]}
    assert shown == {writer.pid: False, os.getpid(): False, live.pid: True}

    dry = maintain_json(db, "--dry-run")
    (step,) = [s for s in dry["steps"] if s["name"] == "procs"]
    assert step["status"] == "dry-run" and step["detail"] == {"gone": 2, "live": 1}
    assert (folder / f"{writer.pid}.json").exists() and reused.exists()

    done = maintain_json(db)
    (step,) = [s for s in done["steps"] if s["name"] == "procs"]
    assert step["status"] == "done" and step["detail"] == {"gone": 2, "live": 1}
    # The gone processes' counts stay in the store's totals (retired.json, and the lock
    # its writers take): fleetstore metrics' counters do not fall.
    # (The live process's temporary file may be there for the moment it publishes.)
    assert sorted(p.name for p in folder.iterdir() if p.name != f".{live.pid}.json.tmp") == [
        ".retired.lock",
        f"{live.pid}.json",
        "retired.json",
    ]
    _, after = doctor_json(db)
    assert "procs-gone" not in codes(after)


IDLE_PUBLISHER = r"""
import os, sys, time
import fleetstore
store = fleetstore.open(sys.argv[1], publish_interval=0.05)
store.sessions.list()  # starts the publisher
while not os.path.exists(f"{sys.argv[1]}.procs/{os.getpid()}.json"):
    time.sleep(0.01)
print("published", flush=True)
time.sleep(600)
"""


def maintain_json(db: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "fleetstore", "maintain", str(db), "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    report: dict[str, Any] = json.loads(done.stdout)
    return report


FAILING_AFTER_COMMIT = r"""
import sys, time
import fleetstore
store = fleetstore.open(sys.argv[1], publish_interval=0.05)
s = store.sessions.create()
db = store.db
value = db._checkpoint_step
calls = []
def step(self):
    calls.append(1)
    if len(calls) == 1:
        raise RuntimeError("injected after the commit")
    return value
# The WAL size count, inside COMMIT once the commit is in the WAL, reads this step.
type(db)._checkpoint_step = property(step)
store.messages.append(s.id, "user", "committed")  # returns: the commit stands
assert [m.parts[0].text for m in store.messages.list(s.id)] == ["committed"]
time.sleep(0.3)  # published
print("failed-after", store.metrics()["post_commit_errors"], flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_step_that_failed_after_a_commit_in_another_process_is_reported(
    tmp_path: Path, agents: list[Proc]
) -> None:
    """Work after a COMMIT that fails is never raised (the commit stands): it is counted
    in the process's figures, and doctor, another process, reports it from there."""
    db = tmp_path / "store.db"
    make_store(db)
    _, clean = doctor_json(db)
    assert "post-commit-errors" not in codes(clean)
    writer = _child(FAILING_AFTER_COMMIT, db, "failing after a commit", agents)
    _, line = writer.wait_line("failed-after", timeout=60)
    assert line.split()[1] == "1", line

    rc, report = doctor_json(db)

    found = finding(report, "post-commit-errors")
    assert f"pid {writer.pid}" in found["message"] and "1 step(s)" in found["message"]
    assert "injected after the commit" in found["message"]
    assert found["severity"] == "warning" and rc >= doctor.EXIT_WARNINGS
    assert "checkpoint-failing" not in codes(report)


@pytest.mark.parametrize("free, code", [(1024, "disk-full"), (100 * 2**20, "disk-low")])
def test_a_full_or_nearly_full_disk_is_reported(tmp_path: Path, free: int, code: str) -> None:
    db = tmp_path / "store.db"
    make_store(db)
    # Doctor in its own process, told the file system has *free* bytes left.
    run = (
        "import sys; from fleetstore.admin.doctor import findings; "
        f"findings.free_bytes = lambda path: {free}; "
        "from fleetstore.cli.main import main; sys.argv[0] = 'fleetstore'; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", run, "doctor", str(db), "--json", "--interval", "0.1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    report = json.loads(done.stdout)
    found = finding(report, code)
    assert "StorageFull" in found["message"]
    assert found["severity"] == ("problem" if code == "disk-full" else "warning")
    assert done.returncode == (
        doctor.EXIT_PROBLEMS if code == "disk-full" else doctor.EXIT_WARNINGS
    )


def test_a_spool_journal_whose_blob_is_missing_is_reported(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    make_store(db)
    spool = tmp_path / "store.db.spool"
    spool.mkdir(mode=0o700)
    missing = "ab" * 32
    part = {"enc": "str", "blob": {"sha256": missing, "size": 10, "stored_size": 10}}
    args = {"id": new_id(), "session_id": new_id(), "role": "tool", "parts": [part]}
    journal = spool / f"{4_000_000}-{os.urandom(6).hex()}.jsonl"
    journal.write_bytes(encode_line(Operation("append_message", args, new_id())))
    journal.chmod(0o600)

    rc, report = doctor_json(db)

    found = finding(report, "spool-blob-missing")
    assert missing in found["message"] and found["severity"] == "problem"
    [entry] = report["fleetstore"]["spool"]["journals"]
    assert entry["missing_blobs"] == [missing]
    assert rc == doctor.EXIT_PROBLEMS
