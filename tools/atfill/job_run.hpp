// Running one job in the foreground for the launcher's verbs: the progress view, Ctrl-C and
// request files (pause/cancel from another atfill) as stop requests, and the closing summary.
#pragma once

#include <optional>

#include <cstdint>
#include <string>
#include <vector>

#include "pipeline/engine.hpp"
#include "pipeline/plan.hpp"
#include "pipeline/source.hpp"
#include "pipeline/transform.hpp"
#include "state/job_store.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/state_access.hpp"

namespace atfill::cli {

// From here on, the first SIGINT/SIGTERM asks the running job to pause at its next checkpoint
// and a second one exits at once, as does the first when 4 s later the process is still there
// (SIGALRM). RestoreSignals puts the defaults back.
void CatchStopSignals();
void RestoreSignals();
// A SIGINT/SIGTERM arrived since CatchStopSignals.
bool StopSignalled();

struct ForegroundJob {
  const char* verb = "";  // names the verb in messages ("ingest", "backfill")
  const AppConfig* config = nullptr;
  OpenedState* state = nullptr;
  state::JobRecord job;
  pipeline::Source* source = nullptr;
  // The job's stages; RunInForeground adds the shard filter (--shard) and the record scripts
  // ([scripts]) itself, in their slots of the standard order.
  pipeline::StandardStages stages;
  pipeline::Sink* sink = nullptr;
  std::string cursor_name;
  // Words for the summary: what the job reads ("events", "records fetched").
  const char* read_noun = "events read";
  bool dry_run = false;
  // Replaces [engine]'s batch limits for this job (the live consumer has its own).
  std::optional<pipeline::BatcherOptions> batch;
  // Out: why the job stopped (empty when it completed or failed to run).
  state::StopReason stop_reason;
};

// Runs the job to its end (completed, paused, cancelled or failed), prints the summary and
// returns the verb's exit code: 0 completed, 1 completed with unresolved errors in its log (some
// input was refused, the rest processed) or failed, 3 state unavailable, 4 paused/cancelled.
int RunInForeground(ForegroundJob& spec);

// Whether job `job`'s error log holds an error no later attempt resolved (or more than it could
// store).
Result<bool> HasUnresolvedErrors(state::ErrorLog& errors, uint64_t job);

}  // namespace atfill::cli
