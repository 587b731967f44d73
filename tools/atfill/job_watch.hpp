// What this process knows of the jobs it runs, beyond the state store: each job's stage
// transitions since the process started, the runners of the jobs running now (to pause or cancel
// them at once), and the metrics fed from every committed batch. One per process.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "pipeline/job.hpp"
#include "tools/atfill/admin/admin_backend.hpp"
#include "tools/atfill/admin/metrics.hpp"

namespace atfill::cli {

class JobWatch {
 public:
  static JobWatch& Get();

  // Metrics to feed from now on (nullptr: none); not owned, must outlive its use.
  void SetMetrics(admin::Metrics* metrics);

  // pipeline::JobOptions::on_change: records a stage transition (before the record is stored, so
  // none is missed by a reader of the store) and feeds the metrics with the batch.
  void Changed(const state::JobRecord& job, const pipeline::BatchReport* batch);

  // The job's transitions with index >= since.
  std::vector<admin::StageChange> StageChanges(uint64_t id, uint64_t since);

  // A job this process is about to run (its thread starts): counts as running from now on, and a
  // stop asked for before its runner exists is handed to the runner when it attaches.
  void Starting(uint64_t id);
  // The runner of a job while it runs in this process.
  void Attach(uint64_t id, pipeline::JobRunner* runner);
  void Detach(uint64_t id);
  // Asks the job's runner to stop; false when the job does not run in this process.
  bool RequestStop(uint64_t id, pipeline::StopKind kind);
  bool Running(uint64_t id);

 private:
  struct Entry {
    bool seen = false;
    state::JobStage stage = state::JobStage::kPending;
    state::JobCounters counters;
    std::vector<admin::StageChange> changes;
    pipeline::JobRunner* runner = nullptr;
    bool starting = false;
    pipeline::StopKind pending_stop = pipeline::StopKind::kNone;
  };
  std::mutex mu_;
  std::map<uint64_t, Entry> jobs_;
  admin::Metrics* metrics_ = nullptr;
};

}  // namespace atfill::cli
