-- The sharded layout's catalog (fleetstore.store.sharded).

-- shard_of: the shard holding a session (no row: the catalog holds it)
SELECT shard FROM shard_sessions WHERE session_id = ?

-- shard_index_ids: the sessions the catalog says a shard holds
SELECT session_id FROM shard_sessions WHERE shard = ?

-- shard_index_put: a session lives in a shard
INSERT INTO shard_sessions (session_id, shard) VALUES (?, ?)
ON CONFLICT (session_id) DO UPDATE SET shard = excluded.shard

-- shard_index_drop: a session left the shard (deleted)
DELETE FROM shard_sessions WHERE session_id = ?

-- shard_list: every shard the catalog knows, with its session count
SELECT shard, count(*) FROM shard_sessions GROUP BY shard ORDER BY shard

-- shard_session_rows: every session row of a shard, for the catalog's index (those being deleted or forked too, with their job: the catalog keeps them hidden)
SELECT id, parent_id, root_id, forked_from, fork_seq, project, title, status, metadata,
       created_at, updated_at, archived_at, version, job, job_owner
FROM sessions ORDER BY created_at, id

-- shard_session_upsert: the catalog's index row of a session, as its shard has it
INSERT INTO sessions (id, parent_id, root_id, forked_from, fork_seq, project, title, status,
                      metadata, created_at, updated_at, archived_at, version, job, job_owner)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET
    parent_id = excluded.parent_id, root_id = excluded.root_id,
    forked_from = excluded.forked_from, fork_seq = excluded.fork_seq,
    project = excluded.project, title = excluded.title, status = excluded.status,
    metadata = excluded.metadata, created_at = excluded.created_at,
    updated_at = excluded.updated_at, archived_at = excluded.archived_at,
    version = excluded.version, job = excluded.job, job_owner = excluded.job_owner

-- shard_intent_add: a catalog+shard write begins
INSERT INTO shard_intents (op_id, shard, op, owner, created_at) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (op_id) DO NOTHING

-- shard_intent_done: a catalog+shard write is complete (or abandoned)
DELETE FROM shard_intents WHERE op_id = ?

-- shard_intent_get: one catalog+shard write under way
SELECT shard, op, owner FROM shard_intents WHERE op_id = ?

-- shard_intents: the catalog+shard writes under way, oldest first
SELECT op_id, shard, op, owner FROM shard_intents ORDER BY created_at, op_id

-- shard_keys_of_project: the shards holding sessions of a project
SELECT DISTINCT x.shard FROM shard_sessions x JOIN sessions s ON s.id = x.session_id
WHERE s.project = ?
