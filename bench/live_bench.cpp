// The live consumer against simnet's Jetstream on loopback, in-process: the Jetstream source (v2
// subscribeEvents, zstd with simnet's trained dictionary or uncompressed), CID verify, the account
// check (each #account deletion asks simnet's PDS), the live hold stage (idle: no backfill beside
// it), the ingest guard (with the live consumer's
// delete-tombstone rule) and the SQLite sink, state in
// RocksDB, as `atfill run` runs it (its [live] batch defaults), with the engine's workers set to 4.
//
// BM_LiveCatchUp: the whole log (kEvents events) is published before the consumer connects with
// cursor seq 1, so the consumer reads as fast as it can apply: events_per_s is its sustained
// ceiling. The job ends when the stream has been quiet for kIdleMs; that wait is not counted.
//
// BM_LiveAtRate: simnet publishes the log at a fixed rate (events/s, the second argument) from
// the moment it starts, and the consumer follows from seq 1. Every 20 ms a watcher compares what
// simnet has published with what the job has committed; max_lag_events is the largest gap seen,
// max_lag_ms the same in time at that rate, final_lag_ms how long after the last event was
// published the consumer had committed it. A lag that stays at a few batches means the consumer
// keeps up at that rate; one that grows with the run means it does not.
//
// Simnet generates its log and renders and compresses every frame (JetstreamOptions::prerender)
// outside the timed part; it runs in this process and shares the 2 cores with the consumer,
// sending every frame over loopback.
// simnet_cores and consumer_cores split the process's CPU by thread (simnet's io threads are named
// simnet-io); consumer_cpu_us_per_event is the consumer's CPU per event, so 2 cores /
// consumer_cpu_us_per_event is what this consumer could reach on this machine with the Jetstream
// elsewhere (an estimate: the measured figure is events_per_s).
//
//
// BM_FirehoseVerify: the relay firehose's per-frame work, without the network: each frame of the
// shared relay capture (150 real frames, 148 commits, ../shared/protocols/jetstream/data/
// internal/corpus/testdata) decoded, every commit verified as sync 1.1 says (signature with the
// repo's key, already resolved; record blocks; the ops inverted onto the partial MST) and turned
// into record events with JSON bodies, on one thread. events_per_s counts record ops and
// frames_per_s frames, both per second of that thread's CPU time (a shared machine's load
// stretches the wall clock, not the work).
//
//   cmake --build build --target live_bench -j2 && build/bench/live_bench
#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <unistd.h>

#include <simdjson.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "bench/bench_util.hpp"
#include "bench/jetstream_backlog.hpp"
#include "bench/planned_stages.hpp"
#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"
#include "pipeline/plan.hpp"
#include "sinks/dry_run_sink.hpp"
#include "sinks/sqlite_reader.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/crawl/pds_account_status.hpp"
#include "sources/crawl/resolver.hpp"
#include "sources/firehose/firehose.hpp"
#include "sources/firehose/firehose_frames.hpp"
#include "sources/jetstream/jetstream.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"
#include "state/resolver_cache.hpp"
#include "state/tombstones.hpp"
#include "tools/simnet/firehose_relay.hpp"
#include "tools/simnet/jetstream.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill {
namespace {

namespace fs = std::filesystem;

// ATFILL_LIVE_BENCH_EVENTS replaces it (a slow rate's run takes events / rate seconds).
const uint64_t kEvents = [] {
  const char* e = std::getenv("ATFILL_LIVE_BENCH_EVENTS");
  return e != nullptr ? std::strtoull(e, nullptr, 10) : uint64_t{300'000};
}();
constexpr int64_t kIdleMs = 400;

fs::path WorkDir() { return bench::WorkDir("live-bench"); }
using bench::ProcessCpuSeconds;
using bench::StatusKb;

simnet::SimnetOptions Network(double rate) { return bench::JetstreamBacklog(kEvents, rate); }

// CPU clock ticks used so far by simnet's io threads (which live as long as simnet).
long SimnetTicks() {
  long ticks = 0;
  for (const auto& [tid, cpu] : bench::ThreadTicks()) {
    if (cpu.name == "simnet-io") ticks += cpu.ticks;
  }
  return ticks;
}

// A relay firehose for BM_FirehoseCatchUp: the relay serving a log of the network's repos as
// signed commits, and how many events (record ops and #account frames) the log holds.
struct FirehoseFeed {
  const simnet::FirehoseRelay* relay = nullptr;
  uint64_t events = 0;
  uint32_t workers = 2;  // the engine's workers, which decode and verify the commits
};

struct LiveRun {
  std::string error;
  state::JobRecord job;
  sources::JetstreamStats stats;  // with a firehose: messages, bytes and connections only
  double seconds = 0;             // from the job's start to its end, the idle wait excluded
  uint64_t max_lag_events = 0;
  double final_lag_ms = 0;
  uint64_t batches = 0;  // committed
  double simnet_cpu_s = 0, consumer_cpu_s = 0;
  double rss_growth_mb = 0;  // peak RSS during the run less the RSS before it
};

// One live job in a fresh directory, from seq 1 until the stream has been idle for kIdleMs.
// `published` (may be null) says how many events simnet has published now.
// With `firehose` set, the source is the relay firehose instead of simnet's Jetstream.
LiveRun RunLive(const simnet::Simnet& net, bool compress,
                const std::function<uint64_t()>& published, bool dry_run = false,
                const FirehoseFeed* firehose = nullptr) {
  LiveRun out;
  const uint64_t events = firehose != nullptr ? firehose->events : kEvents;
  const fs::path dir = WorkDir() / "live";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto kv = state::OpenRocksDb({.path = (dir / "state").string()});
  if (!kv.ok()) {
    out.error = kv.status().ToString();
    return out;
  }
  sinks::SqliteSinkOptions sink_options;
  sink_options.path = (dir / "db.sqlite").string();
  auto sink = dry_run ? sinks::NewDryRunSink() : sinks::OpenSqliteSink(sink_options);
  if (!sink.ok()) {
    out.error = sink.status().ToString();
    return out;
  }
  state::JobStore jobs(**kv);
  state::ErrorLog errors(**kv);
  state::JobRecord prototype;
  prototype.kind = "live";
  prototype.created_us = pipeline::NowMicros();
  prototype.started_by = "live_bench";
  auto job = jobs.Create(prototype);
  if (!job.ok()) {
    out.error = job.status().ToString();
    return out;
  }
  sources::JetstreamOptions options;
  options.hosts = {net.jetstream_url()};
  options.protocol = sources::JetstreamProtocol::kV2;
  options.compress = compress;
  options.idle_exit_ms = kIdleMs;
  options.start_seq = 1;
  Result<std::unique_ptr<pipeline::Source>> source = Status::Internal("no source");
  std::function<sources::JetstreamStats()> stats;
  if (firehose == nullptr) {
    auto jetstream = sources::JetstreamSource::Create(options, kv->get());
    if (jetstream.ok()) {
      stats = [s = jetstream->get()] { return s->stats(); };
      source = std::unique_ptr<pipeline::Source>(std::move(*jetstream));
    } else {
      source = jetstream.status();
    }
  } else {
    // `atfill run` with [live] protocol = "firehose": every commit verified, keys resolved
    // through simnet's PLC directory.
    sources::FirehoseOptions fo;
    fo.hosts = {firehose->relay->url()};
    fo.start_seq = 1;
    fo.idle_exit_ms = kIdleMs;
    fo.resolver.plc_url = net.plc_url();
    fo.resolver.allow_loopback_endpoints = true;
    fo.http.allow_private_addresses = true;
    auto made = sources::FirehoseSource::Create(std::move(fo), kv->get());
    if (made.ok()) {
      stats = [s = made->get()] {
        const sources::FirehoseStats f = s->stats();
        sources::JetstreamStats j;
        j.messages = f.messages;
        j.bytes = f.bytes;
        j.connections = f.connections;
        j.last_seq = f.last_seq;
        return j;
      };
      source = std::unique_ptr<pipeline::Source>(std::move(*made));
    } else {
      source = made.status();
    }
  }
  if (!source.ok()) {
    out.error = source.status().ToString();
    return out;
  }
  state::Tombstones tombstones(**kv);
  // The account check, as `atfill run` has it by default: each deletion asks simnet's PDS.
  net::HttpClientOptions check_http_options;
  check_http_options.allow_private_addresses = true;
  auto check_http = net::HttpClient::Start(check_http_options);
  if (!check_http.ok()) {
    out.error = check_http.status().ToString();
    return out;
  }
  sources::ResolverOptions resolver_options;
  resolver_options.plc_url = net.plc_url();
  resolver_options.allow_loopback_endpoints = true;
  state::ResolverCache resolver_cache(**kv);
  sources::DidResolver resolver(check_http->get(), &resolver_cache, resolver_options);
  sources::PdsAccountStatus lookup(&resolver, check_http->get());
  // `atfill run`'s stages, made by its own factories: CID verification, the account check, the
  // live hold (what it costs with no backfill beside it) and the guard with the live
  // delete-tombstone rule (a sink lookup per delete the run has not seen a create for).
  pipeline::SinkReaders readers;
  if (!dry_run) readers.holds = sinks::SqliteHoldsRecords(sink_options.path);
  auto planned = bench::PlannedStages::Make({.kind = "live",
                                             .kv = kv->get(),
                                             .tombstones = &tombstones,
                                             .jobs = &jobs,
                                             .readers = std::move(readers),
                                             .account_status = &lookup});
  if (!planned.ok()) {
    out.error = planned.status().ToString();
    return out;
  }
  pipeline::JobOptions job_options;
  job_options.record_batches = true;  // to count the batches
  pipeline::JobRunner runner(kv->get(), &jobs, &errors, *job, "live", job_options);
  pipeline::EngineOptions engine_options;
  engine_options.workers = firehose != nullptr ? firehose->workers : 4;
  // `atfill run`'s [live] batch defaults (sources::SourceSettings::live_batch).
  // ATFILL_LIVE_BENCH_BATCH = "events,chunks,ms" tries others.
  engine_options.batch = {.max_events = 50'000, .max_delay_ms = 1000, .max_chunks = 128};
  if (const char* e = std::getenv("ATFILL_LIVE_BENCH_BATCH")) {
    unsigned long long events = 0, chunks = 0;
    long long ms = 0;
    if (std::sscanf(e, "%llu,%llu,%lld", &events, &chunks, &ms) == 3) {
      engine_options.batch = {.max_events = events, .max_delay_ms = ms, .max_chunks = chunks};
    }
  }
  pipeline::Engine engine(engine_options, source->get(), (*planned)->InOrder(), sink->get(),
                          kv->get(), &runner);

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  const auto start = std::chrono::steady_clock::now();
  std::atomic<int64_t> caught_up_us{-1};  // when the job had committed every published event
  std::thread watcher([&] {
    std::unique_lock<std::mutex> lock(mu);
    while (!done) {
      const uint64_t applied = runner.Snapshot().counters.events_read;
      const uint64_t pub = published ? published() : events;
      if (pub > applied) out.max_lag_events = std::max(out.max_lag_events, pub - applied);
      if (applied >= events && caught_up_us.load() < 0) {
        caught_up_us = std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count();
      }
      cv.wait_for(lock, std::chrono::milliseconds(20), [&] { return done; });
    }
  });
  bench::ResetPeakRss();
  const int64_t rss_before_kb = StatusKb("VmRSS");
  const long simnet_before = SimnetTicks();
  const double cpu_before = ProcessCpuSeconds();
  auto ran = runner.Run(&engine);
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  out.simnet_cpu_s = static_cast<double>(SimnetTicks() - simnet_before) / tick;
  // The process (threads that ended during the run included) less simnet's io threads.
  out.consumer_cpu_s = ProcessCpuSeconds() - cpu_before - out.simnet_cpu_s;
  out.rss_growth_mb = static_cast<double>(StatusKb("VmHWM") - rss_before_kb) / 1024.0;
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_one();
  watcher.join();
  out.seconds = wall - static_cast<double>(kIdleMs) / 1000.0;
  out.stats = stats();
  if (!ran.ok()) {
    out.error = ran.status().ToString();
    return out;
  }
  out.job = *ran;
  if (auto audit = jobs.ListBatchAudit(out.job.id, 0, 1'000'000); audit.ok()) {
    out.batches = audit->size();
  }
  if (out.job.counters.events_read != events) {
    out.error = "the job applied " + std::to_string(out.job.counters.events_read) + " of " +
                std::to_string(events) + " events (" + out.job.stop_reason.code + ")";
    if (auto kinds = errors.CountsByKind(out.job.id); kinds.ok()) {
      for (const auto& [kind, n] : *kinds) out.error += "; " + kind + " " + std::to_string(n);
    }
  }
  // When the watcher did not see the last event committed before the run ended, the run's end
  // (the idle wait excluded) is when it was.
  out.final_lag_ms =
      caught_up_us.load() >= 0 ? static_cast<double>(caught_up_us.load()) / 1e3 : out.seconds * 1e3;
  return out;
}

void Report(benchmark::State& state, const LiveRun& run) {
  const double s = run.seconds;
  state.counters["events"] = static_cast<double>(run.job.counters.events_read);
  state.counters["events_per_s"] = static_cast<double>(run.job.counters.events_read) / s;
  state.counters["records_written"] = static_cast<double>(run.job.counters.records_written);
  state.counters["wire_mb"] = static_cast<double>(run.stats.bytes) / 1e6;
  state.counters["wire_bytes_per_event"] =
      static_cast<double>(run.stats.bytes) / static_cast<double>(run.job.counters.events_read);
  state.counters["batches"] = static_cast<double>(run.batches);
  state.counters["connections"] = static_cast<double>(run.stats.connections);
  state.counters["overflow_drops"] = static_cast<double>(run.stats.overflow_drops);
  state.counters["errors"] = static_cast<double>(run.job.counters.failed_records);
  state.counters["account_checks"] = static_cast<double>(
      run.job.counters.extra.count("account_checks") ? run.job.counters.extra.at("account_checks")
                                                     : 0);
  state.counters["elapsed_s"] = s;
  // What the run added to the process's memory at its peak (simnet's log and frames were there
  // before): the consumer's batches, buffers and caches.
  state.counters["rss_growth_mb"] = run.rss_growth_mb;
  // Over the whole run, the idle wait at the end included (little CPU).
  state.counters["simnet_cores"] = run.simnet_cpu_s / (s + kIdleMs / 1000.0);
  state.counters["consumer_cores"] = run.consumer_cpu_s / (s + kIdleMs / 1000.0);
  state.counters["consumer_cpu_us_per_event"] =
      run.consumer_cpu_s * 1e6 / static_cast<double>(run.job.counters.events_read);
}

// Arguments: compression (0 off, 1 zstd with the host's dictionary), sink (0 SQLite, 1 dry-run:
// everything but the database, to tell its share apart).
void BM_LiveCatchUp(benchmark::State& state) {
  const bool compress = state.range(0) != 0;
  const bool dry_run = state.range(1) != 0;
  static std::unique_ptr<simnet::Simnet> net = [] {
    auto started = simnet::Simnet::Start(Network(0));
    return started.ok() ? std::move(*started) : nullptr;
  }();
  if (net == nullptr) return state.SkipWithError("simnet did not start");
  LiveRun run;
  for (auto _ : state) {
    run = RunLive(*net, compress, nullptr, dry_run);
    state.SetIterationTime(run.seconds);
    if (!run.error.empty()) return state.SkipWithError(run.error.c_str());
  }
  Report(state, run);
  state.SetLabel(std::string(compress ? "v2, zstd" : "v2, uncompressed") +
                 (dry_run ? ", dry-run" : ", sqlite"));
}

// Arguments: compression, publication rate in events/s.
void BM_LiveAtRate(benchmark::State& state) {
  const bool compress = state.range(0) != 0;
  const auto rate = static_cast<double>(state.range(1));
  LiveRun run;
  for (auto _ : state) {
    simnet::SimnetOptions o = Network(rate);
    o.jetstream.published_at_start = 0;
    auto net = simnet::Simnet::Start(o);
    if (!net.ok()) return state.SkipWithError(net.status().ToString().c_str());
    const auto published_from = std::chrono::steady_clock::now();
    const simnet::JetstreamLog* log = (*net)->jetstream();
    run = RunLive(**net, compress, [&] {
      return std::min<uint64_t>(
          kEvents, log->PublishedAt(std::chrono::steady_clock::now() - published_from));
    });
    state.SetIterationTime(run.seconds);
    if (!run.error.empty()) return state.SkipWithError(run.error.c_str());
    // How long after the last publication the consumer had it committed.
    const double last_published_ms =
        std::chrono::duration<double, std::milli>(log->PublishTime(kEvents)).count();
    run.final_lag_ms = std::max(0.0, run.final_lag_ms - last_published_ms);
  }
  Report(state, run);
  state.counters["rate"] = rate;
  state.counters["max_lag_events"] = static_cast<double>(run.max_lag_events);
  state.counters["max_lag_ms"] = static_cast<double>(run.max_lag_events) / rate * 1000.0;
  state.counters["final_lag_ms"] = run.final_lag_ms;
  state.SetLabel(compress ? "v2, zstd" : "v2, uncompressed");
}

// The shared relay capture, read once: its frames and each commit DID's key.
struct RelayCapture {
  std::vector<Bytes> frames;
  std::map<std::string, atproto::PublicKey> keys;
  std::string error;
};

// The file's bytes decompressed (one zstd frame), or "" when it cannot be read.
std::string ReadZstdFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string packed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto decoder = sources::ZstdFrameDecoder::Create(nullptr, 64u << 20);
  std::string out, kind;
  if (packed.empty() || !decoder.ok() || !decoder->Decompress(AsBytes(packed), &out, &kind).ok()) {
    return "";
  }
  return out;
}

const RelayCapture& Capture() {
  static const RelayCapture capture = [] {
    RelayCapture c;
    const char* env = std::getenv("ATFILL_SHARED");
    const std::filesystem::path dir =
        std::filesystem::path(env != nullptr && *env != '\0' ? env : ATFILL_DEFAULT_SHARED_DIR) /
        "protocols/jetstream/data/internal/corpus/testdata";
    const std::string raw = ReadZstdFile(dir / "frames.bin.zst");
    const std::string docs = ReadZstdFile(dir / "did_docs.json.zst");
    if (raw.empty() || docs.empty()) {
      c.error = "the relay capture is not in " + dir.string() + " (set ATFILL_SHARED)";
      return c;
    }
    for (size_t pos = 0; pos + 4 <= raw.size();) {
      uint32_t len = 0;
      std::memcpy(&len, raw.data() + pos, 4);
      pos += 4;
      if (len > raw.size() - pos) break;
      c.frames.emplace_back(raw.begin() + static_cast<std::ptrdiff_t>(pos),
                            raw.begin() + static_cast<std::ptrdiff_t>(pos + len));
      pos += len;
    }
    simdjson::dom::parser parser;
    simdjson::dom::object object;
    if (parser.parse(docs).get(object) != simdjson::SUCCESS) {
      c.error = "did_docs.json.zst is not a JSON object";
      return c;
    }
    for (auto [did, doc] : object) {
      const sources::ResolveOutcome out =
          sources::ParseDidDocument(did, simdjson::minify(doc), sources::ResolverOptions{}, 0);
      if (!out.ok()) continue;
      auto key = atproto::PublicKey::FromMultibase(out.doc->signing_key);
      if (key.ok()) c.keys.emplace(std::string(did), *key);
    }
    return c;
  }();
  return capture;
}

void BM_FirehoseVerify(benchmark::State& state) {
  const RelayCapture& capture = Capture();
  if (!capture.error.empty()) return state.SkipWithError(capture.error.c_str());
  uint64_t frames = 0, events = 0, bytes = 0;
  std::string failure;
  std::vector<pipeline::Event> out;
  for (auto _ : state) {
    for (const Bytes& bytes_in : capture.frames) {
      sources::FirehoseFrame frame;
      std::string kind;
      if (!sources::DecodeFirehoseFrame(bytes_in, &frame, &kind).ok()) failure = kind;
      ++frames;
      bytes += bytes_in.size();
      const auto* commit = std::get_if<sources::FirehoseCommit>(&frame.payload);
      if (commit == nullptr) continue;
      const auto key = capture.keys.find(commit->repo);
      if (key == capture.keys.end()) {
        failure = "no key for " + commit->repo;
        continue;
      }
      sources::VerifiedCommit verified;
      if (!sources::VerifyFirehoseCommit(*commit, key->second, &verified, &kind).ok() ||
          !sources::FirehoseCommitEvents(*commit, verified, pipeline::Origin::kLive, &out, &kind)
               .ok()) {
        failure = kind;
      }
      events += out.size();
      out.clear();
    }
  }
  if (!failure.empty()) return state.SkipWithError(("a frame failed: " + failure).c_str());
  state.counters["frames_per_s"] =
      benchmark::Counter(static_cast<double>(frames), benchmark::Counter::kIsRate);
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}

// The relay firehose into SQLite, as `atfill run` runs it with [live] protocol = "firehose": a
// relay (in this process, on loopback) serves simnet's repos as chains of signed commits from
// seq 1; the consumer decodes and verifies every commit, follows each repo's chain and writes
// through the same stages and sink as BM_LiveCatchUp. events counts the frames the job applied
// (each a commit of 1 to 4 record ops), ops the record ops (ops_per_s, wire_bytes_per_op and
// consumer_cpu_us_per_op compare with BM_LiveCatchUp's per-event figures: one op per event);
// wire_mb is what it read.
void BM_FirehoseCatchUp(benchmark::State& state) {
  struct Feed {
    std::unique_ptr<simnet::Simnet> net;
    std::unique_ptr<simnet::FirehoseRelay> relay;
    uint64_t events = 0;  // frames (the job counts each as one event)
    uint64_t ops = 0;     // record ops in them
    std::string error;
  };
  static Feed feed = [] {
    Feed f;
    simnet::SimnetOptions o = Network(0);
    o.jetstream.events = 0;
    o.accounts = 4'000;
    o.min_records = 4;
    o.max_records = 40;
    o.distribution = simnet::RecordCountDistribution::kUniform;
    o.deactivated_share = 0;
    o.takendown_share = 0;
    auto net = simnet::Simnet::Start(o);
    if (!net.ok()) {
      f.error = net.status().ToString();
      return f;
    }
    simnet::FirehoseLogOptions lo;
    lo.records_per_commit = 4;
    auto log = simnet::BuildFirehoseLog((*net)->network(), lo);
    if (!log.ok()) {
      f.error = log.status().ToString();
      return f;
    }
    uint64_t ops = 0;
    for (const auto& frame : log->frames) {
      sources::FirehoseFrame decoded;
      std::string kind;
      if (sources::DecodeFirehoseFrame(frame.bytes, &decoded, &kind).ok() &&
          decoded.kind() == sources::FirehoseKind::kCommit) {
        ops += std::get<sources::FirehoseCommit>(decoded.payload).ops.size();
      }
    }
    f.events = log->frames.size();
    f.ops = ops;
    auto relay = simnet::FirehoseRelay::Start(std::move(log->frames));
    if (!relay.ok()) {
      f.error = relay.status().ToString();
      return f;
    }
    f.net = std::move(*net);
    f.relay = std::move(*relay);
    return f;
  }();
  if (!feed.error.empty()) return state.SkipWithError(feed.error.c_str());
  const FirehoseFeed firehose{feed.relay.get(), feed.events, static_cast<uint32_t>(state.range(0))};
  LiveRun run;
  for (auto _ : state) {
    run = RunLive(*feed.net, false, nullptr, false, &firehose);
    state.SetIterationTime(run.seconds);
    if (!run.error.empty()) return state.SkipWithError(run.error.c_str());
  }
  Report(state, run);
  // A frame is a commit of several record ops; Jetstream sends one op per event.
  const double ops = static_cast<double>(feed.ops);
  state.counters["ops"] = ops;
  state.counters["ops_per_s"] = ops / run.seconds;
  state.counters["wire_bytes_per_op"] = static_cast<double>(run.stats.bytes) / ops;
  state.counters["consumer_cpu_us_per_op"] = run.consumer_cpu_s * 1e6 / ops;
  state.counters["verified"] =
      static_cast<double>(run.job.counters.extra.count("firehose_verified")
                              ? run.job.counters.extra.at("firehose_verified")
                              : 0);
  state.SetLabel("relay firehose, verified on " + std::to_string(state.range(0)) +
                 " engine worker(s), sqlite");
}

BENCHMARK(BM_FirehoseVerify)->Unit(benchmark::kMillisecond);
// Argument: the engine's workers.
BENCHMARK(BM_FirehoseCatchUp)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(2);
BENCHMARK(BM_LiveCatchUp)
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({1, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(2);
BENCHMARK(BM_LiveAtRate)
    ->Args({0, 50'000})
    ->Args({1, 50'000})
    ->Args({1, 100'000})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(1);

}  // namespace
}  // namespace atfill

BENCHMARK_MAIN();
