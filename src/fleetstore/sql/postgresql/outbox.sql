-- PostgreSQL's text of the queries of sql/common/outbox.sql that differ here: the
-- same names, parameters and result columns.
-- A negative limit means no limit, as on SQLite: LIMIT nullif(greatest(n, -1), -1)
-- is PostgreSQL's LIMIT NULL (all rows) for those, LIMIT n otherwise.

-- effect_list: effects filtered (NULL filters match all), by thread and seq, after a cursor
SELECT id, thread_key, seq, kind, enc, payload, blob_sha, size, state, attempt, max_attempts,
       replay_safe, available_at, fence, lease_owner, lease_expires_at, idempotency_key, result,
       last_error, dead_reason, errors, created_at, updated_at, started_at, finished_at
FROM effects
WHERE (:thread IS NULL OR thread_key = :thread)
  AND (:state IS NULL OR state = :state)
  AND (:kind IS NULL OR kind = :kind)
  AND (:after_thread IS NULL OR (thread_key, seq) > (:after_thread, :after_seq))
ORDER BY thread_key, seq
LIMIT nullif(greatest(:limit, -1), -1)

-- effect_thread_has_active: does the thread have a pending or running effect?  The thread's head row is touched first (an update that changes nothing): under snapshot isolation, an enqueue deciding "not the head" and a settlement of that head deciding "no next effect" would otherwise both commit and leave the thread without a head for ever (write skew); touching the row makes the later of the two fail with 40001 and start over, seeing the other
WITH t AS (SELECT ?::text AS key),
touched AS (
    UPDATE effects SET updated_at = updated_at
    WHERE thread_key = (SELECT key FROM t) AND is_head = 1
    RETURNING 1
)
SELECT 1 FROM effects
WHERE thread_key = (SELECT key FROM t) AND state IN ('pending', 'running')
   OR EXISTS (SELECT 1 FROM touched)
LIMIT 1

-- effect_insert: a new pending effect
INSERT INTO effects (id, thread_key, seq, kind, enc, payload, blob_sha, size, state, is_head,
                     attempt, max_attempts, replay_safe, available_at, idempotency_key,
                     created_at, updated_at)
VALUES (:id, :thread, :seq, :kind, :enc, fleetstore_bytes(:payload), :blob_sha, :size, 'pending',
        :is_head, 0, :max_attempts, :replay_safe, :available_at, :key, :now, :now)

-- effect_next_ready: when the next claimable head becomes available (NULL: none)
SELECT min(available_at) FROM effects
WHERE state = 'pending' AND is_head = 1
  AND (:kinds IS NULL OR kind IN (SELECT json_array_elements_text(:kinds::json)))

-- effect_active_count: pending or running effects (of these kinds)
SELECT count(*) FROM effects
WHERE state IN ('pending', 'running')
  AND (:kinds IS NULL OR kind IN (SELECT json_array_elements_text(:kinds::json)))

-- effect_claim: take up to :limit ready heads, oldest first, in one statement; SKIP LOCKED passes over the heads another claim is taking, and the outer SELECT only orders what the UPDATE returns; :timeouts (JSON object, kind -> seconds, or NULL) sets each one's deadline; returns what a worker needs of each (outbox.claimed_effect)
WITH claimed AS (
    UPDATE effects
    SET state = 'running', attempt = attempt + 1, fence = fence + 1, lease_owner = :owner,
        lease_expires_at = :now + :lease, started_at = :now, updated_at = :now,
        claim_op = :claim_op,
        deadline = :now + (:timeouts::jsonb ->> kind)::double precision
    WHERE id IN (
        SELECT id FROM effects
        WHERE state = 'pending' AND is_head = 1 AND available_at <= :now
          AND (:kinds IS NULL OR kind IN (SELECT json_array_elements_text(:kinds::json)))
        ORDER BY available_at, thread_key
        LIMIT nullif(greatest(:limit, -1), -1)
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id, thread_key, seq, kind, enc, payload, blob_sha, size, attempt,
              max_attempts, replay_safe, available_at, fence, lease_owner, lease_expires_at,
              idempotency_key, last_error, created_at, started_at
)
SELECT id, thread_key, seq, kind, enc, payload, blob_sha, size, attempt, max_attempts,
       replay_safe, available_at, fence, lease_owner, lease_expires_at, idempotency_key,
       last_error, created_at, started_at
FROM claimed
ORDER BY available_at, thread_key

-- effect_claim_next: settle-and-claim: the head a settlement just handed its thread on to, claimed in the same transaction for the settling worker (:claim_op: the settlement's operation id) if it is pending, available now and of the worker's kinds; its id
UPDATE effects
SET state = 'running', attempt = attempt + 1, fence = fence + 1, lease_owner = :owner,
    lease_expires_at = :now + :lease, started_at = :now, updated_at = :now, claim_op = :claim_op,
    deadline = :now + (:timeouts::jsonb ->> kind)::double precision
WHERE id = :id AND state = 'pending' AND is_head = 1 AND available_at <= :now
  AND (:kinds IS NULL OR kind IN (SELECT json_array_elements_text(:kinds::json)))
RETURNING id

-- effect_make_due: a pending effect may run now
UPDATE effects SET available_at = LEAST(available_at, ?), updated_at = ?, fence = fence + 1
WHERE id = ?

-- effect_sweep: expired leases back to pending (replay-safe, attempts left) or to dead, in one guarded statement
UPDATE effects
SET state = v.verdict,
    is_head = (v.verdict = 'pending')::int,
    lease_owner = NULL,
    lease_expires_at = NULL,
    available_at = :now,
    last_error = v.message,
    dead_reason = v.dead_reason,
    errors = (
        SELECT json_agg(x.e ORDER BY x.n NULLS LAST)::text
        FROM (
            SELECT e, n FROM json_array_elements(effects.errors::json) WITH ORDINALITY AS a(e, n)
            WHERE n > CASE WHEN json_array_length(effects.errors::json) >= :kept THEN 1 ELSE 0 END
            UNION ALL
            SELECT json_build_object('attempt', effects.attempt, 'error', v.message, 'at', :now,
                                     'owner', effects.lease_owner), NULL
        ) AS x
    ),
    finished_at = CASE WHEN v.verdict = 'dead' THEN :now END,
    updated_at = :now
FROM (
    SELECT id,
           CASE WHEN dead_reason IS NULL THEN 'pending' ELSE 'dead' END AS verdict,
           dead_reason,
           'the lease of ' || lease_owner || ' expired during attempt ' || attempt
           || CASE dead_reason
                  WHEN 'not_replay_safe' THEN '; kind ' || kind || ' is not replay-safe: not run again'
                  WHEN 'attempts_exhausted' THEN '; no attempts left'
                  ELSE '' END AS message
    FROM (
        SELECT e.id, e.kind, e.attempt, e.lease_owner,
               CASE WHEN coalesce(e.replay_safe, k.replay_safe, 1) = 0 THEN 'not_replay_safe'
                    WHEN e.attempt >= e.max_attempts THEN 'attempts_exhausted' END AS dead_reason
        FROM effects e LEFT JOIN effect_kinds k ON k.kind = e.kind
        WHERE e.state = 'running' AND e.lease_expires_at < :now
    ) AS x
) AS v
WHERE effects.id = v.id AND effects.state = 'running' AND effects.lease_expires_at < :now
RETURNING effects.id, effects.thread_key, effects.state

-- effect_declare_kind: record whether a kind may run again after its owner was lost
INSERT INTO effect_kinds (kind, replay_safe, declared_at) VALUES (?, ?, ?)
ON CONFLICT (kind) DO UPDATE SET replay_safe = excluded.replay_safe, declared_at = excluded.declared_at
WHERE effect_kinds.replay_safe IS DISTINCT FROM excluded.replay_safe
