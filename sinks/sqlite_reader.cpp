#include "sinks/sqlite_reader.hpp"

#include <filesystem>
#include <mutex>
#include <system_error>
#include <utility>

#include "sinks/shared_reader.hpp"
#include "sinks/sqlite_schema.hpp"
#include "sinks/sqlite_util.hpp"

namespace atfill::sinks {
namespace {

using sqlite::BindText;
using sqlite::ColumnText;
using sqlite::ResetOnExit;
using sqlite::Stmt;

// indexed_at_us is computed from the view's own text, so it checks that text round-trips.
constexpr std::string_view kColumns =
    "SELECT uri, did, collection, rkey, record, cid, rev, indexed_at, created_at, "
    "CAST(strftime('%s', substr(indexed_at, 1, 19)) AS INTEGER) * 1000000 + "
    "CAST(substr(indexed_at, 21, 6) AS INTEGER) FROM atfill_records";

RecordRow ReadRow(sqlite3_stmt* s) {
  RecordRow row;
  row.uri = ColumnText(s, 0);
  row.did = ColumnText(s, 1);
  row.collection = ColumnText(s, 2);
  row.rkey = ColumnText(s, 3);
  row.record = ColumnText(s, 4);
  row.cid = ColumnText(s, 5);
  row.rev = ColumnText(s, 6);
  row.indexed_at = ColumnText(s, 7);
  row.created_at = ColumnText(s, 8);
  row.indexed_at_us = sqlite3_column_int64(s, 9);
  return row;
}

}  // namespace

struct SqliteReader::Impl {
  std::string path;
  sqlite::Db db;
  Stmt get;
  Stmt all;
  Stmt count;
  Stmt holds;
  Stmt dids;
  Stmt repo;

  // Opens the connection and prepares the statements.
  Status Init();
  Status Fail(int rc, const char* what) const {
    return sqlite::ErrorStatus(db.get(), rc, what).WithContext("SQLite database " + path);
  }
};

SqliteReader::SqliteReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SqliteReader::~SqliteReader() = default;

Result<std::unique_ptr<SqliteReader>> SqliteReader::Open(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return Status::NotFound("no SQLite database at " + path);
  }
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  Status st = impl->Init();
  if (!st.ok()) return st.WithContext("opening SQLite database " + path);
  return std::unique_ptr<SqliteReader>(new SqliteReader(std::move(impl)));
}

Status SqliteReader::Impl::Init() {
  ATFILL_ASSIGN_OR_RETURN(db, sqlite::Open(path, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX));
  sqlite3* raw = db.get();
  // A reader waits only while a WAL is being recovered by another connection.
  sqlite3_busy_timeout(raw, 5000);
  ATFILL_RETURN_IF_ERROR(sqlite::CheckSchemaCurrent(raw));
  std::string get_sql(kColumns);
  get_sql += " WHERE did = ?1 AND collection = ?2 AND rkey = ?3";
  ATFILL_ASSIGN_OR_RETURN(get, sqlite::Prepare(raw, get_sql, true));
  std::string all_sql(kColumns);
  all_sql += " ORDER BY uri";
  ATFILL_ASSIGN_OR_RETURN(all, sqlite::Prepare(raw, all_sql, true));
  ATFILL_ASSIGN_OR_RETURN(count,
                          sqlite::Prepare(raw, "SELECT count(*) FROM atfill_record_rows", true));
  ATFILL_ASSIGN_OR_RETURN(
      holds, sqlite::Prepare(raw,
                             "SELECT 1 FROM atfill_record_rows WHERE did_id = (SELECT id FROM "
                             "atfill_dids WHERE did = ?1) AND collection_id = (SELECT id FROM "
                             "atfill_collections WHERE nsid = ?2) LIMIT 1",
                             true));
  ATFILL_ASSIGN_OR_RETURN(dids, sqlite::Prepare(raw, std::string(SqliteReader::DidsSql()), true));
  ATFILL_ASSIGN_OR_RETURN(
      repo, sqlite::Prepare(
                raw,
                "SELECT c.nsid, r.rkey, atfill_cid(r.cid), r.rev FROM atfill_record_rows r JOIN "
                "atfill_collections c ON c.id = r.collection_id WHERE r.did_id = "
                "(SELECT id FROM atfill_dids WHERE did = ?1) ORDER BY c.nsid, r.rkey",
                true));
  return Status::OK();
}

Result<std::optional<RecordRow>> SqliteReader::Get(std::string_view uri) {
  constexpr std::string_view kScheme = "at://";
  auto invalid = [&](const char* why) {
    return Status::Invalid("AT URI '" + std::string(uri) + "': " + why);
  };
  if (!uri.starts_with(kScheme)) return invalid("does not start with at://");
  std::string_view rest = uri.substr(kScheme.size());
  size_t first = rest.find('/');
  if (first == std::string_view::npos) return invalid("has no collection");
  size_t second = rest.find('/', first + 1);
  if (second == std::string_view::npos) return invalid("has no record key");
  if (rest.find('/', second + 1) != std::string_view::npos) return invalid("has extra path parts");
  std::string_view did = rest.substr(0, first);
  std::string_view collection = rest.substr(first + 1, second - first - 1);
  std::string_view rkey = rest.substr(second + 1);
  if (did.empty() || collection.empty() || rkey.empty()) return invalid("has an empty part");
  return Get(did, collection, rkey);
}

Result<std::optional<RecordRow>> SqliteReader::Get(std::string_view did,
                                                   std::string_view collection,
                                                   std::string_view rkey) {
  sqlite3_stmt* s = impl_->get.get();
  ResetOnExit reset(s);
  BindText(s, 1, did);
  BindText(s, 2, collection);
  BindText(s, 3, rkey);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_DONE) return std::optional<RecordRow>();
  if (rc != SQLITE_ROW) return impl_->Fail(rc, "reading a record");
  return std::optional<RecordRow>(ReadRow(s));
}

Result<std::vector<RecordRow>> SqliteReader::ReadAll() {
  sqlite3_stmt* s = impl_->all.get();
  ResetOnExit reset(s);
  std::vector<RecordRow> rows;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) rows.push_back(ReadRow(s));
  if (rc != SQLITE_DONE) return impl_->Fail(rc, "reading the records");
  return rows;
}

Result<uint64_t> SqliteReader::Count() {
  sqlite3_stmt* s = impl_->count.get();
  ResetOnExit reset(s);
  int rc = sqlite3_step(s);
  if (rc != SQLITE_ROW) return impl_->Fail(rc, "counting the records");
  return static_cast<uint64_t>(sqlite3_column_int64(s, 0));
}

Result<bool> SqliteReader::HoldsRecords(std::string_view did, std::string_view collection) {
  sqlite3_stmt* s = impl_->holds.get();
  ResetOnExit reset(s);
  BindText(s, 1, did);
  BindText(s, 2, collection);
  const int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return impl_->Fail(rc, "looking up an account's records");
}

// One pass over the account index's entries, rather than a probe per account: the account index
// leads with the row's block, so a probe per account is a skip scan over every block, and
// accounts times blocks grows past the table's rows once the accounts outnumber a block's rows.
// The pass costs the table's size, which `verify`, the caller, then reads in full anyway.
std::string_view SqliteReader::DidsSql() {
  return "SELECT did FROM atfill_dids WHERE id IN (SELECT did_id FROM atfill_record_rows) "
         "ORDER BY did";
}

Result<std::vector<std::string>> SqliteReader::Dids() {
  sqlite3_stmt* s = impl_->dids.get();
  ResetOnExit reset(s);
  std::vector<std::string> out;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) out.emplace_back(ColumnText(s, 0));
  if (rc != SQLITE_DONE) return impl_->Fail(rc, "listing the accounts");
  return out;
}

Result<std::vector<RepoRecordKey>> SqliteReader::RepoRecords(std::string_view did) {
  sqlite3_stmt* s = impl_->repo.get();
  ResetOnExit reset(s);
  BindText(s, 1, did);
  std::vector<RepoRecordKey> out;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    out.push_back({std::string(ColumnText(s, 0)), std::string(ColumnText(s, 1)),
                   std::string(ColumnText(s, 2)), std::string(ColumnText(s, 3))});
  }
  if (rc != SQLITE_DONE) return impl_->Fail(rc, "reading an account's records");
  return out;
}

std::function<Result<std::vector<std::string>>()> SqliteDidsReader(std::string path) {
  return SharedReader<SqliteReader>(std::move(path), std::vector<std::string>(),
                                    [](SqliteReader& reader) { return reader.Dids(); });
}

std::function<Result<std::vector<RepoRecordKey>>(const std::string& did)> SqliteRepoRecordsReader(
    std::string path) {
  return SharedReader<SqliteReader>(
      std::move(path), std::vector<RepoRecordKey>(),
      [](SqliteReader& reader, const std::string& did) { return reader.RepoRecords(did); });
}

std::function<Result<bool>(const std::string& did, const std::string& collection)>
SqliteHoldsRecords(std::string path) {
  return SharedReader<SqliteReader>(
      std::move(path), false,
      [](SqliteReader& reader, const std::string& did, const std::string& collection) {
        return reader.HoldsRecords(did, collection);
      });
}

std::function<Result<std::optional<std::string>>(std::string_view uri)> SqliteRecordReader(
    std::string path) {
  return SharedReader<SqliteReader>(
      std::move(path), std::optional<std::string>(),
      [](SqliteReader& reader, std::string_view uri) -> Result<std::optional<std::string>> {
        ATFILL_ASSIGN_OR_RETURN(auto row, reader.Get(uri));
        if (!row) return std::optional<std::string>();
        return std::optional<std::string>(std::move(row->record));
      });
}

Result<std::vector<std::vector<std::string>>> SqliteReader::Query(std::string_view sql) {
  sqlite3_stmt* raw = nullptr;
  int rc =
      sqlite3_prepare_v2(impl_->db.get(), sql.data(), static_cast<int>(sql.size()), &raw, nullptr);
  if (rc != SQLITE_OK) return impl_->Fail(rc, "preparing a query");
  Stmt stmt(raw);
  std::vector<std::vector<std::string>> rows;
  const int n = sqlite3_column_count(raw);
  rows.emplace_back();
  for (int i = 0; i < n; ++i) rows.back().emplace_back(sqlite3_column_name(raw, i));
  while ((rc = sqlite3_step(raw)) == SQLITE_ROW) {
    rows.emplace_back();
    for (int i = 0; i < n; ++i) {
      const unsigned char* text = sqlite3_column_text(raw, i);
      rows.back().emplace_back(text == nullptr ? "" : reinterpret_cast<const char*>(text));
    }
  }
  if (rc != SQLITE_DONE) return impl_->Fail(rc, "running a query");
  return rows;
}

Result<std::vector<RecordRow>> ReadAllRecords(const std::string& path) {
  ATFILL_ASSIGN_OR_RETURN(std::unique_ptr<SqliteReader> reader, SqliteReader::Open(path));
  return reader->ReadAll();
}

Result<std::optional<RecordRow>> GetRecord(const std::string& path, std::string_view uri) {
  ATFILL_ASSIGN_OR_RETURN(std::unique_ptr<SqliteReader> reader, SqliteReader::Open(path));
  return reader->Get(uri);
}

}  // namespace atfill::sinks
