// Running jobs for the launcher's verbs: this process's job controller (pipeline/job_controller)
// with the launcher's job kinds, Ctrl-C as a pause request, and the progress view and closing
// summary of a job run in the foreground.
#pragma once

#include <cstdint>
#include <string>

#include "pipeline/job_controller.hpp"
#include "state/job_store.hpp"
#include "tools/atfill/app_config.hpp"

namespace atfill::cli {

// From here on, the first SIGINT/SIGTERM asks the running jobs to pause at their next checkpoint
// and a second one exits at once, as does the first when 4 s later the process is still there
// (SIGALRM). RestoreSignals puts the defaults back.
void CatchStopSignals();
void RestoreSignals();
// A SIGINT/SIGTERM arrived since CatchStopSignals.
bool StopSignalled();

// The job controller of `st` (made at the first call, with the library's job kinds, request files
// and Ctrl-C); `config` and `st` must outlive it (it is released with `st`).
pipeline::JobController& ControllerOf(const AppConfig& config, OpenedState& st);

// Runs `job` in the foreground to its end (completed, paused, cancelled or failed) with the
// progress view, prints the summary and returns the verb's exit code: 0 completed, 1 completed
// with unresolved errors in its log (some input was refused, the rest processed) or failed, 2 the
// job cannot run with this config, 3 state or database unavailable, 4 paused/cancelled. `stop`
// receives why it stopped.
int RunInForeground(const char* verb, const AppConfig& config, OpenedState& st,
                    state::JobRecord job, const pipeline::JobContext& ctx = {},
                    state::StopReason* stop = nullptr);

// RunInForeground's run and summary, returning the outcome (for a pipeline::JobGroup's jobs).
Result<pipeline::JobOutcome> RunAndReport(const char* verb, const AppConfig& config,
                                          OpenedState& st, state::JobRecord job,
                                          const pipeline::JobContext& ctx = {});

// The exit code of a job's outcome (as RunInForeground returns it), without printing.
int ExitCodeOf(const Result<pipeline::JobOutcome>& outcome);

}  // namespace atfill::cli
