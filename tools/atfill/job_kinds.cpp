#include "tools/atfill/job_kinds.hpp"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "net/http_client.hpp"
#include "sinks/dry_run_sink.hpp"
#include "sources/archive_http.hpp"
#include "sources/crawl/crawl_source.hpp"
#include "sources/crawl/resolver.hpp"
#include "sources/event_file.hpp"
#include "sources/jetstream.hpp"
#include "sources/pds_account_status.hpp"
#include "sources/replay.hpp"
#include "stages/account_check.hpp"
#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
#include "stages/live_hold.hpp"
#include "stages/script.hpp"
#include "state/live_holds.hpp"
#include "state/resolver_cache.hpp"
#include "tools/atfill/sink_access.hpp"

namespace atfill::cli {

std::string JoinLines(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : "\n") + s;
  return out;
}

std::vector<std::string> SplitLines(const std::string& s) {
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

Result<std::unique_ptr<sources::Archive>> OpenArchive(const AppConfig& config,
                                                      const std::string& location, bool probe) {
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

namespace {

using pipeline::JobContext;
using pipeline::JobPlan;

std::string Param(const state::JobRecord& job, const char* name) {
  auto it = job.params.find(name);
  return it == job.params.end() ? std::string() : it->second;
}

// What the planners return for a job this build or config cannot run (the verbs' usage exit),
// as opposed to what was unavailable (their I/O exit).
Status Unrunnable(const state::JobRecord& job, const Status& s) {
  return Status::Invalid("job " + std::to_string(job.id) + ": " + s.message());
}

Status Unavailable(const Status& s) { return Status::IoError(s.message()); }

template <typename T>
T* Keep(JobPlan& plan, std::unique_ptr<T> piece) {
  T* raw = piece.get();
  plan.keep.push_back(std::shared_ptr<T>(std::move(piece)));
  return raw;
}

// The stages every job has: CID verification ([stages] verify_cids), the record scripts
// ([scripts]) and the ingest guard (revs and tombstones; `rule` decides which deletes leave a
// tombstone, none: every one does).
Status AddCommonStages(const AppConfig& config, OpenedState& st, JobPlan& plan,
                       std::optional<stages::DeleteTombstoneRule> rule = std::nullopt) {
  if (config.verify_cids)
    plan.stages.cid_verify = Keep(plan, std::make_unique<stages::CidVerify>());
  if (!config.scripts.scripts.empty()) {
    stages::ScriptOptions options = config.scripts;
    options.read_record = SinkRecordReader(config);
    auto made = stages::ScriptStage::Create(std::move(options));
    if (!made.ok()) {
      return Status::Invalid(config.path + ": " + made.status().message());
    }
    plan.stages.script = Keep(plan, std::move(*made));
  }
  plan.stages.ingest_guard = Keep(
      plan, std::make_unique<stages::IngestGuard>(st.tombstones.get(), nullptr, std::move(rule)));
  return Status::OK();
}

// A replay job: the job's collections read from its archive (sources/replay.hpp).
Result<JobPlan> PlanReplay(const AppConfig& config, OpenedState& st, state::JobRecord& job) {
  JobPlan plan;
  auto archive = OpenArchive(config, Param(job, "archive"));
  if (!archive.ok()) {
    return Status::IoError("job " + std::to_string(job.id) + ": " + archive.status().message());
  }
  sources::Archive* reader = Keep(plan, std::move(*archive));
  sources::ReplayOptions options = config.replay;
  options.collections = SplitLines(Param(job, "collections"));
  options.only_blocks = SplitLines(Param(job, "blocks"));
  options.after_seq = std::strtoull(Param(job, "after_seq").c_str(), nullptr, 10);
  options.before_seq = std::strtoull(Param(job, "before_seq").c_str(), nullptr, 10);
  options.all_markers = Param(job, "gap") == "1";
  if (!Param(job, "retry_of").empty())
    options.retry_of = std::strtoull(Param(job, "retry_of").c_str(), nullptr, 10);
  // A replay checkpoints the SQLite WAL less often than other jobs ([archive] sqlite_wal_mb).
  AppConfig sink_config = config;
  sink_config.sqlite.wal_autocheckpoint_bytes = config.replay_sqlite_wal_bytes;
  auto sink = OpenConfiguredSink(sink_config);
  if (!sink.ok()) return Unavailable(sink.status());
  plan.sink = Keep(plan, std::move(*sink));
  plan.source =
      Keep(plan, std::make_unique<sources::ReplaySource>(reader, options, job.id, st.kv.get()));
  ATFILL_RETURN_IF_ERROR(AddCommonStages(config, st, plan));
  plan.cursor_name = "job/" + std::to_string(job.id) + "/replay";
  plan.batch = config.replay_batch;
  plan.after = [reader](const state::JobRecord&) {
    if (const auto* http = dynamic_cast<const sources::HttpArchive*>(reader)) {
      const sources::HttpArchiveStats s = http->stats();
      std::fprintf(stderr,
                   "atfill: archive: %" PRIu64 " requests (%" PRIu64 " retried, %" PRIu64
                   " throttled), %.1f MB, %" PRIu64 " segments spooled (%" PRIu64
                   " blocks read from them, %" PRIu64 " spool failures)\n",
                   s.requests, s.retries, s.throttled, static_cast<double>(s.bytes) / 1e6,
                   s.spooled_segments, s.spooled_blocks, s.spool_failures);
    }
  };
  return plan;
}

// A crawl job: the config's network settings with the job's own targets.
Result<JobPlan> PlanCrawl(const AppConfig& config, OpenedState& st, state::JobRecord& job,
                          const JobContext& ctx) {
  sources::CrawlOptions crawl = config.crawl;
  crawl.relay_url = Param(job, "relay");
  auto discovery = sources::ParseDiscovery(Param(job, "discovery"));
  if (!discovery.ok()) return Unrunnable(job, discovery.status());
  crawl.discovery = *discovery;
  auto mode = sources::ParseFetchMode(Param(job, "mode"));
  if (!mode.ok()) return Unrunnable(job, mode.status());
  crawl.mode = *mode;
  crawl.collections = SplitLines(Param(job, "collections"));
  crawl.dids = SplitLines(Param(job, "dids"));
  crawl.hold_live = ctx.hold_live;
  JobPlan plan;
  AppConfig sink_config = config;
  sink_config.sqlite.bulk_load = config.crawl_bulk_load && !ctx.hold_live;
  auto sink = OpenConfiguredSink(sink_config);
  if (!sink.ok()) return Unavailable(sink.status());
  plan.sink = Keep(plan, std::move(*sink));
  auto source = sources::CrawlSource::Create(crawl, job.id, st.kv.get());
  if (!source.ok()) return Status::Invalid(source.status().message());
  plan.source = Keep(plan, std::move(*source));
  ATFILL_RETURN_IF_ERROR(AddCommonStages(config, st, plan));
  plan.cursor_name = "job/" + std::to_string(job.id) + "/crawl";
  plan.batch = config.crawl_batch;
  return plan;
}

// An ingest job: its event files, into the sink (or the dry-run sink).
Result<JobPlan> PlanIngest(const AppConfig& config, OpenedState& st, state::JobRecord& job) {
  JobPlan plan;
  const bool dry_run = Param(job, "dry_run") == "true";
  auto sink = dry_run ? sinks::NewDryRunSink() : OpenConfiguredSink(config);
  if (!sink.ok()) return Unavailable(sink.status());
  plan.sink = Keep(plan, std::move(*sink));
  sources::EventFileOptions file_options = config.files;
  file_options.paths = SplitLines(Param(job, "files"));
  auto source = sources::EventFileSource::Open(file_options);
  if (!source.ok()) return Unavailable(source.status());
  job.counters.extra[pipeline::kInputTotal] = (*source)->total_bytes();
  plan.source = Keep(plan, std::move(*source));
  ATFILL_RETURN_IF_ERROR(AddCommonStages(config, st, plan));
  plan.cursor_name = "job/" + std::to_string(job.id) + "/file";
  return plan;
}

// The collections the unfinished backfill jobs of this state cover ("*" for one that fetches every
// collection); empty when none is unfinished.
Result<std::vector<std::string>> UnfinishedBackfillCollections(OpenedState& st) {
  ATFILL_ASSIGN_OR_RETURN(auto jobs, st.jobs->List());
  std::vector<std::string> out;
  for (const auto& j : jobs) {
    if (j.kind != "backfill" || state::IsTerminal(j.status)) continue;
    std::vector<std::string> collections = SplitLines(Param(j, "collections"));
    if (collections.empty()) return std::vector<std::string>{"*"};
    out.insert(out.end(), collections.begin(), collections.end());
  }
  return out;
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

// A gap of the live consumer (JetstreamOptions::gap_replay): a CursorTooOld becomes a replay job
// of the stream's gap, (last seq, the archive's sealed tip], from [archive] url or dir, else the
// host's own archive (its ws:// address as http://), run in `gaps` beside the consumer.
Result<sources::JetstreamOptions::GapReplay> StartGapReplay(const AppConfig& config,
                                                            OpenedState& st,
                                                            pipeline::JobGroup& gaps,
                                                            uint64_t last_seq,
                                                            const std::string& host) {
  std::string location = ArchiveLocation(config);
  if (location.empty()) location = ArchiveOfHost(host);  // the host serves its own archive
  if (location.empty()) return Status::Invalid("no archive is configured ([archive] url or dir)");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  ATFILL_ASSIGN_OR_RETURN(auto archive, OpenArchive(config, location, /*probe=*/true));
  sources::PlanRequest request;
  request.collections = config.live.collections;
  request.after_seq = last_seq;
  auto plan = archive->PlanSnapshot(request);
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
  job.params = {{"config", std::filesystem::absolute(config.path).string()},
                {"source", "replay"},
                {"archive", location},
                {"collections", JoinLines(config.live.collections)},
                {"after_seq", std::to_string(last_seq)},
                {"before_seq", std::to_string(plan->sealed_tip)},
                {"gap", "1"},
                {"sink", SinkLocation(config)}};
  ATFILL_ASSIGN_OR_RETURN(job, st.jobs->Create(job));
  std::fprintf(stderr,
               "atfill run: the stream's gap after seq %" PRIu64 " is replayed by job %" PRIu64
               " from %s (through seq %" PRIu64 ")\n",
               last_seq, job.id, location.c_str(), plan->sealed_tip);
  // Before the stream resumes past the gap: its events are held from now on.
  ATFILL_RETURN_IF_ERROR(gaps.Start({job}));
  return sources::JetstreamOptions::GapReplay{plan->sealed_tip, job.id};
}

// The live consumer ([live]): a Jetstream into the sink.
Result<JobPlan> PlanLive(const AppConfig& config, OpenedState& st, const JobContext& ctx) {
  JobPlan plan;
  auto sink = OpenConfiguredSink(config);
  if (!sink.ok()) return Unavailable(sink.status());
  plan.sink = Keep(plan, std::move(*sink));
  // With [crawl] source = auto or replay, a cursor below the host's floor (CursorTooOld) becomes a
  // replay job of the gap, run beside this consumer.
  pipeline::JobGroup* gaps = ctx.beside;
  sources::JetstreamOptions live = config.live;
  if (config.backfill_source != "crawl" && gaps != nullptr) {
    live.gap_replay = [&config, &st, gaps](uint64_t last_seq, const std::string& host) {
      return StartGapReplay(config, st, *gaps, last_seq, host);
    };
  }
  auto source = sources::JetstreamSource::Create(live, st.kv.get());
  if (!source.ok()) return Status::Invalid(source.status().message());
  sources::JetstreamSource* stream = Keep(plan, std::move(*source));
  plan.source = stream;
  // Record deletes leave a tombstone only where a stale create could still arrive.
  stages::DeleteTombstoneRule rule;
  // The stream's events wait while a gap replay runs (hold_all below), so none reaches the guard
  // before the gap is written. A gap job that stopped unfinished may still bring older creates
  // when it is resumed: until then, every delete leaves a tombstone.
  rule.sink_holds = [gaps, holds = SinkHoldsRecords(config)](
                        const std::string& did, const std::string& collection) -> Result<bool> {
    if (gaps != nullptr && gaps->unfinished()) return true;
    return holds(did, collection);
  };
  auto backfills = UnfinishedBackfillCollections(st);
  if (!backfills.ok()) return Unavailable(backfills.status());
  rule.always = std::move(*backfills);
  // Events of repos a crawl beside this consumer has queued wait for the repo's checkpoint (and
  // what an earlier run held is applied).
  auto* holds = Keep(plan, std::make_unique<state::LiveHolds>(*st.kv));
  stages::LiveHoldOptions hold_options;
  hold_options.backfill_running = ctx.backfill_running;
  // While a gap replay runs, the stream's events wait in state, then apply on top of the gap.
  hold_options.hold_all = [gaps] { return gaps != nullptr && gaps->running(); };
  plan.stages.live_hold = Keep(plan, std::make_unique<stages::LiveHold>(holds, hold_options));
  // The account check asks PDSs with the crawl's resolver settings ([resolver], [net]).
  if (config.check_deleted_accounts) {
    net::HttpClientOptions http = config.crawl.resolver_http;
    sources::ResolverOptions resolver = config.crawl.resolver;
    const bool loopback = config.live_allow_private_endpoints ||
                          config.crawl.allow_loopback_endpoints ||
                          config.crawl.allow_private_endpoints;
    http.allow_private_addresses = loopback;
    resolver.allow_loopback_endpoints = loopback;
    resolver.allow_private_endpoints =
        config.live_allow_private_endpoints || config.crawl.allow_private_endpoints;
    auto started = net::HttpClient::Start(http);
    if (!started.ok()) return Status::Invalid(started.status().message());
    // Declared in this order, released in the reverse: the cache outlives the client's callbacks.
    auto* cache = Keep(plan, std::make_unique<state::ResolverCache>(*st.kv));
    auto* client = Keep(plan, std::move(*started));
    auto* resolve = Keep(plan, std::make_unique<sources::DidResolver>(client, cache, resolver));
    auto* lookup = Keep(plan, std::make_unique<sources::PdsAccountStatus>(resolve, client));
    plan.stages.account_check =
        Keep(plan, std::make_unique<stages::AccountCheck>(lookup, config.account_check));
  }
  ATFILL_RETURN_IF_ERROR(AddCommonStages(config, st, plan, std::move(rule)));
  plan.cursor_name = kLiveCursor;
  plan.batch = config.live_batch;
  plan.after = [stream](const state::JobRecord&) {
    const auto s = stream->stats();
    std::fprintf(
        stderr,
        "atfill run: live: %s via %s, %" PRIu64 " connection(s) in %" PRIu64 " attempt(s), %" PRIu64
        " failed, last seq %" PRIu64 ", %" PRIu64 " v1 fallback(s), %" PRIu64
        " cursor(s) too old, %" PRIu64 " gap(s) replayed from the archive\n",
        s.host.c_str(), s.protocol.c_str(), s.connections, s.attempts, s.connection_failures,
        s.last_seq, s.v1_fallbacks, s.cursor_too_old, s.gap_replays);
    if (!s.last_error.empty()) {
      std::fprintf(stderr, "atfill run: live: last connection error: %s\n", s.last_error.c_str());
    }
  };
  return plan;
}

}  // namespace

void RegisterJobKinds(pipeline::JobController& controller, const AppConfig& config,
                      OpenedState& st) {
  controller.SetPlanner("backfill", [&config, &st](state::JobRecord& job, const JobContext& ctx) {
    if (Param(job, "source") == "replay") return PlanReplay(config, st, job);
    return PlanCrawl(config, st, job, ctx);
  });
  controller.SetPlanner("ingest", [&config, &st](state::JobRecord& job, const JobContext&) {
    return PlanIngest(config, st, job);
  });
  controller.SetPlanner("live", [&config, &st](state::JobRecord&, const JobContext& ctx) {
    return PlanLive(config, st, ctx);
  });
}

}  // namespace atfill::cli
