#include "sinks/purge.hpp"

#include <chrono>
#include <filesystem>

#include "sinks/postgres_schema.hpp"
#include "sinks/postgres_util.hpp"
#include "sinks/sqlite_schema.hpp"
#include "sinks/sqlite_util.hpp"

namespace atfill::sinks {

Result<uint64_t> SqlitePurgeCollection(const std::string& path, const std::string& collection) {
  if (!std::filesystem::exists(path)) return uint64_t{0};
  auto opened = sqlite::Open(path, SQLITE_OPEN_READWRITE);
  if (!opened.ok()) return opened.status().WithContext("purging " + collection + " from " + path);
  sqlite3* db = opened->get();
  // The sink commits a batch at a time; a purge transaction waits for it, and it for the purge.
  sqlite3_busy_timeout(db, 60'000);
  ATFILL_RETURN_IF_ERROR(sqlite::CheckSchemaCurrent(db).WithContext("purging " + path));
  ATFILL_ASSIGN_OR_RETURN(
      sqlite::Stmt del,
      sqlite::Prepare(db,
                      "DELETE FROM atfill_record_rows WHERE rowid IN (SELECT r.rowid FROM "
                      "atfill_record_rows r JOIN atfill_collections c ON c.id = r.collection_id "
                      "WHERE c.nsid = ?1 LIMIT " +
                          std::to_string(kPurgeRows) + ")",
                      false));
  uint64_t deleted = 0;
  for (;;) {
    ATFILL_RETURN_IF_ERROR(sqlite::Exec(db, "BEGIN IMMEDIATE"));
    sqlite::ResetOnExit reset(del.get());
    sqlite::BindText(del.get(), 1, collection);
    const int rc = sqlite3_step(del.get());
    if (rc != SQLITE_DONE) {
      Status st = sqlite::ErrorStatus(db, rc, "purging " + collection + " from " + path);
      (void)sqlite::Exec(db, "ROLLBACK");  // the purge's error is the one worth reporting
      return st;
    }
    const int n = sqlite3_changes(db);
    ATFILL_RETURN_IF_ERROR(sqlite::Exec(db, "COMMIT"));
    deleted += static_cast<uint64_t>(n);
    if (n < kPurgeRows) return deleted;
  }
}

Result<uint64_t> PostgresPurgeCollection(const PostgresReaderOptions& options,
                                         const std::string& collection) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options.connect_timeout_ms);
  auto conn = pg::Connect(options.conninfo, deadline);
  if (!conn.ok()) {
    return conn.status().WithContext("purging " + collection + " from " +
                                     pg::DescribeConninfo(options.conninfo));
  }
  PGconn* c = conn->get();
  ATFILL_RETURN_IF_ERROR(pg::CheckSchemaCurrent(c, options.schema));
  const std::string sql =
      "WITH gone AS (DELETE FROM " + pg::QualifiedName(options.schema, "atfill_record_rows") +
      " WHERE ctid IN (SELECT ctid FROM " +
      pg::QualifiedName(options.schema, "atfill_record_rows") + " WHERE collection = $1 LIMIT " +
      std::to_string(kPurgeRows) + ") RETURNING 1) SELECT count(*) FROM gone";
  uint64_t deleted = 0;
  for (;;) {
    ATFILL_ASSIGN_OR_RETURN(pg::PgResult r, pg::Query(c, sql, {collection.c_str()}, nullptr));
    const uint64_t n = std::stoull(std::string(pg::Cell(r.get(), 0, 0)));
    deleted += n;
    if (n < static_cast<uint64_t>(kPurgeRows)) return deleted;
  }
}

}  // namespace atfill::sinks
