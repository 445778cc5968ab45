"""``fleetstore import --from langgraph-sqlite``: a real ``SqliteSaver`` file, written
by running a graph, read back through ``FleetstoreSaver`` gives what ``SqliteSaver``
gives.  The source file is written, and ``SqliteSaver``'s answers read, by this file
run as a script in its own process: it uses the standard library's sqlite3, which must
never share a process with fleetstore's connections (DESIGN.md).

    test_langgraph_import.py make PATH [--tweak]   # prints a pickle of the answers (hex)
"""

from __future__ import annotations

import operator
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

THREADS = ("t-plain", "t-twice", "t-interrupted")


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    count: int
    answer: str


def build(checkpointer: Any, tweak: bool = False) -> Any:
    def first(s: State) -> dict[str, Any]:
        return {"log": ["first" + (" (edited)" if tweak else "")], "count": s["count"] + 1}

    def left(s: State) -> dict[str, Any]:
        return {"log": ["left"]}

    def right(s: State) -> dict[str, Any]:
        return {"log": ["right " + "x" * 70_000]}  # past the blob threshold

    def ask(s: State) -> dict[str, Any]:
        if s["count"] < 2:
            return {"answer": "none"}
        return {"answer": str(interrupt({"question": "go on?"}))}

    g = StateGraph(State)
    for name, fn in (("first", first), ("left", left), ("right", right), ("ask", ask)):
        g.add_node(name, fn)
    g.add_edge(START, "first")
    g.add_edge("first", "left")
    g.add_edge("first", "right")
    g.add_edge(["left", "right"], "ask")
    g.add_edge("ask", END)
    return g.compile(checkpointer=checkpointer)


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def answers(saver: Any, graph: Any) -> dict[str, Any]:
    """What a saver gives: per thread its list, each checkpoint's get_tuple, the
    graph's state history; and the list of every thread."""
    out: dict[str, Any] = {"all": list(saver.list(None))}
    for t in THREADS:
        listed = list(saver.list(config(t)))
        out[t] = {
            "list": listed,
            "latest": saver.get_tuple(config(t)),
            "tuples": [saver.get_tuple(c.config) for c in listed],
            "history": list(graph.get_state_history(config(t))),
            "limited": list(saver.list(config(t), limit=2, before=listed[1].config)),
            "filtered": list(saver.list(config(t), filter={"step": 1})),
        }
    return out


def make(path: str, tweak: bool) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    with SqliteSaver.from_conn_string(path) as saver:
        graph = build(saver, tweak)
        graph.invoke({"log": [], "count": 0, "answer": ""}, config("t-plain"))
        graph.invoke({"log": [], "count": 0, "answer": ""}, config("t-twice"))
        graph.invoke({"log": ["again"], "count": 0, "answer": ""}, config("t-twice"))
        graph.invoke({"log": [], "count": 1, "answer": ""}, config("t-interrupted"))
        sys.stdout.write(pickle.dumps(answers(saver, graph)).hex())


def make_source(path: Path, *extra: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "make", str(path), *extra],
        capture_output=True,
        text=True,
        check=True,
        timeout=180,
    )
    return dict(pickle.loads(bytes.fromhex(out.stdout)))


# -- the tests -------------------------------------------------------------------------------


def test_import_gives_what_sqlitesaver_gives_verified_and_idempotent(tmp_path: Path) -> None:
    import fleetstore
    from fleetstore.integrations.langgraph import FleetstoreSaver
    from fleetstore.integrations.langgraph.importer import import_langgraph_sqlite

    source = tmp_path / "lg.db"
    expected = make_source(source)
    with fleetstore.open(tmp_path / "store.db") as store:
        first = import_langgraph_sqlite(store, source)
        again = import_langgraph_sqlite(store, source)
        saver = FleetstoreSaver(store)
        graph = build(saver)
        got = answers(saver, graph)
        assert got == expected
        # the interrupted thread pends on the interrupt, and resumes on fleetstore
        snap = graph.get_state(config("t-interrupted"))
        assert snap.next == ("ask",) and snap.interrupts
        done = graph.invoke(Command(resume="yes"), config("t-interrupted"))
        assert done["answer"] == "yes" and done["count"] == 2
        saver.close()
    assert first.threads == 3 and first.checkpoints == len(expected["all"]) > 10
    assert first.new_checkpoints == first.checkpoints and first.writes > first.checkpoints
    assert first.new_tasks > 0 and first.unchanged_tasks == 0
    assert again.new_checkpoints == 0 and again.new_tasks == 0
    assert again.unchanged_checkpoints == first.checkpoints
    assert again.unchanged_tasks == first.new_tasks


def test_a_bad_file_is_refused_and_nothing_written(tmp_path: Path) -> None:
    import fleetstore
    from fleetstore import errors
    from fleetstore.integrations.langgraph.importer import import_langgraph_sqlite

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not sqlite" * 100)
    other = tmp_path / "other.db"
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sqlite3; sqlite3.connect({str(other)!r}).execute("
            "'CREATE TABLE checkpoints (x)').connection.commit()",
        ],
        check=True,
        timeout=60,
    )
    with fleetstore.open(tmp_path / "store.db") as store:
        with pytest.raises(errors.InvalidInput, match="not an importable LangGraph"):
            import_langgraph_sqlite(store, garbage)
        with pytest.raises(errors.InvalidInput, match="no table writes"):
            import_langgraph_sqlite(store, other)
        with pytest.raises(errors.NotFound):
            import_langgraph_sqlite(store, tmp_path / "missing.db")
        assert list(fleetstore_checkpoints(store)) == []


def test_a_checkpoint_stored_under_another_id_is_refused_and_nothing_written(
    tmp_path: Path,
) -> None:
    """A row whose checkpoint says another id is a bad file, refused before anything is
    written (the importer's check of each checkpoint; without it the rows were imported
    and the import failed only in its verification, issue 26's hand mutation)."""
    import fleetstore
    from fleetstore import errors
    from fleetstore.integrations.langgraph.importer import import_langgraph_sqlite

    source = tmp_path / "lg.db"
    make_source(source)
    edited = tmp_path / "edited.db"
    script = (
        "import sqlite3, sys\n"
        "from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer\n"
        "src, dst = sys.argv[1:3]\n"
        "a = sqlite3.connect(src); b = sqlite3.connect(dst); a.backup(b); a.close()\n"
        "s = JsonPlusSerializer()\n"
        'row = b.execute("SELECT thread_id, checkpoint_id, type, checkpoint FROM checkpoints "\n'
        "    \"WHERE thread_id = 't-plain' ORDER BY checkpoint_id DESC LIMIT 1\").fetchone()\n"
        "cp = s.loads_typed((row[2], row[3])); cp['id'] = 'another-id'\n"
        "t, body = s.dumps_typed(cp)\n"
        "b.execute('UPDATE checkpoints SET type = ?, checkpoint = ? WHERE thread_id = ? '\n"
        "    'AND checkpoint_id = ?', (t, body, row[0], row[1])); b.commit()\n"
    )
    subprocess.run([sys.executable, "-c", script, str(source), str(edited)], check=True, timeout=60)
    with fleetstore.open(tmp_path / "store.db") as store:
        with pytest.raises(errors.InvalidInput, match="not a checkpoint with that id"):
            import_langgraph_sqlite(store, edited)
        assert fleetstore_checkpoints(store) == []


def fleetstore_checkpoints(store: Any) -> list[Any]:
    from fleetstore.domain.langgraph import Checkpoints

    return list(Checkpoints(store).list())


@pytest.mark.slow
def test_a_file_contradicting_the_store_writes_nothing(tmp_path: Path) -> None:
    import fleetstore
    from fleetstore import errors
    from fleetstore.integrations.langgraph.importer import import_langgraph_sqlite

    # Checkpoint ids differ between runs; copy one file and change a value in place
    # (in a process of its own) so the ids stay and the contents differ.
    source = tmp_path / "lg.db"
    make_source(source)
    edited = tmp_path / "edited.db"
    script = (
        "import shutil, sqlite3, sys\n"
        "from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer\n"
        "src, dst = sys.argv[1:3]\n"
        "a = sqlite3.connect(src); b = sqlite3.connect(dst); a.backup(b); a.close()\n"
        "s = JsonPlusSerializer()\n"
        'row = b.execute("SELECT thread_id, checkpoint_id, type, checkpoint FROM checkpoints "\n'
        "    \"WHERE thread_id = 't-plain' ORDER BY checkpoint_id DESC LIMIT 1\").fetchone()\n"
        "cp = s.loads_typed((row[2], row[3])); cp['channel_values']['answer'] = 'edited'\n"
        "t, body = s.dumps_typed(cp)\n"
        "b.execute('UPDATE checkpoints SET type = ?, checkpoint = ? WHERE thread_id = ? '\n"
        "    'AND checkpoint_id = ?', (t, body, row[0], row[1])); b.commit()\n"
    )
    subprocess.run([sys.executable, "-c", script, str(source), str(edited)], check=True, timeout=60)
    with fleetstore.open(tmp_path / "store.db") as store:
        import_langgraph_sqlite(store, source)
        before = [(c.checkpoint_id, c.writes) for c in fleetstore_checkpoints(store)]
        with pytest.raises(errors.AlreadyExists, match="other contents"):
            import_langgraph_sqlite(store, edited)
        assert [(c.checkpoint_id, c.writes) for c in fleetstore_checkpoints(store)] == before


@pytest.mark.slow
def test_cli_import_from_langgraph_sqlite(tmp_path: Path) -> None:
    source = tmp_path / "lg.db"
    make_source(source)
    store = tmp_path / "store.db"
    cmd = ["fleetstore", "import", "--from", "langgraph-sqlite", str(source)]
    exe = str(Path(sys.executable).parent / "fleetstore")
    done = subprocess.run(
        [exe, *cmd[1:], "--store", str(store)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "3 LangGraph threads" in done.stdout and "verified" in done.stdout
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"nope" * 100)
    done = subprocess.run(
        [exe, *cmd[1:-1], str(bad), "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "not an importable LangGraph" in done.stderr


if __name__ == "__main__" and sys.argv[1:2] == ["make"]:
    make(sys.argv[2], "--tweak" in sys.argv[3:])
