#include "sources/crawl/crawl_source.hpp"

#include <chrono>

#include "base/clock.hpp"
#include "net/endpoint.hpp"
#include "sources/crawl/crawl_impl.hpp"

namespace atfill::sources {

using pipeline::EventChunk;

std::string CrawlSource::ListingCursorName(uint64_t job_id, std::string_view listing) {
  return CrawlCursorName(job_id, listing);
}

namespace {

constexpr size_t kCheckpointResolutions = 100;
constexpr size_t kCheckpointFetches = 10;
constexpr size_t kMaxBytesPerChunk = size_t{16} << 20;
// max_active_units = 0: this many units resolving, ready or fetching per fetch slot, at most
// kMaxDefaultLookahead.
constexpr uint64_t kLookaheadPerSlot = 16;
constexpr uint64_t kMaxDefaultLookahead = 1'000'000;

// The scheduler's limits from the options (see the top of crawl_source.hpp).
HostSchedulerOptions SchedulerOptions(const CrawlOptions& o) {
  HostSchedulerOptions s;
  // The lookahead: by default kLookaheadPerSlot units per fetch slot, so the ready units pile up
  // on hosts (a host opens with several ready) rather than one or two on each of many hosts.
  const uint64_t fetch_slots = std::min<uint64_t>(
      static_cast<uint64_t>(o.http.max_in_flight),
      static_cast<uint64_t>(o.http.max_hosts) * static_cast<uint64_t>(o.http.max_per_host));
  s.max_active = o.max_active_units != 0
                     ? o.max_active_units
                     : std::min<uint64_t>(kLookaheadPerSlot * fetch_slots, kMaxDefaultLookahead);
  // Twice the PLC's per-host limit: while one resolution's answer waits for Read, another is
  // queued in the resolver's client to take its slot. did:web DIDs each have a host of their own.
  const int rmax = o.resolver_http.max_in_flight;
  s.max_resolving_plc =
      static_cast<size_t>(std::max(1, std::min(2 * o.resolver_http.max_per_host, rmax)));
  s.max_resolving_web =
      static_cast<size_t>(std::max(1, std::min(o.resolver_http.max_hosts - 1, rmax / 2)));
  s.max_hosts = o.http.max_hosts;
  s.max_per_host = o.http.max_per_host;
  s.max_in_flight = o.http.max_in_flight;
  if (o.discovery != Discovery::kDidList) {
    Result<std::string> relay = net::HostKey(o.relay_url);
    s.relay_host = relay.ok() ? *relay : o.relay_url;
  }
  return s;
}

}  // namespace

CrawlSource::Impl::Impl(CrawlOptions o, uint64_t j, state::KvStore* k)
    : options(std::move(o)),
      job(j),
      queue(*k),
      cursors(*k),
      log(*k),
      holds(*k),
      cache(*k),
      discovery(&options, j, &cursors),
      scheduler(SchedulerOptions(options)),
      decoder{&options, j, &log, &holds, &cursors} {}

std::vector<std::pair<std::string, std::string>> CrawlSource::Impl::UnitIds(
    std::string_view did, std::string_view listed) const {
  std::vector<std::pair<std::string, std::string>> out;  // (id, collection)
  if (options.mode == FetchMode::kGetRepo) {
    out.emplace_back(std::string(did), "");
  } else if (!listed.empty()) {
    out.emplace_back(std::string(did) + " " + std::string(listed), std::string(listed));
  } else {
    for (const auto& c : options.collections) out.emplace_back(std::string(did) + " " + c, c);
  }
  return out;
}

void CrawlSource::Impl::AddUnit(Unit u) {
  ids.insert(u.id);
  scheduler.Add(u.position, u.did);
  const uint64_t position = u.position;
  units.emplace(position, std::move(u));
}

Status CrawlSource::Impl::QueueDid(std::string_view did, std::string_view listed, EventChunk* chunk,
                                   uint64_t* queued) {
  if (!options.shard.Owns(did)) {
    ++other_shards;
    return Status::OK();
  }
  for (auto& [id, collection] : UnitIds(did, listed)) {
    if (ids.count(id) != 0) continue;
    ATFILL_ASSIGN_OR_RETURN(bool finished, queue.IsFinished(job, id));
    if (finished) continue;
    ATFILL_ASSIGN_OR_RETURN(auto pos, queue.Push(&chunk->state_writes, job, id, ""));
    if (!pos) continue;  // queued in a committed batch: the resume scan loads it
    if (options.hold_live) holds.MarkQueued(&chunk->state_writes, did);
    Unit u;
    u.position = *pos;
    u.id = std::move(id);
    u.did = std::string(did);
    u.collection = std::move(collection);
    AddUnit(std::move(u));
    ++*queued;
  }
  return Status::OK();
}

void CrawlSource::Impl::CountQueued(EventChunk* chunk, uint64_t queued) {
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

RepoDiscovery::QueueDid CrawlSource::Impl::Queuer(EventChunk* chunk, uint64_t* queued) {
  return [this, chunk, queued](std::string_view did, std::string_view listed) {
    return QueueDid(did, listed, chunk, queued);
  };
}

Status CrawlSource::Impl::StartDiscovery(EventChunk* chunk) {
  uint64_t queued = 0;
  ATFILL_ASSIGN_OR_RETURN(
      auto request, discovery.Next(
                        SteadyMs(), [this] { return HasRoom(); }, Queuer(chunk, &queued), chunk));
  CountQueued(chunk, queued);
  if (!request) return Status::OK();
  const uint64_t index = request->listing;
  http->Submit(std::move(request->request), [ch = channel, index](Result<net::HttpResponse> r) {
    Completion c;
    c.kind = Completion::kListing;
    c.unit = index;
    c.response.emplace(std::move(r));
    Deliver(*ch, std::move(c));
  });
  return Status::OK();
}

Status CrawlSource::Impl::HandleListing(Completion& c, EventChunk* chunk) {
  uint64_t queued = 0;
  ATFILL_RETURN_IF_ERROR(
      discovery.HandleAnswer(c.unit, *c.response, SteadyMs(), Queuer(chunk, &queued), chunk));
  CountQueued(chunk, queued);
  return Status::OK();
}

Status CrawlSource::Impl::LoadResumed() {
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
      AddUnit(std::move(u));
    }
    if (past_end) {
      resume_left = 0;
      break;
    }
  }
  return Status::OK();
}

bool CrawlSource::Impl::ListingSlotNeeded() const {
  if (options.discovery == Discovery::kDidList) return false;
  return discovery.InFlight() || (discovery.Active() && HasRoom());
}

void CrawlSource::Impl::StartUnits() {
  SchedulerRequests next = scheduler.Step(SteadyMs(), ListingSlotNeeded());
  for (std::string& did : next.resolve) {
    ++stats.resolutions;
    // A cache hit (or a DID refused before any request) completes inline, into the channel.
    resolver->Resolve(did, [ch = channel, did](ResolveOutcome outcome) {
      Completion c;
      c.kind = Completion::kResolved;
      c.did = did;
      c.outcome = std::move(outcome);
      Deliver(*ch, std::move(c));
    });
  }
  for (uint64_t pos : next.fetch) {
    auto it = units.find(pos);
    if (it != units.end()) SubmitFetch(it->second);
  }
}

void CrawlSource::Impl::SubmitFetch(Unit& u) {
  net::HttpRequest request;
  request.url =
      options.mode == FetchMode::kGetRepo
          ? GetRepoUrl(u.pds, u.did)
          : ListRecordsUrl(u.pds, u.did, u.collection, options.list_records_limit, u.page_cursor);
  if (stored && !u.whole) {
    // The rev a getRepo crawl of these collections (or more) last applied to the table: the
    // answer since then covers every change the table has not seen. None (a repo never crawled
    // so, whatever rows the live stream gave it), or no stored row left (a purge): the whole repo.
    u.stored.clear();
    u.since.clear();
    auto applied = cursors.Get(RepoRevCursor(u.did));
    const std::string since =
        applied.ok() && applied->has_value() ? RepoRevFor(**applied, options.collections) : "";
    if (!since.empty()) {
      auto rows = stored(u.did);
      if (rows.ok() && !rows->empty()) {
        u.since = since;
        u.stored = std::move(*rows);
        request.url += "&since=" + u.since;
      }
    }
  }
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

std::string CrawlSource::Impl::UnitKey(const Unit& u) const {
  return u.collection.empty() ? u.did : "at://" + u.did + "/" + u.collection;
}

CrawlSource::CrawlSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CrawlSource::~CrawlSource() {
  // Requests still running complete with Cancelled into the channel, which outlives nothing but
  // their callbacks.
  if (impl_->http) impl_->http->Shutdown();
  if (impl_->resolver_http) impl_->resolver_http->Shutdown();
}

Result<std::unique_ptr<CrawlSource>> CrawlSource::Create(
    CrawlOptions options, uint64_t job_id, state::KvStore* kv,
    std::function<Result<std::vector<pipeline::StoredRecord>>(const std::string& did)>
        stored_records) {
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
      std::make_unique<DidResolver>(impl->resolver_http.get(), &impl->cache, o.resolver);
  if (o.incremental && o.mode == FetchMode::kGetRepo) impl->stored = std::move(stored_records);
  return std::unique_ptr<CrawlSource>(new CrawlSource(std::move(impl)));
}

Status CrawlSource::Seek(const std::string& /*resume_cursor*/) {
  Impl& s = *impl_;
  ATFILL_RETURN_IF_ERROR(s.discovery.Load());
  ATFILL_ASSIGN_OR_RETURN(s.resume_upto, s.queue.LastPosition(s.job));
  ATFILL_ASSIGN_OR_RETURN(s.resume_left, s.queue.Recount(s.job));
  s.resume_scan = 0;
  ATFILL_ASSIGN_OR_RETURN(s.recent_seq, s.log.LastRecentSeq(s.job));
  return Status::OK();
}

Result<bool> CrawlSource::Read(EventChunk* chunk) {
  Impl& s = *impl_;
  chunk->resume_cursor = "crawl";
  chunk->payload.reset();  // a reused chunk whose answers were never decoded
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
           fetched < kCheckpointFetches && Impl::ResponseBytes(*chunk) < kMaxBytesPerChunk) {
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
    chunk->stage = s.discovery.Active() ? state::JobStage::kDiscovering
                                        : state::JobStage::kResolvingAndFetching;
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
  if (chunk->payload == nullptr) return;
  impl_->decoder.Decode(static_cast<const FetchedResponses&>(*chunk->payload), chunk);
  // The bodies are decoded: free them now rather than when the engine reuses the chunk.
  chunk->payload.reset();
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
  for (const auto& l : s.discovery.listings()) {
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
  s.listing_pages = impl_->discovery.pages();
  s.units_queued = a.units_queued;
  s.units_finished = a.units_finished;
  s.units_failed = a.units_failed;
  s.units_unavailable = a.units_unavailable;
  s.units_deferred = a.units_deferred;
  s.fetch_requests = a.fetch_requests;
  s.resolutions = a.resolutions;
  s.retries = a.retries + impl_->discovery.retries();
  return s;
}

net::HttpClientStats CrawlSource::http_stats() const { return impl_->http->stats(); }
net::HttpClientStats CrawlSource::resolver_http_stats() const {
  return impl_->resolver_http->stats();
}

}  // namespace atfill::sources
