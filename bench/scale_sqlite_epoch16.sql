-- A layout for bench/scale_bench's SQLite runs: schema version 3 with the by-account index's
-- blocks of 2^16 rows instead of 2^18 (did_epoch = id >> 16), so that the part of the index a
-- stream's batch writes into is a quarter as large. Run with
-- ATFILL_SCALE_SETUP_SQL=bench/scale_sqlite_epoch16.sql (docs/performance.md, "The by-account
-- index's block"). The whole schema at the sink's version, as sinks/sqlite_schema.cpp writes it
-- but for the block.
CREATE TABLE atfill_schema_version(version INTEGER NOT NULL);
INSERT INTO atfill_schema_version(version) VALUES (3);
CREATE TABLE atfill_dids(id INTEGER PRIMARY KEY, did TEXT NOT NULL UNIQUE);
CREATE TABLE atfill_collections(id INTEGER PRIMARY KEY, nsid TEXT NOT NULL UNIQUE);
CREATE TABLE atfill_record_rows(
  id INTEGER PRIMARY KEY,
  did_id INTEGER NOT NULL REFERENCES atfill_dids(id),
  collection_id INTEGER NOT NULL REFERENCES atfill_collections(id),
  rkey TEXT NOT NULL,
  cid TEXT NOT NULL,
  rev TEXT,
  indexed_at INTEGER NOT NULL,
  created_at TEXT,
  record TEXT NOT NULL,
  did_epoch INTEGER GENERATED ALWAYS AS (id >> 16) VIRTUAL);
CREATE UNIQUE INDEX atfill_record_rows_key ON atfill_record_rows(collection_id, rkey, did_id);
CREATE INDEX atfill_record_rows_by_did ON atfill_record_rows(did_epoch, did_id, collection_id);
CREATE INDEX atfill_record_rows_by_created ON atfill_record_rows(collection_id, created_at);
CREATE VIEW atfill_records(uri, did, collection, rkey, record, cid, rev, indexed_at, created_at) AS
SELECT 'at://' || d.did || '/' || c.nsid || '/' || r.rkey,
       d.did, c.nsid, r.rkey, r.record, r.cid, r.rev,
       strftime('%Y-%m-%dT%H:%M:%S', r.indexed_at / 1000000, 'unixepoch') ||
           printf('.%06dZ', r.indexed_at % 1000000),
       r.created_at
FROM atfill_record_rows r
JOIN atfill_dids d ON d.id = r.did_id
JOIN atfill_collections c ON c.id = r.collection_id;
CREATE TABLE atfill_dicts(
  id INTEGER PRIMARY KEY,
  collection_id INTEGER NOT NULL REFERENCES atfill_collections(id),
  dict BLOB NOT NULL,
  samples INTEGER NOT NULL,
  created_at INTEGER NOT NULL);
CREATE INDEX atfill_dicts_by_collection ON atfill_dicts(collection_id, id);
ANALYZE sqlite_schema;
INSERT INTO sqlite_stat1(tbl, idx, stat) VALUES
  ('atfill_record_rows', 'atfill_record_rows_key', '100000000 10000000 10 1'),
  ('atfill_record_rows', 'atfill_record_rows_by_did', '100000000 65536 5 2'),
  ('atfill_record_rows', 'atfill_record_rows_by_created', '100000000 10000000 2');
ANALYZE sqlite_schema;
