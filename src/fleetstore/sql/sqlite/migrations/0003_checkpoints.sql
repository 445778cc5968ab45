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
