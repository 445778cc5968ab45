-- Full-text search (docs/search.md).  What is searched (a message's parts and error, a
-- session's title and metadata values) is indexed by a background step, not in the
-- write that stores it: the write only queues it (search_queue, by the triggers
-- below, in the same transaction), and an indexer takes the queue in batches, each
-- in one transaction with the index rows it writes.  A delete removes the index rows
-- in the deleting transaction.  Existing stores: search_state's two cursors walk the
-- sessions and messages there were (the backfill), in batches, resumably.

-- One row per indexed section of text.  id is the index's rowid: its owner's time in
-- hundredths of a second << 13, plus a counter, so that newest first is id order and
-- an owner's sections are found by their hundredth (and the next: a full one spills
-- into it) without an index of their own.
CREATE TABLE search_docs (
    id          INTEGER PRIMARY KEY,
    -- A message's part or error, or a session's title or metadata (the other NULL).
    message_id  TEXT,
    session_id  TEXT,
    -- The part's seq in its message (NULL for an error, a title, metadata).
    part        INTEGER,
    kind        TEXT NOT NULL,
    -- Characters [start, stop) of the owner's text.
    start       INTEGER NOT NULL,
    stop        INTEGER NOT NULL
);

-- What is to be indexed (again): 'm' || message id, 's' || session id.  ver grows
-- with each change, so an indexer that read an older version leaves it queued.
CREATE TABLE search_queue (
    doc  TEXT PRIMARY KEY,
    ver  INTEGER NOT NULL DEFAULT 1,
    at   REAL NOT NULL
) WITHOUT ROWID;

-- The indexer at work (a lease: its owner, host:pid, and the time of its last batch)
-- and the backfill: sessions and messages with an id above these are still to be
-- indexed (NULL: done; '' from the start).
CREATE TABLE search_state (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    owner          TEXT,
    beat           REAL,
    sessions_from  TEXT,
    messages_from  TEXT
);
INSERT INTO search_state (id, sessions_from, messages_from)
SELECT 1, CASE WHEN EXISTS (SELECT 1 FROM sessions) THEN '' END,
          CASE WHEN EXISTS (SELECT 1 FROM messages) THEN '' END;

-- The words (FTS5 unicode61, folded and without diacritics; positions kept, for
-- phrases) and the trigrams (substrings; no positions: a candidate is checked against
-- its text).  Contentless: the text is where it always is (parts, chunks, blobs), not
-- copied.  tags holds hashed filter words (session, root, project, kind, role).
CREATE VIRTUAL TABLE search_words USING fts5(
    body, tags, content='', contentless_delete=1, tokenize='unicode61 remove_diacritics 2'
);
CREATE VIRTUAL TABLE search_grams USING fts5(
    body, content='', contentless_delete=1, detail=none, tokenize='trigram'
);

CREATE TRIGGER search_message_added AFTER INSERT ON messages
WHEN NEW.status != 'streaming'
BEGIN
    INSERT INTO search_queue (doc, at) VALUES ('m' || NEW.id, unixepoch('subsec'))
    ON CONFLICT (doc) DO UPDATE SET ver = ver + 1;
END;

CREATE TRIGGER search_message_done AFTER UPDATE OF status ON messages
WHEN OLD.status = 'streaming' AND NEW.status != 'streaming'
BEGIN
    INSERT INTO search_queue (doc, at) VALUES ('m' || NEW.id, unixepoch('subsec'))
    ON CONFLICT (doc) DO UPDATE SET ver = ver + 1;
END;

CREATE TRIGGER search_message_gone AFTER DELETE ON messages
BEGIN
    DELETE FROM search_words WHERE rowid IN (SELECT id FROM search_docs WHERE id >= (CAST(OLD.created_at * 100 AS INTEGER) << 13) AND id < ((CAST(OLD.created_at * 100 AS INTEGER) + 2) << 13) AND message_id = OLD.id);
    DELETE FROM search_grams WHERE rowid IN (SELECT id FROM search_docs WHERE id >= (CAST(OLD.created_at * 100 AS INTEGER) << 13) AND id < ((CAST(OLD.created_at * 100 AS INTEGER) + 2) << 13) AND message_id = OLD.id);
    DELETE FROM search_docs WHERE id >= (CAST(OLD.created_at * 100 AS INTEGER) << 13) AND id < ((CAST(OLD.created_at * 100 AS INTEGER) + 2) << 13) AND message_id = OLD.id;
    DELETE FROM search_queue WHERE doc = 'm' || OLD.id;
END;

-- Content rewritten (redaction) or a part removed from a message that stays: what the
-- index holds of the message goes now, and it is indexed again.
CREATE TRIGGER search_part_changed AFTER UPDATE ON parts
BEGIN
    DELETE FROM search_words WHERE rowid IN (SELECT id FROM search_docs WHERE id >= ((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) << 13) AND id < (((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) + 2) << 13)
        AND message_id = OLD.message_id);
    DELETE FROM search_grams WHERE rowid IN (SELECT id FROM search_docs WHERE id >= ((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) << 13) AND id < (((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) + 2) << 13)
        AND message_id = OLD.message_id);
    DELETE FROM search_docs WHERE id >= ((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) << 13) AND id < (((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) + 2) << 13)
        AND message_id = OLD.message_id;
    INSERT INTO search_queue (doc, at) VALUES ('m' || NEW.message_id, unixepoch('subsec'))
    ON CONFLICT (doc) DO UPDATE SET ver = ver + 1;
END;

CREATE TRIGGER search_part_removed AFTER DELETE ON parts
WHEN EXISTS (SELECT 1 FROM messages WHERE id = OLD.message_id)
BEGIN
    DELETE FROM search_words WHERE rowid IN (SELECT id FROM search_docs WHERE id >= ((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) << 13) AND id < (((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) + 2) << 13)
        AND message_id = OLD.message_id);
    DELETE FROM search_grams WHERE rowid IN (SELECT id FROM search_docs WHERE id >= ((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) << 13) AND id < (((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) + 2) << 13)
        AND message_id = OLD.message_id);
    DELETE FROM search_docs WHERE id >= ((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) << 13) AND id < (((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) + 2) << 13)
        AND message_id = OLD.message_id;
    INSERT INTO search_queue (doc, at) VALUES ('m' || OLD.message_id, unixepoch('subsec'))
    ON CONFLICT (doc) DO UPDATE SET ver = ver + 1;
END;

CREATE TRIGGER search_chunk_changed AFTER UPDATE ON chunks
BEGIN
    DELETE FROM search_words WHERE rowid IN (SELECT id FROM search_docs WHERE id >= ((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) << 13) AND id < (((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) + 2) << 13)
        AND message_id = OLD.message_id);
    DELETE FROM search_grams WHERE rowid IN (SELECT id FROM search_docs WHERE id >= ((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) << 13) AND id < (((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) + 2) << 13)
        AND message_id = OLD.message_id);
    DELETE FROM search_docs WHERE id >= ((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) << 13) AND id < (((SELECT CAST(created_at * 100 AS INTEGER) FROM messages WHERE id = OLD.message_id) + 2) << 13)
        AND message_id = OLD.message_id;
    INSERT INTO search_queue (doc, at) VALUES ('m' || NEW.message_id, unixepoch('subsec'))
    ON CONFLICT (doc) DO UPDATE SET ver = ver + 1;
END;

-- A session's title and metadata (not the catalog's copy of a shard's session: the
-- shard indexes it).
CREATE TRIGGER search_session_added AFTER INSERT ON sessions
WHEN (NEW.title IS NOT NULL OR NEW.metadata != '{}')
 AND NOT EXISTS (SELECT 1 FROM shard_sessions WHERE session_id = NEW.id)
BEGIN
    INSERT INTO search_queue (doc, at) VALUES ('s' || NEW.id, unixepoch('subsec'))
    ON CONFLICT (doc) DO UPDATE SET ver = ver + 1;
END;

CREATE TRIGGER search_session_changed AFTER UPDATE OF title, metadata ON sessions
WHEN (NEW.title IS NOT OLD.title OR NEW.metadata IS NOT OLD.metadata)
 AND NOT EXISTS (SELECT 1 FROM shard_sessions WHERE session_id = NEW.id)
BEGIN
    DELETE FROM search_words WHERE rowid IN (SELECT id FROM search_docs WHERE id >= (CAST(OLD.created_at * 100 AS INTEGER) << 13) AND id < ((CAST(OLD.created_at * 100 AS INTEGER) + 2) << 13) AND session_id = OLD.id);
    DELETE FROM search_grams WHERE rowid IN (SELECT id FROM search_docs WHERE id >= (CAST(OLD.created_at * 100 AS INTEGER) << 13) AND id < ((CAST(OLD.created_at * 100 AS INTEGER) + 2) << 13) AND session_id = OLD.id);
    DELETE FROM search_docs WHERE id >= (CAST(OLD.created_at * 100 AS INTEGER) << 13) AND id < ((CAST(OLD.created_at * 100 AS INTEGER) + 2) << 13) AND session_id = OLD.id;
    INSERT INTO search_queue (doc, at) VALUES ('s' || NEW.id, unixepoch('subsec'))
    ON CONFLICT (doc) DO UPDATE SET ver = ver + 1;
END;

CREATE TRIGGER search_session_gone AFTER DELETE ON sessions
BEGIN
    DELETE FROM search_words WHERE rowid IN (SELECT id FROM search_docs WHERE id >= (CAST(OLD.created_at * 100 AS INTEGER) << 13) AND id < ((CAST(OLD.created_at * 100 AS INTEGER) + 2) << 13) AND session_id = OLD.id);
    DELETE FROM search_grams WHERE rowid IN (SELECT id FROM search_docs WHERE id >= (CAST(OLD.created_at * 100 AS INTEGER) << 13) AND id < ((CAST(OLD.created_at * 100 AS INTEGER) + 2) << 13) AND session_id = OLD.id);
    DELETE FROM search_docs WHERE id >= (CAST(OLD.created_at * 100 AS INTEGER) << 13) AND id < ((CAST(OLD.created_at * 100 AS INTEGER) + 2) << 13) AND session_id = OLD.id;
    DELETE FROM search_queue WHERE doc = 's' || OLD.id;
END;
