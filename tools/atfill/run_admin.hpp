// The admin API's backend inside `atfill run` (docs/admin.md): jobs started, steered and shown
// over HTTP run on threads of this process, on its open state; plus the daily retention task.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "pipeline/job_controller.hpp"
#include "pipeline/job_details.hpp"
#include "tools/atfill/admin/admin_backend.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/run_collections.hpp"

namespace atfill::cli {

class RunAdmin : public admin::AdminBackend {
 public:
  // `config` and `st` must outlive it. `live_running` tells whether this process's live
  // consumer runs now (backfills started then hold its events of their repos).
  RunAdmin(const AppConfig& config, OpenedState& st, std::function<bool()> live_running);
  // Shutdown().
  ~RunAdmin() override;

  // Starts backfill `job` on a thread of its own (the API's jobs and `atfill run`'s resumed ones).
  void Spawn(state::JobRecord job);
  // The backfills started by Spawn.
  pipeline::JobGroup* jobs() { return &jobs_; }
  // Refuses new jobs, asks the running ones to pause and waits for them.
  void Shutdown();

  // Starts the daily retention task (nothing when [jobs] backfill_retention_days is 0).
  void StartRetention();
  // Starts sampling the live consumer's lag every kLiveSampleMs for LiveHistory (nothing when
  // [live] is not set).
  void StartLiveHistory();

  // The lag history: one sample a second, the last hour kept (in memory, since this start).
  static constexpr int64_t kLiveSampleMs = 1000;
  static constexpr size_t kLiveSamplesKept = 3600;

  Result<std::vector<admin::JobSummary>> ListJobs() override;
  Result<admin::JobDetails> GetJob(uint64_t id) override;
  Result<std::vector<admin::StageChange>> StageChanges(uint64_t id, uint64_t since) override;
  Result<uint64_t> StartBackfill(const admin::BackfillRequest& request) override;
  Result<state::JobRecord> Pause(uint64_t id) override;
  Result<state::JobRecord> Resume(uint64_t id) override;
  Result<state::JobRecord> Cancel(uint64_t id) override;
  Result<uint64_t> RetryFailed(uint64_t id) override;
  Status ClearDetails(uint64_t id) override;
  Result<uint64_t> ClearAllDetails() override;
  Result<admin::LiveStatus> Live() override;
  Result<std::vector<state::BatchAudit>> Batches(uint64_t id, uint64_t from, size_t limit) override;
  Result<std::vector<admin::LiveSample>> LiveHistory(int64_t* interval_ms) override;
  Result<admin::CollectionsAnswer> Collections() override;
  Result<admin::CollectionsAnswer> ChangeCollections(
      const admin::CollectionsRequest& request) override;
  Result<std::vector<admin::LexiconInfo>> Lexicons() override;
  Result<admin::LexiconAnswer> AddLexicon(std::string_view document, bool backfill) override;
  Result<admin::LexiconAnswer> RemoveLexicon(std::string_view nsid) override;

  // The live consumer's collections as they change while this process runs (nullptr when it
  // runs no live consumer).
  void SetRuntimeCollections(RuntimeCollections* collections) { collections_ = collections; }

 private:
  // Copies a running job's wait for its sink (JobRecord::waiting) into `job` read from state.
  void WithWait(state::JobRecord* job) const;

  const AppConfig& config_;
  OpenedState& st_;
  pipeline::JobController& controller_;
  pipeline::JobDetailsReader details_;
  std::function<bool()> live_running_;
  pipeline::JobGroup jobs_;  // the backfills started here
  std::mutex mu_;            // guards stopping_
  bool stopping_ = false;
  std::thread retention_;
  std::thread sampler_;
  std::condition_variable stop_cv_;  // wakes retention_ and sampler_ at Shutdown
  std::mutex history_mu_;
  std::deque<admin::LiveSample> history_;  // guarded by history_mu_
  RuntimeCollections* collections_ = nullptr;
};

// `atfill run` with [admin]: serves the admin API and dashboard, starts `backfills` (and, with
// `with_backfill`, [crawl]'s targets) on threads of their own, runs the live consumer when
// [live] is set, and keeps serving until Ctrl-C or SIGTERM; then pauses what runs and exits.
int ServeRun(const AppConfig& config, OpenedState& st,
             const std::vector<state::JobRecord>& backfills, bool with_backfill);

}  // namespace atfill::cli
