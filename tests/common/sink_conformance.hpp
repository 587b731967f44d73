// The Sink conformance suite: every pipeline::Sink implementation runs the same tests of the write
// rules in pipeline/sink.hpp. An implementation instantiates it with a SinkConformanceParam:
//
//   INSTANTIATE_TEST_SUITE_P(Sqlite, SinkConformanceTest,
//                            ::testing::Values(MySinkParam()), SinkConformanceName);
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "pipeline/sink.hpp"
#include "sinks/sqlite_reader.hpp"  // RecordRow: one row of the atfill_records view, either sink

namespace atfill::testing {

// A row as every sink stores it; optional columns are empty when the database holds NULL.
struct TableRow {
  std::string uri;
  std::string cid;
  std::string rev;
  std::string record;
  std::string created_at;

  friend bool operator==(const TableRow&, const TableRow&) = default;
  friend std::ostream& operator<<(std::ostream& os, const TableRow& r);
};

// Reads back what a sink wrote, through the backend's own read path.
class TableReader {
 public:
  virtual ~TableReader() = default;
  // Every row, ordered by uri.
  virtual Result<std::vector<TableRow>> ReadAll() = 0;
  // The row's indexed_at in unix microseconds, nullopt when there is no such row.
  virtual Result<std::optional<int64_t>> IndexedAtUs(std::string_view uri) = 0;
  // The same as the view's text ("YYYY-MM-DDTHH:MM:SS.ffffffZ").
  virtual Result<std::optional<std::string>> IndexedAtText(std::string_view uri) = 0;
};

// The backend's own reader (SqliteReader, PostgresReader): what tools and scripts look records up
// with. Each method is the reader's method of the same name.
class RecordLookup {
 public:
  virtual ~RecordLookup() = default;
  virtual Result<std::optional<sinks::RecordRow>> Get(std::string_view uri) = 0;
  virtual Result<std::optional<sinks::RecordRow>> Get(std::string_view did,
                                                      std::string_view collection,
                                                      std::string_view rkey) = 0;
  virtual Result<uint64_t> Count() = 0;
  virtual Result<bool> HoldsRecords(std::string_view did, std::string_view collection) = 0;
  virtual Result<std::vector<std::vector<std::string>>> Query(std::string_view sql) = 0;
  virtual Result<std::vector<std::string>> Dids() = 0;
  virtual Result<std::vector<sinks::RepoRecordKey>> RepoRecords(std::string_view did) = 0;
};

// A RecordLookup over a reader class that has those methods.
template <typename Reader>
class ReaderLookup : public RecordLookup {
 public:
  explicit ReaderLookup(std::unique_ptr<Reader> reader) : reader_(std::move(reader)) {}
  Result<std::optional<sinks::RecordRow>> Get(std::string_view uri) override {
    return reader_->Get(uri);
  }
  Result<std::optional<sinks::RecordRow>> Get(std::string_view did, std::string_view collection,
                                              std::string_view rkey) override {
    return reader_->Get(did, collection, rkey);
  }
  Result<uint64_t> Count() override { return reader_->Count(); }
  Result<bool> HoldsRecords(std::string_view did, std::string_view collection) override {
    return reader_->HoldsRecords(did, collection);
  }
  Result<std::vector<std::vector<std::string>>> Query(std::string_view sql) override {
    return reader_->Query(sql);
  }
  Result<std::vector<std::string>> Dids() override { return reader_->Dids(); }
  Result<std::vector<sinks::RepoRecordKey>> RepoRecords(std::string_view did) override {
    return reader_->RepoRecords(did);
  }

 private:
  std::unique_ptr<Reader> reader_;
};

// Wraps a reader's Open result.
template <typename Reader>
Result<std::unique_ptr<RecordLookup>> LookupOf(Result<std::unique_ptr<Reader>> reader) {
  if (!reader.ok()) return reader.status();
  return std::unique_ptr<RecordLookup>(
      std::make_unique<ReaderLookup<Reader>>(std::move(reader).value()));
}

// Keeps the backend refusing writes transiently (Unavailable) while it lives.
class WriteBlocker {
 public:
  virtual ~WriteBlocker() = default;
};

// Options a case changes on the env's sink.
struct SinkTweaks {
  // The intern cache's entries (DID and collection ids); 0 keeps the env's.
  size_t intern_cache_entries = 0;
  // The sink's default lock wait (seconds) instead of the env's short one.
  bool default_lock_timeout = false;
};

// One empty database for one test.
class SinkTestEnv {
 public:
  virtual ~SinkTestEnv() = default;
  // A new sink on this env's database (each call a new connection); it must take indexed_at from
  // the clock the env was made with, and give up on a blocked database within about a second.
  virtual Result<std::unique_ptr<pipeline::Sink>> OpenSink() = 0;
  virtual TableReader& reader() = 0;
  // Holds the database's write lock from another connection until the result dies.
  virtual Result<std::unique_ptr<WriteBlocker>> BlockWrites() = 0;
  // The cases below fail with Internal on an env that does not override them.
  // OpenSink with some of the sink's options changed.
  virtual Result<std::unique_ptr<pipeline::Sink>> OpenSinkWith(const SinkTweaks& tweaks);
  // Opens the backend's own reader (SqliteReader, PostgresReader) on the database.
  virtual Result<std::unique_ptr<RecordLookup>> OpenReader();
  // Runs SQL (the same text on every backend: plain statements on the atfill tables) on a
  // connection of its own.
  virtual Status Exec(const std::string& sql);
  // The first column of every row of a query, as text ("NULL" for NULL).
  virtual Result<std::vector<std::string>> Column(const std::string& sql);
  // The backend's purge of a collection's rows (sinks/purge.hpp).
  virtual Result<uint64_t> PurgeCollection(const std::string& collection);
};

struct SinkConformanceParam {
  std::string name;
  // Creates a fresh, empty database whose sinks read the time (unix microseconds) from `now_us`.
  std::function<Result<std::unique_ptr<SinkTestEnv>>(std::function<int64_t()> now_us)> make_env;
};

void PrintTo(const SinkConformanceParam& param, std::ostream* os);
std::string SinkConformanceName(const ::testing::TestParamInfo<SinkConformanceParam>& info);

// Event builders shared by the suite and the backend-specific tests. The CID is the real
// DAG-CBOR-codec CID of the body bytes, so distinct bodies have distinct CIDs.
pipeline::Event MakeCreate(std::string did, std::string collection, std::string rkey,
                           std::string body, std::string rev = "", std::string created_at = "");
pipeline::Event MakeUpdate(std::string did, std::string collection, std::string rkey,
                           std::string body, std::string rev = "");
pipeline::Event MakeDelete(std::string did, std::string collection, std::string rkey,
                           std::string rev = "");
pipeline::Event MakeAccount(std::string did, pipeline::AccountStatus status);
// The text form of MakeCreate's CID for `body`.
std::string CidOf(std::string_view body);

class SinkConformanceTest : public ::testing::TestWithParam<SinkConformanceParam> {
 protected:
  void SetUp() override;

  // Writes `batch` with sink_, failing the test on an error.
  pipeline::WriteStats MustWrite(const std::vector<pipeline::Event>& batch);
  std::vector<TableRow> MustReadAll();
  std::optional<int64_t> MustIndexedAt(std::string_view uri);
  // env_->Column, failing the test on an error.
  std::vector<std::string> MustColumn(const std::string& sql);

  int64_t now_us_ = 1'796'029'200'000'000;  // 2026-11-30T09:00:00Z
  std::unique_ptr<SinkTestEnv> env_;
  std::unique_ptr<pipeline::Sink> sink_;
};

}  // namespace atfill::testing
