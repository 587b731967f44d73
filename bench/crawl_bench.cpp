// The crawl against simnet on loopback, in-process.
//
// BM_Crawl: 10,000 accounts on 500 PDS hosts, every answer 50 ms late, two collections, the
// default record counts (0..40 per account, log-uniform), a few did:web accounts. The crawl runs
// with the default network options, as `atfill backfill` would, through CID verify and the ingest
// guard into a SQLite sink (or the dry-run sink, to tell the sink's cost apart). Simnet is
// generated outside the timed part; the time is the job's run, from the first listing request to
// the last commit.
//
// The bound. A client with N requests in flight against answers that take L seconds makes at most
// N / L requests per second. The crawl has two clients:
//   fetch     listings and listRecords/getRepo: max_hosts 64 x max_per_host 3 = 192 in flight,
//             192 / 0.05 s = 3,840 req/s;
//   resolver  DID documents: PLC is one host, so max_per_host (32) in flight, 32 / 0.05 s = 640
//             req/s (the few did:web DIDs each have their own host and are not limited by it).
// The "requests in flight / latency" is read here as both clients together:
// bound = (192 + 32) / 0.05 s = 4,480 req/s, ratio_to_bound = (fetch + resolver requests) / s over
// it, because every unit costs one resolution and both clients' slots are what the crawl has in
// flight. fetch_ratio is the fetch client alone (fetch requests / s over 3,840). As the two
// clients work on different units at once only when their demands match their slots, the crawl
// is also compared with the time its stages need at best: stage_bound_s = max(fetch requests /
// 3,840, PLC requests / 640), stage_ratio = stage_bound_s / elapsed.
//
// BM_Discovery: peak RSS while discovering 1,000,000 repos (listReposByCollection, latency 0, the
// default discovery window of 50,000 units). See the comment above it.
//
//   build-bench-crawl/bench/crawl_bench                      (Release build)
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"
#include "sinks/dry_run_sink.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/crawl.hpp"
#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"
#include "state/tombstones.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill {
namespace {

namespace fs = std::filesystem;
using sources::CrawlOptions;
using sources::CrawlSource;
using sources::FetchMode;

constexpr uint32_t kAccounts = 10'000;
constexpr uint32_t kHosts = 500;
constexpr int64_t kLatencyMs = 50;
const std::vector<std::string> kCollections = {"app.bsky.feed.post", "app.bsky.feed.like"};

fs::path WorkDir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("atfill-crawl-bench-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// A "Vm..." field of /proc/self/status in KiB, or -1 when absent.
int64_t StatusKb(std::string_view field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > field.size() && line.compare(0, field.size(), field) == 0 &&
        line[field.size()] == ':') {
      return std::stoll(line.substr(field.size() + 1));
    }
  }
  return -1;
}

// Resets VmHWM to the current RSS (Linux >= 4.0); false when not permitted.
bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return out.good();
}

struct CrawlRun {
  bool ok = false;
  std::string error;
  state::JobRecord job;
  sources::CrawlStats stats;
  net::HttpClientStats fetch;
  net::HttpClientStats resolve;
  double seconds = 0;
  int64_t sampled_peak_kb = 0;  // the largest VmRSS seen by the watcher
  // Transfers running, averaged over the watcher's samples.
  double avg_fetch_in_flight = 0;
  double avg_resolve_in_flight = 0;
};

// Runs one crawl job in a fresh state directory `dir`, as `atfill backfill` does (CID verify, the
// ingest guard, then the sink). Every 50 ms a watcher samples VmRSS and calls `stop_when` with the
// source; when it returns true the job is asked to pause, and the run ends at the next
// checkpoint.
CrawlRun RunCrawl(const fs::path& dir, const CrawlOptions& options, bool dry_run,
                  const std::function<bool(const CrawlSource&)>& stop_when) {
  CrawlRun out;
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto kv = state::OpenRocksDb({.path = (dir / "state").string()});
  if (!kv.ok()) {
    out.error = kv.status().ToString();
    return out;
  }
  Result<std::unique_ptr<pipeline::Sink>> sink = Status::Internal("unset");
  if (dry_run) {
    sink = sinks::NewDryRunSink();
  } else {
    sinks::SqliteSinkOptions sink_options;
    sink_options.path = (dir / "db.sqlite").string();
    sink = sinks::OpenSqliteSink(sink_options);
  }
  if (!sink.ok()) {
    out.error = sink.status().ToString();
    return out;
  }
  state::JobStore jobs(**kv);
  state::ErrorLog errors(**kv);
  state::JobRecord prototype;
  prototype.kind = "backfill";
  prototype.created_us = pipeline::NowMicros();
  prototype.started_by = "crawl_bench";
  prototype.params = {{"name", "bench"}};
  auto job = jobs.Create(prototype);
  if (!job.ok()) {
    out.error = job.status().ToString();
    return out;
  }
  auto source = CrawlSource::Create(options, job->id, kv->get());
  if (!source.ok()) {
    out.error = source.status().ToString();
    return out;
  }
  state::Tombstones tombstones(**kv);
  stages::CidVerify verify;
  stages::IngestGuard guard(&tombstones);
  pipeline::JobRunner runner(kv->get(), &jobs, &errors, *job,
                             "job/" + std::to_string(job->id) + "/crawl", pipeline::JobOptions{});
  pipeline::Engine engine(pipeline::EngineOptions{}, source->get(), {&verify, &guard}, sink->get(),
                          kv->get(), &runner);

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watcher([&] {
    bool stopped = false;
    uint64_t samples = 0;
    double fetch_sum = 0, resolve_sum = 0;
    std::unique_lock<std::mutex> lock(mu);
    while (!done) {
      out.sampled_peak_kb = std::max(out.sampled_peak_kb, StatusKb("VmRSS"));
      ++samples;
      fetch_sum += static_cast<double>((*source)->http_stats().in_flight);
      resolve_sum += static_cast<double>((*source)->resolver_http_stats().in_flight);
      out.avg_fetch_in_flight = fetch_sum / static_cast<double>(samples);
      out.avg_resolve_in_flight = resolve_sum / static_cast<double>(samples);
      if (std::getenv("XTRACE") && samples % 10 == 0) {
        auto f = (*source)->http_stats();
        auto r = (*source)->resolver_http_stats();
        auto st = (*source)->stats();
        std::fprintf(stderr, "t=%llu fetch if=%lld q=%lld done=%llu | res if=%lld q=%lld done=%llu | queued=%llu fin=%llu pages=%llu\n",
                     (unsigned long long)samples, (long long)f.in_flight, (long long)f.queued, (unsigned long long)f.completed,
                     (long long)r.in_flight, (long long)r.queued, (unsigned long long)r.completed,
                     (unsigned long long)st.units_queued, (unsigned long long)st.units_finished, (unsigned long long)st.listing_pages);
      }
      if (!stopped && stop_when && stop_when(**source)) {
        runner.RequestStop(pipeline::StopKind::kPause);
        stopped = true;
      }
      cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return done; });
    }
  });
  const auto start = std::chrono::steady_clock::now();
  auto ran = runner.Run(&engine);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_one();
  watcher.join();
  out.sampled_peak_kb = std::max(out.sampled_peak_kb, StatusKb("VmRSS"));
  if (!ran.ok()) {
    out.error = ran.status().ToString();
    return out;
  }
  out.job = *ran;
  out.stats = (*source)->stats();
  out.fetch = (*source)->http_stats();
  out.resolve = (*source)->resolver_http_stats();
  out.ok = true;
  return out;
}

CrawlOptions CrawlOf(const simnet::Simnet& net, FetchMode mode) {
  CrawlOptions o;
  o.relay_url = net.relay_url();
  o.resolver.plc_url = net.plc_url();
  o.collections = kCollections;
  o.mode = mode;
  o.allow_loopback_endpoints = true;
  if (const char* e = std::getenv("XPLC")) o.resolver_http.max_per_host = std::atoi(e);
  if (const char* e = std::getenv("XACTIVE")) o.max_active_units = std::atoi(e);
  return o;
}

// Arguments: fetch mode (0 listRecords, 1 getRepo), sink (0 SQLite, 1 dry-run).
void BM_Crawl(benchmark::State& state) {
  const FetchMode mode = state.range(0) == 0 ? FetchMode::kListRecords : FetchMode::kGetRepo;
  const bool dry_run = state.range(1) != 0;
  simnet::SimnetOptions net_options;
  net_options.accounts = kAccounts;
  net_options.pds_hosts = kHosts;
  net_options.latency_ms = kLatencyMs;
  net_options.collections = kCollections;
  net_options.did_web_share = 0.01;
  CrawlRun run;
  uint64_t plc_requests = 0;
  for (auto _ : state) {
    // A fresh network per run: every run starts with simnet's repo cache cold, as the first did.
    auto net = simnet::Simnet::Start(net_options);
    if (!net.ok()) return state.SkipWithError(net.status().ToString().c_str());
    const uint64_t plc_before = (*net)->host_requests(1);
    run = RunCrawl(WorkDir() / "crawl", CrawlOf(**net, mode), dry_run, nullptr);
    state.SetIterationTime(run.seconds);
    plc_requests = (*net)->host_requests(1) - plc_before;
    net->reset();
    if (!run.ok) return state.SkipWithError(run.error.c_str());
    if (run.job.status != state::JobStatus::kCompleted) {
      return state.SkipWithError(("the crawl did not complete: " + run.job.stop_reason.code + " " +
                                  run.job.stop_reason.sentence)
                                     .c_str());
    }
  }
  const CrawlOptions defaults;
  const double latency_s = static_cast<double>(kLatencyMs) / 1000.0;
  const double fetch_in_flight = std::min(
      defaults.http.max_in_flight, defaults.http.max_hosts * defaults.http.max_per_host);
  const double resolver_in_flight = defaults.resolver_http.max_per_host;
  const double fetch_bound = fetch_in_flight / latency_s;
  const double resolver_bound = resolver_in_flight / latency_s;
  const double fetches = static_cast<double>(run.fetch.completed);
  const double resolutions = static_cast<double>(run.resolve.completed);
  const double s = run.seconds;
  const double records = static_cast<double>(run.job.counters.records_written);
  state.counters["records"] = records;
  state.counters["units"] = static_cast<double>(run.stats.units_finished);
  state.counters["records_per_s"] = records / s;
  state.counters["fetch_req"] = fetches;
  state.counters["resolve_req"] = resolutions;
  state.counters["requests_per_s"] = (fetches + resolutions) / s;
  state.counters["fetch_req_per_s"] = fetches / s;
  state.counters["resolve_req_per_s"] = resolutions / s;
  state.counters["bound_req_per_s"] = fetch_bound + resolver_bound;
  state.counters["ratio_to_bound"] = (fetches + resolutions) / s / (fetch_bound + resolver_bound);
  state.counters["fetch_ratio"] = fetches / s / fetch_bound;
  const double stage_bound_s =
      std::max(fetches / fetch_bound, static_cast<double>(plc_requests) / resolver_bound);
  state.counters["stage_bound_s"] = stage_bound_s;
  state.counters["stage_ratio"] = stage_bound_s / s;
  state.counters["elapsed_s"] = s;
  state.counters["avg_fetch_in_flight"] = run.avg_fetch_in_flight;
  state.counters["avg_resolve_in_flight"] = run.avg_resolve_in_flight;
  state.counters["peak_rss_mb"] = static_cast<double>(StatusKb("VmHWM")) / 1024.0;
  state.SetLabel(std::string(sources::FetchModeName(mode)) + (dry_run ? ", dry-run" : ", sqlite"));
}

BENCHMARK(BM_Crawl)
    ->ArgNames({"getRepo", "dry_run"})
    ->Args({0, 0})
    ->Args({0, 1})
    ->Args({1, 0})
    ->Args({1, 1})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Peak RSS while discovering repos: simnet with `accounts` accounts (argument), one collection in
// which every account has one record, latency 0, all accounts active; listReposByCollection
// discovery (1,000 DIDs a page) with the default window of 50,000 units, listRecords into the
// dry-run sink. With the window, listing all accounts means resolving and fetching all but the
// last window's worth too; the job is paused as soon as the listing is done.
//
// Simnet lives in the same process: its generated accounts are there before the crawl starts, and
// it keeps a little per served repo (the commit it signed) as the crawl goes, which is counted as
// the crawl's. peak_rss_mb is the process's VmHWM during the crawl (reset before it starts);
// crawl_rss_mb = peak_rss_mb - the RSS just before the crawl.
void BM_Discovery(benchmark::State& state) {
  const auto accounts = static_cast<uint32_t>(state.range(0));
  simnet::SimnetOptions net_options;
  net_options.accounts = accounts;
  net_options.pds_hosts = kHosts;
  net_options.collections = {kCollections[0]};
  net_options.min_records = 1;
  net_options.max_records = 1;
  net_options.did_web_share = 0;
  net_options.deactivated_share = 0;
  net_options.takendown_share = 0;
  net_options.repo_cache_bytes = uint64_t{8} << 20;
  CrawlRun run;
  int64_t before_kb = 0;
  bool reset = false;
  double generate_s = 0;
  for (auto _ : state) {
    const auto gen_start = std::chrono::steady_clock::now();
    auto net = simnet::Simnet::Start(net_options);
    if (!net.ok()) return state.SkipWithError(net.status().ToString().c_str());
    generate_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - gen_start).count();
    CrawlOptions options = CrawlOf(**net, FetchMode::kListRecords);
    options.collections = {kCollections[0]};
    reset = ResetPeakRss();
    before_kb = StatusKb("VmRSS");
    run = RunCrawl(WorkDir() / "discovery", options, true, [&](const CrawlSource& s) {
      return s.stats().units_queued >= accounts;
    });
    state.SetIterationTime(run.seconds);
    net->reset();
    if (!run.ok) return state.SkipWithError(run.error.c_str());
    if (run.stats.units_queued < accounts) {
      return state.SkipWithError(("listed " + std::to_string(run.stats.units_queued) + " of " +
                                  std::to_string(accounts) + " repos")
                                     .c_str());
    }
  }
  const double peak_kb =
      reset ? static_cast<double>(StatusKb("VmHWM")) : static_cast<double>(run.sampled_peak_kb);
  state.counters["repos_listed"] = static_cast<double>(run.stats.units_queued);
  state.counters["listing_pages"] = static_cast<double>(run.stats.listing_pages);
  state.counters["units_finished"] = static_cast<double>(run.stats.units_finished);
  state.counters["generate_s"] = generate_s;
  state.counters["elapsed_s"] = run.seconds;
  state.counters["rss_before_mb"] = static_cast<double>(before_kb) / 1024.0;
  state.counters["peak_rss_mb"] = peak_kb / 1024.0;
  state.counters["crawl_rss_mb"] = (peak_kb - static_cast<double>(before_kb)) / 1024.0;
  state.counters["sampled_peak_mb"] = static_cast<double>(run.sampled_peak_kb) / 1024.0;
  state.SetLabel(reset ? "VmHWM reset before the crawl" : "VmRSS sampled every 50 ms");
}

BENCHMARK(BM_Discovery)
    ->ArgName("accounts")
    ->Arg(1'000'000)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace atfill

BENCHMARK_MAIN();
