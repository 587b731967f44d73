// The short way to run a graph as a resumable job, for programs that embed atfill.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"

namespace atfill::pipeline {

// A job record to create (or to match with FindOrCreateJob): its kind, first stage, who starts it
// ("cli", "api"...) and when.
state::JobRecord NewJobRecord(std::string kind, state::JobStage stage, std::string started_by,
                              int64_t created_us = NowMicros());

// The unfinished job (not completed, not cancelled) of `prototype.kind` whose params named in
// `match` equal the prototype's, newest first; otherwise a new job made from the prototype.
// `*resumed` says which.
Result<state::JobRecord> FindOrCreateJob(state::JobStore* jobs, const state::JobRecord& prototype,
                                         const std::vector<std::string>& match, bool* resumed);

struct RunOptions {
  EngineOptions engine;
  JobOptions job;
  state::ErrorLogOptions error_log;
  // Identifies the job across runs: the same name resumes the same unfinished job.
  std::string job_name = "embedded";
  std::string started_by = "library";
  Status Validate() const;
};

// Runs `source` through `transforms` into `sink` as the job named options.job_name, recorded in
// `kv` with its cursor, counters and error log; a later call with the same name resumes it. Returns
// the job as it ended (completed, or failed with the reason).
Result<state::JobRecord> RunAsJob(Source* source, const std::vector<const Transform*>& transforms,
                                  Sink* sink, state::KvStore* kv, const RunOptions& options);

// The same for a source that keeps state of its own per job (the crawl's queue and cursors): it
// is made once the job is found or created. `kind` names the job's kind ("backfill"...).
using SourceFactory = std::function<Result<std::unique_ptr<Source>>(const state::JobRecord& job)>;
Result<state::JobRecord> RunAsJob(const SourceFactory& make_source, std::string_view kind,
                                  const std::vector<const Transform*>& transforms, Sink* sink,
                                  state::KvStore* kv, const RunOptions& options);

}  // namespace atfill::pipeline
