-- LangGraph's checkpoints (fleetstore.domain.langgraph), prefixed ckpt_;
-- tables in migration 0003.

-- ckpt_upsert: store a checkpoint (a retried or repeated put replaces it whole)
INSERT INTO ckpt_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_id, type, body,
                              blob_sha, size, metadata, channel_keys, run_id, created_at)
VALUES (:thread, :ns, :id, :parent, :type, :body, :blob_sha, :size, :metadata, :channel_keys,
        :run_id, :now)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_id = excluded.parent_id, type = excluded.type, body = excluded.body,
    blob_sha = excluded.blob_sha, size = excluded.size, metadata = excluded.metadata,
    channel_keys = excluded.channel_keys, run_id = excluded.run_id

-- ckpt_channel_insert: one channel value at one version (first write wins: versions are immutable)
INSERT INTO ckpt_channels (thread_id, checkpoint_ns, channel, version, type, body, blob_sha, size)
VALUES (:thread, :ns, :channel, :version, :type, :body, :blob_sha, :size)
ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING

-- ckpt_write_insert: one pending write of a task (a repeated one is ignored)
INSERT INTO ckpt_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type,
                         body, blob_sha, size, task_path)
VALUES (:thread, :ns, :id, :task, :idx, :channel, :type, :body, :blob_sha, :size, :task_path)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING

-- ckpt_write_upsert: a special write (error, interrupt...) under its fixed negative idx, replaced
INSERT INTO ckpt_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type,
                         body, blob_sha, size, task_path)
VALUES (:thread, :ns, :id, :task, :idx, :channel, :type, :body, :blob_sha, :size, :task_path)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = excluded.channel, type = excluded.type, body = excluded.body,
    blob_sha = excluded.blob_sha, size = excluded.size, task_path = excluded.task_path

-- ckpt_get: one checkpoint by id
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_id, type, body, blob_sha, size, metadata,
       channel_keys
FROM ckpt_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?

-- ckpt_latest: the newest checkpoint of a thread's namespace
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_id, type, body, blob_sha, size, metadata,
       channel_keys
FROM ckpt_checkpoints WHERE thread_id = ? AND checkpoint_ns = ?
ORDER BY checkpoint_id DESC LIMIT 1

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
        SELECT 1 FROM json_each(:filter) f
        WHERE NOT EXISTS (
            SELECT 1 FROM json_each(c.metadata) m
            WHERE m.key = f.key AND m.value IS f.value
              AND (m.type = f.type OR (m.type IN ('integer', 'real')
                                       AND f.type IN ('integer', 'real'))))))
ORDER BY c.checkpoint_id DESC, c.checkpoint_ns DESC
LIMIT :limit

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
        SELECT 1 FROM json_each(:filter) f
        WHERE NOT EXISTS (
            SELECT 1 FROM json_each(c.metadata) m
            WHERE m.key = f.key AND m.value IS f.value
              AND (m.type = f.type OR (m.type IN ('integer', 'real')
                                       AND f.type IN ('integer', 'real'))))))
ORDER BY c.checkpoint_id DESC, c.thread_id DESC, c.checkpoint_ns DESC
LIMIT :limit

-- ckpt_values: the channel values a checkpoint reads (its channel_keys JSON is the 3rd parameter)
SELECT b.channel, b.type, b.body, b.blob_sha, b.size
FROM json_each(?3) k
JOIN ckpt_channels b
  ON b.thread_id = ?1 AND b.checkpoint_ns = ?2 AND b.channel = k.key AND b.version = k.value

-- ckpt_writes_of: a checkpoint's pending writes, in the order a super-step applies them
SELECT task_id, channel, type, body, blob_sha, size FROM ckpt_writes
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
ORDER BY task_path, task_id, idx

-- ckpt_delete_thread_checkpoints: every checkpoint of a thread
DELETE FROM ckpt_checkpoints WHERE thread_id = ?

-- ckpt_delete_thread_channels: every channel value of a thread
DELETE FROM ckpt_channels WHERE thread_id = ?

-- ckpt_delete_thread_writes: every pending write of a thread
DELETE FROM ckpt_writes WHERE thread_id = ?

-- ckpt_of_run: the checkpoints a run made
SELECT thread_id, checkpoint_ns, checkpoint_id FROM ckpt_checkpoints WHERE run_id = ?

-- ckpt_outline: what pruning a thread looks at, per checkpoint (no bodies)
SELECT checkpoint_ns, checkpoint_id, parent_id, metadata, channel_keys FROM ckpt_checkpoints
WHERE thread_id = ?

-- ckpt_stored_channels: the channels a checkpoint holds a value for (not merely a version)
SELECT b.channel
FROM json_each(?3) k
JOIN ckpt_channels b
  ON b.thread_id = ?1 AND b.checkpoint_ns = ?2 AND b.channel = k.key AND b.version = k.value
WHERE b.type <> 'empty'

-- ckpt_delete_one: one checkpoint
DELETE FROM ckpt_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?

-- ckpt_delete_writes_of: one checkpoint's pending writes
DELETE FROM ckpt_writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?

-- ckpt_unreferenced_channels: drop channel values no checkpoint of the namespace reads any more
DELETE FROM ckpt_channels
WHERE thread_id = ?1 AND checkpoint_ns = ?2
  AND (channel, version) NOT IN (
      SELECT k.key, k.value FROM ckpt_checkpoints c, json_each(c.channel_keys) k
      WHERE c.thread_id = ?1 AND c.checkpoint_ns = ?2)

-- ckpt_copy_checkpoints: copy a thread's checkpoints to another thread (existing ones are kept)
INSERT INTO ckpt_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_id, type, body,
                              blob_sha, size, metadata, channel_keys, run_id, created_at)
SELECT ?2, checkpoint_ns, checkpoint_id, parent_id, type, body, blob_sha, size, metadata,
       channel_keys, run_id, created_at
FROM ckpt_checkpoints WHERE thread_id = ?1
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO NOTHING

-- ckpt_copy_channels: copy a thread's channel values to another thread
INSERT INTO ckpt_channels (thread_id, checkpoint_ns, channel, version, type, body, blob_sha, size)
SELECT ?2, checkpoint_ns, channel, version, type, body, blob_sha, size
FROM ckpt_channels WHERE thread_id = ?1
ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING

-- ckpt_copy_writes: copy a thread's pending writes to another thread
INSERT INTO ckpt_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type,
                         body, blob_sha, size, task_path)
SELECT ?2, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, body, blob_sha, size,
       task_path
FROM ckpt_writes WHERE thread_id = ?1
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
