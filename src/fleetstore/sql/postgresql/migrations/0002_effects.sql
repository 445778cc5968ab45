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
