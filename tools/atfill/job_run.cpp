#include "tools/atfill/job_run.hpp"

#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <csignal>
#include <cstdio>

#include "tools/atfill/cli.hpp"
#include "tools/atfill/job_view.hpp"

namespace atfill::cli {
namespace {

std::atomic<int> g_interrupts{0};

// A pause waits for the chunks in flight, which a stage (a record script, a sink that hangs) can
// hold for long: past this long after the first interrupt the process leaves as on a second one.
// What was not committed is read again on resume, as after a crash.
constexpr unsigned kStopGraceSeconds = 4;

extern "C" void OnStopOverdue(int) {
  static const char kMessage[] =
      "atfill: the job did not pause within 4 s of the interrupt; exiting without the last "
      "commit (resume reads it again)\n";
  ssize_t written = write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
  static_cast<void>(written);
  _exit(130);
}

extern "C" void OnInterrupt(int) {
  // The first interrupt pauses the job at its next checkpoint; a second one leaves at once.
  if (g_interrupts.fetch_add(1) >= 1) _exit(130);
  alarm(kStopGraceSeconds);
}

// Words for the summary: what the job reads.
const char* ReadNoun(const state::JobRecord& job) {
  if (job.kind == "live") return "messages read";
  if (job.kind == "ingest") return "events read";
  if (job.kind == "verify") return "repos read";
  auto source = job.params.find("source");
  if (source != job.params.end() && source->second == "replay") return "archive blocks read";
  return "records fetched";
}

}  // namespace

void CatchStopSignals() {
  std::signal(SIGALRM, OnStopOverdue);
  std::signal(SIGINT, OnInterrupt);
  std::signal(SIGTERM, OnInterrupt);
}

bool StopSignalled() { return g_interrupts.load() > 0; }

void RestoreSignals() {
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  alarm(0);
  std::signal(SIGALRM, SIG_DFL);
}

pipeline::JobController& ControllerOf(const AppConfig& config, OpenedState& st) {
  return pipeline::MakeController(st, LauncherComponents(), config.settings,
                                  [] { return StopSignalled(); });
}

int ExitCodeOf(const Result<pipeline::JobOutcome>& outcome) {
  if (!outcome.ok()) {
    const StatusCode code = outcome.status().code();
    return code == StatusCode::kInvalid || code == StatusCode::kUnsupported ? kExitUsage : kExitIo;
  }
  switch (outcome->job.status) {
    case state::JobStatus::kCompleted:
      // Completed, but some input was refused (bad lines, CID mismatches, unreachable repos):
      // the rest was processed, and the caller can tell the two apart without reading stderr.
      return outcome->unresolved_errors ? kExitInputInvalid : kExitOk;
    case state::JobStatus::kFailed:
      return kExitInputInvalid;
    default:
      return kExitStopped;
  }
}

Result<pipeline::JobOutcome> RunAndReport(const char* verb, const AppConfig& config,
                                          OpenedState& st, state::JobRecord job,
                                          const pipeline::JobContext& ctx) {
  pipeline::JobController& controller = ControllerOf(config, st);
  const uint64_t id = job.id;
  const state::JobRecord before = job;
  ProgressReporter progress(
      [&controller, &before, id] { return controller.Snapshot(id).value_or(before); },
      config.progress_interval_s, ::isatty(STDERR_FILENO) != 0);
  progress.Start();
  Result<pipeline::JobOutcome> outcome = controller.Run(std::move(job), ctx);
  // The controller forgets a job once its run ends, so the last line shows the outcome's record
  // rather than a snapshot that would fall back to the job as it started.
  progress.Stop(outcome.ok() ? &outcome->job : nullptr);
  if (!outcome.ok()) {
    std::fprintf(stderr, "atfill %s: %s\n", verb, outcome.status().message().c_str());
    return outcome;
  }
  const state::JobRecord& done = outcome->job;
  const auto& c = done.counters;
  const bool dry_run = done.params.count("dry_run") && done.params.at("dry_run") == "true";
  std::fprintf(stderr, "atfill %s: job %" PRIu64 " %s: %s %s, %s records written%s", verb, done.id,
               std::string(state::JobStatusName(done.status)).c_str(),
               FormatCount(c.events_read).c_str(), ReadNoun(done),
               FormatCount(c.records_written).c_str(),
               dry_run ? " (dry run: nothing was written; this is what would have been)" : "");
  std::fprintf(stderr, ", %s errors", FormatCount(c.failed_records).c_str());
  const auto found = c.extra.find("units_unavailable");
  const uint64_t unavailable = found == c.extra.end() ? 0 : found->second;
  if (unavailable > 0) {
    std::fprintf(stderr, ", %s unavailable (accounts deactivated, taken down or gone)",
                 FormatCount(unavailable).c_str());
  }
  std::fprintf(stderr, "\n");
  if (c.failed_records > 0 || unavailable > 0) {
    std::fprintf(stderr,
                 "atfill %s: the errors and unavailable accounts are listed by: atfill job %s "
                 "%" PRIu64 " --errors\n",
                 verb, config.path.c_str(), done.id);
  }
  if (!done.stop_reason.empty()) {
    std::fprintf(stderr, "atfill %s: %s: %s\n", verb, done.stop_reason.code.c_str(),
                 done.stop_reason.sentence.c_str());
  }
  return outcome;
}

int RunInForeground(const char* verb, const AppConfig& config, OpenedState& st,
                    state::JobRecord job, const pipeline::JobContext& ctx,
                    state::StopReason* stop) {
  Result<pipeline::JobOutcome> outcome = RunAndReport(verb, config, st, std::move(job), ctx);
  if (stop != nullptr) *stop = outcome.ok() ? outcome->job.stop_reason : state::StopReason{};
  return ExitCodeOf(outcome);
}

}  // namespace atfill::cli
