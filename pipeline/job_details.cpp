#include "pipeline/job_details.hpp"

#include "pipeline/engine.hpp"
#include "state/failed_blocks.hpp"
#include "state/work_queue.hpp"

#include <ctime>

namespace atfill::pipeline {

std::string FormatUtc(int64_t unix_us) {
  if (unix_us <= 0) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_us / 1'000'000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Result<JobDetails> JobDetailsReader::Get(uint64_t id) {
  JobDetails d;
  ATFILL_ASSIGN_OR_RETURN(d.job, jobs_->Get(id));
  ATFILL_ASSIGN_OR_RETURN(d.queued_units, QueuedUnits(id));
  state::CrawlLog log(*kv_);
  ATFILL_ASSIGN_OR_RETURN(d.hosts, log.Hosts(id));
  ATFILL_ASSIGN_OR_RETURN(d.recent, log.Recent(id));
  ATFILL_ASSIGN_OR_RETURN(d.failed_blocks, state::FailedBlocks(*kv_).Count(id));
  ATFILL_ASSIGN_OR_RETURN(d.errors_by_kind, errors_->CountsByKind(id));
  return d;
}

Result<uint64_t> JobDetailsReader::QueuedUnits(uint64_t id) {
  return state::WorkQueue(*kv_).Count(id);
}

Status JobDetailsReader::ClearJob(state::JobRecord job) {
  ATFILL_RETURN_IF_ERROR(state::WorkQueue(*kv_).Clear(job.id));
  ATFILL_RETURN_IF_ERROR(state::CrawlLog(*kv_).ClearRecent(job.id).status());
  job.params[kDetailsCleared] = FormatUtc(NowMicros());
  state::WriteBatch batch;
  ATFILL_RETURN_IF_ERROR(jobs_->Put(&batch, job));
  return kv_->Write(batch);
}

Status JobDetailsReader::Clear(uint64_t id) {
  ATFILL_ASSIGN_OR_RETURN(auto job, jobs_->Get(id));
  if (!state::IsTerminal(job.status)) {
    return Status::Unsupported("job " + std::to_string(id) + " is " +
                               std::string(state::JobStatusName(job.status)) +
                               "; only a finished job's details can be cleared");
  }
  return ClearJob(std::move(job));
}

Result<uint64_t> JobDetailsReader::ClearAll() {
  ATFILL_ASSIGN_OR_RETURN(auto jobs, jobs_->List());
  uint64_t n = 0;
  for (auto& j : jobs) {
    if (!state::IsTerminal(j.status)) continue;
    ATFILL_RETURN_IF_ERROR(ClearJob(std::move(j)));
    ++n;
  }
  return n;
}

Result<uint64_t> JobDetailsReader::ClearBackfillsFinishedBefore(double days, int64_t now_us) {
  if (days <= 0) return uint64_t{0};
  const int64_t before = now_us - static_cast<int64_t>(days * 86'400'000'000.0);
  ATFILL_ASSIGN_OR_RETURN(auto jobs, jobs_->List());
  uint64_t cleared = 0;
  for (auto& j : jobs) {
    if (j.kind != "backfill" || !state::IsTerminal(j.status)) continue;
    if (j.finished_us == 0 || j.finished_us >= before || j.params.count(kDetailsCleared)) continue;
    ATFILL_RETURN_IF_ERROR(ClearJob(std::move(j)));
    ++cleared;
  }
  return cleared;
}

}  // namespace atfill::pipeline
