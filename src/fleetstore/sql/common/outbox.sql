-- The outbox (fleetstore.domain.outbox): effects, their threads, claims, settling
-- and sweeps, and the declared kinds.

-- effect_get: one effect
SELECT id, thread_key, seq, kind, enc, payload, blob_sha, size, state, attempt, max_attempts,
       replay_safe, available_at, fence, lease_owner, lease_expires_at, idempotency_key, result,
       last_error, dead_reason, errors, created_at, updated_at, started_at, finished_at
FROM effects WHERE id = ?

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
LIMIT :limit

-- effect_counts: how many effects are in each state
SELECT state, count(*) FROM effects GROUP BY state

-- effect_expired_count: running effects whose lease has expired (the sweep's work)
SELECT count(*) FROM effects WHERE state = 'running' AND lease_expires_at < ?

-- effect_by_key: the effect enqueued under an idempotency key
SELECT id, thread_key, kind FROM effects WHERE idempotency_key = ?

-- effect_thread_last_seq: the highest seq of a thread (0 for none)
SELECT coalesce(max(seq), 0) FROM effects WHERE thread_key = ?

-- effect_thread_has_active: does the thread have a pending or running effect?
SELECT 1 FROM effects WHERE thread_key = ? AND state IN ('pending', 'running') LIMIT 1

-- effect_insert: a new pending effect
INSERT INTO effects (id, thread_key, seq, kind, enc, payload, blob_sha, size, state, is_head,
                     attempt, max_attempts, replay_safe, available_at, idempotency_key,
                     created_at, updated_at)
VALUES (:id, :thread, :seq, :kind, :enc, :payload, :blob_sha, :size, 'pending', :is_head,
        0, :max_attempts, :replay_safe, :available_at, :key, :now, :now)

-- effect_next_ready: when the next claimable head becomes available (NULL: none); INDEXED BY because without statistics the planner picks effects_by_state and reads every pending row (7 ms at 10,000 pending, inside the claim's transaction, against 10-20 us)
SELECT min(available_at) FROM effects INDEXED BY effects_ready
WHERE state = 'pending' AND is_head = 1
  AND (:kinds IS NULL OR kind IN (SELECT value FROM json_each(:kinds)))

-- effect_active_count: pending or running effects (of these kinds)
SELECT count(*) FROM effects
WHERE state IN ('pending', 'running')
  AND (:kinds IS NULL OR kind IN (SELECT value FROM json_each(:kinds)))

-- effect_claim: take up to :limit ready heads, oldest first, in one statement; :timeouts (JSON object, kind -> seconds, or NULL) sets each one's deadline; returns what a worker needs of each (outbox.claimed_effect)
UPDATE effects
SET state = 'running', attempt = attempt + 1, fence = fence + 1, lease_owner = :owner,
    lease_expires_at = :now + :lease, started_at = :now, updated_at = :now, claim_op = :claim_op,
    deadline = :now + (SELECT value FROM json_each(:timeouts) WHERE key = effects.kind)
WHERE id IN (
    SELECT id FROM effects INDEXED BY effects_ready
    WHERE state = 'pending' AND is_head = 1 AND available_at <= :now
      AND (:kinds IS NULL OR kind IN (SELECT value FROM json_each(:kinds)))
    ORDER BY available_at, thread_key
    LIMIT :limit
)
RETURNING id, thread_key, seq, kind, enc, payload, blob_sha, size, attempt, max_attempts,
          replay_safe, available_at, fence, lease_owner, lease_expires_at, idempotency_key,
          last_error, created_at, started_at

-- effect_claim_next: settle-and-claim: the head a settlement just handed its thread on to, claimed in the same transaction for the settling worker (:claim_op: the settlement's operation id) if it is pending, available now and of the worker's kinds; its id
UPDATE effects
SET state = 'running', attempt = attempt + 1, fence = fence + 1, lease_owner = :owner,
    lease_expires_at = :now + :lease, started_at = :now, updated_at = :now, claim_op = :claim_op,
    deadline = :now + (SELECT value FROM json_each(:timeouts) WHERE key = effects.kind)
WHERE id = :id AND state = 'pending' AND is_head = 1 AND available_at <= :now
  AND (:kinds IS NULL OR kind IN (SELECT value FROM json_each(:kinds)))
RETURNING id

-- effect_claimed_by: what one claim took (a claim run again after a lost COMMIT), as effect_claim returns it
SELECT id, thread_key, seq, kind, enc, payload, blob_sha, size, attempt, max_attempts,
       replay_safe, available_at, fence, lease_owner, lease_expires_at, idempotency_key,
       last_error, created_at, started_at
FROM effects WHERE state = 'running' AND claim_op = ?
ORDER BY available_at, thread_key

-- effect_replay_safe: may the effect run again while an attempt of it may still be running (1) or not (0): as the sweep decides
SELECT coalesce(e.replay_safe, k.replay_safe, 1)
FROM effects e LEFT JOIN effect_kinds k ON k.kind = e.kind
WHERE e.id = ?

-- effect_for_settle: what a settlement checks before it writes
SELECT thread_key, state, fence, lease_owner, attempt, max_attempts, errors, dead_reason
FROM effects WHERE id = ?

-- effect_heartbeat: extend a lease, only for the claim that holds it; an effect a sweep put back to pending, and nobody claimed since, is taken back
UPDATE effects
SET state = 'running', lease_owner = :owner, lease_expires_at = :now + :lease, updated_at = :now
WHERE id = :id AND fence = :fence AND state IN ('running', 'pending')
RETURNING lease_expires_at

-- effect_fence_raise: a new fencing token, nothing else changed (a timed-out attempt's claim must settle nothing after)
UPDATE effects SET fence = fence + 1, updated_at = ? WHERE id = ?

-- effect_settle: a running (or pending) effect's new state; the caller checked the fence
UPDATE effects
SET state = :state, is_head = :is_head, lease_owner = NULL, lease_expires_at = NULL,
    available_at = :available_at, result = :result, last_error = :error,
    dead_reason = :dead_reason, errors = :errors, attempt = :attempt,
    finished_at = :finished_at, updated_at = :now, fence = fence + :bump
WHERE id = :id

-- effect_requeue: an operator's retry: pending again at the end of its thread
UPDATE effects
SET state = 'pending', is_head = :is_head, seq = :seq, attempt = 0, available_at = :now,
    dead_reason = NULL, finished_at = NULL, updated_at = :now, fence = fence + 1
WHERE id = :id

-- effect_make_due: a pending effect may run now
UPDATE effects SET available_at = min(available_at, ?), updated_at = ?, fence = fence + 1
WHERE id = ?

-- effect_clear_head: the thread's head flag off (before another effect takes it)
UPDATE effects SET is_head = 0 WHERE thread_key = ? AND is_head = 1

-- effect_advance_head: the thread's lowest active effect becomes its head; its state (a pending one is claimable: the caller claims it for the settling worker, or rings) and id
UPDATE effects SET is_head = 1
WHERE id = (
    SELECT id FROM effects
    WHERE thread_key = ? AND state IN ('pending', 'running')
    ORDER BY seq LIMIT 1
)
RETURNING state, id

-- effect_sweep: expired leases back to pending (replay-safe, attempts left) or to dead, in one guarded statement
UPDATE effects
SET state = v.verdict,
    is_head = (v.verdict = 'pending'),
    lease_owner = NULL,
    lease_expires_at = NULL,
    available_at = :now,
    last_error = v.message,
    dead_reason = v.dead_reason,
    errors = json_insert(
        CASE WHEN json_array_length(effects.errors) >= :kept
             THEN json_remove(effects.errors, '$[0]') ELSE effects.errors END,
        '$[#]',
        json_object('attempt', effects.attempt, 'error', v.message, 'at', :now,
                    'owner', effects.lease_owner)),
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
    )
) AS v
WHERE effects.id = v.id AND effects.state = 'running' AND effects.lease_expires_at < :now
RETURNING effects.id, effects.thread_key, effects.state

-- effect_declare_kind: record whether a kind may run again after its owner was lost
INSERT INTO effect_kinds (kind, replay_safe, declared_at) VALUES (?, ?, ?)
ON CONFLICT (kind) DO UPDATE SET replay_safe = excluded.replay_safe, declared_at = excluded.declared_at
WHERE effect_kinds.replay_safe IS NOT excluded.replay_safe

-- effect_kinds: the declared kinds
SELECT kind, replay_safe, declared_at FROM effect_kinds ORDER BY kind

-- effect_set_trace: the trace context an effect was enqueued in (trace_effects)
UPDATE effects SET trace_context = ? WHERE id = ?

-- effect_trace: the trace context an effect was enqueued in (NULL: none carried)
SELECT trace_context FROM effects WHERE id = ?
