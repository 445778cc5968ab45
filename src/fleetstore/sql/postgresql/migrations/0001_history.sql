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
    version      BIGINT NOT NULL DEFAULT 1
);
CREATE INDEX sessions_by_parent ON sessions(parent_id);
CREATE INDEX sessions_by_root ON sessions(root_id);
CREATE INDEX sessions_by_project ON sessions(project, id);

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
    applied_at  DOUBLE PRECISION NOT NULL
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
