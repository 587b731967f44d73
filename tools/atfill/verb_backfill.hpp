// The crawl verbs' entry points shared with `resume` and `run`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.hpp"
#include "pipeline/job_controller.hpp"
#include "sources/components.hpp"
#include "state/job_store.hpp"
#include "tools/atfill/app_config.hpp"

namespace atfill::cli {

// sources::CreateBackfill inside `atfill run`, announced on standard error as "atfill run: backfill
// job N crawls 2 collection(s) ..."; `started_by` ("cli", "api", "run") is recorded in the job.
Result<state::JobRecord> CreateBackfill(const AppConfig& config, OpenedState& st,
                                        const sources::BackfillTargets& targets,
                                        const std::string& started_by);

// Runs the live consumer of the config ([live]) as the job "live" until it stops
// (pipeline::JobController::RunLive), with `backfills` one after another beside it; their exit
// codes' worst goes to `backfill_rc`. While `backfill_running` (or those backfills) answers true,
// the live events of repos a crawl marked are held until their checkpoint (stages::LiveHold);
// `stop` receives the live job's stop reason.
// `added_backfills`: a group whose jobs (started while the consumer runs) are held and waited for
// as `backfills` are.
int RunLive(const AppConfig& config, OpenedState& st,
            std::function<bool()> backfill_running = nullptr, state::StopReason* stop = nullptr,
            std::vector<state::JobRecord> backfills = {}, int* backfill_rc = nullptr,
            pipeline::JobGroup* added_backfills = nullptr);

}  // namespace atfill::cli
