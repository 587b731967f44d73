// atfill backfill CONFIG [--collection NSID]... [--did DID]... [--mode listRecords|getRepo]:
// the crawl as a job (discover, resolve, fetch, verify, write), resumable.
// atfill run CONFIG: resumes every unfinished job after a restart.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "pipeline/job.hpp"
#include "pipeline/run.hpp"
#include "sources/archive.hpp"
#include "sources/archive_http.hpp"
#include "sources/crawl.hpp"
#include "sources/replay.hpp"
#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
#include "state/failed_blocks.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/atfill/job_run.hpp"
#include "tools/atfill/run_admin.hpp"
#include "tools/atfill/sink_access.hpp"
#include "tools/atfill/state_access.hpp"
#include "tools/atfill/verb_backfill.hpp"

namespace atfill::cli {
namespace {

int Fail(const char* verb, const std::string& msg, int code) {
  std::fprintf(stderr, "atfill %s: %s\n", verb, msg.c_str());
  return code;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : "\n") + s;
  return out;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t nl = s.find('\n', start);
    if (nl == std::string::npos) nl = s.size();
    if (nl > start) out.push_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

// A job's crawl: the config's network settings with the job's own targets.
Result<sources::CrawlOptions> CrawlOfJob(const AppConfig& config, state::JobRecord& job) {
  sources::CrawlOptions crawl = config.crawl;
  crawl.relay_url = job.params["relay"];
  ATFILL_ASSIGN_OR_RETURN(crawl.discovery, sources::ParseDiscovery(job.params["discovery"]));
  ATFILL_ASSIGN_OR_RETURN(crawl.mode, sources::ParseFetchMode(job.params["mode"]));
  crawl.collections = Split(job.params["collections"]);
  crawl.dids = Split(job.params["dids"]);
  return crawl;
}

// The archive XRPC base of a Jetstream host ("ws://h:1/" -> "http://h:1"); empty for another
// scheme.
std::string ArchiveOfHost(const std::string& host) {
  std::string location;
  if (host.starts_with("ws://")) location = "http://" + host.substr(5);
  if (host.starts_with("wss://")) location = "https://" + host.substr(6);
  while (!location.empty() && location.back() == '/') location.pop_back();
  return location;
}

// The archive at `location`: a URL (the archive XRPC API, the config's key) or a directory.
// `probe` shortens the retries (auto's question "is there an archive?").
Result<std::unique_ptr<sources::Archive>> OpenArchive(const AppConfig& config,
                                                      const std::string& location,
                                                      bool probe = false) {
  if (location.starts_with("http://") || location.starts_with("https://")) {
    sources::HttpArchiveOptions o;
    o.base_url = location;
    o.key = config.archive_key;
    // [archive] url, or the archive of one of [live]'s hosts: the operator's, so reached
    // wherever it points (loopback and private networks included).
    o.allow_private_addresses = true;
    o.user_agent = config.crawl.http.user_agent;
    if (config.archive_spool_segments) o.spool_dir = config.archive_replay_dir;
    o.spool_chunk_bytes = config.archive_spool_chunk_kb << 10;
    if (config.archive_retry_delays_ms) o.retry_delays_ms = *config.archive_retry_delays_ms;
    if (probe) {
      o.retry_delays_ms = {250, 750};
      o.unavailable_retries = 1;
      o.max_throttled_ms = 10'000;
      o.connect_timeout_ms = 5'000;
      o.request_timeout_ms = 15'000;
    }
    ATFILL_ASSIGN_OR_RETURN(auto archive, sources::HttpArchive::Open(std::move(o)));
    return std::unique_ptr<sources::Archive>(std::move(archive));
  }
  ATFILL_ASSIGN_OR_RETURN(auto archive, sources::LocalArchive::Open(location));
  return std::unique_ptr<sources::Archive>(std::move(archive));
}

// A replay job: the job's collections read from its archive (sources/replay.hpp).
int RunReplayJob(const char* verb, const AppConfig& config, OpenedState& st, state::JobRecord job) {
  const auto param = [&job](const char* name) {
    auto it = job.params.find(name);
    return it == job.params.end() ? std::string() : it->second;
  };
  auto archive = OpenArchive(config, param("archive"));
  if (!archive.ok()) {
    return Fail(verb, "job " + std::to_string(job.id) + ": " + archive.status().message(), kExitIo);
  }
  sources::ReplayOptions options = config.replay;
  options.collections = Split(param("collections"));
  options.only_blocks = Split(param("blocks"));
  options.after_seq = std::strtoull(param("after_seq").c_str(), nullptr, 10);
  options.before_seq = std::strtoull(param("before_seq").c_str(), nullptr, 10);
  options.all_markers = param("gap") == "1";
  if (!param("retry_of").empty())
    options.retry_of = std::strtoull(param("retry_of").c_str(), nullptr, 10);
  // A replay checkpoints the SQLite WAL less often than other jobs ([archive] sqlite_wal_mb).
  AppConfig sink_config = config;
  sink_config.sqlite.wal_autocheckpoint_bytes = config.replay_sqlite_wal_bytes;
  auto sink = OpenConfiguredSink(sink_config);
  if (!sink.ok()) return Fail(verb, sink.status().message(), kExitIo);
  sources::ReplaySource source(archive->get(), options, job.id, st.kv.get());
  stages::CidVerify verify;
  stages::IngestGuard guard(st.tombstones.get());
  ForegroundJob run;
  run.verb = verb;
  run.config = &config;
  run.state = &st;
  run.job = std::move(job);
  run.source = &source;
  if (config.verify_cids) run.stages.cid_verify = &verify;
  run.stages.ingest_guard = &guard;
  run.sink = sink->get();
  run.cursor_name = "job/" + std::to_string(run.job.id) + "/replay";
  run.batch = config.replay_batch;
  run.read_noun = "archive blocks read";
  const int rc = RunInForeground(run);
  if (const auto* http = dynamic_cast<const sources::HttpArchive*>(archive->get())) {
    const sources::HttpArchiveStats s = http->stats();
    std::fprintf(stderr,
                 "atfill %s: archive: %" PRIu64 " requests (%" PRIu64 " retried, %" PRIu64
                 " throttled), %.1f MB, %" PRIu64 " segments spooled (%" PRIu64
                 " blocks read from them, %" PRIu64 " spool failures)\n",
                 verb, s.requests, s.retries, s.throttled, static_cast<double>(s.bytes) / 1e6,
                 s.spooled_segments, s.spooled_blocks, s.spool_failures);
  }
  return rc;
}

}  // namespace

int RunBackfillJob(const char* verb, const AppConfig& config, OpenedState& st, state::JobRecord job,
                   bool hold_live) {
  if (auto it = job.params.find("source"); it != job.params.end() && it->second == "replay") {
    return RunReplayJob(verb, config, st, std::move(job));
  }
  auto crawl = CrawlOfJob(config, job);
  if (!crawl.ok())
    return Fail(verb, "job " + std::to_string(job.id) + ": " + crawl.status().message(),
                kExitUsage);
  crawl->hold_live = hold_live;
  auto sink = OpenConfiguredSink(config);
  if (!sink.ok()) return Fail(verb, sink.status().message(), kExitIo);
  auto source = sources::CrawlSource::Create(*crawl, job.id, st.kv.get());
  if (!source.ok()) return Fail(verb, source.status().message(), kExitUsage);
  stages::CidVerify verify;
  stages::IngestGuard guard(st.tombstones.get());
  ForegroundJob run;
  run.verb = verb;
  run.config = &config;
  run.state = &st;
  run.job = std::move(job);
  run.source = source->get();
  if (config.verify_cids) run.stages.cid_verify = &verify;
  run.stages.ingest_guard = &guard;
  run.sink = sink->get();
  run.cursor_name = "job/" + std::to_string(run.job.id) + "/crawl";
  run.read_noun = "records fetched";
  run.batch = config.crawl_batch;
  return RunInForeground(run);
}

namespace {

// The job that crawls these targets: the unfinished one, or a new one.
Result<state::JobRecord> FindOrCreateBackfillJob(const AppConfig& config, OpenedState& st,
                                                 const sources::CrawlOptions& crawl, bool* resumed,
                                                 const std::string& source = "crawl",
                                                 const std::string& started_by = "cli") {
  const int64_t now = pipeline::NowMicros();
  ATFILL_RETURN_IF_ERROR(st.tombstones->Sweep(now).status().WithContext("sweeping tombstones"));
  // The same targets resume the unfinished job that crawls them.
  state::JobRecord prototype;
  prototype.kind = "backfill";
  prototype.stage = state::JobStage::kDiscovering;
  prototype.created_us = now;
  prototype.started_by = started_by;
  prototype.params = {{"config", std::filesystem::absolute(config.path).string()},
                      {"relay", crawl.relay_url},
                      {"discovery", std::string(sources::DiscoveryName(crawl.discovery))},
                      {"mode", std::string(sources::FetchModeName(crawl.mode))},
                      {"collections", Join(crawl.collections)},
                      {"dids", Join(crawl.dids)},
                      {"sink", SinkLocation(config)}};
  if (source == "replay") {
    // A replay reads the archive, not the relay: its targets are the collections.
    prototype.params.erase("relay");
    prototype.params.erase("discovery");
    prototype.params.erase("mode");
    prototype.params["source"] = "replay";
    prototype.params["archive"] = ArchiveLocation(config);
    prototype.stage = state::JobStage::kReplaying;
  }
  return pipeline::FindOrCreateJob(
      st.jobs.get(), prototype,
      {"source", "archive", "relay", "discovery", "mode", "collections", "dids"}, resumed);
}

void AnnounceBackfill(const char* verb, const sources::CrawlOptions& crawl,
                      const state::JobRecord& job, bool resumed) {
  const auto source = job.params.find("source");
  if (!resumed && source != job.params.end() && source->second == "replay") {
    std::fprintf(stderr,
                 "atfill %s: backfill job %" PRIu64 " replays %zu collection(s) from %s into %s\n",
                 verb, job.id, crawl.collections.size(), job.params.at("archive").c_str(),
                 job.params.count("sink") ? job.params.at("sink").c_str() : "");
    return;
  }
  if (resumed) {
    std::fprintf(stderr, "atfill %s: resuming backfill job %" PRIu64 " (%s)\n", verb, job.id,
                 std::string(state::JobStatusName(job.status)).c_str());
  } else {
    std::fprintf(stderr,
                 "atfill %s: backfill job %" PRIu64 " crawls %zu collection(s) (%s, %s) into %s\n",
                 verb, job.id, crawl.collections.size(),
                 std::string(sources::DiscoveryName(crawl.discovery)).c_str(),
                 std::string(sources::FetchModeName(crawl.mode)).c_str(),
                 job.params.count("sink") ? job.params.at("sink").c_str() : "");
  }
}

// Where a backfill of these targets reads from: "crawl" or "replay" (source is the config's or
// --source's crawl, auto or replay). A replay of given accounts is refused; auto crawls them.
Result<std::string> ChooseSource(const AppConfig& config, const sources::CrawlOptions& crawl,
                                 const std::string& source) {
  if (source != "crawl" && source != "auto" && source != "replay") {
    return Status::Invalid("--source: '" + source + "' is not crawl, auto or replay");
  }
  const bool accounts = crawl.discovery == sources::Discovery::kDidList;
  if (source == "crawl") return std::string("crawl");
  if (accounts) {
    if (source == "replay") {
      return Status::Invalid(
          "a replay cannot backfill given accounts (--did, discovery = \"dids\"): account "
          "backfills always crawl their PDS; use --source crawl");
    }
    return std::string("crawl");
  }
  const std::string location = ArchiveLocation(config);
  if (location.empty()) {
    if (source == "replay") {
      return Status::Invalid(config.path + ": a replay needs an archive: set [archive] url or dir");
    }
    std::fprintf(stderr,
                 "atfill: no archive is configured ([archive] url or dir); the backfill crawls\n");
    return std::string("crawl");
  }
  if (source == "auto") {
    // Is there an archive that answers? A plan of the collections asks (key-gated, like a
    // replay's requests).
    auto archive = OpenArchive(config, location, /*probe=*/true);
    Status answer = archive.status();
    if (archive.ok()) {
      sources::PlanRequest request;
      request.collections = crawl.collections;
      request.markers = false;
      answer = (*archive)->PlanSnapshot(request).status();
    }
    if (!answer.ok()) {
      const bool refused_key = !config.archive_key.empty() &&
                               answer.code() == StatusCode::kInvalid &&
                               answer.message().find("key") != std::string::npos;
      if (refused_key) {
        return Status::Invalid("the archive " + location +
                               " refused the configured key: " + answer.message());
      }
      std::fprintf(stderr, "atfill: no archive to replay from (%s); the backfill crawls\n",
                   answer.message().c_str());
      return std::string("crawl");
    }
  }
  return std::string("replay");
}

}  // namespace

Result<std::pair<sources::CrawlOptions, std::string>> PlanBackfill(const AppConfig& config,
                                                                   const BackfillTargets& t) {
  sources::CrawlOptions crawl = config.crawl;
  if (!t.collections.empty()) crawl.collections = t.collections;
  if (!t.dids.empty()) {
    crawl.dids = t.dids;
    crawl.discovery = sources::Discovery::kDidList;
  }
  if (!t.relay.empty()) crawl.relay_url = t.relay;
  if (!t.mode.empty()) {
    auto m = sources::ParseFetchMode(t.mode);
    if (!m.ok()) return m.status().WithContext("--mode");
    crawl.mode = *m;
  }
  if (!t.discovery.empty()) {
    auto d = sources::ParseDiscovery(t.discovery);
    if (!d.ok()) return d.status().WithContext("--discovery");
    crawl.discovery = *d;
  }
  if (crawl.discovery != sources::Discovery::kDidList) crawl.dids.clear();
  ATFILL_ASSIGN_OR_RETURN(
      std::string chosen,
      ChooseSource(config, crawl, t.source.empty() ? config.backfill_source : t.source));
  if (chosen == "crawl") ATFILL_RETURN_IF_ERROR(crawl.Validate().WithContext(config.path));
  return std::make_pair(std::move(crawl), std::move(chosen));
}

Result<state::JobRecord> CreateBackfill(const AppConfig& config, OpenedState& st,
                                        const BackfillTargets& targets,
                                        const std::string& started_by) {
  ATFILL_ASSIGN_OR_RETURN(auto planned, PlanBackfill(config, targets));
  bool resumed = false;
  ATFILL_ASSIGN_OR_RETURN(auto job, FindOrCreateBackfillJob(config, st, planned.first, &resumed,
                                                            planned.second, started_by));
  AnnounceBackfill(started_by.c_str(), planned.first, job, resumed);
  return job;
}

int RunBackfill(std::span<char* const> args) {
  std::string config_path;
  std::vector<std::string> collections, dids;
  std::string mode, discovery, relay, source;
  CLI::App app{"", "atfill backfill"};
  PrepareVerbApp(app);
  app.add_option("CONFIG", config_path, "the config file")->required();
  app.add_option("--collection", collections);
  app.add_option("--did", dids);
  app.add_option("--mode", mode);
  app.add_option("--discovery", discovery);
  app.add_option("--relay", relay);
  app.add_option("--source", source);
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  auto config = LoadAppConfig(config_path);
  if (!config.ok()) return Fail("backfill", config.status().message(), kExitUsage);
  auto planned = PlanBackfill(*config, {collections, dids, mode, discovery, relay, source});
  if (!planned.ok()) return Fail("backfill", planned.status().message(), kExitUsage);
  const sources::CrawlOptions& crawl = planned->first;
  const std::string* chosen = &planned->second;

  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail("backfill", st.status().message(), kExitIo);
  bool resumed = false;
  auto job = FindOrCreateBackfillJob(*config, *st, crawl, &resumed, *chosen);
  if (!job.ok()) return Fail("backfill", job.status().message(), kExitIo);
  AnnounceBackfill("backfill", crawl, *job, resumed);
  const int rc = RunBackfillJob("backfill", *config, *st, *job);
  RestoreSignals();
  return rc;
}

Result<state::JobRecord> CreateRetryJob(OpenedState& st, uint64_t id, const std::string& started_by,
                                        bool* resumed) {
  ATFILL_ASSIGN_OR_RETURN(auto original, st.jobs->Get(id));
  if (original.params["source"] != "replay") {
    return Status::Unsupported("job " + std::to_string(id) +
                               " is not a replay job: only archive replays have failed blocks");
  }
  std::vector<std::string> blocks;
  state::FailedBlocks failed(*st.kv);
  ATFILL_RETURN_IF_ERROR(failed.Scan(id, [&](const state::FailedBlock& b) {
    blocks.push_back(b.block_id);
    return true;
  }));
  if (blocks.empty()) {
    return Status::NotFound("job " + std::to_string(id) + " has no failed block");
  }
  state::JobRecord prototype;
  prototype.kind = "backfill";
  prototype.stage = state::JobStage::kRetryingBlocks;
  prototype.created_us = pipeline::NowMicros();
  prototype.started_by = started_by;
  prototype.params = original.params;
  prototype.params["retry_of"] = std::to_string(id);
  prototype.params["blocks"] = Join(blocks);
  return pipeline::FindOrCreateJob(st.jobs.get(), prototype, {"source", "retry_of"}, resumed);
}

int RunRetryFailed(std::span<char* const> args) {
  std::string config_path;
  uint64_t id = 0;
  CLI::App app{"", "atfill retry-failed"};
  PrepareVerbApp(app);
  app.add_option("CONFIG", config_path, "the config file")->required();
  app.add_option("JOB", id, "the replay job's id")->required()->check(PositiveInteger("a job id"));
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  auto config = LoadAppConfig(config_path);
  if (!config.ok()) return Fail("retry-failed", config.status().message(), kExitUsage);
  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail("retry-failed", st.status().message(), kExitIo);
  bool resumed = false;
  auto job = CreateRetryJob(*st, id, "cli", &resumed);
  if (!job.ok()) {
    const bool nothing = job.status().code() == StatusCode::kNotFound &&
                         job.status().message().find("no failed block") != std::string::npos;
    if (nothing) {
      std::fprintf(stderr, "atfill retry-failed: %s\n", job.status().message().c_str());
      return kExitOk;
    }
    return Fail("retry-failed", job.status().message(),
                job.status().code() == StatusCode::kIoError ? kExitIo : kExitUsage);
  }
  std::fprintf(stderr,
               "atfill retry-failed: %s job %" PRIu64
               " fetching the %zu failed block(s) of job %" PRIu64
               ", then the account events of the accounts they hold records of\n",
               resumed ? "resuming" : "started", job->id, Split(job->params["blocks"]).size(), id);
  const int rc = RunBackfillJob("retry-failed", *config, *st, *job);
  RestoreSignals();
  return rc;
}

int ResumeBackfill(const std::string& config_path, uint64_t id) {
  auto config = LoadAppConfig(config_path);
  if (!config.ok()) return Fail("resume", config.status().message(), kExitUsage);
  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail("resume", st.status().message(), kExitIo);
  auto job = st->jobs->Get(id);
  if (!job.ok()) return Fail("resume", job.status().message(), kExitUsage);
  const int rc = RunBackfillJob("resume", *config, *st, *job);
  RestoreSignals();
  return rc;
}

// Jobs a restart should pick up: interrupted ones (running, pausing), ones that paused because
// work was left (not on request), and cancellations to finish.
bool ShouldResume(const state::JobRecord& j) {
  switch (j.status) {
    case state::JobStatus::kRunning:
    case state::JobStatus::kPausing:
      return true;
    case state::JobStatus::kPaused:
      return j.stop_reason.code != "paused";
    default:
      return false;
  }
}

int RunRun(std::span<char* const> args) {
  std::string config_path;
  bool with_backfill = false;
  CLI::App app{"", "atfill run"};
  PrepareVerbApp(app);
  app.add_option("CONFIG", config_path, "the config file")->required();
  app.add_flag("--backfill", with_backfill);
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  auto config = LoadAppConfig(config_path);
  if (!config.ok()) return Fail("run", config.status().message(), kExitUsage);
  const bool live = !config->live.hosts.empty();
  std::vector<state::JobRecord> todo;
  // With a live consumer, backfills run beside it (its events of repos they crawl are held).
  std::vector<state::JobRecord> beside;
  {
    auto st = OpenStateForWrite(*config);
    if (!st.ok()) return Fail("run", st.status().message(), kExitIo);
    auto all = st->jobs->List();
    if (!all.ok()) return Fail("run", all.status().message(), kExitIo);
    for (auto& j : *all) {
      if (j.status == state::JobStatus::kCancelling) {
        // Its process died before the cancellation finished: finish it.
        j.status = state::JobStatus::kCancelled;
        j.stage = state::JobStage::kCancelled;
        j.stop_reason = {"cancelled", "cancelled on request"};
        j.finished_us = pipeline::NowMicros();
        state::WriteBatch b;
        if (Status s = st->jobs->Put(&b, j); !s.ok()) return Fail("run", s.message(), kExitIo);
        if (Status s = st->kv->Write(b); !s.ok()) return Fail("run", s.message(), kExitIo);
        continue;
      }
      // The live job is run below (when configured), not resumed.
      if (!ShouldResume(j)) continue;
      if (j.kind == "backfill" && (live || config->admin_enabled)) {
        beside.push_back(j);
      } else if (j.kind == "backfill" || j.kind == "ingest") {
        todo.push_back(j);
      }
    }
  }
  auto by_id = [](const state::JobRecord& a, const state::JobRecord& b) { return a.id < b.id; };
  std::sort(todo.begin(), todo.end(), by_id);
  std::sort(beside.begin(), beside.end(), by_id);
  int worst = kExitOk;
  if (todo.empty() && beside.empty() && !with_backfill) {
    std::fprintf(stderr, "atfill run: no unfinished job to resume\n");
  }
  for (const auto& j : todo) {
    std::fprintf(stderr, "atfill run: resuming %s job %" PRIu64 " (%s)\n", j.kind.c_str(), j.id,
                 std::string(state::JobStatusName(j.status)).c_str());
    std::string id = std::to_string(j.id);
    std::string cfg = config_path;
    std::vector<char*> argv = {cfg.data(), id.data()};
    const int rc = RunResume(argv);
    worst = std::max(worst, rc);
    if (rc == kExitStopped) return worst;  // paused or cancelled by the user: stop here
  }
  // With [admin], this process serves the API and dashboard until Ctrl-C (or SIGTERM); backfills
  // (resumed, asked for, or started over the API) run on threads of their own meanwhile.
  if (config->admin_enabled) return std::max(worst, ServeRun(*config, beside, with_backfill));
  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail("run", st.status().message(), kExitIo);
  if (with_backfill) {
    // The backfill of [crawl]'s targets: the unfinished job that crawls them, or a new one.
    auto chosen = ChooseSource(*config, config->crawl, config->backfill_source);
    if (!chosen.ok()) return Fail("run", "--backfill: " + chosen.status().message(), kExitUsage);
    if (Status s = config->crawl.Validate(); *chosen == "crawl" && !s.ok()) {
      return Fail("run", config->path + ": --backfill: " + s.message(), kExitUsage);
    }
    bool resumed = false;
    auto job = FindOrCreateBackfillJob(*config, *st, config->crawl, &resumed, *chosen);
    if (!job.ok()) return Fail("run", job.status().message(), kExitIo);
    AnnounceBackfill("run", config->crawl, *job, resumed);
    const bool listed = std::any_of(beside.begin(), beside.end(),
                                    [&](const state::JobRecord& j) { return j.id == job->id; });
    if (!listed) beside.push_back(*job);
    if (!live) {
      const int rc = RunBackfillJob("run", *config, *st, *job);
      RestoreSignals();
      return std::max(worst, rc);
    }
  }
  if (!live) return worst;
  // The backfills run on their own thread while this one keeps the database current from the
  // Jetstream, holding the live events of each repo until the crawl has written it.
  std::atomic<bool> backfilling{!beside.empty()};
  int backfill_rc = kExitOk;  // read after the thread is joined
  std::thread crawls([&] {
    for (const auto& j : beside) {
      std::fprintf(stderr, "atfill run: backfill job %" PRIu64 " runs beside the live consumer\n",
                   j.id);
      const int rc = RunBackfillJob("run", *config, *st, j, /*hold_live=*/true);
      backfill_rc = std::max(backfill_rc, rc);
      if (rc == kExitStopped) break;
    }
    backfilling = false;
  });
  state::StopReason stopped;
  int rc = RunLive(
      *config, *st, [&backfilling] { return backfilling.load(); }, &stopped);
  if (stopped.code == "stream_idle" && backfilling.load() && !StopSignalled()) {
    // The stream went quiet before the backfills ended: once they have, the live consumer runs
    // again from its cursor and applies what it held.
    std::fprintf(stderr,
                 "atfill run: the stream is idle; waiting for the backfill to finish, then "
                 "applying the live events held for its repos\n");
    crawls.join();
    rc = RunLive(
        *config, *st, [] { return false; }, &stopped);
  }
  if (crawls.joinable()) crawls.join();
  RestoreSignals();
  return std::max({worst, rc, backfill_rc});
}

GapReplays::~GapReplays() { Wait(); }

void GapReplays::Wait() {
  std::lock_guard lock(mu_);
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

Result<std::pair<uint64_t, uint64_t>> GapReplays::Start(uint64_t last_seq,
                                                        const std::string& host) {
  std::string location = ArchiveLocation(config_);
  if (location.empty()) location = ArchiveOfHost(host);  // the host serves its own archive
  if (location.empty()) return Status::Invalid("no archive is configured ([archive] url or dir)");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  ATFILL_ASSIGN_OR_RETURN(auto archive, OpenArchive(config_, location, /*probe=*/true));
  sources::PlanRequest request;
  request.collections = config_.live.collections;
  request.after_seq = last_seq;
  auto plan = (*archive).PlanSnapshot(request);
  if (!plan.ok()) return plan.status().WithContext("planning the gap at " + location);
  if (std::chrono::steady_clock::now() > deadline) {
    return Status::Unavailable("the archive " + location + " took more than 30 s to plan the gap");
  }
  if (plan->sealed_tip <= last_seq) {
    return Status::NotFound("the archive " + location + " has sealed nothing after seq " +
                            std::to_string(last_seq));
  }
  state::JobRecord job;
  job.kind = "backfill";
  job.stage = state::JobStage::kReplaying;
  job.created_us = pipeline::NowMicros();
  job.started_by = "live gap";
  job.params = {{"config", std::filesystem::absolute(config_.path).string()},
                {"source", "replay"},
                {"archive", location},
                {"collections", Join(config_.live.collections)},
                {"after_seq", std::to_string(last_seq)},
                {"before_seq", std::to_string(plan->sealed_tip)},
                {"gap", "1"},
                {"sink", SinkLocation(config_)}};
  ATFILL_ASSIGN_OR_RETURN(job, st_.jobs->Create(job));
  std::fprintf(stderr,
               "atfill run: the stream's gap after seq %" PRIu64 " is replayed by job %" PRIu64
               " from %s (through seq %" PRIu64 ")\n",
               last_seq, job.id, location.c_str(), plan->sealed_tip);
  // Both before the stream resumes past the gap: its events are held from now on.
  started_ = true;
  ++running_;
  std::lock_guard lock(mu_);
  threads_.emplace_back([this, job] {
    if (RunBackfillJob("run", config_, st_, job) != kExitOk) unfinished_ = true;
    --running_;
  });
  return std::make_pair(plan->sealed_tip, job.id);
}

Result<std::vector<std::string>> UnfinishedBackfillCollections(OpenedState& st) {
  ATFILL_ASSIGN_OR_RETURN(auto jobs, st.jobs->List());
  std::vector<std::string> out;
  for (const auto& j : jobs) {
    if (j.kind != "backfill" || state::IsTerminal(j.status)) continue;
    auto it = j.params.find("collections");
    std::vector<std::string> collections =
        it == j.params.end() ? std::vector<std::string>{} : Split(it->second);
    if (collections.empty()) return std::vector<std::string>{"*"};
    out.insert(out.end(), collections.begin(), collections.end());
  }
  return out;
}

}  // namespace atfill::cli
