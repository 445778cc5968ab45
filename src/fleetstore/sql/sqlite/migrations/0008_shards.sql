-- The sharded layout (sqlite+sharded:///DIR): in its catalog database, which
-- shard file holds each session, and the catalog+shard writes under way.  In a
-- single-file store, in a shard and on PostgreSQL these tables stay empty.

-- A session whose rows live in a shard (the catalog's sessions row is its index
-- entry); a session without a row here lives in the catalog itself.
CREATE TABLE shard_sessions (
    session_id  TEXT PRIMARY KEY,
    shard       TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX shard_sessions_by_shard ON shard_sessions(shard);

-- A write that changes a shard and then the catalog: recorded here first, deleted
-- with the catalog's part; a row whose owner died is finished by the next open.
CREATE TABLE shard_intents (
    op_id       TEXT PRIMARY KEY,
    shard       TEXT NOT NULL,
    op          TEXT NOT NULL,
    owner       TEXT NOT NULL,
    created_at  REAL NOT NULL
) WITHOUT ROWID;
