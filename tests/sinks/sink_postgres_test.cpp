// The PostgreSQL sink: the Sink conformance suite, plus what only PostgreSQL has (the view equal to
// SQLite's, sharded writers on one database, server restarts and outages, the schema, the reader).
// Needs a server: see tests/common/pg_server.hpp (tools/test starts one).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/engine.hpp"
#include "sinks/postgres_reader.hpp"
#include "sinks/postgres_sink.hpp"
#include "sinks/purge.hpp"
#include "sinks/sqlite_reader.hpp"
#include "sinks/sqlite_sink.hpp"
#include "state/kv_store.hpp"
#include "tests/common/pg_server.hpp"
#include "tests/common/process.hpp"
#include "tests/common/sink_conformance.hpp"

namespace atfill::sinks {
namespace {

using pipeline::AccountEvent;
using pipeline::AccountStatus;
using pipeline::Event;
using pipeline::RecordEvent;
using pipeline::WriteStats;
using testing::MakeAccount;
using testing::MakeCreate;
using testing::MakeDelete;
using testing::MakeUpdate;
using testing::PgConnection;
using testing::PgDatabase;
using testing::PgServer;
using testing::SinkConformanceTest;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// The conformance suite.

class PgTableReader : public testing::TableReader {
 public:
  explicit PgTableReader(std::string conninfo) : conninfo_(std::move(conninfo)) {}
  Result<std::vector<testing::TableRow>> ReadAll() override {
    ATFILL_RETURN_IF_ERROR(EnsureOpen());
    ATFILL_ASSIGN_OR_RETURN(std::vector<RecordRow> rows, reader_->ReadAll());
    std::vector<testing::TableRow> out;
    for (RecordRow& r : rows) {
      out.push_back({std::move(r.uri), std::move(r.cid), std::move(r.rev), std::move(r.record),
                     std::move(r.created_at)});
    }
    return out;
  }
  Result<std::optional<int64_t>> IndexedAtUs(std::string_view uri) override {
    ATFILL_RETURN_IF_ERROR(EnsureOpen());
    ATFILL_ASSIGN_OR_RETURN(std::optional<RecordRow> row, reader_->Get(uri));
    if (!row) return std::optional<int64_t>();
    return std::optional<int64_t>(row->indexed_at_us);
  }
  Result<std::optional<std::string>> IndexedAtText(std::string_view uri) override {
    ATFILL_RETURN_IF_ERROR(EnsureOpen());
    ATFILL_ASSIGN_OR_RETURN(std::optional<RecordRow> row, reader_->Get(uri));
    if (!row) return std::optional<std::string>();
    return std::optional<std::string>(row->indexed_at);
  }

 private:
  // The tables exist once the env's first sink opened.
  Status EnsureOpen() {
    if (reader_ != nullptr) return Status::OK();
    ATFILL_ASSIGN_OR_RETURN(reader_, PostgresReader::Open(conninfo_));
    return Status::OK();
  }
  std::string conninfo_;
  std::unique_ptr<PostgresReader> reader_;
};

// Another connection holding the record table's strongest lock in an open transaction.
class PgLock : public testing::WriteBlocker {
 public:
  static Result<std::unique_ptr<testing::WriteBlocker>> Take(const std::string& conninfo) {
    ATFILL_ASSIGN_OR_RETURN(auto conn, PgConnection::Open(conninfo));
    ATFILL_RETURN_IF_ERROR(
        conn->Exec("BEGIN; LOCK TABLE public.atfill_record_rows IN ACCESS EXCLUSIVE MODE"));
    return std::unique_ptr<testing::WriteBlocker>(new PgLock(std::move(conn)));
  }
  ~PgLock() override { (void)conn_->Exec("ROLLBACK"); }

 private:
  explicit PgLock(std::unique_ptr<PgConnection> conn) : conn_(std::move(conn)) {}
  std::unique_ptr<PgConnection> conn_;
};

class PgEnv : public testing::SinkTestEnv {
 public:
  PgEnv(std::unique_ptr<PgDatabase> db, std::function<int64_t()> now_us)
      : db_(std::move(db)), reader_(db_->conninfo()) {
    options_.conninfo = db_->conninfo();
    options_.now_us = std::move(now_us);
    options_.lock_timeout_ms = 100;
    options_.connect_timeout_ms = 2000;
  }
  Result<std::unique_ptr<pipeline::Sink>> OpenSink() override { return OpenPostgresSink(options_); }
  testing::TableReader& reader() override { return reader_; }
  Result<std::unique_ptr<testing::WriteBlocker>> BlockWrites() override {
    return PgLock::Take(db_->conninfo());
  }
  Result<std::unique_ptr<pipeline::Sink>> OpenSinkWith(const testing::SinkTweaks& t) override {
    PostgresSinkOptions options = options_;
    if (t.intern_cache_entries != 0) options.intern_cache_entries = t.intern_cache_entries;
    if (t.default_lock_timeout) options.lock_timeout_ms = PostgresSinkOptions().lock_timeout_ms;
    return OpenPostgresSink(options);
  }
  Result<std::unique_ptr<testing::RecordLookup>> OpenReader() override {
    return testing::LookupOf(PostgresReader::Open(db_->conninfo()));
  }
  Result<uint64_t> PurgeCollection(const std::string& collection) override {
    PostgresReaderOptions o;
    o.conninfo = db_->conninfo();
    o.schema = options_.schema;
    return PostgresPurgeCollection(o, collection);
  }
  Status Exec(const std::string& sql) override {
    ATFILL_ASSIGN_OR_RETURN(auto conn, PgConnection::Open(db_->conninfo()));
    return conn->Exec(sql);
  }
  Result<std::vector<std::string>> Column(const std::string& sql) override {
    ATFILL_ASSIGN_OR_RETURN(auto conn, PgConnection::Open(db_->conninfo()));
    return conn->Column(sql);
  }

 private:
  std::unique_ptr<PgDatabase> db_;
  PostgresSinkOptions options_;
  PgTableReader reader_;
};

testing::SinkConformanceParam PostgresParam() {
  return {"Postgres",
          [](std::function<int64_t()> now_us) -> Result<std::unique_ptr<testing::SinkTestEnv>> {
            ATFILL_ASSIGN_OR_RETURN(auto db, PgDatabase::CreateOnTestServer());
            return std::unique_ptr<testing::SinkTestEnv>(
                std::make_unique<PgEnv>(std::move(db), std::move(now_us)));
          }};
}

INSTANTIATE_TEST_SUITE_P(Postgres, SinkConformanceTest, ::testing::Values(PostgresParam()),
                         testing::SinkConformanceName);

// ---------------------------------------------------------------------------------------------
// PostgreSQL only.

constexpr const char* kAlice = "did:plc:alice2ixhq5mvvcy4ygqtfp";
constexpr const char* kBob = "did:plc:bob7x3ohbx4kdyhrlqwv2mtq";
constexpr const char* kPost = "app.bsky.feed.post";
constexpr const char* kLike = "app.bsky.feed.like";
constexpr const char* kRev1 = "3kaaaaaaaaa2a";
constexpr const char* kRev2 = "3kbbbbbbbbb2a";
const std::string kBody = R"({"$type":"app.bsky.feed.post","text":"hello"})";

std::string Uri(std::string_view did, std::string_view collection, std::string_view rkey) {
  return "at://" + std::string(did) + "/" + std::string(collection) + "/" + std::string(rkey);
}

// Every counter, so that any difference shows.
std::string StatsText(const WriteStats& s) {
  return "inserted=" + std::to_string(s.inserted) + " updated=" + std::to_string(s.updated) +
         " unchanged=" + std::to_string(s.unchanged) + " stale=" + std::to_string(s.stale) +
         " deleted=" + std::to_string(s.deleted) +
         " purged_accounts=" + std::to_string(s.purged_accounts) +
         " purged_records=" + std::to_string(s.purged_records) +
         " resyncs=" + std::to_string(s.resyncs) +
         " resynced_records=" + std::to_string(s.resynced_records);
}

class PostgresSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto db = PgDatabase::CreateOnTestServer();
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    db_ = std::move(*db);
    options_.conninfo = db_->conninfo();
    options_.now_us = [this] { return now_us_.load(); };
    options_.lock_timeout_ms = 1000;
  }
  std::unique_ptr<pipeline::Sink> MustOpen() {
    auto sink = OpenPostgresSink(options_);
    EXPECT_TRUE(sink.ok()) << sink.status().ToString();
    return sink.ok() ? std::move(sink).value() : nullptr;
  }
  std::unique_ptr<PgConnection> MustConnect() {
    auto conn = PgConnection::Open(db_->conninfo());
    EXPECT_TRUE(conn.ok()) << conn.status().ToString();
    return conn.ok() ? std::move(conn).value() : nullptr;
  }
  std::vector<std::string> Column(const std::string& sql) {
    auto conn = MustConnect();
    if (conn == nullptr) return {};
    auto col = conn->Column(sql);
    EXPECT_TRUE(col.ok()) << col.status().ToString();
    return col.ok() ? *col : std::vector<std::string>{};
  }
  std::vector<RecordRow> MustReadAll() {
    auto reader = PostgresReader::Open(db_->conninfo());
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    if (!reader.ok()) return {};
    auto rows = (*reader)->ReadAll();
    EXPECT_TRUE(rows.ok()) << rows.status().ToString();
    return rows.ok() ? *rows : std::vector<RecordRow>{};
  }

  std::unique_ptr<PgDatabase> db_;
  std::atomic<int64_t> now_us_{1'796'029'200'123'456};  // 2026-11-30T09:00:00.123456Z
  PostgresSinkOptions options_;
};

TEST_F(PostgresSinkTest, CreatesTheSchemaAndTheDocumentedView) {
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  EXPECT_EQ(Column("SELECT version FROM atfill_schema_version"),
            std::vector<std::string>{std::to_string(kPostgresSchemaVersion)});
  EXPECT_EQ(
      Column("SELECT table_name FROM information_schema.tables WHERE table_schema = "
             "'public' ORDER BY table_name"),
      (std::vector<std::string>{"atfill_collections", "atfill_dids", "atfill_label_rows",
                                "atfill_labels", "atfill_lexicons", "atfill_record_epochs",
                                "atfill_record_rows", "atfill_records", "atfill_schema_version"}));
  EXPECT_EQ(Column("SELECT column_name FROM information_schema.columns WHERE table_name = "
                   "'atfill_records' ORDER BY ordinal_position"),
            (std::vector<std::string>{"uri", "did", "collection", "rkey", "record", "cid", "rev",
                                      "indexed_at", "created_at"}));
  ASSERT_TRUE(
      sink->Write(std::vector<Event>{
                      MakeCreate(kAlice, kPost, "3kp1", kBody, kRev1, "2024-05-06T07:08:09.010Z"),
                      MakeCreate(kAlice, kPost, "3kp2", kBody),
                  })
          .ok());
  const std::string where = " FROM atfill_records WHERE rkey = '3kp1'";
  EXPECT_EQ(Column("SELECT uri" + where), std::vector<std::string>{Uri(kAlice, kPost, "3kp1")});
  EXPECT_EQ(Column("SELECT did || ' ' || collection || ' ' || rkey" + where),
            std::vector<std::string>{std::string(kAlice) + " " + kPost + " 3kp1"});
  EXPECT_EQ(Column("SELECT record" + where), std::vector<std::string>{kBody});
  EXPECT_EQ(Column("SELECT cid" + where), std::vector<std::string>{testing::CidOf(kBody)});
  EXPECT_EQ(Column("SELECT rev" + where), std::vector<std::string>{kRev1});
  EXPECT_EQ(Column("SELECT indexed_at" + where),
            std::vector<std::string>{"2026-11-30T09:00:00.123456Z"});
  EXPECT_EQ(Column("SELECT created_at" + where),
            std::vector<std::string>{"2024-05-06T07:08:09.010Z"});
  // The record is text (exact bytes); raw SQL casts it to query it.
  EXPECT_EQ(Column("SELECT pg_typeof(record)::text" + where), std::vector<std::string>{"text"});
  EXPECT_EQ(Column("SELECT record::jsonb ->> 'text'" + where), std::vector<std::string>{"hello"});
  // No rev and no createdAt are NULL, not empty strings.
  EXPECT_EQ(Column("SELECT (rev IS NULL)::text || ' ' || (created_at IS NULL)::text FROM "
                   "atfill_records WHERE rkey = '3kp2'"),
            std::vector<std::string>{"true true"});
  // The lexicons accounts publish, by the NSID they define ([lexicons] track_network).
  const std::string lexicon =
      R"({"$type":"com.atproto.lexicon.schema","lexicon":1,"id":"com.example.thing","defs":{}})";
  ASSERT_TRUE(sink->Write(std::vector<Event>{MakeCreate(kAlice, "com.atproto.lexicon.schema",
                                                        "com.example.thing", lexicon)})
                  .ok());
  EXPECT_EQ(Column("SELECT nsid || ' ' || did || ' ' || cid || ' ' || seen_at FROM "
                   "atfill_lexicons"),
            std::vector<std::string>{"com.example.thing " + std::string(kAlice) + " " +
                                     testing::CidOf(lexicon) + " 2026-11-30T09:00:00.123456Z"});
  EXPECT_EQ(Column("SELECT document FROM atfill_lexicons"), std::vector<std::string>{lexicon});
}

// Mixed batches (creates, updates, deletes, purges, resyncs, bounded ones, one URI several times
// in a batch, redeliveries) over a small key space, written into an SQLite sink and a PostgreSQL
// sink: every batch's WriteStats and, after every batch, both views column for column are equal.
TEST_F(PostgresSinkTest, ViewAndStatsEqualSqlitesForTheSameInput) {
  testing::TempDir dir;
  SqliteSinkOptions sqlite_options;
  sqlite_options.path = (dir.path() / "atfill.db").string();
  sqlite_options.now_us = [this] { return now_us_.load(); };
  auto sqlite = OpenSqliteSink(sqlite_options);
  ASSERT_TRUE(sqlite.ok()) << sqlite.status().ToString();
  auto postgres = MustOpen();
  ASSERT_NE(postgres, nullptr);
  auto pg_reader = PostgresReader::Open(db_->conninfo());
  ASSERT_TRUE(pg_reader.ok()) << pg_reader.status().ToString();

  const std::vector<std::string> dids = {kAlice, kBob, "did:web:carol.example"};
  const std::vector<std::string> collections = {kPost, kLike, "app.bsky.graph.follow"};
  const std::vector<std::string> revs = {
      "", "3kaaaaaaaaa2a", "3kbbbbbbbbb2a", "3kccccccccc2a", "3kddddddddd2a", "3keeeeeeeee2a"};
  const std::vector<std::string> bodies = {
      R"({"text":"plain"})",
      "{\"text\":\"tab\\there\",\t\"n\":1}",
      "{\"text\":\"new\nline and \\\\ backslash and \\r\r\"}",
      "{\"text\":\"h\xc3\xa9llo \xf0\x9f\xa6\x8b \\u00e9 \\\"q\\\"\"}",
      R"({"text":")" + std::string(3000, 'z') + R"("})",
  };
  const std::vector<std::string> created = {"", "2024-01-01T00:00:00.000Z", "not a date\t\\"};
  std::mt19937 rng(20261130);
  auto pick = [&](const auto& v) -> const auto& { return v[rng() % v.size()]; };
  auto random_event = [&]() -> Event {
    const int roll = static_cast<int>(rng() % 100);
    const std::string& did = pick(dids);
    const std::string rkey = "r" + std::to_string(rng() % 4);
    if (roll < 40)
      return MakeCreate(did, pick(collections), rkey, pick(bodies), pick(revs), pick(created));
    if (roll < 60) return MakeUpdate(did, pick(collections), rkey, pick(bodies), pick(revs));
    if (roll < 82) return MakeDelete(did, pick(collections), rkey, pick(revs));
    AccountEvent a;
    a.did = did;
    if (roll < 88) {
      a.status = rng() % 2 == 0 ? AccountStatus::kTakendown : AccountStatus::kDeleted;
    } else if (roll < 91) {
      a.status = AccountStatus::kDeactivated;
    } else {
      a.resync = true;
      if (rng() % 2 == 0) a.resync_collections = {pick(collections)};
      if (rng() % 4 == 0) a.resync_collections = {"app.bsky.feed.*"};
    }
    if (rng() % 3 == 0) a.purge_before_rev = pick(revs);
    return a;
  };

  std::vector<Event> previous;
  size_t largest = 0;
  WriteStats total;
  for (int b = 0; b < 120; ++b) {
    SCOPED_TRACE("batch " + std::to_string(b));
    std::vector<Event> batch;
    if (b % 10 == 9) {
      batch = previous;  // a redelivery
    } else {
      // Some batches past SQLite's grouping threshold (64 events), most shorter.
      const int n = b % 7 == 3 ? 150 : 1 + static_cast<int>(rng() % 30);
      for (int i = 0; i < n; ++i) batch.push_back(random_event());
    }
    now_us_ += 1'000'003;
    auto want = (*sqlite)->Write(batch);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    auto got = postgres->Write(batch);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(StatsText(*got), StatsText(*want));
    auto sqlite_rows = ReadAllRecords(sqlite_options.path);
    ASSERT_TRUE(sqlite_rows.ok()) << sqlite_rows.status().ToString();
    auto pg_rows = (*pg_reader)->ReadAll();
    ASSERT_TRUE(pg_rows.ok()) << pg_rows.status().ToString();
    ASSERT_EQ(*pg_rows, *sqlite_rows);
    previous = std::move(batch);
    largest = std::max(largest, pg_rows->size());
    total += *got;
  }
  // The comparisons were not between empty tables, and every rule came into play.
  EXPECT_GE(largest, 10u);
  EXPECT_GT(total.inserted, 0u);
  EXPECT_GT(total.updated, 0u);
  EXPECT_GT(total.unchanged, 0u);
  EXPECT_GT(total.stale, 0u);
  EXPECT_GT(total.deleted, 0u);
  EXPECT_GT(total.purged_records, 0u);
  EXPECT_GT(total.resynced_records, 0u);
}

// Several sinks on one database from several threads (as sharded processes do): each writes its
// own DIDs, all interning the same collections (some new mid-run) at once.
TEST_F(PostgresSinkTest, ShardedSinksWriteTheirOwnDidsAtOnce) {
  constexpr int kShards = 3;
  constexpr int kBatches = 12;
  constexpr int kPerBatch = 300;
  std::vector<std::unique_ptr<pipeline::Sink>> sinks;
  for (int i = 0; i < kShards; ++i) sinks.push_back(MustOpen());
  for (const auto& s : sinks) ASSERT_NE(s, nullptr);
  std::vector<std::string> failures(kShards);
  std::vector<std::thread> threads;
  for (int shard = 0; shard < kShards; ++shard) {
    threads.emplace_back([&, shard] {
      for (int b = 0; b < kBatches; ++b) {
        std::vector<Event> batch;
        for (int i = 0; i < kPerBatch; ++i) {
          const std::string did =
              "did:plc:shard" + std::to_string(shard) + "u" + std::to_string(i % 40);
          const std::string collection = "com.example.c" + std::to_string((b + i) % (2 + b));
          batch.push_back(MakeCreate(did, collection, "k" + std::to_string(b * kPerBatch + i),
                                     R"({"n":)" + std::to_string(i) + "}", kRev1));
        }
        auto stats = sinks[static_cast<size_t>(shard)]->Write(batch);
        if (!stats.ok()) {
          failures[static_cast<size_t>(shard)] = stats.status().ToString();
          return;
        }
        if (stats->inserted != kPerBatch) {
          failures[static_cast<size_t>(shard)] =
              "batch " + std::to_string(b) + ": " + StatsText(*stats);
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& f : failures) EXPECT_EQ(f, "");
  std::vector<RecordRow> rows = MustReadAll();
  ASSERT_EQ(rows.size(), static_cast<size_t>(kShards * kBatches * kPerBatch));
  std::map<std::string, int> per_shard;
  for (const RecordRow& r : rows) {
    ++per_shard[r.did.substr(0, std::string("did:plc:shard0").size())];
    const int k = std::stoi(r.rkey.substr(1));
    EXPECT_EQ(r.collection, "com.example.c" + std::to_string((k / kPerBatch + k % kPerBatch) %
                                                             (2 + k / kPerBatch)))
        << r.uri;
  }
  for (int shard = 0; shard < kShards; ++shard) {
    EXPECT_EQ(per_shard["did:plc:shard" + std::to_string(shard)], kBatches * kPerBatch);
  }
  // Each name interned once.
  EXPECT_EQ(Column("SELECT count(*) FROM atfill_collections"),
            std::vector<std::string>{std::to_string(kBatches + 1)});
  EXPECT_EQ(Column("SELECT count(*) FROM atfill_dids"),
            std::vector<std::string>{std::to_string(kShards * 40)});
}

TEST_F(PostgresSinkTest, TextPostgresCannotStoreIsInvalid) {
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  ASSERT_TRUE(sink->Write(std::vector<Event>{MakeCreate(kAlice, kPost, "keep", kBody)}).ok());
  struct Case {
    const char* what;
    Event bad;
    const char* field;
  };
  std::vector<Case> cases = {
      {"NUL in the body", MakeCreate(kBob, kPost, "r", std::string("{\"a\":\"x") + '\0' + "y\"}"),
       "record body"},
      {"invalid UTF-8 in the body", MakeCreate(kBob, kPost, "r", "{\"a\":\"\xff\"}"),
       "record body"},
      {"a lone surrogate", MakeCreate(kBob, kPost, "r", "{\"a\":\"\xed\xa0\x80\"}"), "record body"},
      {"invalid UTF-8 in the rkey", MakeDelete(kBob, kPost, "r\xc0"), "rkey"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto stats = sink->Write(std::vector<Event>{MakeCreate(kBob, kLike, "fine", kBody), c.bad});
    ASSERT_FALSE(stats.ok());
    EXPECT_EQ(stats.status().code(), StatusCode::kInvalid) << stats.status().ToString();
    EXPECT_NE(stats.status().message().find("event 1"), std::string::npos)
        << stats.status().ToString();
    EXPECT_NE(stats.status().message().find(std::string(kBob) + "/" + kPost + "/r"),
              std::string::npos)
        << stats.status().ToString();
    EXPECT_NE(stats.status().message().find(c.field), std::string::npos)
        << stats.status().ToString();
  }
  std::vector<RecordRow> rows = MustReadAll();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].rkey, "keep");
}

TEST_F(PostgresSinkTest, TablesGoInTheConfiguredSchema) {
  options_.schema = "atfill \"data\"";  // quoting is needed and done
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  ASSERT_TRUE(sink->Write(std::vector<Event>{MakeCreate(kAlice, kPost, "a", kBody, kRev1)}).ok());
  EXPECT_EQ(
      Column("SELECT table_name FROM information_schema.tables WHERE table_schema = "
             "'atfill \"data\"' ORDER BY table_name"),
      (std::vector<std::string>{"atfill_collections", "atfill_dids", "atfill_label_rows",
                                "atfill_labels", "atfill_lexicons", "atfill_record_epochs",
                                "atfill_record_rows", "atfill_records", "atfill_schema_version"}));
  EXPECT_EQ(Column("SELECT count(*) FROM information_schema.tables WHERE table_schema = "
                   "'public'"),
            std::vector<std::string>{"0"});
  PostgresReaderOptions reader_options;
  reader_options.conninfo = db_->conninfo();
  reader_options.schema = options_.schema;
  auto reader = PostgresReader::Open(reader_options);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto record = (*reader)->ReadRecord(Uri(kAlice, kPost, "a"));
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ(*record, std::optional<std::string>(kBody));
  // The default schema holds no atfill tables.
  auto in_public = PostgresReader::Open(db_->conninfo());
  ASSERT_FALSE(in_public.ok());
  EXPECT_EQ(in_public.status().code(), StatusCode::kNotFound) << in_public.status().ToString();
}

TEST_F(PostgresSinkTest, OptionsAreValidated) {
  struct Case {
    const char* field;
    std::function<void(PostgresSinkOptions*)> mutate;
  };
  std::vector<Case> cases = {
      {"conninfo", [](PostgresSinkOptions* o) { o->conninfo = "host=x port"; }},
      {"conninfo", [](PostgresSinkOptions* o) { o->conninfo = "nosuchkey=1"; }},
      {"schema", [](PostgresSinkOptions* o) { o->schema.clear(); }},
      {"schema", [](PostgresSinkOptions* o) { o->schema = std::string(64, 's'); }},
      {"connect_timeout_ms", [](PostgresSinkOptions* o) { o->connect_timeout_ms = 0; }},
      {"lock_timeout_ms", [](PostgresSinkOptions* o) { o->lock_timeout_ms = 0; }},
      {"lock_timeout_ms", [](PostgresSinkOptions* o) { o->lock_timeout_ms = 1LL << 40; }},
      {"conflict_retries", [](PostgresSinkOptions* o) { o->conflict_retries = -1; }},
      {"intern_cache_entries", [](PostgresSinkOptions* o) { o->intern_cache_entries = 0; }},
  };
  EXPECT_TRUE(options_.Validate().ok());
  for (const Case& c : cases) {
    PostgresSinkOptions o = options_;
    c.mutate(&o);
    Status st = o.Validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalid) << c.field;
    EXPECT_NE(st.message().find(c.field), std::string::npos) << st.ToString();
    EXPECT_FALSE(OpenPostgresSink(o).ok()) << c.field;
  }
  // Nothing was created.
  EXPECT_EQ(Column("SELECT count(*) FROM information_schema.tables WHERE table_schema = "
                   "'public'"),
            std::vector<std::string>{"0"});
}

// What only the PostgreSQL reader offers: the record's JSON alone, and the shared helpers that wrap
// a reader for callers on any thread (the Sink conformance suite covers the lookups both share).
TEST_F(PostgresSinkTest, ReaderReadsRecordTextAndSharedHelpersReadTheView) {
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  ASSERT_TRUE(sink->Write(std::vector<Event>{MakeCreate(kAlice, kPost, "a", kBody, kRev1, "c"),
                                             MakeCreate(kAlice, kPost, "b", kBody)})
                  .ok());
  auto reader = PostgresReader::Open(db_->conninfo());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const std::string uri = Uri(kAlice, kPost, "a");
  auto record = (*reader)->ReadRecord(uri);
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ(*record, std::optional<std::string>(kBody));
  auto missing = (*reader)->ReadRecord(Uri(kAlice, kPost, "zzz"));
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
  for (const char* bad : {"", "http://x/y/z", "at://did:plc:x/coll", "at://d/coll/"}) {
    auto r = (*reader)->ReadRecord(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalid) << bad;
    EXPECT_NE(r.status().message().find("AT URI"), std::string::npos) << r.status().ToString();
  }
  ASSERT_TRUE(sink->Write(std::vector<Event>{MakeDelete(kAlice, kPost, "a")}).ok());
  auto after = (*reader)->ReadRecord(uri);
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(after->has_value());

  // The shared helpers read the same, and tables not created yet hold nothing.
  PostgresReaderOptions shared;
  shared.conninfo = db_->conninfo();
  auto read_record = PostgresRecordReader(shared);
  auto b = read_record(Uri(kAlice, kPost, "b"));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(*b, std::optional<std::string>(kBody));
  auto holds = PostgresHoldsRecords(shared)(kAlice, kPost);
  ASSERT_TRUE(holds.ok()) << holds.status().ToString();
  EXPECT_TRUE(*holds);
  shared.schema = "nothing_here";
  auto empty_holds = PostgresHoldsRecords(shared)(kAlice, kPost);
  ASSERT_TRUE(empty_holds.ok()) << empty_holds.status().ToString();
  EXPECT_FALSE(*empty_holds);
}

TEST_F(PostgresSinkTest, ReaderLookupsUseTheKeyIndex) {
  ASSERT_NE(MustOpen(), nullptr);
  auto conn = MustConnect();
  ASSERT_NE(conn, nullptr);
  // Big enough that a scan would cost more than the index.
  ASSERT_TRUE(conn->Exec("INSERT INTO atfill_dids(did) SELECT 'did:plc:' || i FROM "
                         "generate_series(1, 20000) i; INSERT INTO atfill_collections(nsid) "
                         "VALUES ('a.b.c'); INSERT INTO atfill_record_rows SELECT i, 1, 'k', "
                         "'cid', NULL, 0, NULL, '{}' FROM generate_series(1, 20000) i; ANALYZE")
                  .ok());
  auto plan = conn->Column(
      "EXPLAIN SELECT * FROM atfill_records WHERE did = 'did:plc:7' AND collection = 'a.b.c' AND "
      "rkey = 'k'");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_FALSE(plan->empty());
  for (const std::string& step : *plan) {
    EXPECT_EQ(step.find("Seq Scan on atfill_record_rows"), std::string::npos) << step;
  }
}

// Schema version 2 as atfill wrote it, frozen here: the upgrade must take such a database as it is.
constexpr const char* kSchemaV2 = R"sql(
CREATE TABLE atfill_schema_version(version integer NOT NULL);
INSERT INTO atfill_schema_version VALUES (2);
CREATE TABLE atfill_dids(id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  did text COLLATE "C" NOT NULL UNIQUE);
CREATE TABLE atfill_collections(id integer GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  nsid text COLLATE "C" NOT NULL UNIQUE);
CREATE TABLE atfill_record_rows(did_id bigint NOT NULL, collection_id integer NOT NULL,
  rkey text COLLATE "C" NOT NULL, cid text COLLATE "C" NOT NULL, rev text COLLATE "C",
  indexed_at bigint NOT NULL, created_at text, record text NOT NULL,
  PRIMARY KEY (did_id, collection_id, rkey));
CREATE VIEW atfill_records(uri, did, collection, rkey, record, cid, rev, indexed_at,
                           created_at) AS
SELECT 'at://' || d.did || '/' || c.nsid || '/' || r.rkey, d.did, c.nsid, r.rkey, r.record, r.cid,
       r.rev, to_char(timestamp '1970-01-01' + (r.indexed_at / 1000000) * interval '1 second' +
                      (r.indexed_at % 1000000) * interval '1 microsecond',
                      'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), r.created_at
FROM atfill_record_rows r JOIN atfill_dids d ON d.id = r.did_id
JOIN atfill_collections c ON c.id = r.collection_id;
CREATE INDEX atfill_record_rows_by_created ON atfill_record_rows(collection_id, created_at);
)sql";

// A database written by schema version 2 opens: its rows are given their collection's NSID, the
// index of a collection newest first is replaced, the view reads every row as before, and the sink
// writes on.
TEST_F(PostgresSinkTest, UpgradesAVersion2Database) {
  auto conn = MustConnect();
  ASSERT_NE(conn, nullptr);
  ASSERT_TRUE(conn->Exec(kSchemaV2).ok());
  ASSERT_TRUE(
      conn->Exec(std::string("INSERT INTO atfill_dids(did) VALUES ('") + kAlice + "'), ('" + kBob +
                 "'); INSERT INTO atfill_collections(nsid) VALUES ('" + kPost + "'), ('" + kLike +
                 "'); INSERT INTO atfill_record_rows VALUES (1, 1, 'a', '" + testing::CidOf(kBody) +
                 "', '" + kRev1 + "', 1796029200123456, 'c', '" + kBody + "'), (2, 2, 'b', '" +
                 testing::CidOf(kBody) + "', NULL, 1796029200123456, NULL, '" + kBody + "')")
          .ok());
  // Read through version 2's view (this build's reader refuses version 2 until it is upgraded).
  const std::string every_row =
      "SELECT concat_ws('|', uri, did, collection, rkey, record, cid, rev, indexed_at, created_at) "
      "FROM atfill_records ORDER BY uri";
  const std::vector<std::string> before = Column(every_row);
  ASSERT_EQ(before.size(), 2u);

  // The upgrade is said before it runs (a large table's rewrite takes minutes) and when it ended.
  std::vector<std::string> said;
  options_.log = [&said](std::string_view line) { said.emplace_back(line); };
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  ASSERT_EQ(said.size(), 2u);
  EXPECT_TRUE(said[0].starts_with("atfill: postgres: upgrading schema public of ")) << said[0];
  // A table never analysed has no estimate of its rows.
  EXPECT_TRUE(said[0].ends_with(" from schema version 2 to " +
                                std::to_string(kPostgresSchemaVersion) +
                                " (its record rows), in one transaction"))
      << said[0];
  EXPECT_TRUE(said[1].starts_with("atfill: postgres: upgraded schema public of ")) << said[1];
  EXPECT_NE(said[1].find(" to schema version " + std::to_string(kPostgresSchemaVersion) + " in "),
            std::string::npos)
      << said[1];
  said.clear();
  EXPECT_NE(MustOpen(), nullptr);
  EXPECT_TRUE(said.empty());  // current tables: nothing to say
  EXPECT_EQ(Column("SELECT version FROM atfill_schema_version"),
            std::vector<std::string>{std::to_string(kPostgresSchemaVersion)});
  EXPECT_EQ(Column("SELECT collection FROM atfill_record_rows ORDER BY did_id"),
            (std::vector<std::string>{kPost, kLike}));
  EXPECT_EQ(Column("SELECT indexname FROM pg_indexes WHERE tablename = 'atfill_record_rows' "
                   "ORDER BY indexname"),
            (std::vector<std::string>{"atfill_record_rows_by_collection_created",
                                      "atfill_record_rows_by_did", "atfill_record_rows_pkey"}));
  EXPECT_EQ(Column(every_row), before);
  EXPECT_EQ(MustReadAll().size(), 2u);
  auto stats = sink->Write(std::vector<Event>{MakeCreate(kBob, kPost, "c", kBody, kRev2),
                                              MakeDelete(kAlice, kPost, "a")});
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(StatsText(*stats),
            "inserted=1 updated=0 unchanged=0 stale=0 deleted=1 "
            "purged_accounts=0 purged_records=0 resyncs=0 resynced_records=0");
  EXPECT_EQ(Column("SELECT uri FROM atfill_records WHERE collection = 'app.bsky.feed.post' ORDER "
                   "BY created_at DESC"),
            std::vector<std::string>{Uri(kBob, kPost, "c")});
}

// Another process creating or upgrading the tables (here a connection holding the upgrade lock in
// an open transaction, as a long upgrade does) is waited for however long it takes, and the wait
// is said; the open goes on once that transaction ends.
TEST_F(PostgresSinkTest, AnOpenWaitsForAnotherProcesssUpgradeAndSaysSo) {
  auto holder = MustConnect();
  ASSERT_NE(holder, nullptr);
  ASSERT_TRUE(holder->Exec("BEGIN").ok());
  ASSERT_TRUE(
      holder->Column("SELECT pg_advisory_xact_lock(1635018345, hashtext('public'))::text").ok());
  std::promise<std::string> waiting;
  std::vector<std::string> said;
  std::mutex mu;
  options_.log = [&](std::string_view line) {
    std::lock_guard lock(mu);
    said.emplace_back(line);
    if (said.size() == 1) waiting.set_value(std::string(line));
  };
  Result<std::unique_ptr<pipeline::Sink>> opened = Status::Internal("not opened");
  std::thread opener([&] { opened = OpenPostgresSink(options_); });
  auto line = waiting.get_future();
  const bool told = line.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  ASSERT_TRUE(holder->Exec("COMMIT").ok());
  opener.join();
  ASSERT_TRUE(told) << "the open never said it was waiting";
  EXPECT_TRUE(line.get().starts_with(
      "atfill: postgres: waiting for another atfill process creating or upgrading the tables of "
      "schema public of "))
      << said[0];
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(said.size(), 1u);  // creating the tables is no upgrade
  EXPECT_EQ(Column("SELECT version FROM atfill_schema_version"),
            std::vector<std::string>{std::to_string(kPostgresSchemaVersion)});
}

// The queries users run, through the view, each answered from an index: a collection newest first
// reads its index backwards (no sort of the collection), by DID and by DID and collection probe the
// index by account once per block of rows (schema version 5), and a record by its URI's parts
// probes the primary key.
TEST_F(PostgresSinkTest, TheViewAnswersTheUsersQueriesFromIndexes) {
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  // Enough rows over enough accounts that a scan or a sort would cost more than the index.
  std::vector<Event> batch;
  for (int i = 0; i < 20000; ++i) {
    const std::string did = "did:plc:account" + std::to_string(i % 2000);
    const std::string collection = i % 3 == 0 ? kPost : kLike;
    char created[40];
    std::snprintf(created, sizeof created, "2026-01-01T00:00:00.%06dZ", i);
    batch.push_back(MakeCreate(did, collection, "k" + std::to_string(i), kBody, "", created));
  }
  ASSERT_TRUE(sink->Write(batch).ok());
  auto conn = MustConnect();
  ASSERT_NE(conn, nullptr);
  ASSERT_TRUE(conn->Exec("ANALYZE").ok());
  struct Case {
    const char* sql;
    const char* must_hold;  // a plan line that must appear
  };
  const Case cases[] = {
      {"SELECT uri FROM atfill_records WHERE collection = $1 ORDER BY created_at DESC LIMIT 20",
       "Index Scan Backward using atfill_record_rows_by_collection_created"},
      {"SELECT uri FROM atfill_records WHERE did = $2 LIMIT 20",
       "Index Cond: ((did_epoch = e.epoch) AND (did_id = d.id))"},
      {"SELECT uri FROM atfill_records WHERE did = $2 AND collection = $1 LIMIT 20",
       "Index Cond: ((did_epoch = e.epoch) AND (did_id = d.id) AND (collection_id = c.id))"},
      {"SELECT uri FROM atfill_records WHERE did = $2 AND collection = $1 AND rkey = $3",
       "atfill_record_rows_pkey"},
  };
  // Both a plan for the values (a literal, or one of PostgreSQL's first custom plans) and the
  // generic plan a prepared statement settles on.
  for (const char* mode : {"force_custom_plan", "force_generic_plan"}) {
    for (const Case& c : cases) {
      ASSERT_TRUE(conn->Exec(std::string("DEALLOCATE ALL; SET plan_cache_mode = ") + mode +
                             "; PREPARE q(text, text, text) AS " + c.sql)
                      .ok());
      auto plan = conn->Column("EXPLAIN EXECUTE q('app.bsky.feed.post', 'did:plc:account7', 'k7')");
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      std::string text;
      for (const std::string& line : *plan) text += line + "\n";
      EXPECT_NE(text.find(c.must_hold), std::string::npos) << mode << " " << c.sql << "\n" << text;
      EXPECT_EQ(text.find("Seq Scan on atfill_record_rows"), std::string::npos)
          << mode << " " << c.sql << "\n"
          << text;
      EXPECT_EQ(text.find("Sort"), std::string::npos) << mode << " " << c.sql << "\n" << text;
    }
  }
  auto newest = conn->Column(
      "SELECT rkey FROM atfill_records WHERE collection = 'app.bsky.feed.post' ORDER BY created_at "
      "DESC LIMIT 2");
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(*newest, (std::vector<std::string>{"k19998", "k19995"}));
}

// Rows in several blocks of 2^20 ids (written by plain SQL after the identity sequence was moved
// on, as millions of rows would): each block up to the sequence's is added to atfill_record_epochs
// by the insert itself, so every row stays in the view; the queries by account find the rows of
// every block, through the index by account, and so do the reader and a purge.
TEST_F(PostgresSinkTest, RowsOfEveryBlockStayInTheViewAndAreFoundByAccount) {
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  ASSERT_TRUE(sink->Write(std::vector<Event>{MakeCreate(kAlice, kPost, "a", kBody, kRev1),
                                             MakeCreate(kBob, kPost, "b", kBody, kRev1)})
                  .ok());
  auto conn = MustConnect();
  ASSERT_NE(conn, nullptr);
  auto insert = [&](int64_t after_id, std::vector<std::string> rkeys) {
    std::string values;
    for (const std::string& k : rkeys) values += (values.empty() ? "('" : ", ('") + k + "')";
    return conn->Exec("SELECT setval(pg_get_serial_sequence('atfill_record_rows', 'id'), " +
                      std::to_string(after_id) +
                      "); INSERT INTO atfill_record_rows(did_id, collection_id, rkey, cid, rev, "
                      "indexed_at, created_at, record) SELECT d.id, c.id, v.k, '" +
                      testing::CidOf(kBody) + "', NULL, 1796029200123456, NULL, '" + kBody +
                      "' FROM (VALUES " + values + ") v(k) JOIN atfill_dids d ON d.did = '" +
                      kAlice + "' JOIN atfill_collections c ON c.nsid = '" + kLike + "'");
  };
  ASSERT_TRUE(
      conn->Exec("INSERT INTO atfill_collections(nsid) VALUES ('" + std::string(kLike) + "')")
          .ok());
  ASSERT_TRUE(insert((1 << 20) + 4, {"k1"}).ok());          // block 1
  ASSERT_TRUE(insert((3 << 20) + 6, {"k3a", "k3b"}).ok());  // block 3
  EXPECT_EQ(Column("SELECT did_epoch FROM atfill_record_rows ORDER BY id"),
            (std::vector<std::string>{"0", "0", "1", "3", "3"}));
  EXPECT_EQ(Column("SELECT epoch FROM atfill_record_epochs ORDER BY epoch"),
            (std::vector<std::string>{"0", "1", "2", "3"}));
  EXPECT_EQ(Column("SELECT rkey FROM atfill_records WHERE did = '" + std::string(kAlice) +
                   "' ORDER BY rkey"),
            (std::vector<std::string>{"a", "k1", "k3a", "k3b"}));
  EXPECT_EQ(Column("SELECT rkey FROM atfill_records WHERE did = '" + std::string(kAlice) +
                   "' AND collection = '" + kLike + "' ORDER BY rkey"),
            (std::vector<std::string>{"k1", "k3a", "k3b"}));
  EXPECT_EQ(MustReadAll().size(), 5u);
  auto reader = PostgresReader::Open(db_->conninfo());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto repo = (*reader)->RepoRecords(kAlice);
  ASSERT_TRUE(repo.ok()) << repo.status().ToString();
  EXPECT_EQ(repo->size(), 4u);
  auto holds = (*reader)->HoldsRecords(kAlice, kLike);
  ASSERT_TRUE(holds.ok()) << holds.status().ToString();
  EXPECT_TRUE(*holds);
  auto dids = (*reader)->Dids();
  ASSERT_TRUE(dids.ok()) << dids.status().ToString();
  EXPECT_EQ(*dids, (std::vector<std::string>{kAlice, kBob}));
  auto purged =
      sink->Write(std::vector<Event>{testing::MakeAccount(kAlice, AccountStatus::kDeleted)});
  ASSERT_TRUE(purged.ok()) << purged.status().ToString();
  EXPECT_EQ(purged->purged_records, 4u);
  EXPECT_EQ(Column("SELECT count(*) FROM atfill_record_rows WHERE did_id = (SELECT id FROM "
                   "atfill_dids WHERE did = '" +
                   std::string(kAlice) + "')"),
            std::vector<std::string>{"0"});
  EXPECT_EQ(MustReadAll().size(), 1u);
}

// ---------------------------------------------------------------------------------------------
// Outages, each on a server of the test's own (stopping the shared one would disturb the tests
// running beside it).

class PostgresOutageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The shared server's variable is what says PostgreSQL tests are meant to run here.
    auto admin = testing::TestServerConninfo();
    ASSERT_TRUE(admin.ok()) << admin.status().ToString();
    auto server = PgServer::StartPrivate();
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    options_.conninfo = server_->admin_conninfo();
    options_.connect_timeout_ms = 1000;
    options_.now_us = [] { return int64_t{1'796'029'200'000'000}; };
  }

  // Batch b: 100 creates of its own URIs, an update of one of the previous batch's, and a delete of
  // another one; `want` follows along.
  std::vector<Event> Batch(int b, std::map<std::string, std::string>* want) {
    std::vector<Event> batch;
    for (int i = 0; i < 100; ++i) {
      const std::string rkey = "b" + std::to_string(b) + "i" + std::to_string(i);
      const std::string body =
          R"({"b":)" + std::to_string(b) + R"(,"i":)" + std::to_string(i) + "}";
      batch.push_back(MakeCreate("did:plc:u" + std::to_string(i % 7), kPost, rkey, body));
      (*want)[Uri("did:plc:u" + std::to_string(i % 7), kPost, rkey)] = body;
    }
    if (b > 0) {
      const std::string prev = "b" + std::to_string(b - 1) + "i";
      batch.push_back(MakeUpdate("did:plc:u1", kPost, prev + "1", R"({"updated":true})"));
      (*want)[Uri("did:plc:u1", kPost, prev + "1")] = R"({"updated":true})";
      batch.push_back(MakeDelete("did:plc:u2", kPost, prev + "2"));
      want->erase(Uri("did:plc:u2", kPost, prev + "2"));
    }
    return batch;
  }

  // Restarts the server, telling WriteThrough (on any thread) while it is down.
  Status RestartServer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      restarting_ = true;
    }
    Status s = server_->Restart();
    {
      std::lock_guard<std::mutex> lock(mu_);
      restarting_ = false;
    }
    cv_.notify_all();
    return s;
  }

  // Writes until it succeeds: a write that fails Unavailable while the server restarts is retried
  // once the restart is over, one that fails with the server up is retried at once (its
  // connection died with the last restart) and at most twice more. The attempts made, or -1.
  int WriteThrough(pipeline::Sink* sink, const std::vector<Event>& batch) {
    const auto give_up = Clock::now() + std::chrono::seconds(60);
    int failed_while_up = 0;
    for (int attempts = 1;; ++attempts) {
      auto stats = sink->Write(batch);
      if (stats.ok()) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++batches_written_;
        }
        cv_.notify_all();
        return attempts;
      }
      EXPECT_EQ(stats.status().code(), StatusCode::kUnavailable) << stats.status().ToString();
      if (stats.status().code() != StatusCode::kUnavailable) return -1;
      std::unique_lock<std::mutex> lock(mu_);
      if (!restarting_ && ++failed_while_up > 2) {
        ADD_FAILURE() << "Unavailable with the server up: " << stats.status().ToString();
        return -1;
      }
      if (!cv_.wait_until(lock, give_up, [&] { return !restarting_; })) return -1;
    }
  }

  // Blocks until WriteThrough has written `count` batches in all.
  bool WaitForBatches(int count) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return batches_written_ >= count; });
  }

  void ExpectTable(const std::map<std::string, std::string>& want) {
    auto reader = PostgresReader::Open(server_->admin_conninfo());
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    auto rows = (*reader)->ReadAll();
    ASSERT_TRUE(rows.ok()) << rows.status().ToString();
    std::map<std::string, std::string> got;
    for (const RecordRow& r : *rows) got[r.uri] = r.record;
    EXPECT_EQ(got.size(), want.size());
    EXPECT_TRUE(got == want);
  }

  std::unique_ptr<PgServer> server_;
  PostgresSinkOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool restarting_ = false;
  int batches_written_ = 0;
};

TEST_F(PostgresOutageTest, RestartsBetweenAndDuringBatchesLoseNothing) {
  auto sink = OpenPostgresSink(options_);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  auto reader = PostgresReader::Open(server_->admin_conninfo());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::map<std::string, std::string> want;
  int b = 0;
  for (; b < 5; ++b) ASSERT_EQ(WriteThrough(sink->get(), Batch(b, &want)), 1);

  // Between batches: the dead connection is replaced within the next Write.
  ASSERT_TRUE(RestartServer().ok());
  auto after_restart = (*sink)->Write(Batch(b++, &want));
  EXPECT_TRUE(after_restart.ok()) << after_restart.status().ToString();
  if (!after_restart.ok()) {
    ASSERT_GT(WriteThrough(sink->get(), Batch(b - 1, &want)), 0);
  }
  // The reader, too, reconnects.
  auto count = (*reader)->Count();
  ASSERT_TRUE(count.ok()) << count.status().ToString();
  EXPECT_EQ(*count, want.size());

  // During batches: restarts from another thread while batches keep coming, each once the
  // writer has written 5 more batches since the last (so writes fall before, during and after).
  std::atomic<bool> restarted{false};
  std::atomic<int> restarts{0};
  std::thread restarter([&] {
    for (int i = 1; i <= 3; ++i) {
      int written = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        written = batches_written_;
      }
      if (!WaitForBatches(written + 5)) break;
      if (RestartServer().ok()) ++restarts;
    }
    restarted = true;
  });
  int retried = 0;
  const auto give_up = Clock::now() + std::chrono::seconds(120);
  for (; !restarted || b < 60; ++b) {
    const int attempts = WriteThrough(sink->get(), Batch(b, &want));
    if (attempts <= 0 || Clock::now() > give_up) {
      restarter.join();
      FAIL() << "batch " << b << " was not written";
    }
    retried += attempts - 1;
  }
  restarter.join();
  EXPECT_EQ(restarts.load(), 3);
  std::cout << "[ info ] " << b << " batches, " << retried
            << " attempts failed Unavailable across 3 restarts\n";
  ExpectTable(want);
}

TEST_F(PostgresOutageTest, AStoppedServerIsUnavailableFastThenWritesResume) {
  auto sink = OpenPostgresSink(options_);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  std::map<std::string, std::string> want;
  ASSERT_EQ(WriteThrough(sink->get(), Batch(0, &want)), 1);
  ASSERT_TRUE(server_->Stop().ok());
  // While it is down, every Write fails Unavailable within the connect timeout, however often.
  const std::vector<Event> batch = Batch(1, &want);
  for (int failures = 0; failures < 4; ++failures) {
    const auto start = Clock::now();
    auto stats = (*sink)->Write(batch);
    const auto took =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    ASSERT_FALSE(stats.ok());
    EXPECT_EQ(stats.status().code(), StatusCode::kUnavailable) << stats.status().ToString();
    EXPECT_NE(stats.status().message().find("nothing of the batch was written"), std::string::npos)
        << stats.status().ToString();
    EXPECT_LT(took, options_.connect_timeout_ms + 1000);
  }
  ASSERT_TRUE(server_->Start().ok());
  // Nothing of the failed attempts was applied: the whole batch is new now.
  auto stats = (*sink)->Write(batch);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->inserted, 100u);
  EXPECT_EQ(stats->updated, 1u);
  EXPECT_EQ(stats->deleted, 1u);
  ExpectTable(want);
}

TEST_F(PostgresOutageTest, ANeverReachableServerIsUnavailableAtOpen) {
  ASSERT_TRUE(server_->Stop().ok());
  options_.connect_timeout_ms = 300;
  const auto start = Clock::now();
  auto sink = OpenPostgresSink(options_);
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  ASSERT_FALSE(sink.ok());
  EXPECT_EQ(sink.status().code(), StatusCode::kUnavailable) << sink.status().ToString();
  EXPECT_NE(sink.status().message().find("127.0.0.1"), std::string::npos)
      << sink.status().ToString();
  EXPECT_LT(took, 2000);
}

// The engine's own retries carry a batch across an outage: ingest pauses while the server is down
// and resumes when it returns, with nothing lost or applied twice. The source holds its input at
// chunk 20 until the server is down, so batches are still to come; the server comes back once the
// engine has failed two attempts against it.
TEST_F(PostgresOutageTest, TheEngineRidesOutAnOutage) {
  constexpr uint64_t kChunks = 60;
  constexpr uint64_t kHoldAt = 20;
  constexpr int kPerChunk = 50;
  // What the source, the sink and the commits report, for the outage thread to wait on.
  struct Observed {
    std::mutex mu;
    std::condition_variable cv;
    int committed = 0;
    int failed_writes = 0;
    bool server_down = false;
    bool give_up = false;  // the test is failing: let the source run out
  };
  class Source : public pipeline::Source {
   public:
    explicit Source(Observed* o) : o_(o) {}
    Status Seek(const std::string&) override { return Status::OK(); }
    Result<bool> Read(pipeline::EventChunk* chunk) override {
      if (next_ >= kChunks) return false;
      if (next_ == kHoldAt) {
        std::unique_lock<std::mutex> lock(o_->mu);
        o_->cv.wait(lock, [&] { return o_->server_down || o_->give_up; });
      }
      for (int i = 0; i < kPerChunk; ++i) {
        const uint64_t n = next_ * kPerChunk + static_cast<uint64_t>(i);
        Event e = MakeCreate("did:plc:e" + std::to_string(n % 11), kPost, "r" + std::to_string(n),
                             R"({"n":)" + std::to_string(n) + "}", kRev1);
        std::get<RecordEvent>(e).position = n;
        chunk->events.push_back(std::move(e));
      }
      chunk->units_read = kPerChunk;
      chunk->resume_cursor = std::to_string(++next_);
      return true;
    }
    std::string Describe() const override { return "test source"; }

   private:
    Observed* o_;
    uint64_t next_ = 0;
  };
  class CountingSink : public pipeline::Sink {
   public:
    CountingSink(pipeline::Sink* s, Observed* o) : s_(s), o_(o) {}
    Result<WriteStats> Write(std::span<const Event> batch) override {
      auto stats = s_->Write(batch);
      if (!stats.ok()) {
        std::lock_guard<std::mutex> lock(o_->mu);
        ++o_->failed_writes;
        o_->cv.notify_all();
      }
      return stats;
    }
    std::string_view name() const override { return s_->name(); }

   private:
    pipeline::Sink* s_;
    Observed* o_;
  };
  class Committer : public pipeline::Committer {
   public:
    explicit Committer(Observed* o) : o_(o) {}
    Status PrepareCommit(const pipeline::BatchReport& report, state::WriteBatch*) override {
      max_attempts = std::max(max_attempts.load(), report.attempts);
      return Status::OK();
    }
    void OnCommitted(const pipeline::BatchReport&) override {
      std::lock_guard<std::mutex> lock(o_->mu);
      ++o_->committed;
      o_->cv.notify_all();
    }
    bool StopRequested() const override { return false; }
    std::atomic<uint32_t> max_attempts{0};

   private:
    Observed* o_;
  };

  auto sink = OpenPostgresSink(options_);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  Observed observed;
  Source source(&observed);
  CountingSink counting(sink->get(), &observed);
  Committer committer(&observed);
  auto kv = state::NewMemoryKvStore();
  pipeline::EngineOptions engine_options;
  engine_options.batch.max_events = 200;
  engine_options.batch.max_delay_ms = 50;
  engine_options.workers = 2;
  engine_options.sink_retry.initial_delay_ms = 50;
  engine_options.sink_retry.max_delay_ms = 400;
  pipeline::Engine engine(engine_options, &source, {}, &counting, kv.get(), &committer);
  Status outage = Status::Internal("the outage did not happen");
  std::thread outage_thread([&] {
    std::unique_lock<std::mutex> lock(observed.mu);
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    if (!observed.cv.wait_until(lock, deadline, [&] { return observed.committed >= 2; })) {
      outage = Status::Internal("no two batches committed before the outage");
    } else {
      lock.unlock();
      outage = server_->Stop();
      lock.lock();
      observed.server_down = outage.ok();
      observed.cv.notify_all();
      if (outage.ok() &&
          !observed.cv.wait_until(lock, deadline, [&] { return observed.failed_writes >= 2; })) {
        outage = Status::Internal("the engine made no two attempts during the outage");
      }
      lock.unlock();
      if (outage.ok()) outage = server_->Start();
      lock.lock();
    }
    observed.give_up = true;
    observed.cv.notify_all();
  });
  auto summary = engine.Run("");
  outage_thread.join();
  ASSERT_TRUE(outage.ok()) << outage.ToString();
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->events, kChunks * kPerChunk);
  // A commit whose acknowledgement the outage swallowed is retried and then counts as unchanged.
  EXPECT_EQ(summary->stats.inserted + summary->stats.unchanged, kChunks * kPerChunk);
  EXPECT_GT(committer.max_attempts.load(), 1u);  // a batch did wait out the outage
  auto reader = PostgresReader::Open(server_->admin_conninfo());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto count = (*reader)->Count();
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, kChunks * kPerChunk);
}

}  // namespace
}  // namespace atfill::sinks
