#include "sinks/sqlite_schema.hpp"

#include <array>
#include <string>

#include "sinks/sqlite_sink.hpp"
#include "sinks/sqlite_util.hpp"

namespace atfill::sinks::sqlite {
namespace {

// The record table is a rowid table with a separate unique index: measured with ~400-byte bodies,
// appending rows in rowid order and keeping only the narrow key in the random-order index beats a
// WITHOUT ROWID table clustered on the key by 3x when DIDs interleave (every insert would move
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

// kMigrations[n] takes a database from version n to n + 1.
using Migration = Status (*)(sqlite3*);
constexpr std::array<Migration, 1> kMigrations = {MigrateTo1};
static_assert(kMigrations.size() == kSqliteSchemaVersion);

Status SetVersion(sqlite3* db, int version) {
  std::string sql = "UPDATE atfill_schema_version SET version = " + std::to_string(version);
  return Exec(db, sql.c_str());
}

Status MigrateLocked(sqlite3* db) {
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
  }
  for (int v = version; v < kSqliteSchemaVersion; ++v) {
    Status st = kMigrations[static_cast<size_t>(v)](db);
    if (!st.ok()) {
      return st.WithContext("migrating the schema from version " + std::to_string(v) + " to " +
                            std::to_string(v + 1));
    }
    ATFILL_RETURN_IF_ERROR(SetVersion(db, v + 1));
  }
  return Status::OK();
}

}  // namespace

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

Status MigrateSchema(sqlite3* db) {
  // The common case, an up-to-date database, needs no write lock.
  ATFILL_ASSIGN_OR_RETURN(int version, ReadSchemaVersion(db));
  if (version == kSqliteSchemaVersion) return Status::OK();
  if (version > kSqliteSchemaVersion) return MigrateLocked(db);  // reports the refusal

  ATFILL_RETURN_IF_ERROR(Exec(db, "BEGIN IMMEDIATE"));
  // Re-read under the write lock: another process may have migrated in between.
  Status st = MigrateLocked(db);
  if (st.ok()) st = Exec(db, "COMMIT");
  if (!st.ok() && !sqlite3_get_autocommit(db)) {
    (void)Exec(db, "ROLLBACK");  // the migration error is the one worth reporting
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
