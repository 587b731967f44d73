// Read-only access to a database the SQLite sink writes: for tests, tools and scripts that look
// records up by AT URI.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"

namespace atfill::sinks {

// One row of the atfill_records view (see sqlite_sink.hpp for what each column holds).
struct RecordRow {
  std::string uri;
  std::string did;
  std::string collection;
  std::string rkey;
  std::string record;
  std::string cid;
  std::string rev;            // empty when the view holds NULL
  std::string indexed_at;     // the view's text, "YYYY-MM-DDTHH:MM:SS.ffffffZ"
  int64_t indexed_at_us = 0;  // the same instant, unix microseconds (parsed from that text)
  std::string created_at;     // empty when the view holds NULL

  friend bool operator==(const RecordRow&, const RecordRow&) = default;
};

// One stored record of a repo, without its body (what `atfill verify` compares).
struct RepoRecordKey {
  std::string collection;
  std::string rkey;
  std::string cid;
  std::string rev;  // empty when the row holds NULL

  friend bool operator==(const RepoRecordKey&, const RepoRecordKey&) = default;
};

// A read-only connection. Never blocks the sink (WAL readers see the last committed batch) and
// never migrates: a database at another schema version is Unsupported, one without atfill tables
// NotFound. Not thread-safe: one reader per thread.
class SqliteReader {
 public:
  // Opens an existing database read-only; a missing file is NotFound.
  static Result<std::unique_ptr<SqliteReader>> Open(const std::string& path);
  ~SqliteReader();
  SqliteReader(const SqliteReader&) = delete;
  SqliteReader& operator=(const SqliteReader&) = delete;

  // The record at `uri` ("at://did/collection/rkey"), or nullopt. A URI not of that shape is
  // Invalid. Uses the key index (no scan).
  Result<std::optional<RecordRow>> Get(std::string_view uri);
  Result<std::optional<RecordRow>> Get(std::string_view did, std::string_view collection,
                                       std::string_view rkey);
  // Every record, ordered by uri (byte order).
  Result<std::vector<RecordRow>> ReadAll();
  // Number of records.
  Result<uint64_t> Count();
  // Whether any record of `did` in `collection` is stored. Uses the key index (no scan).
  Result<bool> HoldsRecords(std::string_view did, std::string_view collection);
  // The DIDs that hold at least one record, in byte order. Reads the account index once through.
  Result<std::vector<std::string>> Dids();
  // The statement Dids runs (its plan is tested).
  static std::string_view DidsSql();
  // The records of `did` as (collection, rkey, cid, rev), by collection then rkey (byte order).
  // Uses the account index (no scan).
  Result<std::vector<RepoRecordKey>> RepoRecords(std::string_view did);
  // Runs one read-only SQL statement and returns its rows as text (NULL as ""), the column names
  // first. For tools and the demo; the connection is read-only, so writes fail.
  Result<std::vector<std::vector<std::string>>> Query(std::string_view sql);

 private:
  struct Impl;
  explicit SqliteReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One-shot helpers over SqliteReader.
Result<std::vector<RecordRow>> ReadAllRecords(const std::string& path);
Result<std::optional<RecordRow>> GetRecord(const std::string& path, std::string_view uri);

// SqliteReader::HoldsRecords on the database at `path`, for a caller on any thread (one
// connection behind a mutex, opened at the first call; a database not yet created holds nothing).
std::function<Result<bool>(const std::string& did, const std::string& collection)>
SqliteHoldsRecords(std::string path);

// SqliteReader::Dids and RepoRecords on the database at `path`, for a caller on any thread (as
// SqliteHoldsRecords; a database not yet created holds nothing).
std::function<Result<std::vector<std::string>>()> SqliteDidsReader(std::string path);
std::function<Result<std::vector<RepoRecordKey>>(const std::string& did)> SqliteRepoRecordsReader(
    std::string path);

// SqliteReader::Get's record JSON at an AT URI (nullopt when none), likewise.
std::function<Result<std::optional<std::string>>(std::string_view uri)> SqliteRecordReader(
    std::string path);

}  // namespace atfill::sinks
