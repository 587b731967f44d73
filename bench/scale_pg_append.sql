-- Appends rows of bench/scale_bench's stream (its collection mix, record keys and createdAt that
-- follow time, accounts at random, bodies of the same shapes and about the same size) to a record
-- table of version 3 or later that scale_bench's PostgreSQL run made (version 5 gives the rows
-- their ids and blocks itself), straight in SQL: PostgreSQL's sink would take
-- hours for 50M rows on a shared 2-core machine, and what is measured on the result is the queries
-- (docs/performance.md, "The queries at 50M rows (PostgreSQL)"). Rows g = :first .. :last; the
-- table's indexes are kept, so each row is indexed as the sink's would be. The accounts are those the
-- run interned, the collections those it created (scale_bench writes every one of the mix).
--
--   psql -v schema=q50 -v first=1 -v last=7000000 -f bench/scale_pg_append.sql
\set ON_ERROR_STOP on
SET search_path = :"schema";
INSERT INTO atfill_record_rows(did_id, collection_id, collection, rkey, cid, rev, indexed_at,
                               created_at, record)
SELECT ids.a[1 + floor(random() * ids.n)::int], c.id, c.nsid, k.rkey,
       'bafyrei' || k.h1 || substr(k.h2, 1, 20), k.rkey,
       (extract(epoch FROM k.ts) * 1000000)::bigint, k.created_at,
       '{"$type":"' || c.nsid || '"' ||
       CASE
         WHEN c.nsid IN ('app.bsky.feed.like', 'app.bsky.feed.repost') THEN
           ',"subject":{"cid":"bafyreig' || k.h2 || substr(k.h1, 1, 19) ||
           '","uri":"at://did:plc:' || substr(k.h3, 1, 24) || '/app.bsky.feed.post/3' ||
           substr(k.h3, 20, 12) || '"}'
         WHEN c.nsid IN ('app.bsky.graph.follow', 'app.bsky.graph.block') THEN
           ',"subject":"did:plc:' || substr(k.h3, 1, 24) || '"'
         ELSE
           ',"langs":["en"],"text":"' ||
           substr(repeat(k.h1 || ' ' || k.h3 || ' ', 5), 1, 10 + (g % 260)::int) || '"'
       END || ',"createdAt":"' || k.created_at || '"}'
FROM generate_series(:first::bigint, :last::bigint) g
CROSS JOIN (SELECT array_agg(id ORDER BY id) AS a, count(*)::int AS n FROM atfill_dids) ids
CROSS JOIN LATERAL (
  SELECT CASE
           WHEN g % 100 < 55 THEN 'app.bsky.feed.like'
           WHEN g % 100 < 70 THEN 'app.bsky.graph.follow'
           WHEN g % 100 < 85 THEN 'app.bsky.feed.post'
           WHEN g % 100 < 96 THEN 'app.bsky.feed.repost'
           ELSE 'app.bsky.graph.block'
         END AS nsid) m
JOIN atfill_collections c ON c.nsid = m.nsid
CROSS JOIN LATERAL (
  -- The keys sort after the run's own (TIDs of 2026 begin with "3m") and follow g.
  SELECT '4' || lpad(to_hex(g), 12, '0') AS rkey,
         timestamp '2026-09-01' + g * interval '20 microseconds' AS ts,
         to_char(timestamp '2026-09-01' + g * interval '20 microseconds',
                 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS created_at,
         md5(g::text) AS h1, md5((-g)::text) AS h2, md5((g * 7)::text) AS h3) k;
