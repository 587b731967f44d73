// The SQLite sink: the Sink conformance suite, plus what only SQLite has (schema versions, the
// view, file handling, locks, the size cap, the reader).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "sinks/purge.hpp"
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
using testing::RawDb;
using testing::SinkConformanceTest;
using testing::TempDir;

class SqliteTableReader : public testing::TableReader {
 public:
  explicit SqliteTableReader(std::string path) : path_(std::move(path)) {}
  Result<std::vector<testing::TableRow>> ReadAll() override {
    ATFILL_ASSIGN_OR_RETURN(std::vector<RecordRow> rows, ReadAllRecords(path_));
    std::vector<testing::TableRow> out;
    for (RecordRow& r : rows) {
      out.push_back({std::move(r.uri), std::move(r.cid), std::move(r.rev), std::move(r.record),
                     std::move(r.created_at)});
    }
    return out;
  }
  Result<std::optional<int64_t>> IndexedAtUs(std::string_view uri) override {
    ATFILL_ASSIGN_OR_RETURN(std::optional<RecordRow> row, GetRecord(path_, uri));
    if (!row) return std::optional<int64_t>();
    return std::optional<int64_t>(row->indexed_at_us);
  }
  Result<std::optional<std::string>> IndexedAtText(std::string_view uri) override {
    ATFILL_ASSIGN_OR_RETURN(std::optional<RecordRow> row, GetRecord(path_, uri));
    if (!row) return std::optional<std::string>();
    return std::optional<std::string>(row->indexed_at);
  }

 private:
  std::string path_;
};

class SqliteLock : public testing::WriteBlocker {
 public:
  explicit SqliteLock(const std::string& path) : db_(path) {}
  Status Lock() {
    if (db_.Exec("BEGIN IMMEDIATE") != SQLITE_OK) {
      return Status::Internal(std::string("BEGIN IMMEDIATE: ") + sqlite3_errmsg(db_.get()));
    }
    return Status::OK();
  }
  ~SqliteLock() override { db_.Exec("ROLLBACK"); }

 private:
  RawDb db_;
};

class SqliteEnv : public testing::SinkTestEnv {
 public:
  SqliteEnv(std::function<int64_t()> now_us, bool background_checkpoint, bool bulk_load,
            size_t dictionary_samples)
      : path_((dir_.path() / "atfill.db").string()), reader_(path_) {
    options_.path = path_;
    options_.now_us = std::move(now_us);
    options_.busy_timeout_ms = 100;
    options_.background_checkpoint = background_checkpoint;
    options_.bulk_load = bulk_load;
    options_.dictionary_samples = dictionary_samples;
    // The suite's plain parameters run the default (text bodies), the *Compressed ones compress.
    options_.compress = dictionary_samples != 1000;
  }
  Result<std::unique_ptr<pipeline::Sink>> OpenSink() override { return OpenSqliteSink(options_); }
  testing::TableReader& reader() override { return reader_; }
  Result<std::unique_ptr<testing::WriteBlocker>> BlockWrites() override {
    auto lock = std::make_unique<SqliteLock>(path_);
    ATFILL_RETURN_IF_ERROR(lock->Lock());
    return std::unique_ptr<testing::WriteBlocker>(std::move(lock));
  }
  Result<std::unique_ptr<pipeline::Sink>> OpenSinkWith(const testing::SinkTweaks& t) override {
    SqliteSinkOptions options = options_;
    if (t.intern_cache_entries != 0) options.intern_cache_entries = t.intern_cache_entries;
    if (t.default_lock_timeout) options.busy_timeout_ms = SqliteSinkOptions().busy_timeout_ms;
    return OpenSqliteSink(options);
  }
  Result<std::unique_ptr<testing::RecordLookup>> OpenReader() override {
    return testing::LookupOf(SqliteReader::Open(path_));
  }
  Result<uint64_t> PurgeCollection(const std::string& collection) override {
    return SqlitePurgeCollection(path_, collection);
  }
  Status Exec(const std::string& sql) override {
    RawDb db(path_);
    if (db.Exec(sql) != SQLITE_OK) {
      return Status::Internal(sql + ": " + sqlite3_errmsg(db.get()));
    }
    return Status::OK();
  }
  Result<std::vector<std::string>> Column(const std::string& sql) override {
    return RawDb(path_).Column(sql);
  }

 private:
  TempDir dir_;
  std::string path_;
  SqliteSinkOptions options_;
  SqliteTableReader reader_;
};

// The writer checkpoints on a thread of the sink's own (the default), or inside its COMMIT; a
// bulk-loading sink (a fresh backfill's) writes in the load layout and builds the final indexes
// when it closes. With the default 1,000 samples the suite's collections rarely get a
// dictionary; SqliteCompressed and SqliteBulkLoadCompressed turn compression on and train one
// after a collection's 8th body, so the rows of the suite's larger collections are compressed.
testing::SinkConformanceParam SqliteParam(std::string name, bool background_checkpoint,
                                          bool bulk_load, size_t dictionary_samples = 1000) {
  return {std::move(name),
          [background_checkpoint, bulk_load, dictionary_samples](
              std::function<int64_t()> now_us) -> Result<std::unique_ptr<testing::SinkTestEnv>> {
            return std::unique_ptr<testing::SinkTestEnv>(std::make_unique<SqliteEnv>(
                std::move(now_us), background_checkpoint, bulk_load, dictionary_samples));
          }};
}

INSTANTIATE_TEST_SUITE_P(Sqlite, SinkConformanceTest,
                         ::testing::Values(SqliteParam("Sqlite", true, false),
                                           SqliteParam("SqliteInlineCheckpoint", false, false),
                                           SqliteParam("SqliteBulkLoad", true, true),
                                           SqliteParam("SqliteCompressed", true, false, 8),
                                           SqliteParam("SqliteBulkLoadCompressed", true, true, 8)),
                         testing::SinkConformanceName);

constexpr const char* kAlice = "did:plc:alice2ixhq5mvvcy4ygqtfp";
constexpr const char* kPost = "app.bsky.feed.post";
constexpr const char* kRev1 = "3kaaaaaaaaa2a";
constexpr const char* kRev2 = "3kbbbbbbbbb2a";
const std::string kBody = R"({"$type":"app.bsky.feed.post","text":"hello"})";

class SqliteSinkTest : public ::testing::Test {
 protected:
  SqliteSinkTest() {
    options_.path = Path();
    options_.now_us = [this] { return now_us_; };
  }
  std::string Path() const { return (dir_.path() / "atfill.db").string(); }
  std::unique_ptr<pipeline::Sink> MustOpen() {
    auto sink = OpenSqliteSink(options_);
    EXPECT_TRUE(sink.ok()) << sink.status().ToString();
    return sink.ok() ? std::move(sink).value() : nullptr;
  }
  std::vector<RecordRow> MustReadAll() {
    auto rows = ReadAllRecords(Path());
    EXPECT_TRUE(rows.ok()) << rows.status().ToString();
    return rows.ok() ? *rows : std::vector<RecordRow>{};
  }

  TempDir dir_;
  int64_t now_us_ = 1'796'029'200'123'456;  // 2026-11-30T09:00:00.123456Z
  SqliteSinkOptions options_;
};

TEST_F(SqliteSinkTest, CreatesTheSchemaInAnEmptyFile) {
  std::vector<std::string> said;
  options_.log = [&said](std::string_view line) { said.emplace_back(line); };
  ASSERT_NE(MustOpen(), nullptr);
  EXPECT_TRUE(said.empty());  // creating the tables is no upgrade
  RawDb db(Path());
  EXPECT_EQ(db.Column("SELECT version FROM atfill_schema_version"),
            std::vector<std::string>{std::to_string(kSqliteSchemaVersion)});
  EXPECT_EQ(db.Column("SELECT name FROM sqlite_schema WHERE type IN ('table', 'view') "
                      "ORDER BY name"),
            (std::vector<std::string>{"atfill_collections", "atfill_dicts", "atfill_dids",
                                      "atfill_lexicons", "atfill_record_rows", "atfill_records",
                                      "atfill_schema_version",
                                      // SQLite's own: the planner's statistics (the schema's
                                      // hints for the record table's indexes)
                                      "sqlite_stat1"}));
  EXPECT_EQ(db.Column("PRAGMA journal_mode"), std::vector<std::string>{"wal"});
}

TEST_F(SqliteSinkTest, ViewHasTheDocumentedColumnsAndFormats) {
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  ASSERT_TRUE(
      sink->Write(std::vector<Event>{
                      MakeCreate(kAlice, kPost, "3kp1", kBody, kRev1, "2024-05-06T07:08:09.010Z"),
                      MakeCreate(kAlice, kPost, "3kp2", kBody),
                  })
          .ok());
  RawDb db(Path());
  EXPECT_EQ(db.Column("SELECT name FROM pragma_table_info('atfill_records') ORDER BY cid"),
            (std::vector<std::string>{"uri", "did", "collection", "rkey", "record", "cid", "rev",
                                      "indexed_at", "created_at"}));
  const std::string where = " FROM atfill_records WHERE rkey = '3kp1'";
  EXPECT_EQ(
      db.Column("SELECT uri" + where),
      std::vector<std::string>{"at://did:plc:alice2ixhq5mvvcy4ygqtfp/app.bsky.feed.post/3kp1"});
  EXPECT_EQ(db.Column("SELECT did || ' ' || collection || ' ' || rkey" + where),
            std::vector<std::string>{std::string(kAlice) + " " + kPost + " 3kp1"});
  EXPECT_EQ(db.Column("SELECT record" + where), std::vector<std::string>{kBody});
  EXPECT_EQ(db.Column("SELECT cid" + where), std::vector<std::string>{testing::CidOf(kBody)});
  EXPECT_EQ(db.Column("SELECT rev" + where), std::vector<std::string>{kRev1});
  EXPECT_EQ(db.Column("SELECT indexed_at" + where),
            std::vector<std::string>{"2026-11-30T09:00:00.123456Z"});
  EXPECT_EQ(db.Column("SELECT created_at" + where),
            std::vector<std::string>{"2024-05-06T07:08:09.010Z"});
  // Raw SQL can use SQLite's JSON functions on the record.
  EXPECT_EQ(db.Column("SELECT json_extract(record, '$.text')" + where),
            std::vector<std::string>{"hello"});
  // No rev and no createdAt are NULL, not empty strings.
  EXPECT_EQ(db.Column("SELECT typeof(rev) || ' ' || typeof(created_at) FROM atfill_records "
                      "WHERE rkey = '3kp2'"),
            std::vector<std::string>{"null null"});
}

TEST_F(SqliteSinkTest, HoldsRecordsLooksUpAnAccountsCollection) {
  auto holds = SqliteHoldsRecords(Path());
  auto before = holds(kAlice, kPost);  // no database yet
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_FALSE(*before);
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  ASSERT_TRUE(sink->Write(std::vector<Event>{MakeCreate(kAlice, kPost, "a", kBody, kRev1)}).ok());
  for (const auto& [did, collection, want] :
       std::vector<std::tuple<std::string, std::string, bool>>{
           {kAlice, kPost, true},
           {kAlice, "app.bsky.feed.like", false},
           {"did:plc:nobody", kPost, false}}) {
    auto got = holds(did, collection);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, want) << did << " " << collection;
  }
  ASSERT_TRUE(sink->Write(std::vector<Event>{MakeDelete(kAlice, kPost, "a", kRev2)}).ok());
  auto after = holds(kAlice, kPost);
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(*after);
}

// A sink opened on a table that already holds accounts starts with their interned ids in memory
// (up to its cache's size, the newest first): each row keeps its own account and collection,
// for accounts the cache was warmed with, for those it had no room for, and for new ones.
TEST_F(SqliteSinkTest, AReopenedSinkFilesEveryRowUnderItsOwnAccount) {
  const std::vector<std::string> dids = {"did:plc:aaaaaaaaaaaaaaaaaaaaaaaa",
                                         "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb",
                                         "did:plc:cccccccccccccccccccccccc"};
  const std::vector<std::string> nsids = {kPost, "app.bsky.feed.like", "app.bsky.graph.follow"};
  {
    auto sink = MustOpen();
    ASSERT_NE(sink, nullptr);
    std::vector<Event> batch;
    for (size_t i = 0; i < dids.size(); ++i) {
      batch.push_back(MakeCreate(dids[i], nsids[i], "first", kBody, kRev1));
    }
    ASSERT_TRUE(sink->Write(batch).ok());
  }
  for (size_t entries : {size_t{1} << 20, size_t{2}}) {
    options_.intern_cache_entries = entries;
    // The warm-up is ready before the batch, so the batch runs on the warmed caches.
    std::promise<void> warmed;
    options_.on_warmed = [&warmed] { warmed.set_value(); };
    auto sink = MustOpen();
    ASSERT_NE(sink, nullptr);
    warmed.get_future().wait();
    std::vector<Event> batch;
    // Every account with every collection, in the order opposite to their ids, and a new one.
    for (size_t i = dids.size(); i-- > 0;) {
      for (const std::string& nsid : nsids) {
        batch.push_back(MakeCreate(dids[i], nsid, "n" + std::to_string(entries), kBody, kRev2));
      }
    }
    batch.push_back(MakeCreate(
        entries == 2 ? "did:plc:dddddddddddddddddddddddd" : "did:plc:eeeeeeeeeeeeeeeeeeeeeeee",
        kPost, "n", kBody, kRev2));
    ASSERT_TRUE(sink->Write(batch).ok());
  }
  std::set<std::string> uris;
  for (const RecordRow& row : MustReadAll()) {
    EXPECT_EQ(row.uri, "at://" + row.did + "/" + row.collection + "/" + row.rkey);
    uris.insert(row.uri);
  }
  std::set<std::string> want;
  for (size_t i = 0; i < dids.size(); ++i) {
    want.insert("at://" + dids[i] + "/" + nsids[i] + "/first");
    for (const std::string& nsid : nsids) {
      for (const char* rkey : {"n1048576", "n2"})
        want.insert("at://" + dids[i] + "/" + nsid + "/" + rkey);
    }
  }
  want.insert("at://did:plc:dddddddddddddddddddddddd/app.bsky.feed.post/n");
  want.insert("at://did:plc:eeeeeeeeeeeeeeeeeeeeeeee/app.bsky.feed.post/n");
  EXPECT_EQ(uris, want);
}

// A database written by atfill at schema version 1 opens, migrates to the current version and
// keeps every row (ids included), a user's own index and view over the table, and its key.
TEST_F(SqliteSinkTest, MigratesAVersion1DatabaseKeepingItsRows) {
  const std::string bob = "did:plc:bob22ixhq5mvvcy4ygqtfpz";
  {
    RawDb db(Path());
    ASSERT_EQ(db.Exec("PRAGMA journal_mode = WAL"), SQLITE_OK);
    ASSERT_EQ(db.Exec(testing::FrozenSchemaV1()), SQLITE_OK) << sqlite3_errmsg(db.get());
    ASSERT_EQ(db.Exec("INSERT INTO atfill_dids(id, did) VALUES (1, '" + std::string(kAlice) +
                      "'), (7, '" + bob + "')"),
              SQLITE_OK);
    ASSERT_EQ(db.Exec("INSERT INTO atfill_collections(id, nsid) VALUES (3, '" + std::string(kPost) +
                      "')"),
              SQLITE_OK);
    ASSERT_EQ(db.Exec("INSERT INTO atfill_record_rows(id, did_id, collection_id, rkey, cid, rev, "
                      "indexed_at, created_at, record) VALUES "
                      "(5, 1, 3, 'a', '" +
                      testing::CidOf(kBody) + "', '" + kRev1 +
                      "', 1796029200123456, '2024-05-06T07:08:09.010Z', '" + kBody +
                      "'), "
                      "(9, 7, 3, 'b', '" +
                      testing::CidOf(kBody) +
                      "', NULL, 1796029200000001, "
                      "NULL, '" +
                      kBody + "')"),
              SQLITE_OK)
        << sqlite3_errmsg(db.get());
    ASSERT_EQ(db.Exec("CREATE INDEX user_by_cid ON atfill_record_rows(cid); CREATE VIEW "
                      "user_posts AS SELECT uri FROM atfill_records WHERE collection = '" +
                      std::string(kPost) + "'"),
              SQLITE_OK);
  }
  const std::string all_rows =
      "SELECT id || ' ' || did_id || ' ' || collection_id || ' ' || rkey || ' ' || cid || ' ' || "
      "ifnull(rev, 'NULL') || ' ' || indexed_at || ' ' || ifnull(created_at, 'NULL') || ' ' || "
      "record FROM atfill_record_rows ORDER BY id";
  const std::string all_view =
      "SELECT uri || ' ' || did || ' ' || collection || ' ' || rkey || ' ' || cid || ' ' || "
      "ifnull(rev, 'NULL') || ' ' || indexed_at || ' ' || ifnull(created_at, 'NULL') || ' ' || "
      "record FROM atfill_records ORDER BY uri";
  const std::vector<std::string> before = RawDb(Path()).Column(all_rows);
  const std::vector<std::string> view_before = RawDb(Path()).Column(all_view);
  ASSERT_EQ(before.size(), 2u);

  // The upgrade is said before it runs (a large table's takes minutes) and when it ended.
  std::vector<std::string> said;
  options_.log = [&said](std::string_view line) { said.emplace_back(line); };
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  ASSERT_EQ(said.size(), 2u);
  EXPECT_EQ(said[0], "atfill: sqlite: upgrading " + Path() + " from schema version 1 to " +
                         std::to_string(kSqliteSchemaVersion) +
                         " (up to 9 record rows), in one transaction");
  EXPECT_TRUE(said[1].starts_with("atfill: sqlite: upgraded " + Path() + " to schema version " +
                                  std::to_string(kSqliteSchemaVersion) + " in "))
      << said[1];
  {
    RawDb db(Path());
    EXPECT_EQ(db.Column("SELECT version FROM atfill_schema_version"),
              std::vector<std::string>{std::to_string(kSqliteSchemaVersion)});
    EXPECT_EQ(db.Column(all_rows), before);
    EXPECT_EQ(
        db.Column("SELECT name FROM sqlite_schema WHERE tbl_name = 'atfill_record_rows' "
                  "AND type = 'index' ORDER BY name"),
        (std::vector<std::string>{"atfill_record_rows_by_created", "atfill_record_rows_by_did",
                                  "atfill_record_rows_key", "user_by_cid"}));
    EXPECT_EQ(db.Column("SELECT count(*) FROM user_posts"), std::vector<std::string>{"2"});
  }
  EXPECT_EQ(RawDb(Path()).Column(all_view), view_before);
  EXPECT_EQ(MustReadAll().size(), 2u);
  // The key still holds: the same record again is unchanged, a new key is inserted with the next
  // id, and a purge finds the account's rows.
  auto stats = sink->Write(std::vector<Event>{MakeCreate(kAlice, kPost, "a", kBody, kRev1),
                                              MakeCreate(kAlice, kPost, "c", kBody, kRev2)});
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->unchanged, 1u);
  EXPECT_EQ(stats->inserted, 1u);
  EXPECT_EQ(RawDb(Path()).Column("SELECT max(id) FROM atfill_record_rows"),
            std::vector<std::string>{"10"});
  stats = sink->Write(std::vector<Event>{MakeAccount(bob, AccountStatus::kDeleted)});
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->purged_records, 1u);
  EXPECT_EQ(MustReadAll().size(), 2u);
  sink.reset();
  // Opening again migrates nothing more, and says nothing.
  said.clear();
  ASSERT_NE(MustOpen(), nullptr);
  EXPECT_TRUE(said.empty());
  EXPECT_EQ(RawDb(Path()).Column(
                "SELECT count(*) FROM sqlite_schema WHERE tbl_name = 'atfill_record_rows'"),
            std::vector<std::string>{"5"});
}

// The queries users run (docs/queries.md) use an index: no full scan of the record table and no
// sort of its rows.
TEST_F(SqliteSinkTest, UserQueriesUseIndexes) {
  ASSERT_NE(MustOpen(), nullptr);
  RawDb db(Path());
  for (const std::string query : {
           "SELECT uri, record FROM atfill_records WHERE collection = 'c' ORDER BY created_at "
           "DESC LIMIT 20",
           "SELECT uri, record FROM atfill_records WHERE did = 'd' LIMIT 20",
           "SELECT uri, record FROM atfill_records WHERE did = 'd' AND collection = 'c' LIMIT 20",
           "SELECT uri, record FROM atfill_records WHERE did = 'd' AND collection = 'c' AND "
           "rkey = 'k'",
       }) {
    const std::vector<std::string> plan = db.Column("EXPLAIN QUERY PLAN " + query, 3);
    ASSERT_FALSE(plan.empty()) << query;
    for (const std::string& step : plan) {
      EXPECT_EQ(step.find("SCAN"), std::string::npos) << query << ": " << step;
      EXPECT_EQ(step.find("TEMP B-TREE"), std::string::npos) << query << ": " << step;
    }
    // A lookup by URI binds the whole key: a record key such as "self" is shared by every
    // account's profile.
    if (query.find("rkey") != std::string::npos) {
      EXPECT_NE(plan.back().find("collection_id=? AND rkey=? AND did_id=?"), std::string::npos)
          << query << ": " << plan.back();
    }
  }
}

TEST_F(SqliteSinkTest, SharesTheFileWithUserTables) {
  {
    RawDb db(Path());
    ASSERT_EQ(db.Exec("CREATE TABLE posts(x); INSERT INTO posts VALUES (42); "
                      "PRAGMA user_version = 7"),
              SQLITE_OK);
  }
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  ASSERT_TRUE(sink->Write(std::vector<Event>{MakeCreate(kAlice, kPost, "a", kBody)}).ok());
  RawDb db(Path());
  EXPECT_EQ(db.Column("SELECT x FROM posts"), std::vector<std::string>{"42"});
  EXPECT_EQ(db.Column("PRAGMA user_version"), std::vector<std::string>{"7"});
  EXPECT_EQ(MustReadAll().size(), 1u);
}

TEST_F(SqliteSinkTest, RejectsFilesThatAreNotDatabases) {
  {
    std::ofstream out(Path());
    out << "this is not a database, just some text that is long enough to have a header........"
           "................................................................................";
  }
  auto sink = OpenSqliteSink(options_);
  ASSERT_FALSE(sink.ok());
  EXPECT_EQ(sink.status().code(), StatusCode::kCorrupt) << sink.status().ToString();
  EXPECT_NE(sink.status().message().find(Path()), std::string::npos) << sink.status().ToString();
}

TEST_F(SqliteSinkTest, MissingFolderIsAnIoError) {
  options_.path = (dir_.path() / "no" / "such" / "dir" / "atfill.db").string();
  auto sink = OpenSqliteSink(options_);
  ASSERT_FALSE(sink.ok());
  EXPECT_EQ(sink.status().code(), StatusCode::kIoError) << sink.status().ToString();
  EXPECT_NE(sink.status().message().find(options_.path), std::string::npos);
}

TEST_F(SqliteSinkTest, BusyDatabaseIsUnavailableAfterBoundedRetry) {
  for (int64_t timeout_ms : {0, 30}) {
    SCOPED_TRACE(timeout_ms);
    options_.busy_timeout_ms = timeout_ms;
    auto sink = MustOpen();
    ASSERT_NE(sink, nullptr);
    RawDb holder(Path());
    ASSERT_EQ(holder.Exec("BEGIN IMMEDIATE"), SQLITE_OK);
    auto stats = sink->Write(std::vector<Event>{MakeCreate(kAlice, kPost, "a", kBody)});
    ASSERT_FALSE(stats.ok());
    EXPECT_EQ(stats.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(stats.status().message().find("locked"), std::string::npos)
        << stats.status().ToString();
    ASSERT_EQ(holder.Exec("ROLLBACK"), SQLITE_OK);
    EXPECT_TRUE(MustReadAll().empty());
    EXPECT_TRUE(sink->Write(std::vector<Event>{MakeCreate(kAlice, kPost, "a", kBody)}).ok());
    EXPECT_EQ(MustReadAll().size(), 1u);
    ASSERT_EQ(holder.Exec("DELETE FROM atfill_record_rows"), SQLITE_OK);
  }
}

TEST_F(SqliteSinkTest, FullDatabaseIsUnavailableAndRollsBack) {
  {
    auto sink = MustOpen();
    ASSERT_NE(sink, nullptr);
    ASSERT_TRUE(sink->Write(std::vector<Event>{MakeCreate(kAlice, kPost, "keep", kBody)}).ok());
  }
  const uint64_t size = std::filesystem::file_size(Path());
  options_.max_database_bytes = size + 64 * 1024;
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  // ~1 MB of records cannot fit in 64 KiB more.
  std::vector<Event> big;
  for (int i = 0; i < 1000; ++i) {
    big.push_back(MakeCreate("did:plc:many" + std::to_string(i % 7), kPost, "r" + std::to_string(i),
                             R"({"text":")" + std::string(1000, 'x') + std::to_string(i) + "\"}"));
  }
  auto stats = sink->Write(big);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), StatusCode::kUnavailable) << stats.status().ToString();
  EXPECT_NE(stats.status().message().find("full"), std::string::npos) << stats.status().ToString();
  std::vector<RecordRow> rows = MustReadAll();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].rkey, "keep");
  // The sink stays usable for what fits, and ids interned by the failed batch are not reused.
  auto small = sink->Write(std::vector<Event>{MakeCreate("did:plc:many3", kPost, "small", kBody)});
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  rows = MustReadAll();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].did, "did:plc:many3");
  EXPECT_EQ(rows[1].rkey, "small");
  // Without the cap the same batch fits.
  options_.max_database_bytes = 0;
  sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  auto again = sink->Write(big);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->inserted, 1000u);
}

TEST_F(SqliteSinkTest, PageSizeAppliesToNewDatabasesOnly) {
  options_.page_size_bytes = 4096;
  ASSERT_NE(MustOpen(), nullptr);
  {
    RawDb db(Path());
    EXPECT_EQ(db.Column("PRAGMA page_size"), std::vector<std::string>{"4096"});
  }
  options_.page_size_bytes = 32768;
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  ASSERT_TRUE(sink->Write(std::vector<Event>{MakeCreate(kAlice, kPost, "a", kBody)}).ok());
  RawDb db(Path());
  EXPECT_EQ(db.Column("PRAGMA page_size"), std::vector<std::string>{"4096"});
  EXPECT_EQ(MustReadAll().size(), 1u);

  SqliteSinkOptions fresh;
  fresh.path = (dir_.path() / "default.db").string();
  ASSERT_TRUE(OpenSqliteSink(fresh).ok());
  RawDb other(fresh.path);
  EXPECT_EQ(other.Column("PRAGMA page_size"),
            std::vector<std::string>{std::to_string(SqliteSinkOptions().page_size_bytes)});
}

TEST_F(SqliteSinkTest, FullSynchronousModeWrites) {
  options_.synchronous = SqliteSynchronous::kFull;
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  ASSERT_TRUE(sink->Write(std::vector<Event>{MakeCreate(kAlice, kPost, "a", kBody)}).ok());
  EXPECT_EQ(MustReadAll().size(), 1u);
}

TEST_F(SqliteSinkTest, OptionsAreValidated) {
  struct Case {
    const char* field;
    std::function<void(SqliteSinkOptions*)> mutate;
  };
  std::vector<Case> cases = {
      {"path", [](SqliteSinkOptions* o) { o->path.clear(); }},
      {"path", [](SqliteSinkOptions* o) { o->path = ":memory:"; }},
      {"busy_timeout_ms", [](SqliteSinkOptions* o) { o->busy_timeout_ms = -1; }},
      {"busy_timeout_ms", [](SqliteSinkOptions* o) { o->busy_timeout_ms = 1LL << 40; }},
      {"cache_bytes", [](SqliteSinkOptions* o) { o->cache_bytes = 0; }},
      {"wal_autocheckpoint_bytes", [](SqliteSinkOptions* o) { o->wal_autocheckpoint_bytes = 0; }},
      {"page_size_bytes", [](SqliteSinkOptions* o) { o->page_size_bytes = 1000; }},
      {"page_size_bytes", [](SqliteSinkOptions* o) { o->page_size_bytes = 256; }},
      {"page_size_bytes", [](SqliteSinkOptions* o) { o->page_size_bytes = 131072; }},
      {"intern_cache_entries", [](SqliteSinkOptions* o) { o->intern_cache_entries = 0; }},
  };
  EXPECT_TRUE(options_.Validate().ok());
  for (const Case& c : cases) {
    SqliteSinkOptions o = options_;
    c.mutate(&o);
    Status st = o.Validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalid) << c.field;
    EXPECT_NE(st.message().find(c.field), std::string::npos) << st.ToString();
    auto sink = OpenSqliteSink(o);
    EXPECT_FALSE(sink.ok()) << c.field;
  }
  EXPECT_FALSE(std::filesystem::exists(Path()));
}

TEST_F(SqliteSinkTest, ReaderLookupUsesTheKeyIndex) {
  ASSERT_NE(MustOpen(), nullptr);
  const std::vector<std::string> plan = RawDb(Path()).Column(
      "EXPLAIN QUERY PLAN SELECT * FROM atfill_records WHERE did = 'a' AND collection = 'b' AND "
      "rkey = 'c'",
      3);
  ASSERT_FALSE(plan.empty());
  for (const std::string& step : plan) {
    EXPECT_EQ(step.find("SCAN"), std::string::npos) << step;
  }
}

// `verify`'s listing of the accounts reads the account index once through. A probe per account
// would be a skip scan over every block of the index (it leads with the block), whose cost is the
// accounts times the blocks: more than the table's rows once accounts outnumber a block's rows.
TEST_F(SqliteSinkTest, ReaderListsTheAccountsInOnePass) {
  ASSERT_NE(MustOpen(), nullptr);
  const std::vector<std::string> plan =
      RawDb(Path()).Column("EXPLAIN QUERY PLAN " + std::string(SqliteReader::DidsSql()), 3);
  ASSERT_FALSE(plan.empty());
  bool one_pass = false;
  for (const std::string& step : plan) {
    EXPECT_EQ(step.find("CORRELATED"), std::string::npos) << step;
    EXPECT_EQ(step.find("did_epoch"), std::string::npos) << step;
    if (step == "SCAN atfill_record_rows USING COVERING INDEX atfill_record_rows_by_did") {
      one_pass = true;
    }
  }
  EXPECT_TRUE(one_pass);
}

TEST_F(SqliteSinkTest, ReaderRefusesWhatIsNotAnAtfillDatabase) {
  auto missing = SqliteReader::Open(Path());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  {
    RawDb db(Path());
    ASSERT_EQ(db.Exec("CREATE TABLE other(x)"), SQLITE_OK);
  }
  auto empty = SqliteReader::Open(Path());
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kNotFound);
  EXPECT_NE(empty.status().message().find("no atfill tables"), std::string::npos)
      << empty.status().ToString();
  auto all = ReadAllRecords(Path());
  EXPECT_FALSE(all.ok());
}

// A batch of `n` creates of ~1 KB for one account, rkeys `prefix`0..n-1.
std::vector<Event> KilobyteBatch(const std::string& prefix, int n) {
  std::vector<Event> batch;
  for (int i = 0; i < n; ++i) {
    batch.push_back(MakeCreate(kAlice, kPost, prefix + std::to_string(i),
                               R"({"text":")" + std::string(1000, 'x') + "\"}"));
  }
  return batch;
}

uint64_t FileSize(const std::string& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  return ec ? 0 : size;
}

// However the checkpoints run, the WAL stays within its cap plus about a batch, and the records
// reach the database file while the sink is open.
TEST_F(SqliteSinkTest, CheckpointsKeepTheWalWithinItsCap) {
  for (bool background : {true, false}) {
    SCOPED_TRACE(background ? "background" : "inline");
    std::filesystem::remove(Path());
    std::filesystem::remove(Path() + "-wal");
    std::filesystem::remove(Path() + "-shm");
    options_.background_checkpoint = background;
    options_.wal_autocheckpoint_bytes = 256 << 10;
    // Text bodies, so that the 4 MB written stays 4 MB on disk.
    options_.compress = false;
    auto sink = MustOpen();
    ASSERT_NE(sink, nullptr);
    uint64_t largest_wal = 0;
    for (int b = 0; b < 40; ++b) {
      auto stats = sink->Write(KilobyteBatch("b" + std::to_string(b) + "-", 100));
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
      ASSERT_EQ(stats->inserted, 100u);
      largest_wal = std::max(largest_wal, FileSize(Path() + "-wal"));
    }
    // 256 KiB of cap, a ~100 KB batch with its index and table pages, and the page the WAL
    // header rounds to; without checkpoints it would hold all 4 MB.
    EXPECT_LE(largest_wal, uint64_t{1} << 20);
    EXPECT_GE(FileSize(Path()), uint64_t{3} << 20);
    sink.reset();
    EXPECT_EQ(MustReadAll().size(), 4000u);
  }
}

// A reader holding an old snapshot keeps the WAL from being copied and started again; the writer
// goes on all the same (the WAL grows), and once the reader is done the WAL is reused again.
TEST_F(SqliteSinkTest, ReaderHoldingTheWalDoesNotStopTheWriter) {
  options_.wal_autocheckpoint_bytes = 256 << 10;
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  ASSERT_TRUE(sink->Write(KilobyteBatch("first", 10)).ok());
  RawDb reader(Path());
  ASSERT_EQ(reader.Exec("BEGIN"), SQLITE_OK);
  ASSERT_EQ(reader.Column("SELECT count(*) FROM atfill_record_rows"),
            std::vector<std::string>{"10"});
  for (int b = 0; b < 30; ++b) {
    auto stats = sink->Write(KilobyteBatch("held" + std::to_string(b) + "-", 100));
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  }
  // The reader still sees its snapshot, so nothing after it could be copied.
  EXPECT_EQ(reader.Column("SELECT count(*) FROM atfill_record_rows"),
            std::vector<std::string>{"10"});
  const uint64_t held_wal = FileSize(Path() + "-wal");
  EXPECT_GE(held_wal, uint64_t{3} << 20);
  ASSERT_EQ(reader.Exec("COMMIT"), SQLITE_OK);
  for (int b = 0; b < 30; ++b) {
    auto stats = sink->Write(KilobyteBatch("free" + std::to_string(b) + "-", 100));
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  }
  // 3 MB more went through a WAL that started again inside the file it already had (a batch or
  // two may still be appended before the first complete checkpoint lets it start again).
  EXPECT_LE(FileSize(Path() + "-wal"), held_wal + (512 << 10));
  EXPECT_EQ(reader.Column("SELECT count(*) FROM atfill_record_rows"),
            std::vector<std::string>{"6010"});
}

}  // namespace
}  // namespace atfill::sinks
