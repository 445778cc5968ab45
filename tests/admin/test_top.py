"""`fleetstore top` and the figures processes publish for it: the publisher's files, the
frame arithmetic (rates and p99 over the last interval, histograms merged across
processes), and the live screen driven in a real pseudo-terminal with real writer
processes."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest

import fleetstore
from fleetstore.admin import top
from fleetstore.core import liveness
from fleetstore.core.metrics import Histogram
from fleetstore.files import processes
from fleetstore.store.procstats import (
    Published,
    procs_dir,
    read_published,
    remove_gone,
)

WRITER = """
import sys, time, fleetstore
store = fleetstore.open(sys.argv[1], publish_interval=0.2)
s = store.sessions.create("top")
print("ready", flush=True)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    store.messages.append(s.id, "user", "x")
    time.sleep(0.005)
store.close()
"""


def wait_for(what: str, check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_writer(db: str, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, db, str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.stdout.close()
    return proc


# -- the publisher ---------------------------------------------------------------------------


def test_a_store_publishes_its_figures_and_removes_them_on_close(tmp_path: Path) -> None:
    db = str(tmp_path / "p.db")
    store = fleetstore.open(db, publish_interval=0.05)
    s = store.sessions.create()
    for _ in range(5):
        store.messages.append(s.id, "user", "x")
    own = procs_dir(db) / f"{os.getpid()}.json"
    wait_for("a published file", own.exists)
    wait_for(
        "the writes in it",
        lambda: json.loads(own.read_text())["metrics"]["operations"].get("append_message") == 5,
    )
    (mine,) = read_published(db)
    assert mine.alive and mine.pid == os.getpid() and mine.age < 30
    assert mine.histogram("lock_wait").export()["n"] == mine.record["metrics"]["writes"]
    assert (own.stat().st_mode & 0o777) == 0o600
    store.close()
    assert not own.exists()


def test_publish_interval_zero_publishes_nothing_and_bad_values_are_refused(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "p.db")
    with fleetstore.open(db, publish_interval=0) as store:
        store.sessions.create()
        time.sleep(0.1)
        assert read_published(db) == []
    for bad in (-1, float("nan"), "often", True):
        with pytest.raises(fleetstore.ConfigError):
            fleetstore.open(db, publish_interval=bad)


def test_a_dead_or_reused_pid_is_not_alive(tmp_path: Path) -> None:
    db = str(tmp_path / "p.db")
    folder = procs_dir(db)
    folder.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    (folder / f"{dead_pid}.json").write_text(
        json.dumps({"pid": dead_pid, "start_time": 1, "published_at": time.time()})
    )
    # This process's PID with another start time: the PID was reused.
    (folder / f"{os.getpid()}.json").write_text(
        json.dumps({"pid": os.getpid(), "start_time": -5, "published_at": time.time()})
    )
    (folder / "junk.json").write_text("{not json")
    found = read_published(db)
    assert {p.pid for p in found} == {dead_pid, os.getpid()}
    assert not any(p.alive for p in found)
    assert liveness.start_time(os.getpid()) is not None


def test_remove_gone_keeps_live_processes_files_and_fresh_temporary_files(tmp_path: Path) -> None:
    """``fleetstore maintain``'s procs step (tests/admin/test_doctor.py runs it whole):
    the files of dead and reused PIDs go, and a temporary file left by a publisher
    killed between writing and renaming it: at once when its process is gone, else
    once it is a minute old."""
    db = str(tmp_path / "p.db")
    folder = procs_dir(db)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with fleetstore.open(db, publish_interval=0.05) as store:
            store.sessions.create()
            own = folder / f"{os.getpid()}.json"
            wait_for("a published file", own.exists)
            other = folder / "4000001.json"
            other.write_text(json.dumps({"pid": 4_000_001, "start_time": 7, "published_at": 1.0}))
            old_tmp = folder / ".1.json.tmp"  # pid 1 lives, but no rename takes a minute
            dead_tmp = folder / ".4000003.json.tmp"  # a fresh one, its process gone
            new_tmp = folder / f".{sleeper.pid}.json.tmp"  # a live process's, publishing
            for tmp in (old_tmp, dead_tmp, new_tmp):
                tmp.write_text("{")
            age = time.time() - 120
            os.utime(old_tmp, (age, age))

            # This process's own file is kept, and not counted: whether the maintain run's
            # publisher had written it by the procs step was a race (live 1 or 2).
            assert remove_gone(db, dry_run=True)[1] == 0
            assert other.exists() and old_tmp.exists() and dead_tmp.exists()
            gone, live = remove_gone(db)
            assert [p.pid for p in gone] == [4_000_001] and live == 0
            assert not other.exists() and not old_tmp.exists() and not dead_tmp.exists()
            assert own.exists() and new_tmp.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


# -- frames ----------------------------------------------------------------------------------


def published(
    pid: int, writes: int, waits: list[float], alive: bool = True, **group: int
) -> Published:
    hist = Histogram()
    for w in waits:
        hist.add(w)
    record = {
        "metrics": {"writes": writes, "begin_busy_retries": 2, "spool_pending": 1, **group},
        "histograms": {"lock_wait": hist.export()},
    }
    return Published(pid, f"agent {pid}", alive, 0.1, record)


def test_frame_rates_and_p99_cover_the_last_interval_merged_across_processes() -> None:
    old = top.Sample(
        100.0,
        (published(1, 100, [0.001] * 100), published(2, 50, [0.001] * 50)),
        {"db": 1, "wal": 2, "shm": 3},
        None,
    )
    # In the next 2 s: process 1 made 100 fast writes, process 2 made 10 slow ones.
    new = top.Sample(
        102.0,
        (
            published(1, 200, [0.001] * 200),
            published(2, 60, [0.001] * 50 + [0.5] * 10),
            published(3, 7, [0.2], alive=False),
        ),
        {"db": 1, "wal": 2, "shm": 3},
        {"pending": 4},
    )
    f = top.frame("x.db", new, old)
    rates = {r.pid: r.writes_per_s for r in f.rows}
    assert rates == {1: 50.0, 2: 5.0}
    assert f.writes_per_s == 55.0 and f.stale == 1
    p99 = {r.pid: r.wait_p99 for r in f.rows}
    assert p99[1] is not None and p99[1] < 0.002
    assert p99[2] is not None and 0.45 < p99[2] <= 0.5
    # Lifetime figures would hide process 2's slow interval (10 slow of 60); the merged
    # window of 110 writes has 10 slow ones: its p99 is slow.
    assert f.wait_p99 is not None and f.wait_p99 > 0.45
    screen = "\n".join(top.render(f, 120))
    assert "pending 4" in screen and "agent 1" in screen and "+1 gone" in screen
    first = top.frame("x.db", old, None)
    assert first.writes_per_s is None and "rates appear" in "\n".join(top.render(first, 120))


def test_top_json_frame_from_the_cli(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    # Writing until stopped: on a loaded machine top may start seconds later.
    writer = start_writer(db, 300)
    try:
        wait_for("the writer's figures", lambda: any(p.alive for p in read_published(db)))
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "fleetstore",
                "top",
                db,
                "--count",
                "1",
                "--json",
                "--interval",
                "0.5",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        writer.terminate()
        writer.wait(30)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    (proc,) = data["processes"]
    assert proc["pid"] == writer.pid and proc["writes_per_s"] > 0
    assert data["outbox"]["pending"] == 0 and data["files"]["db"] > 0
    missing = subprocess.run(
        [sys.executable, "-m", "fleetstore", "top", str(tmp_path / "none.db"), "--count", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and not (tmp_path / "none.db").exists()


READER = """
import sys, time, fleetstore
store = fleetstore.open(sys.argv[1], publish_interval=0)
def hold(tx):
    tx.execute("SELECT count(*) FROM messages")
    print("reading", flush=True)
    time.sleep(600)
store.read(hold)
"""


def test_top_names_a_reader_that_pins_the_wal(tmp_path: Path) -> None:
    """Issue 23: a 60 s reader let the WAL reach 2.3 GB and top did not name it (doctor
    did).  A real process holding a read transaction while another writes: every frame
    names it, with how long it has held it (at least) and how much the WAL grew."""
    db = str(tmp_path / "t.db")
    writer = start_writer(db, 300)
    reader = subprocess.Popen([sys.executable, "-c", READER, db], stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "reading"
        args = [sys.executable, "-m", "fleetstore", "top", db, "--interval", "0.5"]
        done = subprocess.run(
            [*args, "--count", "3", "--json"], capture_output=True, text=True, timeout=60
        )
        text = subprocess.run([*args, "--count", "1"], capture_output=True, text=True, timeout=60)
    finally:
        for proc in (reader, writer):
            proc.terminate()
            proc.wait(30)
        if reader.stdout is not None:
            reader.stdout.close()
    assert done.returncode == 0 and text.returncode == 0, done.stderr + text.stderr
    frames = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(frames) == 3
    seen = [{r["pid"]: r for r in f["wal_readers"]} for f in frames]
    assert all(reader.pid in s and writer.pid not in s for s in seen), seen
    mine = [s[reader.pid] for s in seen]
    assert [m["held_s"] for m in mine] == sorted({m["held_s"] for m in mine})  # rises
    assert mine[0]["held_s"] > 0 and len({m["wal_bytes_then"] for m in mine}) == 1
    assert mine[-1]["wal_grew"] > 0 and mine[-1]["wal_bytes"] == frames[-1]["files"]["wal"]
    assert "import sys, time, fleetstore store = " in mine[0]["command"]  # one line
    line = next(x for x in text.stdout.splitlines() if x.startswith("reader "))
    assert f"pid {reader.pid} " in line and "has held a read transaction" in line


def test_a_short_read_or_a_writer_is_not_a_reader_pinning_the_wal() -> None:
    """Seen in one sample only, a reader is not shown (a short read looks the same);
    a process holding the write lock reads as part of its write, and is left out."""
    locks = [
        processes.Lock(10, "shm", "POSIX", "READ", 123, 123, ("wal-read-2",)),
        processes.Lock(11, "shm", "POSIX", "READ", 121, 121, ("wal-read-0",)),
        processes.Lock(11, "shm", "POSIX", "WRITE", 120, 120, ("wal-write",)),
        processes.Lock(12, "shm", "POSIX", "READ", 122, 123, ("wal-read-1", "wal-read-2")),
    ]
    assert processes.wal_readers(locks) == {10: 2, 12: 1}
    old = top.Sample(1.0, (), {"db": 1, "wal": 100, "shm": 1}, None)
    new = top.Sample(
        2.0,
        (),
        {"db": 1, "wal": 300, "shm": 1},
        None,
        readers=(top.Reader(10, 2, 1.0, 100), top.Reader(12, 1, 2.0, 300)),
    )
    f = top.frame("x.db", new, old)
    assert [(r["pid"], r["held_s"], r["wal_grew"]) for r in f.readers] == [(10, 1.0, 200)]


# -- the live screen, in a pseudo-terminal -----------------------------------------------------


def read_some(fd: int, buf: bytearray, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                buf += os.read(fd, 65536)
            except OSError:
                return


def read_until(fd: int, needle: bytes, timeout: float, buf: bytearray) -> None:
    deadline = time.monotonic() + timeout
    while needle not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"screen never showed {needle!r}; last: {bytes(buf[-2000:])!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                raise AssertionError(f"top exited; output: {bytes(buf[-2000:])!r}")
            buf += chunk


@pytest.mark.slow
def test_top_renders_live_in_a_pseudo_terminal_and_q_quits(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    writers = [start_writer(db, 20), start_writer(db, 20)]
    with fleetstore.open(db) as store:
        store.effects.enqueue("t", "k")
        store.effects.enqueue("t", "k")
    pid, fd = pty.fork()
    if pid == 0:  # the child: top on a 160x40 pseudo-terminal
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        # pytest exports COLUMNS/LINES, which would override the terminal's size.
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        argv = [sys.executable, "-m", "fleetstore", "top", "--store", db, "--interval", "0.3"]
        os.execve(sys.executable, argv, env)
    try:
        buf = bytearray()
        read_until(fd, b"(q quits)", 30, buf)
        # Wait for a frame with rates for both writers.
        deadline = time.monotonic() + 30
        while True:
            # rich's live screen: each frame is drawn from the top-left corner (\x1b[H),
            # its header in bold; the escapes are left out to read it.
            frames = [f for f in bytes(buf).split(b"\x1b[H") if b"(q quits)" in f]
            screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", frames[-1].decode("utf-8", "replace"))
            rows = [ln for ln in screen.splitlines() if ln.split() and ln.split()[0].isdigit()]
            if (
                all(str(w.pid) in screen for w in writers)
                and rows
                and all(ln.split()[1] != "-" for ln in rows)
            ):
                break
            assert time.monotonic() < deadline, screen
            del buf[:-20000]
            read_some(fd, buf, 0.4)
        assert "COMMITS/S" in screen and "BATCH" in screen and "WAIT P99" in screen
        assert "outbox     pending 2" in screen
        assert f"fleetstore top  {db}" in screen
        for w in writers:
            line = next(ln for ln in screen.splitlines() if ln.split()[:1] == [str(w.pid)])
            assert float(line.split()[1].replace(",", "")) > 0, line
        os.write(fd, b"q")
        deadline = time.monotonic() + 10
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() < deadline, "q did not quit top"
            with_data, _, _ = select.select([fd], [], [], 0.1)
            if with_data:
                try:
                    os.read(fd, 65536)
                except OSError:
                    pass
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)
        for w in writers:
            w.kill()
            w.wait()


def test_frame_shows_operations_commits_and_batch_sizes_of_group_commit() -> None:
    """Process 1 committed 10 transactions carrying 40 operations, 30 of them process
    2's; process 2 committed nothing itself: its 30 were handed over."""
    old = top.Sample(
        10.0,
        (published(1, 5, [0.001] * 5, batched_items=5), published(2, 3, [0.001] * 3)),
        {"db": 1, "wal": 2, "shm": 3},
        None,
    )
    new = top.Sample(
        12.0,
        (
            published(1, 15, [0.001] * 15, batched_items=45, served=30, batch_max=9),
            published(2, 3, [0.001] * 3, handed_over=30),
        ),
        {"db": 1, "wal": 2, "shm": 3},
        None,
    )
    f = top.frame("x.db", new, old)
    rows = {r.pid: r for r in f.rows}
    assert rows[1].writes_per_s == 5.0 and rows[1].ops_per_s == 5.0
    assert rows[1].batch_mean == 4.0 and rows[1].batch_max == 9
    assert rows[2].writes_per_s == 0.0 and rows[2].ops_per_s == 15.0
    assert rows[2].batch_mean is None
    assert f.writes_per_s == 5.0 and f.ops_per_s == 20.0 and f.batch_mean == 4.0
    assert f.batch_max == 9
    screen = "\n".join(top.render(f, 160))
    assert "operations/s 20" in screen and "batch 4.0 (max 9)" in screen
    doc = f.to_json()
    assert doc["commits_per_s"] == 5.0 and doc["operations_per_s"] == 20.0
    assert doc["processes"][1]["operations_per_s"] == 15.0


def test_top_shows_the_search_indexers_figures(tmp_path: Path) -> None:
    """Issue 30: the index's lag is visible in top (its JSON's ``search``, its text's
    ``search`` line), from the figures the writers' indexer threads publish."""
    db = str(tmp_path / "t.db")
    writer = start_writer(db, 300)
    try:
        wait_for(
            "the writer's indexer's figures",
            lambda: any(
                p.alive and p.record["metrics"].get("search_sections", 0) > 0
                for p in read_published(db)
            ),
        )
        args = [sys.executable, "-m", "fleetstore", "top", db, "--interval", "0.5"]
        done = subprocess.run(
            [*args, "--count", "2", "--json"], capture_output=True, text=True, timeout=60
        )
        text = subprocess.run([*args, "--count", "1"], capture_output=True, text=True, timeout=60)
    finally:
        writer.terminate()
        writer.wait(30)
    assert done.returncode == 0 and text.returncode == 0, done.stderr + text.stderr
    last = [json.loads(line) for line in done.stdout.splitlines()][-1]
    assert set(last["search"]) == {"queued", "lag_s", "sections_per_s"}
    assert last["search"]["queued"] >= 0 and last["search"]["lag_s"] >= 0
    line = next(x for x in text.stdout.splitlines() if x.startswith("search "))
    assert "queued" in line and "lag" in line and "sections/s" in line
