#include "sinks/sqlite_schema.hpp"

#include <array>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "sinks/sqlite_sink.hpp"
#include "sinks/sqlite_util.hpp"
#include "sinks/upgrade_lines.hpp"

namespace atfill::sinks::sqlite {
namespace {

// The record table is a rowid table with a separate unique index: measured with ~400-byte bodies,
// appending rows in rowid order and keeping only the narrow key in the random-order index beats a
// WITHOUT ROWID table clustered on the key by far when DIDs interleave (every insert would move
// whole rows inside the tree) and ties when each repo arrives in one piece. `record` is the last
// column so that reading cid and rev never touches the overflow pages of large records.
constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE atfill_dids(
  id INTEGER PRIMARY KEY,
  did TEXT NOT NULL UNIQUE);
CREATE TABLE atfill_collections(
  id INTEGER PRIMARY KEY,
  nsid TEXT NOT NULL UNIQUE);
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
  UNIQUE(did_id, collection_id, rkey));
CREATE VIEW atfill_records(uri, did, collection, rkey, record, cid, rev, indexed_at, created_at) AS
SELECT 'at://' || d.did || '/' || c.nsid || '/' || r.rkey,
       d.did, c.nsid, r.rkey, r.record, r.cid, r.rev,
       strftime('%Y-%m-%dT%H:%M:%S', r.indexed_at / 1000000, 'unixepoch') ||
           printf('.%06dZ', r.indexed_at % 1000000),
       r.created_at
FROM atfill_record_rows r
JOIN atfill_dids d ON d.id = r.did_id
JOIN atfill_collections c ON c.id = r.collection_id;
)sql";

Status MigrateTo1(sqlite3* db) { return Exec(db, kSchemaV1); }

// Version 2: every index of the record table takes a stream's new rows near its right edge, so
// the cost of a write does not grow with the table (measured in docs/performance.md; with the
// account first, as in version 1, every event of a stream that interleaves millions of accounts
// dirtied an index page of its own once the index outgrew a batch):
//  * the key leads with the collection and the record key: record keys are mostly TIDs, ordered
//    in time, so new keys land at the right edge of their collection's range;
//  * what needs rows by account (purges, resyncs, HoldsRecords, the queries by DID) uses
//    (did_epoch, did_id, collection_id), where did_epoch is the row id's block of 2^18 rows: new
//    rows only touch the newest block's part of the index, which stays a few hundred pages; a
//    lookup by account probes each block (SQLite's skip-scan, chosen from the sqlite_stat1 rows
//    written here, or from ANALYZE's);
//  * collection newest first uses (collection_id, created_at): createdAt follows time too.
// The key is a separate UNIQUE INDEX rather than a table constraint, so that a later version can
// change it without rebuilding the table. The stat1 rows describe a large table (what matters is
// the ratios: a collection holds many rows, an account few in each block, and a record key may be
// shared by many accounts, as "self" is, so a lookup by URI binds the whole key); ANALYZE
// replaces them with measured ones.
constexpr const char* kRecordRowsV2 = R"sql(
CREATE TABLE atfill_record_rows_v2(
  id INTEGER PRIMARY KEY,
  did_id INTEGER NOT NULL REFERENCES atfill_dids(id),
  collection_id INTEGER NOT NULL REFERENCES atfill_collections(id),
  rkey TEXT NOT NULL,
  cid TEXT NOT NULL,
  rev TEXT,
  indexed_at INTEGER NOT NULL,
  created_at TEXT,
  record TEXT NOT NULL,
  did_epoch INTEGER GENERATED ALWAYS AS (id >> 18) VIRTUAL);
INSERT INTO atfill_record_rows_v2(id, did_id, collection_id, rkey, cid, rev, indexed_at,
                                  created_at, record)
SELECT id, did_id, collection_id, rkey, cid, rev, indexed_at, created_at, record
FROM atfill_record_rows ORDER BY id;
DROP TABLE atfill_record_rows;
ALTER TABLE atfill_record_rows_v2 RENAME TO atfill_record_rows;
CREATE UNIQUE INDEX atfill_record_rows_key ON atfill_record_rows(collection_id, rkey, did_id);
CREATE INDEX atfill_record_rows_by_did ON atfill_record_rows(did_epoch, did_id, collection_id);
CREATE INDEX atfill_record_rows_by_created ON atfill_record_rows(collection_id, created_at);
ANALYZE sqlite_schema;
DELETE FROM sqlite_stat1 WHERE tbl = 'atfill_record_rows';
INSERT INTO sqlite_stat1(tbl, idx, stat) VALUES
  ('atfill_record_rows', 'atfill_record_rows_key', '100000000 10000000 10 1'),
  ('atfill_record_rows', 'atfill_record_rows_by_did', '100000000 262144 20 5'),
  ('atfill_record_rows', 'atfill_record_rows_by_created', '100000000 10000000 2');
ANALYZE sqlite_schema;
)sql";

// The view over the record table reads `record` and `cid` as they are stored (kPlainView) until
// the database holds a compressed row, then through atfill_json and atfill_cid (kDecodingView).
struct ViewColumns {
  std::string_view record;
  std::string_view cid;
};
constexpr ViewColumns kPlainView = {"r.record", "r.cid"};
constexpr ViewColumns kDecodingView = {"atfill_json(r.record)", "atfill_cid(r.cid)"};

std::string RecordsView(ViewColumns columns) {
  std::string sql = R"sql(
CREATE VIEW atfill_records(uri, did, collection, rkey, record, cid, rev, indexed_at, created_at) AS
SELECT 'at://' || d.did || '/' || c.nsid || '/' || r.rkey,
       d.did, c.nsid, r.rkey, )sql";
  sql += columns.record;
  sql += ", ";
  sql += columns.cid;
  sql += R"sql(, r.rev,
       strftime('%Y-%m-%dT%H:%M:%S', r.indexed_at / 1000000, 'unixepoch') ||
           printf('.%06dZ', r.indexed_at % 1000000),
       r.created_at
FROM atfill_record_rows r
JOIN atfill_dids d ON d.id = r.did_id
JOIN atfill_collections c ON c.id = r.collection_id;
)sql";
  return sql;
}

// Rebuilds the record table (a table constraint cannot be dropped), keeping every row and its id.
// Indexes and triggers a user added to the table are created again on the new one; the view is
// dropped and created again around the rebuild. Legacy ALTER TABLE semantics: the rename then
// leaves views the user defined over atfill_record_rows as they are (they read the new table).
Status MigrateTo2(sqlite3* db) {
  std::vector<std::string> user_objects;
  {
    ATFILL_ASSIGN_OR_RETURN(
        Stmt list, Prepare(db,
                           "SELECT sql FROM sqlite_schema WHERE tbl_name = 'atfill_record_rows' "
                           "AND type IN ('index', 'trigger') AND sql IS NOT NULL",
                           false));
    int rc;
    while ((rc = sqlite3_step(list.get())) == SQLITE_ROW) {
      user_objects.emplace_back(ColumnText(list.get(), 0));
    }
    if (rc != SQLITE_DONE) return ErrorStatus(db, rc, "listing the record table's indexes");
  }
  ATFILL_RETURN_IF_ERROR(Exec(db, "PRAGMA legacy_alter_table = ON"));
  Status st = Exec(db, "DROP VIEW atfill_records");
  if (st.ok()) st = Exec(db, kRecordRowsV2);
  if (st.ok()) st = Exec(db, RecordsView(kPlainView).c_str());
  for (size_t i = 0; st.ok() && i < user_objects.size(); ++i) {
    st = Exec(db, user_objects[i].c_str());
  }
  Status off = Exec(db, "PRAGMA legacy_alter_table = OFF");
  return st.ok() ? off : st;
}

// Version 3: the dictionaries of compressed record bodies. No row is rewritten: every existing
// body stays text, which atfill_json returns as it is, and the view keeps reading the column
// directly until the first dictionary is stored (UseDecodingView).
constexpr const char* kSchemaV3 = R"sql(
CREATE TABLE atfill_dicts(
  id INTEGER PRIMARY KEY,
  collection_id INTEGER NOT NULL REFERENCES atfill_collections(id),
  dict BLOB NOT NULL,
  samples INTEGER NOT NULL,
  created_at INTEGER NOT NULL);
CREATE INDEX atfill_dicts_by_collection ON atfill_dicts(collection_id, id);
)sql";

Status MigrateTo3(sqlite3* db) { return Exec(db, kSchemaV3); }

// Whether the view is the decoding one of version 3 (atfill_json only) or 4 (and atfill_cid).
Result<bool> ViewCalls(sqlite3* db, const char* function) {
  ATFILL_ASSIGN_OR_RETURN(Stmt find,
                          Prepare(db,
                                  "SELECT count(*) FROM sqlite_schema WHERE type = "
                                  "'view' AND name = 'atfill_records' AND instr(sql, ?1)",
                                  false));
  const std::string call = std::string(function) + "(";
  sqlite3_bind_text(find.get(), 1, call.data(), static_cast<int>(call.size()), SQLITE_STATIC);
  const int rc = sqlite3_step(find.get());
  if (rc != SQLITE_ROW) return ErrorStatus(db, rc, "reading the schema catalogue");
  return sqlite3_column_int(find.get(), 0) != 0;
}

// Version 4: a compressed row's CID may be stored binary, 36 bytes instead of its 59 characters
// (the record table's largest column after the body; docs/performance.md, "The settings that
// matter"). Only a database whose view already decodes (it holds a compressed row, so it already
// needs atfill's functions) gets the new view; the sink writes binary CIDs only beside compressed
// bodies, so a database without any keeps the view that the sqlite3 shell reads as it is.
Status MigrateTo4(sqlite3* db) {
  ATFILL_ASSIGN_OR_RETURN(bool decoding, ViewCalls(db, "atfill_json"));
  if (!decoding) return Status::OK();
  ATFILL_RETURN_IF_ERROR(Exec(db, "DROP VIEW atfill_records"));
  return Exec(db, RecordsView(kDecodingView).c_str());
}

// Version 5: the lexicons the network publishes (com.atproto.lexicon.schema records, whose key is
// the NSID they define), as [lexicons] track_network keeps them, under names of their own.
constexpr const char* kSchemaV5 = R"sql(
CREATE VIEW atfill_lexicons(nsid, did, document, cid, seen_at) AS
SELECT rkey, did, record, cid, indexed_at FROM atfill_records
WHERE collection = 'com.atproto.lexicon.schema';
)sql";

Status MigrateTo5(sqlite3* db) { return Exec(db, kSchemaV5); }

// kMigrations[n] takes a database from version n to n + 1.
using Migration = Status (*)(sqlite3*);
constexpr std::array<Migration, 5> kMigrations = {MigrateTo1, MigrateTo2, MigrateTo3, MigrateTo4,
                                                  MigrateTo5};
static_assert(kMigrations.size() == kSqliteSchemaVersion);

using Clock = std::chrono::steady_clock;
using LogLine = std::function<void(std::string_view line)>;

// The record table's rows, from its largest id (no scan): for the lines a long wait prints.
std::string RecordRowsOf(sqlite3* db) {
  auto max = Prepare(db, "SELECT max(id) FROM atfill_record_rows", false);
  if (!max.ok() || sqlite3_step(max->get()) != SQLITE_ROW) return "its record rows";
  if (sqlite3_column_type(max->get(), 0) == SQLITE_NULL) return "no record rows";
  return "up to " + std::to_string(sqlite3_column_int64(max->get(), 0)) + " record rows";
}

Status SetVersion(sqlite3* db, int version) {
  std::string sql = "UPDATE atfill_schema_version SET version = " + std::to_string(version);
  return Exec(db, sql.c_str());
}

// Returns the version the database was upgraded from, 0 when it was created or already current.
Result<int> MigrateLocked(sqlite3* db, std::string_view name, const LogLine& log) {
  ATFILL_ASSIGN_OR_RETURN(int version, ReadSchemaVersion(db));
  if (version > kSqliteSchemaVersion) {
    return Status::Unsupported("database schema version " + std::to_string(version) +
                               " is newer than this atfill supports (" +
                               std::to_string(kSqliteSchemaVersion) + "); upgrade atfill");
  }
  if (version == 0) {
    ATFILL_RETURN_IF_ERROR(Exec(db,
                                "CREATE TABLE atfill_schema_version(version INTEGER NOT NULL);"
                                "INSERT INTO atfill_schema_version(version) VALUES (0);"));
  } else if (version < kSqliteSchemaVersion && log) {
    log(UpgradingLine("sqlite", name, version, kSqliteSchemaVersion, RecordRowsOf(db)));
  }
  for (int v = version; v < kSqliteSchemaVersion; ++v) {
    Status st = kMigrations[static_cast<size_t>(v)](db);
    if (!st.ok()) {
      return st.WithContext("migrating the schema from version " + std::to_string(v) + " to " +
                            std::to_string(v + 1));
    }
    ATFILL_RETURN_IF_ERROR(SetVersion(db, v + 1));
  }
  return version == 0 || version == kSqliteSchemaVersion ? 0 : version;
}

// The bulk layout of a fresh backfill (see BeginBulkLoad in sqlite_schema.hpp): the record
// table's key as (did_id, collection_id, rkey) instead of (collection_id, rkey, did_id), and no
// (collection_id, created_at) index. A crawl delivers each account's records together, accounts
// interned in the order they come, so both remaining indexes take its rows at their right edge,
// whereas the final key and created_at index take them all over (record keys and createdAt span
// each account's history). The key is unique on the same columns, so the sink's statements (its
// upsert names the columns, which SQLite matches in any order) behave the same in either layout.
constexpr const char* kEnterBulk = R"sql(
CREATE UNIQUE INDEX atfill_record_rows_bulk_key ON atfill_record_rows(did_id, collection_id, rkey);
DROP INDEX IF EXISTS atfill_record_rows_key;
DROP INDEX IF EXISTS atfill_record_rows_by_created;
DELETE FROM sqlite_stat1 WHERE tbl = 'atfill_record_rows' AND
  idx IN ('atfill_record_rows_key', 'atfill_record_rows_by_created',
          'atfill_record_rows_bulk_key');
INSERT INTO sqlite_stat1(tbl, idx, stat) VALUES
  ('atfill_record_rows', 'atfill_record_rows_bulk_key', '100000000 20 5 1');
ANALYZE sqlite_schema;
)sql";

// Back to version 2's indexes, built from the whole table at once (a sort, not one insert per
// row), and version 2's sqlite_stat1 rows for them.
constexpr const char* kFinishBulk = R"sql(
CREATE UNIQUE INDEX atfill_record_rows_key ON atfill_record_rows(collection_id, rkey, did_id);
CREATE INDEX atfill_record_rows_by_created ON atfill_record_rows(collection_id, created_at);
DROP INDEX atfill_record_rows_bulk_key;
DELETE FROM sqlite_stat1 WHERE tbl = 'atfill_record_rows' AND
  idx IN ('atfill_record_rows_key', 'atfill_record_rows_by_created',
          'atfill_record_rows_bulk_key');
INSERT INTO sqlite_stat1(tbl, idx, stat) VALUES
  ('atfill_record_rows', 'atfill_record_rows_key', '100000000 10000000 10 1'),
  ('atfill_record_rows', 'atfill_record_rows_by_created', '100000000 10000000 2');
ANALYZE sqlite_schema;
)sql";

// Runs `body` in one IMMEDIATE transaction: committed when it succeeds, rolled back when not.
template <typename Body>
Status InWriteTransaction(sqlite3* db, Body&& body) {
  ATFILL_RETURN_IF_ERROR(Exec(db, "BEGIN IMMEDIATE"));
  Status st = body();
  if (st.ok()) st = Exec(db, "COMMIT");
  if (!st.ok() && !sqlite3_get_autocommit(db)) (void)Exec(db, "ROLLBACK");
  return st;
}

}  // namespace

Status UseDecodingView(sqlite3* db) {
  ATFILL_ASSIGN_OR_RETURN(bool decoding, ViewCalls(db, "atfill_cid"));
  if (decoding) return Status::OK();
  ATFILL_RETURN_IF_ERROR(Exec(db, "DROP VIEW atfill_records"));
  return Exec(db, RecordsView(kDecodingView).c_str());
}

Result<bool> HasRecordRows(sqlite3* db) {
  ATFILL_ASSIGN_OR_RETURN(Stmt any, Prepare(db, "SELECT 1 FROM atfill_record_rows LIMIT 1", false));
  int rc = sqlite3_step(any.get());
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return ErrorStatus(db, rc, "reading the record table");
}

Result<bool> InBulkLayout(sqlite3* db) {
  ATFILL_ASSIGN_OR_RETURN(Stmt find, Prepare(db,
                                             "SELECT count(*) FROM sqlite_schema WHERE type = "
                                             "'index' AND name = 'atfill_record_rows_bulk_key'",
                                             false));
  int rc = sqlite3_step(find.get());
  if (rc != SQLITE_ROW) return ErrorStatus(db, rc, "reading the schema catalogue");
  return sqlite3_column_int(find.get(), 0) != 0;
}

bool IsBusy(sqlite3* db) {
  const int rc = sqlite3_extended_errcode(db) & 0xff;
  return rc == SQLITE_BUSY || rc == SQLITE_LOCKED;
}

Result<bool> BeginBulkLoad(sqlite3* db) {
  ATFILL_ASSIGN_OR_RETURN(bool bulk, InBulkLayout(db));
  if (bulk) return true;
  ATFILL_ASSIGN_OR_RETURN(bool has_rows, HasRecordRows(db));
  if (has_rows) return false;
  Status st = InWriteTransaction(db, [&]() -> Status {
    ATFILL_ASSIGN_OR_RETURN(bulk, InBulkLayout(db));
    if (bulk) return Status::OK();
    ATFILL_ASSIGN_OR_RETURN(bool has_rows, HasRecordRows(db));
    if (has_rows) return Status::OK();
    bulk = true;
    return Exec(db, kEnterBulk);
  });
  // Another writer kept the lock past the busy timeout: the load goes into the final layout,
  // which is only slower.
  if (!st.ok() && IsBusy(db)) return false;
  if (!st.ok()) return st.WithContext("switching to the bulk-load layout");
  return bulk;
}

Status FinishBulkLoad(sqlite3* db, std::string_view name, const LogLine& log) {
  // The common case, a table in the final layout, needs no write lock.
  ATFILL_ASSIGN_OR_RETURN(bool bulk, InBulkLayout(db));
  if (!bulk) return Status::OK();
  const auto start = Clock::now();
  if (log) {
    log("atfill: sqlite: building the indexes of the bulk load of " + std::string(name) + " (" +
        RecordRowsOf(db) + ")");
  }
  bool built = false;
  Status st = InWriteTransaction(db, [&]() -> Status {
    // Re-read under the write lock: another connection may have finished it in between.
    ATFILL_ASSIGN_OR_RETURN(bool still, InBulkLayout(db));
    if (!still) return Status::OK();
    built = true;
    return Exec(db, kFinishBulk);
  });
  // Another writer kept the lock past the busy timeout: the table answers every query in either
  // layout, and the next open (or the loading sink's close) finishes it.
  const bool busy = !st.ok() && IsBusy(db);
  if (log) {
    if (st.ok()) {
      log("atfill: sqlite: " + std::string(built ? "built" : "another connection built") +
          " the indexes of " + std::string(name) + " in " + SecondsSince(start));
    } else {
      log("atfill: sqlite: the indexes of " + std::string(name) + " are not built (" +
          (busy ? std::string("another writer held the database") : st.ToString()) +
          "); the next sink to open it builds them");
    }
  }
  if (busy) return Status::OK();
  if (!st.ok()) return st.WithContext("building the indexes of a bulk load");
  return st;
}

Result<int> ReadSchemaVersion(sqlite3* db) {
  ATFILL_ASSIGN_OR_RETURN(
      Stmt has_table, Prepare(db,
                              "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = "
                              "'atfill_schema_version'",
                              false));
  int rc = sqlite3_step(has_table.get());
  if (rc != SQLITE_ROW) return ErrorStatus(db, rc, "reading the schema catalogue");
  if (sqlite3_column_int(has_table.get(), 0) == 0) return 0;

  ATFILL_ASSIGN_OR_RETURN(Stmt read,
                          Prepare(db, "SELECT version FROM atfill_schema_version", false));
  int rows = 0;
  int version = 0;
  while ((rc = sqlite3_step(read.get())) == SQLITE_ROW) {
    ++rows;
    version = sqlite3_column_int(read.get(), 0);
  }
  if (rc != SQLITE_DONE) return ErrorStatus(db, rc, "reading atfill_schema_version");
  if (rows != 1) {
    return Status::Corrupt("atfill_schema_version holds " + std::to_string(rows) +
                           " rows; expected exactly one");
  }
  if (version < 0) {
    return Status::Corrupt("atfill_schema_version holds a negative version " +
                           std::to_string(version));
  }
  return version;
}

Status MigrateSchema(sqlite3* db, std::string_view name, const LogLine& log) {
  // The common case, an up-to-date database, needs no write lock.
  ATFILL_ASSIGN_OR_RETURN(int version, ReadSchemaVersion(db));
  if (version == kSqliteSchemaVersion) return Status::OK();
  if (version > kSqliteSchemaVersion) return MigrateLocked(db, name, {}).status();  // the refusal

  ATFILL_RETURN_IF_ERROR(Exec(db, "BEGIN IMMEDIATE"));
  // Re-read under the write lock: another process may have migrated in between.
  const auto start = Clock::now();
  Result<int> from = MigrateLocked(db, name, log);
  Status st = from.status();
  if (st.ok()) st = Exec(db, "COMMIT");
  if (!st.ok() && !sqlite3_get_autocommit(db)) {
    (void)Exec(db, "ROLLBACK");  // the migration error is the one worth reporting
  }
  if (st.ok() && *from != 0 && log) {
    log(UpgradedLine("sqlite", name, kSqliteSchemaVersion, start));
  }
  return st;
}

Status CheckSchemaCurrent(sqlite3* db) {
  ATFILL_ASSIGN_OR_RETURN(int version, ReadSchemaVersion(db));
  if (version == kSqliteSchemaVersion) return Status::OK();
  if (version == 0) return Status::NotFound("the database holds no atfill tables");
  return Status::Unsupported("the database has schema version " + std::to_string(version) +
                             "; this atfill reads version " + std::to_string(kSqliteSchemaVersion) +
                             (version > kSqliteSchemaVersion
                                  ? " (upgrade atfill)"
                                  : " (open it with the sink to migrate)"));
}

}  // namespace atfill::sinks::sqlite
