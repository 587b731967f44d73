// Deterministic synthetic Jetstream v1 events with real CIDs and per-repo increasing revs: for
// tests, benchmarks and the simulated network. The same options give the same bytes.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "atproto/tid.hpp"
#include "base/status.hpp"

namespace atfill::gen {

struct EventGenOptions {
  // Seed of the pseudo-random choices.
  uint64_t seed = 1;
  // Accounts the events are spread over.
  uint32_t dids = 1000;
  // Collections (app.bsky.feed.post, app.bsky.feed.like, ...; at most 6).
  uint32_t collections = 3;
  // Approximate size of a record body, bytes.
  uint32_t body_bytes = 400;
  // Share of events that update an existing record, delete one, or are account events.
  double update_ratio = 0.1;
  double delete_ratio = 0.05;
  double account_ratio = 0.0;
  // Share of events that are malformed lines (bad JSON, bad DID, wrong CID).
  double bad_ratio = 0.0;
  // 1: each event's account is drawn at random (the order of a live stream or an archive).
  // N > 1: accounts take turns in runs of N consecutive events, in account order (the order of a
  // crawl, which fetches one repository after another).
  uint32_t run_length = 1;
  // Time of the first event, unix µs; each event is 100 µs later.
  int64_t start_time_us = 1'780'000'000'000'000;
  Status Validate() const;
};

class EventGenerator {
 public:
  explicit EventGenerator(EventGenOptions options);

  // The next event as one JSON line (no newline).
  std::string Next();

  // Writes `count` events, one per line, to `path` (zstd-compressed when `zstd`).
  static Status WriteFile(const EventGenOptions& options, uint64_t count, const std::string& path,
                          bool zstd = false);

 private:
  std::string Did(uint32_t index) const;
  std::string Body(const std::string& collection, int64_t time_us);
  std::string Commit(uint32_t did, const std::string& op, const std::string& collection,
                     const std::string& rkey, const std::string& body);

  EventGenOptions options_;
  std::mt19937_64 rng_;
  int64_t now_us_;
  uint64_t counter_ = 0;
  // Per account: its TID clock state and its live records (collection index, rkey).
  struct Account {
    int64_t last_us = 0;
    std::vector<std::pair<uint32_t, std::string>> live;
  };
  std::vector<Account> accounts_;
};

}  // namespace atfill::gen
