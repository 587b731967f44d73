// The launcher's job kinds: what a backfill (crawl or replay), an ingest and the live consumer run,
// built from the config and the job's record for pipeline::JobController.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.hpp"
#include "pipeline/job_controller.hpp"
#include "sources/archive.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/state_access.hpp"

namespace atfill::cli {

// Registers the planners of "backfill", "ingest" and "live" jobs on `controller`; `config` and
// `st` must outlive it.
void RegisterJobKinds(pipeline::JobController& controller, const AppConfig& config,
                      OpenedState& st);

// The archive at `location`: a URL (the archive XRPC API, the config's key) or a directory.
// `probe` shortens the retries (auto's question "is there an archive?").
Result<std::unique_ptr<sources::Archive>> OpenArchive(const AppConfig& config,
                                                      const std::string& location,
                                                      bool probe = false);

// Lines <-> the newline-separated lists job parameters hold.
std::string JoinLines(const std::vector<std::string>& v);
std::vector<std::string> SplitLines(const std::string& s);

// The live consumer's cursor: "SEQ:TIME_US" of the last applied event.
inline constexpr const char* kLiveCursor = "live/jetstream";

}  // namespace atfill::cli
