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
