// The stages' part of the component registry (pipeline/components.hpp): [stages], [scripts] and
// [live] account_check_timeout_ms into StageSettings, and a factory for each standard stage:
// CID verification, the record scripts, the account check (when the job's source offers a way to
// ask PDSs), the live hold and the ingest guard (the live consumer's), in the standard order.
#pragma once

#include "pipeline/components.hpp"
#include "stages/account_check.hpp"
#include "stages/script/script.hpp"

namespace atfill::stages {

struct StageSettings {
  bool verify_cids = true;  // [stages] verify_cids
  // [scripts] fail_open, instruction_budget, memory_mb, attempts, call_timeout_ms, and
  // [scripts.collections] (collection = "script.lua"); read_record is bound to the configured
  // sink when a job is planned.
  ScriptOptions scripts;
  AccountCheckOptions account_check;  // [live] account_check_timeout_ms
};

void Register(pipeline::Components& components);

}  // namespace atfill::stages
