#include "tools/atfill/job_run.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "pipeline/job.hpp"
#include "pipeline/shard.hpp"
#include "stages/script.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/atfill/job_view.hpp"
#include "tools/atfill/job_watch.hpp"
#include "tools/atfill/sink_access.hpp"

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

// Watches for stop requests (request files from other atfill processes, Ctrl-C) while a job runs.
class StopWatcher {
 public:
  StopWatcher(const AppConfig& config, uint64_t job, pipeline::JobRunner* runner)
      : config_(config), job_(job), runner_(runner) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~StopWatcher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return done_; })) {
      std::error_code ec;
      if (std::filesystem::exists(RequestPath(config_, job_, "cancel"), ec)) {
        runner_->RequestStop(pipeline::StopKind::kCancel);
      } else if (g_interrupts.load() > 0 ||
                 std::filesystem::exists(RequestPath(config_, job_, "pause"), ec)) {
        runner_->RequestStop(pipeline::StopKind::kPause);
      }
    }
  }
  const AppConfig& config_;
  uint64_t job_;
  pipeline::JobRunner* runner_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

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

Result<bool> HasUnresolvedErrors(state::ErrorLog& errors, uint64_t job) {
  ATFILL_ASSIGN_OR_RETURN(state::ErrorTotals totals, errors.Totals(job));
  if (totals.dropped > 0) return true;  // entries past the cap were never stored
  ATFILL_ASSIGN_OR_RETURN(auto entries, errors.List(job, 0, totals.entries));
  return std::any_of(entries.begin(), entries.end(),
                     [](const state::ErrorEntry& e) { return !e.resolved; });
}

int RunInForeground(ForegroundJob& spec) {
  const AppConfig& config = *spec.config;
  OpenedState& st = *spec.state;
  // A sharded process's graph first removes the events of DIDs other shards own.
  pipeline::ShardFilter shard_filter(config.shard);
  pipeline::StandardStages plan = spec.stages;
  // The record scripts ([scripts]) take their slot in the standard order (pipeline/plan.hpp).
  std::unique_ptr<stages::ScriptStage> scripts;
  if (!config.scripts.scripts.empty()) {
    stages::ScriptOptions options = config.scripts;
    options.read_record = SinkRecordReader(config);
    auto made = stages::ScriptStage::Create(std::move(options));
    if (!made.ok()) {
      std::fprintf(stderr, "atfill %s: %s: %s\n", spec.verb, config.path.c_str(),
                   made.status().message().c_str());
      return kExitUsage;
    }
    scripts = std::move(*made);
    plan.script = scripts.get();
  }
  if (!config.shard.all()) {
    plan.shard_filter = &shard_filter;
    spec.job.params["shard"] = config.shard.ToString();
  }
  pipeline::JobOptions job_options = config.jobs;
  job_options.on_change = [](const state::JobRecord& job, const pipeline::BatchReport* batch) {
    JobWatch::Get().Changed(job, batch);
  };
  pipeline::JobRunner runner(st.kv.get(), st.jobs.get(), st.errors.get(), spec.job,
                             spec.cursor_name, job_options);
  pipeline::EngineOptions engine_options = config.engine;
  if (spec.batch) engine_options.batch = *spec.batch;
  pipeline::Engine engine(engine_options, spec.source, plan.InOrder(), spec.sink, st.kv.get(),
                          &runner);
  ProgressReporter progress([&runner] { return runner.Snapshot(); }, config.progress_interval_s,
                            ::isatty(STDERR_FILENO) != 0);
  Result<state::JobRecord> done = Status::Internal("not run");
  {
    StopWatcher watcher(config, spec.job.id, &runner);
    JobWatch::Get().Attach(spec.job.id, &runner);
    progress.Start();
    done = runner.Run(&engine);
    progress.Stop();
    JobWatch::Get().Detach(spec.job.id);
  }
  ClearRequests(config, spec.job.id);
  if (!done.ok()) {
    std::fprintf(stderr, "atfill %s: %s\n", spec.verb, done.status().message().c_str());
    return kExitIo;
  }
  spec.stop_reason = done->stop_reason;
  const auto& c = done->counters;
  std::fprintf(stderr, "atfill %s: job %" PRIu64 " %s: %s %s, %s records written%s", spec.verb,
               done->id, std::string(state::JobStatusName(done->status)).c_str(),
               FormatCount(c.events_read).c_str(), spec.read_noun,
               FormatCount(c.records_written).c_str(),
               spec.dry_run ? " (dry run: nothing was written; this is what would have been)" : "");
  std::fprintf(stderr, ", %s errors\n", FormatCount(c.failed_records).c_str());
  if (c.failed_records > 0) {
    std::fprintf(stderr,
                 "atfill %s: the errors are listed by: atfill job %s %" PRIu64 " --errors\n",
                 spec.verb, config.path.c_str(), done->id);
  }
  if (!done->stop_reason.empty()) {
    std::fprintf(stderr, "atfill %s: %s: %s\n", spec.verb, done->stop_reason.code.c_str(),
                 done->stop_reason.sentence.c_str());
  }
  switch (done->status) {
    case state::JobStatus::kCompleted: {
      // Completed, but some input was refused (bad lines, CID mismatches, unreachable repos):
      // the rest was processed, and the caller can tell the two apart without reading stderr.
      // Errors a later attempt resolved (a unit that failed, then succeeded) do not count.
      if (c.failed_records == 0) return kExitOk;
      auto unresolved = HasUnresolvedErrors(*st.errors, done->id);
      if (!unresolved.ok()) {
        std::fprintf(stderr, "atfill %s: %s\n", spec.verb, unresolved.status().message().c_str());
        return kExitIo;
      }
      return *unresolved ? kExitInputInvalid : kExitOk;
    }
    case state::JobStatus::kFailed:
      return kExitInputInvalid;
    default:
      return kExitStopped;
  }
}

}  // namespace atfill::cli
