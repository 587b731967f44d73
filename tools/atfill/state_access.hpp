// Opening a config's state directory for the launcher's verbs, and the request files through which
// one process asks another (the one holding the state) to pause or cancel a job.
#pragma once

#include <filesystem>
#include <memory>
#include <string_view>

#include "base/status.hpp"
#include "pipeline/job_controller.hpp"
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
  // The jobs this process runs on it (tools/atfill/job_run.hpp ControllerOf); released first.
  std::unique_ptr<pipeline::JobController> controller;
};

// Exclusive: fails with a message naming the holder when another process has the directory.
Result<OpenedState> OpenStateForWrite(const AppConfig& config);
// Exclusive when possible; otherwise a read-only view of what the holder has written.
Result<OpenedState> OpenStateForRead(const AppConfig& config);

// "<state dir>/requests": where another process asks the holder to pause or cancel a job
// (pipeline::JobController::WriteRequest).
std::filesystem::path RequestsDir(const AppConfig& config);

}  // namespace atfill::cli
