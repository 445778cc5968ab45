-- PostgreSQL's text of the queries of sql/common/adk.sql that differ here: the
-- same names, parameters and result columns.
-- A negative limit means no limit, as on SQLite: LIMIT nullif(greatest(n, -1), -1)
-- is PostgreSQL's LIMIT NULL (all rows) for those, LIMIT n otherwise.

-- adk_session_list: a page of an app's sessions (of one user, or all), in ADK's order
SELECT app_name, user_id, session_id, fs_id, revision, create_time, update_time
FROM adk_sessions
WHERE app_name = :app_name
  AND (:user_id IS NULL OR user_id = :user_id)
  AND (:after_time IS NULL
       OR (update_time, user_id, session_id) > (:after_time, :after_user, :after_session))
  AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = adk_sessions.fs_id AND s.job IS NOT NULL)
ORDER BY update_time, user_id, session_id
LIMIT nullif(greatest(:limit, -1), -1)

-- adk_last_event: the ADK event id of a session's last event (no row if it has none)
SELECT metadata::json ->> 'adk_event_id' FROM messages
WHERE session_id = ? ORDER BY seq DESC LIMIT 1

-- adk_events: a session's events (part 0 of its messages), newest first, optionally
-- only those at or after a time and at most :limit (-1: all)
SELECT m.seq, p.enc, p.body, p.blob_sha, p.size
FROM messages m JOIN parts p ON p.message_id = m.id AND p.seq = 0
WHERE m.session_id = :fs_id
  AND (m.metadata::json ->> 'adk_event_id') IS NOT NULL
  AND (:after IS NULL OR m.created_at >= :after)
ORDER BY m.seq DESC
LIMIT nullif(greatest(:limit, -1), -1)

-- adk_events_by_time: adk_events newest timestamp first, ties newest append first
-- (ADK's SqliteSessionService order; the event's timestamp is the message's created_at)
SELECT m.seq, p.enc, p.body, p.blob_sha, p.size
FROM messages m JOIN parts p ON p.message_id = m.id AND p.seq = 0
WHERE m.session_id = :fs_id
  AND (m.metadata::json ->> 'adk_event_id') IS NOT NULL
  AND (:after IS NULL OR m.created_at >= :after)
ORDER BY m.created_at DESC, m.seq DESC
LIMIT nullif(greatest(:limit, -1), -1)

-- adk_events_by_time_id: adk_events newest timestamp first, ties by event id, greatest
-- first (ADK's DatabaseSessionService order)
SELECT m.seq, p.enc, p.body, p.blob_sha, p.size
FROM messages m JOIN parts p ON p.message_id = m.id AND p.seq = 0
WHERE m.session_id = :fs_id
  AND (m.metadata::json ->> 'adk_event_id') IS NOT NULL
  AND (:after IS NULL OR m.created_at >= :after)
ORDER BY m.created_at DESC, (m.metadata::json ->> 'adk_event_id') COLLATE "C" DESC
LIMIT nullif(greatest(:limit, -1), -1)

-- adk_states_of_sessions: the session state values of the sessions in the JSON array ?
SELECT session_id, key, enc, value, blob_sha, size FROM state
WHERE session_id IN (SELECT json_array_elements_text(?::json)) AND namespace = 'adk'

-- adk_app_state_put: set one app state value
INSERT INTO adk_app_state (app_name, key, enc, value, blob_sha, size, updated_at)
VALUES (?, ?, ?, fleetstore_bytes(?), ?, ?, ?)
ON CONFLICT (app_name, key) DO UPDATE SET
    enc = excluded.enc, value = excluded.value, blob_sha = excluded.blob_sha,
    size = excluded.size, updated_at = excluded.updated_at

-- adk_user_state_put: set one user state value
INSERT INTO adk_user_state (app_name, user_id, key, enc, value, blob_sha, size, updated_at)
VALUES (?, ?, ?, ?, fleetstore_bytes(?), ?, ?, ?)
ON CONFLICT (app_name, user_id, key) DO UPDATE SET
    enc = excluded.enc, value = excluded.value, blob_sha = excluded.blob_sha,
    size = excluded.size, updated_at = excluded.updated_at
