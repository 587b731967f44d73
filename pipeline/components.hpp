// The component registry: how a config file becomes running jobs without pipeline/ knowing any
// source, stage or sink. Each folder registers what it provides (sources::Register,
// stages::Register, sinks::Register): its config sections' readers into its own typed settings,
// and factories that add its pieces to a job's plan. The launcher and a program that embeds
// atfill do the same three calls, load the same config and get the same job kinds:
//
//   pipeline::Components components;
//   sinks::Register(components);
//   sources::Register(components);
//   stages::Register(components);
//   auto settings = components.LoadConfig("atfill.toml");
//   ... open the state, make a JobController ...
//   components.RegisterKinds(controller, environment);
//   controller.Run(job);
//
// A job's plan is made in a fixed order: the source of its kind (which may ask things of the sink
// through SinkHints), then the sink, then each stage factory in registration order, each filling
// its slot of pipeline::StandardStages or leaving it empty. The controller adds the shard filter.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <typeindex>
#include <utility>
#include <vector>

#include "base/status.hpp"
#include "pipeline/account_status.hpp"
#include "pipeline/batcher.hpp"
#include "pipeline/config.hpp"
#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"
#include "pipeline/job_controller.hpp"
#include "pipeline/label.hpp"
#include "pipeline/shard.hpp"
#include "pipeline/sink_readers.hpp"
#include "pipeline/transform.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"
#include "state/tombstones.hpp"

namespace atfill::pipeline {

// The typed options of every registered component, one object per type (each folder keeps its
// own struct: sources::SourceSettings, sinks::SinkSettings...). Filled once by the config readers;
// read-only while jobs run.
class Settings {
 public:
  // The config file they were read from, as given (messages name it); empty when built in code.
  std::string path;

  // The object of type T, made with T's defaults at the first call.
  template <typename T>
  T& Mutable() {
    std::shared_ptr<void>& slot = items_[std::type_index(typeid(T))];
    if (!slot) slot = std::make_shared<T>();
    return *static_cast<T*>(slot.get());
  }
  // The object of type T, or T's defaults when none was set.
  template <typename T>
  const T& Get() const {
    auto it = items_.find(std::type_index(typeid(T)));
    if (it == items_.end()) {
      static const T kDefaults{};
      return kDefaults;
    }
    return *static_cast<const T*>(it->second.get());
  }

 private:
  std::map<std::type_index, std::shared_ptr<void>> items_;
};

// The engine's and the state's own settings: [state], [engine], [jobs], [tombstones].
struct CoreSettings {
  state::RocksDbOptions state;  // [state] dir (default "atfill-state" beside the config), sync
  EngineOptions engine;         // [engine]
  // [engine] shard = "i/n" (a launcher's --shard replaces it): this process owns the DIDs of
  // shard i; every job's graph starts with a ShardFilter.
  Shard shard;
  JobOptions jobs;                     // [jobs] record_batches
  state::ErrorLogOptions error_log;    // [jobs] error_log_cap
  state::TombstoneOptions tombstones;  // [tombstones] retention_hours
};

// What the sink of a job is asked for by its source (a crawl's bulk load, a replay's WAL size, a
// dry run).
struct SinkHints {
  bool dry_run = false;    // write nothing (the dry-run sink)
  bool bulk_load = false;  // a crawl alone into an empty table may bulk-load it (SQLite)
  std::optional<int64_t> wal_autocheckpoint_bytes;  // a replay checkpoints SQLite's WAL less often
  // Where the sink says what keeps the job waiting (an upgrade of its tables, a bulk load's index
  // builds); Plan sets it to the environment's log.
  std::function<void(std::string_view line)> log;
};

// The process's state and settings, which every factory may use. Everything must outlive the
// jobs planned with it.
class Components;
struct Environment {
  const Components* components = nullptr;
  const Settings* settings = nullptr;
  state::KvStore* kv = nullptr;
  state::JobStore* jobs = nullptr;
  state::ErrorLog* errors = nullptr;
  state::Tombstones* tombstones = nullptr;
  // Where the library's components report what a user reads (a job's closing statistics, a gap
  // replay started): one line, no newline, which names its speaker ("atfill: archive: ...").
  // Unset: standard error.
  std::function<void(std::string_view line)> log;

  void Log(std::string_view line) const;
};

// One job's plan while its factories fill it.
struct PlanDraft {
  state::JobRecord* job = nullptr;  // the job's record; a factory may add parameters or counters
  const JobContext* ctx = nullptr;
  JobPlan* plan = nullptr;
  SinkHints sink_hints;  // set by the source factory, read by the sink factory
  SinkReaders readers;   // set with the sink (the configured database's, even for a dry run)
  // Set by a source whose job may purge accounts the stream calls deleted: how to ask an
  // account's PDS (the account check stage uses it; nullptr: no check).
  AccountStatusLookup* account_status = nullptr;
  // Set by a source whose collections change while it runs (the live consumer): whether a
  // collection is still consumed now. Events held back earlier (stages/live_hold) of one no longer
  // consumed are dropped when released. Unset: every collection.
  std::function<bool(std::string_view collection)> consumes;

  // Keeps `piece` alive for the run (released after it, last made first) and returns it.
  template <typename T>
  T* Keep(std::unique_ptr<T> piece) {
    T* raw = piece.get();
    plan->keep.push_back(std::shared_ptr<T>(std::move(piece)));
    return raw;
  }
  std::string Param(const std::string& name) const;
};

class Components {
 public:
  // Reads a component's sections of a config file into its settings. Readers run in registration
  // order, after the core's own ([state], [engine], [jobs], [tombstones]); a later one may read
  // what an earlier one set. Messages name the file, line and key (ConfigFile::Where).
  using ConfigReader = std::function<Status(ConfigFile& file, Settings& settings)>;
  // Adds a source to the plan (plan->source, cursor_name, batch, after) and says what it needs
  // of the sink (draft.sink_hints).
  using SourceFactory = std::function<Status(const Environment& env, PlanDraft& draft)>;
  // A sink on the database `kind` names (created or migrated as needed).
  using SinkFactory = std::function<Result<std::unique_ptr<Sink>>(const Settings& settings,
                                                                  const SinkHints& hints)>;
  // A stage factory fills its slot of plan->stages, or leaves it empty when the job or the config
  // does not want it.
  using StageFactory = std::function<Status(const Environment& env, PlanDraft& draft)>;
  // What a sink kind provides besides its writer.
  struct SinkKind {
    SinkFactory open;
    // "sqlite:/path/atfill.db": where it writes, for job parameters and messages (no password).
    std::function<std::string(const Settings&)> location;
    // Its readers (made lazily: a reader opens its connection at its first call).
    std::function<SinkReaders(const Settings&)> readers;
    // Its label sink (pipeline/label.hpp); empty when the kind stores no labels.
    std::function<Result<std::unique_ptr<LabelSink>>(const Settings&)> open_labels = nullptr;
  };
  // Which sink kind the settings choose ("sqlite", "postgres"...).
  using SinkChooser = std::function<std::string(const Settings&)>;

  void AddConfigReader(ConfigReader reader);
  void AddSource(std::string name, SourceFactory factory);
  void AddSinkKind(std::string kind, SinkKind sink);
  void SetSinkChooser(SinkChooser chooser);
  void AddStage(std::string name, StageFactory factory);
  // A job kind ("backfill", "ingest", "live") and the source it runs when its record names none
  // (its "source" parameter names one otherwise).
  void AddJobKind(std::string kind, std::string default_source);

  // Loads `path`: the core sections, then every registered reader; a key no reader asked for is
  // an error. `extra` reads the caller's own sections (a launcher's [admin]) before that check.
  Result<Settings> LoadConfig(const std::string& path, const ConfigReader& extra = {}) const;
  // The same from text (tests, embedded configs); relative paths resolve against the current
  // folder.
  Result<Settings> ParseConfig(std::string_view text, const std::string& name,
                               const ConfigReader& extra = {}) const;

  // The plan of `job`: its kind's source, the configured sink (or the dry-run sink), the stages.
  Result<JobPlan> Plan(const Environment& env, state::JobRecord& job, const JobContext& ctx) const;
  // The stages alone, as Plan makes them: every stage factory in registration order, each filling
  // its slot of draft.plan->stages. For a job whose source and sink the caller brings (the benches,
  // a program with its own source), so that it still gets the launcher's stages and write rules.
  // The caller sets draft.job, ctx, plan and readers, and account_status and consumes as its
  // source would.
  Status PlanStages(const Environment& env, PlanDraft& draft) const;
  // Registers a planner for every job kind on `controller`; this registry and what `env` points to
  // must outlive it.
  void RegisterKinds(JobController& controller, Environment env) const;

  // The configured sink kind's writer, location and readers.
  Result<std::unique_ptr<Sink>> OpenSink(const Settings& settings,
                                         const SinkHints& hints = {}) const;
  std::string SinkLocation(const Settings& settings) const;
  // The configured sink kind's label sink; Unsupported when that kind stores no labels.
  Result<std::unique_ptr<LabelSink>> OpenLabelSink(const Settings& settings) const;
  SinkReaders Readers(const Settings& settings) const;

  // The options a JobController of these settings takes (engine, jobs, shard).
  static JobControllerOptions ControllerOptions(const Settings& settings);

 private:
  Result<const SinkKind*> ChosenSink(const Settings& settings) const;
  Status ReadAll(ConfigFile& file, Settings& settings, const ConfigReader& extra) const;

  std::vector<ConfigReader> readers_;
  std::map<std::string, SourceFactory> sources_;
  std::map<std::string, SinkKind> sinks_;
  SinkChooser chooser_;
  std::vector<std::pair<std::string, StageFactory>> stages_;
  std::map<std::string, std::string> kinds_;
};

// [section] batch_records, batch_ms, batch_chunks into `batch`.
Status ReadBatchOptions(ConfigFile& file, const std::string& section, BatcherOptions* batch);

// Newline-separated lists, as job parameters hold them.
std::string JoinLines(const std::vector<std::string>& lines);
std::vector<std::string> SplitLines(const std::string& text);

}  // namespace atfill::pipeline
