#include "sources/verify/verify_source.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "pipeline/job.hpp"
#include "sources/crawl/fetcher.hpp"
#include "sources/crawl/resolver.hpp"
#include "state/resolver_cache.hpp"

namespace atfill::sources {
namespace {

// What a repo's resolution and fetch ended with, handed from the I/O threads to Read.
struct Fetched {
  std::string did;
  std::string error_kind;  // empty on success
  std::string message;
  std::string signing_key;
  std::string car;
  bool resolved = false;  // the DID resolved (a failure, if any, came after)
};

struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Fetched> items;
};

void Deliver(Channel& ch, Fetched f) {
  {
    std::lock_guard<std::mutex> lock(ch.mu);
    ch.items.push_back(std::move(f));
  }
  ch.cv.notify_one();
}

std::string Uri(const std::string& did, const std::string& collection, const std::string& rkey) {
  return "at://" + did + "/" + collection + "/" + rkey;
}

// The start of a body for a message: printable ASCII, at most 200 bytes.
std::string Snippet(std::string_view body) {
  std::string out;
  for (char c : body.substr(0, 200)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

}  // namespace

Status VerifyOptions::Validate() const {
  if (repos_in_flight < 1 || repos_in_flight > 1024) {
    return Status::Invalid("verify: repos_in_flight must be 1..1024, not " +
                           std::to_string(repos_in_flight));
  }
  return Status::OK();
}

struct VerifySource::Impl {
  VerifyOptions options;
  pipeline::SinkReaders readers;
  state::ResolverCache cache;
  std::unique_ptr<net::HttpClient> http;
  std::unique_ptr<net::HttpClient> resolver_http;
  std::unique_ptr<DidResolver> resolver;
  std::shared_ptr<Channel> channel = std::make_shared<Channel>();

  std::string resume_after;  // the last DID a previous run committed
  bool listed = false;
  std::vector<std::string> todo;         // DIDs in byte order, after resume_after
  uint64_t done_before = 0;              // DIDs a previous run finished (at or before resume_after)
  size_t next_submit = 0;                // todo[next_submit] is the next to resolve
  size_t next_emit = 0;                  // todo[next_emit] is the next whose chunk Read returns
  std::map<std::string, Fetched> ready;  // fetched, waiting for their turn

  Impl(VerifyOptions o, pipeline::SinkReaders r, state::KvStore* kv)
      : options(std::move(o)), readers(std::move(r)), cache(*kv) {}

  Status List(pipeline::EventChunk* chunk);
  void Submit();
  void Fetch(const std::string& did, state::ResolvedDid doc);
  void Compare(Fetched f, pipeline::EventChunk* chunk);
};

void VerifySource::Impl::Submit() {
  while (next_submit < todo.size() && next_submit - next_emit < options.repos_in_flight) {
    const std::string did = todo[next_submit++];
    resolver->Resolve(did, [this, ch = channel, did](ResolveOutcome outcome) {
      if (!outcome.ok()) {
        Deliver(*ch, {did, outcome.error_kind.empty() ? "resolve_failed" : outcome.error_kind,
                      outcome.message, "", "", false});
        return;
      }
      // Runs on the resolver's loop thread or inline; Submit only queues the request. The
      // source outlives its callbacks: its destructor shuts both clients down first.
      Fetch(did, std::move(*outcome.doc));
    });
  }
}

void VerifySource::Impl::Fetch(const std::string& did, state::ResolvedDid doc) {
  net::HttpRequest request;
  request.url = GetRepoUrl(doc.pds_endpoint, did);
  http->Submit(std::move(request), [ch = channel, did, key = doc.signing_key,
                                    pds = doc.pds_endpoint](Result<net::HttpResponse> r) {
    Fetched f{did, "", "", key, "", true};
    if (!r.ok()) {
      f.error_kind = "fetch_failed";
      f.message = did + ": getRepo from " + pds + " failed: " + r.status().message();
    } else if (r->status != 200) {
      f.error_kind = "fetch_failed";
      f.message = did + ": getRepo from " + pds + " answered " + std::to_string(r->status) + ": " +
                  Snippet(r->body);
    } else {
      f.car = std::move(r->body);
    }
    Deliver(*ch, std::move(f));
  });
}

Status VerifySource::Impl::List(pipeline::EventChunk* chunk) {
  std::vector<std::string> dids = options.dids;
  if (dids.empty()) {
    if (!readers.dids) return Status::Unsupported("verify: the sink cannot list its accounts");
    ATFILL_ASSIGN_OR_RETURN(dids, readers.dids());
  }
  std::sort(dids.begin(), dids.end());
  dids.erase(std::unique(dids.begin(), dids.end()), dids.end());
  if (resume_after.empty()) {
    chunk->counters.emplace_back(pipeline::kTotalRepos, dids.size());
    // The progress view's measure: repos done of the repos to check.
    chunk->counters.emplace_back(pipeline::kInputTotal, dids.size());
  }
  for (auto& d : dids) {
    if (resume_after.empty() || d > resume_after) {
      todo.push_back(std::move(d));
    } else {
      ++done_before;
    }
  }
  listed = true;
  return Status::OK();
}

void VerifySource::Impl::Compare(Fetched f, pipeline::EventChunk* chunk) {
  const std::string& did = f.did;
  chunk->resume_cursor = did;
  chunk->units_read = 1;
  chunk->bytes_read = f.car.size();
  chunk->counters.emplace_back(pipeline::kProcessedRepos, 1);
  if (f.resolved) chunk->counters.emplace_back(pipeline::kResolvedRepos, 1);
  auto fail = [&](std::string kind, std::string message) {
    chunk->errors.push_back({std::move(kind), did, std::move(message)});
    chunk->counters.emplace_back(kVerifyReposFailed, 1);
  };
  if (!f.error_kind.empty()) return fail(f.error_kind, f.message);
  RepoFailure failure = RepoFailure::kNone;
  Result<RepoRecords> repo =
      ReadRepoRecords(did, f.signing_key, f.car, {}, options.net.limits, &failure);
  if (!repo.ok()) {
    return fail(failure == RepoFailure::kNone ? "bad_repo" : std::string(RepoFailureKind(failure)),
                repo.status().message());
  }
  Result<std::vector<pipeline::StoredRecord>> stored = readers.repo_records(did);
  if (!stored.ok()) {
    return fail("read_failed", did + ": reading the stored records: " + stored.status().message());
  }
  const std::vector<std::string>& wanted = options.collections;
  // The repo's records by (collection, rkey); records the CAR held but could not give are left
  // out with their error and not compared (neither missing nor extra).
  std::map<std::pair<std::string, std::string>, pipeline::RecordEvent*> theirs;
  for (pipeline::RecordEvent& r : repo->records) {
    if (pipeline::CollectionMatches(r.collection, wanted)) theirs[{r.collection, r.rkey}] = &r;
  }
  std::map<std::pair<std::string, std::string>, bool> unreadable;
  for (pipeline::EventError& e : repo->errors) {
    const std::string prefix = "at://" + did + "/";
    if (e.key.starts_with(prefix)) {
      const std::string rest = e.key.substr(prefix.size());
      const size_t slash = rest.find('/');
      if (slash != std::string::npos) {
        unreadable[{rest.substr(0, slash), rest.substr(slash + 1)}] = true;
      }
    }
    chunk->errors.push_back(std::move(e));
  }
  uint64_t missing = 0, extra = 0, different = 0, compared = 0;
  const std::string& rev = repo->rev;
  const std::string repaired = options.repair ? "; repaired" : "";
  for (const pipeline::StoredRecord& s : *stored) {
    if (!pipeline::CollectionMatches(s.collection, wanted)) continue;
    ++compared;
    const std::string uri = Uri(did, s.collection, s.rkey);
    auto it = theirs.find({s.collection, s.rkey});
    if (it == theirs.end()) {
      if (unreadable.count({s.collection, s.rkey})) continue;
      ++extra;
      chunk->errors.push_back({kVerifyExtra, uri,
                               "stored with cid " + s.cid + ", not in the repo at rev " + rev +
                                   " (commit " + repo->commit_cid + ")" + repaired});
      if (options.repair) {
        pipeline::RecordEvent del;
        del.did = did;
        del.collection = s.collection;
        del.rkey = s.rkey;
        del.operation = pipeline::Operation::kDelete;
        del.rev = rev;
        del.origin = pipeline::Origin::kCrawl;
        chunk->events.emplace_back(std::move(del));
      }
      continue;
    }
    pipeline::RecordEvent* r = it->second;
    theirs.erase(it);
    if (r->cid.ToString() == s.cid) continue;
    ++different;
    chunk->errors.push_back({kVerifyDifferent, uri,
                             "stored with cid " + s.cid + ", the repo at rev " + rev + " has " +
                                 r->cid.ToString() + repaired});
    if (options.repair) {
      r->operation = pipeline::Operation::kUpdate;
      chunk->events.emplace_back(std::move(*r));
    }
  }
  for (auto& [key, r] : theirs) {
    ++missing;
    chunk->errors.push_back({kVerifyMissing, Uri(did, key.first, key.second),
                             "in the repo at rev " + rev + " with cid " + r->cid.ToString() +
                                 ", not stored" + repaired});
    if (options.repair) chunk->events.emplace_back(std::move(*r));
  }
  compared += missing;
  chunk->counters.emplace_back(kVerifyReposChecked, 1);
  chunk->counters.emplace_back(kVerifyRecords, compared);
  if (missing) chunk->counters.emplace_back(kVerifyMissing, missing);
  if (extra) chunk->counters.emplace_back(kVerifyExtra, extra);
  if (different) chunk->counters.emplace_back(kVerifyDifferent, different);
  if (missing + extra + different > 0) chunk->counters.emplace_back(kVerifyReposDiffering, 1);
  if (!chunk->events.empty()) {
    chunk->counters.emplace_back(kVerifyRepairs, chunk->events.size());
  }
}

VerifySource::VerifySource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

VerifySource::~VerifySource() {
  // Requests still running complete with Cancelled; their callbacks (a resolution's starts a
  // fetch) must not outlive the clients, so the resolver's client goes first.
  if (impl_->resolver_http) impl_->resolver_http->Shutdown();
  if (impl_->http) impl_->http->Shutdown();
}

Result<std::unique_ptr<VerifySource>> VerifySource::Create(VerifyOptions options,
                                                           pipeline::SinkReaders readers,
                                                           state::KvStore* kv) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  if (!readers.repo_records || (options.dids.empty() && !readers.dids)) {
    return Status::Unsupported("verify: the sink cannot read back a repo's records");
  }
  CrawlOptions& net = options.net;
  const bool loopback = net.allow_loopback_endpoints || net.allow_private_endpoints;
  // The clients check the address they connect to; the resolver the endpoint a DID names.
  net.http.allow_private_addresses = loopback;
  net.resolver_http.allow_private_addresses = loopback;
  net.resolver.allow_loopback_endpoints = loopback;
  net.resolver.allow_private_endpoints = net.allow_private_endpoints;
  ATFILL_RETURN_IF_ERROR(net.resolver.Validate());
  auto impl = std::make_unique<Impl>(std::move(options), std::move(readers), kv);
  const CrawlOptions& o = impl->options.net;
  ATFILL_ASSIGN_OR_RETURN(impl->http, net::HttpClient::Start(o.http));
  ATFILL_ASSIGN_OR_RETURN(impl->resolver_http, net::HttpClient::Start(o.resolver_http));
  impl->resolver =
      std::make_unique<DidResolver>(impl->resolver_http.get(), &impl->cache, o.resolver);
  return std::unique_ptr<VerifySource>(new VerifySource(std::move(impl)));
}

Status VerifySource::Seek(const std::string& resume_cursor) {
  impl_->resume_after = resume_cursor;
  return Status::OK();
}

Result<bool> VerifySource::Read(pipeline::EventChunk* chunk) {
  Impl& s = *impl_;
  if (!s.listed) {
    ATFILL_RETURN_IF_ERROR(s.List(chunk));
    chunk->stage = state::JobStage::kResolvingAndFetching;
  }
  if (s.next_emit >= s.todo.size()) {
    if (!chunk->counters.empty()) {
      chunk->tick = true;
      chunk->resume_cursor = s.resume_after;
      return true;
    }
    return false;
  }
  s.Submit();
  const std::string& want = s.todo[s.next_emit];
  auto take = [&]() -> bool {
    std::vector<Fetched> items;
    {
      std::lock_guard<std::mutex> lock(s.channel->mu);
      items.swap(s.channel->items);
    }
    for (Fetched& f : items) s.ready[f.did] = std::move(f);
    return s.ready.count(want) > 0;
  };
  if (!take()) {
    std::unique_lock<std::mutex> lock(s.channel->mu);
    s.channel->cv.wait_for(lock, std::chrono::milliseconds(s.options.net.tick_ms),
                           [&] { return !s.channel->items.empty(); });
    lock.unlock();
    if (!take()) {
      chunk->tick = true;
      chunk->resume_cursor = s.next_emit == 0 ? s.resume_after : s.todo[s.next_emit - 1];
      return true;
    }
  }
  auto node = s.ready.extract(want);
  ++s.next_emit;
  s.Compare(std::move(node.mapped()), chunk);
  chunk->input_done = s.done_before + s.next_emit;
  return true;
}

std::string VerifySource::Describe() const {
  return std::string("verify") + (impl_->options.repair ? " and repair" : "") + " of " +
         (impl_->options.dids.empty() ? "every stored repo"
                                      : std::to_string(impl_->options.dids.size()) + " repo(s)");
}

}  // namespace atfill::sources
