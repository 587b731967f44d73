// The stages `atfill` plans for a job, for a bench that brings its own source and sink: made by the
// stage registry's own factories (stages::Register, through Components::PlanStages) with the
// default config, so that a bench measures the launcher's stages and write rules, not a copy of
// them that could drift.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.hpp"
#include "pipeline/components.hpp"
#include "stages/components.hpp"

namespace atfill::bench {

class PlannedStages {
 public:
  struct Inputs {
    std::string kind = {};  // the job kind: "ingest", "backfill" or "live"
    state::KvStore* kv = nullptr;
    state::Tombstones* tombstones = nullptr;
    state::JobStore* jobs = nullptr;     // the live consumer's guard reads the unfinished backfills
    pipeline::SinkReaders readers = {};  // the sink's (the live guard asks `holds`)
    // What a live source offers to confirm an account deletion (the account check stage).
    pipeline::AccountStatusLookup* account_status = nullptr;
  };

  static Result<std::unique_ptr<PlannedStages>> Make(Inputs in) {
    auto out = std::unique_ptr<PlannedStages>(new PlannedStages());
    stages::Register(out->components_);
    out->job_.kind = in.kind;
    pipeline::Environment env;
    env.components = &out->components_;
    env.settings = &out->settings_;
    env.kv = in.kv;
    env.jobs = in.jobs;
    env.tombstones = in.tombstones;
    pipeline::PlanDraft draft;
    draft.job = &out->job_;
    draft.ctx = &out->ctx_;
    draft.plan = &out->plan_;
    draft.readers = std::move(in.readers);
    draft.account_status = in.account_status;
    ATFILL_RETURN_IF_ERROR(out->components_.PlanStages(env, draft));
    return out;
  }

  std::vector<const pipeline::Transform*> InOrder() const { return plan_.stages.InOrder(); }
  const pipeline::StandardStages& stages() const { return plan_.stages; }

 private:
  PlannedStages() = default;

  pipeline::Components components_;
  pipeline::Settings settings_;
  state::JobRecord job_;
  pipeline::JobContext ctx_;
  pipeline::JobPlan plan_;
};

}  // namespace atfill::bench
