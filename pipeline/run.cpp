#include "pipeline/run.hpp"

namespace atfill::pipeline {

state::JobRecord NewJobRecord(std::string kind, state::JobStage stage, std::string started_by,
                              int64_t created_us) {
  state::JobRecord job;
  job.kind = std::move(kind);
  job.stage = stage;
  job.created_us = created_us;
  job.started_by = std::move(started_by);
  return job;
}

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

namespace {

Result<state::JobRecord> RunJob(Source* source, const SourceFactory* make_source,
                                std::string_view kind,
                                const std::vector<const Transform*>& transforms, Sink* sink,
                                state::KvStore* kv, const RunOptions& options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  state::JobStore jobs(*kv);
  state::ErrorLog errors(*kv, options.error_log);
  state::JobRecord prototype;
  prototype.kind = std::string(kind);
  prototype.stage =
      make_source != nullptr ? state::JobStage::kPending : state::JobStage::kReplaying;
  prototype.created_us = NowMicros();
  prototype.started_by = options.started_by;
  prototype.params = {{"name", options.job_name}, {"sink", std::string(sink->name())}};
  if (source != nullptr) prototype.params["source"] = source->Describe();
  bool resumed = false;
  ATFILL_ASSIGN_OR_RETURN(auto job, FindOrCreateJob(&jobs, prototype, {"name"}, &resumed));
  std::unique_ptr<Source> made;
  if (make_source != nullptr) {
    ATFILL_ASSIGN_OR_RETURN(made, (*make_source)(job));
    source = made.get();
  }
  JobRunner runner(kv, &jobs, &errors, job, "job/" + std::to_string(job.id) + "/cursor",
                   options.job);
  Engine engine(options.engine, source, transforms, sink, kv, &runner);
  return runner.Run(&engine);
}

}  // namespace

Result<state::JobRecord> RunAsJob(Source* source, const std::vector<const Transform*>& transforms,
                                  Sink* sink, state::KvStore* kv, const RunOptions& options) {
  return RunJob(source, nullptr, "embedded", transforms, sink, kv, options);
}

Result<state::JobRecord> RunAsJob(const SourceFactory& make_source, std::string_view kind,
                                  const std::vector<const Transform*>& transforms, Sink* sink,
                                  state::KvStore* kv, const RunOptions& options) {
  return RunJob(nullptr, &make_source, kind, transforms, sink, kv, options);
}

}  // namespace atfill::pipeline
