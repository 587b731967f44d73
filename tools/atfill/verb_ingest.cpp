// atfill ingest CONFIG FILE...: Jetstream event files into the sink (the "ingest" job kind,
// sources/components.hpp), as a job that resumes where it stopped when the same command runs
// again.
#include <cinttypes>
#include <cstdio>
#include <filesystem>

#include "pipeline/job.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/atfill/job_run.hpp"

namespace atfill::cli {
namespace {

int Fail(const std::string& msg, int code) {
  std::fprintf(stderr, "atfill ingest: %s\n", msg.c_str());
  return code;
}

}  // namespace

int RunIngest(std::span<char* const> args) {
  bool dry_run = false;
  std::string config_path;
  std::vector<std::string> inputs;
  CLI::App app{"", "atfill ingest"};
  PrepareVerbApp(app);
  app.add_option("CONFIG", config_path, "the config file")->required();
  app.add_option("FILE", inputs, "Jetstream event files")->required();
  app.add_flag("--dry-run", dry_run);
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  auto config = LoadAppConfig(config_path);
  if (!config.ok()) return Fail(config.status().message(), kExitUsage);
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    auto abs = std::filesystem::absolute(input, ec);
    if (ec || !std::filesystem::is_regular_file(abs, ec)) {
      return Fail("cannot read " + input, kExitIo);
    }
    files.push_back(abs.lexically_normal().string());
  }

  // From here on an interrupt asks for a pause (seen once the job runs) rather than killing.
  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail(st.status().message(), kExitIo);
  bool resumed = false;
  auto found = sources::FindOrCreateIngestJob(EnvOf(*config, *st), files, dry_run, "cli", &resumed);
  if (!found.ok()) return Fail(found.status().message(), kExitIo);
  std::optional<state::JobRecord> job = std::move(*found);
  if (resumed) {
    std::fprintf(stderr, "atfill ingest: resuming job %" PRIu64 " (%s)\n", job->id,
                 std::string(state::JobStatusName(job->status)).c_str());
  } else {
    std::fprintf(stderr, "atfill ingest: job %" PRIu64 " reads %zu file(s) into %s\n", job->id,
                 files.size(), job->params["sink"].c_str());
  }

  const int rc = RunInForeground("ingest", *config, *st, *job);
  RestoreSignals();
  return rc;
}

}  // namespace atfill::cli
