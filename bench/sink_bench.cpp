// The SQLite and PostgreSQL sinks alone: 1,000,000 generated create events (~400-byte bodies,
// 10,000 DIDs, 3 collections) written in batches of 5,000, against the raw bound of the same rows
// inserted by a bare prepared-statement loop into the same schema (one transaction per 5,000). Two
// arrival orders: `crawl` (each repo's records together, as a getRepo/listRecords backfill delivers
// them) and `interleaved` (every record from a random DID, as the firehose or an archive replay
// does). Both with the sink's default page size and SQLite's default (4 KiB). Also the replay of an
// already written table (every event `unchanged`).
//
// Counters: items_per_second (records/s over the Write calls only; generating events is not
// timed), bytes_per_second (record bodies), and vs_raw = sink records/s / raw records/s for the
// same order (present when the raw benchmark ran first in the same process).
//
// The PostgreSQL sink writes the same 1,000,000 events (same generator, same batches) into a fresh
// database on the server named by ATFILL_BENCH_PG (else ATFILL_TEST_PG; an admin connection string
// in key=value form, such as "host=127.0.0.1 port=55432 user=postgres dbname=postgres";
// tools/pgserver starts a server), crawl and interleaved order, and the replay; vs_sqlite = its
// records/s / the SQLite sink's (default page size) for the same order, when that ran first in the
// same process. Without a server those benchmarks report an error and the SQLite ones still run.
#include <benchmark/benchmark.h>
#include <libpq-fe.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "atproto/cid.hpp"
#include "base/bytes.hpp"
#include "pipeline/event.hpp"
#include "sinks/postgres_sink.hpp"
#include "sinks/sqlite_sink.hpp"

namespace atfill::sinks {
namespace {

using pipeline::Event;
using pipeline::RecordEvent;

constexpr int kRecords = 1'000'000;
constexpr int kDids = 10'000;
constexpr int kBatch = 5'000;
constexpr std::array<const char*, 3> kCollections = {"app.bsky.feed.post", "app.bsky.feed.like",
                                                     "app.bsky.graph.follow"};
constexpr int64_t kNowUs = 1'796'029'200'000'000;

enum class Order { kCrawl = 0, kInterleaved = 1 };

const char* OrderName(Order order) { return order == Order::kCrawl ? "crawl" : "interleaved"; }

// A TID: 53 bits of microseconds and 10 bits of clock id, base32-sortable, 13 characters.
std::string Tid(uint64_t micros) {
  static constexpr char kAlphabet[] = "234567abcdefghijklmnopqrstuvwxyz";
  uint64_t v = (micros & ((1ULL << 53) - 1)) << 10;
  std::string out(13, '2');
  for (int i = 12; i >= 0; --i) {
    out[static_cast<size_t>(i)] = kAlphabet[v & 31];
    v >>= 5;
  }
  return out;
}

std::string DidName(int index) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "did:plc:bench%019d", index);  // 32 characters, as did:plc
  return buf;
}

// Deterministic events: record k (0 <= k < kRecords) is always the same event.
class Generator {
 public:
  explicit Generator(Order order) : order_(order) {
    std::mt19937_64 rng(20261130);
    if (order_ == Order::kInterleaved) {
      did_of_.resize(kRecords);
      for (int& d : did_of_) d = static_cast<int>(rng() % kDids);
    }
    for (int d = 0; d < kDids; ++d) dids_.push_back(DidName(d));
  }

  int DidOf(int k) const {
    return order_ == Order::kCrawl ? k / (kRecords / kDids) : did_of_[static_cast<size_t>(k)];
  }

  // Overwrites `batch` (kBatch events) with records [first, first + kBatch), reusing its strings.
  void Fill(int first, std::vector<Event>* batch, uint64_t* body_bytes) const {
    batch->resize(kBatch, Event(RecordEvent{}));
    for (int i = 0; i < kBatch; ++i) {
      const int k = first + i;
      RecordEvent& e = std::get<RecordEvent>((*batch)[static_cast<size_t>(i)]);
      const size_t c = static_cast<size_t>(k) % kCollections.size();
      e.did = dids_[static_cast<size_t>(DidOf(k))];
      e.collection = kCollections[c];
      e.operation = pipeline::Operation::kCreate;
      e.rkey = Tid(static_cast<uint64_t>(kNowUs) - kRecords + static_cast<uint64_t>(k));
      e.rev = e.rkey;
      e.created_at = "2024-11-05T21:14:09.387Z";
      e.body.clear();
      e.body += R"({"$type":")";
      e.body += kCollections[c];
      e.body += R"(","text":"record )";
      e.body += std::to_string(k);
      e.body += ' ';
      e.body.append(320, 'x');
      e.body += R"(","createdAt":")";
      e.body += e.created_at;
      e.body += R"("})";
      e.cid = atproto::Cid::Compute(atproto::Cid::Codec::kDagCbor, AsBytes(e.body));
      e.position = static_cast<uint64_t>(k);
      *body_bytes += e.body.size();
    }
  }

  const std::vector<std::string>& dids() const { return dids_; }

 private:
  Order order_;
  std::vector<int> did_of_;
  std::vector<std::string> dids_;
};

const Generator& GeneratorFor(Order order) {
  static const Generator crawl(Order::kCrawl);
  static const Generator interleaved(Order::kInterleaved);
  return order == Order::kCrawl ? crawl : interleaved;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "atfill_sink_bench_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const char* name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Raw records/s by (order, page size).
std::map<std::pair<Order, int64_t>, double>& RawRates() {
  static std::map<std::pair<Order, int64_t>, double> rates;
  return rates;
}

// The SQLite sink's records/s (default page size) by order.
std::map<Order, double>& SqliteSinkRates() {
  static std::map<Order, double> rates;
  return rates;
}

// page_size 0: the sink's default.
SqliteSinkOptions BenchOptions(const std::string& path, int64_t page_size) {
  SqliteSinkOptions options;
  options.path = path;
  options.now_us = [] { return kNowUs; };
  if (page_size > 0) options.page_size_bytes = page_size;
  return options;
}

using Clock = std::chrono::steady_clock;

// Writes all kRecords through `sink`, adding up the stats; returns the seconds spent in Write.
double WriteAll(benchmark::State& state, pipeline::Sink& sink, const Generator& gen,
                uint64_t* body_bytes, pipeline::WriteStats* total) {
  std::vector<Event> batch;
  double seconds = 0;
  for (int first = 0; first < kRecords; first += kBatch) {
    gen.Fill(first, &batch, body_bytes);
    auto start = Clock::now();
    auto stats = sink.Write(batch);
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
    if (!stats.ok()) {
      state.SkipWithError(stats.status().ToString().c_str());
      return seconds;
    }
    *total += *stats;
  }
  return seconds;
}

void BM_RawInsert(benchmark::State& state) {
  const Order order = static_cast<Order>(state.range(0));
  const SqliteSinkOptions options = BenchOptions("", state.range(1));
  const Generator& gen = GeneratorFor(order);
  double total_seconds = 0;
  uint64_t body_bytes = 0;
  for (auto _ : state) {
    TempDir dir;
    const std::string path = dir.File("raw.db");
    {
      // The sink creates the schema and applies its pragmas; the loop then writes on its own.
      SqliteSinkOptions create = options;
      create.path = path;
      auto sink = OpenSqliteSink(create);
      if (!sink.ok()) return state.SkipWithError(sink.status().ToString().c_str());
    }
    sqlite3* db = nullptr;
    sqlite3_open(path.c_str(), &db);
    const std::string pragmas =
        "PRAGMA synchronous = NORMAL; PRAGMA cache_size = -" +
        std::to_string(options.cache_bytes / 1024 + 1) + "; PRAGMA wal_autocheckpoint = " +
        std::to_string(options.wal_autocheckpoint_bytes / options.page_size_bytes) + "; BEGIN";
    sqlite3_exec(db, pragmas.c_str(), nullptr, nullptr, nullptr);
    sqlite3_stmt* did = nullptr;
    sqlite3_prepare_v2(db, "INSERT INTO atfill_dids(id, did) VALUES (?1, ?2)", -1, &did, nullptr);
    for (int d = 0; d < kDids; ++d) {
      sqlite3_bind_int(did, 1, d + 1);
      sqlite3_bind_text(did, 2, gen.dids()[static_cast<size_t>(d)].c_str(), -1, SQLITE_STATIC);
      sqlite3_step(did);
      sqlite3_reset(did);
    }
    sqlite3_finalize(did);
    for (size_t c = 0; c < kCollections.size(); ++c) {
      std::string sql = "INSERT INTO atfill_collections(id, nsid) VALUES (" +
                        std::to_string(c + 1) + ", '" + kCollections[c] + "')";
      sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
    }
    sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
    sqlite3_stmt* insert = nullptr;
    sqlite3_prepare_v3(db,
                       "INSERT INTO atfill_record_rows(did_id, collection_id, rkey, cid, rev, "
                       "indexed_at, created_at, record) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                       -1, SQLITE_PREPARE_PERSISTENT, &insert, nullptr);

    // Start from clean OS buffers, so that the previous benchmark's writeback is not billed here.
    ::sync();
    std::vector<Event> batch;
    std::vector<std::string> cids(kBatch);
    std::vector<int> did_ids(kBatch);
    double seconds = 0;
    bool failed = false;
    for (int first = 0; first < kRecords && !failed; first += kBatch) {
      gen.Fill(first, &batch, &body_bytes);
      // The bound gets its ids and CID strings for free.
      for (int i = 0; i < kBatch; ++i) {
        cids[static_cast<size_t>(i)] =
            std::get<RecordEvent>(batch[static_cast<size_t>(i)]).cid.ToString();
        did_ids[static_cast<size_t>(i)] = gen.DidOf(first + i) + 1;
      }
      auto start = Clock::now();
      sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
      for (int i = 0; i < kBatch; ++i) {
        const RecordEvent& e = std::get<RecordEvent>(batch[static_cast<size_t>(i)]);
        sqlite3_bind_int(insert, 1, did_ids[static_cast<size_t>(i)]);
        sqlite3_bind_int(insert, 2, static_cast<int>((first + i) % kCollections.size()) + 1);
        sqlite3_bind_text(insert, 3, e.rkey.data(), static_cast<int>(e.rkey.size()), SQLITE_STATIC);
        const std::string& cid = cids[static_cast<size_t>(i)];
        sqlite3_bind_text(insert, 4, cid.data(), static_cast<int>(cid.size()), SQLITE_STATIC);
        sqlite3_bind_text(insert, 5, e.rev.data(), static_cast<int>(e.rev.size()), SQLITE_STATIC);
        sqlite3_bind_int64(insert, 6, kNowUs);
        sqlite3_bind_text(insert, 7, e.created_at.data(), static_cast<int>(e.created_at.size()),
                          SQLITE_STATIC);
        sqlite3_bind_text(insert, 8, e.body.data(), static_cast<int>(e.body.size()), SQLITE_STATIC);
        if (sqlite3_step(insert) != SQLITE_DONE) {
          state.SkipWithError(sqlite3_errmsg(db));
          failed = true;
          break;
        }
        sqlite3_reset(insert);
      }
      if (sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK && !failed) {
        state.SkipWithError(sqlite3_errmsg(db));
        failed = true;
      }
      seconds += std::chrono::duration<double>(Clock::now() - start).count();
    }
    sqlite3_finalize(insert);
    sqlite3_close(db);
    state.SetIterationTime(seconds);
    total_seconds += seconds;
  }
  state.SetItemsProcessed(state.iterations() * kRecords);
  state.SetBytesProcessed(static_cast<int64_t>(body_bytes));
  state.SetLabel(OrderName(order));
  if (total_seconds > 0) {
    RawRates()[{order, options.page_size_bytes}] =
        static_cast<double>(state.iterations()) * kRecords / total_seconds;
  }
}

// Times writing the events once into the fresh sink `open` makes for each iteration (every event a
// new row); returns the records/s over all iterations (0 when none ran).
double TimeFirstWrite(benchmark::State& state,
                      const std::function<Result<std::unique_ptr<pipeline::Sink>>()>& open) {
  const Order order = static_cast<Order>(state.range(0));
  const Generator& gen = GeneratorFor(order);
  double total_seconds = 0;
  uint64_t body_bytes = 0;
  for (auto _ : state) {
    auto sink = open();
    if (!sink.ok()) {
      state.SkipWithError(sink.status().ToString().c_str());
      return 0;
    }
    ::sync();
    pipeline::WriteStats total;
    double seconds = WriteAll(state, **sink, gen, &body_bytes, &total);
    if (total.inserted != kRecords) {
      state.SkipWithError("the sink did not insert every record");
      return 0;
    }
    state.SetIterationTime(seconds);
    total_seconds += seconds;
  }
  state.SetItemsProcessed(state.iterations() * kRecords);
  state.SetBytesProcessed(static_cast<int64_t>(body_bytes));
  state.SetLabel(OrderName(order));
  return total_seconds > 0 ? static_cast<double>(state.iterations()) * kRecords / total_seconds : 0;
}

void BM_SqliteSink(benchmark::State& state) {
  const Order order = static_cast<Order>(state.range(0));
  const int64_t page_size = BenchOptions("", state.range(1)).page_size_bytes;
  std::unique_ptr<TempDir> dir;
  const double rate = TimeFirstWrite(state, [&]() -> Result<std::unique_ptr<pipeline::Sink>> {
    dir = std::make_unique<TempDir>();
    return OpenSqliteSink(BenchOptions(dir->File("sink.db"), page_size));
  });
  if (rate > 0 && page_size == SqliteSinkOptions().page_size_bytes) SqliteSinkRates()[order] = rate;
  auto raw = RawRates().find({order, page_size});
  if (raw != RawRates().end() && rate > 0) state.counters["vs_raw"] = rate / raw->second;
}

// Writes the events into the sink `open` makes for each iteration, then times writing them all
// again: a table already written being replayed (after a crash, or a re-crawl), every event
// `unchanged`.
void TimeRedelivery(benchmark::State& state,
                    const std::function<Result<std::unique_ptr<pipeline::Sink>>()>& open) {
  const Order order = static_cast<Order>(state.range(0));
  const Generator& gen = GeneratorFor(order);
  uint64_t body_bytes = 0;
  for (auto _ : state) {
    auto sink = open();
    if (!sink.ok()) return state.SkipWithError(sink.status().ToString().c_str());
    uint64_t first_bytes = 0;
    pipeline::WriteStats first;
    WriteAll(state, **sink, gen, &first_bytes, &first);
    ::sync();
    pipeline::WriteStats replay;
    double seconds = WriteAll(state, **sink, gen, &body_bytes, &replay);
    if (replay.unchanged != kRecords) {
      return state.SkipWithError("the replay was not all unchanged");
    }
    state.SetIterationTime(seconds);
  }
  state.SetItemsProcessed(state.iterations() * kRecords);
  state.SetBytesProcessed(static_cast<int64_t>(body_bytes));
  state.SetLabel(OrderName(order));
}

void BM_SqliteSinkReplay(benchmark::State& state) {
  std::unique_ptr<TempDir> dir;
  TimeRedelivery(state, [&]() -> Result<std::unique_ptr<pipeline::Sink>> {
    dir = std::make_unique<TempDir>();
    return OpenSqliteSink(BenchOptions(dir->File("sink.db"), 0));
  });
}

// A fresh database on the benchmark's PostgreSQL server, dropped by the destructor.
class PgBenchDatabase {
 public:
  // Empty conninfo() when there is no server or the database could not be made; error() says why.
  PgBenchDatabase() {
    const char* env = std::getenv("ATFILL_BENCH_PG");
    if (env == nullptr || *env == '\0') env = std::getenv("ATFILL_TEST_PG");
    if (env == nullptr || *env == '\0') {
      error_ =
          "no PostgreSQL server: set ATFILL_BENCH_PG (or ATFILL_TEST_PG) to an admin connection "
          "string, e.g. after tools/pgserver start /tmp/pgbench 55433: \"host=127.0.0.1 "
          "port=55433 user=postgres dbname=postgres\"";
      return;
    }
    admin_ = env;
    name_ = "atfill_bench_" + std::to_string(::getpid());
    if (!Admin("DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)") ||
        !Admin("CREATE DATABASE " + name_)) {
      return;
    }
    // Later keywords override earlier ones: the admin string's database is replaced.
    conninfo_ = admin_ + " dbname=" + name_;
  }
  ~PgBenchDatabase() {
    if (!conninfo_.empty()) Admin("DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)");
  }
  const std::string& conninfo() const { return conninfo_; }
  const std::string& error() const { return error_; }

 private:
  bool Admin(const std::string& sql) {
    PGconn* conn = PQconnectdb(admin_.c_str());
    PQsetNoticeProcessor(
        conn, [](void*, const char*) {}, nullptr);
    bool ok = PQstatus(conn) == CONNECTION_OK;
    if (ok) {
      PGresult* r = PQexec(conn, sql.c_str());
      ok = PQresultStatus(r) == PGRES_COMMAND_OK;
      PQclear(r);
    }
    if (!ok) error_ = sql + ": " + PQerrorMessage(conn);
    PQfinish(conn);
    return ok;
  }
  std::string admin_;
  std::string name_;
  std::string conninfo_;
  std::string error_;
};

PostgresSinkOptions PgBenchOptions(const std::string& conninfo) {
  PostgresSinkOptions options;
  options.conninfo = conninfo;
  options.now_us = [] { return kNowUs; };
  return options;
}

void BM_PostgresSink(benchmark::State& state) {
  const Order order = static_cast<Order>(state.range(0));
  std::unique_ptr<PgBenchDatabase> db;
  const double rate = TimeFirstWrite(state, [&]() -> Result<std::unique_ptr<pipeline::Sink>> {
    db.reset();  // the previous iteration's sink is closed: drop its database first
    db = std::make_unique<PgBenchDatabase>();
    if (db->conninfo().empty()) return Status::Unavailable(db->error());
    return OpenPostgresSink(PgBenchOptions(db->conninfo()));
  });
  auto sqlite = SqliteSinkRates().find(order);
  if (sqlite != SqliteSinkRates().end() && rate > 0)
    state.counters["vs_sqlite"] = rate / sqlite->second;
}

void BM_PostgresSinkReplay(benchmark::State& state) {
  std::unique_ptr<PgBenchDatabase> db;
  TimeRedelivery(state, [&]() -> Result<std::unique_ptr<pipeline::Sink>> {
    db.reset();  // the previous iteration's sink is closed: drop its database first
    db = std::make_unique<PgBenchDatabase>();
    if (db->conninfo().empty()) return Status::Unavailable(db->error());
    return OpenPostgresSink(PgBenchOptions(db->conninfo()));
  });
}

// Each sink configuration right after its raw bound, so that it can report the ratio and both run
// under the same conditions. Arguments: order (0 crawl, 1 interleaved) and page size (bytes; 0 is
// the sink's default).
void Configure(benchmark::internal::Benchmark* b, int order, int page) {
  b->ArgNames({"order", "page"})
      ->Args({order, page})
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_RawInsert)->Apply([](auto* b) { Configure(b, 0, 0); });
BENCHMARK(BM_SqliteSink)->Apply([](auto* b) { Configure(b, 0, 0); });
BENCHMARK(BM_RawInsert)->Apply([](auto* b) { Configure(b, 0, 4096); });
BENCHMARK(BM_SqliteSink)->Apply([](auto* b) { Configure(b, 0, 4096); });
BENCHMARK(BM_RawInsert)->Apply([](auto* b) { Configure(b, 1, 0); });
BENCHMARK(BM_SqliteSink)->Apply([](auto* b) { Configure(b, 1, 0); });
BENCHMARK(BM_RawInsert)->Apply([](auto* b) { Configure(b, 1, 4096); });
BENCHMARK(BM_SqliteSink)->Apply([](auto* b) { Configure(b, 1, 4096); });
BENCHMARK(BM_SqliteSinkReplay)
    ->ArgName("order")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
// After the SQLite sink's runs, for vs_sqlite.
BENCHMARK(BM_PostgresSink)
    ->ArgName("order")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PostgresSinkReplay)
    ->ArgName("order")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace atfill::sinks
