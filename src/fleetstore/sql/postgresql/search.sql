-- Full-text search on PostgreSQL: the search_* queries of sql/common/search.sql
-- that differ here, and the tsv_* queries of its own (search_text: tsvectors,
-- trigrams).
-- The tsv_*_newest/best queries are templates: {joins} and {filters} are the filters'
-- joins and conditions, {condition} a substring query's (domain/search.py).

-- search_where_kinds: (a fragment) the section's kind is one listed in the JSON array :kinds
d.kind IN (SELECT json_array_elements_text(CAST(:kinds AS json)))

-- search_where_roles: (a fragment) the section's message's role is one listed in :roles
m.role IN (SELECT json_array_elements_text(CAST(:roles AS json)))

-- search_state_get: the indexer's lease, the backfill's cursors, and whether anything is queued
SELECT owner, beat, sessions_from, messages_from,
       (SELECT count(*) FROM (SELECT 1 FROM search_queue LIMIT 1) q)
FROM search_state WHERE id = 1

-- search_lease: take (or keep) the indexer's lease, if it is free, ours, or still what was seen (gone or stale)
UPDATE search_state SET owner = :owner, beat = :now
WHERE id = 1 AND (owner IS NULL OR owner = :owner OR owner IS NOT DISTINCT FROM :seen)
RETURNING owner

-- search_queue_versions: the queued versions of the owners listed in the JSON array :docs
SELECT doc, ver FROM search_queue
WHERE doc IN (SELECT json_array_elements_text(CAST(:docs AS json)))

-- search_message_rows: what indexing and hits read of the messages listed in the JSON array :ids
SELECT m.id, m.session_id, m.seq, m.role, m.status, m.error, m.created_at,
       s.root_id, s.project, s.job, s.status
FROM messages m JOIN sessions s ON s.id = m.session_id
WHERE m.id IN (SELECT json_array_elements_text(CAST(:ids AS json)))

-- search_session_rows: the same of the sessions listed in :ids (not the catalog's copies of a shard's)
SELECT s.id, s.root_id, s.project, s.title, s.metadata, s.created_at, s.job, s.status
FROM sessions s
WHERE s.id IN (SELECT json_array_elements_text(CAST(:ids AS json)))
  AND NOT EXISTS (SELECT 1 FROM shard_sessions x WHERE x.session_id = s.id)

-- search_doc_next: the first free section id from :lo to :hi (above :hi: none free)
SELECT coalesce(max(id), CAST(:lo AS bigint) - 1) + 1 FROM search_docs
WHERE id BETWEEN :lo AND :hi

-- search_forget: what the index holds of a message (:message_id) or a session's title and metadata (:session_id), ids from :lo to below :below (search_text cascades)
DELETE FROM search_docs WHERE id >= :lo AND id < :below
    AND (message_id = :message_id OR session_id = :session_id)

-- search_status: queued owners, the oldest one's time, sections indexed, the lease and the backfill, and the clock the queue's times are read by
SELECT (SELECT count(*) FROM search_queue), (SELECT min(at) FROM search_queue),
       (SELECT count(*) FROM search_docs), owner, beat, sessions_from, messages_from,
       CAST(extract(epoch FROM clock_timestamp()) AS double precision)
FROM search_state WHERE id = 1

-- search_queue_lag: how many owners are queued, when the oldest was, and the clock that time is read by
SELECT count(*), min(at), CAST(extract(epoch FROM clock_timestamp()) AS double precision) FROM search_queue

-- tsv_text_insert: a section's words (a tsvector's text) and its case-folded text
INSERT INTO search_text (id, words, folded) VALUES (:doc_id, CAST(:words AS tsvector), :folded)

-- tsv_words_newest: sections matching a tsquery, newest first, ids from :lo to below :below
SELECT d.id, d.message_id, d.session_id, d.part, d.kind, d.start, d.stop,
       CAST(ts_rank(t.words, CAST(:match AS tsquery)) AS double precision)
FROM search_text t JOIN search_docs d ON d.id = t.id {joins}
WHERE t.words @@ CAST(:match AS tsquery) AND d.id >= :lo AND d.id < :below{filters}
ORDER BY d.id DESC LIMIT :limit

-- tsv_words_best: sections matching a tsquery, best first (ts_rank), after the first :skip
SELECT d.id, d.message_id, d.session_id, d.part, d.kind, d.start, d.stop,
       CAST(ts_rank(t.words, CAST(:match AS tsquery)) AS double precision) AS rank
FROM search_text t JOIN search_docs d ON d.id = t.id {joins}
WHERE t.words @@ CAST(:match AS tsquery) AND d.id >= :lo AND d.id < :below{filters}
ORDER BY rank DESC, d.id DESC LIMIT :limit OFFSET :skip

-- tsv_grams_newest: sections holding a substring query's text, newest first
SELECT d.id, d.message_id, d.session_id, d.part, d.kind, d.start, d.stop,
       CAST(0 AS double precision)
FROM search_text t JOIN search_docs d ON d.id = t.id {joins}
WHERE {condition} AND d.id >= :lo AND d.id < :below{filters}
ORDER BY d.id DESC LIMIT :limit

-- tsv_sizes: the bytes of each table and index search keeps
SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c
WHERE c.relname LIKE 'search%' AND c.relkind IN ('r', 'i')
  AND c.relnamespace = current_schema()::regnamespace ORDER BY c.relname
