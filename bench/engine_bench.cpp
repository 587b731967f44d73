// The whole engine, end to end: an event file -> CID verify -> ingest guard -> SQLite, with the
// job's state in RocksDB, on 1,000,000 generated create events (~400 B bodies). In the same run,
// the raw bound: the same rows inserted by a bare prepared-statement loop into the same schema,
// one transaction per 5,000 (and, beside it, the same loop with 32 rows per INSERT, as the sink
// once inserted). Two input orders: "interleaved" (accounts at random, as a live stream
// or an archive) and "repo" (one account after another, as a crawl).
//
// ATFILL_ENGINE_BENCH_BATCH="events,chunks,ms" replaces the engine's default batch limits
// (5,000 events, 16 chunks, 200 ms), as [engine] batch_records/batch_chunks/batch_ms would.
// ATFILL_BENCH_SQLITE_BULK=1 makes the repo-order run's sink bulk-load (SqliteSinkOptions::
// bulk_load, as a fresh crawl's does): its time then includes building the indexes at the end.
// ATFILL_BENCH_SQLITE_CHECKPOINT=inline makes the sink checkpoint inside its COMMIT (as SQLite
// does by default, and as the raw loop does) instead of on its checkpoint thread.
// ATFILL_BENCH_SQLITE_COMPRESS=1 makes the sink compress bodies, =0 store them as text; unset, the
// sink's default (text).
//
//   build/bench/engine_bench                      (Release build)
#include <benchmark/benchmark.h>
#include <simdjson.h>
#include <sqlite3.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string_view>
#include <unordered_map>

#include "bench/bench_util.hpp"
#include "bench/planned_stages.hpp"
#include "pipeline/plan.hpp"
#include "pipeline/run.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/files/event_file.hpp"
#include "state/kv_store.hpp"
#include "state/tombstones.hpp"
#include "tools/gen/event_gen.hpp"

namespace atfill {
namespace {

constexpr uint64_t kEvents = 1'000'000;
constexpr uint32_t kDids = 10'000;
constexpr int kBatch = 5000;

namespace fs = std::filesystem;

fs::path WorkDir() { return bench::WorkDir("engine-bench"); }

// The event file of one order, generated once per process.
const std::string& EventFile(bool repo_order) {
  static std::map<bool, std::string> files;
  auto it = files.find(repo_order);
  if (it != files.end()) return it->second;
  gen::EventGenOptions o;
  o.dids = kDids;
  o.update_ratio = 0;
  o.delete_ratio = 0;
  o.body_bytes = 400;
  o.run_length = repo_order ? static_cast<uint32_t>(kEvents / kDids) : 1;
  const std::string path = (WorkDir() / (repo_order ? "repo.jsonl" : "interleaved.jsonl")).string();
  if (Status s = gen::EventGenerator::WriteFile(o, kEvents, path); !s.ok()) std::abort();
  return files[repo_order] = path;
}

double PeakRssMb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

std::map<bool, double>& EndToEndRates() {
  static std::map<bool, double> rates;
  return rates;
}

void BM_EndToEnd(benchmark::State& state) {
  const bool repo_order = state.range(0) != 0;
  const std::string& events = EventFile(repo_order);
  double seconds = 0;
  for (auto _ : state) {
    const fs::path dir = WorkDir() / "e2e";
    fs::remove_all(dir);
    fs::create_directories(dir);
    const auto start = std::chrono::steady_clock::now();
    sources::EventFileOptions in;
    in.paths = {events};
    auto source = sources::EventFileSource::Open(in);
    sinks::SqliteSinkOptions out;
    out.path = (dir / "out.db").string();
    out.compress = bench::SqliteCompress(out.compress);
    if (const char* c = std::getenv("ATFILL_BENCH_SQLITE_CHECKPOINT")) {
      out.background_checkpoint = std::string_view(c) != "inline";
    }
    if (const char* b = std::getenv("ATFILL_BENCH_SQLITE_BULK")) {
      out.bulk_load = repo_order && std::string_view(b) == "1";
    }
    auto sink = sinks::OpenSqliteSink(out);
    state::RocksDbOptions st;
    st.path = (dir / "state").string();
    auto kv = state::OpenRocksDb(st);
    if (!source.ok() || !sink.ok() || !kv.ok()) return state.SkipWithError("open failed");
    state::Tombstones tombstones(**kv);
    // `atfill ingest`'s stages, made by its own factories.
    auto planned =
        bench::PlannedStages::Make({.kind = "ingest", .kv = kv->get(), .tombstones = &tombstones});
    if (!planned.ok()) return state.SkipWithError(planned.status().ToString().c_str());
    pipeline::RunOptions options;
    if (const char* e = std::getenv("ATFILL_ENGINE_BENCH_BATCH")) {
      unsigned long long events = 0, chunks = 0;
      long long ms = 0;
      if (std::sscanf(e, "%llu,%llu,%lld", &events, &chunks, &ms) == 3) {
        options.engine.batch = {.max_events = events, .max_delay_ms = ms, .max_chunks = chunks};
      }
    }
    auto job =
        pipeline::RunAsJob(source->get(), (*planned)->InOrder(), sink->get(), kv->get(), options);
    if (!job.ok() || job->counters.records_written != kEvents) {
      return state.SkipWithError("the run did not write every record");
    }
    sink->reset();  // a bulk load builds its indexes here
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kEvents));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * fs::file_size(events)));
  state.counters["peak_rss_mb"] = PeakRssMb();
  state.SetLabel(repo_order ? "repo order" : "interleaved");
  EndToEndRates()[repo_order] = static_cast<double>(kEvents) / seconds;
}

struct Row {
  int did_id;
  int collection_id;
  std::string rkey, cid, rev, created_at, body;
};

// The rows of the event file, parsed outside the timed loop.
std::vector<Row> Rows(const std::string& path, std::vector<std::string>* dids,
                      std::vector<std::string>* collections) {
  std::vector<Row> rows;
  std::unordered_map<std::string, int> did_ids, collection_ids;
  simdjson::dom::parser parser;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    simdjson::dom::element e = parser.parse(line);
    const std::string did{std::string_view(e["did"])};
    simdjson::dom::element c = e["commit"];
    const std::string coll{std::string_view(c["collection"])};
    auto d = did_ids.emplace(did, static_cast<int>(did_ids.size()) + 1);
    if (d.second) dids->push_back(did);
    auto k = collection_ids.emplace(coll, static_cast<int>(collection_ids.size()) + 1);
    if (k.second) collections->push_back(coll);
    simdjson::dom::element record = c["record"];
    Row r{d.first->second,
          k.first->second,
          std::string(std::string_view(c["rkey"])),
          std::string(std::string_view(c["cid"])),
          std::string(std::string_view(c["rev"])),
          std::string(std::string_view(record["createdAt"])),
          simdjson::minify(record)};
    rows.push_back(std::move(r));
  }
  return rows;
}

void BM_RawBound(benchmark::State& state) {
  const bool repo_order = state.range(0) != 0;
  const auto per_insert = static_cast<size_t>(state.range(1));
  std::vector<std::string> dids, collections;
  const std::vector<Row> rows = Rows(EventFile(repo_order), &dids, &collections);
  const sinks::SqliteSinkOptions defaults;
  for (auto _ : state) {
    const fs::path dir = WorkDir() / "raw";
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string path = (dir / "raw.db").string();
    {
      // The sink creates the schema and sets its pragmas; the loop then writes on its own.
      sinks::SqliteSinkOptions create;
      create.path = path;
      if (!sinks::OpenSqliteSink(create).ok()) return state.SkipWithError("schema");
    }
    sqlite3* db = nullptr;
    sqlite3_open(path.c_str(), &db);
    const std::string pragmas =
        "PRAGMA synchronous = NORMAL; PRAGMA cache_size = -" +
        std::to_string(defaults.cache_bytes / 1024) + "; PRAGMA wal_autocheckpoint = " +
        std::to_string(defaults.wal_autocheckpoint_bytes / defaults.page_size_bytes) + "; BEGIN";
    sqlite3_exec(db, pragmas.c_str(), nullptr, nullptr, nullptr);
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(db, "INSERT INTO atfill_dids(id, did) VALUES (?1, ?2)", -1, &s, nullptr);
    for (size_t i = 0; i < dids.size(); ++i) {
      sqlite3_bind_int(s, 1, static_cast<int>(i) + 1);
      sqlite3_bind_text(s, 2, dids[i].c_str(), -1, SQLITE_STATIC);
      sqlite3_step(s);
      sqlite3_reset(s);
    }
    sqlite3_finalize(s);
    sqlite3_prepare_v2(db, "INSERT INTO atfill_collections(id, nsid) VALUES (?1, ?2)", -1, &s,
                       nullptr);
    for (size_t i = 0; i < collections.size(); ++i) {
      sqlite3_bind_int(s, 1, static_cast<int>(i) + 1);
      sqlite3_bind_text(s, 2, collections[i].c_str(), -1, SQLITE_STATIC);
      sqlite3_step(s);
      sqlite3_reset(s);
    }
    sqlite3_finalize(s);
    sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
    // One row per INSERT (the raw bound), or `per_insert` rows per INSERT as the sink now does.
    sqlite3_prepare_v2(db, bench::RecordInsertSql(1).c_str(), -1, &s, nullptr);
    sqlite3_stmt* multi = nullptr;
    sqlite3_prepare_v2(db, bench::RecordInsertSql(per_insert).c_str(), -1, &multi, nullptr);
    auto bind = [](sqlite3_stmt* st, int b, const Row& r) {
      sqlite3_bind_int(st, b + 1, r.did_id);
      sqlite3_bind_int(st, b + 2, r.collection_id);
      sqlite3_bind_text(st, b + 3, r.rkey.data(), static_cast<int>(r.rkey.size()), SQLITE_STATIC);
      sqlite3_bind_text(st, b + 4, r.cid.data(), static_cast<int>(r.cid.size()), SQLITE_STATIC);
      sqlite3_bind_text(st, b + 5, r.rev.data(), static_cast<int>(r.rev.size()), SQLITE_STATIC);
      sqlite3_bind_int64(st, b + 6, 1'780'000'000'000'000);
      sqlite3_bind_text(st, b + 7, r.created_at.data(), static_cast<int>(r.created_at.size()),
                        SQLITE_STATIC);
      sqlite3_bind_text(st, b + 8, r.body.data(), static_cast<int>(r.body.size()), SQLITE_STATIC);
    };
    const auto start = std::chrono::steady_clock::now();
    for (size_t first = 0; first < rows.size(); first += kBatch) {
      sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
      const size_t end = std::min(rows.size(), first + kBatch);
      size_t i = first;
      for (; per_insert > 1 && i + per_insert <= end; i += per_insert) {
        for (size_t k = 0; k < per_insert; ++k) bind(multi, static_cast<int>(k) * 8, rows[i + k]);
        if (sqlite3_step(multi) != SQLITE_DONE) return state.SkipWithError(sqlite3_errmsg(db));
        sqlite3_reset(multi);
      }
      for (; i < end; ++i) {
        bind(s, 0, rows[i]);
        if (sqlite3_step(s) != SQLITE_DONE) return state.SkipWithError(sqlite3_errmsg(db));
        sqlite3_reset(s);
      }
      sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    sqlite3_finalize(s);
    sqlite3_finalize(multi);
    sqlite3_close(db);
    state.SetIterationTime(seconds);
    const double raw_rate = static_cast<double>(rows.size()) / seconds;
    if (auto it = EndToEndRates().find(repo_order);
        per_insert == 1 && it != EndToEndRates().end()) {
      state.counters["e2e_over_raw"] = it->second / raw_rate;
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * rows.size()));
  std::string label = repo_order ? "repo order" : "interleaved";
  if (per_insert > 1) label += ", " + std::to_string(per_insert) + " rows per INSERT";
  state.SetLabel(label);
}

// End to end first, so its peak RSS counter is not the raw loop's. Its CPU column is the whole
// process's (every engine thread), which says more than the rate on a busy machine.
BENCHMARK(BM_EndToEnd)
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->UseManualTime()
    ->MeasureProcessCPUTime()
    ->Unit(benchmark::kSecond);
// {order, rows per INSERT}: /x/1 is the raw bound (the sink inserts one row per statement too);
// /x/32 the same loop with 32-row INSERTs (its CPU column is the whole process's: the loop's own
// CPU).
BENCHMARK(BM_RawBound)
    ->Args({0, 1})
    ->Args({0, 32})
    ->Args({1, 1})
    ->Args({1, 32})
    ->Iterations(1)
    ->UseManualTime()
    ->MeasureProcessCPUTime()
    ->Unit(benchmark::kSecond);

}  // namespace
}  // namespace atfill

BENCHMARK_MAIN();
