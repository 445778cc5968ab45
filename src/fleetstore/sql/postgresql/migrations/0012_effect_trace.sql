-- The trace context an effect was enqueued in (JSON: W3C traceparent and tracestate),
-- when the enqueuing process asked for it (trace_effects): the handler's span joins
-- that trace (docs/telemetry.md).  NULL: none carried.
ALTER TABLE effects ADD COLUMN trace_context TEXT COLLATE "C";
