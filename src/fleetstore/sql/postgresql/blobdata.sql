-- PostgreSQL only: the bytes of the blobs, compressed as the SQLite store's blob
-- files are, in chunks of 1 MiB (table blob_chunks, migration 0001).
-- A negative limit means no limit, as on SQLite: LIMIT nullif(greatest(n, -1), -1)
-- is PostgreSQL's LIMIT NULL (all rows) for those, LIMIT n otherwise.

-- blobdata_put_chunk: one chunk of a blob's stored bytes (a chunk written before is kept)
INSERT INTO blob_chunks (sha256, seq, data) VALUES (?, ?, ?) ON CONFLICT DO NOTHING

-- blobdata_get: a blob's stored bytes, chunk by chunk in order
SELECT data FROM blob_chunks WHERE sha256 = ? ORDER BY seq

-- blobdata_exists: how many chunks of a blob are stored, and their bytes
SELECT count(*), coalesce(sum(octet_length(data)), 0)::bigint FROM blob_chunks WHERE sha256 = ?

-- blobdata_list: every blob that has chunks, in hash order
SELECT DISTINCT sha256 FROM blob_chunks ORDER BY sha256

-- blobdata_delete: a blob's chunks
DELETE FROM blob_chunks WHERE sha256 = ?

-- blobdata_list_after: up to ? blobs that have chunks, after a hash, in hash order
SELECT DISTINCT sha256 FROM blob_chunks WHERE sha256 > ? ORDER BY sha256 LIMIT nullif(greatest(?, -1), -1)
