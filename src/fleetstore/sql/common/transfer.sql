-- Export, import and merge (fleetstore/transfer/digest.py, export.py, importing.py):
-- whole rows read out and written back as they were, so a store round-trips exactly.

-- transfer_session_tree: every session's id and parent, to order them parents first (not those being deleted or forked)
SELECT id, parent_id FROM sessions WHERE job IS NULL ORDER BY id

-- transfer_session_root: the root of a session (a new subagent joins its parent's tree)
SELECT root_id FROM sessions WHERE id = ?

-- transfer_session_insert: a session with every column as exported
INSERT INTO sessions (id, parent_id, root_id, forked_from, fork_seq, project, title, status,
                      metadata, created_at, updated_at, archived_at, version)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- transfer_session_update: bring a session forward to a later exported state
UPDATE sessions SET title = ?, metadata = ?, status = ?, archived_at = ?, updated_at = ?,
                    version = ?
WHERE id = ?

-- transfer_message_row: a message's own columns (no parts)
SELECT session_id, seq, role, status, model, metadata, error, created_at, completed_at
FROM messages WHERE id = ?

-- transfer_message_at_seq: which message holds a seq of a session
SELECT id FROM messages WHERE session_id = ? AND seq = ?

-- transfer_message_insert: a message with every column as exported
INSERT INTO messages (id, session_id, seq, role, status, model, metadata, error, created_at,
                      completed_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- transfer_message_finish: a message streaming here was finished in the export
UPDATE messages SET status = ?, error = ?, completed_at = ? WHERE id = ?

-- transfer_parts: the parts of the messages listed in the JSON array ?, as stored
SELECT message_id, seq, kind, meta, enc, body, blob_sha, size
FROM parts WHERE message_id IN (SELECT value FROM json_each(?))
ORDER BY message_id, seq

-- transfer_chunks: the streamed chunks of the messages listed in the JSON array ?
SELECT message_id, part_seq, seq, text
FROM chunks WHERE message_id IN (SELECT value FROM json_each(?))
ORDER BY message_id, part_seq, seq

-- transfer_part_row: one part as stored
SELECT kind, meta, enc, body, blob_sha, size FROM parts WHERE message_id = ? AND seq = ?

-- transfer_part_insert_chunked: a streamed part's row (its chunks follow)
INSERT INTO parts (message_id, seq, session_id, kind, meta, enc, size)
VALUES (?, ?, ?, ?, ?, 'chunks', 0)

-- transfer_part_text: the text of a streamed part, its chunks joined
SELECT group_concat(text, '' ORDER BY seq) FROM chunks WHERE message_id = ? AND part_seq = ?

-- transfer_chunk_text: one chunk's text
SELECT text FROM chunks WHERE message_id = ? AND part_seq = ? AND seq = ?

-- transfer_usage_row: a message's usage
SELECT input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, cost
FROM usage WHERE message_id = ?

-- transfer_state_of_session: a session's state values, as stored (none of a session being deleted)
WITH s(id) AS (SELECT ?)
SELECT namespace, key, version, enc, value, blob_sha, size, updated_at
FROM state WHERE session_id = (SELECT id FROM s)
  AND NOT EXISTS (SELECT 1 FROM sessions x WHERE x.id = (SELECT id FROM s) AND x.job IS NOT NULL)
ORDER BY namespace, key

-- transfer_blobs_of_session: the blobs a session's parts and state refer to
SELECT blob_sha FROM parts WHERE session_id = ? AND blob_sha IS NOT NULL
UNION
SELECT blob_sha FROM state WHERE session_id = ? AND blob_sha IS NOT NULL
