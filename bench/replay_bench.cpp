// Replay of a local Jetstream v2 archive (sources/archive/replay.hpp) end to end: 5,000,000
// generated create events (~400 B records, 10,000 accounts, interleaved as an archive is) written
// once as .jss segments (4,096 rows a block, 256 MiB segments) by ArchiveWriter, then replayed
// through CID verification and the ingest guard into SQLite, the job's state in RocksDB. records/s
// and the archive's MB/s (compressed bytes read). In the same run, the same replay into the dry-run
// sink: the source, decode and verify bound without the database. "CPU" is the whole process's CPU
// time (every thread), so CPU / Time is the cores a run kept busy.
//
//   build/bench/replay_bench                      (Release build)
//   ATFILL_REPLAY_BENCH_EVENTS=N                  (another size; default 5,000,000)
//   ATFILL_REPLAY_BENCH_ARCHIVE=DIR               (generate the archive there once, reuse it)
//   ATFILL_REPLAY_BENCH_BATCH=events,chunks,ms    (the engine's batch limits; default
//                                                 sources::kReplayBatch, as atfill replays)
//   ATFILL_REPLAY_BENCH_SQLITE=cache_mb,wal_mb,page_kb  (the SQLite sink's options; default
//                                                 64,512,16: the WAL as atfill replays)
//   ATFILL_BENCH_SQLITE_CHECKPOINT=inline         (the writer checkpoints inside its COMMIT,
//                                                 as before background_checkpoint)
//   ATFILL_BENCH_SQLITE_COMPRESS=1 or 0           (bodies compressed, or text; unset, the sink's
//                                                 default: text)
//   ATFILL_REPLAY_BENCH_PG=CONNINFO               (Replay/0 into the PostgreSQL sink instead, a
//   fresh
//                                                 schema of the run on that server)
//
// BM_SqliteBound: what SQLite itself takes on this machine, without any decode: the same number of
// rows of the same shape (10,000 accounts interleaved at random, three collections, ~400 B
// records, TID rkeys in stream order) inserted by a bare loop into the sink's schema as the sink
// inserts them (one row per INSERT, in stream order), one body for every row, in these
// arrangements: /0 100,000 rows per transaction (a replay batch), /1 1,000,000, /2 all
// rows in one transaction with a 2 GiB page cache, /3 the table without any index during the load
// (100,000 per transaction) and the sink's three indexes built afterwards (PRAGMA threads = 2):
// the cheapest any layout could make a replay into an empty table.
#include <benchmark/benchmark.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string_view>
#include <vector>

#include "bench/bench_util.hpp"
#include "bench/planned_stages.hpp"
#include "pipeline/plan.hpp"
#include "pipeline/run.hpp"
#include "sinks/dry_run_sink.hpp"
#include "sinks/postgres_sink.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/archive/archive.hpp"
#include "sources/archive/archive_writer.hpp"
#include "sources/archive/replay.hpp"
#include "sources/jetstream/jetstream_frames.hpp"
#include "state/kv_store.hpp"
#include "state/tombstones.hpp"
#include "tools/gen/event_gen.hpp"

namespace atfill {
namespace {

namespace fs = std::filesystem;

uint64_t Events() {
  if (const char* e = std::getenv("ATFILL_REPLAY_BENCH_EVENTS"))
    return std::strtoull(e, nullptr, 10);
  return 5'000'000;
}

fs::path WorkDir() { return bench::WorkDir("replay-bench"); }

// The archive, written once per process; its size in bytes.
const fs::path& ArchiveDir(uint64_t* bytes) {
  static fs::path dir;
  static uint64_t size = 0;
  if (dir.empty()) {
    dir = WorkDir() / "archive";
    if (const char* keep = std::getenv("ATFILL_REPLAY_BENCH_ARCHIVE")) {
      // A kept archive: generated into that folder once, reused by later runs.
      dir = keep;
      std::error_code ec;
      if (fs::exists(dir / "seg_0000000000.jss", ec)) {
        for (const auto& f : fs::directory_iterator(dir)) size += f.file_size();
        *bytes = size;
        return dir;
      }
    }
    gen::EventGenOptions o;
    o.dids = 10'000;
    o.update_ratio = 0;
    o.delete_ratio = 0;
    o.body_bytes = 400;
    gen::EventGenerator events(o);
    auto writer = sources::ArchiveWriter::Open(dir.string());
    if (!writer.ok()) std::abort();
    for (uint64_t i = 0; i < Events(); ++i) {
      const std::string line = events.Next();
      sources::JetstreamFrame frame;
      std::string kind;
      if (!sources::DecodeJetstreamV1(line, line.size(), pipeline::Origin::kReplay, &frame, &kind)
               .ok() ||
          !(*writer)->Append(frame.payload, frame.time_us).ok()) {
        std::abort();
      }
    }
    if (!(*writer)->Finish().ok()) std::abort();
    for (const auto& f : fs::directory_iterator(dir)) size += f.file_size();
  }
  *bytes = size;
  return dir;
}

void BM_Replay(benchmark::State& state) {
  const bool to_sqlite = state.range(0) == 0;
  uint64_t archive_bytes = 0;
  const fs::path& archive_dir = ArchiveDir(&archive_bytes);
  double seconds = 0;
  for (auto _ : state) {
    const fs::path dir = WorkDir() / "run";
    fs::remove_all(dir);
    fs::create_directories(dir);
    bench::ResetPeakRss();
    const auto start = std::chrono::steady_clock::now();
    auto archive = sources::LocalArchive::Open(archive_dir.string());
    state::RocksDbOptions st;
    st.path = (dir / "state").string();
    auto kv = state::OpenRocksDb(st);
    if (!archive.ok() || !kv.ok()) return state.SkipWithError("open failed");
    std::unique_ptr<pipeline::Sink> sink;
    const char* pg = std::getenv("ATFILL_REPLAY_BENCH_PG");
    if (to_sqlite && pg != nullptr && *pg != '\0') {
      // The PostgreSQL sink instead, into a schema of this run on the server named.
      sinks::PostgresSinkOptions out;
      out.conninfo = pg;
      out.schema = "atfill_replay_bench_" + std::to_string(::getpid());
      auto s = sinks::OpenPostgresSink(out);
      if (!s.ok()) return state.SkipWithError(s.status().ToString().c_str());
      sink = std::move(*s);
    } else if (to_sqlite) {
      sinks::SqliteSinkOptions out;
      out.path = (dir / "out.db").string();
      out.wal_autocheckpoint_bytes = sources::kReplaySqliteWalBytes;  // as atfill replays
      out.compress = bench::SqliteCompress(out.compress);
      if (const char* e = std::getenv("ATFILL_REPLAY_BENCH_SQLITE")) {
        long long cache_mb = 0, wal_mb = 0, page_kb = 0;
        if (std::sscanf(e, "%lld,%lld,%lld", &cache_mb, &wal_mb, &page_kb) == 3) {
          out.cache_bytes = cache_mb << 20;
          out.wal_autocheckpoint_bytes = wal_mb << 20;
          out.page_size_bytes = page_kb << 10;
        }
      }
      if (const char* c = std::getenv("ATFILL_BENCH_SQLITE_CHECKPOINT")) {
        out.background_checkpoint = std::string_view(c) != "inline";
      }
      auto s = sinks::OpenSqliteSink(out);
      if (!s.ok()) return state.SkipWithError("sink");
      sink = std::move(*s);
    } else {
      auto s = sinks::NewDryRunSink();
      if (!s.ok()) return state.SkipWithError("sink");
      sink = std::move(*s);
    }
    sources::ReplayOptions options;
    sources::ReplaySource source(archive->get(), options, 1, kv->get());
    state::Tombstones tombstones(**kv);
    // The stages of a replay job (an ingest), made by the launcher's own factories.
    auto planned =
        bench::PlannedStages::Make({.kind = "ingest", .kv = kv->get(), .tombstones = &tombstones});
    if (!planned.ok()) return state.SkipWithError(planned.status().ToString().c_str());
    pipeline::RunOptions run;
    run.engine.batch = sources::kReplayBatch;  // as atfill runs a replay
    if (const char* e = std::getenv("ATFILL_REPLAY_BENCH_BATCH")) {
      unsigned long long events = 0, chunks = 0;
      long long ms = 0;
      if (std::sscanf(e, "%llu,%llu,%lld", &events, &chunks, &ms) == 3) {
        run.engine.batch = {.max_events = events, .max_delay_ms = ms, .max_chunks = chunks};
      }
    }
    auto job = pipeline::RunAsJob(&source, (*planned)->InOrder(), sink.get(), kv->get(), run);
    if (!job.ok() || job->counters.records_written != Events()) {
      return state.SkipWithError("the replay did not write every record");
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * Events()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * archive_bytes));
  state.counters["archive_mb"] = static_cast<double>(archive_bytes) / 1e6;
  state.counters["peak_rss_mb"] = static_cast<double>(bench::StatusKb("VmHWM")) / 1024.0;
  const char* pg = std::getenv("ATFILL_REPLAY_BENCH_PG");
  state.SetLabel(!to_sqlite                       ? "into the dry-run sink"
                 : (pg != nullptr && *pg != '\0') ? "into PostgreSQL"
                                                  : "into SQLite");
}

BENCHMARK(BM_Replay)->Arg(0)->Arg(1)->Iterations(1)->UseManualTime()->MeasureProcessCPUTime()->Unit(
    benchmark::kSecond);

bool Exec(sqlite3* db, const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &error) == SQLITE_OK) return true;
  std::fprintf(stderr, "replay_bench: %s: %s\n", sql, error != nullptr ? error : "?");
  sqlite3_free(error);
  return false;
}

void BM_SqliteBound(benchmark::State& state) {
  const int variant = static_cast<int>(state.range(0));
  const uint64_t n = Events();
  const uint64_t per_txn = variant == 1 ? 1'000'000 : variant == 2 ? n : 100'000;
  const std::string body = [] {
    std::string b =
        R"({"$type":"app.bsky.feed.post","createdAt":"2026-11-30T09:00:00.000Z","text":")";
    b.append(400 - b.size() - 2, 'x');
    return b + "\"}";
  }();
  const std::string cid = "bafyreib2rxk3rybk3aobmv5cjuql3bm2twh4jo5uxgf5alqwqkvq4kqvlu";
  uint64_t written = 0;
  for (auto _ : state) {
    const fs::path dir = WorkDir() / "bound";
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string path = (dir / "out.db").string();
    if (variant != 3) {
      // The sink's own schema, with its unique index.
      sinks::SqliteSinkOptions out;
      out.path = path;
      if (!sinks::OpenSqliteSink(out).ok()) return state.SkipWithError("sink");
    }
    sqlite3* db = nullptr;
    if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) return state.SkipWithError("open");
    std::string pragmas =
        "PRAGMA page_size = 16384; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; "
        "PRAGMA wal_autocheckpoint = 8192; PRAGMA cache_size = ";
    pragmas += variant == 2 ? "-2097152" : "-65536";
    bool ok = Exec(db, pragmas.c_str());
    if (ok && variant == 3) {
      ok = Exec(db,
                "CREATE TABLE atfill_record_rows(id INTEGER PRIMARY KEY, did_id INTEGER NOT NULL, "
                "collection_id INTEGER NOT NULL, rkey TEXT NOT NULL, cid TEXT NOT NULL, rev TEXT, "
                "indexed_at INTEGER NOT NULL, created_at TEXT, record TEXT NOT NULL, did_epoch "
                "INTEGER GENERATED ALWAYS AS (id >> 18) VIRTUAL)");
    }
    std::string sql = bench::RecordInsertSql(1);
    if (variant != 3) sql += " ON CONFLICT (did_id, collection_id, rkey) DO NOTHING";
    sqlite3_stmt* insert = nullptr;
    if (ok && sqlite3_prepare_v2(db, sql.c_str(), -1, &insert, nullptr) != SQLITE_OK) ok = false;
    std::mt19937_64 rng(7);
    struct Row {
      uint32_t did;
      uint64_t seq;
    };
    std::vector<Row> rows;
    std::array<char, 16> rkey{};
    written = 0;
    const auto start = std::chrono::steady_clock::now();
    for (uint64_t first = 0; ok && first < n; first += per_txn) {
      rows.clear();
      for (uint64_t i = first; i < std::min(n, first + per_txn); ++i) {
        rows.push_back({static_cast<uint32_t>(rng() % 10'000) + 1, i});
      }
      ok = Exec(db, "BEGIN IMMEDIATE");
      for (size_t at = 0; ok && at < rows.size(); ++at) {
        const Row& r = rows[at];
        std::snprintf(rkey.data(), rkey.size(), "3m%011llu",
                      static_cast<unsigned long long>(r.seq));
        sqlite3_bind_int64(insert, 1, r.did);
        sqlite3_bind_int64(insert, 2, static_cast<int64_t>(r.seq % 3) + 1);
        sqlite3_bind_text(insert, 3, rkey.data(), 13, SQLITE_STATIC);
        sqlite3_bind_text(insert, 4, cid.data(), static_cast<int>(cid.size()), SQLITE_STATIC);
        sqlite3_bind_text(insert, 5, rkey.data(), 13, SQLITE_STATIC);
        sqlite3_bind_int64(insert, 6, static_cast<int64_t>(r.seq));
        sqlite3_bind_text(insert, 7, "2026-11-30T09:00:00.000Z", 24, SQLITE_STATIC);
        sqlite3_bind_text(insert, 8, body.data(), static_cast<int>(body.size()), SQLITE_STATIC);
        ok = sqlite3_step(insert) == SQLITE_DONE;
        sqlite3_reset(insert);
        ++written;
      }
      if (ok) ok = Exec(db, "COMMIT");
    }
    // The load alone, apart: for /3 the rate of a table with no index at all, which bounds what
    // any layout could write during a replay before its indexes are built.
    const double load_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (ok && variant == 3) {
      // The sink's three indexes (schema version 2 on), each built from the whole table.
      ok = Exec(db,
                "PRAGMA threads = 2; CREATE UNIQUE INDEX atfill_record_rows_key ON "
                "atfill_record_rows(collection_id, rkey, did_id); CREATE INDEX "
                "atfill_record_rows_by_did ON atfill_record_rows(did_epoch, did_id, "
                "collection_id); CREATE INDEX atfill_record_rows_by_created ON "
                "atfill_record_rows(collection_id, created_at)");
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.counters["load_s"] = load_seconds;
    state.counters["load_per_second"] = static_cast<double>(written) / load_seconds;
    sqlite3_finalize(insert);
    sqlite3_close(db);
    if (!ok) return state.SkipWithError("an insert failed");
    state.SetIterationTime(seconds);
  }
  state.SetItemsProcessed(static_cast<int64_t>(written));
  state.SetLabel(variant == 0   ? "100,000 rows per transaction"
                 : variant == 1 ? "1,000,000 rows per transaction"
                 : variant == 2 ? "one transaction, 2 GiB cache"
                                : "no index during the load, the sink's three built afterwards");
}

BENCHMARK(BM_SqliteBound)
    ->DenseRange(0, 3)
    ->Iterations(1)
    ->UseManualTime()
    ->MeasureProcessCPUTime()
    ->Unit(benchmark::kSecond);

}  // namespace
}  // namespace atfill

BENCHMARK_MAIN();
