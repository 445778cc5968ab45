-- When the worker running an effect gives up on its attempt (claim time plus its
-- kind's handler timeout; NULL: no timeout): doctor reports a running effect long
-- past it, whose handler hangs and whose worker did not give up.
ALTER TABLE effects ADD COLUMN deadline REAL;
