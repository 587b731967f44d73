#include "pipeline/process_state.hpp"

#include <mutex>

namespace atfill::pipeline {
namespace {

// Requests written before this process started were meant for an earlier holder of the state.
const std::filesystem::file_time_type kProcessStart = std::filesystem::file_time_type::clock::now();

void RemoveStaleRequests(const Settings& settings) {
  std::error_code ec;
  const auto dir = RequestsDir(settings);
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code entry_ec;
    const auto written = entry.last_write_time(entry_ec);
    if (!entry_ec && written < kProcessStart) std::filesystem::remove(entry.path(), entry_ec);
  }
}

ProcessState Wrap(std::unique_ptr<state::KvStore> kv, const CoreSettings& core, bool read_only) {
  ProcessState s;
  s.kv = std::move(kv);
  s.jobs = std::make_unique<state::JobStore>(*s.kv);
  s.errors = std::make_unique<state::ErrorLog>(*s.kv, core.error_log);
  s.tombstones = std::make_unique<state::Tombstones>(*s.kv, core.tombstones);
  s.read_only = read_only;
  return s;
}

}  // namespace

Environment ProcessState::EnvironmentFor(const Components& components,
                                         const Settings& settings) const {
  Environment env;
  env.components = &components;
  env.settings = &settings;
  env.kv = kv.get();
  env.jobs = jobs.get();
  env.errors = errors.get();
  env.tombstones = tombstones.get();
  return env;
}

Result<ProcessState> OpenStateForWrite(const Settings& settings) {
  const CoreSettings& core = settings.Get<CoreSettings>();
  ATFILL_ASSIGN_OR_RETURN(auto kv, state::OpenRocksDb(core.state));
  // A state directory belongs to one shard: its queue, cursors and live position are that
  // shard's. The first process to write it records its shard; another shard is refused.
  constexpr std::string_view kShardKey = "shard";
  ATFILL_ASSIGN_OR_RETURN(auto recorded, kv->Get(state::Family::kMeta, kShardKey));
  const std::string shard = core.shard.ToString();
  if (!recorded) {
    state::WriteBatch b;
    b.Put(state::Family::kMeta, kShardKey, shard);
    ATFILL_RETURN_IF_ERROR(kv->Write(b));
  } else if (*recorded != shard) {
    return Status::Invalid("the state directory " + core.state.path + " belongs to shard " +
                           *recorded + ", and this process is shard " + shard +
                           " ([engine] shard or --shard): each shard needs its own state directory "
                           "([state] dir)");
  }
  // Now that this process holds the state, a request written from here on is for it, even one
  // that arrives before its job starts; only older ones are dropped.
  RemoveStaleRequests(settings);
  return Wrap(std::move(kv), core, false);
}

Result<ProcessState> OpenStateForRead(const Settings& settings) {
  const CoreSettings& core = settings.Get<CoreSettings>();
  // Never the exclusive open: it writes (a new log, a manifest, the owner file) and so fails, or
  // worse, on a full disk, and it would shut out a process starting beside it.
  const bool held = state::StateDirHeld(core.state.path);
  auto view = state::OpenRocksDbReadOnly(core.state);
  if (view.status().code() == StatusCode::kNotFound) {
    // No state yet: nothing to show, and nothing is created for it.
    return Wrap(state::NewMemoryKvStore(), core, false);
  }
  if (!view.ok()) return view.status();
  return Wrap(std::move(*view), core, held);
}

std::filesystem::path RequestsDir(const Settings& settings) {
  return std::filesystem::path(settings.Get<CoreSettings>().state.path) / "requests";
}

JobController& MakeController(ProcessState& st, const Components& components,
                              const Settings& settings, std::function<bool()> interrupted) {
  // Jobs beside the caller's ask for it from their own threads.
  static std::mutex mu;
  std::lock_guard lock(mu);
  if (!st.controller) {
    JobControllerOptions options = Components::ControllerOptions(settings);
    options.requests_dir = RequestsDir(settings);
    options.interrupted = std::move(interrupted);
    st.controller =
        std::make_unique<JobController>(st.kv.get(), st.jobs.get(), st.errors.get(), options);
    components.RegisterKinds(*st.controller, st.EnvironmentFor(components, settings));
  }
  return *st.controller;
}

}  // namespace atfill::pipeline
