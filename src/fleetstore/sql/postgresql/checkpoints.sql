-- PostgreSQL's text of the queries of sql/common/checkpoints.sql that differ here: the
-- same names, parameters and result columns.
-- Parameters are positional in the order the
-- callers pass them: where SQLite numbers them (?1, ?2, ?3) the statements here are
-- arranged so that each one appears once, in that order.  The metadata filter
-- compares values as jsonb (1 and 1.0 are equal here, not on SQLite), one value at
-- a time, reading the stored JSON as json, which (unlike jsonb) accepts any JSON text.
-- A negative limit means no limit, as on SQLite: LIMIT nullif(greatest(n, -1), -1)
-- is PostgreSQL's LIMIT NULL (all rows) for those, LIMIT n otherwise.

-- ckpt_upsert: store a checkpoint (a retried or repeated put replaces it whole)
INSERT INTO ckpt_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_id, type, body,
                              blob_sha, size, metadata, channel_keys, run_id, created_at)
VALUES (:thread, :ns, :id, :parent, :type, fleetstore_bytes(:body), :blob_sha, :size, :metadata,
        :channel_keys, :run_id, :now)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_id = excluded.parent_id, type = excluded.type, body = excluded.body,
    blob_sha = excluded.blob_sha, size = excluded.size, metadata = excluded.metadata,
    channel_keys = excluded.channel_keys, run_id = excluded.run_id

-- ckpt_channel_insert: one channel value at one version (first write wins: versions are immutable)
INSERT INTO ckpt_channels (thread_id, checkpoint_ns, channel, version, type, body, blob_sha, size)
VALUES (:thread, :ns, :channel, :version, :type, fleetstore_bytes(:body), :blob_sha, :size)
ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING

-- ckpt_write_insert: one pending write of a task (a repeated one is ignored)
INSERT INTO ckpt_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type,
                         body, blob_sha, size, task_path)
VALUES (:thread, :ns, :id, :task, :idx, :channel, :type, fleetstore_bytes(:body), :blob_sha,
        :size, :task_path)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING

-- ckpt_write_upsert: a special write (error, interrupt...) under its fixed negative idx, replaced
INSERT INTO ckpt_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type,
                         body, blob_sha, size, task_path)
VALUES (:thread, :ns, :id, :task, :idx, :channel, :type, fleetstore_bytes(:body), :blob_sha,
        :size, :task_path)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = excluded.channel, type = excluded.type, body = excluded.body,
    blob_sha = excluded.blob_sha, size = excluded.size, task_path = excluded.task_path

-- ckpt_list_thread: a page of a thread's checkpoints, newest first; NULL parameters match all
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_id, c.type, c.body, c.blob_sha,
       c.size, c.metadata, c.channel_keys
FROM ckpt_checkpoints c
WHERE c.thread_id = :thread
  AND (:ns IS NULL OR c.checkpoint_ns = :ns)
  AND (:id IS NULL OR c.checkpoint_id = :id)
  AND (:before IS NULL OR c.checkpoint_id < :before)
  AND (:after_id IS NULL OR (c.checkpoint_id, c.checkpoint_ns) < (:after_id, :after_ns))
  AND (:filter IS NULL OR NOT EXISTS (
        SELECT 1 FROM json_each(:filter::json) f
        WHERE (c.metadata::json -> f.key)::jsonb IS DISTINCT FROM f.value::jsonb))
ORDER BY c.checkpoint_id DESC, c.checkpoint_ns DESC
LIMIT nullif(greatest(:limit, -1), -1)

-- ckpt_list_all: a page of every thread's checkpoints, newest first; NULL parameters match all
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_id, c.type, c.body, c.blob_sha,
       c.size, c.metadata, c.channel_keys
FROM ckpt_checkpoints c
WHERE (:ns IS NULL OR c.checkpoint_ns = :ns)
  AND (:id IS NULL OR c.checkpoint_id = :id)
  AND (:before IS NULL OR c.checkpoint_id < :before)
  AND (:after_id IS NULL
       OR (c.checkpoint_id, c.thread_id, c.checkpoint_ns) < (:after_id, :after_thread, :after_ns))
  AND (:filter IS NULL OR NOT EXISTS (
        SELECT 1 FROM json_each(:filter::json) f
        WHERE (c.metadata::json -> f.key)::jsonb IS DISTINCT FROM f.value::jsonb))
ORDER BY c.checkpoint_id DESC, c.thread_id DESC, c.checkpoint_ns DESC
LIMIT nullif(greatest(:limit, -1), -1)

-- ckpt_values: the channel values a checkpoint reads (its channel_keys JSON is the 3rd parameter)
SELECT b.channel, b.type, b.body, b.blob_sha, b.size
FROM ckpt_channels b
WHERE b.thread_id = ? AND b.checkpoint_ns = ?
  AND (b.channel, b.version) IN (SELECT k.key, k.value FROM json_each_text(?::json) k)

-- ckpt_stored_channels: the channels a checkpoint holds a value for (not merely a version)
SELECT b.channel
FROM ckpt_channels b
WHERE b.thread_id = ? AND b.checkpoint_ns = ?
  AND (b.channel, b.version) IN (SELECT k.key, k.value FROM json_each_text(?::json) k)
  AND b.type <> 'empty'

-- ckpt_unreferenced_channels: drop channel values no checkpoint of the namespace reads any more
DELETE FROM ckpt_channels b
WHERE b.thread_id = ? AND b.checkpoint_ns = ?
  AND NOT EXISTS (
      SELECT 1 FROM ckpt_checkpoints c, json_each_text(c.channel_keys::json) k
      WHERE c.thread_id = b.thread_id AND c.checkpoint_ns = b.checkpoint_ns
        AND k.key = b.channel AND k.value = b.version)

-- ckpt_copy_checkpoints: copy a thread's checkpoints to another thread (existing ones are kept)
WITH p (source, target) AS (VALUES (?::text, ?::text))
INSERT INTO ckpt_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_id, type, body,
                              blob_sha, size, metadata, channel_keys, run_id, created_at)
SELECT p.target, c.checkpoint_ns, c.checkpoint_id, c.parent_id, c.type, c.body, c.blob_sha,
       c.size, c.metadata, c.channel_keys, c.run_id, c.created_at
FROM p, ckpt_checkpoints c WHERE c.thread_id = p.source
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO NOTHING

-- ckpt_copy_channels: copy a thread's channel values to another thread
WITH p (source, target) AS (VALUES (?::text, ?::text))
INSERT INTO ckpt_channels (thread_id, checkpoint_ns, channel, version, type, body, blob_sha, size)
SELECT p.target, c.checkpoint_ns, c.channel, c.version, c.type, c.body, c.blob_sha, c.size
FROM p, ckpt_channels c WHERE c.thread_id = p.source
ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING

-- ckpt_copy_writes: copy a thread's pending writes to another thread
WITH p (source, target) AS (VALUES (?::text, ?::text))
INSERT INTO ckpt_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type,
                         body, blob_sha, size, task_path)
SELECT p.target, c.checkpoint_ns, c.checkpoint_id, c.task_id, c.idx, c.channel, c.type, c.body,
       c.blob_sha, c.size, c.task_path
FROM p, ckpt_writes c WHERE c.thread_id = p.source
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
