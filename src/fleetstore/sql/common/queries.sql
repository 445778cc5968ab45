-- The operation log, sessions, messages, parts, stream chunks, usage, deletes and
-- forks, state, blob references.

-- op_applied: has this operation id been applied? (and what it returned)
SELECT 1, result FROM applied_ops WHERE op_id = ?

-- op_record: remember an applied operation id, and what it returned
INSERT INTO applied_ops (op_id, name, session_id, applied_at, result) VALUES (?, ?, ?, ?, ?)

-- session_for_write: the columns writes need, by id (none while a delete or fork of it is under way)
SELECT id, root_id, version, title, metadata, parent_id, project FROM sessions
WHERE id = ? AND job IS NULL

-- session_exists: does this session exist? (not while a delete or fork of it is under way)
SELECT 1 FROM sessions WHERE id = ? AND job IS NULL

-- session_identity: what a create compares to tell a retry from a clash
SELECT parent_id, project, title, metadata FROM sessions WHERE id = ?

-- session_insert: a new session; :job 'fork' makes a fork hidden until its copy is whole
INSERT INTO sessions (id, parent_id, root_id, forked_from, fork_seq, project, title, metadata, created_at, updated_at, job, job_owner)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- session_update: new title / metadata, next version
UPDATE sessions SET title = ?, metadata = ?, updated_at = ?, version = version + 1 WHERE id = ?

-- session_archive: archive or restore
UPDATE sessions SET status = ?, archived_at = ?, updated_at = ?, version = version + 1 WHERE id = ?

-- session_touch: a message was added or finished
UPDATE sessions SET updated_at = max(updated_at, ?) WHERE id = ?

-- session_delete: a session, with its subagents, messages, parts and state (cascades)
DELETE FROM sessions WHERE id = ?

-- session_get: one session (none while a delete or fork of it is under way)
SELECT id, root_id, parent_id, forked_from, fork_seq, project, title, status, metadata,
       created_at, updated_at, archived_at, version
FROM sessions WHERE id = ? AND job IS NULL

-- session_list: sessions, newest first, filtered; NULL filters match all
SELECT id, root_id, parent_id, forked_from, fork_seq, project, title, status, metadata,
       created_at, updated_at, archived_at, version
FROM sessions
WHERE (:project IS NULL OR project = :project)
  AND (:parent_id IS NULL OR parent_id = :parent_id)
  AND (:root_id IS NULL OR root_id = :root_id)
  AND (:include_archived OR status = 'active')
  AND (:before IS NULL OR id < :before)
  AND job IS NULL
ORDER BY id DESC
LIMIT :limit

-- message_identity: session, seq and status of a message
SELECT session_id, seq, status FROM messages WHERE id = ?

-- message_last_seq: the highest message seq of a session (0 if none)
SELECT coalesce(max(seq), 0) FROM messages WHERE session_id = ?

-- message_insert: a new message
INSERT INTO messages (id, session_id, seq, role, status, model, metadata, created_at, completed_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)

-- message_model: the model a message was written with
SELECT model FROM messages WHERE id = ?

-- message_finish: a streaming message ends
UPDATE messages SET status = ?, error = ?, completed_at = ? WHERE id = ? AND status = 'streaming'

-- message_get: one message (none of a session being deleted or forked)
SELECT id, session_id, seq, role, status, model, metadata, error, created_at, completed_at
FROM messages m WHERE id = ?
  AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = m.session_id AND s.job IS NOT NULL)

-- message_list: messages of a session in order, from a seq on (none of a session being deleted or forked)
SELECT id, session_id, seq, role, status, model, metadata, error, created_at, completed_at
FROM messages WHERE session_id = :session_id AND seq > :after
  AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = :session_id AND s.job IS NOT NULL)
ORDER BY seq LIMIT :limit

-- message_list_last: the last messages of a session (newest first; none of a session being deleted or forked)
SELECT id, session_id, seq, role, status, model, metadata, error, created_at, completed_at
FROM messages WHERE session_id = :session_id
  AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = :session_id AND s.job IS NOT NULL)
ORDER BY seq DESC LIMIT :limit

-- part_insert: a whole part
INSERT INTO parts (message_id, seq, session_id, kind, meta, enc, body, blob_sha, size)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)

-- part_insert_streamed: a streamed part's row, made by its first chunk
INSERT INTO parts (message_id, seq, session_id, kind, meta, enc, size)
VALUES (?, ?, ?, ?, '{}', 'chunks', 0) ON CONFLICT DO NOTHING

-- part_exists: does this part exist?
SELECT 1 FROM parts WHERE message_id = ? AND seq = ?

-- chunk_insert: one appended piece of streamed text (a replay inserts nothing)
INSERT INTO chunks (message_id, part_seq, seq, text) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING

-- parts_of_messages: the parts of the messages listed in the JSON array ?
SELECT p.message_id, p.seq, p.kind, p.meta, p.enc, p.body, p.blob_sha, p.size,
       CASE WHEN p.enc = 'chunks'
            THEN (SELECT group_concat(c.text, '' ORDER BY c.seq) FROM chunks c
                  WHERE c.message_id = p.message_id AND c.part_seq = p.seq)
       END
FROM parts p WHERE p.message_id IN (SELECT value FROM json_each(?))
ORDER BY p.message_id, p.seq

-- usage_upsert: a message's usage
INSERT INTO usage (message_id, session_id, model, input_tokens, output_tokens, cache_read_tokens,
                   cache_write_tokens, reasoning_tokens, cost)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (message_id) DO UPDATE SET
    input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens,
    cache_read_tokens = excluded.cache_read_tokens, cache_write_tokens = excluded.cache_write_tokens,
    reasoning_tokens = excluded.reasoning_tokens, cost = excluded.cost

-- usage_of_messages: usage of the messages listed in the JSON array ?
SELECT message_id, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
       reasoning_tokens, cost
FROM usage WHERE message_id IN (SELECT value FROM json_each(?))

-- usage_total: tokens and cost of a session
SELECT count(*), coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0),
       coalesce(sum(cache_read_tokens), 0), coalesce(sum(cache_write_tokens), 0),
       coalesce(sum(reasoning_tokens), 0), coalesce(sum(cost), 0)
FROM usage WHERE session_id = ?

-- fork_message_ids: the next messages a fork copies: of :source, after seq :after, up to :upto
SELECT id FROM messages WHERE session_id = :source AND seq > :after AND seq <= :upto
ORDER BY seq LIMIT :limit

-- session_job: a session's job (a delete or fork under way), and where a fork comes from; any session, hidden or not
SELECT job, job_owner, forked_from, fork_seq FROM sessions WHERE id = ?

-- session_jobs: the sessions whose delete or fork is under way
SELECT id, job, job_owner, updated_at FROM sessions WHERE job IS NOT NULL ORDER BY id LIMIT ?

-- session_mark_deleted: a session and its subagents hidden from every read, their rows to be purged
WITH RECURSIVE tree(id) AS (
    SELECT id FROM sessions WHERE id = :id
    UNION ALL
    SELECT s.id FROM sessions s JOIN tree t ON s.parent_id = t.id
)
UPDATE sessions SET job = 'delete', job_owner = :owner WHERE id IN (SELECT id FROM tree)

-- session_fork_done: the fork's last batch is in: it is seen from now on
UPDATE sessions SET job = NULL, job_owner = NULL, updated_at = ? WHERE id = ? AND job = 'fork'

-- session_fork_abandon: a fork that will not be finished: its rows to be purged
UPDATE sessions SET job = 'delete' WHERE id = ? AND job = 'fork'

-- purge_leaf: a session of the tree under :id (all of it being deleted) with no subagent left: purged first
WITH RECURSIVE tree(id) AS (
    SELECT id FROM sessions WHERE id = :id AND job = 'delete'
    UNION ALL
    SELECT s.id FROM sessions s JOIN tree t ON s.parent_id = t.id
)
SELECT t.id FROM tree t WHERE NOT EXISTS (SELECT 1 FROM sessions c WHERE c.parent_id = t.id)
LIMIT 1

-- purge_chunks: up to :limit streamed chunks of a session's messages
DELETE FROM chunks WHERE rowid IN (
    SELECT c.rowid FROM messages m JOIN chunks c ON c.message_id = m.id
    WHERE m.session_id = :id LIMIT :limit
)
RETURNING 1

-- purge_messages: up to :limit messages of a session (their parts and usage cascade)
DELETE FROM messages WHERE id IN (
    SELECT id FROM messages WHERE session_id = :id LIMIT :limit
)
RETURNING 1

-- purge_state: up to :limit state values of a session
DELETE FROM state WHERE (session_id, namespace, key) IN (
    SELECT session_id, namespace, key FROM state WHERE session_id = :id LIMIT :limit
)
RETURNING 1

-- purge_session_row: a session being deleted, once its rows are gone
DELETE FROM sessions WHERE id = ? AND job = 'delete'

-- fork_copy_message: copy one message into the fork
INSERT INTO messages (id, session_id, seq, role, status, model, metadata, error, created_at, completed_at)
SELECT ?, ?, seq, role, status, model, metadata, error, created_at, completed_at FROM messages WHERE id = ?

-- fork_copy_parts: copy its parts (blobs are shared by hash)
INSERT INTO parts (message_id, seq, session_id, kind, meta, enc, body, blob_sha, size)
SELECT ?, seq, ?, kind, meta, enc, body, blob_sha, size FROM parts WHERE message_id = ?

-- fork_copy_chunks: copy its streamed chunks
INSERT INTO chunks (message_id, part_seq, seq, text)
SELECT ?, part_seq, seq, text FROM chunks WHERE message_id = ?

-- fork_copy_usage: copy its usage
INSERT INTO usage (message_id, session_id, model, input_tokens, output_tokens, cache_read_tokens,
                   cache_write_tokens, reasoning_tokens, cost)
SELECT ?, ?, model, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
       reasoning_tokens, cost FROM usage WHERE message_id = ?

-- state_version: the current version of a state key
SELECT version FROM state WHERE session_id = ? AND namespace = ? AND key = ?

-- state_upsert: write a state value
INSERT INTO state (session_id, namespace, key, version, enc, value, blob_sha, size, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (session_id, namespace, key) DO UPDATE SET
    version = excluded.version, enc = excluded.enc, value = excluded.value,
    blob_sha = excluded.blob_sha, size = excluded.size, updated_at = excluded.updated_at

-- state_delete: remove a state key
DELETE FROM state WHERE session_id = ? AND namespace = ? AND key = ?

-- state_get: one state value
SELECT version, enc, value, blob_sha, size, updated_at FROM state
WHERE session_id = ? AND namespace = ? AND key = ?

-- state_keys: the keys of a session's namespace
SELECT key FROM state WHERE session_id = ? AND namespace = ? ORDER BY key

-- blob_insert: a blob reference (its bytes are already stored: on disk, or in blob_chunks on PostgreSQL)
INSERT INTO blobs (sha256, size, stored_size, codec, created_at) VALUES (?, ?, ?, ?, ?)
ON CONFLICT DO NOTHING
