-- fleetstore migrate on PostgreSQL: the queries of sql/common/migrate.sql that
-- differ here (same names, parameters and result columns), and mig_scan_* of its own.
--
-- Verification reads a table in byte order of its key (SQLite's order) so that both
-- dialects hash the same sequence.  Here that is COLLATE "C", which the primary key
-- index (in the database's collation) cannot serve: page queries would sort the whole
-- table once per page, so verification reads through a cursor (mig_scan_open), sorted
-- once, while the copy pages in the index's own order.

-- mig_tables: every table of the store's schema
SELECT c.relname::text
FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
ORDER BY c.relname COLLATE "C"

-- mig_columns: a table's columns in order: name, declared type, place in the primary key (0: none)
SELECT a.attname::text,
       upper(format_type(a.atttypid, NULL)),
       coalesce((SELECT k.n FROM pg_index x, unnest(x.indkey) WITH ORDINALITY AS k(attnum, n)
                 WHERE x.indrelid = a.attrelid AND x.indisprimary AND k.attnum = a.attnum),
                0)::bigint
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ?
  AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum

-- mig_foreign_keys: every foreign key column: (table, column, referenced table)
SELECT c.relname::text, a.attname::text, r.relname::text
FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_class r ON r.oid = k.confrelid
JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = ANY (k.conkey)
WHERE k.contype = 'f' AND c.relnamespace = current_schema()::regnamespace
ORDER BY 1, 2

-- mig_text_order: a text key column in byte order (SQLite's), whatever the collation
{column} COLLATE "C"

-- mig_count: a table's rows
SELECT count(*)::bigint FROM {table}

-- mig_blob_param: a value for a BLOB/BYTEA column: text becomes its UTF-8 bytes (migration 0001)
fleetstore_bytes({mark})

-- mig_scan_open: a whole table in byte order of its key, in one snapshot, for verification
DECLARE fleetstore_migrate_scan NO SCROLL CURSOR FOR
SELECT {columns} FROM {table} ORDER BY {order}

-- mig_scan_fetch: the next rows of that cursor
FETCH FORWARD {rows} FROM fleetstore_migrate_scan
