// Showing jobs to people (tables, a live progress line) and to scripts (JSON).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "state/error_log.hpp"
#include "state/job_store.hpp"

namespace atfill::cli {

std::string FormatCount(uint64_t n);      // 1234567 -> "1,234,567"
std::string FormatDuration(int64_t s);    // 3725 -> "1:02:05"
std::string FormatTime(int64_t unix_us);  // ISO-8601 UTC, seconds
// One line: "job 3 ingest running/replaying 45.2% | 1,234 events | 1,200 written | 250k rec/s ...".
std::string ProgressLine(const state::JobRecord& job, int64_t now_us);
// A job as a JSON object (counters, derived progress, stop reason, params).
std::string JobJson(const state::JobRecord& job, int64_t now_us);

// Prints a job's progress while it runs, from its own thread: on a terminal a line redrawn twice
// a second, otherwise a plain log line every `interval_s`. Stop() prints the final line: of
// `last` when given (the finished job, which the snapshot may no longer know), else of a snapshot.
class ProgressReporter {
 public:
  using SnapshotFn = std::function<state::JobRecord()>;
  ProgressReporter(SnapshotFn snapshot, double interval_s, bool terminal);
  ~ProgressReporter();
  void Start();
  void Stop(const state::JobRecord* last = nullptr);

 private:
  void Loop();
  SnapshotFn snapshot_;
  double interval_s_;
  bool terminal_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::optional<state::JobRecord> last_;
};

}  // namespace atfill::cli
