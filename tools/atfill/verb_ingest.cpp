// atfill ingest CONFIG FILE...: Jetstream event files -> CID verify -> ingest guard -> sink, as a
// job that resumes where it stopped when the same command runs again.
#include <unistd.h>
#include <cinttypes>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"
#include "pipeline/run.hpp"
#include "sinks/dry_run_sink.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/event_file.hpp"
#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/atfill/job_view.hpp"
#include "tools/atfill/state_access.hpp"

namespace atfill::cli {
namespace {

std::atomic<int> g_interrupts{0};

extern "C" void OnInterrupt(int) {
  // The first interrupt pauses the job at its next checkpoint; a second one leaves at once.
  if (g_interrupts.fetch_add(1) >= 1) _exit(130);
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

std::string JoinLines(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : "\n") + s;
  return out;
}

int Fail(const std::string& msg, int code) {
  std::fprintf(stderr, "atfill ingest: %s\n", msg.c_str());
  return code;
}

}  // namespace

int RunIngest(std::span<char* const> args) {
  bool dry_run = false;
  std::vector<std::string> positional;
  for (const char* a : args) {
    const std::string_view s = a;
    if (s == "--dry-run") {
      dry_run = true;
    } else if (s.starts_with("--")) {
      return Fail("unknown option " + std::string(s), kExitUsage);
    } else {
      positional.emplace_back(s);
    }
  }
  if (positional.size() < 2) {
    return Fail("usage: atfill ingest CONFIG FILE... [--dry-run]", kExitUsage);
  }
  auto config = LoadAppConfig(positional[0]);
  if (!config.ok()) return Fail(config.status().message(), kExitUsage);
  std::vector<std::string> files;
  for (size_t i = 1; i < positional.size(); ++i) {
    std::error_code ec;
    auto abs = std::filesystem::absolute(positional[i], ec);
    if (ec || !std::filesystem::is_regular_file(abs, ec)) {
      return Fail("cannot read " + positional[i], kExitIo);
    }
    files.push_back(abs.lexically_normal().string());
  }

  // From here on an interrupt asks for a pause (seen once the job runs) rather than killing.
  std::signal(SIGINT, OnInterrupt);
  std::signal(SIGTERM, OnInterrupt);
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail(st.status().message(), kExitIo);
  const int64_t now = pipeline::NowMicros();
  if (auto swept = st->tombstones->Sweep(now); !swept.ok()) {
    return Fail("sweeping tombstones: " + swept.status().message(), kExitIo);
  }

  // The same files (and mode) resume the unfinished job that read them.
  state::JobRecord prototype;
  prototype.kind = "ingest";
  prototype.stage = state::JobStage::kReplaying;
  prototype.created_us = now;
  prototype.started_by = "cli";
  prototype.params = {{"config", std::filesystem::absolute(config->path).string()},
                      {"files", JoinLines(files)},
                      {"dry_run", dry_run ? "true" : "false"},
                      {"sink", dry_run ? "dry-run" : config->sink + ":" + config->sqlite.path}};
  bool resumed = false;
  auto found = pipeline::FindOrCreateJob(st->jobs.get(), prototype, {"files", "dry_run"}, &resumed);
  if (!found.ok()) return Fail(found.status().message(), kExitIo);
  std::optional<state::JobRecord> job = std::move(*found);
  if (resumed) {
    std::fprintf(stderr, "atfill ingest: resuming job %" PRIu64 " (%s)\n", job->id,
                 std::string(state::JobStatusName(job->status)).c_str());
  } else {
    std::fprintf(stderr, "atfill ingest: job %" PRIu64 " reads %zu file(s) into %s\n", job->id,
                 files.size(), job->params["sink"].c_str());
  }
  ClearRequests(*config, job->id);

  auto sink = dry_run ? sinks::NewDryRunSink() : sinks::OpenSqliteSink(config->sqlite);
  if (!sink.ok()) return Fail(sink.status().message(), kExitIo);
  sources::EventFileOptions file_options = config->files;
  file_options.paths = files;
  auto source = sources::EventFileSource::Open(file_options);
  if (!source.ok()) return Fail(source.status().message(), kExitIo);

  stages::CidVerify verify;
  stages::IngestGuard guard(st->tombstones.get());
  std::vector<const pipeline::Transform*> transforms;
  if (config->verify_cids) transforms.push_back(&verify);
  transforms.push_back(&guard);

  job->counters.extra[pipeline::kInputTotal] = (*source)->total_bytes();
  pipeline::JobRunner runner(st->kv.get(), st->jobs.get(), st->errors.get(), *job,
                             "job/" + std::to_string(job->id) + "/file", config->jobs);
  pipeline::Engine engine(config->engine, source->get(), transforms, sink->get(), st->kv.get(),
                          &runner);

  ProgressReporter progress([&runner] { return runner.Snapshot(); }, config->progress_interval_s,
                            ::isatty(STDERR_FILENO) != 0);
  Result<state::JobRecord> done = Status::Internal("not run");
  {
    StopWatcher watcher(*config, job->id, &runner);
    progress.Start();
    done = runner.Run(&engine);
    progress.Stop();
  }
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  ClearRequests(*config, job->id);
  if (!done.ok()) return Fail(done.status().message(), kExitIo);

  const auto& c = done->counters;
  std::fprintf(stderr, "atfill ingest: job %" PRIu64 " %s: %s events read, %s records written%s",
               done->id, std::string(state::JobStatusName(done->status)).c_str(),
               FormatCount(c.events_read).c_str(), FormatCount(c.records_written).c_str(),
               dry_run ? " (dry run: nothing was written; this is what would have been)" : "");
  std::fprintf(stderr, ", %s errors\n", FormatCount(c.failed_records).c_str());
  if (c.failed_records > 0) {
    std::fprintf(stderr,
                 "atfill ingest: the errors are listed by: atfill job %s %" PRIu64 " --errors\n",
                 config->path.c_str(), done->id);
  }
  if (!done->stop_reason.empty()) {
    std::fprintf(stderr, "atfill ingest: %s: %s\n", done->stop_reason.code.c_str(),
                 done->stop_reason.sentence.c_str());
  }
  switch (done->status) {
    case state::JobStatus::kCompleted:
      return kExitOk;
    case state::JobStatus::kFailed:
      return kExitInputInvalid;
    default:
      return kExitStopped;
  }
}

}  // namespace atfill::cli
