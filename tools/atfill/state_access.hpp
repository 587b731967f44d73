// Opening a config's state directory for the launcher's verbs, and the request files through which
// one process asks another (the one holding the state) to pause or cancel a job.
#pragma once

#include <filesystem>
#include <memory>
#include <string_view>

#include "base/status.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"
#include "state/tombstones.hpp"
#include "tools/atfill/app_config.hpp"

namespace atfill::cli {

struct OpenedState {
  std::unique_ptr<state::KvStore> kv;
  std::unique_ptr<state::JobStore> jobs;
  std::unique_ptr<state::ErrorLog> errors;
  std::unique_ptr<state::Tombstones> tombstones;
  // Another process holds the state: this is a read-only view of it.
  bool read_only = false;
};

// Exclusive: fails with a message naming the holder when another process has the directory.
Result<OpenedState> OpenStateForWrite(const AppConfig& config);
// Exclusive when possible; otherwise a read-only view of what the holder has written.
Result<OpenedState> OpenStateForRead(const AppConfig& config);

// "<state dir>/requests/<job>.<what>", what = "pause" or "cancel".
std::filesystem::path RequestPath(const AppConfig& config, uint64_t job, std::string_view what);
// Writes the request atomically (write, then rename).
Status WriteRequest(const AppConfig& config, uint64_t job, std::string_view what);
// Removes both request files of a job.
void ClearRequests(const AppConfig& config, uint64_t job);

}  // namespace atfill::cli
