#include "sources/firehose/firehose.hpp"

#include <chrono>

#include "atproto/syntax.hpp"
#include "base/clock.hpp"
#include "base/strings.hpp"
#include "net/xrpc_error.hpp"
#include "pipeline/event.hpp"
#include "sources/firehose/firehose_impl.hpp"
#include "sources/live_stream.hpp"

namespace atfill::sources {

namespace {

int64_t TimeUs(std::string_view rfc3339) {
  auto t = atproto::Datetime::Parse(rfc3339);
  return t.ok() ? t->unix_micros() : 0;
}

// The account state a getRepo error names: the repo cannot be fetched until the account is
// active again (an #account or #identity frame says so). Empty for any other error.
std::string InactiveStatus(std::string_view xrpc_error) {
  if (xrpc_error == "RepoDeactivated") return "deactivated";
  if (xrpc_error == "RepoTakendown") return "takendown";
  if (xrpc_error == "RepoSuspended") return "suspended";
  if (xrpc_error == "RepoNotFound") return "not found";
  return {};
}

}  // namespace

Status FirehoseOptions::Validate() const {
  ATFILL_RETURN_IF_ERROR(ValidateLiveStreamOptions(*this, "firehose"));
  if (max_resyncs_in_flight == 0) {
    return Status::Invalid("live: max_resyncs_in_flight must be at least 1");
  }
  if (resync_retry_ms < 1) return Status::Invalid("live: resync_retry_ms must be at least 1");
  if (max_waiting_bytes == 0) return Status::Invalid("live: max_waiting_bytes must be at least 1");
  ATFILL_RETURN_IF_ERROR(resolver.Validate());
  return websocket.Validate();
}

std::string FirehoseSource::Impl::UrlFor(const std::string& host) const {
  std::string base = host;
  while (!base.empty() && base.back() == '/') base.pop_back();
  std::string url = base + "/xrpc/com.atproto.sync.subscribeRepos";
  const uint64_t seq = shared->last_seq.load();
  // Unset (0 with no start): the live tip.
  if (seq > 0 || options.start_seq > 0) url += "?cursor=" + std::to_string(seq);
  return url;
}

Status FirehoseSource::Impl::StartSession() {
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

std::shared_ptr<const std::vector<std::string>> FirehoseSource::Impl::Collections() const {
  std::lock_guard<std::mutex> lock(filter_mu);
  return collections;
}

void FirehoseSource::Impl::Resolve(const std::string& did) {
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

bool FirehoseSource::Impl::NeedsKey(const FirehoseHead& h) {
  return h.kind == FirehoseKind::kCommit || h.kind == FirehoseKind::kSync;
}

void FirehoseSource::Impl::SetInactive(const std::string& did, std::string status,
                                       pipeline::EventChunk* chunk) {
  chains->SetInactive(&chunk->state_writes, did, status);
  inactive.insert_or_assign(did, std::move(status));
  inactive_now = inactive.size();
}

void FirehoseSource::Impl::SetActive(const std::string& did, pipeline::EventChunk* chunk) {
  if (inactive.erase(did) == 0) return;
  chains->ClearInactive(&chunk->state_writes, did);
  inactive_now = inactive.size();
  if (desynced.contains(did)) WantResync(did);
}

bool FirehoseSource::Impl::Handle(Item& item, Payload* payload, pipeline::EventChunk* chunk) {
  const std::string& did = item.head.did;
  switch (item.head.kind) {
    case FirehoseKind::kCommit:
    case FirehoseKind::kSync: {
      auto it = known.find(did);
      if (it == known.end()) return false;
      item.key = it->second;
      payload->items.push_back(std::move(item));
      return true;
    }
    case FirehoseKind::kIdentity:
      // The key or the PDS may have changed: resolve the account again when next needed.
      known.erase(did);
      state::ResolverCache(*kv).Remove(&chunk->state_writes, did);
      SetActive(did, chunk);
      return true;
    case FirehoseKind::kAccount: {
      const pipeline::AccountEvent& a = *item.account;
      if (a.active) {
        SetActive(did, chunk);
      } else if (desynced.contains(did)) {
        // Only the accounts whose resync waits are remembered, so the set stays as small as the
        // desynchronized repos however many accounts the network deactivates; another one is
        // found inactive by its resync's getRepo, if it ever needs one.
        SetInactive(did, std::string(pipeline::AccountStatusName(a.status)), chunk);
      }
      payload->items.push_back(std::move(item));
      return true;
    }
    case FirehoseKind::kInfo:
    case FirehoseKind::kError:
      break;
  }
  return true;
}

bool FirehoseSource::Impl::Wanted(std::string_view did) const {
  if (options.dids.empty()) return true;
  for (const auto& d : options.dids) {
    if (d == did) return true;
  }
  return false;
}

uint64_t FirehoseSource::Impl::HeldBytes(const Item& item) {
  return 256 + item.bytes.size() + item.head.did.size();
}

void FirehoseSource::Impl::Hold(const std::string& did, Item item) {
  waiting_seqs.insert(item.head.seq);
  waiting_bytes += HeldBytes(item);
  if (waiting_bytes > peak_waiting_bytes.load()) peak_waiting_bytes = waiting_bytes;
  waiting[did].push_back(std::move(item));
}

void FirehoseSource::Impl::Unhold(const Item& item) {
  waiting_seqs.erase(waiting_seqs.find(item.head.seq));
  waiting_bytes -= HeldBytes(item);
}

void FirehoseSource::Impl::Dispatch(Item item, Payload* payload, pipeline::EventChunk* chunk) {
  const std::string did = item.head.did;
  if (waiting.contains(did)) {
    Hold(did, std::move(item));
    return;
  }
  if (!Handle(item, payload, chunk)) {
    Hold(did, std::move(item));
    Resolve(did);
  }
}

void FirehoseSource::Impl::Drain(const std::string& did, Payload* payload,
                                 pipeline::EventChunk* chunk) {
  auto it = waiting.find(did);
  if (it == waiting.end()) return;
  std::deque<Item>& q = it->second;
  while (!q.empty()) {
    if (NeedsKey(q.front().head) && !known.contains(did)) {
      Resolve(did);
      return;
    }
    Unhold(q.front());
    Handle(q.front(), payload, chunk);
    q.pop_front();
  }
  waiting.erase(it);
}

void FirehoseSource::Impl::Resolved(const std::string& did, ResolveOutcome outcome,
                                    Payload* payload, pipeline::EventChunk* chunk) {
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
      known.insert_or_assign(
          did, std::make_shared<const Known>(Known{*key, doc.signing_key, doc.pds_endpoint}));
      shared->last_progress_ms = SteadyMs();
    }
  } else {
    why = outcome.message;
  }
  if (!why.empty()) {
    // Nothing of the account can be verified: its frames that need the key are refused, the
    // rest still apply. The next frame of the account asks again.
    if (auto it = waiting.find(did); it != waiting.end()) {
      std::deque<Item> q = std::move(it->second);
      waiting.erase(it);
      for (Item& item : q) {
        Unhold(item);
        if (NeedsKey(item.head)) {
          Refuse(item.head, "key_unresolved", why, chunk);
        } else {
          Handle(item, payload, chunk);
        }
      }
    }
    if (resync_queued.erase(did) > 0) ResyncFailed(did, why, chunk);
    return;
  }
  Drain(did, payload, chunk);
}

void FirehoseSource::Impl::WantResync(const std::string& did) {
  desynced.insert(did);
  if (resync_inflight.contains(did) || resync_queued.contains(did)) return;
  resync_queued.insert(did);
  resync_queue.push_back(did);
}

void FirehoseSource::Impl::ResyncFailed(const std::string& did, const std::string& why,
                                        pipeline::EventChunk* chunk) {
  CountResyncFailed(did, why, chunk);
  RetryLater(did);
}

void FirehoseSource::Impl::StartResyncs() {
  size_t n = resync_queue.size();
  while (n-- > 0 && resync_inflight.size() < options.max_resyncs_in_flight) {
    std::string did = std::move(resync_queue.front());
    resync_queue.pop_front();
    if (!resync_queued.contains(did)) continue;  // given up meanwhile
    if (inactive.contains(did)) {
      // Put off until the account is active again (SetActive queues it then).
      resync_queued.erase(did);
      continue;
    }
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
    req.url = GetRepoUrl(k->second->pds, did);
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
}

void FirehoseSource::Impl::RepoAnswered(const std::string& did, Result<net::HttpResponse> r,
                                        Payload* payload, pipeline::EventChunk* chunk) {
  resync_inflight.erase(did);
  std::string why;
  if (!r.ok()) {
    why = "getRepo of " + did + " failed: " + r.status().message();
  } else if (r->status != 200) {
    const net::XrpcError x = net::ParseXrpcError(r->body);
    why = "getRepo of " + did + " answered HTTP " + std::to_string(r->status) + " " + x.error +
          (x.message.empty() ? "" : ": " + x.message);
    if (std::string status = InactiveStatus(x.error); !status.empty()) {
      SetInactive(did, std::move(status), chunk);
      resync_queued.erase(did);
      chunk->counters.emplace_back("firehose_resync_deferred", 1);
      chunk->errors.push_back(
          {"resync_deferred", did, why + "; resynced when the account is active again"});
      return;
    }
  }
  auto k = known.find(did);
  if (why.empty() && k == known.end()) why = "the signing key of " + did + " is not known";
  if (!why.empty()) {
    ResyncFailed(did, why, chunk);
    return;
  }
  shared->last_progress_ms = SteadyMs();
  Item item;
  item.head.did = did;
  item.repo = true;
  item.bytes = std::move(r->body);
  item.key = k->second;
  payload->items.push_back(std::move(item));
}

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
  impl->collections = std::make_shared<const std::vector<std::string>>(impl->options.collections);
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
  // Except those whose account a previous run found inactive: their PDS would answer the same.
  ATFILL_RETURN_IF_ERROR(s.chains->ScanInactive([&](std::string_view did, std::string_view status) {
    if (s.desynced.contains(std::string(did))) {
      s.inactive.insert_or_assign(std::string(did), std::string(status));
    } else {
      s.stale_inactive.emplace_back(did);
    }
    return true;
  }));
  s.inactive_now = s.inactive.size();
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
  std::deque<std::pair<std::string, bool>> news;
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
             !sh.retries.empty() || !sh.chain_news.empty();
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
    news.swap(sh.chain_news);
    for (auto& e : sh.errors) {
      chunk->counters.emplace_back("live_connection_failures", 1);
      chunk->errors.push_back(std::move(e));
    }
    sh.errors.clear();
    reconnect = sh.reopen && sh.stopped && sh.queue.empty();
  }
  {
    // Chunks from this one on take the filter as it is now (WaitFilterApplied).
    std::lock_guard<std::mutex> lock(s.filter_mu);
    s.next_chunk = chunk->seq + 1;
  }
  for (const std::string& did : s.stale_inactive)
    s.chains->ClearInactive(&chunk->state_writes, did);
  s.stale_inactive.clear();
  auto payload = std::make_shared<Impl::Payload>();
  payload->collections = s.Collections();
  // What the chain stage said, in its order.
  for (auto& [did, desync] : news) {
    if (desync) {
      s.WantResync(did);
    } else {
      s.desynced.erase(did);
      // Its repo came (a getRepo in flight when an #account said inactive): the mark goes, or a
      // later desync would wait for an #account that never comes.
      s.SetActive(did, chunk);
    }
  }
  for (auto& [did, outcome] : resolved) s.Resolved(did, std::move(outcome), payload.get(), chunk);
  for (auto& [did, r] : repos) s.RepoAnswered(did, std::move(r), payload.get(), chunk);
  for (auto& did : retries) {
    if (s.desynced.contains(did)) s.WantResync(did);
  }
  const size_t n = messages.size();
  for (std::string& m : messages) {
    chunk->bytes_read += m.size();
    Impl::Item item;
    if (!PeekFirehoseFrame(AsBytes(m), &item.head)) {
      // Not a frame to route: an info or error frame, a type this consumer does not know, or
      // bad input, which the full decode names.
      FirehoseFrame frame;
      std::string kind;
      if (Status st = DecodeFirehoseFrame(AsBytes(m), &frame, &kind); !st.ok()) {
        if (kind == "unknown_type") continue;  // skipped
        chunk->counters.emplace_back("firehose_bad_frames", 1);
        chunk->errors.push_back({kind.empty() ? "bad_frame" : kind,
                                 "message after seq " + std::to_string(s.read_seq), st.message()});
        ++chunk->dropped;
        continue;
      }
      chunk->counters.emplace_back("firehose_frames", 1);
      const bool info = frame.kind() == FirehoseKind::kInfo;
      if (info || frame.kind() == FirehoseKind::kError) {
        const auto& name = info ? std::get<FirehoseInfo>(frame.payload).name
                                : std::get<FirehoseError>(frame.payload).name;
        const auto& message = info ? std::get<FirehoseInfo>(frame.payload).message
                                   : std::get<FirehoseError>(frame.payload).message;
        chunk->errors.push_back({info ? "relay_info" : "relay_error",
                                 "after seq " + std::to_string(s.read_seq),
                                 name + (message.empty() ? "" : ": " + message)});
        continue;
      }
      // A frame the head reader could not read but the decoder could: routed the same way.
      item.head.kind = frame.kind();
      item.head.seq = frame.seq();
      item.head.did = std::string(frame.did());
    } else {
      chunk->counters.emplace_back("firehose_frames", 1);
    }
    const int64_t seq = item.head.seq;
    // A reconnection resumes from the newest seq read, so what was queued twice comes again.
    if (seq <= s.read_seq) continue;
    s.read_seq = seq;
    sh.last_seq = static_cast<uint64_t>(seq);
    s.read_time = item.head.time;
    if (!s.Wanted(item.head.did)) continue;
    if (item.head.kind == FirehoseKind::kAccount) {
      // Read tracks accounts (a resync waits for an inactive one), so it decodes them itself.
      FirehoseFrame frame;
      std::string kind;
      if (Status st = DecodeFirehoseFrame(AsBytes(m), &frame, &kind); !st.ok()) {
        chunk->counters.emplace_back("firehose_bad_frames", 1);
        chunk->errors.push_back(
            {kind.empty() ? "bad_frame" : kind, Impl::FrameKey(seq, item.head.did), st.message()});
        ++chunk->dropped;
        continue;
      }
      const auto& a = std::get<FirehoseAccount>(frame.payload);
      pipeline::AccountEvent e;
      e.did = a.did;
      e.active = a.active;
      e.status = a.status.empty() ? (a.active ? pipeline::AccountStatus::kActive
                                              : pipeline::AccountStatus::kOther)
                                  : pipeline::ParseAccountStatus(a.status);
      e.seq = a.seq;
      e.time_us = TimeUs(a.time);
      e.position = static_cast<uint64_t>(a.seq);
      item.account = std::move(e);
    } else if (item.head.kind != FirehoseKind::kIdentity) {
      item.bytes = std::move(m);
    }
    s.Dispatch(std::move(item), payload.get(), chunk);
  }
  s.StartResyncs();
  const bool carries = !payload->items.empty();
  if (carries) chunk->payload = std::move(payload);
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
  if (n == 0 && !carries && chunk->events.empty() && chunk->errors.empty() &&
      chunk->counters.empty() && chunk->state_writes.empty()) {
    // A quiet run ends idle_exit_ms after the last message or answer, whatever still waits: a
    // resync not done stays marked in state and runs at the next start, and frames waiting for a
    // key hold the cursor back, so they come again.
    const int64_t last = std::max(sh.last_message_ms.load(), sh.last_progress_ms.load());
    if (s.options.idle_exit_ms > 0 && SteadyMs() - last >= s.options.idle_exit_ms) {
      s.idle_exit = true;
      return false;
    }
    chunk->tick = true;
  }
  return true;
}

const pipeline::Transform* FirehoseSource::OrderedStage() const { return &impl_->stage; }

std::string FirehoseSource::Describe() const {
  return DescribeLiveStream("firehose", impl_->options.hosts);
}

state::StopReason FirehoseSource::Unfinished() const {
  return IdleStopReason(impl_->idle_exit, impl_->options.idle_exit_ms);
}

void FirehoseSource::Committed(uint64_t through_seq) {
  {
    std::lock_guard<std::mutex> lock(impl_->chain_mu);
    impl_->chain->Committed(through_seq);
  }
  {
    std::lock_guard<std::mutex> lock(impl_->filter_mu);
    impl_->committed = std::max(impl_->committed, through_seq + 1);
  }
  impl_->filter_cv.notify_all();
}

Status FirehoseSource::SetCollections(std::vector<std::string> collections) {
  if (collections.empty()) {
    return Status::Invalid("the firehose's collections cannot change to every collection");
  }
  auto now = std::make_shared<const std::vector<std::string>>(std::move(collections));
  std::lock_guard<std::mutex> lock(impl_->filter_mu);
  impl_->collections = std::move(now);
  impl_->fence = impl_->next_chunk;
  return Status::OK();
}

std::vector<std::string> FirehoseSource::collections() const { return *impl_->Collections(); }

bool FirehoseSource::Consumes(std::string_view collection) const {
  return pipeline::CollectionMatches(collection, *impl_->Collections());
}

Status FirehoseSource::WaitFilterApplied(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(impl_->filter_mu);
  if (impl_->filter_cv.wait_for(lock, timeout, [&] { return impl_->committed >= impl_->fence; })) {
    return Status::OK();
  }
  return Status::Unavailable(
      "the chunks read before the collections changed are not committed yet");
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
  st.desynchronized = s.desynchronized_now.load();
  st.inactive = s.inactive_now.load();
  std::lock_guard<std::mutex> lock(s.shared->mu);
  st.host = s.shared->host;
  st.last_error = s.shared->last_error;
  return st;
}

}  // namespace atfill::sources
