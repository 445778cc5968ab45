-- What a logged operation returned: a second run of it (a COMMIT whose outcome was
-- lost, a spool replay) returns the same result, marked duplicate, instead of a
-- bare {"duplicate": true} its caller cannot use.
ALTER TABLE applied_ops ADD COLUMN result TEXT COLLATE "C";
