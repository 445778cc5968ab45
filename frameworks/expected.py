"""The frameworks' own tests that fail on fleetstore's adapters, each with its reason.

Each is marked ``xfail(strict=True)``: if it starts to pass, the run fails until
its entry is removed.  Any other failure fails the run (``make frameworks``).
Keys are test node ids relative to the unpacked package (parameters included);
a key ending in ``[`` matches every parametrisation of the test.
"""

from __future__ import annotations

import pytest

#: Reasons that recur.
CONNECTIONS = (
    "reads or patches SQLiteSession's private sqlite3 plumbing (_connections, "
    "_connections_lock, _get_connection, _locked_connection, _lock, _insert_items): "
    "FleetstoreSession has none of it"
)
TABLES = (
    "opens the file with sqlite3 to read, drop or put triggers on SQLiteSession's own "
    "tables (agent_sessions, agent_messages): a fleetstore store has other tables"
)
CLEAR_THEN_ADD = (
    "injects failures into the SDK's two-write replacement (clear_session, then "
    "add_items) through a SQLiteSession subclass; FleetstoreSession replaces in one "
    "transaction (_atomic_replace_items), so that path is never taken"
)
CANCEL_SETTLES = (
    "expects a cancelled pop to wait for its outcome before re-raising; a cancelled "
    "FleetstoreSession call returns at once while its write runs to its end in its "
    "thread, and the session's later calls run after it (docs/integrations-openai-agents.md)"
)

EXPECTED: dict[str, dict[str, str]] = {
    "agents": {
        "tests/memory/test_session.py::test_sqlite_session_failed_clear_session_rolls_back": TABLES,
        "tests/memory/test_session.py::test_sqlite_session_failed_pop_item_releases_write_lock": TABLES,
        "tests/memory/test_session.py::test_sqlite_session_failed_add_items_releases_write_lock": TABLES,
        "tests/memory/test_session.py::test_sqlite_session_rollback_failure_evicts_connection": CONNECTIONS,
        "tests/memory/test_session.py::test_sqlite_session_close_retries_quarantined_connection": CONNECTIONS,
        "tests/memory/test_session.py::test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome[": CONNECTIONS,
        "tests/memory/test_session.py::test_sqlite_session_close_closes_worker_thread_connections": CONNECTIONS,
        "tests/memory/test_session.py::test_sqlite_session_reaps_connections_from_exited_worker_threads": CONNECTIONS,
        "tests/memory/test_session.py::test_sqlite_session_closes_retired_connections_before_the_next_allocation": CONNECTIONS,
        "tests/memory/test_session.py::test_sqlite_session_keeps_connections_of_live_worker_threads": CONNECTIONS,
        "tests/memory/test_session.py::test_sqlite_session_file_lock_is_shared_across_instances": CONNECTIONS,
        "tests/memory/test_session.py::test_sqlite_session_pop_item_skips_corrupt_most_recent": CONNECTIONS,
        "tests/memory/test_session.py::test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows": CONNECTIONS,
        "tests/memory/test_session.py::test_sqlite_session_get_items_limit_skips_corrupt_newest_rows": CONNECTIONS,
        "tests/memory/test_session.py::test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows": CONNECTIONS,
        "tests/memory/test_session.py::test_sqlite_session_closed_rejects_empty_add_items": (
            "matches the message 'SQLiteSession is closed'; a closed FleetstoreSession raises "
            "a RuntimeError too (SessionClosed), with its own name in the message"
        ),
        "tests/memory/test_compaction_suffix.py::test_suffix_transaction_rolls_back_failed_insert[": TABLES,
        "tests/memory/test_compaction_suffix.py::test_failed_encrypted_suffix_transaction_preserves_original_tokens[": TABLES,
        "tests/memory/test_compaction_suffix.py::test_cancelled_suffix_transaction_settles_before_newer_append[": CONNECTIONS,
        "tests/memory/test_openai_responses_compaction_session.py::TestOpenAIResponsesCompactionSession::test_settled_pop_failure_invalidates_response_chain[": CONNECTIONS,
        "tests/memory/test_openai_responses_compaction_session.py::TestOpenAIResponsesCompactionSession::test_settled_clear_failure_invalidates_response_chain[": CONNECTIONS,
        "tests/extensions/memory/test_encrypt_session.py::test_encrypted_compaction_restores_original_tokens_before_concurrent_append[": CLEAR_THEN_ADD,
        "tests/extensions/memory/test_encrypt_session.py::test_encrypted_pop_authentication_is_atomic_with_concurrent_mutations[": TABLES,
        "tests/extensions/memory/test_encrypt_session.py::test_encrypted_pop_wrong_key_preserves_row_identity": TABLES,
        "tests/extensions/memory/test_encrypt_session.py::test_encrypted_pop_cancellation_waits_for_authentication_rollback": CANCEL_SETTLES,
    },
    "langgraph": {},
}

#: Tests not run at all: they would wait forever (each on an event that only the
#: path they exercise sets), not fail.
DESELECTED: dict[str, dict[str, str]] = {
    "agents": {
        "tests/memory/test_openai_responses_compaction_session.py::TestOpenAIResponsesCompactionSession::test_cancel_restore_waits_for_mutation_lock_before_newer_writes": CLEAR_THEN_ADD,
        "tests/memory/test_openai_responses_compaction_session.py::TestOpenAIResponsesCompactionSession::test_exception_restore_drains_when_compaction_is_cancelled": CLEAR_THEN_ADD,
        "tests/extensions/memory/test_encrypt_session.py::test_encrypted_session_scan_budget_does_not_turn_redis_negative_limit_into_history": (
            "the SDK's RedisSession under fakeredis, no session of ours (it was skipped, "
            "fakeredis not being installed)"
        ),
    },
    "langgraph": {},
}


def _lookup(table: dict[str, str], nodeid: str) -> str | None:
    return table.get(nodeid) or table.get(nodeid.split("[", 1)[0] + "[")


def deselect(framework: str, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the DESELECTED tests from *items* (pytest reports them as deselected)."""
    dropped = [i for i in items if _lookup(DESELECTED[framework], i.nodeid) is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i not in dropped]


def mark_expected(framework: str, items: list[pytest.Item]) -> None:
    expected = EXPECTED[framework]
    for item in items:
        reason = _lookup(expected, item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
