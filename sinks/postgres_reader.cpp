#include "sinks/postgres_reader.hpp"

#include <charconv>
#include <chrono>
#include <mutex>
#include <utility>

#include "sinks/postgres_schema.hpp"
#include "sinks/postgres_util.hpp"
#include "sinks/shared_reader.hpp"

namespace atfill::sinks {
namespace {

using pg::PgResult;

// indexed_at_us is computed from the view's own text, so it checks that text round-trips.
constexpr std::string_view kColumns =
    "SELECT uri, did, collection, rkey, record, cid, rev, indexed_at, created_at, "
    "extract(epoch FROM left(indexed_at, 19)::timestamp)::bigint * 1000000 + "
    "substr(indexed_at, 21, 6)::bigint FROM ";

RecordRow ReadRow(const PGresult* r, int row) {
  RecordRow out;
  out.uri = pg::Cell(r, row, 0);
  out.did = pg::Cell(r, row, 1);
  out.collection = pg::Cell(r, row, 2);
  out.rkey = pg::Cell(r, row, 3);
  out.record = pg::Cell(r, row, 4);
  out.cid = pg::Cell(r, row, 5);
  out.rev = pg::Cell(r, row, 6);
  out.indexed_at = pg::Cell(r, row, 7);
  out.created_at = pg::Cell(r, row, 8);
  const std::string_view us = pg::Cell(r, row, 9);
  std::from_chars(us.data(), us.data() + us.size(), out.indexed_at_us);
  return out;
}

struct UriParts {
  std::string_view did, collection, rkey;
};

Result<UriParts> SplitUri(std::string_view uri) {
  constexpr std::string_view kScheme = "at://";
  auto invalid = [&](const char* why) {
    return Status::Invalid("AT URI '" + std::string(uri) + "': " + why);
  };
  if (!uri.starts_with(kScheme)) return invalid("does not start with at://");
  std::string_view rest = uri.substr(kScheme.size());
  const size_t first = rest.find('/');
  if (first == std::string_view::npos) return invalid("has no collection");
  const size_t second = rest.find('/', first + 1);
  if (second == std::string_view::npos) return invalid("has no record key");
  if (rest.find('/', second + 1) != std::string_view::npos) return invalid("has extra path parts");
  UriParts parts{rest.substr(0, first), rest.substr(first + 1, second - first - 1),
                 rest.substr(second + 1)};
  if (parts.did.empty() || parts.collection.empty() || parts.rkey.empty()) {
    return invalid("has an empty part");
  }
  return parts;
}

}  // namespace

struct PostgresReader::Impl {
  PostgresReaderOptions options;
  pg::Conn conn;
  std::string view;
  std::string get_sql, record_sql, all_sql, count_sql, holds_sql, dids_sql, repo_sql;

  Status Connect() {
    const auto deadline = pg::Clock::now() + std::chrono::milliseconds(options.connect_timeout_ms);
    auto opened = pg::Connect(options.conninfo, deadline);
    if (!opened.ok()) {
      return opened.status().WithContext("connecting to PostgreSQL at " +
                                         pg::DescribeConninfo(options.conninfo));
    }
    conn = std::move(*opened);
    Status st =
        pg::Exec(conn.get(), "SET default_transaction_read_only = on; SET jit = off", nullptr);
    if (st.ok()) st = pg::CheckSchemaCurrent(conn.get(), options.schema);
    if (!st.ok()) {
      conn.reset();
      return st.WithContext("PostgreSQL at " + pg::DescribeConninfo(options.conninfo));
    }
    return Status::OK();
  }

  // Runs `sql` once, and once more on a new connection when the old one turned out dead.
  Result<PgResult> Run(const std::string& sql, const std::vector<const char*>& params) {
    for (int attempt = 0;; ++attempt) {
      if (conn == nullptr) ATFILL_RETURN_IF_ERROR(Connect());
      pg::Failure failure = pg::Failure::kNone;
      auto r = pg::Query(conn.get(), sql, params, &failure);
      if (r.ok() || failure != pg::Failure::kConnection) return r;
      conn.reset();
      if (attempt > 0) return r;
    }
  }
};

PostgresReader::PostgresReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PostgresReader::~PostgresReader() = default;

Result<std::unique_ptr<PostgresReader>> PostgresReader::Open(const std::string& conninfo) {
  PostgresReaderOptions options;
  options.conninfo = conninfo;
  return Open(options);
}

Result<std::unique_ptr<PostgresReader>> PostgresReader::Open(const PostgresReaderOptions& options) {
  ATFILL_RETURN_IF_ERROR(pg::CheckConninfo(options.conninfo));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  const std::string view = pg::QualifiedName(options.schema, "atfill_records");
  const std::string rows = pg::QualifiedName(options.schema, "atfill_record_rows");
  impl->get_sql =
      std::string(kColumns) + view + " WHERE did = $1 AND collection = $2 AND rkey = $3";
  impl->record_sql =
      "SELECT record FROM " + view + " WHERE did = $1 AND collection = $2 AND rkey = $3";
  impl->all_sql = std::string(kColumns) + view + " ORDER BY uri COLLATE \"C\"";
  impl->count_sql = "SELECT count(*) FROM " + rows;
  // By account, the record table is read through (did_epoch, did_id, collection_id), one probe
  // per block of atfill_record_epochs (schema version 5).
  const std::string epochs = pg::QualifiedName(options.schema, "atfill_record_epochs");
  impl->holds_sql = "SELECT 1 FROM " + epochs + " e JOIN " + rows +
                    " r ON r.did_epoch = e.epoch WHERE r.did_id = (SELECT id FROM " +
                    pg::QualifiedName(options.schema, "atfill_dids") +
                    " WHERE did = $1) AND r.collection_id = (SELECT id FROM " +
                    pg::QualifiedName(options.schema, "atfill_collections") +
                    " WHERE nsid = $2) LIMIT 1";
  const std::string dids = pg::QualifiedName(options.schema, "atfill_dids");
  const std::string collections = pg::QualifiedName(options.schema, "atfill_collections");
  impl->dids_sql =
      "SELECT d.did FROM " + dids + " d WHERE EXISTS (SELECT 1 FROM " + epochs + " e JOIN " + rows +
      " r ON r.did_epoch = e.epoch WHERE r.did_id = d.id) ORDER BY d.did COLLATE \"C\"";
  impl->repo_sql = "SELECT c.nsid, r.rkey, r.cid, coalesce(r.rev, '') FROM " + epochs + " e JOIN " +
                   rows + " r ON r.did_epoch = e.epoch JOIN " + collections +
                   " c ON c.id = r.collection_id WHERE r.did_id = (SELECT id FROM " + dids +
                   " WHERE did = $1) ORDER BY c.nsid COLLATE \"C\", r.rkey COLLATE \"C\"";
  ATFILL_RETURN_IF_ERROR(impl->Connect());
  return std::unique_ptr<PostgresReader>(new PostgresReader(std::move(impl)));
}

Result<std::optional<RecordRow>> PostgresReader::Get(std::string_view uri) {
  ATFILL_ASSIGN_OR_RETURN(UriParts parts, SplitUri(uri));
  return Get(parts.did, parts.collection, parts.rkey);
}

Result<std::optional<RecordRow>> PostgresReader::Get(std::string_view did,
                                                     std::string_view collection,
                                                     std::string_view rkey) {
  const std::string d(did), c(collection), k(rkey);
  ATFILL_ASSIGN_OR_RETURN(PgResult r,
                          impl_->Run(impl_->get_sql, {d.c_str(), c.c_str(), k.c_str()}));
  if (PQntuples(r.get()) == 0) return std::optional<RecordRow>();
  return std::optional<RecordRow>(ReadRow(r.get(), 0));
}

Result<std::optional<std::string>> PostgresReader::ReadRecord(std::string_view uri) {
  ATFILL_ASSIGN_OR_RETURN(UriParts parts, SplitUri(uri));
  const std::string d(parts.did), c(parts.collection), k(parts.rkey);
  ATFILL_ASSIGN_OR_RETURN(PgResult r,
                          impl_->Run(impl_->record_sql, {d.c_str(), c.c_str(), k.c_str()}));
  if (PQntuples(r.get()) == 0) return std::optional<std::string>();
  return std::optional<std::string>(std::string(pg::Cell(r.get(), 0, 0)));
}

Result<std::vector<RecordRow>> PostgresReader::ReadAll() {
  ATFILL_ASSIGN_OR_RETURN(PgResult r, impl_->Run(impl_->all_sql, {}));
  std::vector<RecordRow> rows;
  const int n = PQntuples(r.get());
  rows.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) rows.push_back(ReadRow(r.get(), i));
  return rows;
}

Result<uint64_t> PostgresReader::Count() {
  ATFILL_ASSIGN_OR_RETURN(PgResult r, impl_->Run(impl_->count_sql, {}));
  uint64_t n = 0;
  const std::string_view text = pg::Cell(r.get(), 0, 0);
  std::from_chars(text.data(), text.data() + text.size(), n);
  return n;
}

Result<bool> PostgresReader::HoldsRecords(std::string_view did, std::string_view collection) {
  const std::string d(did), c(collection);
  ATFILL_ASSIGN_OR_RETURN(PgResult r, impl_->Run(impl_->holds_sql, {d.c_str(), c.c_str()}));
  return PQntuples(r.get()) > 0;
}

Result<std::vector<std::string>> PostgresReader::Dids() {
  ATFILL_ASSIGN_OR_RETURN(PgResult r, impl_->Run(impl_->dids_sql, {}));
  std::vector<std::string> out;
  for (int i = 0; i < PQntuples(r.get()); ++i) out.emplace_back(PQgetvalue(r.get(), i, 0));
  return out;
}

Result<std::vector<RepoRecordKey>> PostgresReader::RepoRecords(std::string_view did) {
  const std::string d(did);
  ATFILL_ASSIGN_OR_RETURN(PgResult r, impl_->Run(impl_->repo_sql, {d.c_str()}));
  std::vector<RepoRecordKey> out;
  for (int i = 0; i < PQntuples(r.get()); ++i) {
    out.push_back({PQgetvalue(r.get(), i, 0), PQgetvalue(r.get(), i, 1), PQgetvalue(r.get(), i, 2),
                   PQgetvalue(r.get(), i, 3)});
  }
  return out;
}

std::function<Result<std::vector<std::string>>()> PostgresDidsReader(
    PostgresReaderOptions options) {
  return SharedReader<PostgresReader>(std::move(options), std::vector<std::string>(),
                                      [](PostgresReader& reader) { return reader.Dids(); });
}

std::function<Result<std::vector<RepoRecordKey>>(const std::string& did)> PostgresRepoRecordsReader(
    PostgresReaderOptions options) {
  return SharedReader<PostgresReader>(
      std::move(options), std::vector<RepoRecordKey>(),
      [](PostgresReader& reader, const std::string& did) { return reader.RepoRecords(did); });
}

Result<std::vector<std::vector<std::string>>> PostgresReader::Query(std::string_view sql) {
  ATFILL_ASSIGN_OR_RETURN(PgResult r, impl_->Run(std::string(sql), {}));
  std::vector<std::vector<std::string>> rows;
  const int cols = PQnfields(r.get());
  rows.emplace_back();
  for (int c = 0; c < cols; ++c) rows.back().emplace_back(PQfname(r.get(), c));
  for (int i = 0; i < PQntuples(r.get()); ++i) {
    rows.emplace_back();
    for (int c = 0; c < cols; ++c) rows.back().emplace_back(pg::Cell(r.get(), i, c));
  }
  return rows;
}

std::function<Result<bool>(const std::string& did, const std::string& collection)>
PostgresHoldsRecords(PostgresReaderOptions options) {
  return SharedReader<PostgresReader>(
      std::move(options), false,
      [](PostgresReader& reader, const std::string& did, const std::string& collection) {
        return reader.HoldsRecords(did, collection);
      });
}

std::function<Result<std::optional<std::string>>(std::string_view uri)> PostgresRecordReader(
    PostgresReaderOptions options) {
  return SharedReader<PostgresReader>(
      std::move(options), std::optional<std::string>(),
      [](PostgresReader& reader, std::string_view uri) { return reader.ReadRecord(uri); });
}

}  // namespace atfill::sinks
