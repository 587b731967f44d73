// The SQLite sink's bulk load (SqliteSinkOptions::bulk_load, a fresh backfill's layout): a
// bulk-loaded table ends with the same rows, indexes, planner statistics and query plans as one
// written the ordinary way; a table that holds rows is never switched; a process killed mid-load
// (SIGKILL) leaves a table that a resumed load, or any later open, brings to the same end as an
// uninterrupted run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "sinks/sqlite_reader.hpp"
#include "sinks/sqlite_sink.hpp"
#include "tests/common/process.hpp"
#include "tests/common/raw_sqlite.hpp"
#include "tests/common/sink_conformance.hpp"
#include "tests/common/sqlite_fixtures.hpp"

namespace atfill::sinks {
namespace {

using pipeline::AccountStatus;
using pipeline::Event;
using testing::MakeAccount;
using testing::MakeCreate;
using testing::MakeDelete;
using testing::MakeUpdate;

// The first column of every row of `sql` on the database at `path`, as text.
std::vector<std::string> Column(const std::string& path, const std::string& sql) {
  return testing::RawDb(path).Column(sql);
}

// The record table's indexes, "name: sql", by name.
std::vector<std::string> Indexes(const std::string& path) {
  return Column(path,
                "SELECT name || ': ' || sql FROM sqlite_schema WHERE type = 'index' AND "
                "tbl_name = 'atfill_record_rows' AND sql IS NOT NULL ORDER BY name");
}

std::vector<std::string> Stat1(const std::string& path) {
  return Column(path,
                "SELECT idx || ' ' || stat FROM sqlite_stat1 WHERE tbl = 'atfill_record_rows' "
                "ORDER BY idx");
}

// The plans of the queries of docs/queries.md, one line per step.
std::vector<std::string> Plans(const std::string& path) {
  std::vector<std::string> out;
  for (const char* q :
       {"SELECT uri FROM atfill_records WHERE collection = 'app.bsky.feed.post' ORDER BY "
        "created_at DESC LIMIT 20",
        "SELECT uri FROM atfill_records WHERE did = 'did:plc:a' LIMIT 20",
        "SELECT uri FROM atfill_records WHERE did = 'did:plc:a' AND collection = "
        "'app.bsky.feed.post' LIMIT 20",
        "SELECT uri FROM atfill_records WHERE did = 'did:plc:a' AND collection = "
        "'app.bsky.feed.post' AND rkey = 'x'"}) {
    for (std::string& step : Column(path, std::string("EXPLAIN QUERY PLAN ") + q)) {
      out.push_back(std::move(step));
    }
    out.push_back("--");
  }
  return out;
}

const std::vector<std::string> kFinalIndexes = {
    "atfill_record_rows_by_created: CREATE INDEX atfill_record_rows_by_created ON "
    "atfill_record_rows(collection_id, created_at)",
    "atfill_record_rows_by_did: CREATE INDEX atfill_record_rows_by_did ON "
    "atfill_record_rows(did_epoch, did_id, collection_id)",
    "atfill_record_rows_key: CREATE UNIQUE INDEX atfill_record_rows_key ON "
    "atfill_record_rows(collection_id, rkey, did_id)",
};

std::vector<std::string> Uris(const std::string& path) {
  auto rows = ReadAllRecords(path);
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  std::vector<std::string> out;
  if (!rows.ok()) return out;
  for (const RecordRow& r : *rows) {
    out.push_back(r.uri + " " + r.cid + " " + r.rev + " " + r.created_at + " " + r.record + " " +
                  r.indexed_at);
  }
  return out;
}

SqliteSinkOptions Options(const std::string& path, bool bulk) {
  SqliteSinkOptions o;
  o.path = path;
  o.bulk_load = bulk;
  o.now_us = [] { return int64_t{1'796'029'200'000'000}; };
  return o;
}

std::string Did(int a) { return "did:plc:acct" + std::to_string(1000 + a); }

// A crawl's batches: accounts one after another, each with records whose keys span its history
// (not in key order across accounts), plus what a crawl also meets: a record delivered twice, an
// update, a delete and a resync purge.
std::vector<std::vector<Event>> CrawlBatches(int batches) {
  std::vector<std::vector<Event>> out;
  int account = 0;
  for (int b = 0; b < batches; ++b) {
    std::vector<Event> batch;
    for (int k = 0; k < 3; ++k, ++account) {
      const std::string did = Did(account);
      for (int r = 0; r < 30; ++r) {
        const std::string rkey =
            "3k" + std::to_string(100 + (r * 37 + account * 11) % 100) + std::to_string(account);
        const char* coll = r % 3 == 0 ? "app.bsky.feed.post" : "app.bsky.feed.like";
        batch.push_back(MakeCreate(did, coll, rkey, R"({"text":")" + did + rkey + R"("})",
                                   "3kaaaaaaaaa2a",
                                   "2025-0" + std::to_string(1 + r % 9) + "-01T00:00:00Z"));
      }
      batch.push_back(batch.back());  // redelivered
      batch.push_back(MakeUpdate(
          did, "app.bsky.feed.like",
          "3k" + std::to_string(100 + (1 * 37 + account * 11) % 100) + std::to_string(account),
          R"({"text":"updated"})", "3kbbbbbbbbb2a"));
      batch.push_back(MakeDelete(
          did, "app.bsky.feed.post",
          "3k" + std::to_string(100 + (0 * 37 + account * 11) % 100) + std::to_string(account),
          "3kbbbbbbbbb2a"));
    }
    if (b % 4 == 3) batch.push_back(MakeAccount(Did(account - 1), AccountStatus::kDeleted));
    out.push_back(std::move(batch));
  }
  return out;
}

void WriteAll(const SqliteSinkOptions& o, const std::vector<std::vector<Event>>& batches) {
  auto sink = OpenSqliteSink(o);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  for (const auto& b : batches) {
    auto st = (*sink)->Write(b);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
  }
}

TEST(SqliteBulkLoadTest, LoadsWithoutTheFinalIndexesAndEndsWithTheSameTableIndexesAndPlans) {
  testing::TempDir dir;
  const std::string truth = (dir.path() / "truth.db").string();
  const std::string bulk = (dir.path() / "bulk.db").string();
  const auto batches = CrawlBatches(12);
  WriteAll(Options(truth, false), batches);
  ASSERT_EQ(Indexes(truth), kFinalIndexes);
  // The index builds at the close are said (the job's end waits for them), and nothing else.
  std::vector<std::string> said;
  SqliteSinkOptions options = Options(bulk, true);
  options.log = [&said](std::string_view line) { said.emplace_back(line); };
  {
    auto sink = OpenSqliteSink(options);
    ASSERT_TRUE(sink.ok()) << sink.status().ToString();
    for (const auto& b : batches) ASSERT_TRUE((*sink)->Write(b).ok());
    // While loading: the key by account, no created_at index.
    EXPECT_EQ(Indexes(bulk),
              (std::vector<std::string>{
                  "atfill_record_rows_bulk_key: CREATE UNIQUE INDEX atfill_record_rows_bulk_key "
                  "ON atfill_record_rows(did_id, collection_id, rkey)",
                  kFinalIndexes[1]}));
    // Readers answer the same meanwhile.
    EXPECT_EQ(Uris(bulk), Uris(truth));
    const std::string uri = "at://" + Did(4) + "/app.bsky.feed.like/3k" +
                            std::to_string(100 + (1 * 37 + 4 * 11) % 100) + "4";
    auto got = GetRecord(bulk, uri);
    ASSERT_TRUE(got.ok() && got->has_value()) << uri;
    EXPECT_EQ((*got)->record, R"({"text":"updated"})");
    EXPECT_TRUE(said.empty());
  }
  ASSERT_EQ(said.size(), 2u);
  const std::string max_id = Column(bulk, "SELECT max(id) FROM atfill_record_rows").at(0);
  EXPECT_EQ(said[0], "atfill: sqlite: building the indexes of the bulk load of " + bulk +
                         " (up to " + max_id + " record rows)");
  EXPECT_TRUE(said[1].starts_with("atfill: sqlite: built the indexes of " + bulk + " in "))
      << said[1];
  EXPECT_EQ(Indexes(bulk), kFinalIndexes);
  EXPECT_EQ(Stat1(bulk), Stat1(truth));
  EXPECT_EQ(Plans(bulk), Plans(truth));
  EXPECT_EQ(Uris(bulk), Uris(truth));
  EXPECT_GT(Uris(truth).size(), 700u);
}

TEST(SqliteBulkLoadTest, ATableThatHoldsRowsIsWrittenInItsLayout) {
  testing::TempDir dir;
  const std::string path = (dir.path() / "atfill.db").string();
  const auto batches = CrawlBatches(2);
  WriteAll(Options(path, false), {batches[0]});
  auto sink = OpenSqliteSink(Options(path, true));
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  EXPECT_EQ(Indexes(path), kFinalIndexes);
  ASSERT_TRUE((*sink)->Write(batches[1]).ok());
  EXPECT_EQ(Indexes(path), kFinalIndexes);
}

// Kills a loader mid-load; the table is left in the load layout, with some of the batches. The
// loader writes the batches, and again, until killed after the first half is committed.
void KillMidLoad(const std::string& path, const std::vector<std::vector<Event>>& batches) {
  const size_t gate = batches.size() / 2;
  testing::KillSinkWriterAfter(
      Options(path, true), [&](size_t i) { return batches[i % batches.size()]; },
      [gate](size_t i) { return i + 1 == gate; }, 1);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(
      Column(path, "SELECT name FROM sqlite_schema WHERE name = 'atfill_record_rows_bulk_key'"),
      std::vector<std::string>{"atfill_record_rows_bulk_key"});
  EXPECT_FALSE(Uris(path).empty());
}

TEST(SqliteBulkLoadTest, SigkillMidLoadThenAResumedLoadEndsEqualToTheTruth) {
  testing::TempDir dir;
  const std::string truth = (dir.path() / "truth.db").string();
  const std::string path = (dir.path() / "atfill.db").string();
  const auto batches = CrawlBatches(40);
  WriteAll(Options(truth, false), batches);
  KillMidLoad(path, batches);
  // The resumed job redelivers from its last checkpoint: here, everything again.
  {
    auto sink = OpenSqliteSink(Options(path, true));
    ASSERT_TRUE(sink.ok()) << sink.status().ToString();
    EXPECT_EQ(
        Column(path, "SELECT name FROM sqlite_schema WHERE name = 'atfill_record_rows_bulk_key'")
            .size(),
        1u);
    for (const auto& b : batches) ASSERT_TRUE((*sink)->Write(b).ok());
  }
  EXPECT_EQ(Uris(path), Uris(truth));
  EXPECT_EQ(Indexes(path), kFinalIndexes);
  EXPECT_EQ(Stat1(path), Stat1(truth));
  EXPECT_FALSE(std::filesystem::exists(path + "-bulkload"));
  auto check = OpenSqliteSink(Options(path, false));
  ASSERT_TRUE(check.ok()) << check.status().ToString();
}

TEST(SqliteBulkLoadTest, SigkillMidLoadThenAnOrdinaryOpenBuildsTheIndexesFirst) {
  testing::TempDir dir;
  const std::string truth = (dir.path() / "truth.db").string();
  const std::string path = (dir.path() / "atfill.db").string();
  const auto batches = CrawlBatches(40);
  WriteAll(Options(truth, false), batches);
  KillMidLoad(path, batches);
  // The killed owner's lock file is left; the kernel released its lock.
  EXPECT_TRUE(std::filesystem::exists(path + "-bulkload"));
  std::vector<std::string> said;
  SqliteSinkOptions options = Options(path, false);
  options.log = [&said](std::string_view line) { said.emplace_back(line); };
  auto sink = OpenSqliteSink(options);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  EXPECT_EQ(Indexes(path), kFinalIndexes);
  EXPECT_FALSE(std::filesystem::exists(path + "-bulkload"));
  // The open waited for the build, and said so.
  ASSERT_EQ(said.size(), 2u);
  EXPECT_TRUE(said[0].starts_with("atfill: sqlite: building the indexes of the bulk load of " +
                                  path + " (up to "))
      << said[0];
  for (const auto& b : batches) ASSERT_TRUE((*sink)->Write(b).ok());
  EXPECT_EQ(Uris(path), Uris(truth));
  EXPECT_EQ(Stat1(path), Stat1(truth));
}

// Another sink opening the file while the loading sink lives (another job, in this process or
// another) leaves the load to it: it writes into the load layout, and the loader's close builds
// the indexes. A second bulk-loading sink joins the load without owning it.
TEST(SqliteBulkLoadTest, OpensBesideALiveLoadLeaveItToItsOwner) {
  testing::TempDir dir;
  const std::string truth = (dir.path() / "truth.db").string();
  const std::string path = (dir.path() / "atfill.db").string();
  const auto batches = CrawlBatches(8);
  WriteAll(Options(truth, false), batches);
  auto loader = OpenSqliteSink(Options(path, true));
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  EXPECT_TRUE(std::filesystem::exists(path + "-bulkload"));
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE((*loader)->Write(batches[i]).ok());
  {
    auto other = OpenSqliteSink(Options(path, false));
    ASSERT_TRUE(other.ok()) << other.status().ToString();
    auto joiner = OpenSqliteSink(Options(path, true));
    ASSERT_TRUE(joiner.ok()) << joiner.status().ToString();
    ASSERT_TRUE((*other)->Write(batches[4]).ok());
    ASSERT_TRUE((*joiner)->Write(batches[5]).ok());
  }
  EXPECT_EQ(Column(path,
                   "SELECT count(*) FROM sqlite_schema WHERE name = "
                   "'atfill_record_rows_bulk_key'"),
            std::vector<std::string>{"1"});
  for (size_t i = 6; i < batches.size(); ++i) ASSERT_TRUE((*loader)->Write(batches[i]).ok());
  loader->reset();
  EXPECT_EQ(Indexes(path), kFinalIndexes);
  EXPECT_EQ(Stat1(path), Stat1(truth));
  EXPECT_EQ(Uris(path), Uris(truth));
  EXPECT_FALSE(std::filesystem::exists(path + "-bulkload"));
}

// The switch to the load layout needs the write lock; when another connection keeps it past the
// busy timeout the sink opens anyway and loads into the final layout.
TEST(SqliteBulkLoadTest, ALockedDatabaseLoadsInTheFinalLayout) {
  testing::TempDir dir;
  const std::string path = (dir.path() / "atfill.db").string();
  { ASSERT_TRUE(OpenSqliteSink(Options(path, false)).ok()); }
  sqlite3* lock = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &lock), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(lock, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  SqliteSinkOptions o = Options(path, true);
  o.busy_timeout_ms = 50;
  auto sink = OpenSqliteSink(o);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  EXPECT_EQ(Indexes(path), kFinalIndexes);
  sqlite3_exec(lock, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(lock);
  const auto batches = CrawlBatches(1);
  ASSERT_TRUE((*sink)->Write(batches[0]).ok());
  sink->reset();
  EXPECT_EQ(Indexes(path), kFinalIndexes);
  EXPECT_FALSE(Uris(path).empty());
}

// A load whose owner closes while another writer holds the database past the busy timeout keeps
// its layout, says that its indexes are not built, and the next sink to open it builds them.
TEST(SqliteBulkLoadTest, AnOwnerClosingBesideAnotherWriterSaysTheIndexesAreNotBuilt) {
  testing::TempDir dir;
  const std::string path = (dir.path() / "atfill.db").string();
  std::vector<std::string> said;
  SqliteSinkOptions o = Options(path, true);
  o.busy_timeout_ms = 50;
  o.log = [&said](std::string_view line) { said.emplace_back(line); };
  auto sink = OpenSqliteSink(o);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  ASSERT_TRUE((*sink)->Write(CrawlBatches(1)[0]).ok());
  sqlite3* lock = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &lock), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(lock, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  sink->reset();
  sqlite3_exec(lock, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(lock);
  ASSERT_EQ(said.size(), 2u);
  EXPECT_EQ(said[1], "atfill: sqlite: the indexes of " + path +
                         " are not built (another writer held the database); the next sink to "
                         "open it builds them");
  EXPECT_NE(Indexes(path), kFinalIndexes);
  ASSERT_TRUE(OpenSqliteSink(Options(path, false)).ok());
  EXPECT_EQ(Indexes(path), kFinalIndexes);
}

}  // namespace
}  // namespace atfill::sinks
