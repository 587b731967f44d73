#include "pipeline/run.hpp"

namespace atfill::pipeline {

Result<state::JobRecord> FindOrCreateJob(state::JobStore* jobs, const state::JobRecord& prototype,
                                         const std::vector<std::string>& match, bool* resumed) {
  ATFILL_ASSIGN_OR_RETURN(auto all, jobs->List());
  for (const auto& j : all) {
    if (j.kind != prototype.kind || j.status == state::JobStatus::kCompleted ||
        j.status == state::JobStatus::kCancelled) {
      continue;
    }
    bool same = true;
    for (const auto& key : match) {
      auto a = j.params.find(key);
      auto b = prototype.params.find(key);
      same &= (a == j.params.end()) == (b == prototype.params.end()) &&
              (a == j.params.end() || a->second == b->second);
    }
    if (same) {
      *resumed = true;
      return j;
    }
  }
  *resumed = false;
  return jobs->Create(prototype);
}

Status RunOptions::Validate() const {
  ATFILL_RETURN_IF_ERROR(engine.Validate());
  ATFILL_RETURN_IF_ERROR(job.Validate());
  ATFILL_RETURN_IF_ERROR(error_log.Validate());
  if (job_name.empty()) return Status::Invalid("job_name must not be empty");
  return Status::OK();
}

Result<state::JobRecord> RunAsJob(Source* source, const std::vector<const Transform*>& transforms,
                                  Sink* sink, state::KvStore* kv, const RunOptions& options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  state::JobStore jobs(*kv);
  state::ErrorLog errors(*kv, options.error_log);
  state::JobRecord prototype;
  prototype.kind = "embedded";
  prototype.stage = state::JobStage::kReplaying;
  prototype.created_us = NowMicros();
  prototype.started_by = options.started_by;
  prototype.params = {{"name", options.job_name},
                      {"source", source->Describe()},
                      {"sink", std::string(sink->name())}};
  bool resumed = false;
  ATFILL_ASSIGN_OR_RETURN(auto job, FindOrCreateJob(&jobs, prototype, {"name"}, &resumed));
  JobRunner runner(kv, &jobs, &errors, job, "job/" + std::to_string(job.id) + "/cursor",
                   options.job);
  Engine engine(options.engine, source, transforms, sink, kv, &runner);
  return runner.Run(&engine);
}

}  // namespace atfill::pipeline
