// The crawl: the default backfill. Discovers repos (a relay's listReposByCollection, a host's
// listRepos, or a given list of DIDs), queues one work unit per (DID, collection) or per DID,
// resolves each DID to its PDS and fetches its records (listRecords pages or one getRepo CAR),
// and hands the records to the engine. Resolution and fetching are pipelined with discovery.
//
// Scheduling (the fetch client serves at most http.max_hosts hosts at once, http.max_per_host
// requests each, so units picked in queue order from hundreds of hosts would leave most of its
// slots idle):
// - Resolution runs ahead of fetching, once per DID for all of the DID's units in memory (a DID
//   with two collections costs one resolution), up to 2 x resolver_http.max_per_host DIDs of the
//   PLC and resolver_http.max_hosts - 1 did:web DIDs at once (capped by resolver_http's
//   max_in_flight). A failure applies to every unit of the DID: retried (or deferred) when it may
//   pass, finished with its error kind when final.
// - Resolved units wait in a ready queue per PDS host (its net::HostKey). At most http.max_hosts
//   hosts are open at once, each with at most http.max_per_host units fetching, and at most
//   http.max_in_flight units fetch in all; while a listing runs or may start (it shares the fetch
//   client) one slot of the relay's host and one of the totals are left to it. So the client
//   never queues a fetch. A unit keeps its host slot while it pages through listRecords. A host
//   with nothing ready and nothing in flight closes; the closed host with the most ready units
//   opens in its place.
// - A unit retried after a fetch failure goes back to its host's ready queue (its DID stays
//   resolved); one retried after a resolution failure resolves again.
// - max_active_units bounds the units resolving, ready or fetching at once (the lookahead); the
//   rest of the queued units (up to discovery_window) wait unresolved.
//
// State and the delivery guarantee:
// - A listing page's units are pushed to the job's work queue in the same state write as the
//   listing cursor that follows the page (chunk state_writes), so a crash re-lists at most the
//   pages whose units were never committed.
// - A unit leaves the queue (WorkQueue::Finish) in the state write of the batch that holds its
//   last records, after the sink made them durable. A crash refetches the units that had not
//   left the queue; the sink's idempotent writes make the table exact.
// - A resumed job reloads the queued units and the listing cursors; finished units are never
//   fetched again.
//
// Threading: the engine calls Read/Seek on one thread. Network I/O runs on the HttpClients' loop
// threads; their callbacks only append to a completion list that Read drains (waiting at most
// tick_ms for one, then returning a tick chunk so batches flush on time). Decode (parallel, on
// the engine's workers) parses listRecords pages and reads and verifies repo CARs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "net/http_client.hpp"
#include "pipeline/shard.hpp"
#include "pipeline/source.hpp"
#include "stages/fetcher.hpp"
#include "stages/resolver.hpp"
#include "state/kv_store.hpp"

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
  // lookahead (see the top of the file). A resolution starts only while fewer are active. The
  // more there are, the more ready units each host gathers before it opens, so the more of its
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
  stages::FetchLimits limits;
  stages::ResolverOptions resolver;
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
  uint64_t units_deferred = 0;  // out of tries this run; left queued
  uint64_t fetch_requests = 0;
  uint64_t resolutions = 0;
  uint64_t retries = 0;
};

class CrawlSource : public pipeline::Source {
 public:
  // `kv` holds the job's queue and cursors and must outlive the source. Starts the HTTP clients.
  static Result<std::unique_ptr<CrawlSource>> Create(CrawlOptions options, uint64_t job_id,
                                                     state::KvStore* kv);
  ~CrawlSource() override;

  Status Seek(const std::string& resume_cursor) override;
  Result<bool> Read(pipeline::EventChunk* chunk) override;
  void Decode(pipeline::EventChunk* chunk) const override;
  std::string Describe() const override;
  state::StopReason Unfinished() const override;
  void Committed(uint64_t through_seq) override;

  CrawlStats stats() const;
  net::HttpClientStats http_stats() const;
  net::HttpClientStats resolver_http_stats() const;

  // Cursor names in the cursors family: the listing of one collection ("crawl/<job>/<nsid>"),
  // of listRepos ("crawl/<job>/listRepos") and of the DID list ("crawl/<job>/dids").
  static std::string ListingCursorName(uint64_t job_id, std::string_view listing);

 private:
  struct Impl;
  explicit CrawlSource(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace atfill::sources
