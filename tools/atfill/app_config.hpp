// The launcher's config file: the library's components read their sections into typed settings
// (pipeline/components.hpp); the launcher reads its own ([progress], [admin], [jobs]
// backfill_retention_days). Every key is documented in docs/config.md.
#pragma once

#include <string>

#include "base/status.hpp"
#include "pipeline/components.hpp"
#include "pipeline/process_state.hpp"
#include "pipeline/shard.hpp"
#include "sources/components.hpp"
#include "tools/atfill/admin/admin_server.hpp"

namespace atfill::cli {

struct AppConfig {
  std::string path;                 // the config file
  pipeline::Settings settings;      // every component's
  double progress_interval_s = 10;  // [progress] interval_s (plain log lines)
  // [admin] address, port, token (or the environment's ATFILL_ADMIN_TOKEN): `atfill run` serves
  // the admin API and dashboard when port is set (0 = a free port, printed at start).
  bool admin_enabled = false;
  admin::AdminServerOptions admin;
  // [jobs] backfill_retention_days: the per-repo details and leftover queue of backfill jobs
  // finished longer ago are deleted by a daily task of `atfill run` (at its start, then every
  // 24 h); 0 keeps them forever. Fractions of a day are allowed.
  double backfill_retention_days = 28;

  const sources::SourceSettings& sources() const { return settings.Get<sources::SourceSettings>(); }
};

// The components the launcher runs: every source, stage and sink of the library.
const pipeline::Components& LauncherComponents();

// A --shard given on the command line: LoadAppConfig uses it instead of [engine] shard.
void SetShardOverride(pipeline::Shard shard);

// Loads and validates CONFIG. Relative paths are relative to the config file's folder.
Result<AppConfig> LoadAppConfig(const std::string& path);

using OpenedState = pipeline::ProcessState;
// pipeline::OpenStateForWrite, after waiting out a full disk: with less free than the state
// needs to be opened for writing (state::kStateOpenMinFreeBytes), it says so at once and every
// minute, and waits for space until a stop signal (CatchStopSignals) ends the wait.
Result<OpenedState> OpenStateForWrite(const AppConfig& config);
inline Result<OpenedState> OpenStateForRead(const AppConfig& config) {
  return pipeline::OpenStateForRead(config.settings);
}
// What the library's factories and job helpers use: `st`'s stores and the config's settings.
inline pipeline::Environment EnvOf(const AppConfig& config, const OpenedState& st) {
  return st.EnvironmentFor(LauncherComponents(), config.settings);
}
inline std::string SinkLocation(const AppConfig& config) {
  return LauncherComponents().SinkLocation(config.settings);
}

}  // namespace atfill::cli
