// The crawl verbs' entry points shared with `resume` and `run`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "state/job_store.hpp"

namespace atfill::cli {

// Runs backfill job `id` of the config's state again from its queue and cursors.
int ResumeBackfill(const std::string& config_path, uint64_t id);

// Runs the live consumer of the config ([live]) as the job "live" until it stops.
struct AppConfig;
struct OpenedState;
// While `backfill_running` answers true, the live events of repos a crawl marked are held until
// their checkpoint (stages::LiveHold); `stop` receives the live job's stop reason.
int RunLive(const AppConfig& config, OpenedState& st,
            std::function<bool()> backfill_running = nullptr, state::StopReason* stop = nullptr);

// The collections the unfinished backfill jobs of this state cover ("*" for one that fetches every
// collection); empty when none is unfinished.
Result<std::vector<std::string>> UnfinishedBackfillCollections(OpenedState& st);

}  // namespace atfill::cli
