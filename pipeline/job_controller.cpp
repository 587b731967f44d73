#include "pipeline/job_controller.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>

namespace atfill::pipeline {
namespace {

// How often the watcher looks for request files and interrupts: a pause asked for from another
// process or by Ctrl-C reaches the job within this.
constexpr std::chrono::milliseconds kWatchInterval{200};

std::string StatusName(state::JobStatus status) {
  return std::string(state::JobStatusName(status));
}

}  // namespace

JobController::JobController(state::KvStore* kv, state::JobStore* jobs, state::ErrorLog* errors,
                             JobControllerOptions options)
    : kv_(kv), jobs_(jobs), errors_(errors), options_(std::move(options)) {
  watcher_ = std::thread([this] { WatchLoop(); });
}

JobController::~JobController() {
  {
    std::lock_guard lock(mu_);
    closing_ = true;
  }
  watch_cv_.notify_all();
  watcher_.join();
}

void JobController::SetPlanner(const std::string& kind, JobPlanner planner) {
  std::lock_guard lock(mu_);
  planners_[kind] = std::move(planner);
}

void JobController::SetObserver(Observer observer) {
  std::lock_guard lock(mu_);
  observer_ = std::move(observer);
}

void JobController::WatchLoop() {
  std::unique_lock lock(mu_);
  while (!watch_cv_.wait_for(lock, kWatchInterval, [this] { return closing_; })) {
    const bool interrupted = options_.interrupted && options_.interrupted();
    for (auto& [id, e] : entries_) {
      if (e.runner == nullptr) continue;
      std::error_code ec;
      if (!options_.requests_dir.empty() &&
          std::filesystem::exists(RequestPath(options_.requests_dir, id, "cancel"), ec)) {
        e.runner->RequestStop(StopKind::kCancel);
      } else if (interrupted ||
                 (!options_.requests_dir.empty() &&
                  std::filesystem::exists(RequestPath(options_.requests_dir, id, "pause"), ec))) {
        e.runner->RequestStop(StopKind::kPause);
      }
    }
  }
}

void JobController::Changed(const state::JobRecord& job, const BatchReport* batch) {
  Observer observer;
  state::JobCounters before;
  bool seen = false;
  {
    std::lock_guard lock(mu_);
    Entry& e = entries_[job.id];
    if (!e.seen || e.stage != job.stage) {
      const state::JobStage from = e.seen ? e.stage : state::JobStage::kPending;
      e.changes.push_back({e.changes.size(), from, job.stage, NowMicros()});
      e.stage = job.stage;
    }
    seen = e.seen;
    before = e.counters;
    e.seen = true;
    e.counters = job.counters;
    observer = observer_;
  }
  if (observer) observer(job, seen ? &before : nullptr, batch);
}

void JobController::Starting(uint64_t id) {
  std::lock_guard lock(mu_);
  Entry& e = entries_[id];
  ++e.generation;
  e.starting = true;
  e.pending_stop = StopKind::kNone;
}

void JobController::Ended(uint64_t id) {
  std::lock_guard lock(mu_);
  Entry& e = entries_[id];
  e.runner = nullptr;
  e.starting = false;
}

uint64_t JobController::Begin(uint64_t id) {
  std::lock_guard lock(mu_);
  Entry& e = entries_[id];
  // A run announced by Starting is that start's; one that was not is a start of its own.
  if (!e.starting) ++e.generation;
  return e.generation;
}

void JobController::Attach(uint64_t id, JobRunner* runner) {
  std::lock_guard lock(mu_);
  Entry& e = entries_[id];
  e.runner = runner;
  e.starting = false;
  if (e.pending_stop != StopKind::kNone) runner->RequestStop(e.pending_stop);
  e.pending_stop = StopKind::kNone;
}

void JobController::Detach(uint64_t id, uint64_t generation) {
  std::lock_guard lock(mu_);
  Entry& e = entries_[id];
  // A later start of the job (a resume while this run was ending) owns the entry now.
  if (e.generation != generation) return;
  e.runner = nullptr;
  e.starting = false;
}

bool JobController::Running(uint64_t id) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  return it != entries_.end() && (it->second.runner != nullptr || it->second.starting);
}

bool JobController::RequestStop(uint64_t id, StopKind kind) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  Entry& e = it->second;
  if (e.runner != nullptr) {
    e.runner->RequestStop(kind);
    return true;
  }
  if (!e.starting) return false;
  // A cancel outranks a pause asked for earlier.
  if (e.pending_stop != StopKind::kCancel) e.pending_stop = kind;
  return true;
}

void JobController::RequestStopAll(StopKind kind) {
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, e] : entries_) ids.push_back(id);
  }
  for (uint64_t id : ids) RequestStop(id, kind);
}

std::optional<state::JobRecord> JobController::Snapshot(uint64_t id) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.runner == nullptr) return std::nullopt;
  return it->second.runner->Snapshot();
}

std::vector<JobStageChange> JobController::StageChanges(uint64_t id, uint64_t since) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || since >= it->second.changes.size()) return {};
  return {it->second.changes.begin() + static_cast<std::ptrdiff_t>(since),
          it->second.changes.end()};
}

Result<JobOutcome> JobController::Run(state::JobRecord job, const JobContext& ctx) {
  const uint64_t id = job.id;
  struct Detacher {
    JobController* c;
    uint64_t id;
    uint64_t generation;
    ~Detacher() { c->Detach(id, generation); }
  } detach{this, id, Begin(id)};
  JobPlanner planner;
  {
    std::lock_guard lock(mu_);
    auto it = planners_.find(job.kind);
    if (it != planners_.end()) planner = it->second;
  }
  if (!planner) {
    return Status::Unsupported("job " + std::to_string(id) + " is a " + job.kind +
                               " job, and this program runs no job of that kind");
  }
  ATFILL_ASSIGN_OR_RETURN(JobPlan plan, planner(job, ctx));
  // A sharded process's graph first removes the events of DIDs other shards own.
  ShardFilter shard_filter(options_.shard);
  if (!options_.shard.all()) {
    plan.stages.shard_filter = &shard_filter;
    job.params["shard"] = options_.shard.ToString();
  }
  JobOptions job_options = options_.jobs;
  job_options.on_change = [this](const state::JobRecord& j, const BatchReport* batch) {
    Changed(j, batch);
  };
  Result<state::JobRecord> done = Status::Internal("not run");
  {
    JobRunner runner(kv_, jobs_, errors_, job, plan.cursor_name, job_options);
    EngineOptions engine_options = options_.engine;
    if (plan.batch) engine_options.batch = *plan.batch;
    Engine engine(engine_options, plan.source, plan.stages.InOrder(), plan.sink, kv_, &runner);
    Attach(id, &runner);
    done = runner.Run(&engine);
    Detach(id, detach.generation);
  }
  if (!options_.requests_dir.empty()) ClearRequests(options_.requests_dir, id);
  // The pieces go last to first: a later one may use an earlier one until it is gone.
  const auto release = [&plan] {
    while (!plan.keep.empty()) plan.keep.pop_back();
  };
  if (!done.ok()) {
    release();
    return done.status();
  }
  JobOutcome outcome;
  outcome.job = std::move(*done);
  // Errors a later attempt resolved (a unit that failed, then succeeded) do not count.
  if (outcome.job.status == state::JobStatus::kCompleted &&
      outcome.job.counters.failed_records > 0) {
    auto unresolved = HasUnresolvedErrors(id);
    if (!unresolved.ok()) {
      release();
      return unresolved.status();
    }
    outcome.unresolved_errors = *unresolved;
  }
  if (plan.after) plan.after(outcome.job);
  release();
  return outcome;
}

Result<JobOutcome> JobController::RunLive(LiveService service) {
  const JobGroup::RunFn run =
      service.run ? service.run : [this](state::JobRecord job, const JobContext& ctx) {
        return Run(std::move(job), ctx);
      };
  JobGroup backfills(this, run);
  JobContext hold;
  hold.hold_live = true;
  ATFILL_RETURN_IF_ERROR(backfills.Start(service.backfills, hold, service.backfill_done));
  bool waited_for_backfills = false;
  JobGroup* added = service.added_backfills;
  auto backfills_running = [&backfills, added] {
    return backfills.running() || (added != nullptr && added->running());
  };
  Result<JobOutcome> outcome = Status::Internal("the live consumer did not run");
  for (;;) {
    auto job = service.live_job ? service.live_job()
                                : Result<state::JobRecord>(Status::Invalid("no live job"));
    if (!job.ok()) {
      outcome = job.status();
      break;
    }
    JobGroup gaps(this, run);
    JobContext ctx;
    ctx.beside = &gaps;
    if (waited_for_backfills) {
      ctx.backfill_running = [] { return false; };
    } else if (service.backfill_running) {
      ctx.backfill_running = [&backfills_running, &service] {
        return backfills_running() || service.backfill_running();
      };
    } else {
      ctx.backfill_running = backfills_running;
    }
    outcome = run(std::move(*job), ctx);
    const bool idle = outcome.ok() && outcome->job.stop_reason.code == "stream_idle";
    if (idle && gaps.started()) {
      // Its events waited for the gap: once the gap is written, the next run applies them.
      if (gaps.running() && service.waiting) service.waiting("gap");
      gaps.Wait();
      continue;
    }
    const bool interrupted = options_.interrupted && options_.interrupted();
    if (idle && !waited_for_backfills && backfills_running() && !interrupted) {
      // The stream went quiet before the backfills ended: once they have, the consumer runs
      // again and applies what it held for their repos.
      if (service.waiting) service.waiting("backfill");
      backfills.Wait();
      if (added != nullptr) added->Wait();
      waited_for_backfills = true;
      continue;
    }
    break;
  }
  backfills.Wait();
  if (added != nullptr) added->Wait();
  return outcome;
}

Result<state::JobRecord> JobController::Steer(uint64_t id, StopKind kind, std::string_view by) {
  std::lock_guard steer_lock(steer_mu_);
  const bool cancel = kind == StopKind::kCancel;
  ATFILL_ASSIGN_OR_RETURN(auto job, jobs_->Get(id));
  const char* verb = cancel ? "cancel" : "pause";
  if (job.status == state::JobStatus::kCompleted || job.status == state::JobStatus::kCancelled ||
      (!cancel && job.status == state::JobStatus::kFailed)) {
    return Status::Unsupported("job " + std::to_string(id) + " is " + StatusName(job.status) +
                               "; there is nothing to " + verb);
  }
  if (RequestStop(id, kind)) {
    // The job shows pausing/cancelling from its next commit; answer it as asked.
    job.status = cancel ? state::JobStatus::kCancelling : state::JobStatus::kPausing;
    return job;
  }
  if (!cancel && job.status == state::JobStatus::kPaused) return job;  // already paused
  if (!cancel &&
      (job.status == state::JobStatus::kRunning || job.status == state::JobStatus::kPausing ||
       job.status == state::JobStatus::kCancelling)) {
    // Not run by this process, which holds the state: the process that ran it died, and the next
    // restart resumes it. Cancelling it is final either way.
    return Status::Unsupported("job " + std::to_string(id) +
                               " is not running in this process; resume it first");
  }
  const int64_t now = NowMicros();
  job.updated_us = now;
  if (cancel) {
    job.status = state::JobStatus::kCancelled;
    job.stage = state::JobStage::kCancelled;
    job.finished_us = now;
    job.stop_reason = {"cancelled", "cancelled on request (" + std::string(by) + ")"};
  } else {
    job.status = state::JobStatus::kPaused;
    job.stop_reason = {"paused", "paused on request (" + std::string(by) + ")"};
  }
  Changed(job, nullptr);
  state::WriteBatch batch;
  ATFILL_RETURN_IF_ERROR(jobs_->Put(&batch, job));
  ATFILL_RETURN_IF_ERROR(kv_->Write(batch));
  return job;
}

bool JobController::ShouldResume(const state::JobRecord& j) {
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

Result<std::vector<state::JobRecord>> JobController::Recover() {
  ATFILL_ASSIGN_OR_RETURN(auto all, jobs_->List());
  std::vector<state::JobRecord> out;
  for (auto& j : all) {
    if (j.status == state::JobStatus::kCancelling) {
      // Its process died before the cancellation finished: finish it.
      j.status = state::JobStatus::kCancelled;
      j.stage = state::JobStage::kCancelled;
      j.stop_reason = {"cancelled", "cancelled on request"};
      j.finished_us = NowMicros();
      state::WriteBatch b;
      ATFILL_RETURN_IF_ERROR(jobs_->Put(&b, j));
      ATFILL_RETURN_IF_ERROR(kv_->Write(b));
      continue;
    }
    if (ShouldResume(j)) out.push_back(std::move(j));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

Result<bool> JobController::HasUnresolvedErrors(uint64_t job) {
  ATFILL_ASSIGN_OR_RETURN(state::ErrorTotals totals, errors_->Totals(job));
  ATFILL_ASSIGN_OR_RETURN(auto entries, errors_->List(job, 0, totals.entries));
  // Outcomes the network reported (state::IsOutcomeKind) are logged beside the errors but are
  // none. Every occurrence of a stored entry is one of its attempts.
  std::map<std::string, uint64_t> stored;
  for (const state::ErrorEntry& e : entries) {
    if (state::IsOutcomeKind(e.kind)) continue;
    if (!e.resolved) return true;
    stored[e.kind] += e.attempts;
  }
  if (totals.dropped == 0) return false;
  // Past the cap an error is counted by its kind but not stored, so never resolved.
  ATFILL_ASSIGN_OR_RETURN(auto counts, errors_->CountsByKind(job));
  for (const auto& [kind, n] : counts) {
    if (!state::IsOutcomeKind(kind) && n > stored[kind]) return true;
  }
  return false;
}

std::filesystem::path JobController::RequestPath(const std::filesystem::path& dir, uint64_t job,
                                                 std::string_view what) {
  return dir / (std::to_string(job) + "." + std::string(what));
}

Status JobController::WriteRequest(const std::filesystem::path& dir, uint64_t job,
                                   std::string_view what) {
  const auto path = RequestPath(dir, job, what);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("cannot create " + dir.string() + ": " + ec.message());
  const auto tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << what << "\n";
    if (!out) return Status::IoError("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::IoError("cannot write " + path.string() + ": " + ec.message());
  return Status::OK();
}

void JobController::ClearRequests(const std::filesystem::path& dir, uint64_t job) {
  std::error_code ec;
  std::filesystem::remove(RequestPath(dir, job, "pause"), ec);
  std::filesystem::remove(RequestPath(dir, job, "cancel"), ec);
}

JobGroup::~JobGroup() { Wait(); }

Status JobGroup::Start(std::vector<state::JobRecord> jobs, JobContext ctx, Done done) {
  std::lock_guard lock(mu_);
  if (closed_) return Status::Unavailable("shutting down; no job starts now");
  if (jobs.empty()) return Status::OK();
  started_ = true;
  running_ += static_cast<int>(jobs.size());
  for (const auto& j : jobs) controller_->Starting(j.id);
  threads_.emplace_back([this, jobs = std::move(jobs), ctx = std::move(ctx),
                         done = std::move(done)] {
    size_t i = 0;
    for (; i < jobs.size(); ++i) {
      Result<JobOutcome> outcome = run_ ? run_(jobs[i], ctx) : controller_->Run(jobs[i], ctx);
      const bool completed = outcome.ok() && outcome->job.status == state::JobStatus::kCompleted;
      if (!completed) unfinished_ = true;
      if (done) done(jobs[i], outcome);
      --running_;
      const bool stopped = outcome.ok() && (outcome->job.status == state::JobStatus::kPaused ||
                                            outcome->job.status == state::JobStatus::kCancelled);
      if (stopped) break;
    }
    // The rest of a sequence ended early will not run.
    for (++i; i < jobs.size(); ++i) {
      controller_->Ended(jobs[i].id);
      --running_;
    }
  });
  return Status::OK();
}

void JobGroup::Close() {
  std::lock_guard lock(mu_);
  closed_ = true;
}

void JobGroup::Wait() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) {
    if (t.joinable()) t.join();
  }
}

}  // namespace atfill::pipeline
