// Periodic verify jobs ([verify] every_hours): `atfill run` (or a program embedding atfill)
// starts a verify job of the stored repos every so often, beside whatever else runs, each a job
// like any other (progress, counters and its error log in the job store; `atfill jobs` lists
// them with started_by "schedule").
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "base/status.hpp"
#include "pipeline/components.hpp"
#include "pipeline/job_controller.hpp"
#include "sources/verify/verify_source.hpp"

namespace atfill::sources {

struct VerifyScheduleOptions {
  // Hours between the end of one verify job and the start of the next; fractions allowed; 0 = no
  // periodic verify.
  double every_hours = 0;
  // What each job checks ([verify] repair, collections); dids stays empty: every stored repo.
  VerifyTargets targets;
};

class VerifySchedule {
 public:
  // Runs a job the caller's way (a launcher adds its progress view around JobController::Run).
  using RunFn = std::function<Result<pipeline::JobOutcome>(state::JobRecord job)>;

  // Does nothing until Start. `env` and what it points to must outlive the schedule.
  VerifySchedule(pipeline::Environment env, VerifyScheduleOptions options, RunFn run);
  // Stop().
  ~VerifySchedule();
  VerifySchedule(const VerifySchedule&) = delete;
  VerifySchedule& operator=(const VerifySchedule&) = delete;

  // Starts the thread (a no-op when every_hours is 0): the first job is due every_hours after the
  // newest verify job of the state ended (its heartbeat), or every_hours from now when there is
  // none, so a restart does not verify again at once; each next one every_hours after the last
  // ended. A job that cannot be created or run is logged (env.Log) and the schedule goes on.
  void Start();
  // Ends the thread: a wait is cut short; a job running is asked to pause through `stop_job`
  // (given its id; usually JobController::RequestStop) and waited for. Idempotent.
  void Stop(const std::function<void(uint64_t job_id)>& stop_job = nullptr);

  // Jobs run so far (whatever their outcome); thread-safe.
  uint64_t runs() const;

 private:
  void Loop();

  pipeline::Environment env_;
  VerifyScheduleOptions options_;
  RunFn run_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  uint64_t runs_ = 0;
  uint64_t running_id_ = 0;  // the job running now; 0 = none
  std::thread thread_;
};

}  // namespace atfill::sources
