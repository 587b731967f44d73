// The live consumer's collections changed while `atfill run` runs: over the admin API
// (POST /admin/collections), on SIGHUP (the config's [live] collections read again), and at start
// (a config edited while atfill was stopped). Each change reaches the running consumer
// (sources::LiveCollections) and, unless told otherwise, the collections it adds get a backfill
// job of their own, started beside the stream through `spawn` (their repos' live events are held
// until each repo is written, as for any backfill beside the stream).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/status.hpp"
#include "sources/live_collections.hpp"
#include "state/job_store.hpp"
#include "tools/atfill/app_config.hpp"

namespace atfill::cli {

struct CollectionsOutcome {
  sources::CollectionChange change;
  std::optional<uint64_t> backfill_job;     // the job backfilling change.added
  std::vector<std::string> not_backfilled;  // added prefixes ("app.bsky.*"): a crawl needs NSIDs
  std::vector<std::pair<std::string, uint64_t>> purged;  // removed collection, rows deleted
};

class RuntimeCollections {
 public:
  // `config`, `st` must outlive this object; `spawn` starts a backfill job beside the stream.
  RuntimeCollections(const AppConfig& config, OpenedState& st,
                     std::function<void(state::JobRecord)> spawn);
  // Stop().
  ~RuntimeCollections();

  // The set now (the saved one after the first call of anything here).
  Result<std::vector<std::string>> Current();
  // Adds and removes collections; with `backfill`, the added ones are backfilled; with `purge`,
  // the removed ones' rows are deleted once the consumer can no longer write any (waiting at most
  // kPurgeWait for what it received before the change to be committed).
  Result<CollectionsOutcome> Change(const std::vector<std::string>& add,
                                    const std::vector<std::string>& remove, bool backfill,
                                    bool purge, const std::string& by);
  static constexpr std::chrono::milliseconds kPurgeWait{30'000};
  // At start: applies what the config changed while atfill was stopped, and backfills it.
  Result<CollectionsOutcome> Start();
  // From here on, SIGHUP reloads the config's [live] collections (a thread of its own until
  // Stop).
  void WatchReloads();
  void Stop();

 private:
  Result<CollectionsOutcome> Finish(sources::CollectionChange change, bool backfill,
                                    const std::string& by);
  void Reload();

  const AppConfig& config_;
  OpenedState& st_;
  std::function<void(state::JobRecord)> spawn_;
  std::mutex mu_;  // one change at a time
  std::thread watcher_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
};

// SIGHUP from here on counts a reload request (RuntimeCollections::WatchReloads takes them).
void CatchReloadSignal();

}  // namespace atfill::cli
