-- Full-text search (docs/search.md): the PostgreSQL mirror of
-- sql/sqlite/migrations/0011_search.sql.  The queue, the sections and the state are the
-- same tables; where SQLite has FTS5 tables, each section's words (a tsvector, built by
-- fleetstore with FTS5's tokenizing, GIN-indexed) and its text case-folded (for
-- substrings, with a pg_trgm GIN index when the extension is available) are in
-- search_text.

CREATE TABLE search_docs (
    id          BIGINT PRIMARY KEY,
    message_id  TEXT COLLATE "C",
    session_id  TEXT COLLATE "C",
    part        BIGINT,
    kind        TEXT COLLATE "C" NOT NULL,
    start       BIGINT NOT NULL,
    stop        BIGINT NOT NULL
);

CREATE TABLE search_queue (
    doc  TEXT COLLATE "C" PRIMARY KEY,
    ver  BIGINT NOT NULL DEFAULT 1,
    at   DOUBLE PRECISION NOT NULL
);

CREATE TABLE search_state (
    id             BIGINT PRIMARY KEY CHECK (id = 1),
    owner          TEXT COLLATE "C",
    beat           DOUBLE PRECISION,
    sessions_from  TEXT COLLATE "C",
    messages_from  TEXT COLLATE "C"
);
INSERT INTO search_state (id, sessions_from, messages_from)
SELECT 1, CASE WHEN EXISTS (SELECT 1 FROM sessions) THEN '' END,
          CASE WHEN EXISTS (SELECT 1 FROM messages) THEN '' END;

CREATE TABLE search_text (
    id      BIGINT PRIMARY KEY REFERENCES search_docs(id) ON DELETE CASCADE,
    words   TSVECTOR NOT NULL,
    folded  TEXT COLLATE "C" NOT NULL
);
CREATE INDEX search_text_words ON search_text USING gin (words);

-- Substrings use pg_trgm (a contrib extension) where it can be had; without it they
-- are found by reading every section's text.
DO $$
BEGIN
    CREATE EXTENSION IF NOT EXISTS pg_trgm;
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE USING MESSAGE = 'fleetstore search, pg_trgm is not available ('
        || SQLERRM || '): substrings read every section';
END
$$;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm') THEN
        EXECUTE 'CREATE INDEX search_text_grams ON search_text USING gin (folded gin_trgm_ops)';
    END IF;
END
$$;

CREATE FUNCTION fleetstore_search_enqueue(owner_doc text) RETURNS void
    LANGUAGE sql
    AS $$
    INSERT INTO search_queue (doc, at) VALUES (owner_doc, extract(epoch FROM clock_timestamp()))
    ON CONFLICT (doc) DO UPDATE SET ver = search_queue.ver + 1
$$;

CREATE FUNCTION fleetstore_search_message() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM search_docs WHERE id >= (floor(OLD.created_at * 100)::bigint << 13) AND id < ((floor(OLD.created_at * 100)::bigint + 2) << 13)
            AND message_id = OLD.id;
        DELETE FROM search_queue WHERE doc = 'm' || OLD.id;
    ELSE
        PERFORM fleetstore_search_enqueue('m' || NEW.id);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER search_message_added AFTER INSERT ON messages
    FOR EACH ROW WHEN (NEW.status <> 'streaming') EXECUTE FUNCTION fleetstore_search_message();
CREATE TRIGGER search_message_done AFTER UPDATE OF status ON messages
    FOR EACH ROW WHEN (OLD.status = 'streaming' AND NEW.status <> 'streaming')
    EXECUTE FUNCTION fleetstore_search_message();
CREATE TRIGGER search_message_gone AFTER DELETE ON messages
    FOR EACH ROW EXECUTE FUNCTION fleetstore_search_message();

-- Content rewritten (redaction), or a part removed from a message that stays.
CREATE FUNCTION fleetstore_search_content() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    at double precision;
BEGIN
    SELECT created_at INTO at FROM messages WHERE id = OLD.message_id;
    IF NOT FOUND THEN
        RETURN NULL;  -- the message is going too (a cascade)
    END IF;
    DELETE FROM search_docs WHERE id >= (floor(at * 100)::bigint << 13) AND id < ((floor(at * 100)::bigint + 2) << 13)
        AND message_id = OLD.message_id;
    PERFORM fleetstore_search_enqueue('m' || OLD.message_id);
    RETURN NULL;
END
$$;
CREATE TRIGGER search_part_changed AFTER UPDATE ON parts
    FOR EACH ROW EXECUTE FUNCTION fleetstore_search_content();
CREATE TRIGGER search_part_removed AFTER DELETE ON parts
    FOR EACH ROW EXECUTE FUNCTION fleetstore_search_content();
CREATE TRIGGER search_chunk_changed AFTER UPDATE ON chunks
    FOR EACH ROW EXECUTE FUNCTION fleetstore_search_content();

CREATE FUNCTION fleetstore_search_session() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM search_docs WHERE id >= (floor(OLD.created_at * 100)::bigint << 13) AND id < ((floor(OLD.created_at * 100)::bigint + 2) << 13)
            AND session_id = OLD.id;
        DELETE FROM search_queue WHERE doc = 's' || OLD.id;
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM shard_sessions WHERE session_id = NEW.id) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        DELETE FROM search_docs WHERE id >= (floor(OLD.created_at * 100)::bigint << 13) AND id < ((floor(OLD.created_at * 100)::bigint + 2) << 13)
            AND session_id = OLD.id;
    END IF;
    PERFORM fleetstore_search_enqueue('s' || NEW.id);
    RETURN NULL;
END
$$;
CREATE TRIGGER search_session_added AFTER INSERT ON sessions
    FOR EACH ROW WHEN (NEW.title IS NOT NULL OR NEW.metadata <> '{}')
    EXECUTE FUNCTION fleetstore_search_session();
CREATE TRIGGER search_session_changed AFTER UPDATE OF title, metadata ON sessions
    FOR EACH ROW WHEN (NEW.title IS DISTINCT FROM OLD.title OR NEW.metadata IS DISTINCT FROM OLD.metadata)
    EXECUTE FUNCTION fleetstore_search_session();
CREATE TRIGGER search_session_gone AFTER DELETE ON sessions
    FOR EACH ROW EXECUTE FUNCTION fleetstore_search_session();
