#include "tools/atfill/app_config.hpp"

#include <cstdlib>
#include <optional>

#include "sinks/components.hpp"
#include "stages/components.hpp"

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

}  // namespace atfill::cli
