#include "tools/atfill/run_collections.hpp"

#include <cinttypes>
#include <csignal>
#include <cstdio>

#include "pipeline/components.hpp"
#include "tools/atfill/verb_backfill.hpp"

namespace atfill::cli {
namespace {

std::atomic<uint64_t> g_reloads{0};

extern "C" void OnReload(int) { g_reloads.fetch_add(1); }

// How often the watcher looks for a SIGHUP (a signal handler can only set the counter).
constexpr auto kReloadPoll = std::chrono::milliseconds(100);

std::string Names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

}  // namespace

void CatchReloadSignal() { std::signal(SIGHUP, OnReload); }

RuntimeCollections::RuntimeCollections(const AppConfig& config, OpenedState& st,
                                       std::function<void(state::JobRecord)> spawn)
    : config_(config), st_(st), spawn_(std::move(spawn)) {}

RuntimeCollections::~RuntimeCollections() { Stop(); }

Result<std::vector<std::string>> RuntimeCollections::Current() {
  ATFILL_ASSIGN_OR_RETURN(sources::LiveCollections * live,
                          sources::LiveCollectionsOf(EnvOf(config_, st_)));
  return live->Current();
}

Result<CollectionsOutcome> RuntimeCollections::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  sources::CollectionChange loaded;
  ATFILL_RETURN_IF_ERROR(sources::LiveCollectionsOf(EnvOf(config_, st_), &loaded).status());
  return Finish(std::move(loaded), true, "config");
}

Result<CollectionsOutcome> RuntimeCollections::Change(const std::vector<std::string>& add,
                                                      const std::vector<std::string>& remove,
                                                      bool backfill, bool purge,
                                                      const std::string& by) {
  std::lock_guard<std::mutex> lock(mu_);
  ATFILL_ASSIGN_OR_RETURN(sources::LiveCollections * live,
                          sources::LiveCollectionsOf(EnvOf(config_, st_)));
  ATFILL_ASSIGN_OR_RETURN(sources::CollectionChange change, live->Apply(add, remove));
  ATFILL_ASSIGN_OR_RETURN(CollectionsOutcome out, Finish(std::move(change), backfill, by));
  if (!purge || out.change.removed.empty()) return out;
  // Only once nothing received before the change can still land: the events of the removed
  // collections decoded from here on are dropped by the consumer.
  ATFILL_RETURN_IF_ERROR(
      live->WaitApplied(kPurgeWait)
          .WithContext("the collections were removed, but their rows were not purged"));
  const pipeline::SinkReaders sink = LauncherComponents().Readers(config_.settings);
  for (const auto& c : out.change.removed) {
    if (c.ends_with(".*")) continue;  // a prefix names no rows by itself
    ATFILL_ASSIGN_OR_RETURN(uint64_t n, sink.purge_collection(c));
    std::fprintf(stderr, "atfill run: purged %s: %" PRIu64 " row(s) deleted\n", c.c_str(), n);
    out.purged.emplace_back(c, n);
  }
  return out;
}

Result<CollectionsOutcome> RuntimeCollections::Finish(sources::CollectionChange change,
                                                      bool backfill, const std::string& by) {
  CollectionsOutcome out;
  out.change = std::move(change);
  if (!out.change.changed()) return out;
  std::fprintf(stderr, "atfill run: live collections changed (%s): added %s; removed %s; now %s\n",
               by.c_str(), Names(out.change.added).c_str(), Names(out.change.removed).c_str(),
               Names(out.change.now).c_str());
  if (!backfill || out.change.added.empty()) return out;
  sources::BackfillTargets targets;
  for (const auto& c : out.change.added) {
    (c.ends_with(".*") ? out.not_backfilled : targets.collections).push_back(c);
  }
  if (!out.not_backfilled.empty()) {
    std::fprintf(stderr, "atfill run: not backfilled (a backfill takes NSIDs, not prefixes): %s\n",
                 Names(out.not_backfilled).c_str());
  }
  if (targets.collections.empty()) return out;
  auto job = CreateBackfill(config_, st_, targets, by == "api" ? "api" : "run");
  if (!job.ok()) {
    // The filter changed (it is saved); the backfill can be started by hand.
    return job.status().WithContext("the collections changed, but their backfill did not start");
  }
  out.backfill_job = job->id;
  spawn_(std::move(*job));
  return out;
}

void RuntimeCollections::Reload() {
  auto fresh = LoadAppConfig(config_.path);
  if (!fresh.ok()) {
    std::fprintf(stderr, "atfill run: SIGHUP: the config was not reloaded: %s\n",
                 fresh.status().message().c_str());
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto live = sources::LiveCollectionsOf(EnvOf(config_, st_));
  Result<CollectionsOutcome> outcome = live.status();
  if (live.ok()) {
    auto change = (*live)->Reload(fresh->sources().live.collections);
    outcome = change.ok() ? Finish(std::move(*change), true, "SIGHUP")
                          : Result<CollectionsOutcome>(change.status());
  }
  if (!outcome.ok()) {
    std::fprintf(stderr, "atfill run: SIGHUP: [live] collections: %s\n",
                 outcome.status().message().c_str());
  } else if (!outcome->change.changed()) {
    std::fprintf(stderr,
                 "atfill run: SIGHUP: [live] collections unchanged (only they are applied while "
                 "atfill runs; other settings take effect at the next start)\n");
  }
}

void RuntimeCollections::WatchReloads() {
  CatchReloadSignal();
  watcher_ = std::thread([this] {
    uint64_t seen = g_reloads.load();
    std::unique_lock<std::mutex> lock(stop_mu_);
    while (!stopping_) {
      stop_cv_.wait_for(lock, kReloadPoll, [this] { return stopping_; });
      const uint64_t now = g_reloads.load();
      if (stopping_ || now == seen) continue;
      seen = now;
      lock.unlock();
      Reload();
      lock.lock();
    }
  });
}

void RuntimeCollections::Stop() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

}  // namespace atfill::cli
