#include "sources/crawl.hpp"

#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "atproto/syntax.hpp"
#include "base/strings.hpp"
#include "net/endpoint.hpp"
#include "net/xrpc_error.hpp"
#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"
#include "state/crawl_log.hpp"
#include "state/cursors.hpp"
#include "state/live_holds.hpp"
#include "state/resolver_cache.hpp"
#include "state/work_queue.hpp"

namespace atfill::sources {

using pipeline::EventChunk;
using pipeline::EventError;

std::string_view DiscoveryName(Discovery d) {
  switch (d) {
    case Discovery::kListReposByCollection:
      return "listReposByCollection";
    case Discovery::kListRepos:
      return "listRepos";
    case Discovery::kDidList:
      return "dids";
  }
  return "?";
}

std::string_view FetchModeName(FetchMode m) {
  return m == FetchMode::kGetRepo ? "getRepo" : "listRecords";
}

Result<Discovery> ParseDiscovery(std::string_view text) {
  for (Discovery d :
       {Discovery::kListReposByCollection, Discovery::kListRepos, Discovery::kDidList}) {
    if (text == DiscoveryName(d)) return d;
  }
  return Status::Invalid("unknown discovery " + QuoteForMessage(text) +
                         " (expected listReposByCollection, listRepos or dids)");
}

Result<FetchMode> ParseFetchMode(std::string_view text) {
  if (text == "listRecords") return FetchMode::kListRecords;
  if (text == "getRepo") return FetchMode::kGetRepo;
  return Status::Invalid("unknown fetch mode " + QuoteForMessage(text) +
                         " (expected listRecords or getRepo)");
}

CrawlOptions::CrawlOptions() {
  // More hosts than max_in_flight / max_per_host (64): a host fetching its last units empties its
  // slots one by one while it still counts as a host with transfers running, and with exactly 64
  // the other hosts could not take those slots over (the crawl bench's timeline: ~165 of the 192
  // slots busy with 64 hosts, ~178 with 96).
  http.max_hosts = 96;
  http.max_per_host = 3;
  resolver_http.max_hosts = 64;
  resolver_http.max_per_host = 32;
  resolver_http.max_in_flight = 256;
}

Status CrawlOptions::Validate() const {
  if (collections.empty()) return Status::Invalid("crawl: collections: at least one is needed");
  for (const auto& c : collections) {
    if (!atproto::Nsid::Parse(c).ok()) {
      return Status::Invalid("crawl: collections: " + QuoteForMessage(c) + " is not an NSID");
    }
  }
  if (discovery == Discovery::kDidList) {
    if (dids.empty()) return Status::Invalid("crawl: dids: an account backfill needs DIDs");
    for (const auto& d : dids) {
      if (!atproto::Did::Parse(d).ok()) {
        return Status::Invalid("crawl: dids: " + QuoteForMessage(d) + " is not a DID");
      }
    }
  } else if (relay_url.rfind("http://", 0) != 0 && relay_url.rfind("https://", 0) != 0) {
    return Status::Invalid("crawl: relay: " + QuoteForMessage(relay_url) +
                           " is not an http(s) URL");
  }
  auto range = [](const char* name, uint64_t v, uint64_t lo, uint64_t hi) {
    if (v < lo || v > hi) {
      return Status::Invalid(std::string("crawl: ") + name + ": " + std::to_string(v) +
                             " is out of range " + std::to_string(lo) + ".." + std::to_string(hi));
    }
    return Status::OK();
  };
  ATFILL_RETURN_IF_ERROR(range("list_repos_limit", list_repos_limit, 1, 1000));
  ATFILL_RETURN_IF_ERROR(range("list_records_limit", list_records_limit, 1, 100));
  ATFILL_RETURN_IF_ERROR(range("discovery_window", discovery_window, 1, 100'000'000));
  ATFILL_RETURN_IF_ERROR(range("max_active_units", max_active_units, 0, 1'000'000));
  ATFILL_RETURN_IF_ERROR(range("unit_attempts", unit_attempts, 1, 100));
  ATFILL_RETURN_IF_ERROR(range("retry_delay_ms",
                               static_cast<uint64_t>(std::max<int64_t>(retry_delay_ms, -1)), 0,
                               3'600'000));
  ATFILL_RETURN_IF_ERROR(
      range("tick_ms", static_cast<uint64_t>(std::max<int64_t>(tick_ms, 0)), 1, 60'000));
  ATFILL_RETURN_IF_ERROR(range("recent_repos", recent_repos, 1, 1'000'000));
  ATFILL_RETURN_IF_ERROR(resolver.Validate());
  ATFILL_RETURN_IF_ERROR(http.Validate());
  return resolver_http.Validate();
}

std::string CrawlSource::ListingCursorName(uint64_t job_id, std::string_view listing) {
  return "crawl/" + std::to_string(job_id) + "/" + std::string(listing);
}

namespace {

constexpr std::string_view kCursorDone = "done";
constexpr std::string_view kCursorNext = "next:";
constexpr size_t kCheckpointResolutions = 100;
constexpr size_t kCheckpointFetches = 10;
constexpr size_t kMaxRawPerChunk = size_t{16} << 20;
// max_active_units = 0: this many units resolving, ready or fetching per fetch slot, at most
// kMaxDefaultLookahead.
constexpr uint64_t kLookaheadPerSlot = 16;
constexpr uint64_t kMaxDefaultLookahead = 1'000'000;

// One response handed from Read to Decode inside chunk->raw:
//   u8 kind, u32 meta length, u32 body length, meta, body
// meta = did \n collection \n host \n signing key \n recent seq
enum FrameKind : uint8_t { kFramePage = 1, kFrameRepo = 2 };

void AppendU32(std::string* out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  out->append(b, 4);
}

uint32_t ReadU32(std::string_view in, size_t pos) {
  uint32_t v = 0;
  std::memcpy(&v, in.data() + pos, 4);
  return v;
}

struct FrameMeta {
  std::string_view did, collection, host, key;
  uint64_t recent_seq = 0;
};

void AppendFrame(std::string* raw, FrameKind kind, const FrameMeta& m, std::string_view body) {
  std::string meta;
  meta.reserve(m.did.size() + m.collection.size() + m.host.size() + m.key.size() + 24);
  meta.append(m.did).append("\n").append(m.collection).append("\n").append(m.host);
  meta.append("\n").append(m.key).append("\n").append(std::to_string(m.recent_seq));
  raw->push_back(static_cast<char>(kind));
  AppendU32(raw, static_cast<uint32_t>(meta.size()));
  AppendU32(raw, static_cast<uint32_t>(body.size()));
  raw->append(meta);
  raw->append(body);
}

FrameMeta SplitMeta(std::string_view meta) {
  FrameMeta m;
  std::string_view* parts[] = {&m.did, &m.collection, &m.host, &m.key};
  for (std::string_view* p : parts) {
    const size_t nl = meta.find('\n');
    *p = meta.substr(0, nl);
    meta = nl == std::string_view::npos ? std::string_view() : meta.substr(nl + 1);
  }
  uint64_t seq = 0;
  for (char c : meta) seq = seq * 10 + static_cast<uint64_t>(c - '0');
  m.recent_seq = seq;
  return m;
}

// The count of records and the cursor of a listRecords page, without building the records.
struct PageScan {
  bool ok = false;
  size_t count = 0;
  std::string cursor;
  std::string error;
};

PageScan ScanRecordsPage(simdjson::ondemand::parser& parser, std::string& body) {
  PageScan scan;
  body.reserve(body.size() + simdjson::SIMDJSON_PADDING);
  simdjson::padded_string_view view(body.data(), body.size(), body.capacity());
  simdjson::ondemand::document doc;
  if (parser.iterate(view).get(doc) != simdjson::SUCCESS) {
    scan.error = "the listRecords answer is not JSON";
    return scan;
  }
  simdjson::ondemand::object obj;
  if (doc.get_object().get(obj) != simdjson::SUCCESS) {
    scan.error = "the listRecords answer is not a JSON object";
    return scan;
  }
  bool has_records = false;
  for (auto field : obj) {
    std::string_view key;
    if (field.unescaped_key().get(key) != simdjson::SUCCESS) {
      scan.error = "the listRecords answer is not valid JSON";
      return scan;
    }
    if (key == "records") {
      simdjson::ondemand::array arr;
      if (field.value().get_array().get(arr) != simdjson::SUCCESS) {
        scan.error = "the listRecords answer's records is not an array";
        return scan;
      }
      size_t n = 0;
      if (arr.count_elements().get(n) != simdjson::SUCCESS) {
        scan.error = "the listRecords answer's records array is not valid JSON";
        return scan;
      }
      scan.count = n;
      has_records = true;
    } else if (key == "cursor") {
      std::string_view cursor;
      if (field.value().get_string().get(cursor) == simdjson::SUCCESS) {
        scan.cursor = std::string(cursor);
      }
    }
  }
  if (!has_records) {
    scan.error = "the listRecords answer has no records array";
    return scan;
  }
  scan.ok = true;
  return scan;
}

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Truncated(std::string_view s, size_t n = 200) {
  return s.size() <= n ? std::string(s) : std::string(s.substr(0, n)) + "...";
}

}  // namespace

struct CrawlSource::Impl {
  // What the I/O callbacks hand back to Read.
  struct Completion {
    enum Kind : uint8_t { kListing, kResolved, kFetched } kind = kListing;
    uint64_t unit = 0;  // queue position (kFetched) or listing index (kListing)
    std::string did;    // kResolved: the DID resolved (for every unit of it)
    std::optional<Result<net::HttpResponse>> response;
    stages::ResolveOutcome outcome;
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
  // Where a unit in memory is: waiting for its DID to be resolved, its DID resolving, resolved
  // and waiting in its host's ready queue, being fetched (holding one of its host's slots), or
  // waiting out a retry delay. Resolving, ready and fetching units are the `active` ones.
  enum class Stage : uint8_t { kWaiting, kResolving, kReady, kFetching, kDelayed };
  struct Unit {
    uint64_t position = 0;
    Stage stage = Stage::kWaiting;
    std::string host;  // the HostKey of `pds` (the fetch client's per-host key), once resolved
    std::string id;
    std::string did;
    std::string collection;  // listRecords mode; empty for getRepo
    std::string pds;
    std::string signing_key;
    std::string page_cursor;
    uint64_t records = 0;
    uint32_t attempts = 0;
  };

  CrawlOptions options;
  uint64_t job = 0;
  state::KvStore* kv = nullptr;
  state::WorkQueue queue;
  state::Cursors cursors;
  state::CrawlLog log;
  state::LiveHolds holds;
  state::ResolverCache cache;
  std::unique_ptr<net::HttpClient> http;
  std::unique_ptr<net::HttpClient> resolver_http;
  std::unique_ptr<stages::DidResolver> resolver;
  std::shared_ptr<Channel> channel = std::make_shared<Channel>();
  simdjson::ondemand::parser parser;

  std::vector<Listing> listings;
  size_t listing_index = 0;
  std::unordered_map<uint64_t, Unit> units;  // in memory: waiting, delayed or active
  std::unordered_set<std::string> ids;       // ids of `units`
  std::multimap<int64_t, uint64_t> delayed;  // steady ms -> position
  std::deque<Completion> backlog;            // drained but not yet handled
  size_t active = 0;                         // units resolving, ready or fetching
  uint32_t max_active = 0;

  // Resolution, once per DID for all of its units in memory. A DID waits in `waiting_plc` or
  // `waiting_web` (did:web DIDs go to hosts of their own on the resolver client, every other DID
  // to the PLC directory or fails before any request) until a resolution slot is free; units that
  // arrive while it waits or resolves join it.
  struct DidUnits {
    std::vector<uint64_t> units;
    bool resolving = false;
  };
  std::unordered_map<std::string, DidUnits> by_did;  // DIDs waiting or resolving
  std::deque<std::string> waiting_plc, waiting_web;  // DIDs to resolve, in arrival order
  size_t resolving_plc = 0, resolving_web = 0;
  size_t max_resolving_plc = 0, max_resolving_web = 0;

  // Fetching, host by host. Resolved units wait in their host's ready queue; at most
  // http.max_hosts hosts are open at once, each with at most http.max_per_host units fetching,
  // and at most http.max_in_flight in all (a slot less of each while a listing runs or may start),
  // so the fetch client never queues a fetch. A host that has nothing ready and nothing in flight
  // closes, and the closed host with the most ready units opens.
  struct HostSlots {
    std::deque<uint64_t> ready;  // positions
    int fetching = 0;
    bool open = false;
  };
  std::unordered_map<std::string, HostSlots> hosts;  // hosts with ready or fetching units
  // Closed hosts with ready units, by ready count, most first.
  std::set<std::pair<size_t, std::string>, std::greater<>> closed_ready;
  std::vector<std::string> open_hosts;
  size_t fetching = 0;     // units holding a host slot
  std::string relay_host;  // HostKey of relay_url (listings share the fetch client)
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
    std::atomic<uint64_t> listing_pages{0}, units_queued{0}, units_finished{0}, units_failed{0},
        units_deferred{0}, fetch_requests{0}, resolutions{0}, retries{0};
  } stats;

  Impl(CrawlOptions o, uint64_t j, state::KvStore* k)
      : options(std::move(o)),
        job(j),
        kv(k),
        queue(*k),
        cursors(*k),
        log(*k),
        holds(*k),
        cache(*k) {}

  bool Discovering() const {
    for (const auto& l : listings) {
      if (!l.done && !l.stalled) return true;
    }
    return false;
  }

  bool Finished() const {
    return !Discovering() && units.empty() && resume_left == 0 && backlog.empty() && active == 0;
  }

  static bool HasContent(const EventChunk& c) {
    return !c.raw.empty() || !c.errors.empty() || !c.state_writes.empty() || !c.counters.empty();
  }

  // ---- discovery ----

  // The units of a DID: one per DID for getRepo; for listRecords one per collection, or only
  // `listed` when a per-collection listing named the DID.
  std::vector<std::string> UnitIds(std::string_view did, std::string_view listed,
                                   std::vector<std::string>* collections) {
    std::vector<std::string> out;
    collections->clear();
    if (options.mode == FetchMode::kGetRepo) {
      out.emplace_back(did);
      collections->emplace_back();
    } else if (!listed.empty()) {
      out.push_back(std::string(did) + " " + std::string(listed));
      collections->emplace_back(listed);
    } else {
      for (const auto& c : options.collections) {
        out.push_back(std::string(did) + " " + c);
        collections->push_back(c);
      }
    }
    return out;
  }

  // Queues the units of one DID (those not queued, finished or in memory already); the pushes
  // go into the chunk's state writes.
  Status QueueDid(std::string_view did, std::string_view listed, EventChunk* chunk,
                  uint64_t* queued) {
    if (!options.shard.Owns(did)) {
      ++other_shards;
      return Status::OK();
    }
    std::vector<std::string> colls;
    std::vector<std::string> unit_ids = UnitIds(did, listed, &colls);
    for (size_t i = 0; i < unit_ids.size(); ++i) {
      const std::string& id = unit_ids[i];
      if (ids.count(id) != 0) continue;
      ATFILL_ASSIGN_OR_RETURN(bool finished, queue.IsFinished(job, id));
      if (finished) continue;
      ATFILL_ASSIGN_OR_RETURN(auto pos, queue.Push(&chunk->state_writes, job, id, ""));
      if (!pos) continue;  // queued in a committed batch: the resume scan loads it
      if (options.hold_live) holds.MarkQueued(&chunk->state_writes, did);
      Unit u;
      u.position = *pos;
      u.id = id;
      u.did = std::string(did);
      u.collection = colls[i];
      ids.insert(id);
      const uint64_t position = u.position;
      units.emplace(position, std::move(u));
      PushWaiting(units.at(position));
      ++*queued;
    }
    return Status::OK();
  }

  void CountQueued(EventChunk* chunk, uint64_t queued) {
    if (other_shards != 0) {
      chunk->counters.emplace_back("repos_other_shards", static_cast<int64_t>(other_shards));
      other_shards = 0;
    }
    if (queued == 0) return;
    chunk->counters.emplace_back("units_queued", static_cast<int64_t>(queued));
    chunk->counters.emplace_back(pipeline::kTotalRepos, static_cast<int64_t>(queued));
    chunk->counters.emplace_back(pipeline::kInputTotal, static_cast<int64_t>(queued));
    stats.units_queued += queued;
  }

  Status StartDiscovery(EventChunk* chunk) {
    while (listing_index < listings.size() &&
           (listings[listing_index].done || listings[listing_index].stalled)) {
      ++listing_index;
    }
    if (listing_index >= listings.size()) return Status::OK();
    Listing& l = listings[listing_index];
    if (l.in_flight || l.not_before_ms > SteadyMs()) return Status::OK();
    if (units.size() + resume_left >= options.discovery_window) return Status::OK();
    const std::string cursor_name = CrawlSource::ListingCursorName(job, l.name);
    if (options.discovery == Discovery::kDidList) {
      // The list is the listing: queue a window's worth at a time, the index as the cursor.
      size_t next = l.cursor.empty() ? 0 : std::stoull(l.cursor);
      uint64_t queued = 0;
      while (next < options.dids.size() && units.size() + resume_left < options.discovery_window) {
        ATFILL_RETURN_IF_ERROR(QueueDid(options.dids[next], "", chunk, &queued));
        ++next;
      }
      CountQueued(chunk, queued);
      if (next >= options.dids.size()) {
        l.done = true;
        cursors.Set(&chunk->state_writes, cursor_name, kCursorDone);
      } else {
        l.cursor = std::to_string(next);
        cursors.Set(&chunk->state_writes, cursor_name, std::string(kCursorNext) + l.cursor);
      }
      return Status::OK();
    }
    net::HttpRequest request;
    request.trusted_endpoint = true;  // [crawl] relay: the operator's, reached wherever it points
    request.url = options.discovery == Discovery::kListRepos
                      ? stages::ListReposUrl(options.relay_url, options.list_repos_limit, l.cursor)
                      : stages::ListReposByCollectionUrl(options.relay_url, l.name,
                                                         options.list_repos_limit, l.cursor);
    l.in_flight = true;
    const uint64_t index = listing_index;
    http->Submit(std::move(request), [ch = channel, index](Result<net::HttpResponse> r) {
      Completion c;
      c.kind = Completion::kListing;
      c.unit = index;
      c.response.emplace(std::move(r));
      Deliver(*ch, std::move(c));
    });
    return Status::OK();
  }

  Status HandleListing(Completion& c, EventChunk* chunk) {
    Listing& l = listings[c.unit];
    l.in_flight = false;
    Result<net::HttpResponse>& r = *c.response;
    std::string failure;
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kCancelled) return Status::OK();
      failure = r.status().message();
    } else if (r->status != 200) {
      const net::XrpcError e = net::ParseXrpcError(*r);
      failure = "HTTP " + std::to_string(r->status) + (e.error.empty() ? "" : " " + e.error) +
                (e.message.empty() ? "" : ": " + e.message);
    }
    if (failure.empty()) {
      auto page = options.discovery == Discovery::kListRepos
                      ? stages::ParseListRepos(r->body)
                      : stages::ParseListReposByCollection(r->body);
      if (!page.ok()) {
        failure = page.status().message();
      } else {
        ++stats.listing_pages;
        if (!l.answered) {
          // A listing that stalled in an earlier run answers now.
          chunk->resolved_errors.push_back({"listing_failed", l.name});
          l.answered = true;
        }
        l.attempts = 0;
        for (auto& e : page->errors) chunk->errors.push_back(std::move(e));
        uint64_t queued = 0, inactive = 0;
        for (const auto& repo : page->repos) {
          if (!repo.active) {
            ++inactive;
            continue;
          }
          const bool by_collection = options.discovery == Discovery::kListReposByCollection;
          ATFILL_RETURN_IF_ERROR(
              QueueDid(repo.did, by_collection ? std::string_view(l.name) : "", chunk, &queued));
        }
        CountQueued(chunk, queued);
        chunk->counters.emplace_back("repos_listed", static_cast<int64_t>(page->repos.size()));
        if (inactive != 0) {
          chunk->counters.emplace_back("repos_inactive_skipped", static_cast<int64_t>(inactive));
        }
        const std::string name = CrawlSource::ListingCursorName(job, l.name);
        if (page->cursor.empty() || page->repos.empty()) {
          l.done = true;
          cursors.Set(&chunk->state_writes, name, kCursorDone);
        } else {
          l.cursor = page->cursor;
          cursors.Set(&chunk->state_writes, name, std::string(kCursorNext) + l.cursor);
        }
        return Status::OK();
      }
    }
    // The listing is tried again after a delay; out of tries it stalls and the job pauses.
    l.last_error = failure;
    if (++l.attempts >= options.unit_attempts) {
      l.stalled = true;
      chunk->errors.push_back({"listing_failed", l.name,
                               "listing " + l.name + " at " + options.relay_url + " failed " +
                                   std::to_string(l.attempts) + " times: " + Truncated(failure)});
    } else {
      l.not_before_ms = SteadyMs() + options.retry_delay_ms;
      ++stats.retries;
    }
    return Status::OK();
  }

  // ---- units ----

  Status LoadResumed() {
    while (resume_left > 0 && units.size() < options.discovery_window) {
      const size_t want = std::min<uint64_t>(1024, options.discovery_window - units.size());
      ATFILL_ASSIGN_OR_RETURN(auto batch, queue.Pending(job, resume_scan, want));
      bool past_end = batch.empty();
      for (auto& w : batch) {
        if (w.position > resume_upto) {
          past_end = true;
          break;
        }
        resume_scan = w.position;
        if (resume_left > 0) --resume_left;
        if (ids.count(w.id) != 0) continue;
        Unit u;
        u.position = w.position;
        u.id = w.id;
        const size_t space = w.id.find(' ');
        u.did = w.id.substr(0, space);
        if (space != std::string::npos) u.collection = w.id.substr(space + 1);
        ids.insert(u.id);
        const uint64_t position = u.position;
        units.emplace(position, std::move(u));
        PushWaiting(units.at(position));
      }
      if (past_end) {
        resume_left = 0;
        break;
      }
    }
    return Status::OK();
  }

  // ---- the scheduler ----

  static bool IsDidWeb(std::string_view did) { return did.rfind("did:web:", 0) == 0; }

  // A unit to resolve: it joins its DID, waiting or resolving; a DID not seen yet waits in
  // arrival order.
  void PushWaiting(Unit& u) {
    auto [it, inserted] = by_did.try_emplace(u.did);
    it->second.units.push_back(u.position);
    if (it->second.resolving) {
      u.stage = Stage::kResolving;
      ++active;
      return;
    }
    u.stage = Stage::kWaiting;
    if (inserted) (IsDidWeb(u.did) ? waiting_web : waiting_plc).push_back(u.did);
  }

  // Starts the resolution of waiting DIDs while slots are free and the lookahead (max_active) has
  // room: up to max_resolving_plc PLC and max_resolving_web did:web resolutions at once.
  void StartResolutions(std::deque<std::string>& waiting, size_t& resolving, size_t limit) {
    while (resolving < limit && active < max_active && !waiting.empty()) {
      std::string did = std::move(waiting.front());
      waiting.pop_front();
      auto it = by_did.find(did);
      if (it == by_did.end()) continue;
      it->second.resolving = true;
      for (uint64_t pos : it->second.units) {
        units.at(pos).stage = Stage::kResolving;
        ++active;
      }
      ++resolving;
      ++stats.resolutions;
      // A cache hit (or a DID refused before any request) completes inline, into the channel.
      resolver->Resolve(did, [ch = channel, did](stages::ResolveOutcome outcome) {
        Completion c;
        c.kind = Completion::kResolved;
        c.did = did;
        c.outcome = std::move(outcome);
        Deliver(*ch, std::move(c));
      });
    }
  }

  // Whether a listing request is running or may start soon: it shares the fetch client, so the
  // scheduler leaves it one slot of the relay's host and of the client's totals.
  bool ListingSlotNeeded() const {
    if (options.discovery == Discovery::kDidList) return false;
    for (const auto& l : listings) {
      if (l.in_flight) return true;
    }
    return Discovering() && units.size() + resume_left < options.discovery_window;
  }

  void CloseHost(const std::string& key) {
    auto it = hosts.find(key);
    if (it == hosts.end()) return;
    it->second.open = false;
    if (it->second.ready.empty()) {
      hosts.erase(it);
    } else {
      closed_ready.emplace(it->second.ready.size(), key);
    }
  }

  // A resolved unit waits in its host's ready queue.
  void MakeReady(Unit& u) {
    u.stage = Stage::kReady;
    HostSlots& h = hosts[u.host];
    if (!h.open && !h.ready.empty()) closed_ready.erase({h.ready.size(), u.host});
    h.ready.push_back(u.position);
    if (!h.open) closed_ready.emplace(h.ready.size(), u.host);
  }

  // The unit no longer holds a host slot (it finished, failed or waits for a retry).
  void ReleaseSlot(Unit& u) {
    if (u.stage != Stage::kFetching) return;
    auto it = hosts.find(u.host);
    if (it != hosts.end()) --it->second.fetching;
    --fetching;
    u.stage = Stage::kDelayed;
  }

  // Submits the ready units of the open hosts as their slots allow, closes the hosts left with
  // nothing, and opens the closed hosts with the most ready units while host slots are free.
  void Dispatch() {
    const bool listing = ListingSlotNeeded();
    const auto max_total =
        static_cast<size_t>(std::max(1, options.http.max_in_flight - (listing ? 1 : 0)));
    auto host_limit = [&](const std::string& key) {
      return options.http.max_per_host - (listing && key == relay_host ? 1 : 0);
    };
    auto fill = [&](const std::string& key, HostSlots& h) {
      const int limit = host_limit(key);
      while (!h.ready.empty() && h.fetching < limit && fetching < max_total) {
        const uint64_t pos = h.ready.front();
        h.ready.pop_front();
        auto it = units.find(pos);
        if (it == units.end() || it->second.stage != Stage::kReady) continue;
        it->second.stage = Stage::kFetching;
        ++h.fetching;
        ++fetching;
        SubmitFetch(it->second);
      }
    };
    for (size_t i = 0; i < open_hosts.size();) {
      auto it = hosts.find(open_hosts[i]);
      if (it != hosts.end()) {
        fill(it->first, it->second);
        if (!it->second.ready.empty() || it->second.fetching > 0) {
          ++i;
          continue;
        }
      }
      CloseHost(open_hosts[i]);
      open_hosts[i] = std::move(open_hosts.back());
      open_hosts.pop_back();
    }
    // The relay's host takes a host slot of its own unless it is open as a PDS already.
    bool relay_open = false;
    if (listing) {
      auto it = hosts.find(relay_host);
      relay_open = it != hosts.end() && it->second.open;
    }
    const auto max_hosts =
        static_cast<size_t>(std::max(1, options.http.max_hosts - (listing && !relay_open ? 1 : 0)));
    std::vector<std::pair<size_t, std::string>> skipped;
    while (open_hosts.size() < max_hosts && fetching < max_total && !closed_ready.empty()) {
      auto top = closed_ready.begin();
      std::pair<size_t, std::string> entry = *top;
      closed_ready.erase(top);
      if (host_limit(entry.second) <= 0) {  // the relay's host with one slot, held by the listing
        skipped.push_back(std::move(entry));
        continue;
      }
      HostSlots& h = hosts[entry.second];
      h.open = true;
      open_hosts.push_back(entry.second);
      fill(entry.second, h);
    }
    for (auto& entry : skipped) closed_ready.insert(std::move(entry));
  }

  // Retry-delayed units whose time has come: a resolved one (its DID stays resolved) is ready
  // again for its host, one whose resolution failed resolves again. Then resolutions start and
  // fetches are dispatched.
  void StartUnits() {
    const int64_t now = SteadyMs();
    while (!delayed.empty() && delayed.begin()->first <= now) {
      const uint64_t pos = delayed.begin()->second;
      delayed.erase(delayed.begin());
      auto it = units.find(pos);
      if (it == units.end()) continue;
      Unit& u = it->second;
      if (!u.host.empty()) {
        ++active;
        MakeReady(u);
      } else {
        PushWaiting(u);
      }
    }
    StartResolutions(waiting_plc, resolving_plc, max_resolving_plc);
    StartResolutions(waiting_web, resolving_web, max_resolving_web);
    Dispatch();
  }

  void SubmitFetch(Unit& u) {
    net::HttpRequest request;
    request.url = options.mode == FetchMode::kGetRepo
                      ? stages::GetRepoUrl(u.pds, u.did)
                      : stages::ListRecordsUrl(u.pds, u.did, u.collection,
                                               options.list_records_limit, u.page_cursor);
    ++stats.fetch_requests;
    const uint64_t pos = u.position;
    http->Submit(std::move(request), [ch = channel, pos](Result<net::HttpResponse> r) {
      Completion c;
      c.kind = Completion::kFetched;
      c.unit = pos;
      c.response.emplace(std::move(r));
      Deliver(*ch, std::move(c));
    });
  }

  std::string UnitKey(const Unit& u) const {
    return u.collection.empty() ? u.did : "at://" + u.did + "/" + u.collection;
  }

  // The unit leaves the queue with this chunk's commit. `error_kind` empty = fetched; `counted`
  // says whether the host counters and recent-repo entry are left to Decode (a repo CAR).
  void FinishUnit(Unit& u, EventChunk* chunk, const std::string& error_kind,
                  const std::string& message, bool decode_reports) {
    queue.Finish(&chunk->state_writes, job, state::WorkUnit{u.position, u.id, ""});
    if (options.hold_live) holds.MarkFinished(&chunk->state_writes, u.did);
    chunk->counters.emplace_back("units_finished", 1);
    chunk->counters.emplace_back(pipeline::kProcessedRepos, 1);
    chunk->counters.emplace_back(pipeline::kInputDone, 1);
    ++stats.units_finished;
    // A unit an earlier run deferred has now reached its outcome (logged below if it is an
    // error): its deferral no longer stands. Only units queued before this run can have one, so
    // a fresh crawl asks the error log nothing.
    if (u.position <= resume_upto) chunk->resolved_errors.push_back({"unit_deferred", UnitKey(u)});
    if (!error_kind.empty()) {
      chunk->errors.push_back({error_kind, UnitKey(u), message});
      chunk->counters.emplace_back("units_failed", 1);
      ++stats.units_failed;
    }
    // A host's units are counted as they end (with done or errors; Decode adds those for a
    // repo CAR), so a unit that was resolved, then interrupted and resolved again after a
    // restart counts once.
    if (!u.pds.empty()) {
      log.AddHost(&chunk->state_writes, job, u.pds, 1,
                  !decode_reports && error_kind.empty() ? 1 : 0,
                  !decode_reports && !error_kind.empty() ? 1 : 0, 0);
    }
    if (!decode_reports) {
      state::RecentRepo recent;
      recent.seq = ++recent_seq;
      recent.did = u.did;
      recent.host = u.pds;
      recent.records = u.records;
      recent.outcome = error_kind.empty() ? "ok" : error_kind;
      recent.fetched_at_us = pipeline::NowMicros();
      log.PutRecent(&chunk->state_writes, job, recent, options.recent_repos);
    }
    ReleaseSlot(u);
    --active;
    finishing.emplace_back(chunks_returned, u.id);
    units.erase(u.position);
  }

  void ForgetCommittedFinishes() {
    const int64_t through = committed_seq.load(std::memory_order_acquire);
    while (!finishing.empty() && static_cast<int64_t>(finishing.front().first) <= through) {
      ids.erase(finishing.front().second);
      finishing.pop_front();
    }
  }

  // A failure that may pass: try the unit again later, or leave it queued for the next run.
  void RetryOrDefer(Unit& u, EventChunk* chunk, const std::string& kind,
                    const std::string& message) {
    ReleaseSlot(u);
    --active;
    u.stage = Stage::kDelayed;
    if (++u.attempts < options.unit_attempts) {
      ++stats.retries;
      delayed.emplace(SteadyMs() + options.retry_delay_ms, u.position);
      return;
    }
    ++deferred;
    ++stats.units_deferred;
    last_deferred = UnitKey(u) + ": " + message;
    chunk->errors.push_back({"unit_deferred", UnitKey(u),
                             kind + " after " + std::to_string(u.attempts) +
                                 " tries; the unit stays queued for the next run: " + message});
    chunk->counters.emplace_back("units_deferred", 1);
    units.erase(u.position);  // its id stays in `ids`: not queued twice in this run
  }

  // The outcome of one DID's resolution applies to every unit of it: a failure that may pass
  // retries (or defers) each, a final one finishes each; a success makes each ready.
  void HandleResolved(Completion& c, EventChunk* chunk) {
    --(IsDidWeb(c.did) ? resolving_web : resolving_plc);
    auto entry = by_did.find(c.did);
    if (entry == by_did.end()) return;
    const std::vector<uint64_t> group = std::move(entry->second.units);
    by_did.erase(entry);
    stages::ResolveOutcome& o = c.outcome;
    std::string host;
    if (o.ok()) {
      std::string pds = o.doc->pds_endpoint;
      while (!pds.empty() && pds.back() == '/') pds.pop_back();
      Result<std::string> key = net::HostKey(pds);
      host = key.ok() ? *key : pds;
      o.doc->pds_endpoint = std::move(pds);
    }
    int64_t ended = 0;  // units whose resolution ended: to a PDS or with a final error
    for (uint64_t pos : group) {
      auto it = units.find(pos);
      if (it == units.end()) continue;
      Unit& u = it->second;
      if (o.ok() || !o.retryable) ++ended;
      if (!o.ok()) {
        if (o.retryable) {
          RetryOrDefer(u, chunk, o.error_kind, o.message);
        } else {
          FinishUnit(u, chunk, o.error_kind, o.message, false);
        }
        continue;
      }
      u.pds = o.doc->pds_endpoint;
      u.signing_key = o.doc->signing_key;
      u.host = host;
      MakeReady(u);
    }
    if (ended != 0) chunk->counters.emplace_back(pipeline::kResolvedRepos, ended);
  }

  void HandleFetched(Completion& c, EventChunk* chunk) {
    auto it = units.find(c.unit);
    if (it == units.end()) return;
    Unit& u = it->second;
    Result<net::HttpResponse>& r = *c.response;
    if (!r.ok()) {
      const Status& s = r.status();
      switch (s.code()) {
        case StatusCode::kCancelled:
          ReleaseSlot(u);
          --active;
          return;
        case StatusCode::kInvalid:
          FinishUnit(u, chunk, "bad_endpoint",
                     "PDS " + u.pds + " of " + u.did + " refused: " + s.message(), false);
          return;
        case StatusCode::kResourceExhausted:
          FinishUnit(u, chunk, "response_too_large",
                     "PDS " + u.pds + " answer for " + u.did + ": " + s.message(), false);
          return;
        default:
          RetryOrDefer(u, chunk, "fetch_failed",
                       "PDS " + u.pds + " for " + u.did + ": " + s.message());
          return;
      }
    }
    net::HttpResponse& resp = *r;
    if (resp.status != 200) {
      const net::XrpcError e = net::ParseXrpcError(resp);
      const std::string what = "PDS " + u.pds + " answered HTTP " + std::to_string(resp.status) +
                               (e.error.empty() ? "" : " " + e.error) +
                               (e.message.empty() ? "" : " (" + Truncated(e.message) + ")") +
                               " for " + u.did;
      if (net::IsFinalXrpcError(resp.status, e)) {
        FinishUnit(u, chunk, "repo_unavailable", what, false);
      } else if (resp.status >= 400 && resp.status < 500 && resp.status != 408 &&
                 resp.status != 429 && u.attempts + 1 >= options.unit_attempts) {
        FinishUnit(u, chunk, "fetch_rejected", what, false);
      } else {
        RetryOrDefer(u, chunk, "fetch_failed", what);
      }
      return;
    }
    chunk->bytes_read += resp.body.size();
    if (options.mode == FetchMode::kGetRepo) {
      FrameMeta m{u.did, "", u.pds, u.signing_key, ++recent_seq};
      AppendFrame(&chunk->raw, kFrameRepo, m, resp.body);
      FinishUnit(u, chunk, "", "", true);
      return;
    }
    PageScan scan = ScanRecordsPage(parser, resp.body);
    if (!scan.ok) {
      FinishUnit(
          u, chunk, "bad_response",
          "PDS " + u.pds + " listRecords for " + u.did + " " + u.collection + ": " + scan.error,
          false);
      return;
    }
    u.records += scan.count;
    if (scan.count > 0) {
      FrameMeta m{u.did, u.collection, u.pds, "", 0};
      AppendFrame(&chunk->raw, kFramePage, m, resp.body);
    }
    if (scan.count == 0 || scan.cursor.empty() || scan.cursor == u.page_cursor) {
      FinishUnit(u, chunk, "", "", false);
      return;
    }
    u.page_cursor = std::move(scan.cursor);
    u.attempts = 0;
    SubmitFetch(u);
  }
};

CrawlSource::CrawlSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CrawlSource::~CrawlSource() {
  // Requests still running complete with Cancelled into the channel, which outlives nothing but
  // their callbacks.
  if (impl_->http) impl_->http->Shutdown();
  if (impl_->resolver_http) impl_->resolver_http->Shutdown();
}

Result<std::unique_ptr<CrawlSource>> CrawlSource::Create(CrawlOptions options, uint64_t job_id,
                                                         state::KvStore* kv) {
  const bool loopback = options.allow_loopback_endpoints || options.allow_private_endpoints;
  // The clients check the address they connect to; the resolver the endpoint a DID names.
  options.http.allow_private_addresses = loopback;
  options.resolver_http.allow_private_addresses = loopback;
  options.resolver.allow_loopback_endpoints = loopback;
  options.resolver.allow_private_endpoints = options.allow_private_endpoints;
  ATFILL_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>(std::move(options), job_id, kv);
  const CrawlOptions& o = impl->options;
  ATFILL_ASSIGN_OR_RETURN(impl->http, net::HttpClient::Start(o.http));
  ATFILL_ASSIGN_OR_RETURN(impl->resolver_http, net::HttpClient::Start(o.resolver_http));
  impl->resolver =
      std::make_unique<stages::DidResolver>(impl->resolver_http.get(), &impl->cache, o.resolver);
  // The lookahead: by default kLookaheadPerSlot units per fetch slot, so the ready units pile up
  // on hosts (a host opens with several ready) rather than one or two on each of many hosts.
  const uint64_t fetch_slots = std::min<uint64_t>(
      static_cast<uint64_t>(o.http.max_in_flight),
      static_cast<uint64_t>(o.http.max_hosts) * static_cast<uint64_t>(o.http.max_per_host));
  impl->max_active = o.max_active_units != 0
                         ? o.max_active_units
                         : static_cast<uint32_t>(std::min<uint64_t>(kLookaheadPerSlot * fetch_slots,
                                                                    kMaxDefaultLookahead));
  // Twice the PLC's per-host limit: while one resolution's answer waits for Read, another is
  // queued in the resolver's client to take its slot. did:web DIDs each have a host of their own.
  const int rmax = o.resolver_http.max_in_flight;
  impl->max_resolving_plc =
      static_cast<size_t>(std::max(1, std::min(2 * o.resolver_http.max_per_host, rmax)));
  impl->max_resolving_web =
      static_cast<size_t>(std::max(1, std::min(o.resolver_http.max_hosts - 1, rmax / 2)));
  if (o.discovery != Discovery::kDidList) {
    Result<std::string> relay = net::HostKey(o.relay_url);
    impl->relay_host = relay.ok() ? *relay : o.relay_url;
  }
  return std::unique_ptr<CrawlSource>(new CrawlSource(std::move(impl)));
}

Status CrawlSource::Seek(const std::string& /*resume_cursor*/) {
  Impl& s = *impl_;
  s.listings.clear();
  switch (s.options.discovery) {
    case Discovery::kListReposByCollection:
      for (const auto& c : s.options.collections) s.listings.emplace_back().name = c;
      break;
    case Discovery::kListRepos:
      s.listings.emplace_back().name = "listRepos";
      break;
    case Discovery::kDidList:
      s.listings.emplace_back().name = "dids";
      break;
  }
  for (auto& l : s.listings) {
    ATFILL_ASSIGN_OR_RETURN(auto saved, s.cursors.Get(ListingCursorName(s.job, l.name)));
    if (!saved) continue;
    if (*saved == kCursorDone) {
      l.done = true;
    } else if (saved->rfind(kCursorNext, 0) == 0) {
      l.cursor = saved->substr(kCursorNext.size());
    } else {
      return Status::Corrupt("crawl cursor " + ListingCursorName(s.job, l.name) + ": " +
                             QuoteForMessage(*saved) + " is not a listing cursor");
    }
  }
  ATFILL_ASSIGN_OR_RETURN(s.resume_upto, s.queue.LastPosition(s.job));
  ATFILL_ASSIGN_OR_RETURN(s.resume_left, s.queue.Recount(s.job));
  s.resume_scan = 0;
  ATFILL_ASSIGN_OR_RETURN(s.recent_seq, s.log.LastRecentSeq(s.job));
  return Status::OK();
}

Result<bool> CrawlSource::Read(EventChunk* chunk) {
  Impl& s = *impl_;
  chunk->resume_cursor = "crawl";
  s.ForgetCommittedFinishes();
  for (int round = 0;; ++round) {
    // Handle what completed, at most a chunk's worth.
    {
      std::lock_guard<std::mutex> lock(s.channel->mu);
      for (auto& c : s.channel->items) s.backlog.push_back(std::move(c));
      s.channel->items.clear();
    }
    // A chunk ends (and the engine checks for pause and cancel) after a listing page, 100
    // resolutions or 10 fetch answers, whichever comes first.
    size_t resolved = 0, fetched = 0;
    bool listed = false;
    while (!s.backlog.empty() && !listed && resolved < kCheckpointResolutions &&
           fetched < kCheckpointFetches && chunk->raw.size() < kMaxRawPerChunk) {
      Impl::Completion c = std::move(s.backlog.front());
      s.backlog.pop_front();
      switch (c.kind) {
        case Impl::Completion::kListing:
          ATFILL_RETURN_IF_ERROR(s.HandleListing(c, chunk));
          listed = true;
          break;
        case Impl::Completion::kResolved:
          s.HandleResolved(c, chunk);
          ++resolved;
          break;
        case Impl::Completion::kFetched:
          s.HandleFetched(c, chunk);
          ++fetched;
          break;
      }
    }
    ATFILL_RETURN_IF_ERROR(s.LoadResumed());
    ATFILL_RETURN_IF_ERROR(s.StartDiscovery(chunk));
    s.StartUnits();
    chunk->stage =
        s.Discovering() ? state::JobStage::kDiscovering : state::JobStage::kResolvingAndFetching;
    if (Impl::HasContent(*chunk)) {
      ++s.chunks_returned;
      return true;
    }
    if (s.Finished()) return false;
    if (round > 0) {
      chunk->tick = true;
      ++s.chunks_returned;
      return true;
    }
    std::unique_lock<std::mutex> lock(s.channel->mu);
    s.channel->cv.wait_for(lock, std::chrono::milliseconds(s.options.tick_ms),
                           [&] { return !s.channel->items.empty(); });
  }
}

void CrawlSource::Decode(EventChunk* chunk) const {
  const Impl& s = *impl_;
  std::string_view raw = chunk->raw;
  size_t pos = 0;
  while (pos + 9 <= raw.size()) {
    const auto kind = static_cast<FrameKind>(raw[pos]);
    const uint32_t meta_len = ReadU32(raw, pos + 1);
    const uint32_t body_len = ReadU32(raw, pos + 5);
    const FrameMeta m = SplitMeta(raw.substr(pos + 9, meta_len));
    const std::string_view body = raw.substr(pos + 9 + meta_len, body_len);
    pos += 9 + size_t{meta_len} + body_len;
    if (kind == kFramePage) {
      auto page = stages::ParseListRecordsPage(m.did, m.collection, body, s.options.limits);
      if (!page.ok()) {
        chunk->errors.push_back({"bad_response",
                                 "at://" + std::string(m.did) + "/" + std::string(m.collection),
                                 page.status().message()});
        s.log.AddHost(&chunk->state_writes, s.job, m.host, 0, 0, 1, 0);
        continue;
      }
      chunk->units_read += page->records.size() + page->errors.size();
      for (auto& e : page->errors) chunk->errors.push_back(std::move(e));
      s.log.AddHost(&chunk->state_writes, s.job, m.host, 0, 0, 0,
                    static_cast<int64_t>(page->records.size()));
      for (auto& rec : page->records) {
        rec.position = chunk->seq;
        chunk->events.emplace_back(std::move(rec));
      }
      continue;
    }
    // A repo CAR: all of its records, or none when it does not verify.
    state::RecentRepo recent;
    recent.seq = m.recent_seq;
    recent.did = std::string(m.did);
    recent.host = std::string(m.host);
    recent.fetched_at_us = pipeline::NowMicros();
    stages::RepoFailure failure = stages::RepoFailure::kNone;
    auto repo = stages::ReadRepoRecords(m.did, m.key, body, s.options.collections, s.options.limits,
                                        &failure);
    if (!repo.ok()) {
      std::string kind_name(stages::RepoFailureKind(failure));
      if (kind_name.empty()) kind_name = "bad_repo";
      chunk->errors.push_back({kind_name, std::string(m.did), repo.status().message()});
      chunk->counters.emplace_back("units_failed", 1);
      s.log.AddHost(&chunk->state_writes, s.job, m.host, 0, 0, 1, 0);
      recent.outcome = kind_name;
      s.log.PutRecent(&chunk->state_writes, s.job, recent, s.options.recent_repos);
      continue;
    }
    chunk->units_read += repo->records.size() + repo->errors.size();
    for (auto& e : repo->errors) chunk->errors.push_back(std::move(e));
    s.log.AddHost(&chunk->state_writes, s.job, m.host, 0, 1, 0,
                  static_cast<int64_t>(repo->records.size()));
    recent.rev = repo->rev;
    if (s.options.hold_live) s.holds.SetCheckpointRev(&chunk->state_writes, m.did, repo->rev);
    recent.records = repo->records.size();
    recent.outcome = "ok";
    s.log.PutRecent(&chunk->state_writes, s.job, recent, s.options.recent_repos);
    for (auto& rec : repo->records) {
      rec.position = chunk->seq;
      chunk->events.emplace_back(std::move(rec));
    }
  }
}

std::string CrawlSource::Describe() const {
  const CrawlOptions& o = impl_->options;
  std::string d = "crawl (" + std::string(DiscoveryName(o.discovery)) + ", " +
                  std::string(FetchModeName(o.mode)) + ")";
  if (o.discovery != Discovery::kDidList) d += " of " + o.relay_url;
  return d;
}

state::StopReason CrawlSource::Unfinished() const {
  const Impl& s = *impl_;
  for (const auto& l : s.listings) {
    if (l.stalled) {
      return {"unfinished_listing", "listing " + l.name + " at " + s.options.relay_url +
                                        " kept failing (" + Truncated(l.last_error) +
                                        "); resume the job to continue it"};
    }
  }
  if (s.deferred > 0) {
    return {"unfinished_units", std::to_string(s.deferred) +
                                    " unit(s) could not be fetched in this run and stay queued "
                                    "(last: " +
                                    Truncated(s.last_deferred) +
                                    "); resume the job to try them again"};
  }
  return {};
}

void CrawlSource::Committed(uint64_t through_seq) {
  impl_->committed_seq.store(static_cast<int64_t>(through_seq), std::memory_order_release);
}

CrawlStats CrawlSource::stats() const {
  const auto& a = impl_->stats;
  CrawlStats s;
  s.listing_pages = a.listing_pages;
  s.units_queued = a.units_queued;
  s.units_finished = a.units_finished;
  s.units_failed = a.units_failed;
  s.units_deferred = a.units_deferred;
  s.fetch_requests = a.fetch_requests;
  s.resolutions = a.resolutions;
  s.retries = a.retries;
  return s;
}

net::HttpClientStats CrawlSource::http_stats() const { return impl_->http->stats(); }
net::HttpClientStats CrawlSource::resolver_http_stats() const {
  return impl_->resolver_http->stats();
}

}  // namespace atfill::sources
