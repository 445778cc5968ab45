-- Maintenance, retention and statistics (fleetstore/domain/maintenance.py,
-- fleetstore/admin/maintain/, fleetstore/cli/sessions.py).  Deletes are batched: each
-- statement touches at most :limit rows, so no transaction holds the lock long whatever
-- the store's size.

-- mnt_tree_freshness: a session tree's sessions, and its newest write (session rows and state)
WITH RECURSIVE tree(id) AS (
    SELECT id FROM sessions WHERE id = :id
    UNION ALL
    SELECT s.id FROM sessions s JOIN tree t ON s.parent_id = t.id
)
SELECT (SELECT count(*) FROM tree),
       (SELECT max(max(updated_at, created_at)) FROM sessions WHERE id IN tree),
       (SELECT max(updated_at) FROM state WHERE session_id IN tree)

-- mnt_tree_delete_messages: up to :limit messages of a session tree (parts, chunks, usage cascade)
WITH RECURSIVE tree(id) AS (
    SELECT id FROM sessions WHERE id = :id
    UNION ALL
    SELECT s.id FROM sessions s JOIN tree t ON s.parent_id = t.id
)
DELETE FROM messages WHERE id IN (
    SELECT m.id FROM tree JOIN messages m ON m.session_id = tree.id LIMIT :limit
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
    LIMIT :limit
)
RETURNING 1

-- mnt_tree_delete_sessions: the (now empty) sessions of a tree; subagents go by ON DELETE CASCADE
DELETE FROM sessions WHERE id = :id

-- mnt_session_tree_rows: every session's id, parent and last update, for picking old trees (not those being deleted or forked)
SELECT id, parent_id, max(updated_at, created_at), status FROM sessions

-- mnt_state_newest: the newest state write per session
SELECT session_id, max(updated_at) FROM state GROUP BY session_id

-- mnt_blob_referrers: every (table, column) with a foreign key to blobs(sha256)
SELECT m.name, f."from"
FROM sqlite_master m, pragma_foreign_key_list(m.name) f
WHERE m.type = 'table' AND f."table" = 'blobs'
ORDER BY m.name, f."from"

-- mnt_blob_rows: every blob row (hash, stored size), in hash order, from a hash on
SELECT sha256, stored_size FROM blobs WHERE sha256 > ? ORDER BY sha256 LIMIT ?

-- mnt_blob_delete: a blob row (its bytes go after the commit: the file, or the chunks on PostgreSQL)
DELETE FROM blobs WHERE sha256 = ? RETURNING 1

-- mnt_json_ids: the strings of a JSON array, as rows (a fragment: WHERE x IN (this))
SELECT value FROM json_each(?)

-- mnt_blob_exists: is there a row for this blob?
SELECT 1 FROM blobs WHERE sha256 = ?

-- mnt_ops_page: applied_ops rows in key order within (after, below), at most limit
SELECT op_id, applied_at FROM applied_ops WHERE op_id > ? AND op_id < ? ORDER BY op_id LIMIT ?

-- mnt_ops_delete: one applied_ops row, if it is still older than the horizon
DELETE FROM applied_ops WHERE op_id = ? AND applied_at < ? RETURNING 1

-- mnt_ops_count: applied_ops rows, and the oldest application
SELECT count(*), min(applied_at) FROM applied_ops

-- mnt_pages: the database's page size, page count and free pages
SELECT (SELECT page_size FROM pragma_page_size()), (SELECT page_count FROM pragma_page_count()),
       (SELECT freelist_count FROM pragma_freelist_count())

-- mnt_auto_vacuum: 0 none, 1 full, 2 incremental
SELECT auto_vacuum FROM pragma_auto_vacuum()

-- mnt_sessions_list: sessions newest first (by last update), filtered, after an (updated_at, id) cursor; NULL filters match all
SELECT s.id, s.parent_id, s.project, s.title, s.status, s.created_at, s.updated_at,
       (SELECT count(*) FROM messages m WHERE m.session_id = s.id), s.metadata
FROM sessions s
WHERE (:project IS NULL OR s.project = :project)
  AND (:since IS NULL OR s.updated_at >= :since)
  AND (:include_archived OR s.status = 'active')
  AND (NOT :roots OR s.parent_id IS NULL)
  AND (:after_updated IS NULL OR s.updated_at < :after_updated
       OR (s.updated_at = :after_updated AND s.id < :after_id))
ORDER BY s.updated_at DESC, s.id DESC
LIMIT :limit

-- mnt_session_messages: a session's message count per role and status, and its first and last
SELECT role, status, count(*), min(created_at), max(coalesce(completed_at, created_at))
FROM messages WHERE session_id = ? GROUP BY role, status ORDER BY role, status

-- mnt_session_children: a session's subagent sessions
SELECT id FROM sessions WHERE parent_id = ? ORDER BY id

-- mnt_session_state_count: a session's state values and their inline bytes
SELECT count(*), coalesce(sum(octet_length(value)), 0) FROM state WHERE session_id = ?

-- mnt_session_inline_bytes: a session's inline part bytes, and streamed chunk bytes
SELECT (SELECT coalesce(sum(octet_length(body)), 0) FROM parts WHERE session_id = :id),
       (SELECT coalesce(sum(octet_length(c.text)), 0)
        FROM messages m JOIN chunks c ON c.message_id = m.id WHERE m.session_id = :id)

-- mnt_session_blob_bytes: the blobs a session refers to: count, stored and original bytes
SELECT count(*), coalesce(sum(b.stored_size), 0), coalesce(sum(b.size), 0)
FROM blobs b WHERE b.sha256 IN (
    SELECT blob_sha FROM parts WHERE session_id = :id AND blob_sha IS NOT NULL
    UNION
    SELECT blob_sha FROM state WHERE session_id = :id AND blob_sha IS NOT NULL
)

-- mnt_stats_parts: inline part bytes per session
SELECT session_id, coalesce(sum(octet_length(body)), 0) FROM parts GROUP BY session_id

-- mnt_stats_chunks: streamed chunk bytes per session
SELECT m.session_id, sum(octet_length(c.text))
FROM chunks c JOIN messages m ON m.id = c.message_id GROUP BY m.session_id

-- mnt_stats_state: inline state bytes per session
SELECT session_id, coalesce(sum(octet_length(value)), 0) FROM state GROUP BY session_id

-- mnt_stats_messages: messages per session
SELECT session_id, count(*) FROM messages GROUP BY session_id

-- mnt_stats_session_blobs: stored bytes of the blobs each session refers to (a shared blob counts in each)
SELECT x.session_id, count(*), sum(b.stored_size)
FROM (SELECT DISTINCT session_id, blob_sha FROM parts WHERE blob_sha IS NOT NULL
      UNION
      SELECT session_id, blob_sha FROM state WHERE blob_sha IS NOT NULL) x
JOIN blobs b ON b.sha256 = x.blob_sha
GROUP BY x.session_id

-- mnt_stats_sessions: every session's id, parent, title, project, status, last update and metadata (not those being deleted or forked)
SELECT id, parent_id, title, project, status, updated_at, metadata FROM sessions WHERE job IS NULL

-- mnt_stats_blob_rows: every blob row's hash, stored and original bytes
SELECT sha256, stored_size, size FROM blobs

-- mnt_stats_counts: rows of the main tables
SELECT (SELECT count(*) FROM sessions), (SELECT count(*) FROM messages),
       (SELECT count(*) FROM parts), (SELECT count(*) FROM chunks),
       (SELECT count(*) FROM state), (SELECT count(*) FROM applied_ops)

-- mnt_stats_langgraph: LangGraph checkpoints, channel values and pending writes, and their payload bytes
SELECT (SELECT count(*) FROM ckpt_checkpoints), (SELECT count(*) FROM ckpt_channels),
       (SELECT count(*) FROM ckpt_writes),
       (SELECT coalesce(sum(size), 0) FROM ckpt_checkpoints)
       + (SELECT coalesce(sum(size), 0) FROM ckpt_channels)
       + (SELECT coalesce(sum(size), 0) FROM ckpt_writes)

-- mnt_langgraph_threads: LangGraph threads, last checkpoint first: checkpoints, last checkpoint time, pending writes, payload bytes (checkpoints, channel values, writes); limit -1: all
SELECT t.thread_id, t.checkpoints, t.last, coalesce(w.n, 0),
       t.bytes + coalesce(c.bytes, 0) + coalesce(w.bytes, 0)
FROM (SELECT thread_id, count(*) AS checkpoints, max(created_at) AS last,
             sum(size) AS bytes
      FROM ckpt_checkpoints GROUP BY thread_id) t
LEFT JOIN (SELECT thread_id, sum(size) AS bytes FROM ckpt_channels GROUP BY thread_id) c
       ON c.thread_id = t.thread_id
LEFT JOIN (SELECT thread_id, count(*) AS n, sum(size) AS bytes
           FROM ckpt_writes GROUP BY thread_id) w
       ON w.thread_id = t.thread_id
ORDER BY t.last DESC, t.thread_id
LIMIT :limit

-- mnt_ops_old_count: applied_ops rows a prune would delete (id below ?, applied before ?)
SELECT count(*) FROM applied_ops WHERE op_id < ? AND applied_at < ?

-- red_part: a part's stored body, for fleetstore redact (domain/maintenance.py)
SELECT enc, body, blob_sha FROM parts WHERE message_id = :message_id AND seq = :seq

-- red_part_set: a part's body replaced by its redacted one
UPDATE parts SET enc = :enc, body = :body, blob_sha = :blob_sha, size = :size
WHERE message_id = :message_id AND seq = :seq

-- red_chunks: a streamed part's chunks, in order
SELECT seq, text FROM chunks WHERE message_id = :message_id AND part_seq = :part_seq ORDER BY seq

-- red_chunks_clear: a streamed part's chunks, before its redacted text is put back as one
DELETE FROM chunks WHERE message_id = :message_id AND part_seq = :part_seq

-- red_chunk_put: a streamed part's redacted text, as one chunk
INSERT INTO chunks (message_id, part_seq, seq, text) VALUES (:message_id, :part_seq, 0, :text)

-- red_state: a state value as stored
SELECT enc, value, blob_sha FROM state
WHERE session_id = :session_id AND namespace = :namespace AND key = :key

-- red_state_set: a state value replaced by its redacted one (its version kept)
UPDATE state SET enc = :enc, value = :body, blob_sha = :blob_sha, size = :size
WHERE session_id = :session_id AND namespace = :namespace AND key = :key

-- red_effect: an effect's payload as stored, its result and its errors
SELECT enc, payload, blob_sha, result, last_error, errors FROM effects WHERE id = :id

-- red_effect_set: an effect's payload, result and errors replaced by their redacted ones
UPDATE effects SET enc = :enc, payload = :body, blob_sha = :blob_sha, size = :size,
                   result = :result, last_error = :last_error, errors = :errors
WHERE id = :id

-- red_session: a session's title and metadata as stored
SELECT title, metadata FROM sessions WHERE id = :id

-- red_session_set: a session's title and metadata replaced by their redacted ones
UPDATE sessions SET title = :title, metadata = :metadata WHERE id = :id

-- red_message: a message's metadata and error as stored
SELECT metadata, error FROM messages WHERE id = :id

-- red_message_set: a message's metadata and error replaced by their redacted ones
UPDATE messages SET metadata = :metadata, error = :error WHERE id = :id

-- red_parts_page: the next :limit parts with a body of their own after (:m, :after_seq), for redact
SELECT message_id, seq, session_id, enc, body, blob_sha, size FROM parts
WHERE enc <> 'chunks' AND (message_id, seq) > (:m, :after_seq)
ORDER BY message_id, seq LIMIT :limit

-- red_streamed_page: the next :limit streamed parts of messages no longer streaming
SELECT p.message_id, p.seq, p.session_id FROM parts p JOIN messages m ON m.id = p.message_id
WHERE p.enc = 'chunks' AND m.status <> 'streaming' AND (p.message_id, p.seq) > (:m, :after_seq)
ORDER BY p.message_id, p.seq LIMIT :limit

-- red_state_page: the next :limit state values after (:s, :n, :k)
SELECT session_id, namespace, key, enc, value, blob_sha, size FROM state
WHERE (session_id, namespace, key) > (:s, :n, :k)
ORDER BY session_id, namespace, key LIMIT :limit

-- red_effects_page: the next :limit effects after :id
SELECT id, enc, payload, blob_sha, size, result, last_error, errors FROM effects
WHERE id > :id ORDER BY id LIMIT :limit

-- red_sessions_page: the next :limit sessions after :id with a title or metadata
SELECT id, title, metadata FROM sessions
WHERE id > :id AND (title IS NOT NULL OR metadata <> '{}') ORDER BY id LIMIT :limit

-- red_messages_page: the next :limit messages after :id with metadata or an error
SELECT id, session_id, metadata, error FROM messages
WHERE id > :id AND (metadata <> '{}' OR error IS NOT NULL) ORDER BY id LIMIT :limit
