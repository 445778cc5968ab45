"""Lists that were cut say so: ``sessions.list`` and ``effects.list`` return a ``Page``
(a list with ``more`` and ``next_cursor``), sync and async, on every engine; the CLI
pages through everything with ``--all`` and says when a list was cut.

Issue 28: both stopped at 100 without a word, and a program reported 100 effects of 481.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner

import fleetstore
from fleetstore import Page, Store
from fleetstore.cli import effects as effects_cli
from fleetstore.cli import sessions as sessions_cli
from fleetstore.cli.main import main


def test_481_effects_listed_100_at_a_time_say_there_are_more(store: Store) -> None:
    ids = [store.effects.enqueue(f"t{i % 7}", "k", {"i": i}) for i in range(481)]
    first = store.effects.list()
    assert isinstance(first, Page) and isinstance(first, list)
    assert len(first) == 100 and first.more and first.next_cursor == first[-1]
    seen, page = list(first), first
    while page.more:
        page = store.effects.list(after=page.next_cursor)
        seen += page
    assert page.next_cursor is None
    assert sorted(e.id for e in seen) == sorted(ids) and len(seen) == 481
    assert seen == sorted(seen, key=lambda e: (e.thread_key, e.seq))
    # Exactly full: nothing more, and it says so.
    whole = store.effects.list(limit=481)
    assert len(whole) == 481 and not whole.more and whole.next_cursor is None


def test_sessions_pages_cover_every_session_once_newest_first(store: Store) -> None:
    made = [store.sessions.create(title=f"s{i}").id for i in range(7)]
    pages = [store.sessions.list(limit=3)]
    while pages[-1].more:
        pages.append(store.sessions.list(limit=3, before=pages[-1].next_cursor))
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [p.more for p in pages] == [True, True, False]
    listed = [s.id for p in pages for s in p]
    assert listed == sorted(made, reverse=True)
    assert pages[0].next_cursor == pages[0][-1].id
    assert store.sessions.list() == store.sessions.list(limit=7)  # still compares as a list
    assert not store.sessions.list(limit=7).more


def test_the_async_twins_return_the_same_pages(store: Store) -> None:
    for i in range(3):
        store.sessions.create(title=f"s{i}")
        store.effects.enqueue("th", "k", i)

    async def run() -> tuple[Page[fleetstore.Session, str], Page[fleetstore.Effect, object]]:
        astore = fleetstore.AsyncStore(store)
        return await astore.sessions.list(limit=2), await astore.effects.list(limit=2)

    sessions, effects = asyncio.run(run())
    assert isinstance(sessions, Page) and sessions.more and len(sessions) == 2
    assert sessions == store.sessions.list(limit=2)
    assert isinstance(effects, Page) and effects.more and effects.next_cursor == effects[-1]


# --- the CLI ------------------------------------------------------------------------------


def invoke(*args: str) -> tuple[int, str, str]:
    done = CliRunner().invoke(main, list(args))
    return done.exit_code, done.stdout, done.stderr


def test_effects_list_says_when_it_was_cut_and_all_pages_through_everything(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = {store.effects.enqueue(f"t{i % 3}", "k", i) for i in range(25)}
    url = str(store.url)
    store.close()  # the CLI reads a SQLite store strictly read-only: not one open here
    code, out, err = invoke("effects", "list", "--store", url, "--limit", "10")
    assert code == 0 and len(out.splitlines()) == 1 + 10  # a header, then 10 rows
    assert "10 effect(s) shown; more not shown (cut at --limit 10" in err
    assert "25 pending" in err
    monkeypatch.setattr(effects_cli, "PAGE", 4)  # several pages of the --all read
    code, out, err = invoke("effects", "list", "--store", url, "--all", "--json")
    assert code == 0 and {json.loads(line)["id"] for line in out.splitlines()} == ids
    assert len(out.splitlines()) == 25 and "more not shown" not in err
    code, out, err = invoke("effects", "list", "--store", url, "--limit", "25", "--json")
    assert len(out.splitlines()) == 25 and "more not shown" not in err


def test_sessions_list_says_when_it_was_cut_and_all_pages_through_everything(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = [store.sessions.create(title=f"s{i}").id for i in range(11)]
    url = str(store.url)
    store.close()
    monkeypatch.setattr(sessions_cli, "PAGE", 3)  # pages end inside --limit and --all
    code, out, err = invoke("sessions", "list", "--store", url, "--limit", "5", "--json")
    listed = [json.loads(line)["id"] for line in out.splitlines()]
    assert code == 0 and listed == sorted(made, reverse=True)[:5], err
    assert "5 session(s) shown; more not shown" in err
    code, out, err = invoke("sessions", "list", "--store", url, "--all", "--json")
    listed = [json.loads(line)["id"] for line in out.splitlines()]
    assert listed == sorted(made, reverse=True) and "more not shown" not in err
    code, out, err = invoke("sessions", "list", "--store", url, "--limit", "11")
    assert code == 0 and "more not shown" not in err and all(s in out for s in made)
