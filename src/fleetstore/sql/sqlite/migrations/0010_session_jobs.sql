-- A session being deleted or forked in batches, each its own short transaction:
-- delete hides the session (and its subagents) at once, then purges its rows; fork
-- makes a hidden session and copies the source's messages into it.  Every read
-- takes a session whose job is set for one that does not exist, so a half-purged
-- or half-copied session is never seen.  job_owner: the process doing it
-- (its host and pid), so that a fork whose process died is undone by the next open.
ALTER TABLE sessions ADD COLUMN job TEXT CHECK (job IN ('fork', 'delete'));
ALTER TABLE sessions ADD COLUMN job_owner TEXT;
CREATE INDEX sessions_with_job ON sessions(job) WHERE job IS NOT NULL;
