"""The sharded layout (issue 9) under ``kill -9`` and concurrent first use, checked
file by file.

* A process killed between the catalog's record of a catalog+shard write and the
  shard's part, or between the shard's part and the catalog's, leaves an intent
  (fleetstore.store.sharded.router's protocol); the next ``open`` finishes it: the session is in
  its shard and in the catalog's index, the effects enqueued exactly once, iff the
  message they came with exists.  Intents left by several dead processes are
  finished once each when several live processes recover at the same time.
* Processes starting together on a brand-new directory, some growing one new tree
  with subagents, others a tree each: no error, each file migrated once.

``check_consistent(dir)`` reads the files themselves (apsw, no fleetstore in the
way) and compares the catalog's index with every shard.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
import pytest

import fleetstore
from fleetstore.core.crash import CRASH_ENV
from fleetstore.core.targets import CATALOG, SHARDS
from fleetstore.store.sharded.shards import shard_key
from tests.fix_procs import Barrier, Proc

#: The columns the catalog copies from a shard's sessions row.  updated_at is left
#: out: the catalog's copy of it may lag (sharding.py, "_SYNC_INTERVAL").
_COLUMNS = (
    "id, parent_id, root_id, forked_from, fork_seq, project, title, status, metadata, "
    "created_at, archived_at, version, job"
)

#: A child process: opens the store, says "ready", waits at the barrier (if any), does
#: one write (which the crash hook may interrupt with SIGKILL), says "done".  Job
#: "recover" opens the store at the barrier and writes nothing.
_CHILD = r"""
import fcntl, json, os, sys
import fleetstore
from fleetstore import NewEffect

url, barrier, job = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
# A recovering process opens at the barrier (open() finishes dead processes' intents),
# the others before it.
store = None if job["do"] == "recover" else fleetstore.open(url)
print("ready", flush=True)
if barrier:
    fd = os.open(barrier, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.close(fd)
store = store or fleetstore.open(url)
effects = [NewEffect(job["thread"], "notify", {"i": i}) for i in range(job.get("effects", 0))]
if job["do"] == "create":
    store.sessions.create(job["title"], id=job["sid"], parent_id=job.get("parent"), effects=effects)
elif job["do"] == "append":
    store.messages.append(job["sid"], "user", job["text"], id=job["mid"], effects=effects)
elif job["do"] == "fork":
    store.sessions.fork(job["source"], id=job["sid"], title=job["title"])
elif job["do"] == "delete":
    store.sessions.delete(job["sid"])
print("done", flush=True)
store.close()
"""


def _connect(path: Path) -> apsw.Connection:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READWRITE)
    conn.execute("PRAGMA query_only = 1")
    return conn


def _rows(conn: apsw.Connection, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(sql, params)]


@dataclass
class Layout:
    """What a sharded store's files hold."""

    #: The catalog's sessions rows (index copies and the catalog's own), by id.
    catalog: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    #: shard_sessions: session id -> shard key.
    index: dict[str, str] = field(default_factory=dict)
    #: shard_intents: (op_id, shard, owner).
    intents: list[tuple[Any, ...]] = field(default_factory=list)
    #: Each shard file's sessions rows, by key, then id.
    shards: dict[str, dict[str, tuple[Any, ...]]] = field(default_factory=dict)
    #: Message ids per shard key (None: the catalog).
    messages: dict[str | None, set[str]] = field(default_factory=dict)
    #: The catalog's effects: thread_key -> count.
    effects: dict[str, int] = field(default_factory=dict)
    #: Migration versions recorded in each file (None: the catalog).
    migrations: dict[str | None, list[int]] = field(default_factory=dict)
    #: integrity_check of each file, when not "ok".
    damaged: dict[str | None, list[str]] = field(default_factory=dict)

    def home(self, sid: str) -> str | None:
        """The key of the one shard whose file holds *sid* (None: none does)."""
        found = [key for key, rows in self.shards.items() if sid in rows]
        assert len(found) <= 1, f"session {sid} in several shards: {found}"
        return found[0] if found else None


def read_layout(root: Path) -> Layout:
    out = Layout()
    files: list[tuple[str | None, Path]] = [(None, root / CATALOG)]
    for path in sorted((root / SHARDS).glob("*/*.db")):
        name = path.name[:-3]
        assert path.parent.name == name[-2:], f"{path}: not where the key {name!r} puts it"
        files.append((name, path))
    for key, path in files:
        conn = _connect(path)
        try:
            check = [str(r[0]) for r in _rows(conn, "PRAGMA integrity_check")]
            if check != ["ok"]:
                out.damaged[key] = check
            out.migrations[key] = [
                int(r[0]) for r in _rows(conn, "SELECT version FROM fleetstore_migrations")
            ]
            rows = {str(r[0]): r for r in _rows(conn, f"SELECT {_COLUMNS} FROM sessions")}
            out.messages[key] = {str(r[0]) for r in _rows(conn, "SELECT id FROM messages")}
            if key is not None:
                out.shards[key] = rows
                continue
            out.catalog = rows
            out.index = dict(_rows(conn, "SELECT session_id, shard FROM shard_sessions"))
            out.intents = _rows(conn, "SELECT op_id, shard, owner FROM shard_intents")
            out.effects = dict(
                _rows(conn, "SELECT thread_key, count(*) FROM effects GROUP BY thread_key")
            )
        finally:
            conn.close()
    return out


def check_consistent(root: Path) -> Layout:
    """The store at *root* is whole: no catalog+shard write left unfinished, every
    file intact and migrated to the same version, the catalog's index naming exactly
    the sessions each shard holds (with the same rows), no session in two files, no
    message of a sharded session in the catalog."""
    lay = read_layout(root)
    assert not lay.intents, f"unfinished catalog+shard writes: {lay.intents}"
    assert not lay.damaged, lay.damaged
    expected = lay.migrations[None]
    assert expected == sorted(set(expected)) and expected[0] == 1, expected
    for key, versions in lay.migrations.items():
        assert versions == expected, f"shard {key}: migrations {versions}, catalog {expected}"
    for key, rows in lay.shards.items():
        for sid, row in rows.items():
            assert lay.index.get(sid) == key, f"{sid} in shard {key}, index {lay.index.get(sid)}"
            assert lay.catalog.get(sid) == row, f"{sid}: catalog {lay.catalog.get(sid)}, {row}"
    for sid, key in lay.index.items():
        assert key in lay.shards, f"{sid}: indexed in shard {key}, which has no file"
        assert sid in lay.shards[key], f"{sid}: indexed in shard {key}, not in its file"
    for sid in set(lay.catalog) - set(lay.index):
        assert lay.home(sid) is None, f"{sid}: a catalog session also in a shard"
    in_shards = set().union(*(ids for key, ids in lay.messages.items() if key is not None))
    stray = lay.messages[None] & in_shards
    assert not stray, f"messages in the catalog and a shard: {sorted(stray)[:5]}"
    return lay


# -- child processes -------------------------------------------------------------------------


def _child(
    url: str,
    job: dict[str, Any],
    barrier: Barrier | None = None,
    crash: str = "",
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> Proc:
    """A child doing *job*; with *crash*, it SIGKILLs itself at that point of the
    catalog+shard protocol (the variable is set for the child only)."""
    argv = [sys.executable, "-c", _CHILD, url, barrier.path if barrier else "", json.dumps(job)]
    if not crash:
        return Proc(argv, name=job["do"])
    assert monkeypatch is not None
    monkeypatch.setenv(CRASH_ENV, crash)
    try:
        return Proc(argv, name=f"{job['do']} {crash}")
    finally:
        monkeypatch.delenv(CRASH_ENV)


def _killed(proc: Proc) -> None:
    """*proc* died of SIGKILL at its crash point: after "ready", before "done"."""
    rc = proc.finish(timeout=60)
    assert rc == -signal.SIGKILL, f"{proc.name}: rc {rc}; {proc.stderr_tail()}"
    assert [line for _, line in proc.seen] == ["ready"], proc.seen


def _url(root: Path) -> str:
    return f"sqlite+sharded://{root}"


ROOT = "tree-root"
CASES: dict[str, tuple[dict[str, Any], str]] = {
    # name: (the victim's write, where it dies)
    "root-after-intent": ({"do": "create", "sid": "new-root"}, "after-intent"),
    "root-after-shard": ({"do": "create", "sid": "new-root"}, "after-shard"),
    "subagent-after-intent": ({"do": "create", "sid": "sub-1", "parent": ROOT}, "after-intent"),
    "append-after-intent": ({"do": "append", "sid": ROOT, "mid": "m-1"}, "after-intent"),
    "append-after-shard": ({"do": "append", "sid": ROOT, "mid": "m-1"}, "after-shard"),
    "fork-after-shard": ({"do": "fork", "sid": "fork-1", "source": ROOT}, "after-shard"),
    "delete-after-shard": ({"do": "delete", "sid": "sub-0", "source": ROOT}, "after-shard"),
}


def _shard_part_done(job: dict[str, Any], lay: Layout, key: str) -> bool:
    """Whether the victim's write is in its shard file."""
    if job["do"] == "append":
        return str(job["mid"]) in lay.messages.get(key, set())
    row = lay.shards.get(key, {}).get(str(job["sid"]))
    if job["do"] == "delete":  # hidden at once (job 'delete'), its rows purged after
        return row is None or row[-1] == "delete"
    return row is not None


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_kill_between_catalog_and_shard_is_finished_by_the_next_open(
    case: str, tmp_path: Path, procs: list[Proc], monkeypatch: pytest.MonkeyPatch
) -> None:
    job, point = CASES[case]
    root = tmp_path / "store"
    with fleetstore.open(_url(root)) as setup:
        setup.sessions.create("the tree", id=ROOT)
        setup.sessions.create("a subagent", id="sub-0", parent_id=ROOT)
        setup.messages.append(ROOT, "user", "hello", id="m-0")
    check_consistent(root)
    # Effects go with creates and appends (the others take none).
    effects = 3 if job["do"] in ("create", "append") else 0
    job = {**job, "title": "made by the victim", "text": "lost?", "thread": "t-" + case,
           "effects": effects}  # fmt: skip
    procs.append(_child(_url(root), job, crash=point, monkeypatch=monkeypatch))
    procs[-1].wait_line("ready", timeout=60)
    _killed(procs[-1])

    sid = str(job["sid"])
    key = shard_key(str(job.get("parent") or job.get("source") or sid))
    half = read_layout(root)
    assert [i[1] for i in half.intents] == [key], half.intents  # the intent is there
    done = _shard_part_done(job, half, key)
    assert done == (point == "after-shard"), (point, half.shards, half.messages)
    assert half.effects.get(job["thread"], 0) == 0  # the catalog's part never ran
    if job["do"] in ("create", "fork"):
        # At most reserved in the index (no sessions row) until the catalog's part.
        assert sid not in half.catalog and half.index.get(sid) in (None, key), half.index
    if job["do"] == "delete":
        assert half.index.get(sid) == key and sid in half.catalog  # still listed

    victim = half.intents[0][2]
    with fleetstore.open(_url(root)) as store:  # finishes the dead process's intent
        # ...at once; a delete's purge then runs in this process's job thread, a
        # catalog+shard write whose own intent may be in flight while the files are
        # read: only this process's may be left, and the files are checked once that
        # thread has ended (a look between two of its writes saw none left, then the
        # check saw its next one: CI failed on it once).
        deadline = time.monotonic() + 60
        while store._jobs_running or read_layout(root).intents:
            left = read_layout(root).intents
            assert all(i[2] != victim for i in left), left
            assert all(i[2].startswith(f"{os.getpid()}:") for i in left), left
            assert time.monotonic() < deadline, (store._jobs_running, left)
            time.sleep(0.02)
        lay = check_consistent(root)
        assert _shard_part_done(job, lay, key)  # rolled forward
        listed = {s.id for s in store.sessions.list(include_archived=True)}
        if job["do"] == "delete":
            assert sid not in listed
            with pytest.raises(fleetstore.NotFound):
                store.sessions.get(sid)
            assert sid not in lay.index  # the open's job thread purged it
        else:
            assert lay.index.get(sid) == key and sid in listed
        if job["do"] == "create":
            assert store.sessions.get(sid).title == "made by the victim"
        elif job["do"] == "fork":
            fork = store.sessions.get(sid)
            assert fork.forked_from == ROOT and fork.title == "made by the victim"
            assert [m.role for m in store.messages.list(sid)] == ["user"]
        elif job["do"] == "append":
            assert store.messages.get("m-1").session_id == ROOT
            assert [m.id for m in store.messages.list(ROOT)] == ["m-0", "m-1"]
        # Enqueued exactly once, with the write (which the protocol rolled forward).
        assert lay.effects.get(job["thread"], 0) == effects
        assert len(store.effects.list(thread_key=job["thread"])) == effects


@pytest.mark.slow
def test_intents_of_dead_processes_are_finished_once_by_processes_recovering_together(
    tmp_path: Path, procs: list[Proc], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three writers die at their crash points at the same time; then two processes
    open the store at once (open() recovers) while a process that had it open before
    the crash runs ``router.recover()``: each intent is finished exactly once."""
    root = tmp_path / "store"
    url = _url(root)
    live = fleetstore.open(url)
    try:
        live.sessions.create("the tree", id=ROOT)
        crash = Barrier(tmp_path / "crash.barrier")
        jobs = [
            ({"do": "create", "sid": "r-2", "title": "r2", "thread": "t-r2", "effects": 2},
             "after-intent"),
            ({"do": "append", "sid": ROOT, "mid": "m-1", "text": "x", "thread": "t-m1",
              "effects": 3}, "after-shard"),
            ({"do": "create", "sid": "sub-1", "parent": ROOT, "title": "s1", "thread": "t-s1",
              "effects": 1}, "after-intent"),
        ]  # fmt: skip
        victims = [_child(url, job, crash, point, monkeypatch) for job, point in jobs]
        procs.extend(victims)
        for p in victims:
            p.wait_line("ready", timeout=60)
        crash.release()
        for p in victims:
            _killed(p)
        crash.close()
        left = read_layout(root).intents
        assert len(left) == 3, left

        again = Barrier(tmp_path / "recover.barrier")
        helpers = [_child(url, {"do": "recover"}, again) for _ in range(2)]
        procs.extend(helpers)
        for p in helpers:
            p.wait_line("ready", timeout=60)
        again.release()  # both open (and recover) now, as this process recovers
        assert live.router is not None
        live.router.recover()
        for p in helpers:
            assert p.finish(timeout=60) == 0, p.stderr_tail()
        again.close()

        lay = check_consistent(root)
        assert lay.effects == {"t-r2": 2, "t-m1": 3, "t-s1": 1}
        assert lay.shards[shard_key("r-2")].keys() == {"r-2"}
        assert lay.shards[shard_key(ROOT)].keys() == {ROOT, "sub-1"}
        assert lay.messages[shard_key(ROOT)] == {"m-1"}
        listed = {s.id for s in live.sessions.list()}
        assert listed == {ROOT, "r-2", "sub-1"}
    finally:
        live.close()


# -- concurrent first use --------------------------------------------------------------------

_FIRST_USE = r"""
import fcntl, json, os, sys
import fleetstore

url, barrier, role, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
print("ready", flush=True)
fd = os.open(barrier, os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_SH)
os.close(fd)
store = fleetstore.open(url)  # a brand-new directory: every process creates it at once
made = {"root": None, "sessions": [], "messages": 0}
root = "shared-root" if role == "sub" else f"tree-{n}"
try:  # other contents than the other processes': only one can make it
    store.sessions.create(f"root by {n}", id=root)
    made["root"] = root
except fleetstore.AlreadyExists:
    assert role == "sub"
for k in range(3 if role == "sub" else 1):
    child = store.sessions.create(f"sub {n}.{k}", parent_id=root, id=f"sub-{role}-{n}-{k}")
    made["sessions"].append(child.id)
    for j in range(2):
        store.messages.append(child.id, "assistant", f"{n} {k} {j}", id=f"m-{child.id}-{j}")
        made["messages"] += 1
store.messages.append(root, "user", f"from {n}", id=f"m-{role}-{n}-root")
made["messages"] += 1
store.close()
print(json.dumps(made), flush=True)
"""


@pytest.mark.slow
def test_processes_starting_together_on_a_new_directory_make_each_file_once(
    tmp_path: Path, procs: list[Proc], barrier: Barrier
) -> None:
    """8 processes grow subagents under one brand-new tree while 8 others each make
    a tree of their own, all opening a directory that does not exist yet."""
    root = tmp_path / "store"
    url = _url(root)
    for role in ("sub", "tree"):
        for n in range(8):
            argv = [sys.executable, "-c", _FIRST_USE, url, barrier.path, role, str(n)]
            procs.append(Proc(argv, name=f"{role} {n}"))
    for p in procs:
        p.wait_line("ready", timeout=120)
    assert not root.exists()
    barrier.release()
    made = []
    for p in procs:
        assert p.finish(timeout=120) == 0, (p.name, p.stderr_tail())
        made.append(json.loads(p.last_line()))

    lay = check_consistent(root)
    creators = [m["root"] for m in made[:8] if m["root"] is not None]
    assert creators == ["shared-root"], creators  # one process made the shared root
    shared = lay.shards[shard_key("shared-root")]
    subs = {sid for m in made[:8] for sid in m["sessions"]}
    assert len(subs) == 24 and shared.keys() == {"shared-root", *subs}
    assert all(shared[s][2] == "shared-root" for s in subs)  # root_id
    for n, m in enumerate(made[8:]):
        assert lay.shards[shard_key(f"tree-{n}")].keys() == {f"tree-{n}", *m["sessions"]}
    assert len(lay.shards) == 9
    assert sum(len(ids) for ids in lay.messages.values()) == sum(m["messages"] for m in made)
    with fleetstore.open(url) as store:
        assert len(store.sessions.list(limit=1000)) == 1 + 24 + 8 + 8
        assert len(store.messages.list("shared-root")) == 8


# -- the checkers can fail -------------------------------------------------------------------


def test_checkers_see_a_catalog_index_that_disagrees_with_the_shards(tmp_path: Path) -> None:
    """``check_consistent`` here names an index row gone (``fleetstore stress``'s
    read-back has the same test: stress/tests/test_stress.py)."""
    root = tmp_path / "store"
    with fleetstore.open(_url(root)) as store:
        store.sessions.create("a", id="tree-a")
        store.sessions.create("b", id="tree-b")
        store.sessions.create("b's subagent", id="sub-b", parent_id="tree-b")
    check_consistent(root)
    conn = apsw.Connection(str(root / CATALOG), flags=apsw.SQLITE_OPEN_READWRITE)
    try:
        with conn:
            conn.execute("DELETE FROM shard_sessions WHERE session_id = 'sub-b'")
            conn.execute("INSERT INTO shard_sessions VALUES ('ghost', 'tree-a')")
            conn.execute("INSERT INTO shard_sessions VALUES ('lost', 'gone-zz')")
    finally:
        conn.close()
    with pytest.raises(AssertionError, match="sub-b in shard tree-b, index None"):
        check_consistent(root)
