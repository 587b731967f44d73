// The SQLite sink as its table grows: create events from 1,000,000 accounts interleaved as a live
// stream or an archive delivers them (each event from an account drawn at random, record keys TIDs
// of the event's time, so increasing with time), written into ONE database in a backlog's batches
// (50,000 events per Write, as the live consumer and `atfill ingest` hand them to the sink while
// they catch up: [live] and [files] batch_records), reported per window of rows. The events go to
// the sink directly: the engine's parse, CID check and guard cost the same at every table size, so
// leaving them out shows the part that grows.
//
// Benchmarks, in this order:
//  * BM_RepoOrder: the reference, in a database of its own: a window of rows in repo order
//    (10,000 accounts one after another, each with record keys from all of its history) into an
//    empty table.
//  * BM_RepoRaw/bulk:B: the raw bound of BM_RepoOrder, in the same run: the same rows in the same
//    order and batches, written by a bare prepared-statement loop (one row per INSERT, or
//    ATFILL_SCALE_RAW_PER_INSERT, one transaction per batch, accounts interned beforehand) into the
//    sink's schema: B=0 its final layout, B=1 the bulk-load layout, whose indexes are built at the
//    end (timed with the loop). Counters: sink_over_raw (BM_RepoOrder's events/s over this one's).
//  * BM_Interleaved/window:N: rows (N-1)*window .. N*window of the growing table. Counters per
//    window: items_per_second (events/s over the Write calls), cpu_s (process CPU during them,
//    every thread), cpu_us_per_event, peak_rss_mb (VmHWM, reset at the start of the window),
//    disk_bytes_per_record (database + WAL file / rows so far), db_bytes_per_record (database
//    file only), read_bytes_per_event and written_bytes_per_event (what the process read from
//    and wrote to the storage layer during the window, /proc/self/io: reads the page cache served
//    are not counted), vs_repo (events/s / BM_RepoOrder's). Run it in a memory limit smaller
//    than the table (bench/memory_limited) to see the table outgrow its page cache.
//  * BM_Query/<name>: the queries users run, on the final table (warm cache, LIMIT 20), through
//    the atfill_records view.
//  * With ATFILL_SCALE_PG set, the same stream into the PostgreSQL sink:
//    BM_PgInterleaved/window:N (the counters of BM_Interleaved, with server_cpu_s, the CPU of
//    the server's processes during the window when the server runs on this machine,
//    server_read_bytes_per_event and server_written_bytes_per_event from their /proc/<pid>/io,
//    and cpu_us_per_event counting client and server; bytes per record are the record table's and
//    its indexes' as PostgreSQL counts them) and BM_PgQuery/<name> (the same queries through the
//    view, as prepared statements with every value a parameter).
//
// Environment:
//   ATFILL_SCALE_ROWS         rows to write (default 1,000,000)
//   ATFILL_SCALE_WINDOW       rows per reported window (default 1,000,000)
//   ATFILL_SCALE_ACCOUNTS     accounts of the stream (default 1,000,000)
//   ATFILL_SCALE_REPO_ROWS    rows of the repo-order reference (default: one window)
//   ATFILL_SCALE_REPO_ACCOUNTS  accounts of the repo-order reference, 100 records each, then
//                             the same accounts again (default 10,000)
//   ATFILL_SCALE_MAX_SECONDS  stop after the window in which the Write calls passed this many
//                             seconds in all (default 0: no limit)
//   ATFILL_SCALE_DIR          folder for the databases, kept afterwards (default: a scratch
//                             folder removed at exit)
//   ATFILL_SCALE_SETUP_SQL    a file of SQL run on each new database before the sink opens it: to
//                             measure another layout with the same sink (it must leave the schema
//                             at the sink's version, atfill_schema_version included)
//   ATFILL_SCALE_CACHE_MB     the sink's page cache (default: SqliteSinkOptions' default)
//   ATFILL_SCALE_WAL_MB       the sink's WAL size that starts a checkpoint (default:
//                             SqliteSinkOptions' default)
//   ATFILL_SCALE_PAGE_SIZE    the page size of the new databases, bytes (default: the sink's)
//   ATFILL_SCALE_BATCH        events per sink batch (default 50,000: [live] and [files]
//                             batch_records; [engine]'s default is 5,000)
//   ATFILL_SCALE_REPO_BATCH   events per sink batch of the repo-order runs (default:
//                             ATFILL_SCALE_BATCH; a crawl commits [crawl] batch_records, 50,000)
//   ATFILL_SCALE_CHECKPOINT   inline: the sinks checkpoint inside their COMMIT instead of on
//                             their checkpoint thread
//   ATFILL_BENCH_SQLITE_COMPRESS  1: the sinks compress bodies, 0: text (unset: the sink's
//                             default, text)
//   ATFILL_SCALE_BULK         1: BM_RepoOrder's sink loads with bulk_load (a fresh backfill's
//                             layout, indexes built when the sink closes, timed with the writes)
//   ATFILL_SCALE_PG           a libpq connection string: run the PostgreSQL benchmarks there, in
//                             schema ATFILL_SCALE_PG_SCHEMA (default atfill_scale_bench), dropped
//                             and created anew at the start and kept afterwards (to EXPLAIN)
//   ATFILL_SCALE_PG_SETUP_SQL a file of SQL run in that new schema (it is the search_path) before
//                             the sink opens it: another layout with the same sink
//   ATFILL_SCALE_PG_KEEP      1: keep the schema and its rows instead, the setup file unused (a
//                             table an earlier run made, grown by bench/scale_pg_append.sql,
//                             say); the stream goes on from the event after as many as the table
//                             holds rows, so its record keys are new (but for a few: the events
//                             that updated a profile made no row), and ATFILL_SCALE_ROWS more
//                             rows are written, rows_total counting those already there
//
//   ATFILL_SCALE_PG="host=127.0.0.1 port=15470 user=postgres dbname=postgres"
//     build/bench/scale_bench --benchmark_filter=Pg             (the variable set for the run)

//   build/bench/scale_bench                                (Release build)
//   ATFILL_SCALE_ROWS=10000000 build/bench/scale_bench
#include <benchmark/benchmark.h>
#include <libpq-fe.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "atproto/cid.hpp"
#include "base/bytes.hpp"
#include "bench/bench_util.hpp"
#include "pipeline/event.hpp"
#include "pipeline/sink.hpp"
#include "sinks/postgres_sink.hpp"
#include "sinks/sqlite_functions.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/components.hpp"

namespace atfill {
namespace {

namespace fs = std::filesystem;
using pipeline::Event;
using pipeline::RecordEvent;

uint32_t RepoAccounts();
// The stream's clock: the first event's time and the gap between two events (one event every
// 500 us, about the live firehose's pace).
constexpr int64_t kStreamStartUs = 1'780'000'000'000'000;
constexpr int64_t kStreamStepUs = 500;

struct Config {
  uint64_t rows = bench::EnvUint("ATFILL_SCALE_ROWS", 1'000'000);
  uint64_t window = std::max<uint64_t>(1, bench::EnvUint("ATFILL_SCALE_WINDOW", 1'000'000));
  uint32_t accounts = static_cast<uint32_t>(bench::EnvUint("ATFILL_SCALE_ACCOUNTS", 1'000'000));
  uint64_t repo_rows = bench::EnvUint("ATFILL_SCALE_REPO_ROWS", std::min(rows, window));
  double max_seconds = static_cast<double>(bench::EnvUint("ATFILL_SCALE_MAX_SECONDS", 0));
  uint64_t cache_mb = bench::EnvUint("ATFILL_SCALE_CACHE_MB", 0);
  uint64_t wal_mb = bench::EnvUint("ATFILL_SCALE_WAL_MB", 0);
  int64_t page_size = static_cast<int64_t>(bench::EnvUint(
      "ATFILL_SCALE_PAGE_SIZE", static_cast<uint64_t>(sinks::SqliteSinkOptions{}.page_size_bytes)));
  bool bulk = bench::EnvUint("ATFILL_SCALE_BULK", 0) != 0;
  // Events per sink batch: a backlog's (an ingest's, [files] batch_records; the live consumer's
  // is the same), and the repo-order runs' (the same unless set).
  uint64_t batch = std::max<uint64_t>(
      1, bench::EnvUint("ATFILL_SCALE_BATCH", sources::SourceSettings{}.files_batch.max_events));
  uint64_t repo_batch = std::max<uint64_t>(1, bench::EnvUint("ATFILL_SCALE_REPO_BATCH", batch));
};

const Config& Cfg() {
  static const Config config;
  return config;
}

uint32_t RepoAccounts() {
  static const auto accounts = static_cast<uint32_t>(
      std::max<uint64_t>(1, bench::EnvUint("ATFILL_SCALE_REPO_ACCOUNTS", 10'000)));
  return accounts;
}

fs::path Dir() {
  if (const char* d = std::getenv("ATFILL_SCALE_DIR"); d != nullptr && *d != '\0') {
    fs::create_directories(d);
    return d;
  }
  return bench::WorkDir("scale-bench");
}

// A TID: 53 bits of microseconds and 10 bits of clock id, base32-sortable, 13 characters.
std::string Tid(int64_t micros, uint32_t clock_id) {
  static constexpr char kAlphabet[] = "234567abcdefghijklmnopqrstuvwxyz";
  uint64_t v = ((static_cast<uint64_t>(micros) & ((1ULL << 53) - 1)) << 10) | (clock_id & 1023);
  std::string out(13, '2');
  for (int i = 12; i >= 0; --i) {
    out[static_cast<size_t>(i)] = kAlphabet[v & 31];
    v >>= 5;
  }
  return out;
}

// "did:plc:" and 24 base32 characters, spread over the alphabet as real did:plc are.
std::string DidName(uint32_t index) {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz234567";
  uint64_t h = (static_cast<uint64_t>(index) + 1) * 0x9E3779B97F4A7C15ULL;
  std::string out = "did:plc:";
  for (int i = 0; i < 24; ++i) {
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    out += kAlphabet[(h >> 40) & 31];
  }
  return out;
}

// "2026-05-28T21:46:40.123Z" for unix microseconds.
std::string IsoTime(int64_t micros) {
  const std::time_t secs = static_cast<std::time_t>(micros / 1'000'000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>((micros / 1000) % 1000));
  return buf;
}

// The network's mix of collections, roughly: likes most, then follows, posts, reposts, blocks and
// a few profile writes (record key "self", the one key that is not a TID).
struct Collection {
  const char* nsid;
  int weight;
};
constexpr std::array<Collection, 6> kMix = {{{"app.bsky.feed.like", 55},
                                             {"app.bsky.graph.follow", 15},
                                             {"app.bsky.feed.post", 15},
                                             {"app.bsky.feed.repost", 11},
                                             {"app.bsky.graph.block", 3},
                                             {"app.bsky.actor.profile", 1}}};

// Deterministic events; the same seed gives the same stream.
class Stream {
 public:
  // `first`: the index of the first event, as if that many had come before (its time follows).
  Stream(uint32_t accounts, bool repo_order, uint64_t seed, uint64_t first = 0)
      : accounts_(accounts), repo_order_(repo_order), rng_(seed + first), counter_(first) {
    for (const auto& c : kMix) total_weight_ += c.weight;
  }

  // Overwrites `batch` with the next `n` events.
  void Fill(size_t n, std::vector<Event>* batch, uint64_t* body_bytes) {
    batch->resize(n, Event(RecordEvent{}));
    for (size_t i = 0; i < n; ++i) {
      Next(&std::get<RecordEvent>((*batch)[i]));
      *body_bytes += std::get<RecordEvent>((*batch)[i]).body.size();
    }
  }

 private:
  void Next(RecordEvent* e) {
    const uint64_t k = counter_++;
    uint32_t account;
    int64_t time_us;
    if (repo_order_) {
      // Runs of 100 records per account, each run's keys from two years of the account's history.
      account = static_cast<uint32_t>((k / 100) % accounts_);
      if (k % 100 == 0) {
        history_.clear();
        for (int j = 0; j < 100; ++j) {
          history_.push_back(kStreamStartUs -
                             static_cast<int64_t>(rng_() % (2ULL * 365 * 86400 * 1'000'000)));
        }
        std::sort(history_.begin(), history_.end());
      }
      time_us = history_[k % 100];
    } else {
      account = static_cast<uint32_t>(rng_() % accounts_);
      time_us = kStreamStartUs + static_cast<int64_t>(k) * kStreamStepUs;
    }
    int pick = static_cast<int>(rng_() % static_cast<uint64_t>(total_weight_));
    size_t c = 0;
    while (pick >= kMix[c].weight) pick -= kMix[c++].weight;
    const std::string nsid = kMix[c].nsid;

    e->did = DidName(account);
    e->collection = nsid;
    e->operation = pipeline::Operation::kCreate;
    e->rkey = nsid == "app.bsky.actor.profile" ? "self"
                                               : Tid(time_us, static_cast<uint32_t>(rng_() % 1024));
    e->rev = Tid(time_us, 0);
    e->created_at = IsoTime(time_us);
    e->position = k;
    std::string& b = e->body;
    b.clear();
    b += R"({"$type":")";
    b += nsid;
    b += '"';
    if (nsid == "app.bsky.feed.like" || nsid == "app.bsky.feed.repost") {
      b += R"(,"subject":{"cid":"bafyreig)";
      for (int i = 0; i < 51; ++i) b += static_cast<char>('a' + rng_() % 26);
      b += R"(","uri":"at://)";
      b += DidName(static_cast<uint32_t>(rng_() % accounts_));
      b += "/app.bsky.feed.post/";
      b += Tid(time_us - static_cast<int64_t>(rng_() % 86'400'000'000ULL), 0);
      b += R"("})";
    } else if (nsid == "app.bsky.graph.follow" || nsid == "app.bsky.graph.block") {
      b += R"(,"subject":")";
      b += DidName(static_cast<uint32_t>(rng_() % accounts_));
      b += '"';
    } else if (nsid == "app.bsky.feed.post") {
      b += R"(,"langs":["en"],"text":")";
      const int words = 3 + static_cast<int>(rng_() % 40);
      for (int w = 0; w < words; ++w) {
        if (w > 0) b += ' ';
        const int len = 2 + static_cast<int>(rng_() % 8);
        for (int i = 0; i < len; ++i) b += static_cast<char>('a' + rng_() % 26);
      }
      b += '"';
    } else {
      b += R"(,"displayName":"account )";
      b += std::to_string(account);
      b += R"(","description":"a profile")";
    }
    b += R"(,"createdAt":")";
    b += e->created_at;
    b += R"("})";
    e->cid = atproto::Cid::Compute(atproto::Cid::Codec::kDagCbor, AsBytes(b));
  }

  uint32_t accounts_;
  bool repo_order_;
  std::mt19937_64 rng_;
  int total_weight_ = 0;
  uint64_t counter_ = 0;
  std::vector<int64_t> history_;
};

uint64_t FileSize(const fs::path& p) {
  std::error_code ec;
  const auto n = fs::file_size(p, ec);
  return ec ? 0 : n;
}

// A new database at `path` (any older one removed), the setup SQL applied, opened by the sink.
Result<std::unique_ptr<pipeline::Sink>> NewDatabase(const fs::path& path, bool bulk = false) {
  for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(path.string() + suffix);
  if (const char* setup = std::getenv("ATFILL_SCALE_SETUP_SQL"); setup != nullptr && *setup) {
    std::ifstream in(setup);
    std::stringstream sql;
    sql << in.rdbuf();
    sqlite3* db = nullptr;
    sqlite3_open(path.c_str(), &db);
    // The sink's page size only applies to an empty file, so set it here as the sink would.
    const std::string pragmas =
        "PRAGMA page_size = " + std::to_string(Cfg().page_size) + "; PRAGMA journal_mode = WAL;";
    char* err = nullptr;
    int rc = sqlite3_exec(db, pragmas.c_str(), nullptr, nullptr, &err);
    if (rc == SQLITE_OK) rc = sqlite3_exec(db, sql.str().c_str(), nullptr, nullptr, &err);
    std::string message = err != nullptr ? err : "";
    sqlite3_free(err);
    sqlite3_close(db);
    if (rc != SQLITE_OK) return Status::Invalid("ATFILL_SCALE_SETUP_SQL: " + message);
  }
  sinks::SqliteSinkOptions options;
  options.path = path.string();
  options.page_size_bytes = Cfg().page_size;
  if (Cfg().cache_mb > 0) options.cache_bytes = static_cast<int64_t>(Cfg().cache_mb) << 20;
  if (Cfg().wal_mb > 0) {
    options.wal_autocheckpoint_bytes = static_cast<int64_t>(Cfg().wal_mb) << 20;
  }
  options.bulk_load = bulk;
  options.compress = bench::SqliteCompress(options.compress);
  if (const char* c = std::getenv("ATFILL_SCALE_CHECKPOINT")) {
    options.background_checkpoint = std::string(c) != "inline";
  }
  return sinks::OpenSqliteSink(options);
}

// What one run of windows measured: the Write calls' wall and process CPU seconds.
struct Span {
  double seconds = 0;
  double cpu = 0;
  uint64_t rows = 0;
  uint64_t body_bytes = 0;
};

// Writes `rows` events of `stream` into `sink` in batches of `batch_events`, timing only the Write
// calls.
Status WriteRows(pipeline::Sink* sink, Stream* stream, uint64_t rows, Span* span,
                 uint64_t batch_events = Cfg().batch) {
  std::vector<Event> batch;
  for (uint64_t done = 0; done < rows;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(batch_events, rows - done));
    stream->Fill(n, &batch, &span->body_bytes);
    const double cpu0 = bench::ProcessCpuSeconds();
    const auto t0 = std::chrono::steady_clock::now();
    auto stats = sink->Write(batch);
    span->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    span->cpu += bench::ProcessCpuSeconds() - cpu0;
    if (!stats.ok()) return stats.status();
    done += n;
    span->rows += stats->inserted + stats->updated + stats->unchanged;
  }
  return Status::OK();
}

double& RepoRate() {
  static double rate = 0;
  return rate;
}

void BM_RepoOrder(benchmark::State& state) {
  const uint64_t rows = Cfg().repo_rows;
  for (auto _ : state) {
    const fs::path path = Dir() / "repo_order.db";
    auto sink = NewDatabase(path, Cfg().bulk);
    if (!sink.ok()) return state.SkipWithError(sink.status().ToString().c_str());
    Stream stream(RepoAccounts(), /*repo_order=*/true, 7);
    Span span;
    if (Status st = WriteRows(sink->get(), &stream, rows, &span, Cfg().repo_batch); !st.ok()) {
      return state.SkipWithError(st.ToString().c_str());
    }
    // A bulk load builds its indexes when the sink closes: part of the load's time.
    const double cpu0 = bench::ProcessCpuSeconds();
    const auto t0 = std::chrono::steady_clock::now();
    sink->reset();
    const double close_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    span.cpu += bench::ProcessCpuSeconds() - cpu0;
    span.seconds += close_s;
    state.counters["close_s"] = close_s;
    state.counters["db_bytes_per_record"] =
        static_cast<double>(FileSize(path)) / static_cast<double>(rows);
    state.SetIterationTime(span.seconds);
    RepoRate() = static_cast<double>(rows) / span.seconds;
    state.counters["cpu_s"] = span.cpu;
    state.counters["cpu_us_per_event"] = span.cpu * 1e6 / static_cast<double>(rows);
    state.counters["avg_body_bytes"] =
        static_cast<double>(span.body_bytes) / static_cast<double>(rows);
    for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(path.string() + suffix);
  }
  state.SetItemsProcessed(static_cast<int64_t>(rows * state.iterations()));
  state.SetLabel(Cfg().bulk ? "repo order, empty table, bulk load" : "repo order, empty table");
}

void BM_RepoRaw(benchmark::State& state) {
  const bool bulk = state.range(0) != 0;
  const uint64_t rows = Cfg().repo_rows;
  for (auto _ : state) {
    const fs::path path = Dir() / "repo_raw.db";
    // The sink creates the schema (in the bulk layout when asked) and, closing, builds a bulk
    // load's indexes; the loop writes between on a connection of its own.
    auto sink = NewDatabase(path, bulk);
    if (!sink.ok()) return state.SkipWithError(sink.status().ToString().c_str());
    sqlite3* db = nullptr;
    sqlite3_open(path.c_str(), &db);
    const sinks::SqliteSinkOptions defaults;
    const int64_t cache =
        Cfg().cache_mb > 0 ? static_cast<int64_t>(Cfg().cache_mb) << 20 : defaults.cache_bytes;
    const std::string pragmas = "PRAGMA synchronous = NORMAL; PRAGMA cache_size = -" +
                                std::to_string(cache / 1024) + "; PRAGMA wal_autocheckpoint = " +
                                std::to_string(defaults.wal_autocheckpoint_bytes / Cfg().page_size);
    sqlite3_exec(db, pragmas.c_str(), nullptr, nullptr, nullptr);
    sqlite3_stmt* did_insert = nullptr;
    sqlite3_prepare_v2(db, "INSERT INTO atfill_dids(id, did) VALUES (?1, ?2)", -1, &did_insert,
                       nullptr);
    sqlite3_stmt* coll_insert = nullptr;
    sqlite3_prepare_v2(db, "INSERT INTO atfill_collections(id, nsid) VALUES (?1, ?2)", -1,
                       &coll_insert, nullptr);
    sqlite3_stmt* s = nullptr;
    // The stream repeats a few keys (profiles' "self"): kept as the sink keeps the first.
    const std::string insert =
        bench::RecordInsertSql(1) + " ON CONFLICT (collection_id, rkey, did_id) DO NOTHING";
    sqlite3_prepare_v2(db, insert.c_str(), -1, &s, nullptr);
    // ATFILL_SCALE_RAW_PER_INSERT rows per INSERT (default 1): the sink inserts 32.
    const size_t per_insert =
        std::max<uint64_t>(1, bench::EnvUint("ATFILL_SCALE_RAW_PER_INSERT", 1));
    sqlite3_stmt* multi = nullptr;
    const std::string multi_sql = bench::RecordInsertSql(per_insert) +
                                  " ON CONFLICT (collection_id, rkey, did_id) DO NOTHING";
    sqlite3_prepare_v2(db, multi_sql.c_str(), -1, &multi, nullptr);
    std::unordered_map<std::string, int64_t> dids, collections;
    Stream stream(RepoAccounts(), /*repo_order=*/true, 7);
    std::vector<Event> batch;
    std::vector<std::pair<int64_t, int64_t>> ids;
    std::vector<std::string> cids;
    auto bind = [&](sqlite3_stmt* st, int first, size_t i) {
      const auto& e = std::get<RecordEvent>(batch[i]);
      sqlite3_bind_int64(st, first + 1, ids[i].first);
      sqlite3_bind_int64(st, first + 2, ids[i].second);
      sqlite3_bind_text(st, first + 3, e.rkey.data(), static_cast<int>(e.rkey.size()),
                        SQLITE_STATIC);
      sqlite3_bind_text(st, first + 4, cids[i].data(), static_cast<int>(cids[i].size()),
                        SQLITE_STATIC);
      sqlite3_bind_text(st, first + 5, e.rev.data(), static_cast<int>(e.rev.size()), SQLITE_STATIC);
      sqlite3_bind_int64(st, first + 6, kStreamStartUs);
      sqlite3_bind_text(st, first + 7, e.created_at.data(), static_cast<int>(e.created_at.size()),
                        SQLITE_STATIC);
      sqlite3_bind_text(st, first + 8, e.body.data(), static_cast<int>(e.body.size()),
                        SQLITE_STATIC);
    };
    uint64_t body_bytes = 0;
    double seconds = 0;
    const double cpu0 = bench::ProcessCpuSeconds();
    double untimed_cpu = 0;
    for (uint64_t done = 0; done < rows;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(Cfg().repo_batch, rows - done));
      const double g0 = bench::ProcessCpuSeconds();
      stream.Fill(n, &batch, &body_bytes);
      ids.clear();
      cids.clear();
      sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
      for (const Event& ev : batch) {
        const auto& e = std::get<RecordEvent>(ev);
        auto d = dids.emplace(e.did, static_cast<int64_t>(dids.size()) + 1);
        if (d.second) {
          sqlite3_bind_int64(did_insert, 1, d.first->second);
          sqlite3_bind_text(did_insert, 2, e.did.data(), static_cast<int>(e.did.size()),
                            SQLITE_STATIC);
          sqlite3_step(did_insert);
          sqlite3_reset(did_insert);
        }
        auto c = collections.emplace(e.collection, static_cast<int64_t>(collections.size()) + 1);
        if (c.second) {
          sqlite3_bind_int64(coll_insert, 1, c.first->second);
          sqlite3_bind_text(coll_insert, 2, e.collection.data(),
                            static_cast<int>(e.collection.size()), SQLITE_STATIC);
          sqlite3_step(coll_insert);
          sqlite3_reset(coll_insert);
        }
        ids.emplace_back(d.first->second, c.first->second);
        cids.push_back(e.cid.ToString());
      }
      sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
      untimed_cpu += bench::ProcessCpuSeconds() - g0;
      const auto t0 = std::chrono::steady_clock::now();
      sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
      size_t i = 0;
      for (; per_insert > 1 && i + per_insert <= n; i += per_insert) {
        for (size_t k = 0; k < per_insert; ++k) bind(multi, static_cast<int>(k) * 8, i + k);
        if (sqlite3_step(multi) != SQLITE_DONE) {
          state.SkipWithError(sqlite3_errmsg(db));
          break;
        }
        sqlite3_reset(multi);
      }
      for (; i < n; ++i) {
        bind(s, 0, i);
        if (sqlite3_step(s) != SQLITE_DONE) {
          state.SkipWithError(sqlite3_errmsg(db));
          break;
        }
        sqlite3_reset(s);
      }
      sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      done += n;
    }
    sqlite3_finalize(s);
    sqlite3_finalize(multi);
    sqlite3_finalize(did_insert);
    sqlite3_finalize(coll_insert);
    sqlite3_close(db);
    const auto t0 = std::chrono::steady_clock::now();
    sink->reset();
    const double close_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    seconds += close_s;
    const double cpu = bench::ProcessCpuSeconds() - cpu0 - untimed_cpu;
    state.SetIterationTime(seconds);
    state.counters["close_s"] = close_s;
    state.counters["cpu_us_per_event"] = cpu * 1e6 / static_cast<double>(rows);
    const double rate = static_cast<double>(rows) / seconds;
    if (RepoRate() > 0) state.counters["sink_over_raw"] = RepoRate() / rate;
    for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(path.string() + suffix);
  }
  state.SetItemsProcessed(static_cast<int64_t>(rows * state.iterations()));
  state.SetLabel(bulk ? "repo order, bare loop, bulk layout" : "repo order, bare loop");
}

// The growing table, shared by the windows.
struct Growing {
  fs::path path;
  std::unique_ptr<pipeline::Sink> sink;
  std::unique_ptr<Stream> stream;
  uint64_t rows = 0;
  double seconds = 0;  // Write time of every window so far
  bool stopped = false;
};

Growing& Table() {
  static Growing g;
  return g;
}

void BM_Interleaved(benchmark::State& state) {
  Growing& g = Table();
  if (g.stopped) return state.SkipWithError("stopped (ATFILL_SCALE_MAX_SECONDS or an error)");
  if (g.sink == nullptr) {
    g.path = Dir() / "interleaved.db";
    auto sink = NewDatabase(g.path);
    if (!sink.ok()) {
      g.stopped = true;
      return state.SkipWithError(sink.status().ToString().c_str());
    }
    g.sink = std::move(*sink);
    g.stream = std::make_unique<Stream>(Cfg().accounts, /*repo_order=*/false, 11);
  }
  const uint64_t rows = std::min(Cfg().window, Cfg().rows - g.rows);
  for (auto _ : state) {
    bench::ResetPeakRss();
    Span span;
    const bench::IoBytes io0 = bench::ProcessIo("/proc/self");
    Status st = WriteRows(g.sink.get(), g.stream.get(), rows, &span);
    const bench::IoBytes io1 = bench::ProcessIo("/proc/self");
    if (!st.ok()) {
      g.stopped = true;
      return state.SkipWithError(st.ToString().c_str());
    }
    g.rows += rows;
    g.seconds += span.seconds;
    state.SetIterationTime(span.seconds);
    const double rate = static_cast<double>(rows) / span.seconds;
    state.counters["read_bytes_per_event"] = (io1.read - io0.read) / static_cast<double>(rows);
    state.counters["written_bytes_per_event"] =
        (io1.written - io0.written) / static_cast<double>(rows);
    const double db = static_cast<double>(FileSize(g.path));
    const double wal = static_cast<double>(FileSize(g.path.string() + "-wal"));
    state.counters["rows_total"] = static_cast<double>(g.rows);
    state.counters["cpu_s"] = span.cpu;
    state.counters["cpu_us_per_event"] = span.cpu * 1e6 / static_cast<double>(rows);
    state.counters["peak_rss_mb"] = static_cast<double>(bench::StatusKb("VmHWM")) / 1024.0;
    state.counters["disk_bytes_per_record"] = (db + wal) / static_cast<double>(g.rows);
    state.counters["db_bytes_per_record"] = db / static_cast<double>(g.rows);
    state.counters["avg_body_bytes"] =
        static_cast<double>(span.body_bytes) / static_cast<double>(rows);
    if (RepoRate() > 0) state.counters["vs_repo"] = rate / RepoRate();
  }
  state.SetItemsProcessed(static_cast<int64_t>(rows * state.iterations()));
  if (Cfg().max_seconds > 0 && g.seconds >= Cfg().max_seconds) g.stopped = true;
}

// The queries users run, as raw SQL users write them against the view; ?1 is bound to a value
// that exists in the table.
struct Query {
  const char* name;
  const char* sql;
};
constexpr std::array<Query, 4> kQueries = {{
    {"collection_newest",
     "SELECT uri, cid, created_at, record FROM atfill_records WHERE collection = "
     "'app.bsky.feed.post' ORDER BY created_at DESC LIMIT 20"},
    {"did", "SELECT uri, cid, record FROM atfill_records WHERE did = ?1 LIMIT 20"},
    {"did_collection",
     "SELECT uri, cid, record FROM atfill_records WHERE did = ?1 AND collection = "
     "'app.bsky.feed.like' LIMIT 20"},
    {"uri",
     "SELECT uri, cid, record FROM atfill_records WHERE did = ?1 AND collection = "
     "'app.bsky.feed.like' AND rkey = ?2"},
}};

void BM_Query(benchmark::State& state) {
  const Query& q = kQueries[static_cast<size_t>(state.range(0))];
  Growing& g = Table();
  g.sink.reset();  // the writes are over; the queries read what was committed
  if (g.path.empty()) return state.SkipWithError("no table was written");
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(g.path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    return state.SkipWithError("open failed");
  }
  // The view's record column calls atfill_json once the table holds compressed rows.
  if (sinks::RegisterSqliteFunctions(db) != SQLITE_OK) {
    sqlite3_close(db);
    return state.SkipWithError("registering atfill_json failed");
  }
  sqlite3_exec(db, "PRAGMA cache_size = -65536", nullptr, nullptr, nullptr);
  // A DID and a like key of it that exist: the last like written.
  std::string did, rkey;
  {
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(db,
                       "SELECT d.did, r.rkey FROM atfill_record_rows r JOIN atfill_dids d ON "
                       "d.id = r.did_id WHERE r.id = (SELECT max(r.id) FROM atfill_record_rows "
                       "r JOIN atfill_collections c ON c.id = r.collection_id WHERE c.nsid = "
                       "'app.bsky.feed.like')",
                       -1, &s, nullptr);
    if (sqlite3_step(s) == SQLITE_ROW) {
      did = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
      rkey = reinterpret_cast<const char*>(sqlite3_column_text(s, 1));
    }
    sqlite3_finalize(s);
  }
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(db, q.sql, -1, &s, nullptr) != SQLITE_OK) {
    state.SkipWithError(sqlite3_errmsg(db));
    sqlite3_close(db);
    return;
  }
  sqlite3_bind_text(s, 1, did.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 2, rkey.c_str(), -1, SQLITE_TRANSIENT);
  int64_t returned = 0;
  for (auto _ : state) {
    while (sqlite3_step(s) == SQLITE_ROW) ++returned;
    sqlite3_reset(s);
  }
  state.counters["rows_returned"] =
      static_cast<double>(returned) / static_cast<double>(state.iterations());
  state.counters["table_rows"] = static_cast<double>(g.rows);
  state.SetLabel(q.name);
  sqlite3_finalize(s);
  sqlite3_close(db);
}

// ---- PostgreSQL ----

const char* PgConninfo() {
  const char* c = std::getenv("ATFILL_SCALE_PG");
  return c != nullptr && *c != '\0' ? c : nullptr;
}

std::string PgSchema() {
  const char* s = std::getenv("ATFILL_SCALE_PG_SCHEMA");
  return s != nullptr && *s != '\0' ? s : "atfill_scale_bench";
}

struct PgConnCloser {
  void operator()(PGconn* c) const { PQfinish(c); }
};
using PgConn = std::unique_ptr<PGconn, PgConnCloser>;

PgConn PgConnect() {
  PgConn c(PQconnectdb(PgConninfo()));
  if (PQstatus(c.get()) != CONNECTION_OK) return nullptr;
  PQsetNoticeProcessor(
      c.get(), [](void*, const char*) {}, nullptr);
  return c;
}

// Runs statements that return no rows; the server's message on failure.
Status PgExec(PGconn* c, const std::string& sql) {
  PGresult* r = PQexec(c, sql.c_str());
  const ExecStatusType st = PQresultStatus(r);
  std::string message = PQresultErrorMessage(r);
  PQclear(r);
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) return Status::IoError(message);
  return Status::OK();
}

// The first cell of a query, "" on failure or no rows.
std::string PgValue(PGconn* c, const std::string& sql) {
  PGresult* r = PQexec(c, sql.c_str());
  std::string out;
  if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0) out = PQgetvalue(r, 0, 0);
  PQclear(r);
  return out;
}

// What the server's processes used: CPU seconds (the postmaster, its live children, and the
// children it has reaped) and, per live process, the bytes it read and wrote through the storage
// layer, when the server runs on this machine and its data directory is readable; cpu is -1
// otherwise. Backends that exit between two samples are counted in CPU once the postmaster reaps
// them; their I/O is not (the sink's and this benchmark's connections, the checkpointer and the
// background writer live throughout, autovacuum's workers do not).
struct ServerUsage {
  double cpu = -1;
  std::map<long, bench::IoBytes> io;  // by pid
};

// The I/O of `after`'s processes since `before`: a process sampled in both counts its growth, one
// started since counts whole; one that exited in between counts nothing (its counters are gone),
// rather than taking its earlier total off the others'.
bench::IoBytes IoSince(const ServerUsage& before, const ServerUsage& after) {
  bench::IoBytes d;
  for (const auto& [pid, io] : after.io) {
    const auto it = before.io.find(pid);
    const bench::IoBytes base = it == before.io.end() ? bench::IoBytes{} : it->second;
    d.read += io.read - base.read;
    d.written += io.written - base.written;
  }
  return d;
}
ServerUsage PgServerUsage(PGconn* c) {
  static const std::string data_dir = PgValue(c, "SHOW data_directory");
  ServerUsage usage;
  if (data_dir.empty()) return usage;
  std::ifstream pidfile(data_dir + "/postmaster.pid");
  long postmaster = 0;
  if (!(pidfile >> postmaster) || postmaster <= 0) return usage;
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  // Fields after the command's closing parenthesis: state(3) ppid(4) ... utime(14) stime(15)
  // cutime(16) cstime(17).
  auto read = [&](const fs::path& stat, long* ppid, double* own, double* reaped) {
    std::ifstream in(stat);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');
    if (close == std::string::npos) return false;
    std::istringstream fields(text.substr(close + 2));
    std::string f;
    std::vector<std::string> v;
    while (fields >> f && v.size() < 15) v.push_back(f);
    if (v.size() < 15) return false;
    *ppid = std::atol(v[1].c_str());
    *own = (std::atof(v[11].c_str()) + std::atof(v[12].c_str())) / tick;
    *reaped = (std::atof(v[13].c_str()) + std::atof(v[14].c_str())) / tick;
    return true;
  };
  const fs::path postmaster_dir = fs::path("/proc") / std::to_string(postmaster);
  long ppid = 0;
  double own = 0, reaped = 0;
  if (!read(postmaster_dir / "stat", &ppid, &own, &reaped)) return usage;
  double total = own + reaped;
  usage.io[postmaster] = bench::ProcessIo(postmaster_dir);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    long parent = 0;
    double child_own = 0, child_reaped = 0;
    if (read(entry.path() / "stat", &parent, &child_own, &child_reaped) && parent == postmaster) {
      total += child_own + child_reaped;
      usage.io[std::atol(name.c_str())] = bench::ProcessIo(entry.path());
    }
  }
  usage.cpu = total;
  return usage;
}

struct PgGrowing {
  std::unique_ptr<pipeline::Sink> sink;
  std::unique_ptr<Stream> stream;
  PgConn admin;  // the benchmark's own connection: sizes, server CPU, queries
  uint64_t rows = 0;
  uint64_t first = 0;  // the rows the table held at the start (ATFILL_SCALE_PG_KEEP)
  double seconds = 0;
  bool stopped = false;
};

PgGrowing& PgTable() {
  static PgGrowing g;
  return g;
}

Status PgStart(PgGrowing* g) {
  g->admin = PgConnect();
  if (g->admin == nullptr) return Status::Unavailable("cannot connect to ATFILL_SCALE_PG");
  const std::string schema = "\"" + PgSchema() + "\"";
  uint64_t first = 0;
  const bool keep = bench::EnvUint("ATFILL_SCALE_PG_KEEP", 0) != 0;
  if (keep) {
    const std::string held =
        PgValue(g->admin.get(), "SELECT count(*) FROM " + schema + ".atfill_record_rows");
    if (held.empty()) {
      return Status::NotFound("ATFILL_SCALE_PG_KEEP: schema " + schema +
                              " holds no record table to keep");
    }
    first = std::strtoull(held.c_str(), nullptr, 10);
  } else {
    ATFILL_RETURN_IF_ERROR(PgExec(
        g->admin.get(), "DROP SCHEMA IF EXISTS " + schema + " CASCADE; CREATE SCHEMA " + schema));
  }
  if (const char* setup = std::getenv("ATFILL_SCALE_PG_SETUP_SQL");
      !keep && setup != nullptr && *setup) {
    std::ifstream in(setup);
    std::stringstream sql;
    sql << in.rdbuf();
    ATFILL_RETURN_IF_ERROR(PgExec(
        g->admin.get(), "SET search_path = " + schema + "; " + sql.str() + "; RESET search_path"));
  }
  sinks::PostgresSinkOptions options;
  options.conninfo = PgConninfo();
  options.schema = PgSchema();
  ATFILL_ASSIGN_OR_RETURN(g->sink, sinks::OpenPostgresSink(options));
  g->stream = std::make_unique<Stream>(Cfg().accounts, /*repo_order=*/false, 11, first);
  g->rows = first;
  g->first = first;
  return Status::OK();
}

// Bytes of the record table, its indexes and TOAST, its partitions' included.
double PgRecordBytes(PGconn* c) {
  const std::string table = "\"" + PgSchema() + "\".atfill_record_rows";
  const std::string v = PgValue(c,
                                "SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) FROM "
                                "pg_partition_tree('" +
                                    table + "')), pg_total_relation_size('" + table + "'))");
  return v.empty() ? 0 : std::atof(v.c_str());
}

void BM_PgInterleaved(benchmark::State& state) {
  PgGrowing& g = PgTable();
  if (g.stopped) return state.SkipWithError("stopped (ATFILL_SCALE_MAX_SECONDS or an error)");
  if (g.sink == nullptr) {
    if (Status st = PgStart(&g); !st.ok()) {
      g.stopped = true;
      return state.SkipWithError(st.ToString().c_str());
    }
  }
  const uint64_t rows = std::min(Cfg().window, Cfg().rows - (g.rows - g.first));
  for (auto _ : state) {
    bench::ResetPeakRss();
    Span span;
    const ServerUsage server0 = PgServerUsage(g.admin.get());
    Status st = WriteRows(g.sink.get(), g.stream.get(), rows, &span);
    const ServerUsage server1 = PgServerUsage(g.admin.get());
    if (!st.ok()) {
      g.stopped = true;
      return state.SkipWithError(st.ToString().c_str());
    }
    g.rows += rows;
    g.seconds += span.seconds;
    state.SetIterationTime(span.seconds);
    const double n = static_cast<double>(rows);
    state.counters["rows_total"] = static_cast<double>(g.rows);
    state.counters["cpu_s"] = span.cpu;
    double cpu = span.cpu;
    if (server0.cpu >= 0 && server1.cpu >= 0) {
      state.counters["server_cpu_s"] = server1.cpu - server0.cpu;
      cpu += server1.cpu - server0.cpu;
      const bench::IoBytes io = IoSince(server0, server1);
      state.counters["server_read_bytes_per_event"] = io.read / n;
      state.counters["server_written_bytes_per_event"] = io.written / n;
    }
    state.counters["cpu_us_per_event"] = cpu * 1e6 / n;
    state.counters["peak_rss_mb"] = static_cast<double>(bench::StatusKb("VmHWM")) / 1024.0;
    state.counters["db_bytes_per_record"] =
        PgRecordBytes(g.admin.get()) / static_cast<double>(g.rows);
    state.counters["avg_body_bytes"] = static_cast<double>(span.body_bytes) / n;
  }
  state.SetItemsProcessed(static_cast<int64_t>(rows * state.iterations()));
  if (Cfg().max_seconds > 0 && g.seconds >= Cfg().max_seconds) g.stopped = true;
}

// The queries of kQueries against the PostgreSQL view, every value a parameter, as a program
// runs them; `binds` names what $1, $2... stand for: d the DID, c the collection, r the record key.
struct PgQuery {
  const char* name;
  const char* sql;
  const char* binds;
};
constexpr std::array<PgQuery, 4> kPgQueries = {{
    {"collection_newest",
     "SELECT uri, cid, created_at, record FROM atfill_records WHERE collection = $1 ORDER BY "
     "created_at DESC LIMIT 20",
     "c"},
    {"did", "SELECT uri, cid, record FROM atfill_records WHERE did = $1 LIMIT 20", "d"},
    {"did_collection",
     "SELECT uri, cid, record FROM atfill_records WHERE did = $1 AND collection = $2 LIMIT 20",
     "dc"},
    {"uri",
     "SELECT uri, cid, record FROM atfill_records WHERE did = $1 AND collection = $2 AND rkey = "
     "$3",
     "dcr"},
}};

void BM_PgQuery(benchmark::State& state) {
  const PgQuery& q = kPgQueries[static_cast<size_t>(state.range(0))];
  PgGrowing& g = PgTable();
  g.sink.reset();  // the writes are over; the queries read what was committed
  if (g.admin == nullptr) return state.SkipWithError("no table was written");
  PgConn c = PgConnect();
  if (c == nullptr) return state.SkipWithError("cannot connect");
  const std::string schema = "\"" + PgSchema() + "\"";
  // Statistics as autovacuum would have them by now, and the session as the reader's.
  (void)PgExec(c.get(), "ANALYZE " + schema + ".atfill_record_rows; ANALYZE " + schema +
                            ".atfill_dids; ANALYZE " + schema + ".atfill_collections");
  (void)PgExec(c.get(), "SET search_path = " + schema + "; SET jit = off");
  // A DID and a like key of it that exist: the newest like.
  std::string did, rkey;
  {
    PGresult* r = PQexec(c.get(),
                         "SELECT did, rkey FROM atfill_records WHERE collection = "
                         "'app.bsky.feed.like' ORDER BY created_at DESC LIMIT 1");
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
      did = PQgetvalue(r, 0, 0);
      rkey = PQgetvalue(r, 0, 1);
    }
    PQclear(r);
  }
  if (did.empty()) return state.SkipWithError("no like in the table");
  // A collection newest first reads posts (15% of the rows); the others a like of the DID.
  const std::string collection =
      q.binds == std::string("c") ? "app.bsky.feed.post" : "app.bsky.feed.like";
  std::vector<const char*> bound;
  for (const char* b = q.binds; *b != '\0'; ++b) {
    bound.push_back(*b == 'd' ? did.c_str() : *b == 'c' ? collection.c_str() : rkey.c_str());
  }
  const int n_params = static_cast<int>(bound.size());
  PGresult* prepared = PQprepare(c.get(), "q", q.sql, 0, nullptr);
  const bool ok = PQresultStatus(prepared) == PGRES_COMMAND_OK;
  const std::string error = PQresultErrorMessage(prepared);
  PQclear(prepared);
  if (!ok) return state.SkipWithError(error.c_str());
  int64_t returned = 0;
  for (auto _ : state) {
    PGresult* r = PQexecPrepared(c.get(), "q", n_params, bound.data(), nullptr, nullptr, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
      state.SkipWithError(PQresultErrorMessage(r));
      PQclear(r);
      break;
    }
    returned += PQntuples(r);
    PQclear(r);
  }
  state.counters["rows_returned"] =
      static_cast<double>(returned) / static_cast<double>(std::max<int64_t>(1, state.iterations()));
  state.counters["table_rows"] = static_cast<double>(g.rows);
  state.SetLabel(q.name);
}

}  // namespace
}  // namespace atfill

int main(int argc, char** argv) {
  using atfill::Cfg;
  benchmark::RegisterBenchmark("BM_RepoOrder", atfill::BM_RepoOrder)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("BM_RepoRaw", atfill::BM_RepoRaw)
      ->ArgName("bulk")
      ->Arg(0)
      ->Arg(1)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kSecond);
  // One benchmark per window of the growing table, then one per query on the final table.
  const uint64_t windows = (Cfg().rows + Cfg().window - 1) / Cfg().window;
  auto register_table = [windows](const std::string& name, auto write, const auto& queries,
                                  const std::string& query_name, auto query) {
    for (uint64_t w = 1; w <= windows; ++w) {
      benchmark::RegisterBenchmark((name + "/window:" + std::to_string(w)).c_str(), write)
          ->Iterations(1)
          ->UseManualTime()
          ->Unit(benchmark::kSecond);
    }
    for (size_t q = 0; q < queries.size(); ++q) {
      benchmark::RegisterBenchmark((query_name + "/" + queries[q].name).c_str(), query)
          ->Arg(static_cast<int64_t>(q))
          ->Unit(benchmark::kMicrosecond);
    }
  };
  register_table("BM_Interleaved", atfill::BM_Interleaved, atfill::kQueries, "BM_Query",
                 atfill::BM_Query);
  if (atfill::PgConninfo() != nullptr) {
    register_table("BM_PgInterleaved", atfill::BM_PgInterleaved, atfill::kPgQueries, "BM_PgQuery",
                   atfill::BM_PgQuery);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
