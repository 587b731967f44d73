// The crawl verbs' entry points shared with `resume` and `run`.
#pragma once

#include <cstdint>
#include <string>

namespace atfill::cli {

// Runs backfill job `id` of the config's state again from its queue and cursors.
int ResumeBackfill(const std::string& config_path, uint64_t id);

// Runs the live consumer of the config ([live]) as the job "live" until it stops.
struct AppConfig;
struct OpenedState;
int RunLive(const AppConfig& config, OpenedState& st);

}  // namespace atfill::cli
