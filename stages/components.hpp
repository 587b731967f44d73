// The stages' part of the component registry (pipeline/components.hpp): [stages], [scripts] and
// [live] account_check_timeout_ms into StageSettings, and a factory for each standard stage:
// CID verification, lexicon validation ([lexicons]), the record scripts, the account check (when
// the job's source offers a way to ask PDSs), the live hold and the ingest guard (the live
// consumer's), in the standard order.
#pragma once

#include "pipeline/components.hpp"
#include "stages/account_check.hpp"
#include "stages/lexicon_validate.hpp"
#include "stages/script/script.hpp"

namespace atfill::stages {

// [lexicons]: the lexicon documents records are checked against, and what a failure does.
struct LexiconSettings {
  std::vector<std::string> dirs;  // dirs: lexicon files or folders of them
  LexiconMode mode = LexiconMode::kReject;
  // use_network: the lexicons accounts publish (com.atproto.lexicon.schema records the jobs see)
  // validate records of their NSIDs too, unless dirs or the API give that NSID. Nothing checks
  // that a publisher owns the NSID (its DNS record): anyone's lexicon can then reject records.
  bool use_network = false;
  // Made from `dirs` when the config is read (each document checked then), with the documents
  // added at run time joining it; shared by every job of the process, so that a lexicon added
  // while they run reaches them all.
  std::shared_ptr<LexiconRegistry> registry;
};

struct StageSettings {
  bool verify_cids = true;  // [stages] verify_cids
  LexiconSettings lexicons;
  // [scripts] fail_open, instruction_budget, memory_mb, attempts, call_timeout_ms, and
  // [scripts.collections] (collection = "script.lua"); read_record is bound to the configured
  // sink when a job is planned.
  ScriptOptions scripts;
  AccountCheckOptions account_check;  // [live] account_check_timeout_ms
};

void Register(pipeline::Components& components);

}  // namespace atfill::stages
