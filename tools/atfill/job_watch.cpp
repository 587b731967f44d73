#include "tools/atfill/job_watch.hpp"

namespace atfill::cli {

JobWatch& JobWatch::Get() {
  static JobWatch watch;
  return watch;
}

void JobWatch::SetMetrics(admin::Metrics* metrics) {
  std::lock_guard lock(mu_);
  metrics_ = metrics;
}

void JobWatch::Changed(const state::JobRecord& job, const pipeline::BatchReport* batch) {
  std::lock_guard lock(mu_);
  Entry& e = jobs_[job.id];
  // The first sight of a job in this process counts as its move out of "pending" (a resumed job
  // shows the stage it resumes in).
  if (!e.seen || e.stage != job.stage) {
    const state::JobStage from = e.seen ? e.stage : state::JobStage::kPending;
    e.changes.push_back({e.changes.size(), from, job.stage, pipeline::NowMicros()});
    e.stage = job.stage;
  }
  if (metrics_ != nullptr) {
    if (e.seen) metrics_->AddJobCounters(e.counters, job.counters);
    if (batch != nullptr) {
      metrics_->ObserveSinkBatch(static_cast<double>(batch->write_us) / 1e6);
      for (const auto& chunk : batch->batch->chunks) {
        for (const auto& error : chunk->errors) metrics_->AddErrors(error.kind);
      }
    }
  }
  e.seen = true;
  e.counters = job.counters;
}

std::vector<admin::StageChange> JobWatch::StageChanges(uint64_t id, uint64_t since) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end() || since >= it->second.changes.size()) return {};
  return {it->second.changes.begin() + static_cast<std::ptrdiff_t>(since),
          it->second.changes.end()};
}

void JobWatch::Starting(uint64_t id) {
  std::lock_guard lock(mu_);
  Entry& e = jobs_[id];
  e.starting = true;
  e.pending_stop = pipeline::StopKind::kNone;
}

void JobWatch::Attach(uint64_t id, pipeline::JobRunner* runner) {
  std::lock_guard lock(mu_);
  Entry& e = jobs_[id];
  e.runner = runner;
  e.starting = false;
  if (e.pending_stop != pipeline::StopKind::kNone) runner->RequestStop(e.pending_stop);
  e.pending_stop = pipeline::StopKind::kNone;
}

void JobWatch::Detach(uint64_t id) {
  std::lock_guard lock(mu_);
  Entry& e = jobs_[id];
  e.runner = nullptr;
  e.starting = false;
}

bool JobWatch::RequestStop(uint64_t id, pipeline::StopKind kind) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return false;
  Entry& e = it->second;
  if (e.runner != nullptr) {
    e.runner->RequestStop(kind);
    return true;
  }
  if (!e.starting) return false;
  // A cancel outranks a pause asked for earlier.
  if (e.pending_stop != pipeline::StopKind::kCancel) e.pending_stop = kind;
  return true;
}

bool JobWatch::Running(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  return it != jobs_.end() && (it->second.runner != nullptr || it->second.starting);
}

}  // namespace atfill::cli
