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
    version      INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX sessions_by_parent ON sessions(parent_id);
CREATE INDEX sessions_by_root ON sessions(root_id);
CREATE INDEX sessions_by_project ON sessions(project, id);

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
    applied_at  REAL NOT NULL
) WITHOUT ROWID;
