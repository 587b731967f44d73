// The crawl: the default backfill. Discovers repos (a relay's listReposByCollection, a host's
// listRepos, or a given list of DIDs), queues one work unit per (DID, collection) or per DID,
// resolves each DID to its PDS and fetches its records (listRecords pages or one getRepo CAR),
// and hands the records to the engine. Resolution and fetching are pipelined with discovery.
//
// The pieces, in sources/crawl/:
// - discovery.hpp    the listings and their cursors;
// - host_scheduler.hpp  which DIDs resolve and which units fetch next (pure; its rules are there);
// - resolver.hpp     DID -> PDS endpoint and signing key, cached in state;
// - fetcher.hpp      the request URLs and the parsing of listings, pages and repo CARs;
// - responses.hpp    the answers a chunk carries from Read to Decode, and their decoding;
// - this source, which composes them: the work queue, retries and deferral, live-hold marking
//   and the crawl log.
//
// Resolution runs once per DID for all of its units in memory, up to 2 x
// resolver_http.max_per_host DIDs of the PLC and resolver_http.max_hosts - 1 did:web DIDs at once
// (capped by resolver_http's max_in_flight). A failure applies to every unit of the DID: retried
// (or deferred) when it may pass, finished with its error kind when final. Fetches use
// http.max_hosts hosts, http.max_per_host units each and http.max_in_flight in all, so the fetch
// client never queues one. A unit retried after a fetch failure goes back to its host's ready
// queue (its DID stays resolved); one retried after a resolution failure resolves again.
// max_active_units bounds the units resolving, ready or fetching at once (the lookahead); the
// rest of the queued units (up to discovery_window) wait unresolved.
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
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.hpp"
#include "net/http_client.hpp"
#include "pipeline/sink_readers.hpp"
#include "pipeline/source.hpp"
#include "sources/crawl/options.hpp"
#include "state/kv_store.hpp"

namespace atfill::sources {

class CrawlSource : public pipeline::Source {
 public:
  // `kv` holds the job's queue and cursors and must outlive the source. Starts the HTTP clients.
  // `stored_records` (the sink's SinkReaders::repo_records) is read for options.incremental.
  static Result<std::unique_ptr<CrawlSource>> Create(
      CrawlOptions options, uint64_t job_id, state::KvStore* kv,
      std::function<Result<std::vector<pipeline::StoredRecord>>(const std::string& did)>
          stored_records = nullptr);
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
