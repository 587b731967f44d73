// The crawl verbs' entry points shared with `resume` and `run`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.hpp"
#include "sources/crawl/crawl_source.hpp"
#include "state/job_store.hpp"

namespace atfill::cli {

struct AppConfig;
struct OpenedState;

// What a backfill asks for; empty fields take the config's ([crawl], [crawl] source).
struct BackfillTargets {
  std::vector<std::string> collections;
  std::vector<std::string> dids;  // non-empty: an account backfill of these DIDs
  std::string mode;               // listRecords | getRepo
  std::string discovery;          // listReposByCollection | listRepos | dids
  std::string relay;
  std::string source;  // crawl | auto | replay
};
// The crawl options and the source ("crawl" or "replay") a backfill of `targets` runs with;
// Invalid with the reason when the config cannot serve it.
Result<std::pair<sources::CrawlOptions, std::string>> PlanBackfill(const AppConfig& config,
                                                                   const BackfillTargets& targets);
// PlanBackfill, then the unfinished job with these targets or a new one, started by
// `started_by` ("cli", "api"...).
Result<state::JobRecord> CreateBackfill(const AppConfig& config, OpenedState& st,
                                        const BackfillTargets& targets,
                                        const std::string& started_by);
// The job that retries replay job `id`'s failed blocks (the unfinished one, or a new one):
// Unsupported when `id` is not a replay, NotFound when it has no failed block.
Result<state::JobRecord> CreateRetryJob(OpenedState& st, uint64_t id, const std::string& started_by,
                                        bool* resumed);

// Runs the live consumer of the config ([live]) as the job "live" until it stops
// (pipeline::JobController::RunLive), with `backfills` one after another beside it; their exit
// codes' worst goes to `backfill_rc`. While `backfill_running` (or those backfills) answers true,
// the live events of repos a crawl marked are held until their checkpoint (stages::LiveHold);
// `stop` receives the live job's stop reason.
int RunLive(const AppConfig& config, OpenedState& st,
            std::function<bool()> backfill_running = nullptr, state::StopReason* stop = nullptr,
            std::vector<state::JobRecord> backfills = {}, int* backfill_rc = nullptr);

}  // namespace atfill::cli
