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
