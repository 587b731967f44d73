// Read-only access to the tables the PostgreSQL sink writes: for tests, tools and scripts that
// look records up by AT URI.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "sinks/sqlite_reader.hpp"  // RecordRow: one row of the atfill_records view, either sink

namespace atfill::sinks {

struct PostgresReaderOptions {
  // As PostgresSinkOptions::conninfo.
  std::string conninfo;
  // The schema holding the atfill tables.
  std::string schema = "public";
  // Longest a call waits to (re)connect, in milliseconds.
  int64_t connect_timeout_ms = 10000;
};

// One read-only connection (default_transaction_read_only). Never migrates: tables at another
// schema version are Unsupported, a schema without atfill tables NotFound. A connection lost
// between calls (a server restart) is replaced at the next call; a server that stays down is
// Unavailable. Not thread-safe: one reader per thread.
class PostgresReader {
 public:
  static Result<std::unique_ptr<PostgresReader>> Open(const PostgresReaderOptions& options);
  static Result<std::unique_ptr<PostgresReader>> Open(const std::string& conninfo);
  ~PostgresReader();
  PostgresReader(const PostgresReader&) = delete;
  PostgresReader& operator=(const PostgresReader&) = delete;

  // The record at `uri` ("at://did/collection/rkey"), or nullopt. A URI not of that shape is
  // Invalid. Uses the primary key (no scan).
  Result<std::optional<RecordRow>> Get(std::string_view uri);
  Result<std::optional<RecordRow>> Get(std::string_view did, std::string_view collection,
                                       std::string_view rkey);
  // Only the record's JSON text, exactly as received (for scripts).
  Result<std::optional<std::string>> ReadRecord(std::string_view uri);
  // Every record, ordered by uri (byte order).
  Result<std::vector<RecordRow>> ReadAll();
  // Number of records.
  Result<uint64_t> Count();
  // Whether any record of `did` in `collection` is stored. Uses the primary key (no scan).
  Result<bool> HoldsRecords(std::string_view did, std::string_view collection);
  // Runs one SQL statement and returns its rows as text (NULL as ""), the column names first. The
  // session is read-only, so writes fail.
  Result<std::vector<std::vector<std::string>>> Query(std::string_view sql);
  // As SqliteReader::Dids and RepoRecords.
  Result<std::vector<std::string>> Dids();
  Result<std::vector<RepoRecordKey>> RepoRecords(std::string_view did);

 private:
  struct Impl;
  explicit PostgresReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// PostgresReader::HoldsRecords for a caller on any thread (one connection behind a mutex, opened at
// the first call; tables not yet created hold nothing).
std::function<Result<bool>(const std::string& did, const std::string& collection)>
PostgresHoldsRecords(PostgresReaderOptions options);

// PostgresReader::Dids and RepoRecords for a caller on any thread (as PostgresHoldsRecords).
std::function<Result<std::vector<std::string>>()> PostgresDidsReader(PostgresReaderOptions options);
std::function<Result<std::vector<RepoRecordKey>>(const std::string& did)> PostgresRepoRecordsReader(
    PostgresReaderOptions options);

// PostgresReader::ReadRecord for a caller on any thread (one connection behind a mutex, opened at
// the first call; tables not yet created hold nothing).
std::function<Result<std::optional<std::string>>(std::string_view uri)> PostgresRecordReader(
    PostgresReaderOptions options);

}  // namespace atfill::sinks
