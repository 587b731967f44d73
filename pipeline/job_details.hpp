// What a program shows of its jobs beyond their records (an admin API, `atfill job`), read from
// the state: the work left in a job's queue, a crawl's per-host summary and most recent repos, a
// replay's failed blocks, the error log by kind; and the clearing of those details once a job has
// finished (on request, or by the retention of finished backfills).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "state/crawl_log.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"

namespace atfill::pipeline {

struct JobDetails {
  state::JobRecord job;
  uint64_t queued_units = 0;                       // units waiting in the job's work queue
  std::vector<state::HostSummary> hosts;           // per PDS, sorted by host
  std::vector<state::RecentRepo> recent;           // the most recently fetched repos, newest first
  uint64_t failed_blocks = 0;                      // archive blocks still failed (replays), else 0
  std::map<std::string, uint64_t> errors_by_kind;  // the job's error log, counted by kind
};

// "2026-01-02T03:04:05Z" (UTC, to the second); "-" for 0 or less.
std::string FormatUtc(int64_t unix_us);

// The parameter a job whose details were cleared carries (the time they were, FormatUtc).
inline constexpr const char* kDetailsCleared = "details_cleared";

class JobDetailsReader {
 public:
  // The stores must outlive the reader; thread-safe as they are.
  JobDetailsReader(state::KvStore* kv, state::JobStore* jobs, state::ErrorLog* errors)
      : kv_(kv), jobs_(jobs), errors_(errors) {}

  // NotFound when there is no job `id`.
  Result<JobDetails> Get(uint64_t id);
  // Units waiting in job `id`'s work queue.
  Result<uint64_t> QueuedUnits(uint64_t id);

  // Deletes a finished job's work queue and recent repos and marks it (kDetailsCleared);
  // Unsupported while it has not finished.
  Status Clear(uint64_t id);
  // Clear for every finished job; returns how many.
  Result<uint64_t> ClearAll();
  // Clear for the backfill jobs finished more than `days` before `now_us` that were not cleared
  // yet (the retention of finished backfills); returns how many. Nothing when days <= 0.
  Result<uint64_t> ClearBackfillsFinishedBefore(double days, int64_t now_us);

 private:
  Status ClearJob(state::JobRecord job);

  state::KvStore* kv_;
  state::JobStore* jobs_;
  state::ErrorLog* errors_;
};

}  // namespace atfill::pipeline
