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
