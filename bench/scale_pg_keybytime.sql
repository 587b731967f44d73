-- A layout for bench/scale_bench's PostgreSQL runs: the record key led by the collection and the
-- record key, as SQLite's version 2 key is, so that a stream's new TID keys land at its right edge,
-- and a separate (did_id, collection_id) index for the lookups and purges by account. Run with
-- ATFILL_SCALE_PG_SETUP_SQL=bench/scale_pg_keybytime.sql (docs/performance.md, "Past the page
-- cache (PostgreSQL)").
-- Only the record table's layout: the sink creates the rest of its schema around it (the interned
-- names, the view, the indexes of each version) and upgrades it to its own version, as it does a
-- schema without atfill_schema_version, whose CREATE ... IF NOT EXISTS leave this table as it is.
CREATE TABLE atfill_record_rows(
  did_id bigint NOT NULL, collection_id integer NOT NULL, rkey text COLLATE "C" NOT NULL,
  cid text COLLATE "C" NOT NULL, rev text COLLATE "C", indexed_at bigint NOT NULL,
  created_at text, record text NOT NULL,
  PRIMARY KEY (collection_id, rkey, did_id));
CREATE INDEX atfill_record_rows_by_did ON atfill_record_rows(did_id, collection_id);
