"""Search's contract (issue 30): one suite, run on one SQLite file, the sharded layout and
PostgreSQL (``open_store``, tests/fix_stores.py).  What is searched, the query syntax,
highlights, filters, order and pages, what deletes, archives and in-place rewrites do
to the index, streamed text, long parts, forks, and an existing store indexed by the
migration's backfill, online and resumable.

Stores here run without the indexer thread (``search_index=False``) and are caught up
explicitly (``store.search.catch_up()``), so each test knows what the index holds; the
thread itself is test_search_index.py's."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from fleetstore import File, Store, Text, ToolCall, ToolResult, errors
from fleetstore.domain.search_text import words
from tests.fix_stores import OpenStore, read_everywhere


@pytest.fixture
def store(open_store: OpenStore) -> Store:
    return open_store(search_index=False)


def find(store: Store, query: str, **kw: Any) -> list[tuple[str, int | None, str]]:
    """(kind, seq, session id) of every hit, in order, every page."""
    found: list[tuple[str, int | None, str]] = []
    cursor = None
    while True:
        page = store.search(query, cursor=cursor, limit=7, **kw)
        found += [(h.kind, h.seq, h.session_id) for h in page]
        if not page.more:
            return found
        cursor = page.next_cursor


def kinds(store: Store, query: str, **kw: Any) -> list[str]:
    return [k for k, _, _ in find(store, query, **kw)]


def test_what_is_searched_each_kind_of_text(store: Store) -> None:
    s = store.sessions.create(
        title="Deploy the parser",
        project="api",
        metadata={"ticket": "OPS-4242", "nested": {"owner": "zelda"}},
    )
    store.messages.append(s.id, "user", "why does parse_tool_output fail?")
    with store.messages.stream(s.id, model="m") as reply:
        reply.reasoning("thinking about quokkas")
        reply.text("Let me look.")
        call = reply.tool_call("bash", {"cmd": "grep -rn frobnicate src/", "timeout": 30})
        call.result("src/fleet/parser.py:42: ECONNREFUSED talking to the wombat service")
    store.messages.append(
        s.id,
        "tool",
        [
            ToolResult("c1", b"bytes output narwhal"),
            ToolResult("c2", b"\xff\xfe not text ibex"),
            File(b"hedgehog notes", "text/markdown", "notes.md"),
            File(b"\x89PNG ocelot", "image/png", "diagram.png"),
            # over blob_threshold: a blob file, read back to be indexed
            ToolResult("c3", "filler " * 12_000 + "capybara"),
        ],
    )
    with pytest.raises(RuntimeError), store.messages.stream(s.id) as reply:
        reply.text("half an answer")
        raise RuntimeError("kaboom marmoset")
    assert store.search.catch_up() > 0

    assert kinds(store, "quokkas") == ["reasoning"]
    assert kinds(store, '"Let me look"') == ["text"]
    assert kinds(store, "frobnicate") == ["tool_call"]
    assert kinds(store, "bash") == ["tool_call"]  # the tool's name
    assert kinds(store, "timeout") == ["tool_call"]  # an argument's key...
    assert kinds(store, "30") == ["tool_call"]  # ...and its value
    assert kinds(store, "wombat") == ["tool_result"]
    assert kinds(store, "narwhal") == ["tool_result"]  # bytes that are UTF-8
    assert kinds(store, "ibex") == []  # bytes that are not
    assert kinds(store, "hedgehog") == ["file"]  # a textual file's contents
    assert kinds(store, "diagram") == ["file"] and kinds(store, "ocelot") == []
    assert kinds(store, "capybara") == ["tool_result"]  # a blob
    assert kinds(store, "marmoset") == ["error"]
    assert kinds(store, "deploy") == ["title"]
    assert kinds(store, "zelda") == ["metadata"] and kinds(store, '"OPS 4242"') == ["metadata"]
    assert kinds(store, "ticket") == []  # metadata keys are not searched
    hit = store.search("wombat")[0]
    assert (hit.session_id, hit.seq, hit.part, hit.role) == (s.id, 2, 3, "assistant")
    message = store.messages.get(hit.message_id)  # type: ignore[arg-type]
    assert message.seq == 2 and isinstance(message.parts[3], ToolResult)
    title = store.search("deploy")[0]
    assert (title.message_id, title.seq, title.part, title.role) == (None, None, None, None)


def test_query_syntax_words_phrases_prefixes_booleans(store: Store) -> None:
    s = store.sessions.create()
    texts = [
        "the connection was refused by the server",  # 1
        "refused: no connection to the server",  # 2
        "Café au lait, crème brûlée",  # 3
        "call parse_tool_output on src/fleet/parser.py",  # 4
        "frobnicator warming up",  # 5
    ]
    for t in texts:
        store.messages.append(s.id, "user", t)
    store.search.catch_up()

    def seqs(q: str, **kw: Any) -> set[int | None]:
        return {seq for _, seq, _ in find(store, q, **kw)}

    assert seqs("connection refused") == {1, 2}  # AND is implied
    assert seqs('"connection was refused"') == {1}  # a phrase: in that order
    assert seqs('"refused connection"') == set()
    assert seqs("frob*") == {5} and seqs("frob") == set()
    assert seqs("connection OR frobnicator") == {1, 2, 5}
    assert seqs("connection NOT was") == {2}
    assert seqs("(frobnicator OR cafe) AND not") == set()  # lowercase: the word "not"
    assert seqs("(frobnicator OR cafe) lait") == {3}
    assert seqs("cafe CRÈME brulee") == {3}  # case and diacritics folded
    assert seqs("parse_tool_output") == {4} == seqs('"parse tool output"')
    assert seqs("tool_output") == {4} and seqs("output_tool") == set()
    assert seqs("src/fleet/parser.py") == {4} == seqs("fleet/parser")
    assert seqs('"src fleet pars"*') == {4}
    assert seqs("and") == set()  # lowercase: a word, not an operator
    # substrings: inside words, case aside, across separators
    assert seqs("rse_tool_ou", match="substring") == {4}
    assert seqs("ONNECT", match="substring") == {1, 2}
    assert seqs("leet/pars", match="substring") == {4}
    assert seqs('"was refused"', match="substring") == {1}
    assert seqs("onnect NOT server", match="substring") == set()
    assert seqs('onnect NOT "was ref"', match="substring") == {2}
    assert seqs("zzzqqq", match="substring") == set()
    for bad, match in [
        ("NOT connection", "words"),
        ("server OR NOT connection", "words"),
        ('"unclosed', "words"),
        ("(server", "words"),
        ("--- ...", "words"),  # no word in it
        ("server AND", "words"),
        ("ab", "substring"),
        ("server", "fuzzy"),
    ]:
        with pytest.raises(errors.InvalidInput):
            store.search(bad, match=match)


def test_each_highlight_is_a_match_in_the_snippet(store: Store) -> None:
    s = store.sessions.create()
    store.messages.append(
        s.id,
        "user",
        "x " * 300 + "The Quick brown FOX jumps; quick again.\n\tquickly " + "y " * 300,
    )
    store.search.catch_up()
    (hit,) = store.search("quick")
    marked = [hit.snippet[a:b] for a, b in hit.highlights]
    assert marked == ["Quick", "quick"]
    assert hit.snippet.startswith("…") and hit.snippet.endswith("…")
    assert "\n" not in hit.snippet and "\t" not in hit.snippet
    (hit,) = store.search("qui*")
    assert [hit.snippet[a:b] for a, b in hit.highlights] == ["Quick", "quick", "quickly"]
    (hit,) = store.search('"brown fox"')
    assert [words(hit.snippet[a:b]) for a, b in hit.highlights] == [["brown", "fox"]]
    (hit,) = store.search('"ICK bro"', match="substring")
    assert [hit.snippet[a:b] for a, b in hit.highlights] == ["ick bro"]


def test_filters(store: Store) -> None:
    root = store.sessions.create(title="root", project="alpha")
    sub = store.sessions.create(title="sub", project="alpha", parent_id=root.id)
    other = store.sessions.create(title="other", project="beta")
    store.messages.append(root.id, "user", "lemur one")
    store.messages.append(sub.id, "assistant", [Text("lemur two"), ToolCall("lemur", {})])
    store.messages.append(other.id, "user", "lemur three")
    before = time.time()
    time.sleep(0.05)
    store.messages.append(other.id, "system", "lemur four")
    store.search.catch_up()
    everything = find(store, "lemur")
    assert len(everything) == 5
    assert {s for _, _, s in find(store, "lemur", project="alpha")} == {root.id, sub.id}
    assert {s for _, _, s in find(store, "lemur", root_id=root.id)} == {root.id, sub.id}
    assert {s for _, _, s in find(store, "lemur", session_id=sub.id)} == {sub.id}
    assert kinds(store, "lemur", session_id=sub.id, kinds=["tool_call"]) == ["tool_call"]
    assert len(find(store, "lemur", roles=["user", "system"])) == 3
    assert [seq for _, seq, _ in find(store, "lemur", since=before)] == [2]
    assert len(find(store, "lemur", until=before)) == 4
    assert find(store, "lemur", since=before, roles=["user"]) == []
    # substring search, the same filters (applied by a join, not the words' tags)
    assert len(find(store, "emu", match="substring", project="alpha")) == 3
    assert [seq for _, seq, _ in find(store, "emu", match="substring", since=before)] == [2]
    assert find(store, "emu", match="substring", session_id=other.id, kinds=["tool_call"]) == []
    assert len(find(store, "emu", match="substring", roles=["assistant"])) == 2


def test_newest_first_and_best_first_pages_cover_every_hit_once(store: Store) -> None:
    s = store.sessions.create()
    for i in range(23):
        # the more "marmot", the better the rank (bm25, ts_rank: a higher rank)
        store.messages.append(s.id, "user", f"note {i}: " + "marmot " * (1 + i % 5) + "x" * i)
    store.search.catch_up()
    pages = []
    cursor = None
    while True:
        page = store.search("marmot", limit=5, cursor=cursor)
        pages.append(page)
        if not page.more:
            assert page.next_cursor is None
            break
        cursor = page.next_cursor
    hits = [h for p in pages for h in p]
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    assert [h.seq for h in hits] == list(range(23, 0, -1))
    assert all(a.created_at >= b.created_at for a, b in itertools.pairwise(hits))
    best: list[Any] = []
    cursor = None
    while True:
        page = store.search("marmot", order="best", limit=4, cursor=cursor)
        best += page
        if not page.more:
            break
        cursor = page.next_cursor
    assert sorted(h.seq for h in best) == list(range(1, 24))
    assert all(a.rank >= b.rank for a, b in itertools.pairwise(best))
    assert best[0].rank > best[-1].rank
    with pytest.raises(errors.InvalidInput):  # a best-first cursor is not a newest one
        store.search("marmot", cursor=store.search("marmot", order="best", limit=1).next_cursor)


def test_a_deleted_session_is_gone_from_search_and_from_the_index(store: Store) -> None:
    keep = store.sessions.create(title="kept tapir")
    gone = store.sessions.create(title="gone tapir")
    sub = store.sessions.create(parent_id=gone.id)
    for s in (keep, gone, sub):
        for i in range(3):
            store.messages.append(s.id, "user", f"tapir {i}")
    store.search.catch_up()
    assert len(find(store, "tapir")) == 11
    before = read_everywhere(store, "SELECT count(*) FROM search_docs")[0][0]
    store.sessions.delete(gone.id)
    assert {s for _, _, s in find(store, "tapir")} == {keep.id}
    after = read_everywhere(store, "SELECT count(*) FROM search_docs")[0][0]
    assert before - after == 7  # the title and six messages: removed by the delete's triggers
    assert store.search.status().queued == 0


def test_archived_sessions_are_found_only_when_asked(store: Store) -> None:
    s = store.sessions.create(title="okapi")
    store.messages.append(s.id, "user", "okapi sighting")
    store.search.catch_up()
    store.sessions.archive(s.id)
    assert find(store, "okapi") == []
    assert len(find(store, "okapi", include_archived=True)) == 2
    store.sessions.archive(s.id, archived=False)
    assert len(find(store, "okapi")) == 2


def test_a_title_changed_is_unfound_at_once_and_the_new_one_found_once_indexed(
    store: Store,
) -> None:
    s = store.sessions.create(title="old jackal", metadata={"tag": "mongoose"})
    store.search.catch_up()
    store.sessions.update(s.id, title="new dingo")
    assert find(store, "jackal") == []  # the update's trigger took it out
    assert find(store, "dingo") == []  # not indexed yet
    assert store.search.status().queued == 1
    store.search.catch_up()
    assert kinds(store, "dingo") == ["title"] and kinds(store, "mongoose") == ["metadata"]


def _rewrite(store: Store, session_id: str, sql: dict[str, str], params: tuple[Any, ...]) -> None:
    """Raw SQL on the file holding *session_id* (what a redaction does to a stored row)."""
    (key,) = store.search_files(session_id=session_id, root_id=None, project=None)

    def run(db: Any) -> None:
        db.run_write(lambda tx: tx.execute(sql[db.dialect], params))

    store.with_file(key, run)


def test_text_rewritten_in_place_leaves_the_index_at_once(store: Store) -> None:
    """What a redaction does: a part's body or a streamed chunk rewritten by an UPDATE.
    The old words are not found from that commit on (the trigger takes the message out
    of the index, and every hit is checked against its text anyway); the new text is,
    once the message is indexed again."""
    s = store.sessions.create()
    m = store.messages.append(s.id, "user", "secret sk-ocelot-123 here")
    with store.messages.stream(s.id) as reply:
        reply.text("streamed token sk-puma-456")
    store.search.catch_up()
    assert len(find(store, "ocelot")) == 1 and len(find(store, "puma")) == 1
    _rewrite(
        store,
        s.id,
        {
            "sqlite": "UPDATE parts SET body = ? WHERE message_id = ?",
            "postgresql": "UPDATE parts SET body = convert_to(?, 'UTF8') WHERE message_id = ?",
        },
        ("secret [REDACTED:key] here", m.id),
    )
    _rewrite(
        store,
        s.id,
        {
            "sqlite": "UPDATE chunks SET text = ?",
            "postgresql": "UPDATE chunks SET text = ?",
        },
        ("streamed token [REDACTED:key]",),
    )
    assert find(store, "ocelot") == [] and find(store, "puma") == []
    assert find(store, "ocelot", match="substring") == []
    assert store.search.status().queued == 2
    store.search.catch_up()
    assert len(find(store, "redacted")) == 2 and find(store, "puma") == []


def test_a_streamed_reply_is_indexed_whole_once_it_ends(store: Store) -> None:
    s = store.sessions.create()
    with store.messages.stream(s.id) as reply:
        reply.text("the quick brown ")
        reply.flush()
        store.search.catch_up()
        assert find(store, "quick") == []  # still streaming: not queued yet
        reply.text("fox jumps")
    store.search.catch_up()
    assert len(find(store, '"brown fox"')) == 1  # a phrase across two flushes


def test_a_long_part_is_searched_by_its_head_and_its_tail(open_store: OpenStore) -> None:
    store = open_store(search_index=False, search_part_chars=40_000)
    s = store.sessions.create()
    filler = "lorem ipsum " * 5_000
    output = "headword " + filler + " middleword " + filler + " tailword"
    store.messages.append(s.id, "tool", [ToolResult("c", output)])
    store.search.catch_up()
    assert len(find(store, "headword")) == 1 and len(find(store, "tailword")) == 1
    assert find(store, "middleword") == [] and find(store, "ddlewor", match="substring") == []
    assert len(find(store, "lorem")) == 1  # one hit per part, however many sections


def test_a_fork_is_found_in_its_own_session(store: Store) -> None:
    s = store.sessions.create()
    store.messages.append(s.id, "user", "axolotl question")
    fork = store.sessions.fork(s.id)
    store.search.catch_up()
    assert {sid for _, _, sid in find(store, "axolotl")} == {s.id, fork.id}


def test_parts_an_import_adds_to_a_finished_message_are_indexed(store: Store) -> None:
    from fleetstore.core.ids import new_id
    from fleetstore.domain.operations import Operation

    s = store.sessions.create()
    m = store.messages.append(s.id, "assistant", "first part pangolin")
    store.search.catch_up()
    part = {"seq": 1, "kind": "text", "meta": {}, "enc": "str", "body": "later part armadillo"}
    args = {"message_id": m.id, "session_id": s.id, "parts": [part]}
    store.apply(Operation("import_parts", args, new_id()))
    assert store.search.status().queued == 1
    store.search.catch_up()
    assert len(find(store, "armadillo")) == 1 and len(find(store, "pangolin")) == 1


# -- an existing store: the migration's backfill ---------------------------------------------

_UNMIGRATE = {
    "sqlite": [
        "DELETE FROM fleetstore_migrations WHERE version >= 11",
        "ALTER TABLE effects DROP COLUMN trace_context",  # migration 0012
        *(
            f"DROP TRIGGER {t}"
            for t in (
                "search_message_added",
                "search_message_done",
                "search_message_gone",
                "search_part_changed",
                "search_part_removed",
                "search_chunk_changed",
                "search_session_added",
                "search_session_changed",
                "search_session_gone",
            )
        ),
        *(
            f"DROP TABLE {t}"
            for t in ("search_docs", "search_queue", "search_state", "search_words", "search_grams")
        ),
    ],
    "postgresql": [
        "DELETE FROM fleetstore_migrations WHERE version >= 11",
        "ALTER TABLE effects DROP COLUMN trace_context",  # migration 0012
        "DROP TABLE search_text, search_docs, search_queue, search_state",
        "DROP FUNCTION fleetstore_search_message, fleetstore_search_content, "
        "fleetstore_search_session, fleetstore_search_enqueue CASCADE",
    ],
}


def _as_before_search(store: Store) -> None:
    """Take every file of *store* back to the schema before migration 0011 (what a
    store made by the previous release holds; 0012's column too)."""

    def run(db: Any) -> None:
        def undo(tx: Any) -> None:
            for statement in _UNMIGRATE[db.dialect]:
                tx.execute(statement)

        db.run_write(undo)

    for key in store.search_files(session_id=None, root_id=None, project=None):
        store.with_file(key, run)


def test_an_existing_store_is_indexed_by_the_backfill_online_and_resumably(
    open_store: OpenStore,
) -> None:
    store = open_store("old.db", search_index=False)
    s = store.sessions.create(title="backfilled kinkajou")
    ids = [store.messages.append(s.id, "user", f"kinkajou {i}").id for i in range(250)]
    _as_before_search(store)
    store.close()

    store = open_store("old.db", search_index=False)  # migrates: tables, triggers, cursors
    status = store.search.status()
    # backfilling: the files with a backfill to do (a sharded store's catalog, and its shard)
    assert (status.backfill_done, status.backfill_total) == (0, 250) and status.backfilling >= 1
    assert find(store, "kinkajou") == [] and not status.current
    # new writes go to the queue, and are indexed first
    store.messages.append(s.id, "user", "kinkajou fresh")
    seen: list[tuple[int, int]] = []

    def stop() -> bool:  # after the first batch of the backfill's messages
        return bool(seen) and seen[-1][0] > 0

    store.search.catch_up(progress=lambda d, t: seen.append((d, t)), stop=stop)
    part = store.search.status()
    assert part.backfilling >= 1 and 0 < part.backfill_done < 250 and part.queued == 0
    assert len(find(store, "fresh")) == 1
    store.close()

    store = open_store("old.db", search_index=False)  # resumed where it stopped
    store.search.catch_up(progress=lambda d, t: seen.append((d, t)))
    assert store.search.status().current
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1] == (251, 251)
    found = find(store, "kinkajou")
    assert len(found) == 252  # the title, 250 messages and the new one, each once
    assert {h.message_id for h in store.search("kinkajou", limit=1000)} >= set(ids)


def test_the_status_says_how_far_behind_the_index_is(store: Store) -> None:
    status = store.search.status()
    assert status.current and status.queued == 0 and status.lag == 0.0
    s = store.sessions.create(title="lagging")
    store.messages.append(s.id, "user", "one")
    time.sleep(0.05)
    status = store.search.status()
    # (The queue's time is the database's clock, kept to the millisecond: 0.04999995
    # was seen for a 50 ms sleep.)
    assert status.queued == 2 and status.lag >= 0.045 and not status.current
    store.search.catch_up()
    status = store.search.status()
    assert status.current and status.sections == 2


def test_the_async_twin_returns_the_same_page(open_store: OpenStore) -> None:
    import asyncio

    from fleetstore import AsyncStore

    store = open_store(search_index=False)
    s = store.sessions.create()
    store.messages.append(s.id, "user", "dugong")

    async def run() -> tuple[Any, Any]:
        astore = AsyncStore(store)
        try:
            await astore.search.catch_up()
            return await astore.search("dugong"), await astore.search.status()
        finally:
            astore._executor.shutdown(wait=True)

    page, status = asyncio.run(run())
    assert page == store.search("dugong") and status == store.search.status()


def test_a_body_holding_a_nul_is_indexed_and_found(store: Store) -> None:
    """PostgreSQL text holds no NUL: a message body with one made the indexer's batch
    fail every time, and nothing after it was ever indexed."""
    s = store.sessions.create()
    first = store.messages.append(s.id, "user", "before\x00pangolin after")
    later = store.messages.append(s.id, "user", "a later tapir")
    store.search.catch_up()
    assert [h.message_id for h in store.search("pangolin")] == [first.id]
    assert [h.message_id for h in store.search("tapir")] == [later.id]
    assert [h.message_id for h in store.search("olin aft", match="substring")] == [first.id]


def test_rows_damaged_by_hand_do_not_stop_the_index_at_them(store: Store) -> None:
    """Session metadata that is not JSON and a tool call's part without its name (rows
    another program edited) made the indexer's batch fail every time, and nothing after
    them was indexed: the metadata is searched as it is stored, the damaged part is left
    out and the parts beside it are indexed."""
    s = store.sessions.create("okapi title")
    m = store.messages.append(
        s.id, "assistant", [Text("a narwhal here"), ToolCall("grep", {"q": "x"}, "c1")]
    )

    def damage(_key: Any, db: Any) -> None:
        db.run_write(
            lambda tx: (
                tx.execute("UPDATE sessions SET metadata = 'quokka {' WHERE id = ?", (s.id,)),
                tx.execute(
                    "UPDATE parts SET meta = '{}' WHERE message_id = ? AND seq = 1", (m.id,)
                ),
            )
        )

    store.backend.each(damage)
    later = store.messages.append(s.id, "user", "a later tapir")
    store.search.catch_up()
    assert [h.message_id for h in store.search("tapir")] == [later.id]
    assert [h.message_id for h in store.search("narwhal")] == [m.id]
    assert [(h.kind, h.session_id) for h in store.search("quokka")] == [("metadata", s.id)]
