-- OpenAI Agents SDK sessions (fleetstore.domain.frameworks.openai_agents): one fleetstore session per
-- SDK session, one message per item.  The sessions are told apart by their
-- metadata key "openai_agents".

-- agt_last_message: the id of a session's last message (no row if it has none)
SELECT id FROM messages WHERE session_id = ? ORDER BY seq DESC LIMIT 1

-- agt_message_delete: remove one message (its parts, chunks and usage cascade)
DELETE FROM messages WHERE id = ?

-- agt_messages_clear: remove every message of a session, keeping the session
DELETE FROM messages WHERE session_id = ?

-- agt_session_list: the adapter's sessions, newest first, after a (created_at, id) cursor
SELECT s.id, json_extract(s.metadata, '$.openai_agents.session_id'), s.created_at, s.updated_at,
       (SELECT count(*) FROM messages m WHERE m.session_id = s.id)
FROM sessions s
WHERE json_extract(s.metadata, '$.openai_agents.session_id') IS NOT NULL
  AND (:before_at IS NULL OR s.created_at < :before_at
       OR (s.created_at = :before_at AND s.id < :before_id))
  AND s.job IS NULL
ORDER BY s.created_at DESC, s.id DESC
LIMIT :limit

-- agt_message_ids: the ids of a session's messages in order (none of a session being deleted or forked)
WITH s(id) AS (SELECT ?)
SELECT id FROM messages WHERE session_id = (SELECT id FROM s)
  AND NOT EXISTS (SELECT 1 FROM sessions x WHERE x.id = (SELECT id FROM s) AND x.job IS NOT NULL)
ORDER BY seq

-- agt_item_count: how many items (messages) a session holds (none: one being deleted or forked)
WITH s(id) AS (SELECT ?)
SELECT count(*) FROM messages WHERE session_id = (SELECT id FROM s)
  AND NOT EXISTS (SELECT 1 FROM sessions x WHERE x.id = (SELECT id FROM s) AND x.job IS NOT NULL)
