#include "pipeline/job.hpp"

#include <algorithm>
#include <cstdio>
#include <variant>
#include <vector>

namespace atfill::pipeline {

Status JobOptions::Validate() const { return Status::OK(); }

JobProgress DeriveProgress(const state::JobRecord& job, uint64_t done, uint64_t total,
                           int64_t now_us) {
  JobProgress p;
  const int64_t end = job.finished_us != 0 ? job.finished_us : now_us;
  const double seconds = job.started_us != 0 && end > job.started_us
                             ? static_cast<double>(end - job.started_us) / 1e6
                             : 0.0;
  if (seconds > 0) {
    p.records_per_s = static_cast<double>(job.counters.records_written) / seconds;
    p.events_per_s = static_cast<double>(job.counters.events_read) / seconds;
  }
  if (job.status == state::JobStatus::kCompleted) {
    p.percent = 100;
    p.eta_s = 0;
  } else if (total > 0) {
    p.percent = std::min(100.0, 100.0 * static_cast<double>(done) / static_cast<double>(total));
    if (done > 0 && seconds > 0 && done < total) {
      p.eta_s = static_cast<int64_t>(seconds * static_cast<double>(total - done) /
                                     static_cast<double>(done));
    }
  }
  return p;
}

JobProgress DeriveProgress(const state::JobRecord& job, int64_t now_us) {
  auto get = [&job](const char* k) {
    auto it = job.counters.extra.find(k);
    return it == job.counters.extra.end() ? uint64_t{0} : it->second;
  };
  return DeriveProgress(job, get(kInputDone), get(kInputTotal), now_us);
}

JobRunner::JobRunner(state::KvStore* kv, state::JobStore* jobs, state::ErrorLog* errors,
                     state::JobRecord job, std::string cursor_name, JobOptions options,
                     std::function<int64_t()> now_us)
    : kv_(kv),
      jobs_(jobs),
      errors_(errors),
      cursors_(*kv),
      cursor_name_(std::move(cursor_name)),
      options_(options),
      now_us_(now_us ? std::move(now_us) : std::function<int64_t()>(NowMicros)),
      job_(std::move(job)),
      snapshot_(job_) {}

Status JobRunner::Save(state::JobRecord record) {
  if (options_.on_change) options_.on_change(record, nullptr);
  state::WriteBatch batch;
  ATFILL_RETURN_IF_ERROR(jobs_->Put(&batch, record));
  ATFILL_RETURN_IF_ERROR(kv_->Write(batch));
  job_ = record;
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  snapshot_ = std::move(record);
  return Status::OK();
}

Result<state::JobRecord> JobRunner::Run(Engine* engine) {
  const int64_t start = now_us_();
  job_.status = state::JobStatus::kRunning;
  job_.stop_reason = {};
  job_.finished_us = 0;
  if (job_.started_us == 0) job_.started_us = start;
  // No unit is between its resolution and the end of its fetch when a run starts: the units a
  // stopped run had resolved but not finished are resolved again by this one.
  job_.counters.resolved_repos =
      std::min(job_.counters.resolved_repos, job_.counters.processed_repos);
  job_.updated_us = job_.heartbeat_us = start;
  ATFILL_RETURN_IF_ERROR(Save(job_));

  ATFILL_ASSIGN_OR_RETURN(auto cursor, cursors_.Get(cursor_name_));
  committed_cursor_ = cursor.value_or("");
  auto result = engine->Run(committed_cursor_);

  state::JobRecord done = job_;
  const int64_t now = now_us_();
  done.updated_us = done.heartbeat_us = now;
  // The run is over, and with it any wait for the sink.
  done.waiting = {};
  done.waiting_since_us = 0;
  if (!result.ok()) {
    done.status = state::JobStatus::kFailed;
    done.stage = state::JobStage::kFailed;
    done.stop_reason = {"run_failed", result.status().ToString()};
  } else if (error_cap_hit_.load()) {
    done.status = state::JobStatus::kFailed;
    done.stage = state::JobStage::kFailed;
    done.stop_reason = {"error_cap", "the job's error log is full (" +
                                         std::to_string(errors_->options().max_entries_per_job) +
                                         " entries); fix the input or raise the cap, then resume"};
  } else if (result->stopped && stop_.load() == StopKind::kCancel) {
    done.status = state::JobStatus::kCancelled;
    done.stage = state::JobStage::kCancelled;
    done.stop_reason = {"cancelled", "cancelled on request"};
  } else if (result->stopped) {
    done.status = state::JobStatus::kPaused;
    done.stop_reason = {"paused", "paused on request; resume continues from the saved cursor"};
  } else if (!result->unfinished.empty()) {
    done.status = state::JobStatus::kPaused;
    done.stop_reason = result->unfinished;
  } else {
    done.status = state::JobStatus::kCompleted;
    done.stage = state::JobStage::kCompleted;
  }
  if (state::IsTerminal(done.status)) done.finished_us = now;
  ATFILL_RETURN_IF_ERROR(Save(done));
  return done;
}

void JobRunner::RequestStop(StopKind kind) {
  StopKind expected = StopKind::kNone;
  // A cancel overrides a pending pause; a pause never downgrades a cancel.
  if (!stop_.compare_exchange_strong(expected, kind) && kind == StopKind::kCancel) {
    stop_.store(StopKind::kCancel);
  }
}

bool JobRunner::StopRequested() const {
  return stop_.load() != StopKind::kNone || error_cap_hit_.load();
}

state::JobRecord JobRunner::Snapshot() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  return snapshot_;
}

Status JobRunner::PrepareCommit(const BatchReport& report, state::WriteBatch* batch) {
  const PendingBatch& b = *report.batch;
  pending_ = job_;
  pending_.waiting = {};
  pending_.waiting_since_us = 0;
  state::JobCounters& c = pending_.counters;
  std::vector<state::NewError> errors;
  const int64_t now = now_us_();
  uint64_t refused = 0;
  for (const auto& chunk : b.chunks) {
    c.events_read += chunk->units_read;
    c.bytes += chunk->bytes_read;
    refused += chunk->refused;
    if (chunk->input_done != 0) c.extra[kInputDone] = chunk->input_done;
    for (const auto& [name, delta] : chunk->counters) {
      uint64_t* field = name == kTotalRepos       ? &c.total_repos
                        : name == kResolvedRepos  ? &c.resolved_repos
                        : name == kProcessedRepos ? &c.processed_repos
                                                  : &c.extra[name];
      *field = static_cast<uint64_t>(static_cast<int64_t>(*field) + delta);
    }
    if (chunk->stage) pending_.stage = *chunk->stage;
    for (const auto& e : chunk->errors) errors.push_back({e.kind, e.key, e.message, now});
  }
  uint64_t records = 0;
  for (const auto& e : b.events) records += std::holds_alternative<RecordEvent>(e) ? 1 : 0;
  c.total_records += records;
  c.records_written += report.stats.records_written();
  // What the network reported of its accounts is logged with the errors but is none.
  const auto failed = std::count_if(errors.begin(), errors.end(), [](const state::NewError& e) {
    return !state::IsOutcomeKind(e.kind);
  });
  c.failed_records += failed;
  auto bump = [&](const char* name, uint64_t n) {
    if (n != 0) c.extra[name] += n;
  };
  bump("refused", refused);
  bump("unchanged", report.stats.unchanged);
  bump("stale", report.stats.stale);
  bump("deleted", report.stats.deleted);
  bump("purged_records", report.stats.purged_records);
  bump("resyncs", report.stats.resyncs);
  bump("resynced_records", report.stats.resynced_records);

  for (const auto& chunk : b.chunks) {
    for (const auto& r : chunk->resolved_errors) {
      ATFILL_RETURN_IF_ERROR(errors_->ResolveIfStored(pending_.id, r.kind, r.key, batch).status());
    }
  }
  if (!errors.empty()) {
    // Into the same state write as the cursor: a replay after a crash re-reads these lines, and
    // their errors must not be counted twice.
    ATFILL_ASSIGN_OR_RETURN(auto appended, errors_->AppendAll(pending_.id, errors, batch));
    // A log filled by outcomes alone does not stop the job: they stay counted past the cap.
    if (appended.cap_reached && failed > 0 && options_.stop_at_error_cap) {
      error_cap_hit_.store(true);
    }
  }
  // The newest position in the batch; chunks without one (ticks, frames that carry no seq) keep
  // the cursor where it was.
  const std::string* newest = nullptr;
  for (const auto& chunk : b.chunks) {
    if (!chunk->resume_cursor.empty()) newest = &chunk->resume_cursor;
  }
  if (newest != nullptr) cursors_.Set(batch, cursor_name_, *newest);

  switch (stop_.load()) {
    case StopKind::kPause:
      pending_.status = state::JobStatus::kPausing;
      break;
    case StopKind::kCancel:
      pending_.status = state::JobStatus::kCancelling;
      break;
    case StopKind::kNone:
      break;
  }
  pending_.updated_us = pending_.heartbeat_us = now;
  if (options_.record_batches) {
    state::BatchAudit audit;
    audit.batch_no = report.batch_no;
    // Positions are the source's cursors: where the batch started and where it ended.
    audit.first_position = committed_cursor_;
    audit.last_position = b.chunks.empty() ? committed_cursor_ : b.chunks.back()->resume_cursor;
    audit.count = b.events.size();
    audit.failures = errors.size();
    audit.duration_us = report.write_us;
    audit.attempts = report.attempts;
    audit.committed_at_us = now;
    ATFILL_RETURN_IF_ERROR(jobs_->PutBatchAudit(batch, pending_.id, audit));
  }
  if (options_.on_change) options_.on_change(pending_, &report);
  return jobs_->Put(batch, pending_);
}

void JobRunner::Log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

void JobRunner::OnSinkRetry(const SinkRetry& retry) {
  const int64_t now = now_us_();
  char next[32];
  std::snprintf(next, sizeof(next), "%.1f s", static_cast<double>(retry.retry_in_ms) / 1000);
  job_.waiting = {"sink_unavailable",
                  "the sink refuses batch " + std::to_string(retry.batch_no) + " (" +
                      retry.error.message() + "); " + std::to_string(retry.attempts) +
                      " attempt(s), the next in " + next +
                      "; nothing is skipped, and the job goes on when the sink takes it"};
  job_.waiting_since_us = retry.since_us;
  job_.counters.extra["sink_retries"] += 1;
  // Said at once, then now and then while it lasts, not at every attempt: the waits double up to
  // the retry's maximum, and a log a line per attempt would bury everything else.
  const bool say = wait_said_us_ == 0 || retry.attempts % 4 == 0 || now - wait_said_us_ >= 60000000;
  if (say) {
    wait_said_us_ = now;
    Log("atfill: job " + std::to_string(job_.id) + ": " + job_.waiting.sentence);
  }
  if (options_.on_change) options_.on_change(job_, nullptr);
  {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    snapshot_ = job_;
  }
  if (say) {
    // So that `atfill job` and `atfill jobs` in another process see the wait too. Best effort:
    // the state may sit on the file system that is full, and then this write fails like the
    // sink's; the next commit writes the job anyway.
    state::WriteBatch batch;
    if (jobs_->Put(&batch, job_).ok()) static_cast<void>(kv_->Write(batch));
  }
}

void JobRunner::OnCommitted(const BatchReport& report) {
  if (wait_said_us_ != 0) {
    wait_said_us_ = 0;
    Log("atfill: job " + std::to_string(job_.id) + ": the sink took batch " +
        std::to_string(report.batch_no) + " after " + std::to_string(report.attempts) +
        " attempt(s); the job goes on");
  }
  job_ = pending_;
  for (const auto& chunk : report.batch->chunks) {
    if (!chunk->resume_cursor.empty()) committed_cursor_ = chunk->resume_cursor;
  }
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  snapshot_ = job_;
}

}  // namespace atfill::pipeline
