// Embedding atfill with the launcher's job kinds: the same config file, the same components, the
// same jobs. This program ingests Jetstream event files as `atfill ingest CONFIG FILE...` does
// (the config's sink, scripts, CID verification and write rules, a resumable job in the config's
// state directory), through the library alone: the component registry reads the config and plans
// the job, the job controller runs it.
//
//   embed_config CONFIG.toml EVENTS.jsonl...
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "pipeline/components.hpp"
#include "pipeline/process_state.hpp"
#include "sinks/components.hpp"
#include "sources/components.hpp"
#include "stages/components.hpp"

int main(int argc, char** argv) {
  using namespace atfill;
  if (argc < 3) {
    std::fprintf(stderr, "usage: embed_config CONFIG.toml EVENTS.jsonl...\n");
    return 2;
  }
  pipeline::Components components;
  sinks::Register(components);
  sources::Register(components);
  stages::Register(components);
  auto settings = components.LoadConfig(argv[1]);
  if (!settings.ok())
    return std::fprintf(stderr, "embed_config: %s\n", settings.status().ToString().c_str()), 2;
  auto st = pipeline::OpenStateForWrite(*settings);
  if (!st.ok())
    return std::fprintf(stderr, "embed_config: %s\n", st.status().ToString().c_str()), 3;

  std::vector<std::string> files;
  for (int i = 2; i < argc; ++i) files.push_back(std::filesystem::absolute(argv[i]).string());
  const pipeline::Environment env = st->EnvironmentFor(components, *settings);
  bool resumed = false;
  auto job = sources::FindOrCreateIngestJob(env, files, /*dry_run=*/false, "embed", &resumed);
  if (!job.ok())
    return std::fprintf(stderr, "embed_config: %s\n", job.status().ToString().c_str()), 3;

  pipeline::JobController& controller = pipeline::MakeController(*st, components, *settings);
  auto outcome = controller.Run(*job);
  if (!outcome.ok())
    return std::fprintf(stderr, "embed_config: %s\n", outcome.status().ToString().c_str()), 3;
  const state::JobRecord& done = outcome->job;
  std::printf(
      "job %" PRIu64 " %s: %" PRIu64 " events, %" PRIu64 " records written, %" PRIu64 " failed\n",
      done.id, std::string(state::JobStatusName(done.status)).c_str(), done.counters.events_read,
      done.counters.records_written, done.counters.failed_records);
  return done.status == state::JobStatus::kCompleted ? 0 : 1;
}
