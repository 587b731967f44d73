// Embedding atfill in a batch job: Jetstream event lines -> CID verification -> ingest guard ->
// SQLite, as a resumable job whose state lives in a RocksDB folder. Run it again after a crash and
// it resumes. The program brings its own source and sink; its stages are made by the launcher's
// own stage factories (Components::PlanStages) for an ingest job, so the write rules (revs,
// tombstones, inactive accounts) are the launcher's, whatever changes in them.
//
//   embed_batch EVENTS.jsonl OUT.db STATE_DIR
#include <cinttypes>
#include <cstdio>

#include "pipeline/components.hpp"
#include "pipeline/run.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/files/event_file.hpp"
#include "stages/components.hpp"
#include "state/kv_store.hpp"
#include "state/tombstones.hpp"

int main(int argc, char** argv) {
  using namespace atfill;
  if (argc != 4) {
    std::fprintf(stderr, "usage: embed_batch EVENTS.jsonl OUT.db STATE_DIR\n");
    return 2;
  }
  sources::EventFileOptions input;
  input.paths = {argv[1]};
  sinks::SqliteSinkOptions output;
  output.path = argv[2];
  state::RocksDbOptions job_state;
  job_state.path = argv[3];
  auto source = sources::EventFileSource::Open(input);
  auto sink = sinks::OpenSqliteSink(output);
  auto state = state::OpenRocksDb(job_state);
  for (const Status& s : {source.status(), sink.status(), state.status()}) {
    if (!s.ok()) return std::fprintf(stderr, "embed_batch: %s\n", s.ToString().c_str()), 1;
  }
  pipeline::Components components;
  stages::Register(components);
  const pipeline::Settings settings;  // the default config: [stages] verify_cids = true
  state::Tombstones tombstones(**state);
  pipeline::Environment env;
  env.components = &components;
  env.settings = &settings;
  env.kv = state->get();
  env.tombstones = &tombstones;
  state::JobRecord record;
  record.kind = "ingest";
  const pipeline::JobContext ctx;
  pipeline::JobPlan plan;  // owns the stages
  pipeline::PlanDraft draft;
  draft.job = &record;
  draft.ctx = &ctx;
  draft.plan = &plan;
  if (Status s = components.PlanStages(env, draft); !s.ok()) {
    return std::fprintf(stderr, "embed_batch: %s\n", s.ToString().c_str()), 1;
  }
  pipeline::RunOptions options;
  options.job_name = "embed-example";
  auto job =
      pipeline::RunAsJob(source->get(), plan.stages.InOrder(), sink->get(), state->get(), options);
  if (!job.ok())
    return std::fprintf(stderr, "embed_batch: %s\n", job.status().ToString().c_str()), 1;
  std::printf(
      "job %" PRIu64 " %s: %" PRIu64 " events, %" PRIu64 " records written, %" PRIu64 " failed\n",
      job->id, std::string(state::JobStatusName(job->status)).c_str(), job->counters.events_read,
      job->counters.records_written, job->counters.failed_records);
  return job->status == state::JobStatus::kCompleted ? 0 : 1;
}
