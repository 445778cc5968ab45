"""No command that only reads writes to any file it was pointed at, with real processes.

Every command of the CLI's parser is classified here as reading or writing (a new
command fails ``test_every_command_is_classified`` until it is).  Each reading command
runs against a fleetstore store (closed cleanly, and left by a ``kill -9`` with its
-wal and -shm), another program's SQLite file in rollback-journal and in WAL mode, a
file that is not a database, and a path that does not exist.  Every file of the
directory (sidecars included: -wal, -shm, .gate, .blobs/, .procs/, .spool/) is listed
and hashed before and after: nothing may be created, changed or removed.  A command
that writes must still refuse a file that is not a fleetstore store.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click
import pytest

import fleetstore
from fleetstore import ToolResult
from fleetstore.cli.main import main

Argv = Callable[[str, Path], list[str]]

#: Every command that only reads, and how to run it on TARGET (OUT: a directory
#: elsewhere for what the command is asked to write, such as export's file).
READING: dict[str, Argv] = {
    "doctor": lambda t, out: ["doctor", t, "--json", "--interval", "0"],
    "effects list": lambda t, out: ["effects", "list", "--store", t],
    "effects show": lambda t, out: ["effects", "show", "no-such-effect", "--store", t],
    "export": lambda t, out: ["export", "--store", t, "-o", str(out / "e.zst")],
    "metrics": lambda t, out: ["metrics", "--store", t],
    "scan": lambda t, out: ["scan", t, "--json"],
    "sessions list": lambda t, out: ["sessions", "list", "--store", t],
    "sessions show": lambda t, out: ["sessions", "show", "no-such-session", "--store", t],
    "search": lambda t, out: ["search", "anything", "--store", t],
    "stats": lambda t, out: ["stats", "--store", t],
    "top": lambda t, out: ["top", t, "--count", "1", "--json", "--interval", "0.1"],
}

#: Every command that writes (to the store, or creates one), and how to run it so
#: that it would write to TARGET: on a file that is not a store it must refuse.
WRITING: dict[str, Argv | None] = {
    "effects cancel": lambda t, out: ["effects", "cancel", "x", "--store", t],
    "effects enqueue": lambda t, out: ["effects", "enqueue", "th", "k", "{}", "--store", t],
    "effects retry": lambda t, out: ["effects", "retry", "x", "--store", t],
    "effects sweep": lambda t, out: ["effects", "sweep", "--store", t],
    "index": lambda t, out: ["index", "--store", t],
    "import": lambda t, out: ["import", str(out / "empty.zst"), "--store", t],
    "sessions rm": lambda t, out: ["sessions", "rm", "x", "--yes", "--store", t],
    "worker": None,  # runs handlers until stopped; opens through the same check (util.open_existing)
    # These take a write lock, replay journals, move or copy stores: writers by nature.
    "lock": None,
    "maintain": None,
    "recover": None,
    "merge": lambda t, out: ["merge", t, str(out / "dest.db")],
    # Takes the blob collection lock in the store's blob directory (<db>.blobs/.collecting).
    "backup": lambda t, out: ["backup", str(out / "bk"), "--store", t],
    "restore": None,  # makes a new store from a backup, never writes over one
    "migrate": None,
    "reshard": None,
    "sessions archive-tree": None,
    "sessions restore-tree": None,
    "stress": None,
    # Rewrite rows holding secrets / every file under a new key: a store's own tools.
    "redact": None,
    "rekey": None,
}


def leaf_commands() -> list[str]:
    found: list[str] = []

    def walk(prefix: str, cmd: click.Command) -> None:
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)  # the groups load their commands lazily
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                walk(f"{prefix} {name}".strip(), sub)
        else:
            found.append(prefix)

    walk("", main)
    return sorted(found)


def test_every_command_is_classified() -> None:
    leaves = set(leaf_commands())
    assert not set(READING) & set(WRITING)
    assert leaves == set(READING) | set(WRITING), (
        "classify each command as READING or WRITING in this file: "
        f"unclassified {sorted(leaves - set(READING) - set(WRITING))}, "
        f"gone {sorted((set(READING) | set(WRITING)) - leaves)}"
    )


# --- the targets --------------------------------------------------------------------------------

FOREIGN = """
import sys, apsw
conn = apsw.Connection(sys.argv[1])
if sys.argv[2] == "wal":
    conn.execute("PRAGMA journal_mode=WAL")
conn.execute("CREATE TABLE session(id TEXT PRIMARY KEY, title TEXT, data BLOB)")
conn.execute("CREATE TABLE message(id TEXT PRIMARY KEY, session_id TEXT, body TEXT)")
for i in range(50):
    conn.execute("INSERT INTO session VALUES (?, ?, randomblob(300))", (f"s{i}", f"t{i}"))
    conn.execute("INSERT INTO message VALUES (?, ?, ?)", (f"m{i}", f"s{i}", "hi" * 100))
conn.close()
"""

KILLED = """
import os, sys, fleetstore
store = fleetstore.open(sys.argv[1], blob_threshold=1024, checkpoint_bytes=1 << 30)
s = store.sessions.create(title="left behind")
store.messages.append(s.id, "tool", [fleetstore.ToolResult("c", "y" * 5000)])
store.state.put(s.id, "k", {"v": 1})
print("written", flush=True)
sys.stdin.readline()
"""


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}


def fleetstore_store(directory: Path) -> str:
    path = directory / "s.db"
    with fleetstore.open(path, blob_threshold=1024) as store:
        s = store.sessions.create(title="secret")
        store.messages.append(s.id, "tool", [ToolResult("c", "token=" + "x" * 4000)])
        store.state.put(s.id, "cursor", {"seq": 1})
        store.effects.enqueue("th", "notify", {"to": "x"})
    return str(path)


def sharded_store(directory: Path) -> str:
    url = f"sqlite+sharded://{directory / 'fleet'}"
    with fleetstore.open(url, blob_threshold=1024) as store:
        for i in range(3):
            s = store.sessions.create(title=f"tree {i}")
            sub = store.sessions.create(parent_id=s.id, title="sub")
            store.messages.append(sub.id, "tool", [ToolResult("c", "z" * 5000)])
        store.effects.enqueue("th", "notify", {"to": "x"})
    return url


def killed_store(directory: Path) -> str:
    path = directory / "s.db"
    fleetstore_store(directory)
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "written"
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=10)
    wal = Path(str(path) + "-wal")
    assert wal.stat().st_size > 0 and Path(str(path) + "-shm").exists()
    return str(path)


def foreign_db(directory: Path, mode: str) -> str:
    path = directory / "opencode.db"
    done = subprocess.run(
        [sys.executable, "-c", FOREIGN, str(path), mode], capture_output=True, env=clean_env()
    )
    assert done.returncode == 0, done.stderr
    return str(path)


def not_a_database(directory: Path) -> str:
    path = directory / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 40)
    return str(path)


TARGETS: dict[str, Callable[[Path], str]] = {
    "store": fleetstore_store,
    "killed-store": killed_store,
    "sharded-store": sharded_store,
    "foreign-rollback": lambda d: foreign_db(d, "delete"),
    "foreign-wal": lambda d: foreign_db(d, "wal"),
    "not-a-database": not_a_database,
    "missing": lambda d: str(d / "missing.db"),
}


def snapshot(directory: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under *directory*: kind, mode, size, mtime and a hash of its bytes."""
    out: dict[str, tuple[object, ...]] = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            p = Path(root) / name
            st = p.lstat()
            rel = str(p.relative_to(directory))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir", st.st_mode)
            else:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
                out[rel] = ("file", st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetstore", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("command", list(READING))
def test_a_reading_command_writes_nothing(tmp_path: Path, command: str, target: str) -> None:
    here = tmp_path / "here"
    here.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    path = TARGETS[target](here)
    before = snapshot(here)
    done = run(READING[command](path, out))
    after = snapshot(here)
    assert after == before, (
        f"{command} on {target} changed {sorted(set(before) ^ set(after))} or their "
        f"contents: {sorted(k for k in before if k in after and before[k] != after[k])}; "
        f"stderr {done.stderr[-500:]}"
    )
    if command == "doctor":
        return  # doctor reports on any file; its exit code grades what it found
    if command == "scan":  # reads any file by design; none of these holds a secret
        assert done.returncode == (2 if target == "missing" else 0), done.stdout + done.stderr
        return
    if target in ("store", "killed-store", "sharded-store"):
        expected = 2 if command.endswith("show") else 0
        assert done.returncode == expected, done.stderr
        if command == "export":
            assert (out / "e.zst").stat().st_size > 0
    elif target == "missing":
        assert done.returncode == 2, done.stderr
        assert not os.path.exists(path)
    else:
        assert done.returncode == 1, done.stderr
        assert "not a fleetstore store" in done.stderr, done.stderr
        assert list(out.iterdir()) == []


@pytest.mark.parametrize("target", ["foreign-rollback", "foreign-wal", "not-a-database"])
@pytest.mark.parametrize("command", [c for c, argv in WRITING.items() if argv is not None])
def test_a_writing_command_refuses_a_file_that_is_not_a_store(
    tmp_path: Path, command: str, target: str
) -> None:
    here = tmp_path / "here"
    here.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    empty = out / "empty.zst"
    with fleetstore.open(tmp_path / "other.db") as other:
        from fleetstore.transfer.export import export_store

        export_store(other, empty)
    path = TARGETS[target](here)
    before = snapshot(here)
    out_before = snapshot(out)
    done = run(WRITING[command](path, out))  # type: ignore[misc]
    assert snapshot(here) == before, done.stderr
    assert snapshot(out) == out_before, done.stderr
    assert done.returncode == 1, done.stderr
    assert "not a fleetstore store" in done.stderr, done.stderr


def test_import_into_another_programs_file_only_when_asked(tmp_path: Path) -> None:
    src = tmp_path / "src.db"
    with fleetstore.open(src) as store:
        sid = store.sessions.create(title="moved").id
    exported = tmp_path / "e.zst"
    assert run(["export", "--store", str(src), "-o", str(exported)]).returncode == 0
    here = tmp_path / "here"
    here.mkdir()
    path = foreign_db(here, "delete")
    before = snapshot(here)
    refused = run(["import", str(exported), "--store", path])
    assert refused.returncode == 1 and "--add-to-foreign-db" in refused.stderr, refused.stderr
    assert snapshot(here) == before
    # Made under umask 022, the other program's file is 0644: fleetstore writes no
    # session into a file others can read (issue 23), even when asked to add to it.
    readable = run(["import", str(exported), "--store", path, "--add-to-foreign-db"])
    assert readable.returncode == 1 and "chmod 600" in readable.stderr, readable.stderr
    assert snapshot(here) == before
    os.chmod(path, 0o600)
    done = run(["import", str(exported), "--store", path, "--add-to-foreign-db"])
    assert done.returncode == 0, done.stderr
    with fleetstore.open(path) as store:
        assert store.sessions.get(sid).title == "moved"
