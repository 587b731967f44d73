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
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "atproto/syntax.hpp"
#include "base/strings.hpp"
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
  http.max_hosts = 64;
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
    uint64_t unit = 0;  // queue position (kResolved, kFetched) or listing index (kListing)
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
    uint32_t attempts = 0;
    int64_t not_before_ms = 0;
    std::string last_error;
  };
  struct Unit {
    uint64_t position = 0;
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
  std::deque<uint64_t> waiting;
  std::multimap<int64_t, uint64_t> delayed;  // steady ms -> position
  std::deque<Completion> backlog;            // drained but not yet handled
  size_t active = 0;
  uint32_t max_active = 0;
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
      waiting.push_back(u.position);
      units.emplace(u.position, std::move(u));
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
        waiting.push_back(u.position);
        units.emplace(u.position, std::move(u));
      }
      if (past_end) {
        resume_left = 0;
        break;
      }
    }
    return Status::OK();
  }

  void StartUnits() {
    const int64_t now = SteadyMs();
    while (!delayed.empty() && delayed.begin()->first <= now) {
      waiting.push_back(delayed.begin()->second);
      delayed.erase(delayed.begin());
    }
    while (active < max_active && !waiting.empty()) {
      const uint64_t pos = waiting.front();
      waiting.pop_front();
      auto it = units.find(pos);
      if (it == units.end()) continue;
      ++active;
      ++stats.resolutions;
      resolver->Resolve(it->second.did, [ch = channel, pos](stages::ResolveOutcome outcome) {
        Completion c;
        c.kind = Completion::kResolved;
        c.unit = pos;
        c.outcome = std::move(outcome);
        Deliver(*ch, std::move(c));
      });
    }
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
    chunk->counters.emplace_back(pipeline::kInputDone, 1);
    ++stats.units_finished;
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
    --active;
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

  void HandleResolved(Completion& c, EventChunk* chunk) {
    auto it = units.find(c.unit);
    if (it == units.end()) return;
    Unit& u = it->second;
    stages::ResolveOutcome& o = c.outcome;
    if (!o.ok()) {
      if (o.retryable) {
        RetryOrDefer(u, chunk, o.error_kind, o.message);
      } else {
        FinishUnit(u, chunk, o.error_kind, o.message, false);
      }
      return;
    }
    u.pds = o.doc->pds_endpoint;
    while (!u.pds.empty() && u.pds.back() == '/') u.pds.pop_back();
    u.signing_key = o.doc->signing_key;
    SubmitFetch(u);
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
  impl->max_active = o.max_active_units != 0
                         ? o.max_active_units
                         : static_cast<uint32_t>(4 * o.http.max_hosts * o.http.max_per_host);
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
