// What the parts of scale_bench share: its settings, the event stream both sinks are fed, the
// scratch folder and the timed write loop; and the PostgreSQL benchmarks main registers
// (scale_bench_pg.cpp). See scale_bench.cpp for the benchmarks and their settings.
#pragma once

#include <benchmark/benchmark.h>
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
#include "sinks/sqlite_functions.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/components.hpp"

namespace atfill::scale {

namespace fs = std::filesystem;
using pipeline::Event;
using pipeline::RecordEvent;

uint32_t RepoAccounts();
// The stream's clock: the first event's time and the gap between two events (one event every
// 500 us, about the live firehose's pace).
inline constexpr int64_t kStreamStartUs = 1'780'000'000'000'000;
inline constexpr int64_t kStreamStepUs = 500;

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

inline const Config& Cfg() {
  static const Config config;
  return config;
}

inline uint32_t RepoAccounts() {
  static const auto accounts = static_cast<uint32_t>(
      std::max<uint64_t>(1, bench::EnvUint("ATFILL_SCALE_REPO_ACCOUNTS", 10'000)));
  return accounts;
}

inline fs::path Dir() {
  if (const char* d = std::getenv("ATFILL_SCALE_DIR"); d != nullptr && *d != '\0') {
    fs::create_directories(d);
    return d;
  }
  return bench::WorkDir("scale-bench");
}

// A TID: 53 bits of microseconds and 10 bits of clock id, base32-sortable, 13 characters.
inline std::string Tid(int64_t micros, uint32_t clock_id) {
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
inline std::string DidName(uint32_t index) {
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
inline std::string IsoTime(int64_t micros) {
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
inline constexpr std::array<Collection, 6> kMix = {{{"app.bsky.feed.like", 55},
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

inline uint64_t FileSize(const fs::path& p) {
  std::error_code ec;
  const auto n = fs::file_size(p, ec);
  return ec ? 0 : n;
}

// A new database at `path` (any older one removed), the setup SQL applied, opened by the sink.
inline Result<std::unique_ptr<pipeline::Sink>> NewDatabase(const fs::path& path,
                                                           bool bulk = false) {
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
inline Status WriteRows(pipeline::Sink* sink, Stream* stream, uint64_t rows, Span* span,
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

inline double& RepoRate() {
  static double rate = 0;
  return rate;
}

// The queries of kQueries against the PostgreSQL view, every value a parameter, as a program
// runs them; `binds` names what $1, $2... stand for: d the DID, c the collection, r the record key.
struct PgQuery {
  const char* name;
  const char* sql;
  const char* binds;
};
inline constexpr std::array<PgQuery, 4> kPgQueries = {{
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

// scale_bench_pg.cpp
const char* PgConninfo();
void BM_PgInterleaved(benchmark::State& state);
void BM_PgQuery(benchmark::State& state);

}  // namespace atfill::scale
