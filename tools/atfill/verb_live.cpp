// The live consumer for `atfill run` ([live] hosts set): a Jetstream into the sink, as the job
// "live", until it is paused (Ctrl-C) or, with [live] idle_exit_ms, the stream goes quiet.
// `atfill status CONFIG` shows it from another process.
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "pipeline/job.hpp"
#include "sources/jetstream/jetstream.hpp"
#include "sources/labels/labeler.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/atfill/job_run.hpp"
#include "tools/atfill/job_view.hpp"
#include "tools/atfill/verb_backfill.hpp"

namespace atfill::cli {
namespace {

int Fail(const char* verb, const std::string& msg, int code) {
  std::fprintf(stderr, "atfill %s: %s\n", verb, msg.c_str());
  return code;
}

// The label subscriptions' job ([labels] labelers): its counters by outcome, each labeler's
// saved cursor, its refusals and connection errors from the job's error log.
int PrintLabels(const AppConfig& config, OpenedState& st) {
  auto view = sources::ReadLabelsView(EnvOf(config, st));
  if (!view.ok()) return Fail("status", view.status().message(), kExitIo);
  if (!view->job) {
    if (!config.sources().labels.labelers.empty()) {
      std::printf("labels: no labels job has run yet\n");
    }
    return kExitOk;
  }
  const state::JobRecord* job = &*view->job;
  const auto p = pipeline::DeriveProgress(*job, pipeline::NowMicros());
  std::printf("labels job %" PRIu64 ": %s\n", job->id,
              std::string(state::JobStatusName(job->status)).c_str());
  for (const auto& [did, seq] : view->cursors) {
    std::printf("  labeler     %s, cursor seq %" PRIu64 "\n", did.c_str(), seq);
  }
  std::printf("  rate        %.0f labels/s (over the job's running time)\n", p.records_per_s);
  std::printf(
      "  applied     %s frames, %s labels: %s stored, %s negations stored, %s older than the "
      "stored one\n",
      FormatCount(job->counters.events_read).c_str(),
      FormatCount(job->counters.total_records).c_str(),
      FormatCount(view->Extra("labels_stored")).c_str(),
      FormatCount(view->Extra("labels_negated")).c_str(),
      FormatCount(view->Extra("labels_stale")).c_str());
  std::string by_kind;
  for (const auto& [kind, n] : view->RefusedByKind()) {
    by_kind += (by_kind.empty() ? "" : ", ") + FormatCount(n) + " " + kind;
  }
  std::printf("  refused     %s%s%s (atfill job CONFIG %" PRIu64 " --errors), %s bad frames\n",
              FormatCount(job->counters.failed_records).c_str(), by_kind.empty() ? "" : ": ",
              by_kind.c_str(), job->id, FormatCount(view->Extra("labels_bad_frames")).c_str());
  std::printf("  connection  %s failed or dropped attempt(s)\n",
              FormatCount(view->Extra("labels_connection_errors")).c_str());
  auto logged = st.errors->List(job->id, 0, st.errors->options().max_entries_per_job);
  if (!logged.ok()) return Fail("status", logged.status().message(), kExitIo);
  const state::ErrorEntry* last_error = nullptr;
  for (const state::ErrorEntry& e : *logged) {
    if (last_error == nullptr || e.last_us > last_error->last_us) last_error = &e;
  }
  if (last_error != nullptr) {
    std::printf("  last error  %s %s (%s): %s\n", FormatTime(last_error->last_us).c_str(),
                last_error->kind.c_str(), last_error->key.c_str(), last_error->message.c_str());
  }
  if (!job->stop_reason.empty()) {
    std::printf("  stopped     %s: %s\n", job->stop_reason.code.c_str(),
                job->stop_reason.sentence.c_str());
  }
  return kExitOk;
}

}  // namespace

int RunLive(const AppConfig& config, OpenedState& st, std::function<bool()> backfill_running,
            state::StopReason* stop, std::vector<state::JobRecord> backfills, int* backfill_rc,
            pipeline::JobGroup* added_backfills) {
  pipeline::LiveService service;
  service.live_job = [&config, &st]() -> Result<state::JobRecord> {
    auto job = sources::FindOrCreateLiveJob(EnvOf(config, st), "cli");
    if (!job.ok()) return Status::IoError(job.status().message());
    std::fprintf(
        stderr, "atfill run: live job %" PRIu64 " from %s (%s)\n", job->id,
        config.sources().live.hosts.front().c_str(),
        config.sources().live_firehose
            ? "firehose"
            : std::string(sources::JetstreamProtocolName(config.sources().live.protocol)).c_str());
    return job;
  };
  service.backfills = std::move(backfills);
  service.backfill_running = std::move(backfill_running);
  service.added_backfills = added_backfills;
  service.run = [&config, &st](state::JobRecord job, const pipeline::JobContext& ctx) {
    if (job.kind == "backfill" && ctx.hold_live) {
      std::fprintf(stderr, "atfill run: backfill job %" PRIu64 " runs beside the live consumer\n",
                   job.id);
    }
    return RunAndReport("run", config, st, std::move(job), ctx);
  };
  service.backfill_done = [backfill_rc](const state::JobRecord&,
                                        const Result<pipeline::JobOutcome>& outcome) {
    if (backfill_rc != nullptr) *backfill_rc = std::max(*backfill_rc, ExitCodeOf(outcome));
  };
  service.waiting = [](std::string_view what) {
    if (what == "gap") {
      std::fprintf(stderr,
                   "atfill run: the stream is idle; waiting for the gap replay to finish, then "
                   "applying the live events held meanwhile\n");
    } else {
      std::fprintf(stderr,
                   "atfill run: the stream is idle; waiting for the backfill to finish, then "
                   "applying the live events held for its repos\n");
    }
  };
  auto outcome = ControllerOf(config, st).RunLive(std::move(service));
  if (stop != nullptr) *stop = outcome.ok() ? outcome->job.stop_reason : state::StopReason{};
  // A failed run printed its reason; a live job that could not be found or made did not.
  if (!outcome.ok() && outcome.status().code() == StatusCode::kIoError) {
    std::fprintf(stderr, "atfill run: %s\n", outcome.status().message().c_str());
  }
  return ExitCodeOf(outcome);
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
  auto view = sources::ReadLiveView(EnvOf(*config, *st));
  if (!view.ok()) return Fail("status", view.status().message(), kExitIo);
  if (config->sources().live.hosts.empty()) std::printf("live: not configured ([live] hosts)\n");
  if (!view->job) {
    std::printf("live: no live job has run yet\n");
    return PrintLabels(*config, *st);
  }
  const state::JobRecord* live = &*view->job;
  const uint64_t seq = view->seq;
  const int64_t time_us = view->witnessed_us;
  const int64_t now = pipeline::NowMicros();
  const auto p = pipeline::DeriveProgress(*live, now);
  std::printf("live job %" PRIu64 ": %s\n", live->id,
              std::string(state::JobStatusName(live->status)).c_str());
  if (!live->waiting.empty()) {
    std::printf("  waiting     since %s: %s\n", FormatTime(live->waiting_since_us).c_str(),
                live->waiting.sentence.c_str());
  }
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
  if (live->params.count("protocol") && live->params.at("protocol") == "firehose") {
    std::printf("  firehose    %s commits verified, %s refused (atfill job CONFIG %" PRIu64
                " --errors), %s bad frames\n",
                FormatCount(extra("firehose_verified")).c_str(),
                FormatCount(extra("firehose_refused")).c_str(), live->id,
                FormatCount(extra("firehose_bad_frames")).c_str());
    std::printf("  chains      %s applied, %s stale, %s desync, %s resynced, %s resyncs failed\n",
                FormatCount(extra("firehose_applied")).c_str(),
                FormatCount(extra("firehose_stale")).c_str(),
                FormatCount(extra("firehose_desync")).c_str(),
                FormatCount(extra("firehose_resynced")).c_str(),
                FormatCount(extra("firehose_failed")).c_str());
  }
  if (!live->stop_reason.empty()) {
    std::printf("  stopped     %s: %s\n", live->stop_reason.code.c_str(),
                live->stop_reason.sentence.c_str());
  }
  if (const int rc = PrintLabels(*config, *st); rc != kExitOk) return rc;
  if (st->read_only) std::printf("(read-only view: another atfill process holds the state)\n");
  return kExitOk;
}

}  // namespace atfill::cli
