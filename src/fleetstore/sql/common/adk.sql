-- Google ADK sessions (fleetstore/adk_ops.py, fleetstore/integrations/adk.py,
-- fleetstore/integrations/adk_import.py); tables in migration 0005.

-- adk_session_by_name: an ADK session's row, by its ADK names (none while its session is being deleted)
SELECT fs_id, revision, create_time, update_time FROM adk_sessions a
WHERE app_name = ? AND user_id = ? AND session_id = ?
  AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = a.fs_id AND s.job IS NOT NULL)

-- adk_session_by_fs: an ADK session's row, by its fleetstore session id
SELECT app_name, user_id, session_id, revision, create_time, update_time FROM adk_sessions
WHERE fs_id = ?

-- adk_session_insert: a new ADK session (its fleetstore session row exists)
INSERT INTO adk_sessions (app_name, user_id, session_id, fs_id, revision, create_time, update_time)
VALUES (?, ?, ?, ?, ?, ?, ?)

-- adk_session_revise: a write to the session: its new revision and update time
UPDATE adk_sessions SET revision = ?, update_time = ? WHERE fs_id = ?

-- adk_session_list: a page of an app's sessions (of one user, or all), in ADK's order
SELECT app_name, user_id, session_id, fs_id, revision, create_time, update_time
FROM adk_sessions
WHERE app_name = :app_name
  AND (:user_id IS NULL OR user_id = :user_id)
  AND (:after_time IS NULL
       OR (update_time, user_id, session_id) > (:after_time, :after_user, :after_session))
  AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = adk_sessions.fs_id AND s.job IS NOT NULL)
ORDER BY update_time, user_id, session_id
LIMIT :limit

-- adk_last_event: the ADK event id of a session's last event (no row if it has none)
SELECT json_extract(metadata, '$.adk_event_id') FROM messages
WHERE session_id = ? ORDER BY seq DESC LIMIT 1

-- adk_event_part: the stored event of a message (its part 0)
SELECT enc, body, blob_sha, size FROM parts WHERE message_id = ? AND seq = 0

-- adk_events: a session's events (part 0 of its messages), newest first, optionally
-- only those at or after a time and at most :limit (-1: all)
SELECT m.seq, p.enc, p.body, p.blob_sha, p.size
FROM messages m JOIN parts p ON p.message_id = m.id AND p.seq = 0
WHERE m.session_id = :fs_id
  AND json_extract(m.metadata, '$.adk_event_id') IS NOT NULL
  AND (:after IS NULL OR m.created_at >= :after)
ORDER BY m.seq DESC
LIMIT :limit

-- adk_events_by_time: adk_events newest timestamp first, ties newest append first
-- (ADK's SqliteSessionService order; the event's timestamp is the message's created_at)
SELECT m.seq, p.enc, p.body, p.blob_sha, p.size
FROM messages m JOIN parts p ON p.message_id = m.id AND p.seq = 0
WHERE m.session_id = :fs_id
  AND json_extract(m.metadata, '$.adk_event_id') IS NOT NULL
  AND (:after IS NULL OR m.created_at >= :after)
ORDER BY m.created_at DESC, m.seq DESC
LIMIT :limit

-- adk_events_by_time_id: adk_events newest timestamp first, ties by event id, greatest
-- first (ADK's DatabaseSessionService order)
SELECT m.seq, p.enc, p.body, p.blob_sha, p.size
FROM messages m JOIN parts p ON p.message_id = m.id AND p.seq = 0
WHERE m.session_id = :fs_id
  AND json_extract(m.metadata, '$.adk_event_id') IS NOT NULL
  AND (:after IS NULL OR m.created_at >= :after)
ORDER BY m.created_at DESC, json_extract(m.metadata, '$.adk_event_id') DESC
LIMIT :limit

-- adk_session_state: a session's own state values (namespace 'adk')
SELECT key, enc, value, blob_sha, size FROM state WHERE session_id = ? AND namespace = 'adk'

-- adk_states_of_sessions: the session state values of the sessions in the JSON array ?
SELECT session_id, key, enc, value, blob_sha, size FROM state
WHERE session_id IN (SELECT value FROM json_each(?)) AND namespace = 'adk'

-- adk_app_state: an app's state values
SELECT key, enc, value, blob_sha, size FROM adk_app_state WHERE app_name = ?

-- adk_app_state_key: one app state value
SELECT enc, value, blob_sha, size FROM adk_app_state WHERE app_name = ? AND key = ?

-- adk_app_state_put: set one app state value
INSERT INTO adk_app_state (app_name, key, enc, value, blob_sha, size, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (app_name, key) DO UPDATE SET
    enc = excluded.enc, value = excluded.value, blob_sha = excluded.blob_sha,
    size = excluded.size, updated_at = excluded.updated_at

-- adk_user_state: one user's state values in an app
SELECT key, enc, value, blob_sha, size FROM adk_user_state WHERE app_name = ? AND user_id = ?

-- adk_user_state_key: one user state value
SELECT enc, value, blob_sha, size FROM adk_user_state
WHERE app_name = ? AND user_id = ? AND key = ?

-- adk_user_states_of_app: every user's state values in an app
SELECT user_id, key, enc, value, blob_sha, size FROM adk_user_state WHERE app_name = ?

-- adk_user_state_put: set one user state value
INSERT INTO adk_user_state (app_name, user_id, key, enc, value, blob_sha, size, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (app_name, user_id, key) DO UPDATE SET
    enc = excluded.enc, value = excluded.value, blob_sha = excluded.blob_sha,
    size = excluded.size, updated_at = excluded.updated_at
