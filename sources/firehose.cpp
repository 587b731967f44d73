#include "sources/firehose.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "atproto/crypto.hpp"
#include "atproto/syntax.hpp"
#include "base/patterns.hpp"
#include "base/strings.hpp"
#include "net/xrpc_error.hpp"
#include "pipeline/event.hpp"
#include "sources/firehose_chain.hpp"
#include "sources/firehose_frames.hpp"
#include "sources/live_stream.hpp"
#include "state/repo_chains.hpp"
#include "state/resolver_cache.hpp"

namespace atfill::sources {

namespace {

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t TimeUs(std::string_view rfc3339) {
  auto t = atproto::Datetime::Parse(rfc3339);
  return t.ok() ? t->unix_micros() : 0;
}

std::string FrameKey(int64_t seq, std::string_view did) {
  return "seq " + std::to_string(seq) + " " + std::string(did);
}

}  // namespace

Status FirehoseOptions::Validate() const {
  ATFILL_RETURN_IF_ERROR(ValidateLiveStreamOptions(*this, "firehose"));
  if (max_resyncs_in_flight == 0) {
    return Status::Invalid("live: max_resyncs_in_flight must be at least 1");
  }
  if (resync_retry_ms < 1) return Status::Invalid("live: resync_retry_ms must be at least 1");
  if (max_waiting_bytes == 0) return Status::Invalid("live: max_waiting_bytes must be at least 1");
  if (verify_threads < 1 || verify_threads > 64) {
    return Status::Invalid("live: verify_threads must be 1..64");
  }
  ATFILL_RETURN_IF_ERROR(resolver.Validate());
  return websocket.Validate();
}

struct FirehoseSource::Impl {
  // What the WebSocket handlers and the HTTP callbacks hand to Read; shared with them, as they
  // may outlive a source being destroyed.
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::string> queue;
    uint64_t queued_bytes = 0;
    bool stopped = true;
    bool reopen = false;  // the buffer overflowed: reconnect once drained
    std::vector<pipeline::EventError> errors;
    std::string host, last_error;
    // Completed resolutions and getRepo answers, and resyncs whose retry is due.
    std::deque<std::pair<std::string, ResolveOutcome>> resolved;
    std::deque<std::pair<std::string, Result<net::HttpResponse>>> repos;
    std::deque<std::string> retries;
    // The newest seq read: the cursor of a reconnection.
    std::atomic<uint64_t> last_seq{0};
    std::atomic<int64_t> last_message_ms{0};
    std::atomic<uint64_t> messages{0}, bytes{0}, connections{0}, connection_failures{0};
  };

  // What Read knows of an account: its key and its PDS.
  struct Known {
    atproto::PublicKey key;
    std::string signing_key;  // as the DID document states it
    std::string pds;
  };

  FirehoseOptions options;
  state::KvStore* kv = nullptr;
  std::unique_ptr<net::WebSocketClient> ws;
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  // Released in the reverse order: the resolver's callbacks need the cache and the client.
  std::unique_ptr<state::ResolverCache> cache;
  std::unique_ptr<net::HttpClient> http;
  std::unique_ptr<DidResolver> resolver;
  std::unique_ptr<state::RepoChains> chains;

  // The chain is read by Read and released by Committed (the sink thread).
  mutable std::mutex chain_mu;
  std::unique_ptr<FirehoseChain> chain;

  // A commit's verification, done ahead of its turn (Preverify).
  struct Verification {
    Status status;
    std::string kind;
    VerifiedCommit commit;  // views into the frame's blocks (a moved frame keeps its buffer)
  };

  // Read's own state (one thread).
  // This chunk's commits verified ahead, by seq.
  std::unordered_map<int64_t, Verification> preverified;
  uint64_t reads = 0;       // chunks returned (the engine numbers them the same way)
  int64_t read_seq = 0;     // the newest seq decoded
  int64_t cursor_seq = -1;  // the newest resume cursor written
  // The relay's time of the newest frame read (as sent) and of the cursor's frame, unix µs.
  std::string read_time;
  int64_t cursor_time_us = 0;
  std::unordered_map<std::string, Known> known;
  std::unordered_map<std::string, std::deque<FirehoseFrame>> waiting;  // for their key, in order
  std::multiset<int64_t> waiting_seqs;
  // What the waiting frames hold (HeldBytes), and the most they held at once.
  uint64_t waiting_bytes = 0;
  std::atomic<uint64_t> peak_waiting_bytes{0};
  bool paused_for_keys = false;
  std::unordered_set<std::string> resolving;
  std::unordered_set<std::string> desynced;  // awaiting a resync (queued, in flight or retrying)
  std::unordered_set<std::string> resync_queued, resync_inflight;
  std::deque<std::string> resync_queue;
  bool idle_exit = false;

  std::atomic<uint64_t> verified{0}, refused{0}, resyncs_started{0};

  std::string UrlFor(const std::string& host) const {
    std::string base = host;
    while (!base.empty() && base.back() == '/') base.pop_back();
    std::string url = base + "/xrpc/com.atproto.sync.subscribeRepos";
    const uint64_t seq = shared->last_seq.load();
    // Unset (0 with no start): the live tip.
    if (seq > 0 || options.start_seq > 0) url += "?cursor=" + std::to_string(seq);
    return url;
  }

  Status StartSession() {
    net::WebSocketHandlers handlers;
    std::shared_ptr<Shared> sh = shared;
    const uint64_t cap = options.max_buffered_bytes;
    net::WebSocketClient* client = ws.get();
    handlers.on_message = [sh, cap, client](std::string_view data, bool binary) {
      sh->messages.fetch_add(1);
      sh->bytes.fetch_add(data.size());
      sh->last_message_ms.store(SteadyMs());
      bool close = false;
      {
        std::lock_guard<std::mutex> lock(sh->mu);
        if (!binary) {
          sh->errors.push_back({"bad_frame", "message after seq " + std::to_string(sh->last_seq),
                                "a text message on a firehose (frames are binary DAG-CBOR)"});
          return;
        }
        sh->queued_bytes += data.size();
        sh->queue.emplace_back(data);
        close = sh->queued_bytes > cap && !sh->reopen;
        if (close) sh->reopen = true;
      }
      sh->cv.notify_one();
      if (close) client->Close();
    };
    handlers.on_event = [sh](const net::ConnectionEvent& e) {
      std::optional<pipeline::EventError> bad;
      switch (e.kind) {
        case net::ConnectionEventKind::kConnected:
          sh->connections.fetch_add(1);
          break;
        case net::ConnectionEventKind::kRefused: {
          const net::XrpcError x = net::ParseXrpcError(e.body);
          bad = pipeline::EventError{"connection_refused", e.host,
                                     "attempt " + std::to_string(e.attempt) + " to " + e.url +
                                         ": HTTP " + std::to_string(e.http_status) + " " + x.error +
                                         (x.message.empty() ? "" : ": " + x.message)};
          break;
        }
        case net::ConnectionEventKind::kFailed:
          bad = pipeline::EventError{
              e.connected_ms >= 0 ? "connection_lost" : "connection_failed", e.host,
              "attempt " + std::to_string(e.attempt) + " to " + e.url + ": " + e.error.message()};
          break;
        case net::ConnectionEventKind::kClosed:
          if (!e.closed_by_client && e.close_code != 1000) {
            bad = pipeline::EventError{"connection_closed", e.host,
                                       "the host closed the connection with code " +
                                           std::to_string(e.close_code) + " " + e.close_reason};
          }
          break;
        case net::ConnectionEventKind::kStopped:
          MarkSessionStopped(*sh);
          break;
      }
      std::lock_guard<std::mutex> lock(sh->mu);
      sh->host = e.host;
      if (bad) {
        if (e.retry_in_ms >= 0)
          bad->message += "; trying again in " + std::to_string(e.retry_in_ms) + " ms";
        sh->connection_failures.fetch_add(1);
        sh->last_error = bad->kind + ": " + bad->message;
        sh->errors.push_back(std::move(*bad));
      }
      return net::SessionAction::kContinue;
    };
    return StartLiveSession(
        *ws, *shared, options.hosts, [this](const std::string& host) { return UrlFor(host); },
        std::move(handlers));
  }

  // --- keys -------------------------------------------------------------------------------

  void Resolve(const std::string& did) {
    if (!resolving.insert(did).second) return;
    std::shared_ptr<Shared> sh = shared;
    resolver->Resolve(did, [sh, did](ResolveOutcome outcome) {
      {
        std::lock_guard<std::mutex> lock(sh->mu);
        sh->resolved.emplace_back(did, std::move(outcome));
      }
      sh->cv.notify_one();
    });
  }

  static bool NeedsKey(const FirehoseFrame& f) {
    return f.kind() == FirehoseKind::kCommit || f.kind() == FirehoseKind::kSync;
  }

  void Refuse(const FirehoseFrame& f, const std::string& kind, const std::string& message,
              pipeline::EventChunk* chunk) {
    refused.fetch_add(1);
    chunk->counters.emplace_back("firehose_refused", 1);
    chunk->counters.emplace_back("firehose_refused_" + kind, 1);
    chunk->errors.push_back({kind, FrameKey(f.seq(), f.did()),
                             std::string(FirehoseKindName(f.kind())) + " refused: " + message});
  }

  // A frame whose account's earlier frames are all judged. False when it needs a key not known
  // (the caller keeps it waiting and asks for the key).
  Result<bool> Handle(FirehoseFrame& f, pipeline::EventChunk* chunk) {
    const std::string did(f.did());
    const Known* k = nullptr;
    if (NeedsKey(f)) {
      auto it = known.find(did);
      if (it == known.end()) return false;
      k = &it->second;
    }
    bool resync = false;
    switch (f.kind()) {
      case FirehoseKind::kCommit: {
        auto& c = std::get<FirehoseCommit>(f.payload);
        if (c.too_big) {
          // Its blocks are incomplete by design: the repo is fetched whole instead.
          FirehoseSync s;
          s.seq = c.seq;
          s.did = c.repo;
          s.rev = c.rev;
          ATFILL_RETURN_IF_ERROR(chain->Sync(s, chunk, &resync));
          break;
        }
        Verification local;
        Verification* v = nullptr;
        if (auto pre = preverified.find(c.seq); pre != preverified.end()) {
          v = &pre->second;
        } else {
          local.status = VerifyFirehoseCommit(c, k->key, &local.commit, &local.kind);
          v = &local;
        }
        if (!v->status.ok()) {
          Refuse(f, v->kind.empty() ? "bad_commit" : v->kind, v->status.message(), chunk);
          return true;
        }
        verified.fetch_add(1);
        chunk->counters.emplace_back("firehose_verified", 1);
        ATFILL_RETURN_IF_ERROR(chain->Commit(c, v->commit, chunk, &resync));
        break;
      }
      case FirehoseKind::kSync: {
        auto& s = std::get<FirehoseSync>(f.payload);
        atproto::Commit commit;
        std::string kind;
        if (Status st = VerifyFirehoseSync(s, k->key, &commit, &kind); !st.ok()) {
          Refuse(f, kind.empty() ? "bad_commit" : kind, st.message(), chunk);
          return true;
        }
        ATFILL_RETURN_IF_ERROR(chain->Sync(s, chunk, &resync));
        break;
      }
      case FirehoseKind::kIdentity: {
        // The key or the PDS may have changed: resolve the account again when next needed.
        known.erase(did);
        state::ResolverCache(*kv).Remove(&chunk->state_writes, did);
        break;
      }
      case FirehoseKind::kAccount: {
        const auto& a = std::get<FirehoseAccount>(f.payload);
        pipeline::AccountEvent e;
        e.did = a.did;
        e.active = a.active;
        e.status = a.status.empty() ? (a.active ? pipeline::AccountStatus::kActive
                                                : pipeline::AccountStatus::kOther)
                                    : pipeline::ParseAccountStatus(a.status);
        e.seq = a.seq;
        e.time_us = TimeUs(a.time);
        e.position = static_cast<uint64_t>(a.seq);
        chunk->events.push_back(std::move(e));
        break;
      }
      case FirehoseKind::kInfo:
      case FirehoseKind::kError:
        break;
    }
    if (resync) WantResync(did);
    return true;
  }

  // Verifies the commits of `frames` whose turn will find their account's key as it is now (known,
  // nothing of the account waiting, no #identity of it earlier in the batch) on
  // options.verify_threads threads at once: the expensive part of a commit (signature, hashes,
  // MST inversion) depends on nothing but the frame and the key, so only the chain's judgement
  // stays serial.
  void Preverify(std::vector<FirehoseFrame>& frames) {
    preverified.clear();
    if (options.verify_threads <= 1) return;
    struct Job {
      const FirehoseCommit* commit;
      const atproto::PublicKey* key;
      Verification* out;
    };
    std::vector<Job> jobs;
    std::unordered_set<std::string_view> changed;
    for (FirehoseFrame& f : frames) {
      if (f.kind() == FirehoseKind::kIdentity) changed.insert(f.did());
      if (f.kind() != FirehoseKind::kCommit || f.seq() <= read_seq || !Wanted(f.did())) continue;
      const auto& c = std::get<FirehoseCommit>(f.payload);
      if (c.too_big || changed.contains(c.repo) || waiting.contains(c.repo)) continue;
      auto k = known.find(c.repo);
      if (k == known.end()) continue;
      jobs.push_back({&c, &k->second.key, &preverified[c.seq]});
    }
    if (jobs.size() < 2) {
      preverified.clear();
      return;
    }
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i = next.fetch_add(1); i < jobs.size(); i = next.fetch_add(1)) {
        Job& j = jobs[i];
        j.out->status = VerifyFirehoseCommit(*j.commit, *j.key, &j.out->commit, &j.out->kind);
      }
    };
    std::vector<std::thread> helpers;
    const size_t n = std::min<size_t>(options.verify_threads, jobs.size()) - 1;
    for (size_t i = 0; i < n; ++i) helpers.emplace_back(work);
    work();
    for (auto& t : helpers) t.join();
  }

  bool Wanted(std::string_view did) const {
    if (options.dids.empty()) return true;
    for (const auto& d : options.dids) {
      if (d == did) return true;
    }
    return false;
  }

  // The memory a waiting frame holds, roughly: its blocks and strings.
  static uint64_t HeldBytes(const FirehoseFrame& f) {
    constexpr uint64_t kFixed = 256;
    if (const auto* c = std::get_if<FirehoseCommit>(&f.payload)) {
      uint64_t n = kFixed + c->blocks.size() + c->repo.size() + c->rev.size() + c->time.size();
      for (const FirehoseOp& op : c->ops) n += sizeof(FirehoseOp) + op.path.size();
      return n;
    }
    if (const auto* y = std::get_if<FirehoseSync>(&f.payload)) {
      return kFixed + y->blocks.size() + y->did.size();
    }
    return kFixed;
  }

  void Hold(const std::string& did, FirehoseFrame f) {
    waiting_seqs.insert(f.seq());
    waiting_bytes += HeldBytes(f);
    if (waiting_bytes > peak_waiting_bytes.load()) peak_waiting_bytes = waiting_bytes;
    waiting[did].push_back(std::move(f));
  }

  void Unhold(const FirehoseFrame& f) {
    waiting_seqs.erase(waiting_seqs.find(f.seq()));
    waiting_bytes -= HeldBytes(f);
  }

  Status Dispatch(FirehoseFrame f, pipeline::EventChunk* chunk) {
    const std::string did(f.did());
    if (waiting.contains(did)) {
      Hold(did, std::move(f));
      return Status::OK();
    }
    ATFILL_ASSIGN_OR_RETURN(bool done, Handle(f, chunk));
    if (!done) {
      Hold(did, std::move(f));
      Resolve(did);
    }
    return Status::OK();
  }

  // The account's waiting frames, in order, as far as its key allows.
  Status Drain(const std::string& did, pipeline::EventChunk* chunk) {
    auto it = waiting.find(did);
    if (it == waiting.end()) return Status::OK();
    std::deque<FirehoseFrame>& q = it->second;
    while (!q.empty()) {
      ATFILL_ASSIGN_OR_RETURN(bool done, Handle(q.front(), chunk));
      if (!done) {
        Resolve(did);
        return Status::OK();
      }
      Unhold(q.front());
      q.pop_front();
    }
    waiting.erase(it);
    return Status::OK();
  }

  Status Resolved(const std::string& did, ResolveOutcome outcome, pipeline::EventChunk* chunk) {
    resolving.erase(did);
    std::string why;
    if (outcome.ok()) {
      const state::ResolvedDid& doc = *outcome.doc;
      auto key = atproto::PublicKey::FromMultibase(doc.signing_key);
      if (doc.signing_key.empty()) {
        why = "the DID document of " + did + " has no #atproto signing key";
      } else if (!key.ok()) {
        why = "the signing key of " + did + " does not parse: " + key.status().message();
      } else {
        known.insert_or_assign(did, Known{*key, doc.signing_key, doc.pds_endpoint});
      }
    } else {
      why = outcome.message;
    }
    if (!why.empty()) {
      // Nothing of the account can be verified: its frames that need the key are refused, the
      // rest still apply. The next frame of the account asks again.
      if (auto it = waiting.find(did); it != waiting.end()) {
        for (FirehoseFrame& f : it->second) {
          Unhold(f);
          if (NeedsKey(f)) {
            Refuse(f, "key_unresolved", why, chunk);
          } else {
            ATFILL_RETURN_IF_ERROR(Handle(f, chunk).status());
          }
        }
        waiting.erase(it);
      }
      if (resync_queued.erase(did) > 0) ResyncFailed(did, why, chunk);
      return Status::OK();
    }
    ATFILL_RETURN_IF_ERROR(Drain(did, chunk));
    return Status::OK();
  }

  // --- resyncs ----------------------------------------------------------------------------

  void WantResync(const std::string& did) {
    desynced.insert(did);
    if (resync_inflight.contains(did) || resync_queued.contains(did)) return;
    resync_queued.insert(did);
    resync_queue.push_back(did);
  }

  void ResyncFailed(const std::string& did, const std::string& why, pipeline::EventChunk* chunk) {
    chain->ResyncFailed(did, why, chunk);
    std::shared_ptr<Shared> sh = shared;
    http->After(options.resync_retry_ms, [sh, did] {
      {
        std::lock_guard<std::mutex> lock(sh->mu);
        sh->retries.push_back(did);
      }
      sh->cv.notify_one();
    });
  }

  void StartResyncs(pipeline::EventChunk* chunk) {
    size_t n = resync_queue.size();
    while (n-- > 0 && resync_inflight.size() < options.max_resyncs_in_flight) {
      std::string did = std::move(resync_queue.front());
      resync_queue.pop_front();
      if (!resync_queued.contains(did)) continue;  // given up meanwhile
      auto k = known.find(did);
      if (k == known.end()) {
        // Its PDS is not known yet: resolve first, then come back.
        resync_queue.push_back(did);
        Resolve(did);
        continue;
      }
      resync_queued.erase(did);
      resync_inflight.insert(did);
      resyncs_started.fetch_add(1);
      net::HttpRequest req;
      req.url = GetRepoUrl(k->second.pds, did);
      req.max_response_bytes = options.max_repo_bytes;
      std::shared_ptr<Shared> sh = shared;
      http->Submit(std::move(req), [sh, did](Result<net::HttpResponse> r) {
        {
          std::lock_guard<std::mutex> lock(sh->mu);
          sh->repos.emplace_back(did, std::move(r));
        }
        sh->cv.notify_one();
      });
    }
    (void)chunk;
  }

  Status RepoAnswered(const std::string& did, Result<net::HttpResponse> r,
                      pipeline::EventChunk* chunk) {
    resync_inflight.erase(did);
    std::string why;
    if (!r.ok()) {
      why = "getRepo of " + did + " failed: " + r.status().message();
    } else if (r->status != 200) {
      const net::XrpcError x = net::ParseXrpcError(r->body);
      why = "getRepo of " + did + " answered HTTP " + std::to_string(r->status) + " " + x.error +
            (x.message.empty() ? "" : ": " + x.message);
    }
    auto k = known.find(did);
    if (why.empty() && k == known.end()) why = "the signing key of " + did + " is not known";
    if (!why.empty()) {
      ResyncFailed(did, why, chunk);
      return Status::OK();
    }
    RepoFailure failure = RepoFailure::kNone;
    auto repo = ReadRepoRecords(did, k->second.signing_key, r->body, options.collections,
                                options.limits, &failure);
    if (!repo.ok()) {
      ResyncFailed(did, repo.status().message(), chunk);
      return Status::OK();
    }
    for (auto& e : repo->errors) chunk->errors.push_back(std::move(e));
    desynced.erase(did);
    FetchedRepo fetched{std::move(repo->rev), std::move(repo->data_cid), std::move(repo->records)};
    bool again = false;
    ATFILL_RETURN_IF_ERROR(chain->Resynced(did, std::move(fetched), chunk, &again));
    if (again) WantResync(did);
    return Status::OK();
  }
};

FirehoseSource::FirehoseSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FirehoseSource::~FirehoseSource() {
  if (impl_->ws) impl_->ws->Close();
  if (impl_->http) impl_->http->Shutdown();
}

Result<std::unique_ptr<FirehoseSource>> FirehoseSource::Create(FirehoseOptions options,
                                                               state::KvStore* kv) {
  // The hosts are the operator's (config), reached wherever they point.
  options.websocket.allow_private_addresses = true;
  options.websocket.max_message_bytes = options.max_message_bytes;
  ATFILL_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->kv = kv;
  impl->cache = std::make_unique<state::ResolverCache>(*kv);
  ATFILL_ASSIGN_OR_RETURN(impl->http, net::HttpClient::Start(impl->options.http));
  impl->resolver =
      std::make_unique<DidResolver>(impl->http.get(), impl->cache.get(), impl->options.resolver);
  impl->chains = std::make_unique<state::RepoChains>(*kv);
  FirehoseChainOptions co;
  co.collections = impl->options.collections;
  co.max_held_per_repo = impl->options.max_held_per_repo;
  impl->chain = std::make_unique<FirehoseChain>(impl->chains.get(), std::move(co));
  ATFILL_ASSIGN_OR_RETURN(impl->ws, net::WebSocketClient::Start(impl->options.websocket));
  return std::unique_ptr<FirehoseSource>(new FirehoseSource(std::move(impl)));
}

Status FirehoseSource::Seek(const std::string& resume_cursor) {
  Impl& s = *impl_;
  int64_t seq = 0;
  if (!resume_cursor.empty()) {
    try {
      // "<seq>:<time_us>" (the relay's time of that frame, for display), or "<seq>".
      size_t used = 0;
      seq = std::stoll(resume_cursor, &used);
      if (used < resume_cursor.size()) {
        if (resume_cursor[used] != ':') throw std::invalid_argument("");
        s.cursor_time_us = std::stoll(resume_cursor.substr(used + 1));
      }
      if (seq < 0) throw std::invalid_argument("");
    } catch (const std::exception&) {
      return Status::Corrupt("firehose cursor " + QuoteForMessage(resume_cursor) + " is not a seq");
    }
  } else if (s.options.start_seq > 0) {
    seq = static_cast<int64_t>(s.options.start_seq) - 1;  // the relay sends what follows it
  }
  s.read_seq = seq;
  s.cursor_seq = seq;
  s.shared->last_seq = static_cast<uint64_t>(seq);
  // Repos a previous run left desynchronized are fetched again.
  ATFILL_RETURN_IF_ERROR(
      s.chains->ScanDesynchronized([&](std::string_view did, const state::RepoChain&) {
        s.WantResync(std::string(did));
        return true;
      }));
  s.shared->last_message_ms = SteadyMs();
  return s.StartSession();
}

Result<bool> FirehoseSource::Read(pipeline::EventChunk* chunk) {
  Impl& s = *impl_;
  Impl::Shared& sh = *s.shared;
  std::deque<std::string> messages;
  std::deque<std::pair<std::string, ResolveOutcome>> resolved;
  std::deque<std::pair<std::string, Result<net::HttpResponse>>> repos;
  std::deque<std::string> retries;
  bool reconnect = false;
  // Frames waiting for keys hold max_waiting_bytes or more: no new message is taken until keys
  // arrive (or their resolution fails). The messages wait in the connection's buffer, whose own
  // bound drops the connection and resumes it later from the newest seq read, so nothing is lost.
  const bool paused = s.waiting_bytes >= s.options.max_waiting_bytes;
  if (paused && !s.paused_for_keys) chunk->counters.emplace_back("firehose_paused_for_keys", 1);
  s.paused_for_keys = paused;
  {
    std::unique_lock<std::mutex> lock(sh.mu);
    auto ready = [&] {
      return (!paused && !sh.queue.empty()) || !sh.resolved.empty() || !sh.repos.empty() ||
             !sh.retries.empty();
    };
    if (!ready()) sh.cv.wait_for(lock, std::chrono::milliseconds(s.options.tick_ms), ready);
    while (!paused && !sh.queue.empty() && messages.size() < s.options.chunk_messages) {
      sh.queued_bytes -= sh.queue.front().size();
      messages.push_back(std::move(sh.queue.front()));
      sh.queue.pop_front();
    }
    resolved.swap(sh.resolved);
    repos.swap(sh.repos);
    retries.swap(sh.retries);
    for (auto& e : sh.errors) {
      chunk->counters.emplace_back("live_connection_failures", 1);
      chunk->errors.push_back(std::move(e));
    }
    sh.errors.clear();
    reconnect = sh.reopen && sh.stopped && sh.queue.empty();
  }
  chunk->seq = s.reads;  // the engine numbers the chunks the same way; the chain needs it now
  const size_t n = messages.size();
  {
    std::lock_guard<std::mutex> lock(s.chain_mu);
    for (auto& [did, outcome] : resolved) {
      ATFILL_RETURN_IF_ERROR(s.Resolved(did, std::move(outcome), chunk));
    }
    for (auto& [did, r] : repos) ATFILL_RETURN_IF_ERROR(s.RepoAnswered(did, std::move(r), chunk));
    for (auto& did : retries) {
      if (s.desynced.contains(did)) s.WantResync(did);
    }
    std::vector<FirehoseFrame> frames;
    frames.reserve(messages.size());
    for (std::string& m : messages) {
      chunk->bytes_read += m.size();
      FirehoseFrame frame;
      std::string kind;
      if (Status st = DecodeFirehoseFrame(AsBytes(m), &frame, &kind); !st.ok()) {
        if (kind == "unknown_type") continue;  // a type this consumer does not know: skipped
        chunk->counters.emplace_back("firehose_bad_frames", 1);
        chunk->errors.push_back({kind.empty() ? "bad_frame" : kind,
                                 "message after seq " + std::to_string(s.read_seq), st.message()});
        ++chunk->dropped;
        continue;
      }
      frames.push_back(std::move(frame));
    }
    messages.clear();
    s.Preverify(frames);
    for (FirehoseFrame& frame : frames) {
      chunk->counters.emplace_back("firehose_frames", 1);
      if (frame.kind() == FirehoseKind::kInfo || frame.kind() == FirehoseKind::kError) {
        const bool info = frame.kind() == FirehoseKind::kInfo;
        const auto& name = info ? std::get<FirehoseInfo>(frame.payload).name
                                : std::get<FirehoseError>(frame.payload).name;
        const auto& message = info ? std::get<FirehoseInfo>(frame.payload).message
                                   : std::get<FirehoseError>(frame.payload).message;
        chunk->errors.push_back({info ? "relay_info" : "relay_error",
                                 "after seq " + std::to_string(s.read_seq),
                                 name + (message.empty() ? "" : ": " + message)});
        continue;
      }
      const int64_t seq = frame.seq();
      // A reconnection resumes from the newest seq read, so what was queued twice comes again.
      if (seq <= s.read_seq) continue;
      s.read_seq = seq;
      sh.last_seq = static_cast<uint64_t>(seq);
      s.read_time = std::visit(
          [](const auto& p) -> std::string {
            if constexpr (requires { p.time; }) {
              return p.time;
            } else {
              return {};
            }
          },
          frame.payload);
      if (!s.Wanted(frame.did())) continue;
      ATFILL_RETURN_IF_ERROR(s.Dispatch(std::move(frame), chunk));
    }
    s.preverified.clear();
    s.StartResyncs(chunk);
  }
  ++s.reads;
  chunk->units_read = n;
  // The applied watermark: frames still waiting for their key hold it back.
  const int64_t watermark = s.waiting_seqs.empty() ? s.read_seq : *s.waiting_seqs.begin() - 1;
  if (watermark > s.cursor_seq) {
    s.cursor_seq = watermark;
    // The time shown is the watermark frame's when it is the newest read, else the time of an
    // earlier cursor (never later than the watermark).
    if (watermark == s.read_seq) s.cursor_time_us = TimeUs(s.read_time);
    chunk->resume_cursor = std::to_string(watermark) + ":" + std::to_string(s.cursor_time_us);
  }
  if (reconnect) ATFILL_RETURN_IF_ERROR(s.StartSession());
  if (n == 0 && chunk->events.empty() && chunk->errors.empty() && chunk->counters.empty() &&
      chunk->state_writes.empty()) {
    const bool busy = !s.waiting.empty() || !s.resolving.empty() || !s.desynced.empty();
    if (s.options.idle_exit_ms > 0 && !busy &&
        SteadyMs() - sh.last_message_ms.load() >= s.options.idle_exit_ms) {
      s.idle_exit = true;
      return false;
    }
    chunk->tick = true;
  }
  return true;
}

std::string FirehoseSource::Describe() const {
  std::string d = "firehose";
  for (const auto& h : impl_->options.hosts) d += " " + h;
  return d;
}

state::StopReason FirehoseSource::Unfinished() const {
  if (!impl_->idle_exit) return {};
  return {"stream_idle", "no message for " + std::to_string(impl_->options.idle_exit_ms) +
                             " ms (live.idle_exit_ms); run again to continue from the cursor"};
}

void FirehoseSource::Committed(uint64_t through_seq) {
  std::lock_guard<std::mutex> lock(impl_->chain_mu);
  impl_->chain->Committed(through_seq);
}

FirehoseStats FirehoseSource::stats() const {
  const Impl& s = *impl_;
  FirehoseStats st;
  st.messages = s.shared->messages.load();
  st.bytes = s.shared->bytes.load();
  st.connections = s.shared->connections.load();
  st.connection_failures = s.shared->connection_failures.load();
  st.last_seq = s.shared->last_seq.load();
  st.verified = s.verified.load();
  st.refused = s.refused.load();
  st.resyncs_started = s.resyncs_started.load();
  st.peak_waiting_bytes = s.peak_waiting_bytes.load();
  {
    std::lock_guard<std::mutex> lock(s.chain_mu);
    st.desynchronized = s.chain->desynchronized();
  }
  std::lock_guard<std::mutex> lock(s.shared->mu);
  st.host = s.shared->host;
  st.last_error = s.shared->last_error;
  return st;
}

}  // namespace atfill::sources
