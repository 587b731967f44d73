#include "tools/atfill/run_admin.hpp"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include "net/http_client.hpp"
#include "pipeline/job.hpp"
#include "sources/labels/labeler.hpp"
#include "stages/components.hpp"
#include "state/lexicon_store.hpp"
#include "tools/atfill/admin/admin_server.hpp"
#include "tools/atfill/admin/metrics.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/atfill/job_run.hpp"
#include "tools/atfill/job_view.hpp"
#include "tools/atfill/verb_backfill.hpp"

namespace atfill::cli {

namespace {

// The process's lexicon catalog (made when the config was read, never null), with the documents
// kept in state (which the first job's plan would load too).
Result<stages::LexiconRegistry*> LexiconsOf(const AppConfig& config, OpenedState& st) {
  const stages::LexiconSettings& settings = config.settings.Get<stages::StageSettings>().lexicons;
  stages::LexiconRegistry* registry = settings.registry.get();
  if (settings.use_network) ATFILL_RETURN_IF_ERROR(registry->UseNetwork(st.kv.get()));
  state::LexiconStore store(*st.kv);
  ATFILL_RETURN_IF_ERROR(registry->LoadKept(store));
  return registry;
}

std::string Name(state::JobStatus status) { return std::string(state::JobStatusName(status)); }

// The label subscriptions as their job record and cursors say (sources::ReadLabelsView).
Result<admin::LabelsStatus> ReadLabels(const AppConfig& config, const pipeline::Environment& env) {
  admin::LabelsStatus l;
  ATFILL_ASSIGN_OR_RETURN(sources::LabelsView view, sources::ReadLabelsView(env));
  l.configured = view.job.has_value() || !config.sources().labels.labelers.empty();
  if (!view.job) {
    l.status = "not started";
    for (const std::string& did : config.sources().labels.labelers) l.labelers.push_back({did, 0});
    return l;
  }
  const state::JobRecord& job = *view.job;
  l.job_id = job.id;
  l.status = Name(job.status);
  for (const auto& [did, seq] : view.cursors) l.labelers.push_back({did, seq});
  l.labels_per_s = pipeline::DeriveProgress(job, pipeline::NowMicros()).records_per_s;
  l.frames = job.counters.events_read;
  l.labels = job.counters.total_records;
  l.refused = job.counters.failed_records;
  l.stored = view.Extra("labels_stored");
  l.negated = view.Extra("labels_negated");
  l.stale = view.Extra("labels_stale");
  l.refused_by = view.RefusedByKind();
  l.bad_frames = view.Extra("labels_bad_frames");
  l.connection_errors = view.Extra("labels_connection_errors");
  if (!job.stop_reason.empty()) l.error = job.stop_reason.sentence;
  return l;
}

}  // namespace

RunAdmin::RunAdmin(const AppConfig& config, OpenedState& st, std::function<bool()> live_running)
    : config_(config),
      st_(st),
      controller_(ControllerOf(config, st)),
      details_(st.kv.get(), st.jobs.get(), st.errors.get()),
      live_running_(std::move(live_running)),
      jobs_(&controller_, [this](state::JobRecord job, const pipeline::JobContext& ctx) {
        // Every job of this process reports as "atfill run", whether the command line, the API
        // or a collection change started it (the job records which).
        return RunAndReport("run", config_, st_, std::move(job), ctx);
      }) {}

RunAdmin::~RunAdmin() { Shutdown(); }

void RunAdmin::Spawn(state::JobRecord job) {
  pipeline::JobContext ctx;
  ctx.hold_live = live_running_ && live_running_();
  // Refused only while shutting down, when no job starts.
  static_cast<void>(jobs_.Start({std::move(job)}, ctx));
}

void RunAdmin::Shutdown() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  jobs_.Close();
  stop_cv_.notify_all();
  // The jobs see the stop signal (Ctrl-C, SIGTERM) at their next checkpoint and pause; a job
  // still running when Shutdown is called without one is asked to pause here.
  controller_.RequestStopAll(pipeline::StopKind::kPause);
  jobs_.Wait();
  if (retention_.joinable()) retention_.join();
  if (sampler_.joinable()) sampler_.join();
}

void RunAdmin::StartRetention() {
  if (config_.backfill_retention_days <= 0) return;
  retention_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      lock.unlock();
      auto cleared = details_.ClearBackfillsFinishedBefore(config_.backfill_retention_days,
                                                           pipeline::NowMicros());
      if (!cleared.ok()) {
        std::fprintf(stderr, "atfill run: retention: %s\n", cleared.status().message().c_str());
      } else if (*cleared > 0) {
        std::fprintf(stderr,
                     "atfill run: retention: cleared the details of %" PRIu64
                     " backfill job(s) finished more than %g days ago\n",
                     *cleared, config_.backfill_retention_days);
      }
      lock.lock();
      stop_cv_.wait_for(lock, std::chrono::hours(24), [this] { return stopping_; });
    }
  });
}

void RunAdmin::StartLiveHistory() {
  if (config_.sources().live.hosts.empty()) return;
  sampler_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      lock.unlock();
      // A failed look (the state store busy or broken) is a gap in the chart, not an error.
      if (auto live = Live(); live.ok() && live->configured) {
        std::lock_guard history_lock(history_mu_);
        history_.push_back({pipeline::NowMicros(), live->lag_s, live->cursor});
        while (history_.size() > kLiveSamplesKept) history_.pop_front();
      }
      lock.lock();
      stop_cv_.wait_for(lock, std::chrono::milliseconds(kLiveSampleMs),
                        [this] { return stopping_; });
    }
  });
}

Result<std::vector<admin::JobSummary>> RunAdmin::ListJobs() {
  ATFILL_ASSIGN_OR_RETURN(auto jobs, st_.jobs->List());
  std::sort(jobs.begin(), jobs.end(), [](const auto& a, const auto& b) { return a.id > b.id; });
  std::vector<admin::JobSummary> out;
  for (auto& j : jobs) {
    admin::JobSummary s;
    WithWait(&j);
    ATFILL_ASSIGN_OR_RETURN(s.queued_units, details_.QueuedUnits(j.id));
    s.job = std::move(j);
    out.push_back(std::move(s));
  }
  return out;
}

void RunAdmin::WithWait(state::JobRecord* job) const {
  // A wait for the sink may not reach the state (it can sit on the full disk the sink waits
  // for), but the running job's snapshot holds it.
  if (!job->waiting.empty()) return;
  if (auto running = controller_.Snapshot(job->id); running && !running->waiting.empty()) {
    job->waiting = running->waiting;
    job->waiting_since_us = running->waiting_since_us;
  }
}

Result<admin::JobDetails> RunAdmin::GetJob(uint64_t id) {
  ATFILL_ASSIGN_OR_RETURN(admin::JobDetails details, details_.Get(id));
  WithWait(&details.job);
  return details;
}

Result<std::vector<admin::StageChange>> RunAdmin::StageChanges(uint64_t id, uint64_t since) {
  ATFILL_RETURN_IF_ERROR(st_.jobs->Get(id).status());
  std::vector<admin::StageChange> out;
  for (const pipeline::JobStageChange& c : controller_.StageChanges(id, since)) {
    out.push_back({c.index, c.from, c.to, c.at_us});
  }
  return out;
}

Result<uint64_t> RunAdmin::StartBackfill(const admin::BackfillRequest& request) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return Status::Unavailable("atfill is shutting down; no job starts now");
  }
  sources::BackfillTargets targets;
  targets.collections = request.collections;
  targets.dids = request.dids;
  targets.source = request.source;
  targets.mode = request.mode;
  ATFILL_ASSIGN_OR_RETURN(state::JobRecord job, CreateBackfill(config_, st_, targets, "api"));
  if (controller_.Running(job.id)) return job.id;  // those targets' job already runs here
  const uint64_t id = job.id;
  Spawn(std::move(job));
  return id;
}

Result<state::JobRecord> RunAdmin::Pause(uint64_t id) {
  return controller_.Steer(id, pipeline::StopKind::kPause, "admin API");
}
Result<state::JobRecord> RunAdmin::Cancel(uint64_t id) {
  return controller_.Steer(id, pipeline::StopKind::kCancel, "admin API");
}

Result<state::JobRecord> RunAdmin::Resume(uint64_t id) {
  ATFILL_ASSIGN_OR_RETURN(auto job, st_.jobs->Get(id));
  if (controller_.Running(id)) {
    return Status::Unsupported("job " + std::to_string(id) + " is already running");
  }
  if (job.status == state::JobStatus::kCompleted || job.status == state::JobStatus::kCancelled) {
    return Status::Unsupported("job " + std::to_string(id) + " is " + Name(job.status) +
                               "; there is nothing to resume");
  }
  if (job.kind != "backfill") {
    return Status::Unsupported("job " + std::to_string(id) + " is a " + job.kind +
                               " job; the admin API resumes backfill jobs (atfill resume "
                               "resumes the others)");
  }
  {
    std::lock_guard lock(mu_);
    if (stopping_) return Status::Unavailable("atfill is shutting down; no job starts now");
  }
  Spawn(job);
  job.status = state::JobStatus::kRunning;
  return job;
}

Result<uint64_t> RunAdmin::RetryFailed(uint64_t id) {
  ATFILL_ASSIGN_OR_RETURN(auto original, st_.jobs->Get(id));
  if (!state::IsTerminal(original.status) && original.status != state::JobStatus::kPaused) {
    return Status::Unsupported("job " + std::to_string(id) + " is " + Name(original.status) +
                               "; retry its failed blocks once it has stopped");
  }
  bool resumed = false;
  auto job = sources::CreateRetryJob(EnvOf(config_, st_), id, "api", &resumed);
  if (!job.ok()) {
    // Nothing failed: the request cannot be served in this state of the job.
    if (job.status().code() == StatusCode::kNotFound) {
      return Status::Unsupported(job.status().message());
    }
    return job.status();
  }
  if (!controller_.Running(job->id)) Spawn(*job);
  return job->id;
}

Status RunAdmin::ClearDetails(uint64_t id) { return details_.Clear(id); }

Result<uint64_t> RunAdmin::ClearAllDetails() { return details_.ClearAll(); }

Result<admin::LiveStatus> RunAdmin::Live() {
  admin::LiveStatus s;
  ATFILL_ASSIGN_OR_RETURN(s.labels, ReadLabels(config_, EnvOf(config_, st_)));
  if (config_.sources().live.hosts.empty()) return s;
  s.configured = true;
  s.host = config_.sources().live.hosts.front();
  ATFILL_ASSIGN_OR_RETURN(sources::LiveView view, sources::ReadLiveView(EnvOf(config_, st_)));
  if (!view.job) {
    s.status = "not started";
    return s;
  }
  const state::JobRecord* live = &*view.job;
  s.job_id = live->id;
  const bool running = controller_.Running(live->id);
  s.status = running ? "streaming" : Name(live->status);
  if (auto p = live->params.find("protocol"); p != live->params.end()) s.protocol = p->second;
  if (!live->stop_reason.empty() && !running) s.error = live->stop_reason.sentence;
  s.cursor = view.seq;
  s.witnessed_us = view.witnessed_us;
  const int64_t now = pipeline::NowMicros();
  if (s.witnessed_us > 0) s.lag_s = static_cast<double>(now - s.witnessed_us) / 1e6;
  const auto p = pipeline::DeriveProgress(*live, now);
  s.events_per_s = p.events_per_s;
  s.records_per_s = p.records_per_s;
  return s;
}

Result<std::vector<state::BatchAudit>> RunAdmin::Batches(uint64_t id, uint64_t from, size_t limit) {
  ATFILL_RETURN_IF_ERROR(st_.jobs->Get(id).status());
  return st_.jobs->ListBatchAudit(id, from, limit);
}

Result<std::vector<admin::LiveSample>> RunAdmin::LiveHistory(int64_t* interval_ms) {
  *interval_ms = kLiveSampleMs;
  std::lock_guard lock(history_mu_);
  return std::vector<admin::LiveSample>(history_.begin(), history_.end());
}

Result<admin::CollectionsAnswer> RunAdmin::Collections() {
  if (collections_ == nullptr) return admin::AdminBackend::Collections();
  admin::CollectionsAnswer a;
  ATFILL_ASSIGN_OR_RETURN(a.collections, collections_->Current());
  return a;
}

Result<admin::CollectionsAnswer> RunAdmin::ChangeCollections(
    const admin::CollectionsRequest& request) {
  if (collections_ == nullptr) return admin::AdminBackend::ChangeCollections(request);
  {
    std::lock_guard lock(mu_);
    if (stopping_) return Status::Unavailable("atfill is shutting down; nothing changes now");
  }
  ATFILL_ASSIGN_OR_RETURN(
      CollectionsOutcome outcome,
      collections_->Change(request.add, request.remove, request.backfill, request.purge, "api"));
  admin::CollectionsAnswer a;
  a.collections = std::move(outcome.change.now);
  a.added = std::move(outcome.change.added);
  a.removed = std::move(outcome.change.removed);
  a.backfill_job = outcome.backfill_job.value_or(0);
  a.purged = std::move(outcome.purged);
  return a;
}

Result<std::vector<admin::LexiconInfo>> RunAdmin::Lexicons() {
  ATFILL_ASSIGN_OR_RETURN(stages::LexiconRegistry * registry, LexiconsOf(config_, st_));
  std::vector<admin::LexiconInfo> out;
  for (const auto& e : registry->List()) {
    out.push_back({e.nsid, e.record, e.from_config, e.published_by});
  }
  return out;
}

// A record type's lexicon drives what is indexed: its NSID joins the live consumer's collections
// (which backfills it beside the stream) or, without a live consumer, gets a backfill of its own.
Result<admin::LexiconAnswer> RunAdmin::AddLexicon(std::string_view document, bool backfill) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return Status::Unavailable("atfill is shutting down; nothing changes now");
  }
  ATFILL_ASSIGN_OR_RETURN(stages::LexiconRegistry * registry, LexiconsOf(config_, st_));
  state::LexiconStore store(*st_.kv);
  ATFILL_ASSIGN_OR_RETURN(auto added, registry->Add(document, store));
  std::fprintf(stderr, "atfill run: lexicon %s %s (%s)\n", added.nsid.c_str(),
               added.replaced ? "replaced" : "added", added.record ? "a record type" : "no record");
  admin::LexiconAnswer a;
  a.nsid = added.nsid;
  a.record = added.record;
  a.replaced = added.replaced;
  if (!added.record) return a;
  const std::string context = "the lexicon " + a.nsid + " was added, but its collection";
  if (collections_ != nullptr) {
    ATFILL_ASSIGN_OR_RETURN(std::vector<std::string> now, collections_->Current());
    if (!now.empty()) {  // empty: the consumer takes every collection, this one too
      auto outcome = collections_->Change({a.nsid}, {}, backfill, false, "api");
      if (!outcome.ok()) return outcome.status().WithContext(context + " was not followed");
      a.collections = std::move(outcome->change.now);
      a.collection_changed = !outcome->change.added.empty();
      a.backfill_job = outcome->backfill_job.value_or(0);
      return a;
    }
    a.collections = std::move(now);
  }
  if (backfill) {
    admin::BackfillRequest request;
    request.collections = {a.nsid};
    auto job = StartBackfill(request);
    if (!job.ok()) return job.status().WithContext(context + " was not backfilled");
    a.backfill_job = *job;
  }
  return a;
}

Result<admin::LexiconAnswer> RunAdmin::RemoveLexicon(std::string_view nsid) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return Status::Unavailable("atfill is shutting down; nothing changes now");
  }
  ATFILL_ASSIGN_OR_RETURN(stages::LexiconRegistry * registry, LexiconsOf(config_, st_));
  admin::LexiconAnswer a;
  a.nsid = std::string(nsid);
  a.record = registry->catalog()->HasRecord(nsid);
  state::LexiconStore store(*st_.kv);
  ATFILL_RETURN_IF_ERROR(registry->Remove(nsid, store));
  std::fprintf(stderr, "atfill run: lexicon %s removed\n", a.nsid.c_str());
  if (!a.record || collections_ == nullptr) return a;
  ATFILL_ASSIGN_OR_RETURN(std::vector<std::string> now, collections_->Current());
  if (std::find(now.begin(), now.end(), a.nsid) == now.end()) {
    a.collections = std::move(now);
    return a;
  }
  auto outcome = collections_->Change({}, {a.nsid}, false, false, "api");
  if (!outcome.ok()) {
    return outcome.status().WithContext("the lexicon " + a.nsid +
                                        " was removed, but its collection is still followed");
  }
  a.collections = std::move(outcome->change.now);
  a.collection_changed = !outcome->change.removed.empty();
  return a;
}

int ServeRun(const AppConfig& config, OpenedState& st,
             const std::vector<state::JobRecord>& backfills, bool with_backfill) {
  admin::Metrics metrics;
  pipeline::JobController& controller = ControllerOf(config, st);
  controller.SetObserver([&metrics](const state::JobRecord& job, const state::JobCounters* before,
                                    const pipeline::BatchReport* batch) {
    if (before != nullptr) metrics.AddJobCounters(*before, job.counters);
    if (batch != nullptr) {
      metrics.ObserveSinkBatch(static_cast<double>(batch->write_us) / 1e6);
      for (const auto& chunk : batch->batch->chunks) {
        for (const auto& error : chunk->errors) metrics.AddErrors(error.kind);
      }
    }
  });
  static admin::Metrics* g_metrics = nullptr;
  g_metrics = &metrics;
  net::SetResponseObserver([](int status) { g_metrics->CountHttpResponse(status); });
  const bool live = !config.sources().live.hosts.empty();
  // Set before the resumed backfills start, so they hold the consumer's events of their repos.
  std::atomic<bool> live_running{live};
  int rc = kExitOk;
  {
    RunAdmin backend(config, st, [&live_running] { return live_running.load(); });
    admin::AdminServer server;
    if (Status s = server.Start(config.admin, &backend, &metrics); !s.ok()) {
      std::fprintf(stderr, "atfill run: admin API: %s\n", s.message().c_str());
      net::SetResponseObserver(nullptr);
      controller.SetObserver(nullptr);
      return kExitUsage;
    }
    std::fprintf(stderr,
                 "atfill run: admin API and dashboard on http://%s:%u/ (bearer token required; "
                 "Ctrl-C stops)\n",
                 config.admin.address.c_str(), static_cast<unsigned>(server.port()));
    backend.StartRetention();
    backend.StartLiveHistory();
    std::optional<RuntimeCollections> collections;
    if (live) {
      collections.emplace(config, st, [&backend](state::JobRecord job) { backend.Spawn(job); });
      if (auto started = collections->Start(); !started.ok()) {
        std::fprintf(stderr, "atfill run: [live] collections: %s\n",
                     started.status().message().c_str());
        rc = kExitUsage;
      }
      backend.SetRuntimeCollections(&*collections);
      collections->WatchReloads();
    }
    for (const auto& j : backfills) {
      std::fprintf(stderr, "atfill run: resuming backfill job %" PRIu64 " (%s)\n", j.id,
                   std::string(state::JobStatusName(j.status)).c_str());
      backend.Spawn(j);
    }
    if (with_backfill) {
      auto job = CreateBackfill(config, st, {}, "cli");
      if (!job.ok()) {
        // A usage error: stop at once rather than serve without the backfill asked for.
        std::fprintf(stderr, "atfill run: --backfill: %s\n", job.status().message().c_str());
        rc = kExitUsage;
      } else if (!controller.Running(job->id)) {
        backend.Spawn(*job);
      }
    }
    if (live && rc == kExitOk) {
      // Backfills started here (resumed, over the API, for added collections) hold the stream's
      // events of their repos; when the stream goes quiet before they end, the consumer waits for
      // them and runs again to apply what it held.
      rc = RunLive(config, st, nullptr, nullptr, {}, nullptr, backend.jobs());
      // Paused: the stream went quiet, or Ctrl-C/SIGTERM, this server's normal end (the next
      // atfill run resumes from the saved cursor).
      if (rc == kExitStopped) rc = kExitOk;
    }
    live_running = false;
    while (rc != kExitUsage && !StopSignalled()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::fprintf(stderr, "atfill run: stopping: pausing running jobs\n");
    server.Stop();
    if (collections) collections->Stop();
    backend.SetRuntimeCollections(nullptr);
    backend.Shutdown();
  }
  net::SetResponseObserver(nullptr);
  controller.SetObserver(nullptr);
  RestoreSignals();
  return rc;
}

}  // namespace atfill::cli
