-- The whole SQLite schema of a fleetstore store: what migrations/0001..0011 build,
-- written out in one piece to read (tests/sql/test_schema.py checks that the two agree).
-- A store is always built by its migrations; a new migration changes this file too.

-- ---- from migrations/0001_history.sql

-- Session history: sessions (trees of subagents, forks), messages, parts,
-- streamed chunks, usage, versioned state, blob references and the log of
-- applied operations that makes every write idempotent.

CREATE TABLE sessions (
    id           TEXT PRIMARY KEY,
    parent_id    TEXT REFERENCES sessions(id) ON DELETE CASCADE,
    root_id      TEXT NOT NULL,
    forked_from  TEXT,
    fork_seq     INTEGER,
    project      TEXT,
    title        TEXT,
    status       TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'archived')),
    metadata     TEXT NOT NULL DEFAULT '{}',
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    archived_at  REAL,
    version      INTEGER NOT NULL DEFAULT 1,
    -- A delete or fork under way: no read shows the session (migration 0010).
    job          TEXT CHECK (job IN ('fork', 'delete')),
    job_owner    TEXT
);
CREATE INDEX sessions_by_parent ON sessions(parent_id);
CREATE INDEX sessions_by_root ON sessions(root_id);
CREATE INDEX sessions_by_project ON sessions(project, id);
CREATE INDEX sessions_with_job ON sessions(job) WHERE job IS NOT NULL;

CREATE TABLE messages (
    id            TEXT PRIMARY KEY,
    session_id    TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq           INTEGER NOT NULL,
    role          TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('streaming', 'complete', 'error')),
    model         TEXT,
    metadata      TEXT NOT NULL DEFAULT '{}',
    error         TEXT,
    created_at    REAL NOT NULL,
    completed_at  REAL,
    UNIQUE (session_id, seq)
);

-- A part's body is inline (body), or a blob (blob_sha), or, for streamed
-- text, the chunks appended to it in order: never rewritten whole.
CREATE TABLE parts (
    message_id  TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    session_id  TEXT NOT NULL,
    kind        TEXT NOT NULL,
    meta        TEXT NOT NULL DEFAULT '{}',
    enc         TEXT NOT NULL CHECK (enc IN ('str', 'bytes', 'json', 'chunks')),
    body        BLOB,
    blob_sha    TEXT REFERENCES blobs(sha256),
    size        INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (message_id, seq)
);
CREATE INDEX parts_by_blob ON parts(blob_sha) WHERE blob_sha IS NOT NULL;

CREATE TABLE chunks (
    message_id  TEXT NOT NULL,
    part_seq    INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    text        TEXT NOT NULL,
    PRIMARY KEY (message_id, part_seq, seq),
    FOREIGN KEY (message_id, part_seq) REFERENCES parts(message_id, seq) ON DELETE CASCADE
);

CREATE TABLE usage (
    message_id          TEXT PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
    session_id          TEXT NOT NULL,
    model               TEXT,
    input_tokens        INTEGER NOT NULL DEFAULT 0,
    output_tokens       INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens   INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens  INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens    INTEGER NOT NULL DEFAULT 0,
    cost                REAL NOT NULL DEFAULT 0
);
CREATE INDEX usage_by_session ON usage(session_id);

CREATE TABLE state (
    session_id  TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    namespace   TEXT NOT NULL,
    key         TEXT NOT NULL,
    version     INTEGER NOT NULL,
    enc         TEXT NOT NULL CHECK (enc IN ('json', 'bytes')),
    value       BLOB,
    blob_sha    TEXT REFERENCES blobs(sha256),
    size        INTEGER NOT NULL DEFAULT 0,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (session_id, namespace, key)
) WITHOUT ROWID;

CREATE TABLE blobs (
    sha256       TEXT PRIMARY KEY,
    size         INTEGER NOT NULL,
    stored_size  INTEGER NOT NULL,
    codec        TEXT NOT NULL,
    created_at   REAL NOT NULL
) WITHOUT ROWID;

-- One row per applied operation id: applying an operation twice finds its
-- row and does nothing (DESIGN.md promise 2).
CREATE TABLE applied_ops (
    op_id       TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    session_id  TEXT,
    applied_at  REAL NOT NULL,
    result      TEXT
) WITHOUT ROWID;

-- ---- from migrations/0002_effects.sql

-- The durable effect outbox.  One row per effect; per thread, effects run in
-- seq order and one at a time: only the thread's head (its lowest-seq effect
-- still pending or running, flagged is_head) can be claimed, and the partial
-- unique indexes below make "two running in one thread" and "two heads in one
-- thread" impossible, whatever a query does.
CREATE TABLE effects (
    id               TEXT PRIMARY KEY,
    thread_key       TEXT NOT NULL,
    seq              INTEGER NOT NULL,
    kind             TEXT NOT NULL,
    enc              TEXT NOT NULL CHECK (enc IN ('json', 'bytes')),
    payload          BLOB,
    blob_sha         TEXT REFERENCES blobs(sha256),
    size             INTEGER NOT NULL DEFAULT 0,
    state            TEXT NOT NULL
                     CHECK (state IN ('pending', 'running', 'succeeded', 'dead', 'cancelled')),
    is_head          INTEGER NOT NULL DEFAULT 0 CHECK (is_head IN (0, 1)),
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    -- NULL: as the kind declares (effect_kinds), else replay-safe.
    replay_safe      INTEGER CHECK (replay_safe IN (0, 1)),
    available_at     REAL NOT NULL,
    -- The fencing token: raised by every claim, sweep, release and operator
    -- action, so a settlement carrying an older one changes nothing.
    fence            INTEGER NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_expires_at REAL,
    idempotency_key  TEXT UNIQUE,
    result           TEXT,
    last_error       TEXT,
    dead_reason      TEXT,
    errors           TEXT NOT NULL DEFAULT '[]',
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    started_at       REAL,
    finished_at      REAL,
    -- The claim operation that took a running effect (migration 0006).
    claim_op         TEXT,
    -- When its worker gives up on the attempt running now (migration 0009).
    deadline         REAL,
    -- The trace context it was enqueued in, when carried (migration 0012).
    trace_context    TEXT,
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

-- What workers declare about each kind: may it run again after its owner was lost?
CREATE TABLE effect_kinds (
    kind         TEXT PRIMARY KEY,
    replay_safe  INTEGER NOT NULL CHECK (replay_safe IN (0, 1)),
    declared_at  REAL NOT NULL
) WITHOUT ROWID;

-- ---- from migrations/0003_checkpoints.sql

-- Graph checkpoints (LangGraph's checkpoint saver contract; fleetstore.domain.langgraph):
-- a checkpoint row per (thread, namespace, checkpoint id), its channel values
-- stored once per channel version and shared by the checkpoints that did not
-- change them, and the pending writes of the tasks run from a checkpoint.
-- A body is inline (body) or a blob (blob_sha); ``type`` is the serializer's
-- tag for its bytes.  Thread ids are free-form text, not fleetstore sessions.

CREATE TABLE ckpt_checkpoints (
    thread_id      TEXT NOT NULL,
    checkpoint_ns  TEXT NOT NULL,
    checkpoint_id  TEXT NOT NULL,
    parent_id      TEXT,
    type           TEXT NOT NULL,
    body           BLOB,
    blob_sha       TEXT REFERENCES blobs(sha256),
    size           INTEGER NOT NULL DEFAULT 0,
    -- JSON object, keys sorted: list filters compare it in SQL.
    metadata       TEXT NOT NULL DEFAULT '{}',
    -- JSON object channel -> version key: the ckpt_channels rows this
    -- checkpoint reads (and keeps alive when others are pruned).
    channel_keys   TEXT NOT NULL DEFAULT '{}',
    run_id         TEXT,
    created_at     REAL NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
) WITHOUT ROWID;
CREATE INDEX ckpt_checkpoints_by_run ON ckpt_checkpoints(run_id) WHERE run_id IS NOT NULL;

CREATE TABLE ckpt_channels (
    thread_id      TEXT NOT NULL,
    checkpoint_ns  TEXT NOT NULL,
    channel        TEXT NOT NULL,
    version        TEXT NOT NULL,
    type           TEXT NOT NULL,
    body           BLOB,
    blob_sha       TEXT REFERENCES blobs(sha256),
    size           INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
) WITHOUT ROWID;

CREATE TABLE ckpt_writes (
    thread_id      TEXT NOT NULL,
    checkpoint_ns  TEXT NOT NULL,
    checkpoint_id  TEXT NOT NULL,
    task_id        TEXT NOT NULL,
    idx            INTEGER NOT NULL,
    channel        TEXT NOT NULL,
    type           TEXT NOT NULL,
    body           BLOB,
    blob_sha       TEXT REFERENCES blobs(sha256),
    size           INTEGER NOT NULL DEFAULT 0,
    task_path      TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
) WITHOUT ROWID;

-- ---- from migrations/0004_adk.sql

-- Google ADK sessions (fleetstore.integrations.adk, operations in fleetstore/adk_ops.py).
-- An ADK session is a fleetstore session (id derived from app, user and session id)
-- whose events are its messages and whose state is its state (namespace 'adk');
-- this table finds it by its ADK names and keeps what ADK asks of a session row:
-- the update time it lists by, and the revision that stale-session detection
-- compares (the op id of the last write to the session).
CREATE TABLE adk_sessions (
    app_name     TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    session_id   TEXT NOT NULL,
    fs_id        TEXT NOT NULL UNIQUE REFERENCES sessions(id) ON DELETE CASCADE,
    revision     TEXT NOT NULL,
    create_time  REAL NOT NULL,
    update_time  REAL NOT NULL,
    PRIMARY KEY (app_name, user_id, session_id)
) WITHOUT ROWID;
-- list_sessions pages in ADK's order: update time, then user, then session id.
CREATE INDEX adk_sessions_by_update ON adk_sessions(app_name, update_time, user_id, session_id);
CREATE INDEX adk_sessions_by_user ON adk_sessions(app_name, user_id, update_time, session_id);

-- The app and user state, one row per key (prefix removed), shared by every session
-- of the app / of the user in the app.  A value is JSON, inline or a blob.
CREATE TABLE adk_app_state (
    app_name    TEXT NOT NULL,
    key         TEXT NOT NULL,
    enc         TEXT NOT NULL CHECK (enc = 'json'),
    value       BLOB,
    blob_sha    TEXT REFERENCES blobs(sha256),
    size        INTEGER NOT NULL DEFAULT 0,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (app_name, key)
) WITHOUT ROWID;

CREATE TABLE adk_user_state (
    app_name    TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    key         TEXT NOT NULL,
    enc         TEXT NOT NULL CHECK (enc = 'json'),
    value       BLOB,
    blob_sha    TEXT REFERENCES blobs(sha256),
    size        INTEGER NOT NULL DEFAULT 0,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (app_name, user_id, key)
) WITHOUT ROWID;

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
    session_id  TEXT PRIMARY KEY,
    shard       TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX shard_sessions_by_shard ON shard_sessions(shard);

-- A write that changes a shard and then the catalog: recorded here first, deleted
-- with the catalog's part; a row whose owner died is finished by the next open.
CREATE TABLE shard_intents (
    op_id       TEXT PRIMARY KEY,
    shard       TEXT NOT NULL,
    op          TEXT NOT NULL,
    owner       TEXT NOT NULL,
    created_at  REAL NOT NULL
) WITHOUT ROWID;

-- ---- from migrations/0011_search.sql

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
