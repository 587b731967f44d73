// The crawl source's private state, shared by crawl_source.cpp (discovery, scheduling, Read) and
// crawl_units.cpp (what a unit's resolution or fetch ends with: retries, deferral, finishing,
// live-hold marking and the crawl log). Not for use outside sources/crawl/.
#pragma once

#include "sources/crawl/crawl_source.hpp"

#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "base/clock.hpp"
#include "net/endpoint.hpp"
#include "net/xrpc_error.hpp"
#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"
#include "sources/crawl/discovery.hpp"
#include "sources/crawl/fetcher.hpp"
#include "sources/crawl/host_scheduler.hpp"
#include "sources/crawl/resolver.hpp"
#include "sources/crawl/responses.hpp"
#include "state/crawl_log.hpp"
#include "state/cursors.hpp"
#include "state/live_holds.hpp"
#include "state/resolver_cache.hpp"
#include "state/work_queue.hpp"

namespace atfill::sources {

struct CrawlSource::Impl {
  using EventChunk = pipeline::EventChunk;

  // What the I/O callbacks hand back to Read.
  struct Completion {
    enum Kind : uint8_t { kListing, kResolved, kFetched } kind = kListing;
    uint64_t unit = 0;  // queue position (kFetched) or listing index (kListing)
    std::string did;    // kResolved: the DID resolved (for every unit of it)
    std::optional<Result<net::HttpResponse>> response;
    ResolveOutcome outcome;
  };
  struct Channel {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Completion> items;
  };
  // Runs on an I/O thread: hands a completion to Read. The channel is shared with the
  // callbacks, so it outlives a source destroyed while requests are still completing.
  static void Deliver(Channel& ch, Completion c) {
    {
      std::lock_guard<std::mutex> lock(ch.mu);
      ch.items.push_back(std::move(c));
    }
    ch.cv.notify_one();
  }

  // A work unit in memory (waiting, delayed, or active in the scheduler).
  struct Unit {
    uint64_t position = 0;
    std::string id;
    std::string did;
    std::string collection;  // listRecords mode; empty for getRepo
    std::string pds;         // once resolved
    std::string signing_key;
    std::string page_cursor;
    uint64_t records = 0;
    uint32_t attempts = 0;
    // getRepo with CrawlOptions::incremental: the rev asked for (empty: the whole repo), the
    // stored records it is applied to, and whether the whole repo is wanted now.
    std::string since;
    std::vector<pipeline::StoredRecord> stored;
    bool whole = false;
  };

  CrawlOptions options;
  uint64_t job = 0;
  state::WorkQueue queue;
  state::Cursors cursors;
  state::CrawlLog log;
  state::LiveHolds holds;
  state::ResolverCache cache;
  std::unique_ptr<net::HttpClient> http;
  std::unique_ptr<net::HttpClient> resolver_http;
  std::unique_ptr<DidResolver> resolver;
  std::shared_ptr<Channel> channel = std::make_shared<Channel>();
  simdjson::ondemand::parser parser;
  RepoDiscovery discovery;
  HostScheduler scheduler;
  ResponseDecoder decoder;
  // The sink's records of a repo, for incremental fetches; unset otherwise.
  std::function<Result<std::vector<pipeline::StoredRecord>>(const std::string& did)> stored;

  std::unordered_map<uint64_t, Unit> units;  // in memory: waiting, delayed or active
  std::unordered_set<std::string> ids;       // ids of `units`
  std::deque<Completion> backlog;            // drained but not yet handled
  uint64_t resume_upto = 0;
  uint64_t resume_scan = 0;
  uint64_t resume_left = 0;
  uint64_t other_shards = 0;  // DIDs discovery skipped for another shard, not counted yet
  uint64_t recent_seq = 0;
  uint64_t deferred = 0;
  std::string last_deferred;
  // Chunks Read has returned (the seq the engine gives the next one), and the last committed.
  uint64_t chunks_returned = 0;
  std::atomic<int64_t> committed_seq{-1};
  // Units finished in chunks not yet committed: their ids stay in `ids` until then, so a listing
  // that names them again (getRepo units come from every collection's listing) does not queue
  // them a second time before IsFinished can see them.
  std::deque<std::pair<uint64_t, std::string>> finishing;

  struct AtomicStats {
    std::atomic<uint64_t> units_queued{0}, units_finished{0}, units_failed{0}, units_unavailable{0},
        units_deferred{0}, fetch_requests{0}, resolutions{0}, retries{0};
  } stats;

  Impl(CrawlOptions o, uint64_t j, state::KvStore* k);

  bool Finished() const {
    return !discovery.Active() && units.empty() && resume_left == 0 && backlog.empty() &&
           scheduler.active() == 0;
  }

  static bool HasContent(const EventChunk& c) {
    return c.payload != nullptr || !c.errors.empty() || !c.state_writes.empty() ||
           !c.counters.empty();
  }

  static FetchedResponses& Responses(EventChunk* chunk) {
    if (chunk->payload == nullptr) chunk->payload = std::make_shared<FetchedResponses>();
    return static_cast<FetchedResponses&>(*chunk->payload);
  }

  static size_t ResponseBytes(const EventChunk& chunk) {
    return chunk.payload == nullptr ? 0
                                    : static_cast<const FetchedResponses&>(*chunk.payload).bytes;
  }

  bool HasRoom() const { return units.size() + resume_left < options.discovery_window; }

  // ---- discovery ----

  // The units of a DID: one per DID for getRepo; for listRecords one per collection, or only
  // `listed` when a per-collection listing named the DID.
  std::vector<std::pair<std::string, std::string>> UnitIds(std::string_view did,
                                                           std::string_view listed) const;

  void AddUnit(Unit u);

  // Queues the units of one DID (those not queued, finished or in memory already); the pushes
  // go into the chunk's state writes.
  Status QueueDid(std::string_view did, std::string_view listed, EventChunk* chunk,
                  uint64_t* queued);

  void CountQueued(EventChunk* chunk, uint64_t queued);

  RepoDiscovery::QueueDid Queuer(EventChunk* chunk, uint64_t* queued);

  Status StartDiscovery(EventChunk* chunk);

  Status HandleListing(Completion& c, EventChunk* chunk);

  // ---- units ----

  Status LoadResumed();

  // Whether a listing request is running or may start soon: it shares the fetch client, so the
  // scheduler leaves it one slot of the relay's host and of the client's totals.
  bool ListingSlotNeeded() const;

  // Starts what the scheduler asks for: resolutions, then fetches.
  void StartUnits();

  void SubmitFetch(Unit& u);

  std::string UnitKey(const Unit& u) const;
  // The unit leaves the queue with this chunk's commit. `error_kind` empty = fetched;
  // `decode_reports` says whether the host counters and recent-repo entry are left to Decode (a
  // repo CAR).
  void FinishUnit(Unit& u, EventChunk* chunk, const std::string& error_kind,
                  const std::string& message, bool decode_reports);

  void ForgetCommittedFinishes();

  // A failure that may pass: try the unit again later, or leave it queued for the next run.
  void RetryOrDefer(Unit& u, EventChunk* chunk, const std::string& kind,
                    const std::string& message);

  // The outcome of one DID's resolution applies to every unit of it: a failure that may pass
  // retries (or defers) each, a final one finishes each; a success makes each ready.
  void HandleResolved(Completion& c, EventChunk* chunk);

  void HandleFetched(Completion& c, EventChunk* chunk);
};

}  // namespace atfill::sources
