-- PostgreSQL's text of the queries of sql/common/maintenance.sql that differ here: the
-- same names, parameters and result columns.
-- Where SQLite counts a batched delete with changes(), which
-- PostgreSQL lacks, the delete here also returns one row per row deleted.  The
-- page figures (mnt_pages, mnt_auto_vacuum) describe SQLite's file; here they are
-- the database's size in blocks, no free list and no auto-vacuum.
-- A negative limit means no limit, as on SQLite: LIMIT nullif(greatest(n, -1), -1)
-- is PostgreSQL's LIMIT NULL (all rows) for those, LIMIT n otherwise.

-- mnt_tree_freshness: a session tree's sessions, and its newest write (session rows and state)
WITH RECURSIVE tree(id) AS (
    SELECT id FROM sessions WHERE id = :id
    UNION ALL
    SELECT s.id FROM sessions s JOIN tree t ON s.parent_id = t.id
)
SELECT (SELECT count(*) FROM tree),
       (SELECT max(GREATEST(updated_at, created_at)) FROM sessions WHERE id IN (SELECT id FROM tree)),
       (SELECT max(updated_at) FROM state WHERE session_id IN (SELECT id FROM tree))

-- mnt_tree_delete_messages: up to :limit messages of a session tree (parts, chunks, usage cascade)
WITH RECURSIVE tree(id) AS (
    SELECT id FROM sessions WHERE id = :id
    UNION ALL
    SELECT s.id FROM sessions s JOIN tree t ON s.parent_id = t.id
)
DELETE FROM messages WHERE id IN (
    SELECT m.id FROM tree JOIN messages m ON m.session_id = tree.id
    LIMIT nullif(greatest(:limit, -1), -1)
)
RETURNING 1

-- mnt_tree_delete_state: up to :limit state values of a session tree
WITH RECURSIVE tree(id) AS (
    SELECT id FROM sessions WHERE id = :id
    UNION ALL
    SELECT s.id FROM sessions s JOIN tree t ON s.parent_id = t.id
)
DELETE FROM state WHERE (session_id, namespace, key) IN (
    SELECT st.session_id, st.namespace, st.key FROM tree JOIN state st ON st.session_id = tree.id
    LIMIT nullif(greatest(:limit, -1), -1)
)
RETURNING 1

-- mnt_session_tree_rows: every session's id, parent and last update, for picking old trees (not those being deleted or forked)
SELECT id, parent_id, GREATEST(updated_at, created_at), status FROM sessions

-- mnt_blob_referrers: every (table, column) with a foreign key to blobs(sha256)
SELECT t.relname::text, a.attname::text
FROM pg_constraint f
JOIN pg_class t ON t.oid = f.conrelid
JOIN pg_attribute a ON a.attrelid = f.conrelid AND a.attnum = ANY (f.conkey)
WHERE f.contype = 'f'
  AND f.confrelid = to_regclass('blobs')
ORDER BY t.relname::text COLLATE "C", a.attname::text COLLATE "C"

-- mnt_blob_rows: every blob row (hash, stored size), in hash order, from a hash on
SELECT sha256, stored_size FROM blobs WHERE sha256 > ? ORDER BY sha256 LIMIT nullif(greatest(?, -1), -1)

-- mnt_json_ids: the strings of a JSON array, as rows (a fragment: WHERE x IN (this))
SELECT json_array_elements_text(?::json)

-- mnt_ops_page: applied_ops rows in key order within (after, below), at most limit
SELECT op_id, applied_at FROM applied_ops WHERE op_id > ? AND op_id < ? ORDER BY op_id LIMIT nullif(greatest(?, -1), -1)

-- mnt_pages: the database's page size, page count and free pages
SELECT current_setting('block_size')::bigint,
       pg_database_size(current_database()) / current_setting('block_size')::bigint,
       0::bigint

-- mnt_auto_vacuum: 0 none, 1 full, 2 incremental
SELECT 0::bigint

-- mnt_sessions_list: sessions newest first (by last update), filtered, after an (updated_at, id) cursor; NULL filters match all
SELECT s.id, s.parent_id, s.project, s.title, s.status, s.created_at, s.updated_at,
       (SELECT count(*) FROM messages m WHERE m.session_id = s.id), s.metadata
FROM sessions s
WHERE (:project IS NULL OR s.project = :project)
  AND (:since IS NULL OR s.updated_at >= :since)
  AND (CAST(:include_archived AS boolean) OR s.status = 'active')
  AND (NOT CAST(:roots AS boolean) OR s.parent_id IS NULL)
  AND (:after_updated IS NULL OR s.updated_at < :after_updated
       OR (s.updated_at = :after_updated AND s.id < :after_id))
ORDER BY s.updated_at DESC, s.id DESC
LIMIT nullif(greatest(:limit, -1), -1)

-- mnt_session_state_count: a session's state values and their inline bytes
SELECT count(*), coalesce(sum(octet_length(value)), 0)::bigint FROM state WHERE session_id = ?

-- mnt_session_inline_bytes: a session's inline part bytes, and streamed chunk bytes
SELECT (SELECT coalesce(sum(octet_length(body)), 0)::bigint FROM parts WHERE session_id = :id),
       (SELECT coalesce(sum(octet_length(c.text)), 0)::bigint
        FROM messages m JOIN chunks c ON c.message_id = m.id WHERE m.session_id = :id)

-- mnt_session_blob_bytes: the blobs a session refers to: count, stored and original bytes
SELECT count(*), coalesce(sum(b.stored_size), 0)::bigint, coalesce(sum(b.size), 0)::bigint
FROM blobs b WHERE b.sha256 IN (
    SELECT blob_sha FROM parts WHERE session_id = :id AND blob_sha IS NOT NULL
    UNION
    SELECT blob_sha FROM state WHERE session_id = :id AND blob_sha IS NOT NULL
)

-- mnt_stats_parts: inline part bytes per session
SELECT session_id, coalesce(sum(octet_length(body)), 0)::bigint FROM parts GROUP BY session_id

-- mnt_stats_chunks: streamed chunk bytes per session
SELECT m.session_id, sum(octet_length(c.text))::bigint
FROM chunks c JOIN messages m ON m.id = c.message_id GROUP BY m.session_id

-- mnt_stats_state: inline state bytes per session
SELECT session_id, coalesce(sum(octet_length(value)), 0)::bigint FROM state GROUP BY session_id

-- mnt_stats_session_blobs: stored bytes of the blobs each session refers to (a shared blob counts in each)
SELECT x.session_id, count(*), sum(b.stored_size)::bigint
FROM (SELECT DISTINCT session_id, blob_sha FROM parts WHERE blob_sha IS NOT NULL
      UNION
      SELECT session_id, blob_sha FROM state WHERE blob_sha IS NOT NULL) x
JOIN blobs b ON b.sha256 = x.blob_sha
GROUP BY x.session_id

-- mnt_stats_langgraph: LangGraph checkpoints, channel values and pending writes, and their payload bytes
SELECT (SELECT count(*) FROM ckpt_checkpoints), (SELECT count(*) FROM ckpt_channels),
       (SELECT count(*) FROM ckpt_writes),
       (SELECT coalesce(sum(size), 0)::bigint FROM ckpt_checkpoints)
       + (SELECT coalesce(sum(size), 0)::bigint FROM ckpt_channels)
       + (SELECT coalesce(sum(size), 0)::bigint FROM ckpt_writes)

-- mnt_langgraph_threads: LangGraph threads, last checkpoint first: checkpoints, last checkpoint time, pending writes, payload bytes (checkpoints, channel values, writes); limit -1: all
SELECT t.thread_id, t.checkpoints, t.last, coalesce(w.n, 0),
       t.bytes + coalesce(c.bytes, 0) + coalesce(w.bytes, 0)
FROM (SELECT thread_id, count(*) AS checkpoints, max(created_at) AS last,
             sum(size)::bigint AS bytes
      FROM ckpt_checkpoints GROUP BY thread_id) t
LEFT JOIN (SELECT thread_id, sum(size)::bigint AS bytes FROM ckpt_channels GROUP BY thread_id) c
       ON c.thread_id = t.thread_id
LEFT JOIN (SELECT thread_id, count(*) AS n, sum(size)::bigint AS bytes
           FROM ckpt_writes GROUP BY thread_id) w
       ON w.thread_id = t.thread_id
ORDER BY t.last DESC, t.thread_id
LIMIT nullif(greatest(:limit, -1), -1)

-- red_part_set: a part's body replaced by its redacted one
UPDATE parts SET enc = :enc, body = fleetstore_bytes(:body), blob_sha = :blob_sha, size = :size
WHERE message_id = :message_id AND seq = :seq

-- red_state_set: a state value replaced by its redacted one (its version kept)
UPDATE state SET enc = :enc, value = fleetstore_bytes(:body), blob_sha = :blob_sha, size = :size
WHERE session_id = :session_id AND namespace = :namespace AND key = :key

-- red_effect_set: an effect's payload, result and errors replaced by their redacted ones
UPDATE effects SET enc = :enc, payload = fleetstore_bytes(:body), blob_sha = :blob_sha, size = :size,
                   result = :result, last_error = :last_error, errors = :errors
WHERE id = :id
