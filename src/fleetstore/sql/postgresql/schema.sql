-- The whole PostgreSQL schema of a fleetstore store: what migrations/0001..0011 build,
-- written out in one piece to read (tests/sql/test_schema.py checks that the two agree).
-- A store is always built by its migrations; a new migration changes this file too.

-- ---- from migrations/0001_history.sql

-- Session history: sessions (trees of subagents, forks), messages, parts,
-- streamed chunks, usage, versioned state, blob references and the log of
-- applied operations that makes every write idempotent.
--
-- The PostgreSQL mirror of sql/sqlite/migrations/0001_history.sql: the same
-- tables, columns (in the same order), constraints and indexes.  INTEGER is
-- BIGINT, REAL is DOUBLE PRECISION, BLOB is BYTEA.  Text is COLLATE "C" so that
-- comparisons and ORDER BY are by code point, as on SQLite (and as Python's
-- sorted), whatever the database's locale.  blobs comes first: PostgreSQL
-- checks that a referenced table exists.

CREATE TABLE blobs (
    sha256       TEXT COLLATE "C" PRIMARY KEY,
    size         BIGINT NOT NULL,
    stored_size  BIGINT NOT NULL,
    codec        TEXT COLLATE "C" NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL
);

CREATE TABLE sessions (
    id           TEXT COLLATE "C" PRIMARY KEY,
    parent_id    TEXT COLLATE "C" REFERENCES sessions(id) ON DELETE CASCADE,
    root_id      TEXT COLLATE "C" NOT NULL,
    forked_from  TEXT COLLATE "C",
    fork_seq     BIGINT,
    project      TEXT COLLATE "C",
    title        TEXT COLLATE "C",
    status       TEXT COLLATE "C" NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'archived')),
    metadata     TEXT COLLATE "C" NOT NULL DEFAULT '{}',
    created_at   DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
    archived_at  DOUBLE PRECISION,
    version      BIGINT NOT NULL DEFAULT 1,
    -- A delete or fork under way: no read shows the session (migration 0010).
    job          TEXT COLLATE "C" CHECK (job IN ('fork', 'delete')),
    job_owner    TEXT COLLATE "C"
);
CREATE INDEX sessions_by_parent ON sessions(parent_id);
CREATE INDEX sessions_by_root ON sessions(root_id);
CREATE INDEX sessions_by_project ON sessions(project, id);
CREATE INDEX sessions_with_job ON sessions(job) WHERE job IS NOT NULL;

CREATE TABLE messages (
    id            TEXT COLLATE "C" PRIMARY KEY,
    session_id    TEXT COLLATE "C" NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq           BIGINT NOT NULL,
    role          TEXT COLLATE "C" NOT NULL,
    status        TEXT COLLATE "C" NOT NULL CHECK (status IN ('streaming', 'complete', 'error')),
    model         TEXT COLLATE "C",
    metadata      TEXT COLLATE "C" NOT NULL DEFAULT '{}',
    error         TEXT COLLATE "C",
    created_at    DOUBLE PRECISION NOT NULL,
    completed_at  DOUBLE PRECISION,
    UNIQUE (session_id, seq)
);

-- A part's body is inline (body), or a blob (blob_sha), or, for streamed
-- text, the chunks appended to it in order: never rewritten whole.  An inline
-- body is bytes here whatever its enc (text as UTF-8): writes pass it through
-- fleetstore_bytes() below.
CREATE TABLE parts (
    message_id  TEXT COLLATE "C" NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    seq         BIGINT NOT NULL,
    session_id  TEXT COLLATE "C" NOT NULL,
    kind        TEXT COLLATE "C" NOT NULL,
    meta        TEXT COLLATE "C" NOT NULL DEFAULT '{}',
    enc         TEXT COLLATE "C" NOT NULL CHECK (enc IN ('str', 'bytes', 'json', 'chunks')),
    body        BYTEA,
    blob_sha    TEXT COLLATE "C" REFERENCES blobs(sha256),
    size        BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (message_id, seq)
);
CREATE INDEX parts_by_blob ON parts(blob_sha) WHERE blob_sha IS NOT NULL;

CREATE TABLE chunks (
    message_id  TEXT COLLATE "C" NOT NULL,
    part_seq    BIGINT NOT NULL,
    seq         BIGINT NOT NULL,
    text        TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (message_id, part_seq, seq),
    FOREIGN KEY (message_id, part_seq) REFERENCES parts(message_id, seq) ON DELETE CASCADE
);

CREATE TABLE usage (
    message_id          TEXT COLLATE "C" PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
    session_id          TEXT COLLATE "C" NOT NULL,
    model               TEXT COLLATE "C",
    input_tokens        BIGINT NOT NULL DEFAULT 0,
    output_tokens       BIGINT NOT NULL DEFAULT 0,
    cache_read_tokens   BIGINT NOT NULL DEFAULT 0,
    cache_write_tokens  BIGINT NOT NULL DEFAULT 0,
    reasoning_tokens    BIGINT NOT NULL DEFAULT 0,
    cost                DOUBLE PRECISION NOT NULL DEFAULT 0
);
CREATE INDEX usage_by_session ON usage(session_id);

CREATE TABLE state (
    session_id  TEXT COLLATE "C" NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    namespace   TEXT COLLATE "C" NOT NULL,
    key         TEXT COLLATE "C" NOT NULL,
    version     BIGINT NOT NULL,
    enc         TEXT COLLATE "C" NOT NULL CHECK (enc IN ('json', 'bytes')),
    value       BYTEA,
    blob_sha    TEXT COLLATE "C" REFERENCES blobs(sha256),
    size        BIGINT NOT NULL DEFAULT 0,
    updated_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (session_id, namespace, key)
);

-- One row per applied operation id: applying an operation twice finds its
-- row and does nothing (DESIGN.md promise 2).
CREATE TABLE applied_ops (
    op_id       TEXT COLLATE "C" PRIMARY KEY,
    name        TEXT COLLATE "C" NOT NULL,
    session_id  TEXT COLLATE "C",
    applied_at  DOUBLE PRECISION NOT NULL,
    result      TEXT COLLATE "C"
);

-- PostgreSQL only: the bytes of the blobs (compressed as the blob files are on
-- SQLite), cut in chunks of 1 MiB.  No foreign key to blobs: the chunks are
-- written, in their own transactions, before the row that refers to them.
CREATE TABLE blob_chunks (
    sha256  TEXT COLLATE "C" NOT NULL,
    seq     INTEGER NOT NULL,
    data    BYTEA NOT NULL,
    PRIMARY KEY (sha256, seq)
);

-- PostgreSQL only: an inline body as bytes.  SQLite keeps what it is given in a
-- BLOB column (text stays text); a BYTEA column would read a text parameter as
-- bytea's escape format (a backslash is an escape).  The two overloads take
-- either kind of parameter (an untyped literal or NULL resolves to the text one).
CREATE FUNCTION fleetstore_bytes(value text) RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT convert_to(value, 'UTF8') $$;
CREATE FUNCTION fleetstore_bytes(value bytea) RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT value $$;

-- ---- from migrations/0002_effects.sql

-- The durable effect outbox.  One row per effect; per thread, effects run in
-- seq order and one at a time: only the thread's head (its lowest-seq effect
-- still pending or running, flagged is_head) can be claimed, and the partial
-- unique indexes below make "two running in one thread" and "two heads in one
-- thread" impossible, whatever a query does.  (The PostgreSQL mirror of
-- sql/sqlite/migrations/0002_effects.sql.)
CREATE TABLE effects (
    id               TEXT COLLATE "C" PRIMARY KEY,
    thread_key       TEXT COLLATE "C" NOT NULL,
    seq              BIGINT NOT NULL,
    kind             TEXT COLLATE "C" NOT NULL,
    enc              TEXT COLLATE "C" NOT NULL CHECK (enc IN ('json', 'bytes')),
    payload          BYTEA,
    blob_sha         TEXT COLLATE "C" REFERENCES blobs(sha256),
    size             BIGINT NOT NULL DEFAULT 0,
    state            TEXT COLLATE "C" NOT NULL
                     CHECK (state IN ('pending', 'running', 'succeeded', 'dead', 'cancelled')),
    is_head          BIGINT NOT NULL DEFAULT 0 CHECK (is_head IN (0, 1)),
    attempt          BIGINT NOT NULL DEFAULT 0,
    max_attempts     BIGINT NOT NULL,
    -- NULL means as the kind declares (effect_kinds), else replay-safe.
    replay_safe      BIGINT CHECK (replay_safe IN (0, 1)),
    available_at     DOUBLE PRECISION NOT NULL,
    -- The fencing token, raised by every claim, sweep, release and operator
    -- action, so a settlement carrying an older one changes nothing.
    fence            BIGINT NOT NULL DEFAULT 0,
    lease_owner      TEXT COLLATE "C",
    lease_expires_at DOUBLE PRECISION,
    idempotency_key  TEXT COLLATE "C" UNIQUE,
    result           TEXT COLLATE "C",
    last_error       TEXT COLLATE "C",
    dead_reason      TEXT COLLATE "C",
    errors           TEXT COLLATE "C" NOT NULL DEFAULT '[]',
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL,
    started_at       DOUBLE PRECISION,
    finished_at      DOUBLE PRECISION,
    -- The claim operation that took a running effect (migration 0006).
    claim_op         TEXT COLLATE "C",
    -- When its worker gives up on the attempt running now (migration 0009).
    deadline         DOUBLE PRECISION,
    -- The trace context it was enqueued in, when carried (migration 0012).
    trace_context    TEXT COLLATE "C",
    UNIQUE (thread_key, seq),
    CHECK ((state = 'running') = (lease_owner IS NOT NULL)),
    CHECK (is_head = 0 OR state IN ('pending', 'running'))
);
CREATE UNIQUE INDEX effects_one_running ON effects(thread_key) WHERE state = 'running';
CREATE UNIQUE INDEX effects_one_head ON effects(thread_key) WHERE is_head = 1;
-- Claims: ready heads in the order they became available (the claim's ORDER BY).
CREATE INDEX effects_ready ON effects(available_at, thread_key)
    WHERE state = 'pending' AND is_head = 1;
-- Sweeps: running rows by lease expiry.
CREATE INDEX effects_leases ON effects(lease_expires_at) WHERE state = 'running';
-- The next head of a thread once its head settles.
CREATE INDEX effects_active ON effects(thread_key, seq) WHERE state IN ('pending', 'running');
CREATE INDEX effects_by_state ON effects(state, thread_key);
CREATE INDEX effects_by_blob ON effects(blob_sha) WHERE blob_sha IS NOT NULL;

-- What workers declare about each kind: whether it may run again after its owner was lost.
CREATE TABLE effect_kinds (
    kind         TEXT COLLATE "C" PRIMARY KEY,
    replay_safe  BIGINT NOT NULL CHECK (replay_safe IN (0, 1)),
    declared_at  DOUBLE PRECISION NOT NULL
);

-- PostgreSQL only: wake idle workers (LISTEN fleetstore_effects) when an effect
-- becomes claimable, i.e. a pending thread head is written: an enqueue, a head
-- moving on, a sweep or retry putting one back.  Rows that cannot be claimed
-- (pending behind their head) send nothing.  The notification is sent at
-- commit, and identical ones of one transaction are folded into one.
CREATE FUNCTION fleetstore_effects_notify() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('fleetstore_effects', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER effects_notify AFTER INSERT OR UPDATE ON effects
    FOR EACH ROW WHEN (NEW.state = 'pending' AND NEW.is_head = 1)
    EXECUTE FUNCTION fleetstore_effects_notify();

-- ---- from migrations/0003_checkpoints.sql

-- Graph checkpoints (LangGraph's checkpoint saver contract; fleetstore.domain.langgraph),
-- the PostgreSQL mirror of sql/sqlite/migrations/0003_checkpoints.sql:
-- a checkpoint row per (thread, namespace, checkpoint id), its channel values
-- stored once per channel version and shared by the checkpoints that did not
-- change them, and the pending writes of the tasks run from a checkpoint.
-- A body is inline (body) or a blob (blob_sha); type is the serializer's
-- tag for its bytes.  Thread ids are free-form text, not fleetstore sessions.

CREATE TABLE ckpt_checkpoints (
    thread_id      TEXT COLLATE "C" NOT NULL,
    checkpoint_ns  TEXT COLLATE "C" NOT NULL,
    checkpoint_id  TEXT COLLATE "C" NOT NULL,
    parent_id      TEXT COLLATE "C",
    type           TEXT COLLATE "C" NOT NULL,
    body           BYTEA,
    blob_sha       TEXT COLLATE "C" REFERENCES blobs(sha256),
    size           BIGINT NOT NULL DEFAULT 0,
    -- JSON object, keys sorted, which list filters compare in SQL.
    metadata       TEXT COLLATE "C" NOT NULL DEFAULT '{}',
    -- JSON object channel to version key, the ckpt_channels rows this
    -- checkpoint reads (and keeps alive when others are pruned).
    channel_keys   TEXT COLLATE "C" NOT NULL DEFAULT '{}',
    run_id         TEXT COLLATE "C",
    created_at     DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX ckpt_checkpoints_by_run ON ckpt_checkpoints(run_id) WHERE run_id IS NOT NULL;

CREATE TABLE ckpt_channels (
    thread_id      TEXT COLLATE "C" NOT NULL,
    checkpoint_ns  TEXT COLLATE "C" NOT NULL,
    channel        TEXT COLLATE "C" NOT NULL,
    version        TEXT COLLATE "C" NOT NULL,
    type           TEXT COLLATE "C" NOT NULL,
    body           BYTEA,
    blob_sha       TEXT COLLATE "C" REFERENCES blobs(sha256),
    size           BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);

CREATE TABLE ckpt_writes (
    thread_id      TEXT COLLATE "C" NOT NULL,
    checkpoint_ns  TEXT COLLATE "C" NOT NULL,
    checkpoint_id  TEXT COLLATE "C" NOT NULL,
    task_id        TEXT COLLATE "C" NOT NULL,
    idx            BIGINT NOT NULL,
    channel        TEXT COLLATE "C" NOT NULL,
    type           TEXT COLLATE "C" NOT NULL,
    body           BYTEA,
    blob_sha       TEXT COLLATE "C" REFERENCES blobs(sha256),
    size           BIGINT NOT NULL DEFAULT 0,
    task_path      TEXT COLLATE "C" NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);

-- ---- from migrations/0004_adk.sql

-- Google ADK sessions (fleetstore.integrations.adk, operations in fleetstore/adk_ops.py),
-- the PostgreSQL mirror of sql/sqlite/migrations/0004_adk.sql.
-- An ADK session is a fleetstore session (id derived from app, user and session id)
-- whose events are its messages and whose state is its state (namespace 'adk');
-- this table finds it by its ADK names and keeps what ADK asks of a session row:
-- the update time it lists by, and the revision that stale-session detection
-- compares (the op id of the last write to the session).
CREATE TABLE adk_sessions (
    app_name     TEXT COLLATE "C" NOT NULL,
    user_id      TEXT COLLATE "C" NOT NULL,
    session_id   TEXT COLLATE "C" NOT NULL,
    fs_id        TEXT COLLATE "C" NOT NULL UNIQUE REFERENCES sessions(id) ON DELETE CASCADE,
    revision     TEXT COLLATE "C" NOT NULL,
    create_time  DOUBLE PRECISION NOT NULL,
    update_time  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (app_name, user_id, session_id)
);
-- list_sessions pages in ADK's order: update time, then user, then session id.
CREATE INDEX adk_sessions_by_update ON adk_sessions(app_name, update_time, user_id, session_id);
CREATE INDEX adk_sessions_by_user ON adk_sessions(app_name, user_id, update_time, session_id);

-- The app and user state, one row per key (prefix removed), shared by every
-- session of the app / of the user in the app.  A value is JSON, inline or a blob.
CREATE TABLE adk_app_state (
    app_name    TEXT COLLATE "C" NOT NULL,
    key         TEXT COLLATE "C" NOT NULL,
    enc         TEXT COLLATE "C" NOT NULL CHECK (enc = 'json'),
    value       BYTEA,
    blob_sha    TEXT COLLATE "C" REFERENCES blobs(sha256),
    size        BIGINT NOT NULL DEFAULT 0,
    updated_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (app_name, key)
);

CREATE TABLE adk_user_state (
    app_name    TEXT COLLATE "C" NOT NULL,
    user_id     TEXT COLLATE "C" NOT NULL,
    key         TEXT COLLATE "C" NOT NULL,
    enc         TEXT COLLATE "C" NOT NULL CHECK (enc = 'json'),
    value       BYTEA,
    blob_sha    TEXT COLLATE "C" REFERENCES blobs(sha256),
    size        BIGINT NOT NULL DEFAULT 0,
    updated_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (app_name, user_id, key)
);

-- ---- from migrations/0005_blob_indexes.sql

-- Indexes on every blob reference that lacked one: collecting a blob re-checks,
-- in its transaction, that no row refers to it, which without these scanned the
-- whole state and checkpoint tables once per blob (fleetstore maintain).
CREATE INDEX state_by_blob ON state(blob_sha) WHERE blob_sha IS NOT NULL;
CREATE INDEX ckpt_checkpoints_by_blob ON ckpt_checkpoints(blob_sha) WHERE blob_sha IS NOT NULL;
CREATE INDEX ckpt_channels_by_blob ON ckpt_channels(blob_sha) WHERE blob_sha IS NOT NULL;
CREATE INDEX ckpt_writes_by_blob ON ckpt_writes(blob_sha) WHERE blob_sha IS NOT NULL;
CREATE INDEX adk_app_state_by_blob ON adk_app_state(blob_sha) WHERE blob_sha IS NOT NULL;
CREATE INDEX adk_user_state_by_blob ON adk_user_state(blob_sha) WHERE blob_sha IS NOT NULL;

-- ---- from migrations/0008_shards.sql

-- The sharded layout (sqlite+sharded:///DIR): in its catalog database, which
-- shard file holds each session, and the catalog+shard writes under way.  In a
-- single-file store, in a shard and on PostgreSQL these tables stay empty.

-- A session whose rows live in a shard (the catalog's sessions row is its index
-- entry); a session without a row here lives in the catalog itself.
CREATE TABLE shard_sessions (
    session_id  TEXT COLLATE "C" PRIMARY KEY,
    shard       TEXT COLLATE "C" NOT NULL
);
CREATE INDEX shard_sessions_by_shard ON shard_sessions(shard);

-- A write that changes a shard and then the catalog: recorded here first, deleted
-- with the catalog's part; a row whose owner died is finished by the next open.
CREATE TABLE shard_intents (
    op_id       TEXT COLLATE "C" PRIMARY KEY,
    shard       TEXT COLLATE "C" NOT NULL,
    op          TEXT COLLATE "C" NOT NULL,
    owner       TEXT COLLATE "C" NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL
);

-- ---- from migrations/0011_search.sql

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
