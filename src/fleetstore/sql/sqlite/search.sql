-- Full-text search on SQLite: the fts5_* queries (FTS5 tables); the others are
-- in sql/common/search.sql.

-- fts5_words_insert: a section's words, and its filter tags
INSERT INTO search_words (rowid, body, tags) VALUES (:doc_id, :body, :tags)

-- fts5_grams_insert: a section's trigrams
INSERT INTO search_grams (rowid, body) VALUES (:doc_id, :body)

-- fts5_words_newest: sections matching a words query, newest first, ids from :lo to below :below
SELECT d.id, d.message_id, d.session_id, d.part, d.kind, d.start, d.stop, -w.rank
FROM search_words w JOIN search_docs d ON d.id = w.rowid
WHERE search_words MATCH :match AND w.rowid >= :lo AND w.rowid < :below
ORDER BY w.rowid DESC LIMIT :limit

-- fts5_words_best: sections matching a words query, best first (bm25), after the first :skip
SELECT d.id, d.message_id, d.session_id, d.part, d.kind, d.start, d.stop, -w.rank
FROM search_words w JOIN search_docs d ON d.id = w.rowid
WHERE search_words MATCH :match AND w.rowid >= :lo AND w.rowid < :below
ORDER BY w.rank, w.rowid DESC LIMIT :limit OFFSET :skip

-- fts5_grams_newest: sections holding every trigram of a substring query, newest first ({joins} and {filters}: the filters')
SELECT d.id, d.message_id, d.session_id, d.part, d.kind, d.start, d.stop, 0.0
FROM search_grams g JOIN search_docs d ON d.id = g.rowid {joins}
WHERE search_grams MATCH :match AND g.rowid >= :lo AND g.rowid < :below{filters}
ORDER BY g.rowid DESC LIMIT :limit

-- fts5_merge_words: up to :pages pages of merging of the words index (maintain)
INSERT INTO search_words (search_words, rank) VALUES ('merge', :pages)

-- fts5_merge_grams: up to :pages pages of merging of the trigram index (maintain)
INSERT INTO search_grams (search_grams, rank) VALUES ('merge', :pages)

-- fts5_changes: the changes made so far on this connection (merging did work: it grows by 2 or more)
SELECT total_changes()

-- fts5_sizes: the bytes of each table and index search keeps
SELECT name, sum(pgsize) FROM dbstat WHERE name LIKE 'search%' GROUP BY name ORDER BY name
