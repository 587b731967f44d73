// Replay of a local Jetstream v2 archive (sources/replay.hpp) end to end: 5,000,000 generated
// create events (~400 B records, 10,000 accounts, interleaved as an archive is) written once as
// .jss segments (4,096 rows a block, 256 MiB segments) by ArchiveWriter, then replayed through CID
// verification and the ingest guard into SQLite, the job's state in RocksDB. records/s and the
// archive's MB/s (compressed bytes read). In the same run, the same replay into the dry-run sink:
// the source, decode and verify bound without the database.
//
//   build/bench/replay_bench                      (Release build)
//   ATFILL_REPLAY_BENCH_EVENTS=N                  (another size; default 5,000,000)
//   ATFILL_REPLAY_BENCH_ARCHIVE=DIR               (generate the archive there once, reuse it)
//   ATFILL_REPLAY_BENCH_BATCH=events,chunks,ms    (the engine's batch limits; default
//                                                 sources::kReplayBatch, as atfill replays)
//   ATFILL_REPLAY_BENCH_SQLITE=cache_mb,wal_mb,page_kb  (the SQLite sink's options)
//   ATFILL_BENCH_SQLITE_CHECKPOINT=inline         (the writer checkpoints inside its COMMIT,
//                                                 as before background_checkpoint)
//   ATFILL_REPLAY_BENCH_PG=CONNINFO               (Replay/0 into the PostgreSQL sink instead, a
//   fresh
//                                                 schema of the run on that server)
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "bench/bench_util.hpp"
#include "pipeline/run.hpp"
#include "sinks/dry_run_sink.hpp"
#include "sinks/postgres_sink.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/archive.hpp"
#include "sources/archive_writer.hpp"
#include "sources/jetstream_frames.hpp"
#include "sources/replay.hpp"
#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
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
    stages::CidVerify verify;
    stages::IngestGuard guard(&tombstones);
    pipeline::RunOptions run;
    run.engine.batch = sources::kReplayBatch;  // as atfill runs a replay
    if (const char* e = std::getenv("ATFILL_REPLAY_BENCH_BATCH")) {
      unsigned long long events = 0, chunks = 0;
      long long ms = 0;
      if (std::sscanf(e, "%llu,%llu,%lld", &events, &chunks, &ms) == 3) {
        run.engine.batch = {.max_events = events, .max_delay_ms = ms, .max_chunks = chunks};
      }
    }
    auto job = pipeline::RunAsJob(&source, {&verify, &guard}, sink.get(), kv->get(), run);
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

BENCHMARK(BM_Replay)->Arg(0)->Arg(1)->Iterations(1)->UseManualTime()->Unit(benchmark::kSecond);

}  // namespace
}  // namespace atfill

BENCHMARK_MAIN();
