// The crawl's discovery: the listings that name the repos to crawl (a relay's
// listReposByCollection per collection, a host's listRepos, or the DID list of an account
// backfill), each with its cursor in state.
//
// A listing page's DIDs are handed to the caller (QueueDid) in the same chunk as the cursor that
// follows the page (chunk state_writes), so a crash re-lists at most the pages whose units were
// never committed. A resumed job continues each listing from its saved cursor; a finished one is
// not listed again. A page that fails is asked again after retry_delay_ms; after unit_attempts
// failures in a row the listing stalls (the job then pauses with reason "unfinished_listing").
//
// Threading: one caller (the crawl's reading thread); pages() and retries() from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "net/http_client.hpp"
#include "pipeline/chunk.hpp"
#include "sources/crawl/options.hpp"
#include "state/cursors.hpp"

namespace atfill::sources {

// The cursor of one listing in the cursors family: "crawl/<job>/<listing>".
std::string CrawlCursorName(uint64_t job_id, std::string_view listing);

// `s`, cut to `n` characters and "..." when longer (for messages).
std::string Truncated(std::string_view s, size_t n = 200);

class RepoDiscovery {
 public:
  struct Listing {
    std::string name;  // collection, "listRepos" or "dids"
    std::string cursor;
    bool done = false;
    bool stalled = false;
    bool in_flight = false;
    bool answered = false;  // a page arrived in this run
    uint32_t attempts = 0;
    int64_t not_before_ms = 0;
    std::string last_error;
  };
  // A DID a listing names; `listed` is the collection of a per-collection listing, else empty.
  using QueueDid = std::function<Status(std::string_view did, std::string_view listed)>;
  // A listing page to request; its answer goes to HandleAnswer with `listing`.
  struct PageRequest {
    size_t listing = 0;
    net::HttpRequest request;
  };

  // `options` and `cursors` outlive the discovery.
  RepoDiscovery(const CrawlOptions* options, uint64_t job, state::Cursors* cursors);

  // The listings of the options, each from its saved cursor.
  Status Load();

  // Whether a listing is still to finish (neither done nor stalled).
  bool Active() const;
  // Whether a listing page is being requested.
  bool InFlight() const;
  const std::vector<Listing>& listings() const { return listings_; }

  // One step of the current listing when it may take one at `now_ms` and `has_room()` says the
  // crawl has room for more units: a DID list queues its next DIDs while there is room and
  // returns nothing; a listing returns the request of its next page.
  Result<std::optional<PageRequest>> Next(int64_t now_ms, const std::function<bool()>& has_room,
                                          const QueueDid& queue, pipeline::EventChunk* chunk);

  // The answer to a PageRequest. A page queues its active repos and moves the cursor; a failure
  // is tried again later or stalls the listing (an error in the chunk). Fails only when `queue`
  // does.
  Status HandleAnswer(size_t listing, Result<net::HttpResponse>& answer, int64_t now_ms,
                      const QueueDid& queue, pipeline::EventChunk* chunk);

  uint64_t pages() const { return pages_.load(std::memory_order_relaxed); }
  uint64_t retries() const { return retries_.load(std::memory_order_relaxed); }

 private:
  const CrawlOptions* const options_;
  const uint64_t job_;
  state::Cursors* const cursors_;
  std::vector<Listing> listings_;
  size_t index_ = 0;
  std::atomic<uint64_t> pages_{0}, retries_{0};
};

}  // namespace atfill::sources
