-- Indexes on every blob reference that lacked one: collecting a blob re-checks,
-- in its transaction, that no row refers to it, which without these scanned the
-- whole state and checkpoint tables once per blob (fleetstore maintain).
CREATE INDEX state_by_blob ON state(blob_sha) WHERE blob_sha IS NOT NULL;
CREATE INDEX ckpt_checkpoints_by_blob ON ckpt_checkpoints(blob_sha) WHERE blob_sha IS NOT NULL;
CREATE INDEX ckpt_channels_by_blob ON ckpt_channels(blob_sha) WHERE blob_sha IS NOT NULL;
CREATE INDEX ckpt_writes_by_blob ON ckpt_writes(blob_sha) WHERE blob_sha IS NOT NULL;
CREATE INDEX adk_app_state_by_blob ON adk_app_state(blob_sha) WHERE blob_sha IS NOT NULL;
CREATE INDEX adk_user_state_by_blob ON adk_user_state(blob_sha) WHERE blob_sha IS NOT NULL;
