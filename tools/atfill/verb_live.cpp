// The live consumer for `atfill run` ([live] hosts set): a Jetstream into the sink, as the job
// "live", until it is paused (Ctrl-C) or, with [live] idle_exit_ms, the stream goes quiet.
// `atfill status CONFIG` shows it from another process.
#include <cinttypes>
#include <cstdio>

#include "pipeline/job.hpp"
#include "pipeline/run.hpp"
#include "sources/jetstream.hpp"
#include "sources/pds_account_status.hpp"
#include "stages/account_check.hpp"
#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
#include "stages/live_hold.hpp"
#include "stages/resolver.hpp"
#include "state/cursors.hpp"
#include "state/resolver_cache.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/atfill/job_run.hpp"
#include "tools/atfill/job_view.hpp"
#include "tools/atfill/sink_access.hpp"
#include "tools/atfill/state_access.hpp"
#include "tools/atfill/verb_backfill.hpp"

namespace atfill::cli {
namespace {

// One cursor for every live job of this state: a new live job continues where the last stopped.
// kLiveCursor: verb_backfill.hpp

int Fail(const char* verb, const std::string& msg, int code) {
  std::fprintf(stderr, "atfill %s: %s\n", verb, msg.c_str());
  return code;
}

}  // namespace

int RunLive(const AppConfig& config, OpenedState& st, std::function<bool()> backfill_running,
            state::StopReason* stop) {
  state::JobRecord prototype;
  prototype.kind = "live";
  prototype.stage = state::JobStage::kReplaying;
  prototype.created_us = pipeline::NowMicros();
  prototype.started_by = "cli";
  std::string hosts;
  for (const auto& h : config.live.hosts) hosts += (hosts.empty() ? "" : "\n") + h;
  prototype.params = {
      {"hosts", hosts},
      {"protocol", std::string(sources::JetstreamProtocolName(config.live.protocol))},
      {"sink", SinkLocation(config)}};
  bool resumed = false;
  auto job = pipeline::FindOrCreateJob(st.jobs.get(), prototype, {}, &resumed);
  if (!job.ok()) return Fail("run", job.status().message(), kExitIo);
  std::fprintf(stderr, "atfill run: live job %" PRIu64 " from %s (%s)\n", job->id,
               config.live.hosts.front().c_str(),
               std::string(sources::JetstreamProtocolName(config.live.protocol)).c_str());
  auto sink = OpenConfiguredSink(config);
  if (!sink.ok()) return Fail("run", sink.status().message(), kExitIo);
  // With [crawl] source = auto or replay, a cursor below the host's floor (CursorTooOld) becomes a
  // replay job of the gap, run beside this consumer (waited for when it ends).
  GapReplays gaps(config, st);
  sources::JetstreamOptions live = config.live;
  if (config.backfill_source != "crawl") {
    live.gap_replay = [&gaps](
                          uint64_t last_seq,
                          const std::string& host) -> Result<sources::JetstreamOptions::GapReplay> {
      ATFILL_ASSIGN_OR_RETURN(auto started, gaps.Start(last_seq, host));
      return sources::JetstreamOptions::GapReplay{started.first, started.second};
    };
  }
  auto source = sources::JetstreamSource::Create(live, st.kv.get());
  if (!source.ok()) return Fail("run", source.status().message(), kExitUsage);
  stages::CidVerify verify;
  // Record deletes leave a tombstone only where a stale create could still arrive.
  stages::DeleteTombstoneRule rule;
  // The stream's events wait while a gap replay runs (hold_all below), so none reaches the guard
  // before the gap is written. A gap job that stopped unfinished may still bring older creates
  // when it is resumed: until then, every delete leaves a tombstone.
  rule.sink_holds = [&gaps, holds = SinkHoldsRecords(config)](
                        const std::string& did, const std::string& collection) -> Result<bool> {
    if (gaps.unfinished()) return true;
    return holds(did, collection);
  };
  auto backfills = UnfinishedBackfillCollections(st);
  if (!backfills.ok()) return Fail("run", backfills.status().message(), kExitIo);
  rule.always = std::move(*backfills);
  stages::IngestGuard guard(st.tombstones.get(), nullptr, std::move(rule));
  // Events of repos a crawl beside this consumer has queued wait for the repo's checkpoint (and
  // what an earlier run held is applied).
  state::LiveHolds holds(*st.kv);
  stages::LiveHoldOptions hold_options;
  hold_options.backfill_running = backfill_running;
  // While a gap replay runs, the stream's events wait in state, then apply on top of the gap.
  hold_options.hold_all = [&gaps] { return gaps.running(); };
  stages::LiveHold hold(&holds, std::move(hold_options));
  // The account check asks PDSs with the crawl's resolver settings ([resolver], [net]).
  std::unique_ptr<state::ResolverCache> check_cache;  // outlives the client's callbacks
  std::unique_ptr<net::HttpClient> check_http;
  std::unique_ptr<stages::DidResolver> check_resolver;
  std::unique_ptr<sources::PdsAccountStatus> check_lookup;
  std::unique_ptr<stages::AccountCheck> check;
  if (config.check_deleted_accounts) {
    net::HttpClientOptions http = config.crawl.resolver_http;
    stages::ResolverOptions resolver = config.crawl.resolver;
    const bool loopback = config.live_allow_private_endpoints ||
                          config.crawl.allow_loopback_endpoints ||
                          config.crawl.allow_private_endpoints;
    http.allow_private_addresses = loopback;
    resolver.allow_loopback_endpoints = loopback;
    resolver.allow_private_endpoints =
        config.live_allow_private_endpoints || config.crawl.allow_private_endpoints;
    auto started = net::HttpClient::Start(http);
    if (!started.ok()) return Fail("run", started.status().message(), kExitUsage);
    check_http = std::move(*started);
    check_cache = std::make_unique<state::ResolverCache>(*st.kv);
    check_resolver =
        std::make_unique<stages::DidResolver>(check_http.get(), check_cache.get(), resolver);
    check_lookup =
        std::make_unique<sources::PdsAccountStatus>(check_resolver.get(), check_http.get());
    check = std::make_unique<stages::AccountCheck>(check_lookup.get(), config.account_check);
  }
  ForegroundJob run;
  run.verb = "run";
  run.config = &config;
  run.state = &st;
  run.job = *job;
  run.source = source->get();
  if (config.verify_cids) run.stages.cid_verify = &verify;
  run.stages.account_check = check.get();
  run.stages.live_hold = &hold;
  run.stages.ingest_guard = &guard;
  run.sink = sink->get();
  run.cursor_name = kLiveCursor;
  run.batch = config.live_batch;
  run.read_noun = "messages read";
  const int rc = RunInForeground(run);
  if (stop != nullptr) *stop = run.stop_reason;
  const auto s = (*source)->stats();
  std::fprintf(stderr,
               "atfill run: live: %s via %s, %" PRIu64 " connection(s) in %" PRIu64
               " attempt(s), %" PRIu64 " failed, last seq %" PRIu64 ", %" PRIu64
               " v1 fallback(s), %" PRIu64 " cursor(s) too old, %" PRIu64
               " gap(s) replayed from the archive\n",
               s.host.c_str(), s.protocol.c_str(), s.connections, s.attempts, s.connection_failures,
               s.last_seq, s.v1_fallbacks, s.cursor_too_old, s.gap_replays);
  if (!s.last_error.empty()) {
    std::fprintf(stderr, "atfill run: live: last connection error: %s\n", s.last_error.c_str());
  }
  if (gaps.started() && run.stop_reason.code == "stream_idle") {
    // The stream went quiet while its events waited for the gap: once the gap is replayed, the
    // consumer runs again from its cursor and applies them.
    if (gaps.running()) {
      std::fprintf(stderr,
                   "atfill run: the stream is idle; waiting for the gap replay to finish, then "
                   "applying the live events held meanwhile\n");
    }
    gaps.Wait();
    source->reset();  // its connection closes before the next run opens one
    return RunLive(config, st, std::move(backfill_running), stop);
  }
  return rc;
}

int RunStatus(std::span<char* const> args) {
  std::string config_path;
  CLI::App app{"", "atfill status"};
  PrepareVerbApp(app);
  app.add_option("CONFIG", config_path, "the config file")->required();
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  auto config = LoadAppConfig(config_path);
  if (!config.ok()) return Fail("status", config.status().message(), kExitUsage);
  auto st = OpenStateForRead(*config);
  if (!st.ok()) return Fail("status", st.status().message(), kExitIo);
  auto jobs = st->jobs->List();
  if (!jobs.ok()) return Fail("status", jobs.status().message(), kExitIo);
  const state::JobRecord* live = nullptr;
  for (const auto& j : *jobs) {
    if (j.kind == "live" && (live == nullptr || j.id > live->id)) live = &j;
  }
  if (config->live.hosts.empty()) std::printf("live: not configured ([live] hosts)\n");
  if (live == nullptr) {
    std::printf("live: no live job has run yet\n");
    return kExitOk;
  }
  state::Cursors cursors(*st->kv);
  auto cursor = cursors.Get(kLiveCursor);
  if (!cursor.ok()) return Fail("status", cursor.status().message(), kExitIo);
  uint64_t seq = 0;
  int64_t time_us = 0;
  if (*cursor) {
    const size_t colon = (*cursor)->find(':');
    seq = std::strtoull((*cursor)->c_str(), nullptr, 10);
    if (colon != std::string::npos)
      time_us = std::strtoll((*cursor)->c_str() + colon + 1, nullptr, 10);
  }
  const int64_t now = pipeline::NowMicros();
  const auto p = pipeline::DeriveProgress(*live, now);
  std::printf("live job %" PRIu64 ": %s\n", live->id,
              std::string(state::JobStatusName(live->status)).c_str());
  std::printf("  hosts       %s\n",
              live->params.count("hosts") ? live->params.at("hosts").c_str() : "");
  std::printf("  protocol    %s\n",
              live->params.count("protocol") ? live->params.at("protocol").c_str() : "");
  std::printf("  cursor      seq %" PRIu64 ", witnessed %s\n", seq, FormatTime(time_us).c_str());
  std::printf("  lag         %s behind now\n",
              time_us > 0 ? FormatDuration((now - time_us) / 1'000'000).c_str() : "unknown");
  std::printf("  rate        %.0f events/s, %.0f records/s (over the job's running time)\n",
              p.events_per_s, p.records_per_s);
  std::printf("  applied     %s events, %s records written, %s errors\n",
              FormatCount(live->counters.events_read).c_str(),
              FormatCount(live->counters.records_written).c_str(),
              FormatCount(live->counters.failed_records).c_str());
  const auto extra = [&](const char* name) -> uint64_t {
    auto it = live->counters.extra.find(name);
    return it == live->counters.extra.end() ? 0 : it->second;
  };
  // The connection: failed, refused and dropped attempts are in the job's error log, coalesced
  // per kind and host; the newest is the last error.
  auto logged = st->errors->List(live->id, 0, st->errors->options().max_entries_per_job);
  if (!logged.ok()) return Fail("status", logged.status().message(), kExitIo);
  const state::ErrorEntry* last_error = nullptr;
  uint64_t failed_attempts = 0;
  for (const state::ErrorEntry& e : *logged) {
    if (!e.kind.starts_with("connection_")) continue;
    failed_attempts += e.attempts;
    if (last_error == nullptr || e.last_us > last_error->last_us) last_error = &e;
  }
  std::printf("  connection  %s failed or dropped attempt(s)\n",
              FormatCount(failed_attempts).c_str());
  if (last_error != nullptr) {
    std::printf("  last error  %s %s (%s, %s attempt(s)): %s\n",
                FormatTime(last_error->last_us).c_str(), last_error->kind.c_str(),
                last_error->key.c_str(), FormatCount(last_error->attempts).c_str(),
                last_error->message.c_str());
  }
  std::printf("  gaps        %s seen, %s events skipped (atfill job CONFIG %" PRIu64
              " --errors: stream_gap)\n",
              FormatCount(extra("stream_gaps")).c_str(),
              FormatCount(extra("stream_gap_events")).c_str(), live->id);
  std::printf(
      "  accounts    %s deletions checked with their PDS, %s not purged (PDS says active), "
      "%s purged unconfirmed\n",
      FormatCount(extra("account_checks")).c_str(),
      FormatCount(extra("account_purges_refused")).c_str(),
      FormatCount(extra("account_purges_unconfirmed")).c_str());
  std::printf(
      "  held        %s events of repos being backfilled held, %s applied after the repo's "
      "checkpoint, %s dropped (at or below its rev)\n",
      FormatCount(extra("live_held")).c_str(), FormatCount(extra("live_released")).c_str(),
      FormatCount(extra("live_hold_dropped")).c_str());
  if (!live->stop_reason.empty()) {
    std::printf("  stopped     %s: %s\n", live->stop_reason.code.c_str(),
                live->stop_reason.sentence.c_str());
  }
  if (st->read_only) std::printf("(read-only view: another atfill process holds the state)\n");
  return kExitOk;
}

}  // namespace atfill::cli
