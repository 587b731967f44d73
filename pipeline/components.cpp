#include "pipeline/components.hpp"

#include <cstdio>

namespace atfill::pipeline {

void Environment::Log(std::string_view line) const {
  if (log) {
    log(line);
    return;
  }
  std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
}

std::string PlanDraft::Param(const std::string& name) const {
  auto it = job->params.find(name);
  return it == job->params.end() ? std::string() : it->second;
}

std::string JoinLines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& s : lines) out += (out.empty() ? "" : "\n") + s;
  return out;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    if (nl > start) out.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

Status ReadBatchOptions(ConfigFile& file, const std::string& section, BatcherOptions* batch) {
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint(section + ".batch_records", &batch->max_events, 1, 1'000'000));
  ATFILL_RETURN_IF_ERROR(file.ReadInt(section + ".batch_ms", &batch->max_delay_ms, 0, 600'000));
  return file.ReadUint(section + ".batch_chunks", &batch->max_chunks, 1, 100'000);
}

namespace {

// [state], [engine], [jobs], [tombstones].
Status ReadCore(ConfigFile& file, Settings& settings) {
  CoreSettings& c = settings.Mutable<CoreSettings>();
  // Relative defaults resolve against the config's folder, like configured paths.
  c.state.path = "atfill-state";
  ATFILL_RETURN_IF_ERROR(file.ReadPath("state.dir", &c.state.path));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("state.sync", &c.state.sync));
  EngineOptions& e = c.engine;
  ATFILL_RETURN_IF_ERROR(ReadBatchOptions(file, "engine", &e.batch));
  ATFILL_RETURN_IF_ERROR(file.ReadUint("engine.workers", &e.workers, 0, 1024));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("engine.max_chunks_in_flight", &e.max_chunks_in_flight, 0, 1'000'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("engine.sink_retry_initial_ms", &e.sink_retry.initial_delay_ms, 1, 600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("engine.sink_retry_max_ms", &e.sink_retry.max_delay_ms, 1, 3'600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("engine.sink_retry_max_attempts", &e.sink_retry.max_attempts, 0, 1'000'000));
  std::string shard;
  ATFILL_RETURN_IF_ERROR(file.ReadString("engine.shard", &shard));
  if (!shard.empty()) {
    auto parsed = Shard::Parse(shard);
    if (!parsed.ok()) return parsed.status().WithContext(file.Where("engine.shard"));
    c.shard = *parsed;
  }
  ATFILL_RETURN_IF_ERROR(file.ReadBool("jobs.record_batches", &c.jobs.record_batches));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("jobs.error_log_cap", &c.error_log.max_entries_per_job, 1, 100'000'000));
  int64_t retention_hours = c.tombstones.retention_us / 3'600'000'000;
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("tombstones.retention_hours", &retention_hours, 1, 24 * 365 * 10));
  c.tombstones.retention_us = retention_hours * 3'600'000'000;
  const std::string& path = file.source_name();
  if (Status s = c.engine.Validate(); !s.ok()) return s.WithContext(path + ": [engine]");
  if (Status s = c.state.Validate(); !s.ok()) return s.WithContext(path + ": [state]");
  if (Status s = c.error_log.Validate(); !s.ok()) return s.WithContext(path + ": [jobs]");
  if (Status s = c.tombstones.Validate(); !s.ok()) return s.WithContext(path + ": [tombstones]");
  return Status::OK();
}

}  // namespace

void Components::AddConfigReader(ConfigReader reader) { readers_.push_back(std::move(reader)); }

void Components::AddSource(std::string name, SourceFactory factory) {
  sources_[std::move(name)] = std::move(factory);
}

void Components::AddSinkKind(std::string kind, SinkKind sink) {
  sinks_[std::move(kind)] = std::move(sink);
}

void Components::SetSinkChooser(SinkChooser chooser) { chooser_ = std::move(chooser); }

void Components::AddStage(std::string name, StageFactory factory) {
  stages_.emplace_back(std::move(name), std::move(factory));
}

void Components::AddJobKind(std::string kind, std::string default_source) {
  kinds_[std::move(kind)] = std::move(default_source);
}

Status Components::ReadAll(ConfigFile& file, Settings& settings, const ConfigReader& extra) const {
  ATFILL_RETURN_IF_ERROR(ReadCore(file, settings));
  for (const ConfigReader& reader : readers_) ATFILL_RETURN_IF_ERROR(reader(file, settings));
  if (extra) ATFILL_RETURN_IF_ERROR(extra(file, settings));
  return file.Finish();
}

Result<Settings> Components::LoadConfig(const std::string& path, const ConfigReader& extra) const {
  ATFILL_ASSIGN_OR_RETURN(ConfigFile file, ConfigFile::Load(path));
  Settings settings;
  settings.path = path;
  ATFILL_RETURN_IF_ERROR(ReadAll(file, settings, extra));
  return settings;
}

Result<Settings> Components::ParseConfig(std::string_view text, const std::string& name,
                                         const ConfigReader& extra) const {
  ATFILL_ASSIGN_OR_RETURN(ConfigFile file, ConfigFile::Parse(text, name));
  Settings settings;
  settings.path = name;
  ATFILL_RETURN_IF_ERROR(ReadAll(file, settings, extra));
  return settings;
}

Result<const Components::SinkKind*> Components::ChosenSink(const Settings& settings) const {
  const std::string kind = chooser_ ? chooser_(settings) : std::string();
  auto it = sinks_.find(kind);
  if (it == sinks_.end()) {
    return Status::Unsupported("no sink of kind '" + kind + "' is registered");
  }
  return &it->second;
}

Result<std::unique_ptr<Sink>> Components::OpenSink(const Settings& settings,
                                                   const SinkHints& hints) const {
  ATFILL_ASSIGN_OR_RETURN(const SinkKind* sink, ChosenSink(settings));
  return sink->open(settings, hints);
}

Result<std::unique_ptr<LabelSink>> Components::OpenLabelSink(const Settings& settings) const {
  ATFILL_ASSIGN_OR_RETURN(const SinkKind* sink, ChosenSink(settings));
  if (!sink->open_labels) return Status::Unsupported("this sink kind stores no labels");
  return sink->open_labels(settings);
}

std::string Components::SinkLocation(const Settings& settings) const {
  auto sink = ChosenSink(settings);
  return sink.ok() && (*sink)->location ? (*sink)->location(settings) : std::string();
}

SinkReaders Components::Readers(const Settings& settings) const {
  auto sink = ChosenSink(settings);
  return sink.ok() && (*sink)->readers ? (*sink)->readers(settings) : SinkReaders{};
}

Result<JobPlan> Components::Plan(const Environment& env, state::JobRecord& job,
                                 const JobContext& ctx) const {
  auto kind = kinds_.find(job.kind);
  if (kind == kinds_.end()) {
    return Status::Unsupported("job " + std::to_string(job.id) + ": no job kind '" + job.kind +
                               "' is registered");
  }
  JobPlan plan;
  PlanDraft draft;
  draft.job = &job;
  draft.ctx = &ctx;
  draft.plan = &plan;
  std::string source_name = draft.Param("source");
  if (source_name.empty()) source_name = kind->second;
  auto source = sources_.find(source_name);
  if (source == sources_.end()) {
    return Status::Unsupported("job " + std::to_string(job.id) + " (" + job.kind +
                               "): no source '" + source_name + "' is registered");
  }
  ATFILL_RETURN_IF_ERROR(source->second(env, draft));
  if (plan.source == nullptr) {
    return Status::Internal("the source factory '" + source_name + "' made no source");
  }
  // A copy of the log: the sink may speak after the plan (a bulk load's indexes, built as it
  // closes), and the environment's own lifetime is the caller's.
  if (!draft.sink_hints.log) {
    draft.sink_hints.log = [log = env.log](std::string_view line) {
      Environment said;
      said.log = log;
      said.Log(line);
    };
  }
  // The sink is opened after the source (which says what it needs of it) but released after
  // everything else: the source and the stages may use it until they are gone.
  auto sink = OpenSink(*env.settings, draft.sink_hints);
  if (!sink.ok()) {
    // A database that cannot be opened is unavailable, not a job this build cannot run.
    if (sink.status().code() == StatusCode::kUnsupported) return sink.status();
    return Status::IoError(sink.status().message());
  }
  plan.sink = sink->get();
  plan.keep.insert(plan.keep.begin(), std::shared_ptr<Sink>(std::move(*sink)));
  draft.readers = Readers(*env.settings);
  ATFILL_RETURN_IF_ERROR(PlanStages(env, draft));
  return plan;
}

Status Components::PlanStages(const Environment& env, PlanDraft& draft) const {
  for (const auto& [name, factory] : stages_) {
    ATFILL_RETURN_IF_ERROR(factory(env, draft));
  }
  return Status::OK();
}

void Components::RegisterKinds(JobController& controller, Environment env) const {
  for (const auto& [kind, source] : kinds_) {
    controller.SetPlanner(kind, [this, env](state::JobRecord& job, const JobContext& ctx) {
      return Plan(env, job, ctx);
    });
  }
}

JobControllerOptions Components::ControllerOptions(const Settings& settings) {
  const CoreSettings& core = settings.Get<CoreSettings>();
  JobControllerOptions options;
  options.engine = core.engine;
  options.jobs = core.jobs;
  options.shard = core.shard;
  return options;
}

}  // namespace atfill::pipeline
