// Jobs: the lifecycle around an Engine run. A JobRunner is the engine's Committer: each committed
// batch moves the job's cursor, counters, error log entries and audit trail in the same state
// write. Pause and cancel are two-phase: a request sets pausing/cancelling, the engine notices at
// its next checkpoint (between chunks), commits what it read, and the job becomes paused/cancelled.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "base/status.hpp"
#include "pipeline/engine.hpp"
#include "state/cursors.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"

namespace atfill::pipeline {

struct JobOptions {
  // Keep a per-batch audit trail (positions, count, failures, duration, attempts): what the
  // dashboard draws the job's rate from. One small state entry per batch, the newest
  // state::JobStoreOptions::max_audit_batches kept, so it is on by default.
  bool record_batches = true;
  // Stop the job when its error log holds this many entries (the error log's cap) and a batch
  // brings an error (not only outcomes, state::IsOutcomeKind).
  bool stop_at_error_cap = true;
  // Called with the job each time the runner publishes it (when it starts, after each committed
  // batch with that batch's report, and when it ends with `batch` null), in that order, on the
  // thread that published it. For watchers (the admin API's stage history, metrics); must not
  // block for long.
  std::function<void(const state::JobRecord& job, const BatchReport* batch)> on_change;
  // Where the runner says what a user must know at once: a sink that refuses writes (a full disk,
  // a database restart) and, when it takes them again, that it does. One line, no newline, naming
  // its speaker ("atfill: job 3: ..."). Unset: standard error.
  std::function<void(std::string_view line)> log;
  Status Validate() const;
};

// Derived figures for people and scripts.
struct JobProgress {
  double percent = -1;       // 0..100; -1 when the total is unknown
  double records_per_s = 0;  // records written per second of running time
  double events_per_s = 0;   // input events per second of running time
  int64_t eta_s = -1;        // seconds left; -1 when unknown
};

// `done` and `total` are in any unit the job measures its input by (bytes, repos...).
JobProgress DeriveProgress(const state::JobRecord& job, uint64_t done, uint64_t total,
                           int64_t now_us);
// The same from the job's own counters: extra["input_done"] of extra["input_total"].
JobProgress DeriveProgress(const state::JobRecord& job, int64_t now_us);

// Counter names for the input measure.
inline constexpr const char* kInputDone = "input_done";
inline constexpr const char* kInputTotal = "input_total";

// Chunk counters with these names move JobCounters' fixed work-unit fields instead of `extra`
// (a source whose work comes in units, the crawl, reports them; docs/admin.md "Job JSON"): units
// discovered (total_repos), whose DID resolution ended (resolved_repos) and that left the queue
// (processed_repos).
inline constexpr const char* kTotalRepos = "total_repos";
inline constexpr const char* kResolvedRepos = "resolved_repos";
inline constexpr const char* kProcessedRepos = "processed_repos";

// What a stop request asks for.
enum class StopKind : uint8_t { kNone, kPause, kCancel };

class JobRunner : public Committer {
 public:
  // The state objects must outlive the runner. `cursor_name` names the job's resume cursor.
  JobRunner(state::KvStore* kv, state::JobStore* jobs, state::ErrorLog* errors,
            state::JobRecord job, std::string cursor_name, JobOptions options,
            std::function<int64_t()> now_us = nullptr);

  // Runs the engine from the job's saved cursor to the end of input, a stop, or a failure, and
  // records the outcome in the job (completed, paused, cancelled or failed with the reason). The
  // returned record is the final one. A failure of the run is in the record, not the Status; the
  // Status is an error only when the job itself could not be read or written.
  Result<state::JobRecord> Run(Engine* engine);

  // Thread-safe: asks the run to stop at its next checkpoint. The job shows pausing/cancelling
  // from the next commit on.
  void RequestStop(StopKind kind);

  // Thread-safe copy of the job as of the last commit.
  state::JobRecord Snapshot() const;

  // Committer
  Status PrepareCommit(const BatchReport& report, state::WriteBatch* batch) override;
  void OnCommitted(const BatchReport& report) override;
  bool StopRequested() const override;
  // Shows the wait in the job (state::JobRecord::waiting) and says it through options.log: at the
  // first failed attempt, then at every fourth one and at least once a minute.
  void OnSinkRetry(const SinkRetry& retry) override;

 private:
  Status Save(state::JobRecord record);
  void Log(const std::string& line) const;

  state::KvStore* kv_;
  state::JobStore* jobs_;
  state::ErrorLog* errors_;
  state::Cursors cursors_;
  std::string cursor_name_;
  JobOptions options_;
  std::function<int64_t()> now_us_;

  // Owned by the commit path (one batch at a time); published to snapshot_ after each commit.
  state::JobRecord job_;
  state::JobRecord pending_;
  std::string committed_cursor_;
  std::atomic<StopKind> stop_{StopKind::kNone};
  std::atomic<bool> error_cap_hit_{false};
  // Owned by the commit path: when the current sink wait was last said (0: not waiting).
  int64_t wait_said_us_ = 0;
  mutable std::mutex snapshot_mu_;
  state::JobRecord snapshot_;
};

}  // namespace atfill::pipeline
