-- PostgreSQL's text of the queries of sql/common/agents.sql that differ here: the
-- same names, parameters and result columns.
-- A negative limit means no limit, as on SQLite: LIMIT nullif(greatest(n, -1), -1)
-- is PostgreSQL's LIMIT NULL (all rows) for those, LIMIT n otherwise.

-- agt_session_list: the adapter's sessions, newest first, after a (created_at, id) cursor
SELECT s.id, s.metadata::json #>> '{openai_agents,session_id}', s.created_at, s.updated_at,
       (SELECT count(*) FROM messages m WHERE m.session_id = s.id)
FROM sessions s
WHERE (s.metadata::json #>> '{openai_agents,session_id}') IS NOT NULL
  AND (:before_at IS NULL OR s.created_at < :before_at
       OR (s.created_at = :before_at AND s.id < :before_id))
  AND s.job IS NULL
ORDER BY s.created_at DESC, s.id DESC
LIMIT nullif(greatest(:limit, -1), -1)

-- agt_message_ids: the ids of a session's messages in order (none of a session being deleted or forked)
WITH s(id) AS (SELECT ?::text)
SELECT id FROM messages WHERE session_id = (SELECT id FROM s)
  AND NOT EXISTS (SELECT 1 FROM sessions x WHERE x.id = (SELECT id FROM s) AND x.job IS NOT NULL)
ORDER BY seq

-- agt_item_count: how many items (messages) a session holds (none: one being deleted or forked)
WITH s(id) AS (SELECT ?::text)
SELECT count(*) FROM messages WHERE session_id = (SELECT id FROM s)
  AND NOT EXISTS (SELECT 1 FROM sessions x WHERE x.id = (SELECT id FROM s) AND x.job IS NOT NULL)
