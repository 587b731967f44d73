-- A layout for bench/scale_bench's PostgreSQL runs: the record table partitioned by a hash of the
-- DID (16 partitions). Run with ATFILL_SCALE_PG_SETUP_SQL=bench/scale_pg_hash16.sql
-- (docs/performance.md, "Partitioning the record table").
-- Only the record table's layout: the sink creates the rest of its schema around it (the interned
-- names, the view, the indexes of each version) and upgrades it to its own version, as it does a
-- schema without atfill_schema_version, whose CREATE ... IF NOT EXISTS leave this table as it is.
CREATE TABLE atfill_record_rows(
  did_id bigint NOT NULL, collection_id integer NOT NULL, rkey text COLLATE "C" NOT NULL,
  cid text COLLATE "C" NOT NULL, rev text COLLATE "C", indexed_at bigint NOT NULL,
  created_at text, record text NOT NULL,
  PRIMARY KEY (did_id, collection_id, rkey)) PARTITION BY HASH (did_id);
CREATE TABLE atfill_record_rows_p0 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 0);
CREATE TABLE atfill_record_rows_p1 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 1);
CREATE TABLE atfill_record_rows_p2 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 2);
CREATE TABLE atfill_record_rows_p3 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 3);
CREATE TABLE atfill_record_rows_p4 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 4);
CREATE TABLE atfill_record_rows_p5 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 5);
CREATE TABLE atfill_record_rows_p6 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 6);
CREATE TABLE atfill_record_rows_p7 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 7);
CREATE TABLE atfill_record_rows_p8 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 8);
CREATE TABLE atfill_record_rows_p9 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 9);
CREATE TABLE atfill_record_rows_p10 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 10);
CREATE TABLE atfill_record_rows_p11 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 11);
CREATE TABLE atfill_record_rows_p12 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 12);
CREATE TABLE atfill_record_rows_p13 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 13);
CREATE TABLE atfill_record_rows_p14 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 14);
CREATE TABLE atfill_record_rows_p15 PARTITION OF atfill_record_rows FOR VALUES WITH (MODULUS 16, REMAINDER 15);
