-- PostgreSQL's text of the queries of sql/common/transfer.sql that differ here: the
-- same names, parameters and result columns.

-- transfer_parts: the parts of the messages listed in the JSON array ?, as stored
SELECT message_id, seq, kind, meta, enc, body, blob_sha, size
FROM parts WHERE message_id IN (SELECT json_array_elements_text(?::json))
ORDER BY message_id, seq

-- transfer_chunks: the streamed chunks of the messages listed in the JSON array ?
SELECT message_id, part_seq, seq, text
FROM chunks WHERE message_id IN (SELECT json_array_elements_text(?::json))
ORDER BY message_id, part_seq, seq

-- transfer_part_text: the text of a streamed part, its chunks joined
SELECT string_agg(text, '' ORDER BY seq) FROM chunks WHERE message_id = ? AND part_seq = ?

-- transfer_state_of_session: a session's state values, as stored (none of a session being deleted)
WITH s(id) AS (SELECT ?::text)
SELECT namespace, key, version, enc, value, blob_sha, size, updated_at
FROM state WHERE session_id = (SELECT id FROM s)
  AND NOT EXISTS (SELECT 1 FROM sessions x WHERE x.id = (SELECT id FROM s) AND x.job IS NOT NULL)
ORDER BY namespace, key
