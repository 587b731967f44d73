// The crawl verbs' entry points shared with `resume` and `run`.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/status.hpp"
#include "sources/crawl.hpp"
#include "state/job_store.hpp"

namespace atfill::cli {

// Runs backfill job `id` of the config's state again from its queue and cursors.
int ResumeBackfill(const std::string& config_path, uint64_t id);

struct AppConfig;
struct OpenedState;

// Runs backfill `job` (crawl or replay, as its parameters say) in the foreground to its end;
// returns the verb's exit code. `hold_live`: a live consumer runs beside it (stages::LiveHold).
int RunBackfillJob(const char* verb, const AppConfig& config, OpenedState& st, state::JobRecord job,
                   bool hold_live = false);

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

// The live consumer's cursor: "SEQ:TIME_US" of the last applied event.
inline constexpr const char* kLiveCursor = "live/jetstream";

// Runs the live consumer of the config ([live]) as the job "live" until it stops.
// While `backfill_running` answers true, the live events of repos a crawl marked are held until
// their checkpoint (stages::LiveHold); `stop` receives the live job's stop reason.
int RunLive(const AppConfig& config, OpenedState& st,
            std::function<bool()> backfill_running = nullptr, state::StopReason* stop = nullptr);

// Gap replays of a live consumer (JetstreamOptions::gap_replay): each CursorTooOld becomes a replay
// job of the stream's gap, (last seq, the archive's sealed tip], from [archive] url or dir, else
// the host's own archive (its ws:// address as http://), run on a thread of its own. The
// destructor waits for them.
class GapReplays {
 public:
  GapReplays(const AppConfig& config, OpenedState& st) : config_(config), st_(st) {}
  ~GapReplays();
  // Plans the gap (giving up after about 30 s), creates its job and starts it.
  Result<std::pair<uint64_t, uint64_t>> Start(uint64_t last_seq, const std::string& host);
  // Whether a gap replay was started by this process.
  bool started() const { return started_.load(); }
  // Whether a gap replay started by this process is still running.
  bool running() const { return running_.load() > 0; }
  // Whether a gap replay started by this process ended without completing (failed or paused).
  bool unfinished() const { return unfinished_.load(); }
  // Waits for every gap replay started to end.
  void Wait();

 private:
  const AppConfig& config_;
  OpenedState& st_;
  std::mutex mu_;
  std::vector<std::thread> threads_;
  std::atomic<bool> started_{false};
  std::atomic<int> running_{0};
  std::atomic<bool> unfinished_{false};
};

// The collections the unfinished backfill jobs of this state cover ("*" for one that fetches every
// collection); empty when none is unfinished.
Result<std::vector<std::string>> UnfinishedBackfillCollections(OpenedState& st);

}  // namespace atfill::cli
