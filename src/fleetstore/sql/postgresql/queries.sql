-- PostgreSQL's text of the queries of sql/common/queries.sql that differ here: the
-- same names, parameters and result columns.
-- Inline bodies go through fleetstore_bytes() (migration 0001):
-- a text body is stored as its UTF-8 bytes.  JSON (parameters, stored metadata) is
-- read as json, not jsonb: jsonb refuses some valid JSON text (the escape \u0000),
-- and one such row would fail every query that scans it.
-- A negative limit means no limit, as on SQLite: LIMIT nullif(greatest(n, -1), -1)
-- is PostgreSQL's LIMIT NULL (all rows) for those, LIMIT n otherwise.

-- session_touch: a message was added or finished
UPDATE sessions SET updated_at = GREATEST(updated_at, ?) WHERE id = ?

-- session_list: sessions, newest first, filtered; NULL filters match all
SELECT id, root_id, parent_id, forked_from, fork_seq, project, title, status, metadata,
       created_at, updated_at, archived_at, version
FROM sessions
WHERE (:project IS NULL OR project = :project)
  AND (:parent_id IS NULL OR parent_id = :parent_id)
  AND (:root_id IS NULL OR root_id = :root_id)
  AND (CAST(:include_archived AS boolean) OR status = 'active')
  AND (:before IS NULL OR id < :before)
  AND job IS NULL
ORDER BY id DESC
LIMIT nullif(greatest(:limit, -1), -1)

-- message_last_seq: the highest message seq of a session (0 if none); the session row is touched first (an update that changes nothing), so two concurrent appends to one session conflict on that row (40001, started over) instead of both taking the same seq
WITH s AS (SELECT ?::text AS id),
touched AS (UPDATE sessions SET updated_at = updated_at WHERE id = (SELECT id FROM s) RETURNING 1)
SELECT coalesce(max(seq), 0)::bigint FROM messages
WHERE session_id = (SELECT id FROM s) AND (SELECT count(*) FROM touched) >= 0

-- message_list: messages of a session in order, from a seq on (none of a session being deleted or forked)
SELECT id, session_id, seq, role, status, model, metadata, error, created_at, completed_at
FROM messages WHERE session_id = :session_id AND seq > :after
  AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = :session_id AND s.job IS NOT NULL)
ORDER BY seq LIMIT nullif(greatest(:limit, -1), -1)

-- message_list_last: the last messages of a session (newest first; none of a session being deleted or forked)
SELECT id, session_id, seq, role, status, model, metadata, error, created_at, completed_at
FROM messages WHERE session_id = :session_id
  AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = :session_id AND s.job IS NOT NULL)
ORDER BY seq DESC LIMIT nullif(greatest(:limit, -1), -1)

-- part_insert: a whole part
INSERT INTO parts (message_id, seq, session_id, kind, meta, enc, body, blob_sha, size)
VALUES (?, ?, ?, ?, ?, ?, fleetstore_bytes(?), ?, ?)

-- parts_of_messages: the parts of the messages listed in the JSON array ?
SELECT p.message_id, p.seq, p.kind, p.meta, p.enc, p.body, p.blob_sha, p.size,
       CASE WHEN p.enc = 'chunks'
            THEN (SELECT string_agg(c.text, '' ORDER BY c.seq) FROM chunks c
                  WHERE c.message_id = p.message_id AND c.part_seq = p.seq)
       END
FROM parts p WHERE p.message_id IN (SELECT json_array_elements_text(?::json))
ORDER BY p.message_id, p.seq

-- usage_of_messages: usage of the messages listed in the JSON array ?
SELECT message_id, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
       reasoning_tokens, cost
FROM usage WHERE message_id IN (SELECT json_array_elements_text(?::json))

-- usage_total: tokens and cost of a session
SELECT count(*), coalesce(sum(input_tokens), 0)::bigint, coalesce(sum(output_tokens), 0)::bigint,
       coalesce(sum(cache_read_tokens), 0)::bigint, coalesce(sum(cache_write_tokens), 0)::bigint,
       coalesce(sum(reasoning_tokens), 0)::bigint, coalesce(sum(cost), 0)
FROM usage WHERE session_id = ?

-- purge_chunks: up to :limit streamed chunks of a session's messages
DELETE FROM chunks WHERE ctid IN (
    SELECT c.ctid FROM messages m JOIN chunks c ON c.message_id = m.id
    WHERE m.session_id = :id LIMIT :limit
)
RETURNING 1

-- state_upsert: write a state value
INSERT INTO state (session_id, namespace, key, version, enc, value, blob_sha, size, updated_at)
VALUES (?, ?, ?, ?, ?, fleetstore_bytes(?), ?, ?, ?)
ON CONFLICT (session_id, namespace, key) DO UPDATE SET
    version = excluded.version, enc = excluded.enc, value = excluded.value,
    blob_sha = excluded.blob_sha, size = excluded.size, updated_at = excluded.updated_at
