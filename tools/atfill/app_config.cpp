#include "tools/atfill/app_config.hpp"

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include "base/clock.hpp"
#include "sinks/components.hpp"
#include "stages/components.hpp"
#include "state/kv_store.hpp"
#include "tools/atfill/job_run.hpp"

namespace atfill::cli {
namespace {

std::optional<pipeline::Shard>& ShardOverride() {
  static std::optional<pipeline::Shard> shard;
  return shard;
}

}  // namespace

const pipeline::Components& LauncherComponents() {
  static const pipeline::Components components = [] {
    pipeline::Components c;
    sinks::Register(c);
    sources::Register(c);
    stages::Register(c);
    return c;
  }();
  return components;
}

void SetShardOverride(pipeline::Shard shard) { ShardOverride() = shard; }

Result<AppConfig> LoadAppConfig(const std::string& path) {
  AppConfig c;
  c.path = path;
  auto launcher = [&c](pipeline::ConfigFile& file, pipeline::Settings&) -> Status {
    ATFILL_RETURN_IF_ERROR(
        file.ReadDouble("progress.interval_s", &c.progress_interval_s, 0.1, 86'400));
    ATFILL_RETURN_IF_ERROR(
        file.ReadDouble("jobs.backfill_retention_days", &c.backfill_retention_days, 0, 36'500));
    c.admin_enabled = file.Has("admin.port");
    ATFILL_RETURN_IF_ERROR(file.ReadString("admin.address", &c.admin.address));
    ATFILL_RETURN_IF_ERROR(file.ReadUint("admin.port", &c.admin.port, 0, 65535));
    ATFILL_RETURN_IF_ERROR(file.ReadString("admin.token", &c.admin.token));
    ATFILL_RETURN_IF_ERROR(
        file.ReadInt("admin.sse_interval_ms", &c.admin.sse_interval_ms, 10, 60'000));
    if (c.admin.token.empty()) {
      if (const char* token = std::getenv("ATFILL_ADMIN_TOKEN")) c.admin.token = token;
    }
    return Status::OK();
  };
  ATFILL_ASSIGN_OR_RETURN(c.settings, LauncherComponents().LoadConfig(path, launcher));
  if (ShardOverride()) c.settings.Mutable<pipeline::CoreSettings>().shard = *ShardOverride();
  if (c.admin_enabled) {
    if (c.admin.token.empty()) {
      return Status::Invalid(path +
                             ": [admin] needs a token (token = \"...\" or the environment's "
                             "ATFILL_ADMIN_TOKEN): the admin API never runs open");
    }
    if (Status s = c.admin.Validate(); !s.ok()) return s.WithContext(path + ": [admin]");
  }
  return c;
}

Result<OpenedState> OpenStateForWrite(const AppConfig& config) {
  const std::string& dir = config.settings.Get<pipeline::CoreSettings>().state.path;
  int64_t said_ms = -1;
  for (;;) {
    const std::optional<uint64_t> free = state::StateDirFreeBytes(dir);
    if (!free || *free >= state::kStateOpenMinFreeBytes) break;
    const int64_t now = SteadyMs();
    if (said_ms < 0 || now - said_ms >= 60'000) {
      std::fprintf(stderr,
                   "atfill: the disk of the state folder %s is full (%" PRIu64 " KiB free, %" PRIu64
                   " KiB needed to open it for writing): waiting for space; Ctrl-C stops\n",
                   dir.c_str(), *free >> 10, state::kStateOpenMinFreeBytes >> 10);
      said_ms = now;
    }
    if (StopSignalled()) {
      return Status::Unavailable(
          "stopped while waiting for space on the disk of the state folder " + dir);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (said_ms >= 0) std::fprintf(stderr, "atfill: the disk of %s has space again\n", dir.c_str());
  return pipeline::OpenStateForWrite(config.settings);
}

}  // namespace atfill::cli
