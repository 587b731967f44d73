// The state directory of a process that runs jobs ([state] dir): the stores a JobController and
// the component factories use, opened for writing (exclusive) or as a read-only view of what
// another process holds, and the request files through which one process asks the holder to
// pause or cancel a job.
#pragma once

#include <filesystem>
#include <memory>

#include "base/status.hpp"
#include "pipeline/components.hpp"
#include "pipeline/job_controller.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"
#include "state/tombstones.hpp"

namespace atfill::pipeline {

struct ProcessState {
  std::unique_ptr<state::KvStore> kv;
  std::unique_ptr<state::JobStore> jobs;
  std::unique_ptr<state::ErrorLog> errors;
  std::unique_ptr<state::Tombstones> tombstones;
  // Another process holds the state, of which this is a read-only view.
  bool read_only = false;
  // The jobs this process runs on it (MakeController); released first.
  std::unique_ptr<JobController> controller;

  // What the component factories use: these stores, `components` and `settings` (which must
  // outlive the jobs planned with it).
  Environment EnvironmentFor(const Components& components, const Settings& settings) const;
};

// Exclusive: fails with a message naming the holder when another process has the directory, or
// when the directory belongs to another shard ([engine] shard) than the settings'.
Result<ProcessState> OpenStateForWrite(const Settings& settings);
// A read-only view (state::OpenRocksDbReadOnly) that writes nothing into the directory, whether
// or not another process holds it (`read_only` says whether one does); an empty state when the
// directory holds none yet.
Result<ProcessState> OpenStateForRead(const Settings& settings);

// "<state dir>/requests": where another process asks the holder to pause or cancel a job
// (JobController::WriteRequest).
std::filesystem::path RequestsDir(const Settings& settings);

// Makes `st.controller` (once) with the settings' engine, jobs and shard, the request files, and
// a planner for every job kind `components` registered; `interrupted` is polled while jobs run
// (true asks them to pause). `components`, `settings` and `st` must outlive the controller.
JobController& MakeController(ProcessState& st, const Components& components,
                              const Settings& settings, std::function<bool()> interrupted = {});

}  // namespace atfill::pipeline
