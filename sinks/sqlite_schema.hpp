// Internal to sinks/: the SQLite schema and its versioned migrations.
//
// Version 1:
//   atfill_schema_version(version)           one row: the schema version of this database
//   atfill_dids(id, did)                     interned DIDs
//   atfill_collections(id, nsid)             interned collection NSIDs
//   atfill_record_rows(id, did_id, collection_id, rkey, cid, rev, indexed_at, created_at, record)
//       unique (did_id, collection_id, rkey); rev and created_at NULL when unknown; indexed_at in
//       unix microseconds; record is the JSON text exactly as received
//   atfill_records                           the view raw SQL reads (see sqlite_sink.hpp)
//
// Version 2: atfill_record_rows rebuilt with the same rows and ids, plus the virtual column
// did_epoch = id >> 18; its indexes (and sqlite_stat1 rows for them)
//   atfill_record_rows_key         unique (collection_id, rkey, did_id)
//   atfill_record_rows_by_did      (did_epoch, did_id, collection_id)
//   atfill_record_rows_by_created  (collection_id, created_at)
//
// Version 3: no row rewritten;
//   atfill_dicts(id, collection_id, dict, samples, created_at)
//       zstd dictionaries of compressed bodies, one per collection in use (a later one may
//       replace it for new rows; old rows keep naming theirs); dict holds the dictionary with
//       `id` as its zstd dictionary id, which every frame made with it names; samples is the
//       number of bodies it was trained on, created_at unix microseconds
//   atfill_dicts_by_collection     (collection_id, id)
//   atfill_record_rows.record      the JSON text (TEXT), or a zstd frame of it (BLOB) made with a
//                                  dictionary of atfill_dicts (sqlite_compressor.hpp)
//   atfill_records.record          r.record while the database holds no dictionary, then
//                                  atfill_json(r.record) (sqlite_functions.hpp)
//
// Version 4: no row rewritten;
//   atfill_record_rows.cid         the CID's text (TEXT), or its 36 binary bytes (BLOB) in a row
//                                  whose record is compressed (the sink writes both forms of a
//                                  row together)
//   atfill_records.cid             r.cid while the database holds no dictionary, then
//                                  atfill_cid(r.cid), in the same view as atfill_json
//
// The bulk-load layout (not a version: a state of a version 2 database while a fresh backfill
// loads it): atfill_record_rows_key and atfill_record_rows_by_created are absent and
//   atfill_record_rows_bulk_key    unique (did_id, collection_id, rkey)
// stands in for the key. Every statement of the sink and of readers answers the same in it (by
// URI and by account through its indexes; by collection newest first by a scan).
#pragma once

#include <sqlite3.h>

#include <functional>
#include <string_view>

#include "base/status.hpp"

namespace atfill::sinks::sqlite {

// The version of a database: 0 when it holds no atfill tables yet. A database whose version row is
// missing or duplicated is Corrupt.
Result<int> ReadSchemaVersion(sqlite3* db);

// Brings the database to kSqliteSchemaVersion, applying each migration N -> N+1 in order inside one
// IMMEDIATE transaction (all or nothing). A database written by a newer atfill is Unsupported and
// left untouched. `log`, when set, is told in one line each of an upgrade of a database that
// already held atfill tables (not their creation) before it runs, and of its end with its time; a
// large table's upgrade takes minutes. `name` names the database in those lines.
Status MigrateSchema(sqlite3* db, std::string_view name = {},
                     const std::function<void(std::string_view line)>& log = {});

// Fails unless the database is exactly at kSqliteSchemaVersion (used by read-only openers, which
// never migrate).
Status CheckSchemaCurrent(sqlite3* db);

// Makes the atfill_records view return atfill_json(record) and atfill_cid(cid) (the exact JSON
// and CID text of compressed and uncompressed rows) unless it already does; inside the caller's
// write transaction.
Status UseDecodingView(sqlite3* db);

// Whether the record table holds any row.
Result<bool> HasRecordRows(sqlite3* db);

// Whether the record table is in the bulk-load layout.
Result<bool> InBulkLayout(sqlite3* db);

// Switches a database whose record table is empty to the bulk-load layout, in one transaction;
// true when the table is in that layout afterwards (it was empty, or already in it, as after a
// load that was killed), false when it holds rows in the final layout (left as it is) or another
// writer kept the write lock past the busy timeout (the load then goes into the final layout).
Result<bool> BeginBulkLoad(sqlite3* db);

// Builds the final layout's indexes of a table in the bulk-load layout and drops the bulk key, in
// one transaction (all or nothing: a kill during it leaves the bulk layout, finished by the next
// call). Does nothing to a table in the final layout, nor when another writer keeps the write lock
// past the busy timeout (the table then stays in the bulk layout, which answers the same). `log`,
// when set, is told of the build before it runs and of how it ended, as MigrateSchema's.
Status FinishBulkLoad(sqlite3* db, std::string_view name = {},
                      const std::function<void(std::string_view line)>& log = {});

}  // namespace atfill::sinks::sqlite
