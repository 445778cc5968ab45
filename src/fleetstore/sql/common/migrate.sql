-- fleetstore migrate (fleetstore/transfer/migrate/): copy a whole store to another
-- one, table by table in key order, and verify the copy.  The tables and columns are
-- read from the catalog, so a table added later is copied too.  Queries written with
-- {fields} are templates: the migrate package fills in quoted identifiers (from the
-- catalog, never from input) and as many ? as there are key columns.

-- mig_tables: every table of the schema
SELECT name FROM sqlite_master
WHERE type = 'table' AND name NOT LIKE 'sqlite\_%' ESCAPE '\'
ORDER BY name

-- mig_columns: a table's columns in order: name, declared type, place in the primary key (0: none)
SELECT name, upper(type), pk FROM pragma_table_info(?) ORDER BY cid

-- mig_foreign_keys: every foreign key column: (table, column, referenced table)
SELECT m.name, f."from", f."table"
FROM sqlite_master m, pragma_foreign_key_list(m.name) f
WHERE m.type = 'table'
ORDER BY m.name, f."from"

-- mig_text_order: how a text key column is ordered for verification (byte order: SQLite's own)
{column}

-- mig_page_first: the first rows of a table in key order
SELECT {columns} FROM {table} ORDER BY {order} LIMIT ?

-- mig_page_after: the rows after a key, in key order
SELECT {columns} FROM {table} WHERE ({key}) > ({marks}) ORDER BY {order} LIMIT ?

-- mig_count: a table's rows
SELECT count(*) FROM {table}

-- mig_any_row: does a table hold a row?
SELECT 1 FROM {table} LIMIT 1

-- mig_insert: rows as they were (several VALUES groups)
INSERT INTO {table} ({columns}) VALUES {values}

-- mig_blob_param: a value for a BLOB/BYTEA column: a BLOB column keeps text as text
{mark}

-- mig_set_links: a row's references to its own table, set once every row is there
UPDATE {table} SET {assignments} WHERE ({key}) = ({marks})

-- mig_progress_create: where migrate records, in the destination, its source and progress
CREATE TABLE IF NOT EXISTS fleetstore_migrate (
    item   TEXT PRIMARY KEY,
    value  TEXT NOT NULL
)

-- mig_progress_get: every progress item
SELECT item, value FROM fleetstore_migrate ORDER BY item

-- mig_progress_item: one progress item
SELECT value FROM fleetstore_migrate WHERE item = ?

-- mig_progress_put: record a progress item
INSERT INTO fleetstore_migrate (item, value) VALUES (?, ?)
ON CONFLICT (item) DO UPDATE SET value = excluded.value
