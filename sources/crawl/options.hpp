// The crawl's options (CrawlOptions) and counters (CrawlStats), and the names of its discovery
// and fetch modes. How the crawl uses them: sources/crawl/crawl_source.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "net/http_client.hpp"
#include "pipeline/shard.hpp"
#include "sources/crawl/fetcher.hpp"
#include "sources/crawl/resolver.hpp"

namespace atfill::sources {

enum class Discovery : uint8_t {
  kListReposByCollection,  // a relay's com.atproto.sync.listReposByCollection, per collection
  kListRepos,              // com.atproto.sync.listRepos of a relay or a PDS (inactive skipped)
  kDidList,                // an account backfill: the DIDs given, no discovery
};
enum class FetchMode : uint8_t {
  kListRecords,  // com.atproto.repo.listRecords pages, one unit per (DID, collection)
  kGetRepo,      // com.atproto.sync.getRepo, one unit per DID, commit signature verified
};

std::string_view DiscoveryName(Discovery d);
std::string_view FetchModeName(FetchMode m);
Result<Discovery> ParseDiscovery(std::string_view text);  // "listReposByCollection"...
Result<FetchMode> ParseFetchMode(std::string_view text);  // "listRecords" | "getRepo"

struct CrawlOptions {
  Discovery discovery = Discovery::kListReposByCollection;
  FetchMode mode = FetchMode::kListRecords;
  // The relay (listReposByCollection) or the relay/PDS (listRepos) to list; http(s) URL.
  std::string relay_url;
  // The collections to backfill (NSIDs); at least one.
  std::vector<std::string> collections;
  // kDidList: the accounts to backfill.
  std::vector<std::string> dids;
  // Page sizes: listReposByCollection/listRepos (1..1000 on the reference servers) and
  // listRecords (1..100).
  uint32_t list_repos_limit = 1000;
  uint32_t list_records_limit = 100;
  // Discovery pauses while this many units are queued and unfinished; resumes as units finish.
  uint64_t discovery_window = 50'000;
  // Units resolving, resolved and waiting for a host slot, or fetching, at once: the scheduler's
  // lookahead (sources/crawl/host_scheduler.hpp). A resolution starts only while fewer are active.
  // The more there are, the more ready units each host gathers before it opens, so the more of its
  // max_per_host slots it fills; memory is no concern (queued units are in memory anyway, up to
  // discovery_window). 0 = 16 x the fetch slots of `http` (min(max_in_flight, max_hosts x
  // max_per_host)): 3,072 with the defaults.
  uint32_t max_active_units = 0;
  // Times a unit is tried in one run when it fails for a reason that may pass (transport
  // failures, 5xx, a host down). A unit out of tries stays queued: the job then pauses with
  // reason "unfinished_units", and resuming tries it again.
  uint32_t unit_attempts = 3;
  // Wait before a unit is tried again, milliseconds.
  int64_t retry_delay_ms = 2'000;
  // How long Read waits for a completion before it returns a tick chunk, milliseconds.
  int64_t tick_ms = 50;
  // Recently fetched repos the job keeps (a ring).
  uint32_t recent_repos = 1000;
  // Allow PDS, PLC and relay endpoints on loopback (simnet, tests, a local PDS)...
  bool allow_loopback_endpoints = false;
  // ...or on any non-public address (loopback, private, link-local...).
  bool allow_private_endpoints = false;
  // A live consumer runs beside the crawl: each repo queued is marked and each repo written
  // checkpointed (state::LiveHolds), so the consumer holds the repo's live events until then.
  bool hold_live = false;
  // This process's shard of the DID space (--shard i/n): discovery queues only the DIDs it owns
  // (counted in "repos_other_shards"), so nothing else of another shard is resolved or fetched.
  pipeline::Shard shard;
  // getRepo mode: each repo's applied rev is kept in state (RepoRevCursor), and a repo an earlier
  // crawl of these collections (or more) applied, with rows still stored, is fetched with
  // getRepo?since=<that rev> and the answer applied as a diff (creates, updates, deletes;
  // sources/crawl/repo_diff.hpp); the whole repo when the answer cannot settle it. Needs the
  // stored records (CrawlSource::Create's `stored_records`).
  bool incremental = false;
  FetchLimits limits;
  ResolverOptions resolver;
  // The fetch client (PDS hosts and the relay): per-host and host limits, retries, 429 cooldowns.
  net::HttpClientOptions http;
  // The resolver's client (the PLC directory is one host, so it gets its own per-host limit).
  net::HttpClientOptions resolver_http;

  CrawlOptions();
  Status Validate() const;
};

// Counters since construction (for benches and the progress view); safe from any thread.
struct CrawlStats {
  uint64_t listing_pages = 0;
  uint64_t units_queued = 0;
  uint64_t units_finished = 0;  // left the queue (records or a final error)
  uint64_t units_failed = 0;    // of which with a final error
  // of which the PDS reported the account deactivated, taken down, suspended or gone: an outcome,
  // not an error (logged as repo_unavailable)
  uint64_t units_unavailable = 0;
  uint64_t units_deferred = 0;  // out of tries this run; left queued
  uint64_t fetch_requests = 0;
  uint64_t resolutions = 0;
  uint64_t retries = 0;
};

}  // namespace atfill::sources
