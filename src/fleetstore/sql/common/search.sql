-- Full-text search (fleetstore.domain.search, search_index; migration 0011_search).
-- search_* queries exist in both dialects; fts5_* only on SQLite (FTS5 tables,
-- sql/sqlite/search.sql), tsv_* only on PostgreSQL (tsvector and trigram indexes,
-- sql/postgresql/search.sql).

-- search_join_sessions: (a fragment of the candidate queries) the session of a section's owner
LEFT JOIN messages m ON m.id = d.message_id JOIN sessions s ON s.id = coalesce(m.session_id, d.session_id)

-- search_where_session: (a fragment) the section's session
s.id = :session_id

-- search_where_root: (a fragment) the section's session tree
s.root_id = :root_id

-- search_where_project: (a fragment) the section's project
s.project = :project

-- search_where_kinds: (a fragment) the section's kind is one listed in the JSON array :kinds
d.kind IN (SELECT value FROM json_each(:kinds))

-- search_where_roles: (a fragment) the section's message's role is one listed in :roles
m.role IN (SELECT value FROM json_each(:roles))

-- search_state_get: the indexer's lease, the backfill's cursors, and whether anything is queued
SELECT owner, beat, sessions_from, messages_from,
       (SELECT count(*) FROM (SELECT 1 FROM search_queue LIMIT 1))
FROM search_state WHERE id = 1

-- search_lease: take (or keep) the indexer's lease, if it is free, ours, or still what was seen (gone or stale)
UPDATE search_state SET owner = :owner, beat = :now
WHERE id = 1 AND (owner IS NULL OR owner = :owner OR owner IS :seen)
RETURNING owner

-- search_release: give the lease back (nothing left to index)
UPDATE search_state SET owner = NULL WHERE id = 1 AND owner = :owner

-- search_queue_head: the next queued owners to index
SELECT doc, ver FROM search_queue ORDER BY doc LIMIT :limit

-- search_queue_versions: the queued versions of the owners listed in the JSON array :docs
SELECT doc, ver FROM search_queue WHERE doc IN (SELECT value FROM json_each(:docs))

-- search_queue_done: an owner indexed as of version :ver (a later change keeps it queued)
DELETE FROM search_queue WHERE doc = :doc AND ver = :ver

-- search_enqueue: queue an owner to be indexed (again)
INSERT INTO search_queue (doc, at) VALUES (:doc, :at)
ON CONFLICT (doc) DO UPDATE SET ver = search_queue.ver + 1

-- search_backfill_messages: the next messages the backfill indexes, after id :past
SELECT id FROM messages WHERE id > :past ORDER BY id LIMIT :limit

-- search_backfill_sessions: the next sessions the backfill indexes, after id :past
SELECT id FROM sessions WHERE id > :past ORDER BY id LIMIT :limit

-- search_backfill_messages_at: where the backfill of messages stands (NULL: done)
UPDATE search_state SET messages_from = :cursor WHERE id = 1

-- search_backfill_sessions_at: where the backfill of sessions stands (NULL: done)
UPDATE search_state SET sessions_from = :cursor WHERE id = 1

-- search_backfill_progress: messages the backfill has passed, and all of them
SELECT (SELECT count(*) FROM messages WHERE id <= :past), (SELECT count(*) FROM messages)

-- search_message_rows: what indexing and hits read of the messages listed in the JSON array :ids
SELECT m.id, m.session_id, m.seq, m.role, m.status, m.error, m.created_at,
       s.root_id, s.project, s.job, s.status
FROM messages m JOIN sessions s ON s.id = m.session_id
WHERE m.id IN (SELECT value FROM json_each(:ids))

-- search_session_rows: the same of the sessions listed in :ids (not the catalog's copies of a shard's)
SELECT s.id, s.root_id, s.project, s.title, s.metadata, s.created_at, s.job, s.status
FROM sessions s
WHERE s.id IN (SELECT value FROM json_each(:ids))
  AND NOT EXISTS (SELECT 1 FROM shard_sessions x WHERE x.session_id = s.id)

-- search_indexed: whether a message (:message_id) or a session (:session_id) has sections, ids from :lo to below :below
SELECT count(*) FROM search_docs
WHERE id >= :lo AND id < :below AND (message_id = :message_id OR session_id = :session_id)

-- search_doc_next: the first free section id from :lo to :hi (above :hi: none free)
SELECT coalesce(max(id), :lo - 1) + 1 FROM search_docs WHERE id BETWEEN :lo AND :hi

-- search_doc_insert: one indexed section
INSERT INTO search_docs (id, message_id, session_id, part, kind, start, stop)
VALUES (:doc_id, :message_id, :session_id, :part, :kind, :start, :stop)

-- search_forget: what the index holds of a message (:message_id) or a session's title and metadata (:session_id), ids from :lo to below :below
DELETE FROM search_words WHERE rowid IN (
    SELECT id FROM search_docs WHERE id >= :lo AND id < :below
    AND (message_id = :message_id OR session_id = :session_id));
DELETE FROM search_grams WHERE rowid IN (
    SELECT id FROM search_docs WHERE id >= :lo AND id < :below
    AND (message_id = :message_id OR session_id = :session_id));
DELETE FROM search_docs WHERE id >= :lo AND id < :below
    AND (message_id = :message_id OR session_id = :session_id)

-- search_status: queued owners, the oldest one's time, sections indexed, the lease and the backfill, and the clock the queue's times are read by
SELECT (SELECT count(*) FROM search_queue), (SELECT min(at) FROM search_queue),
       (SELECT count(*) FROM search_docs), owner, beat, sessions_from, messages_from,
       unixepoch('subsec')
FROM search_state WHERE id = 1

-- search_queue_lag: how many owners are queued, when the oldest was, and the clock that time is read by
SELECT count(*), min(at), unixepoch('subsec') FROM search_queue
