// Job control for one process that holds a state directory: it runs jobs (in the foreground or on
// threads of their own beside each other), resumes what a restart finds unfinished, steers pause,
// resume and cancel (from this process, from another one through request files, and from
// Ctrl-C), and keeps what an admin backend reads beyond the state store (each job's stage
// transitions, the running jobs' live records).
//
// What a job of each kind runs is not known here: pipeline/ knows no source, stage or sink. A
// kind's planner (registered with SetPlanner) builds the job's plan from its record, from the
// pieces the program links (sources/, stages/, sinks/); the controller assembles the standard
// graph from it (pipeline/plan.hpp, adding the shard filter) and runs it. The component registry
// (pipeline/components.hpp) registers a planner for each kind the library's components provide;
// a program may register its own beside them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/status.hpp"
#include "pipeline/batcher.hpp"
#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"
#include "pipeline/plan.hpp"
#include "pipeline/shard.hpp"
#include "pipeline/sink.hpp"
#include "pipeline/source.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"

namespace atfill::pipeline {

class JobGroup;

// How a job is run this time (not stored: a resumed job may run differently).
struct JobContext {
  // A live consumer runs beside this backfill in this process: the backfill marks the repos it
  // has queued so the consumer holds their events until the repo's checkpoint.
  bool hold_live = false;
  // For the live consumer: whether a backfill beside it still runs.
  std::function<bool()> backfill_running;
  // Jobs this job starts while it runs (the live consumer's gap replays) run in this group;
  // nullptr: it starts none.
  JobGroup* beside = nullptr;
};

// What one run of a job executes. The planner owns the pieces through `keep`; the controller adds
// the shard filter (JobControllerOptions::shard) in its slot of the standard order.
struct JobPlan {
  JobPlan() = default;
  JobPlan(JobPlan&&) = default;
  JobPlan& operator=(JobPlan&&) = default;
  // Releases `keep` last to first: a piece may use one made before it until it is gone.
  ~JobPlan() {
    while (!keep.empty()) keep.pop_back();
  }

  Source* source = nullptr;
  StandardStages stages;
  Sink* sink = nullptr;
  std::string cursor_name;
  // Replaces the engine's batch limits for this job (a crawl, a replay, the live consumer).
  std::optional<BatcherOptions> batch;
  // Whatever the pointers above point to, kept alive for the run and released after it.
  std::vector<std::shared_ptr<void>> keep;
  // Called once the run has ended, with the job as it ended (a kind's own statistics).
  std::function<void(const state::JobRecord& ended)> after;
};

// Builds the plan of `job` (its kind's planner); it may add parameters to the record. An error's
// code tells its caller why: kInvalid/kUnsupported for a job or config this build cannot run,
// other codes for what was unavailable.
using JobPlanner = std::function<Result<JobPlan>(state::JobRecord& job, const JobContext& ctx)>;

struct JobOutcome {
  state::JobRecord job;  // as it ended: completed, paused, cancelled or failed
  // Completed, but its error log holds an error no later attempt resolved (some input was refused
  // and the rest processed), or more errors than it could store. Outcomes the network reported
  // (accounts deactivated, taken down, suspended or gone: state::IsOutcomeKind) are not errors.
  bool unresolved_errors = false;
};

// A job's stage transitions seen by this process (the first sight of a job counts as its move out
// of "pending").
struct JobStageChange {
  uint64_t index = 0;
  state::JobStage from = state::JobStage::kPending;
  state::JobStage to = state::JobStage::kPending;
  int64_t at_us = 0;
};

struct JobControllerOptions {
  EngineOptions engine;
  JobOptions jobs;  // its on_change is the controller's (see SetObserver)
  Shard shard;      // not all: every job's graph starts with a ShardFilter
  // Where other processes leave pause and cancel requests ("<state dir>/requests"); empty: none.
  std::filesystem::path requests_dir;
  // Polled while jobs run: true asks every running job to pause (Ctrl-C, SIGTERM).
  std::function<bool()> interrupted;
};

// The live consumer as `atfill run` keeps it: see JobController::RunLive.
struct LiveService {
  // The live job's record, found (its cursor continues) or made anew each time the consumer
  // starts.
  std::function<Result<state::JobRecord>()> live_job;
  // Backfills run one after another on a thread of their own beside the consumer, which holds
  // their repos' events until each repo's checkpoint.
  std::vector<state::JobRecord> backfills;
  // Backfills run elsewhere (an admin API's group, collections added at run time): the consumer
  // also holds their repos' events while this answers true. Not waited for when the stream goes
  // idle.
  std::function<bool()> backfill_running;
  // Backfills started while the consumer runs (collections added at run time), in a group of the
  // caller's: held and waited for as `backfills` are.
  JobGroup* added_backfills = nullptr;
  // How each job runs (the live consumer, its gap replays, the backfills); Run when not set.
  std::function<Result<JobOutcome>(state::JobRecord job, const JobContext& ctx)> run;
  // Told of each backfill's end.
  std::function<void(const state::JobRecord& job, const Result<JobOutcome>& outcome)> backfill_done;
  // Told why the consumer waits before it runs again ("gap" or "backfill").
  std::function<void(std::string_view waiting_for)> waiting;
};

class JobController {
 public:
  // The stores must outlive the controller.
  JobController(state::KvStore* kv, state::JobStore* jobs, state::ErrorLog* errors,
                JobControllerOptions options);
  // Stops the request watcher; jobs spawned by a JobGroup must have ended (JobGroup::Wait).
  ~JobController();
  JobController(const JobController&) = delete;
  JobController& operator=(const JobController&) = delete;

  void SetPlanner(const std::string& kind, JobPlanner planner);

  // Told of every change of a running job's record (after the controller has noted its stage),
  // with the counters it had before (nullptr at its first sight here) and the batch committed
  // (nullptr for a change without one); from the job's committing thread.
  using Observer = std::function<void(const state::JobRecord& job, const state::JobCounters* before,
                                      const BatchReport* batch)>;
  void SetObserver(Observer observer);

  // Runs `job` on this thread to its end. An error: the job could not be planned (the planner's
  // status) or its state could not be written.
  Result<JobOutcome> Run(state::JobRecord job, const JobContext& ctx = {});

  // Runs the live consumer on this thread with `service`'s backfills beside it. When the stream
  // goes quiet (the consumer pauses with "stream_idle") while events it held wait for a gap replay
  // it started, or for the backfills beside it (unless interrupted), it waits for them and runs
  // again from its cursor, which applies what it held. Returns the consumer's last outcome, once
  // the backfills have ended.
  Result<JobOutcome> RunLive(LiveService service);

  // A job that is about to run on another thread counts as running from now on, and a stop asked
  // for before it starts is handed to it when it does. Ended(id) when it will not run after all.
  void Starting(uint64_t id);
  void Ended(uint64_t id);
  // Whether the job runs (or is starting) in this process.
  bool Running(uint64_t id) const;
  // Asks the job to stop at its next checkpoint; false when it does not run in this process.
  bool RequestStop(uint64_t id, StopKind kind);
  // Asks every job running in this process to stop.
  void RequestStopAll(StopKind kind);
  // Pause or cancel `id` for a user (`by` names where the request came from: "admin API"): a job
  // running here is asked to stop and answered as pausing/cancelling; one that no process runs is
  // marked paused or cancelled at once. Unsupported when there is nothing to do.
  Result<state::JobRecord> Steer(uint64_t id, StopKind kind, std::string_view by);
  // The running job's current record (its counters as of its last commit); nullopt when it does
  // not run here.
  std::optional<state::JobRecord> Snapshot(uint64_t id) const;
  std::vector<JobStageChange> StageChanges(uint64_t id, uint64_t since) const;

  // After a restart: finishes the cancellations a dead process left (cancelling -> cancelled)
  // and returns the jobs to resume (ShouldResume), by id.
  Result<std::vector<state::JobRecord>> Recover();
  // Interrupted jobs (running, pausing) and jobs that paused because work was left (not on
  // request) are resumed by a restart.
  static bool ShouldResume(const state::JobRecord& job);

  // Whether `job`'s error log holds an error no later attempt resolved (or more than it stored);
  // outcome entries (state::IsOutcomeKind) are not errors.
  Result<bool> HasUnresolvedErrors(uint64_t job);

  // Request files: "<dir>/<job>.<what>", what = "pause" or "cancel".
  static std::filesystem::path RequestPath(const std::filesystem::path& dir, uint64_t job,
                                           std::string_view what);
  // Writes a request atomically (write, then rename).
  static Status WriteRequest(const std::filesystem::path& dir, uint64_t job, std::string_view what);
  static void ClearRequests(const std::filesystem::path& dir, uint64_t job);

  state::KvStore* kv() const { return kv_; }
  state::JobStore* jobs() const { return jobs_; }
  state::ErrorLog* errors() const { return errors_; }

 private:
  struct Entry {
    bool seen = false;
    state::JobStage stage = state::JobStage::kPending;
    state::JobCounters counters;
    std::vector<JobStageChange> changes;
    JobRunner* runner = nullptr;
    bool starting = false;
    StopKind pending_stop = StopKind::kNone;
    // Counts the job's starts here: a run that ends after the next start was announced (a pause,
    // then a resume at once) leaves the entry to that start.
    uint64_t generation = 0;
  };
  void Changed(const state::JobRecord& job, const BatchReport* batch);
  // The generation of the run of `id` beginning now (see Entry::generation).
  uint64_t Begin(uint64_t id);
  void Attach(uint64_t id, JobRunner* runner);
  // Ends run `generation` of `id`: nothing when a later start has claimed the job.
  void Detach(uint64_t id, uint64_t generation);
  void WatchLoop();

  state::KvStore* kv_;
  state::JobStore* jobs_;
  state::ErrorLog* errors_;
  JobControllerOptions options_;
  mutable std::mutex mu_;  // guards everything below
  std::map<std::string, JobPlanner> planners_;
  std::map<uint64_t, Entry> entries_;
  Observer observer_;
  std::mutex steer_mu_;  // one steering decision at a time
  std::thread watcher_;
  std::condition_variable watch_cv_;
  bool closing_ = false;
};

// Jobs run on threads of their own beside the caller's: backfills beside the live consumer, the
// live consumer's gap replays, the jobs the admin API starts.
class JobGroup {
 public:
  // How the group runs each job: JobController::Run unless given (a launcher adds its progress
  // view and summary around it).
  using RunFn = std::function<Result<JobOutcome>(state::JobRecord job, const JobContext& ctx)>;
  explicit JobGroup(JobController* controller, RunFn run = {})
      : controller_(controller), run_(std::move(run)) {}
  // Wait().
  ~JobGroup();
  JobGroup(const JobGroup&) = delete;
  JobGroup& operator=(const JobGroup&) = delete;

  using Done = std::function<void(const state::JobRecord& job, const Result<JobOutcome>& outcome)>;
  // Runs `jobs` one after another on one new thread, ending the sequence early when one is paused
  // or cancelled; `done` is told of each. Unavailable after Close.
  Status Start(std::vector<state::JobRecord> jobs, JobContext ctx = {}, Done done = {});

  // Whether a job was started by this group.
  bool started() const { return started_.load(); }
  // Whether a job of this group runs (or waits for its turn) now.
  bool running() const { return running_.load() > 0; }
  // Whether a job of this group ended without completing (failed, paused, cancelled or unplanned).
  bool unfinished() const { return unfinished_.load(); }
  // Refuses new starts from now on.
  void Close();
  // Waits for every thread started.
  void Wait();

 private:
  JobController* controller_;
  RunFn run_;
  std::mutex mu_;
  std::vector<std::thread> threads_;
  bool closed_ = false;
  std::atomic<bool> started_{false};
  std::atomic<int> running_{0};
  std::atomic<bool> unfinished_{false};
};

}  // namespace atfill::pipeline
