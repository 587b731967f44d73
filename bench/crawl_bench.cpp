// The crawl against simnet on loopback, in-process.
//
// BM_Crawl: 10,000 accounts on 500 PDS hosts, every answer 50 ms late, two collections, the
// default record counts (0..40 per account, log-uniform), 1% did:web accounts. Simnet is generated
// and its repo cache warmed outside the timed part (see CrawlNetwork); the time is the job's run,
// from the first listing request to the last commit, in a fresh state directory. The crawl runs
// listReposByCollection discovery, CID verify and the ingest guard, into a SQLite sink or the
// dry-run sink (to tell the sink's cost apart), in listRecords or getRepo mode, in one of three
// setups (the third argument):
//   setup 0  the default CrawlOptions, as `atfill backfill` would run, with a cold resolver cache;
//            all four mode x sink pairs;
//   setup 1  the same with a warm resolver cache: every DID is resolved once into the job's state
//            store before the job (untimed, as another crawl of the same state would leave it), so
//            the PLC is never asked and only the fetch client binds. fetch_ratio is its figure;
//   setup 2  a cold cache with the PLC's slots (resolver_http.max_per_host) raised to balance the
//            fetch client's: getRepo fetches once per DID, so 192; listRecords ~1.8 times, so 107
//            (plc_slots). Both clients can then be busy at once; ratio_to_bound is its figure.
//
// The bound. A client with N requests in flight against answers that take L seconds makes at most
// N / L requests per second. The crawl has two clients:
//   fetch     listings and listRecords/getRepo: max_in_flight 192 (96 hosts x max_per_host 3
//             allowed, so hosts finishing their last requests leave their slots to others),
//             192 / 0.05 s = 3,840 req/s;
//   resolver  DID documents: PLC is one host, so its max_per_host (32 by default, plc_slots) in
//             flight, 32 / 0.05 s = 640 req/s (each did:web DID has a host of its own and is not
//             held by it).
// The "requests in flight / latency" is read as both clients together, since every unit
// costs a resolution as well as its fetches and both clients' slots are what the crawl has in
// flight: bound_req_per_s = (192 + plc_slots) / 0.05 s (4,480 by default), ratio_to_bound =
// (fetch + resolver requests) / s over it. fetch_ratio is the fetch client alone (fetch requests
// / s over 3,840). Both are reachable only when the two clients' demands match their slots, which
// by default they do not: each DID needs one PLC request and one (getRepo) or ~1.8 (listRecords)
// fetches, so the PLC's 32 slots bind long before the fetch client's 192 (setup 2 balances them;
// with a warm cache, setup 1, resolution costs no request and ratio_to_bound says nothing).
// stage_bound_s = max(fetch requests / 3,840, PLC requests / (plc_slots / 0.05 s)) is the least
// time the limits allow for this crawl; stage_ratio = stage_bound_s / elapsed is how close the
// crawl comes to it. plc_req counts the PLC's requests (simnet's), resolutions the crawl's
// Resolve calls (one per DID and run of it, cache hits included).
//
// Diagnostics: avg_*_in_flight (transfers running, sampled every 50 ms), *_latency_ms (Little's
// law: in flight / rate, to see whether answers took the configured 50 ms or the CPU stretched
// them), avg_unhandled_answers (fetch answers waiting for CrawlSource::Read), cpu_cores (the
// process, simnet included) and busiest_thread (the share of one core its busiest thread used).
//
// BM_Discovery: peak RSS while discovering repos with the default discovery window; see the
// comment above it.
//
//   cmake --build build-bench-crawl --target crawl_bench -j2 && build-bench-crawl/bench/crawl_bench
//   build-bench-crawl/bench/crawl_bench --benchmark_filter='BM_Crawl/.*/setup:1'  (one setup)
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "bench/bench_util.hpp"
#include "bench/planned_stages.hpp"
#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"
#include "pipeline/plan.hpp"
#include "sinks/dry_run_sink.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/crawl/crawl_source.hpp"
#include "sources/crawl/resolver.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"
#include "state/resolver_cache.hpp"
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

fs::path WorkDir() { return bench::WorkDir("crawl-bench"); }
using bench::ProcessCpuSeconds;
using bench::ResetPeakRss;
using bench::StatusKb;

struct CrawlRun {
  bool ok = false;
  std::string error;
  state::JobRecord job;
  sources::CrawlStats stats;
  net::HttpClientStats fetch;
  net::HttpClientStats resolve;
  double seconds = 0;
  double cpu_seconds = 0;       // the process's user + system time during the run (simnet's too)
  int64_t sampled_peak_kb = 0;  // the largest VmRSS seen by the watcher
  // Transfers running, averaged over the watcher's samples.
  double avg_fetch_in_flight = 0;
  double avg_resolve_in_flight = 0;
  double avg_unhandled_answers = 0;
  // The share of one core the busiest thread used during the run.
  double busiest_thread = 0;
};

// Runs one crawl job in a fresh state directory `dir`, as `atfill backfill` does (CID verify, the
// ingest guard, then the sink). Every 50 ms a watcher samples VmRSS and calls `stop_when` with the
// source; when it returns true the job is asked to pause, and the run ends at the next
// checkpoint. `prepare` (when set) runs on the fresh state store before the job, untimed.
CrawlRun RunCrawl(const fs::path& dir, const CrawlOptions& options, bool dry_run,
                  const pipeline::JobOptions& job_options,
                  const std::function<bool(const CrawlSource&)>& stop_when,
                  const std::function<Status(state::KvStore&)>& prepare = nullptr) {
  CrawlRun out;
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto kv = state::OpenRocksDb({.path = (dir / "state").string()});
  if (!kv.ok()) {
    out.error = kv.status().ToString();
    return out;
  }
  if (prepare) {
    if (Status st = prepare(**kv); !st.ok()) {
      out.error = st.ToString();
      return out;
    }
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
  // `atfill backfill`'s stages, made by its own factories.
  auto planned =
      bench::PlannedStages::Make({.kind = "backfill", .kv = kv->get(), .tombstones = &tombstones});
  if (!planned.ok()) {
    out.error = planned.status().ToString();
    return out;
  }
  pipeline::JobRunner runner(kv->get(), &jobs, &errors, *job,
                             "job/" + std::to_string(job->id) + "/crawl", job_options);
  pipeline::Engine engine(pipeline::EngineOptions{}, source->get(), (*planned)->InOrder(),
                          sink->get(), kv->get(), &runner);

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread watcher([&] {
    bool stopped = false;
    uint64_t samples = 0;
    double fetch_sum = 0, resolve_sum = 0, unhandled_sum = 0;
    std::unique_lock<std::mutex> lock(mu);
    while (!done) {
      out.sampled_peak_kb = std::max(out.sampled_peak_kb, StatusKb("VmRSS"));
      ++samples;
      fetch_sum += static_cast<double>((*source)->http_stats().in_flight);
      resolve_sum += static_cast<double>((*source)->resolver_http_stats().in_flight);
      out.avg_fetch_in_flight = fetch_sum / static_cast<double>(samples);
      out.avg_resolve_in_flight = resolve_sum / static_cast<double>(samples);
      // Fetch answers that arrived and wait for Read to handle them (their units hold an active
      // slot meanwhile): every completed fetch request but the listing pages and the units
      // finished (one fetch each here).
      {
        const sources::CrawlStats st = (*source)->stats();
        const auto fetched = static_cast<double>((*source)->http_stats().completed);
        unhandled_sum +=
            std::max(0.0, fetched - static_cast<double>(st.listing_pages + st.units_finished));
        out.avg_unhandled_answers = unhandled_sum / static_cast<double>(samples);
      }
      if (!stopped && stop_when && stop_when(**source)) {
        runner.RequestStop(pipeline::StopKind::kPause);
        stopped = true;
      }
      cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return done; });
    }
  });
  const auto ticks_start = bench::ThreadTicks();
  const double cpu_start = ProcessCpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  auto ran = runner.Run(&engine);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.cpu_seconds = ProcessCpuSeconds() - cpu_start;
  for (const auto& [tid, cpu] : bench::ThreadTicks()) {
    auto it = ticks_start.find(tid);
    const long used = cpu.ticks - (it == ticks_start.end() ? 0 : it->second.ticks);
    out.busiest_thread =
        std::max(out.busiest_thread, static_cast<double>(used) /
                                         static_cast<double>(::sysconf(_SC_CLK_TCK)) / out.seconds);
  }
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
  return o;
}

// The network of BM_Crawl, generated once (outside the timed part) and shared by its runs. Simnet
// builds a repo (records, MST, signed commit, CAR) the first time one is asked for and keeps it
// (the 200 MiB repo cache holds all 10,000); an untimed crawl first warms that cache, so the
// timed runs measure the crawl rather than simnet's repo building, which on this 2-core machine
// would otherwise take about half the CPU of the first run.
simnet::Simnet* CrawlNetwork() {
  static std::unique_ptr<simnet::Simnet> net = []() -> std::unique_ptr<simnet::Simnet> {
    simnet::SimnetOptions o;
    o.accounts = kAccounts;
    o.pds_hosts = kHosts;
    o.latency_ms = kLatencyMs;
    o.collections = kCollections;
    o.did_web_share = 0.01;
    auto started = simnet::Simnet::Start(o);
    if (!started.ok()) return nullptr;
    CrawlOptions warm = CrawlOf(**started, FetchMode::kGetRepo);
    warm.resolver_http.max_per_host = 1000;
    warm.resolver_http.max_in_flight = 1000;
    warm.http.max_hosts = kHosts;
    warm.http.max_in_flight = 2000;
    const CrawlRun run = RunCrawl(WorkDir() / "warm", warm, true, {}, nullptr);
    if (!run.ok || run.job.status != state::JobStatus::kCompleted) return nullptr;
    return std::move(*started);
  }();
  return net.get();
}

// Resolves every account of `net` once into the resolver cache of `kv` (what a crawl of the same
// network before, or another job of the same state, leaves behind), many at once.
Status WarmResolverCache(const simnet::Simnet& net, state::KvStore& kv) {
  net::HttpClientOptions http;
  http.allow_private_addresses = true;
  http.max_hosts = static_cast<int>(kHosts) + 64;
  http.max_per_host = 1000;
  http.max_in_flight = 1000;
  ATFILL_ASSIGN_OR_RETURN(auto client, net::HttpClient::Start(http));
  state::ResolverCache cache(kv);
  sources::ResolverOptions options;
  options.plc_url = net.plc_url();
  options.allow_loopback_endpoints = true;
  sources::DidResolver resolver(client.get(), &cache, options);
  std::mutex mu;
  std::condition_variable cv;
  size_t left = net.network().accounts().size(), failed = 0;
  std::string first_error;
  for (const auto& account : net.network().accounts()) {
    resolver.Resolve(account.did, [&](sources::ResolveOutcome outcome) {
      std::lock_guard<std::mutex> lock(mu);
      if (!outcome.ok() && failed++ == 0) first_error = outcome.message;
      if (--left == 0) cv.notify_one();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return left == 0; });
  if (failed != 0) {
    return Status::Internal("warming the resolver cache: " + std::to_string(failed) +
                            " DIDs did not resolve, first: " + first_error);
  }
  return Status::OK();
}

// The setups of BM_Crawl (its third argument).
enum Setup : int64_t {
  kDefault = 0,    // the default CrawlOptions, a cold resolver cache
  kWarmCache = 1,  // every DID in the resolver cache before the job: only the fetch client binds
  kBalanced = 2,   // a cold cache, the PLC's slots raised to match the fetch client's demand
};

// PLC slots whose requests/s at saturation match the fetch client's: fetch slots x PLC requests
// per fetch request. getRepo fetches once per DID (192); listRecords ~1.8 times (a unit per
// collection the DID has records in, a page of up to 100 records each): 192 / 1.8 = ~107.
int BalancedPlcSlots(FetchMode mode, int fetch_slots) {
  return mode == FetchMode::kGetRepo ? fetch_slots : (fetch_slots * 10 + 9) / 18;
}

// Arguments: fetch mode (0 listRecords, 1 getRepo), sink (0 SQLite, 1 dry-run), setup (above).
void BM_Crawl(benchmark::State& state) {
  const FetchMode mode = state.range(0) == 0 ? FetchMode::kListRecords : FetchMode::kGetRepo;
  const bool dry_run = state.range(1) != 0;
  const auto setup = static_cast<Setup>(state.range(2));
  simnet::Simnet* net = CrawlNetwork();
  if (net == nullptr) return state.SkipWithError("simnet did not start or warm up");
  CrawlOptions options = CrawlOf(*net, mode);
  const int fetch_slots =
      std::min(options.http.max_in_flight, options.http.max_hosts * options.http.max_per_host);
  if (setup == kBalanced) {
    options.resolver_http.max_per_host = BalancedPlcSlots(mode, fetch_slots);
    options.resolver_http.max_in_flight =
        std::max(options.resolver_http.max_in_flight, 2 * options.resolver_http.max_per_host);
  }
  CrawlRun run;
  uint64_t plc_requests = 0, repos_built = 0;
  int64_t before_kb = 0;
  for (auto _ : state) {
    uint64_t plc_before = net->host_requests(1);
    const uint64_t built_before = net->stats().repos_built;
    ResetPeakRss();
    before_kb = StatusKb("VmRSS");
    std::function<Status(state::KvStore&)> prepare;
    if (setup == kWarmCache) {
      prepare = [&](state::KvStore& kv) {
        Status st = WarmResolverCache(*net, kv);
        plc_before = net->host_requests(1);
        return st;
      };
    }
    run = RunCrawl(WorkDir() / "crawl", options, dry_run, {}, nullptr, prepare);
    state.SetIterationTime(run.seconds);
    plc_requests = net->host_requests(1) - plc_before;
    repos_built = net->stats().repos_built - built_before;
    if (!run.ok) return state.SkipWithError(run.error.c_str());
    if (run.job.status != state::JobStatus::kCompleted) {
      return state.SkipWithError(("the crawl did not complete: " + run.job.stop_reason.code + " " +
                                  run.job.stop_reason.sentence)
                                     .c_str());
    }
  }
  const double latency_s = static_cast<double>(kLatencyMs) / 1000.0;
  const double fetch_in_flight = fetch_slots;
  const double resolver_in_flight = options.resolver_http.max_per_host;
  const double fetch_bound = fetch_in_flight / latency_s;
  const double resolver_bound = resolver_in_flight / latency_s;
  const double fetches = static_cast<double>(run.fetch.completed);
  const double resolutions = static_cast<double>(run.resolve.completed);
  const double s = run.seconds;
  const double records = static_cast<double>(run.job.counters.records_written);
  state.counters["simnet_repos_built"] = static_cast<double>(repos_built);
  // Little's law: the time a request took on average, queueing in the client excluded.
  state.counters["fetch_latency_ms"] = run.avg_fetch_in_flight / (fetches / s) * 1000.0;
  state.counters["resolve_latency_ms"] = run.avg_resolve_in_flight / (resolutions / s) * 1000.0;
  state.counters["records"] = records;
  state.counters["units"] = static_cast<double>(run.stats.units_finished);
  state.counters["records_per_s"] = records / s;
  state.counters["fetch_req"] = fetches;
  state.counters["resolve_req"] = resolutions;
  state.counters["plc_req"] = static_cast<double>(plc_requests);
  state.counters["plc_slots"] = resolver_in_flight;
  state.counters["resolutions"] = static_cast<double>(run.stats.resolutions);
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
  state.counters["cpu_cores"] = run.cpu_seconds / s;
  state.counters["avg_fetch_in_flight"] = run.avg_fetch_in_flight;
  state.counters["avg_resolve_in_flight"] = run.avg_resolve_in_flight;
  state.counters["avg_unhandled_answers"] = run.avg_unhandled_answers;
  state.counters["busiest_thread"] = run.busiest_thread;
  // The process: the crawl, and simnet with its 10,000 accounts and their repos (~100 MB). The
  // crawl reuses the heap of the runs before it, so peak - before says little after the first.
  state.counters["peak_rss_mb"] = static_cast<double>(StatusKb("VmHWM")) / 1024.0;
  state.counters["rss_before_mb"] = static_cast<double>(before_kb) / 1024.0;
  state.SetLabel(std::string(sources::FetchModeName(mode)) + (dry_run ? ", dry-run" : ", sqlite") +
                 (setup == kWarmCache ? ", warm resolver cache"
                  : setup == kBalanced
                      ? ", PLC slots " + std::to_string(static_cast<int>(resolver_in_flight))
                      : ""));
}

// Peak RSS while discovering repos. The issue asks for 1,000,000; simnet cannot generate that
// many here: each account costs ~0.4 ms of CPU (its secp256k1 public key, derived with OpenSSL)
// and ~0.75 KiB of simnet's memory in this process, so 1,000,000 would take ~7 minutes and
// ~750 MB before the crawl starts. The run lists kDiscoveryAccounts instead, more than the default
// discovery window: the window fills (50,000 units queued and unfinished, in memory, the most the
// crawl holds) and the rest is listed only as units finish, the state in which every later page of
// a 1,000,000-repo listing would be read.
//
// Simnet: one collection in which every account has one record (so listReposByCollection names
// every account), every account active, relay and PDS answers at once, and every DID document
// naming a private PDS endpoint (http://10.0.0.1), so each unit ends at resolution (bad_endpoint,
// one PLC request, no fetch) and the fetch client is left to the listing. PLC answers 10 ms late
// (32 in flight: at most 3,200 units finish a second) so the listing (~25 pages of 1,000 a second)
// runs ahead and fills the window, as a relay does ahead of a crawl on the real network. With
// real repos to fetch on this 2-core machine the listing instead waits behind ~600 queued fetches
// for a host slot (max_hosts), the window never fills, and listing 100,000 takes minutes. The
// error log keeps its 10,000-entry cap (then counts per kind) and the job does not stop at it.
//
// listReposByCollection discovery (1,000 DIDs a page) with the default window, into a SQLite sink
// (which receives no records). The job is paused as soon as every account is listed. Simnet's
// accounts are in the process before the crawl starts: peak_rss_mb is the process's VmHWM during
// the crawl (reset before it starts), crawl_rss_mb = peak_rss_mb - the RSS just before the crawl,
// window_full_rss_mb the RSS when the window first filled, rss_growth_mb_per_100k the RSS growth
// per 100,000 repos listed after that.
//
// The default size keeps the whole program under 3 minutes here; ATFILL_CRAWL_BENCH_ACCOUNTS
// (up to 1,000,000) lists more, for a steadier growth figure.
constexpr uint32_t kDiscoveryAccounts = 80'000;

void BM_Discovery(benchmark::State& state) {
  auto accounts = static_cast<uint32_t>(state.range(0));
  if (const char* env = std::getenv("ATFILL_CRAWL_BENCH_ACCOUNTS")) {
    accounts = static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  }
  simnet::SimnetOptions net_options;
  net_options.accounts = accounts;
  net_options.pds_hosts = kHosts;
  net_options.collections = {kCollections[0]};
  net_options.min_records = 1;
  net_options.max_records = 1;
  net_options.did_web_share = 0;
  net_options.deactivated_share = 0;
  net_options.takendown_share = 0;
  auto faults = simnet::ParseFaultSpec("pds:private_endpoint=always;plc:latency_ms=10");
  if (!faults.ok()) return state.SkipWithError(faults.status().ToString().c_str());
  net_options.faults = *faults;
  CrawlRun run;
  int64_t before_kb = 0, window_full_kb = 0;
  uint64_t window_full_listed = 0;
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
    pipeline::JobOptions job_options;
    job_options.stop_at_error_cap = false;
    reset = ResetPeakRss();
    before_kb = StatusKb("VmRSS");
    const uint64_t window = options.discovery_window;
    run = RunCrawl(WorkDir() / "discovery", options, false, job_options,
                   [&](const CrawlSource& source) {
                     const sources::CrawlStats s = source.stats();
                     if (window_full_kb == 0 && s.units_queued - s.units_finished >= window) {
                       window_full_kb = StatusKb("VmRSS");
                       window_full_listed = s.units_queued;
                     }
                     return s.units_queued >= accounts;
                   });
    state.SetIterationTime(run.seconds);
    net->reset();
    ::malloc_trim(0);  // hand simnet's heap back, so BM_Crawl's RSS figures do not carry it
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
  if (window_full_kb > 0) {
    state.counters["window_full_rss_mb"] = static_cast<double>(window_full_kb) / 1024.0;
    const double listed_after = static_cast<double>(run.stats.units_queued - window_full_listed);
    if (listed_after > 0) {
      state.counters["rss_growth_mb_per_100k"] =
          static_cast<double>(run.sampled_peak_kb - window_full_kb) / 1024.0 * 100'000 /
          listed_after;
    }
  }
  state.SetLabel(reset ? "VmHWM reset before the crawl" : "VmRSS sampled every 50 ms");
}

BENCHMARK(BM_Discovery)
    ->ArgName("accounts")
    ->Arg(kDiscoveryAccounts)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Discovery first: its peak RSS is then not the crawl runs' (whose network stays loaded).
BENCHMARK(BM_Crawl)
    ->ArgNames({"getRepo", "dry_run", "setup"})
    ->Args({0, 0, kDefault})
    ->Args({0, 1, kDefault})
    ->Args({1, 0, kDefault})
    ->Args({1, 1, kDefault})
    ->Args({0, 0, kWarmCache})
    ->Args({1, 0, kWarmCache})
    ->Args({0, 0, kBalanced})
    ->Args({1, 0, kBalanced})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace atfill

BENCHMARK_MAIN();
