// What a crawl job keeps for people: a summary per PDS host (units queued, finished, failed, and
// records fetched) and the most recently fetched repos. Both are written with WriteBatch ops in
// the batch that commits the work they describe, so they stay exact across crashes: the host
// counters are commutative adds, the recent-repo entries overwrite a fixed ring of slots.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "state/kv_store.hpp"

namespace atfill::state {

struct HostSummary {
  std::string host;    // the PDS URL ("https://pds.example.com")
  uint64_t units = 0;  // units of this host that ended (done + errors)
  uint64_t done = 0;
  uint64_t errors = 0;
  uint64_t records = 0;
  bool operator==(const HostSummary&) const = default;
};

struct RecentRepo {
  uint64_t seq = 0;  // increasing per job; the ring keeps the newest `capacity`
  std::string did;
  std::string host;
  std::string rev;  // the repo's commit rev (getRepo) or empty
  uint64_t records = 0;
  std::string outcome;  // "ok" or the error kind
  int64_t fetched_at_us = 0;
  bool operator==(const RecentRepo&) const = default;
};

// Stateless over a KvStore it does not own; thread-safe as the store is.
// Layout (jobs family, job J as 8 big-endian bytes): "h"+J+host+"\0"+field -> counter;
// "r"+J+slot (8 bytes) -> entry.
class CrawlLog {
 public:
  explicit CrawlLog(KvStore& kv) : kv_(kv) {}

  // Adds the deltas to the host's counters (zero deltas write nothing).
  void AddHost(WriteBatch* batch, uint64_t job, std::string_view host, int64_t units, int64_t done,
               int64_t errors, int64_t records) const;
  // Every host of the job, sorted by host.
  Result<std::vector<HostSummary>> Hosts(uint64_t job);

  // Stores `repo` in slot repo.seq % capacity.
  void PutRecent(WriteBatch* batch, uint64_t job, const RecentRepo& repo, uint32_t capacity) const;
  // The job's recent repos, newest first.
  Result<std::vector<RecentRepo>> Recent(uint64_t job);
  // The largest seq stored (0 when none), to continue numbering after a restart.
  Result<uint64_t> LastRecentSeq(uint64_t job);
  // Deletes the job's recent repos (its per-repo details); the host summaries stay. Returns how
  // many entries were removed.
  Result<uint64_t> ClearRecent(uint64_t job);

 private:
  KvStore& kv_;
};

}  // namespace atfill::state
