#include "sources/jetstream/jetstream.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "atproto/syntax.hpp"
#include "base/bytes.hpp"
#include "base/clock.hpp"
#include "base/json_writer.hpp"
#include "base/patterns.hpp"
#include "base/strings.hpp"
#include "net/http_client.hpp"
#include "net/xrpc_error.hpp"
#include "sources/jetstream/jetstream_frames.hpp"
#include "sources/live_stream.hpp"

namespace atfill::sources {

std::string_view JetstreamProtocolName(JetstreamProtocol p) {
  switch (p) {
    case JetstreamProtocol::kAuto:
      return "auto";
    case JetstreamProtocol::kV2:
      return "v2";
    case JetstreamProtocol::kV1:
      return "v1";
  }
  return "?";
}

Result<JetstreamProtocol> ParseJetstreamProtocol(std::string_view text) {
  for (auto p : {JetstreamProtocol::kAuto, JetstreamProtocol::kV2, JetstreamProtocol::kV1}) {
    if (text == JetstreamProtocolName(p)) return p;
  }
  return Status::Invalid("unknown Jetstream protocol " + QuoteForMessage(text) +
                         " (expected auto, v2 or v1)");
}

namespace {
// Hosts a consumer may list: messages carry the sender's index in 4 bits (see kHostShift).
constexpr size_t kMaxHosts = 15;
}  // namespace

Status JetstreamOptions::Validate() const {
  // First, so that a list too long is named before any URL in it.
  if (hosts.size() > kMaxHosts) {
    return Status::Invalid("live: hosts: at most " + std::to_string(kMaxHosts) +
                           " Jetstream hosts");
  }
  ATFILL_RETURN_IF_ERROR(ValidateLiveStreamOptions(*this, "Jetstream"));
  return websocket.Validate();
}

namespace {

// One message as Read frames it for Decode in chunk->raw:
//   u8 flags, u32 length, bytes
// flags: bit 0 binary (zstd), bit 1 v1 (else v2), bits 2-3 dictionary (0 none, 1 v2, 2 v1).
constexpr uint8_t kBinary = 1, kV1Frame = 2;
constexpr uint8_t kDictV2 = 1 << 2, kDictV1 = 2 << 2;
// Bits 4..7: 1 + the index in JetstreamOptions::hosts of the host that sent the message (0 when
// unknown). Seqs are per Jetstream instance, so the cursor names the host its seq belongs to.
constexpr int kHostShift = 4;
// Resuming on another host goes by witnessed time, this much before the last applied event
// (instances witness events at slightly different times; the repeats are idempotent).
constexpr int64_t kFailoverMarginUs = 2'000'000;

std::string HttpBase(const std::string& ws_host) {
  std::string base = ws_host;
  while (!base.empty() && base.back() == '/') base.pop_back();
  if (base.rfind("wss://", 0) == 0) return "https://" + base.substr(6);
  if (base.rfind("ws://", 0) == 0) return "http://" + base.substr(5);
  return base;
}

// The index of `host` in `hosts`, or -2 when it is not there.
int HostIndexIn(const std::vector<std::string>& hosts, const std::string& host) {
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (hosts[i] == host) return static_cast<int>(i);
  }
  return -2;
}

}  // namespace

// Decodes the first frame of each connection on the loop thread, to check its position.
class FirstFrameReader {
 public:
  FirstFrameReader(std::shared_ptr<const ZstdDictionary> v1,
                   std::shared_ptr<const ZstdDictionary> v2, uint64_t max_bytes)
      : v1_(std::move(v1)), v2_(std::move(v2)), max_bytes_(max_bytes) {}

  // The frame's seq and time, or nullopt when it carries none (info, error) or cannot be read.
  std::optional<std::pair<uint64_t, int64_t>> Position(std::string_view data, bool binary,
                                                       bool v1) {
    std::string_view json = data;
    size_t readable = 0;
    std::string kind;
    if (binary) {
      std::optional<ZstdFrameDecoder>& dec = v1 ? v1_dec_ : v2_dec_;
      if (!dec) {
        auto made = ZstdFrameDecoder::Create(v1 ? v1_ : v2_, max_bytes_);
        if (!made.ok()) return std::nullopt;
        dec.emplace(std::move(*made));
      }
      if (!dec->Decompress(AsBytes(data), &text_, &kind).ok()) return std::nullopt;
      json = text_;
      readable = text_.capacity();
    }
    JetstreamFrame frame;
    Status st = v1 ? DecodeJetstreamV1(json, readable, pipeline::Origin::kLive, &frame, &kind)
                   : DecodeJetstreamV2(json, readable, pipeline::Origin::kLive, &frame, &kind);
    if (!st.ok() || frame.time_us == 0) return std::nullopt;
    return std::make_pair(frame.seq, frame.time_us);
  }

 private:
  std::shared_ptr<const ZstdDictionary> v1_, v2_;
  uint64_t max_bytes_;
  std::optional<ZstdFrameDecoder> v1_dec_, v2_dec_;
  std::string text_;
};

struct JetstreamSource::Impl {
  struct Message {
    std::string data;
    uint8_t flags = 0;
  };
  // Shared with the WebSocket handlers, which may outlive a source being destroyed.
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Message> queue;
    uint64_t queued_bytes = 0;
    bool stopped = true;  // the session is over (kStopped seen)
    // The connection was given up (a full buffer, or a renumbered host below): Read opens a new
    // one once this one has stopped and the buffer has drained.
    bool reopen = false;
    // The host renumbered its seqs (our seq cursor is past its tip, so it started at the tip):
    // this connection's messages are dropped and Read reconnects by witnessed time once it ends.
    bool renumbered = false;
    std::atomic<bool> v1{false};       // speaking v1 now
    std::atomic<bool> by_time{false};  // resume by witnessed time (CursorTooOld)
    std::atomic<bool> v2_compress{false};
    // No event seen yet and start_seq set: v1 asks for the oldest kept (cursor 0... clamped).
    std::atomic<bool> start_from_oldest{false};
    std::atomic<uint64_t> last_seq{0};
    std::atomic<int64_t> last_time_us{0};
    std::atomic<int64_t> last_message_ms{0};
    std::atomic<uint64_t> messages{0}, bytes{0}, connections{0}, v1_fallbacks{0}, overflow_drops{0},
        cursor_too_old{0}, gaps{0}, gap_events{0}, future_cursors{0}, gap_replays{0};
    // The position the connection being opened resumes from (UrlFor; 0 = none: a fresh start or
    // the live tip). Its first event must be that one again (replay is inclusive); a later one
    // means the host no longer had it: a gap.
    std::atomic<uint64_t> asked_seq{0};
    std::atomic<int64_t> asked_time_us{0};
    bool check_first = false;  // loop thread only: the next event is a connection's first
    // Under mu, for the next chunk: each gap's log entry and the events it skipped (v2).
    struct PendingReport {
      pipeline::EventError error;
      const char* counter;  // the job counter it adds 1 to
      uint64_t events;      // events skipped (stream_gap_events)
    };
    std::vector<PendingReport> pending_gaps;
    // Attempts that ended without a connection, or connections that ended other than by our
    // own close: each becomes an entry of the job's error log (coalesced by kind and host) with
    // the reason, so a consumer that cannot connect is never silent.
    std::atomic<uint64_t> attempts{0}, connection_failures{0};
    std::string last_error;  // under mu
    std::mutex host_mu;
    std::string host;
    // Indexes into JetstreamOptions::hosts: the host of the open connection, and the host whose
    // numbering last_seq is in (-1: none yet; -2: a host no longer configured).
    std::atomic<int> conn_host{-1};
    std::atomic<int> seq_host{-1};
    // The collections filter now (SetCollections replaces it; UrlFor reads it).
    mutable std::mutex filter_mu;
    std::shared_ptr<const std::vector<std::string>> collections;
    // Under filter_mu: the filter each chunk is decoded with, by the first chunk it applies to
    // (ascending). A chunk read before a change keeps the filter it was received under even when
    // a parallel Decode reaches it after the change, so what lands of a removed collection is the
    // stream up to one point, never a prefix with holes.
    std::vector<std::pair<uint64_t, std::shared_ptr<const std::vector<std::string>>>> filters;
    std::atomic<uint64_t> filter_changes{0}, filter_from_seq{0};
    // The next connection opened is the first with a changed filter (v2): UrlFor records its seq.
    std::atomic<bool> filter_pending{false};
    bool filter_reopen = false;  // under mu: Read reconnects with the new filter (v2)
    // Under mu. read_through: one past the newest chunk Read filled with messages. fence: its
    // value at the last filter change; every chunk filled later is decoded with the new filter.
    // committed: chunks with seq < committed are durable.
    uint64_t read_through = 0;
    uint64_t fence = 0;
    uint64_t committed = 0;
    std::condition_variable committed_cv;
  };

  std::shared_ptr<const std::vector<std::string>> Collections() const {
    std::lock_guard<std::mutex> lock(shared->filter_mu);
    return shared->collections;
  }

  // The filter chunk `seq` is decoded with.
  std::shared_ptr<const std::vector<std::string>> CollectionsOfChunk(uint64_t seq) const {
    std::lock_guard<std::mutex> lock(shared->filter_mu);
    for (auto it = shared->filters.rbegin(); it != shared->filters.rend(); ++it) {
      if (it->first <= seq) return it->second;
    }
    return shared->collections;
  }

  int HostIndex(const std::string& host) const { return HostIndexIn(options.hosts, host); }

  // The error log entry for an attempt or connection that ended badly, or nullopt when its end
  // is expected (our own close, a v2 404 answered by falling back to v1, a refusal the source
  // answers itself such as CursorTooOld).
  static std::optional<pipeline::EventError> EndedBadly(const net::ConnectionEvent& e,
                                                        bool handled_refusal) {
    std::string kind;
    std::string why;
    switch (e.kind) {
      case net::ConnectionEventKind::kRefused: {
        if (handled_refusal) return std::nullopt;
        kind = "connection_refused";
        const net::XrpcError x = net::ParseXrpcError(e.body);
        why = "the host answered the upgrade with HTTP " + std::to_string(e.http_status);
        if (!x.error.empty()) why += " " + x.error;
        if (!x.message.empty()) {
          why += ": " + x.message;
        } else if (x.error.empty() && !e.body.empty()) {
          why += ": " + QuoteForMessage(e.body, 200);
        }
        break;
      }
      case net::ConnectionEventKind::kFailed:
        kind = e.connected_ms >= 0 ? "connection_lost" : "connection_failed";
        why = e.error.message();
        if (e.connected_ms >= 0) {
          why = "the connection dropped after " + std::to_string(e.connected_ms) + " ms and " +
                std::to_string(e.messages) + " message(s): " + why;
        }
        break;
      case net::ConnectionEventKind::kClosed:
        if (e.closed_by_client || e.close_code == 1000) return std::nullopt;
        kind = "connection_closed";
        why = "the host closed the connection after " + std::to_string(e.connected_ms) +
              " ms with code " + std::to_string(e.close_code) +
              (e.close_reason.empty() ? "" : " (" + QuoteForMessage(e.close_reason, 200) + ")");
        break;
      default:
        return std::nullopt;
    }
    why = "attempt " + std::to_string(e.attempt) + " to " + e.url + ": " + why;
    if (e.retry_in_ms >= 0) {
      why += "; trying " + (e.next_host.empty() ? e.host : e.next_host) + " again in " +
             std::to_string(e.retry_in_ms) + " ms";
    } else {
      why += "; no further attempt";
    }
    return pipeline::EventError{std::move(kind), e.host, std::move(why)};
  }

  // The first event of a connection that resumed from a position: a gap when it is past it.
  static void CheckFirstEvent(Shared& sh, FirstFrameReader& reader, std::string_view data,
                              bool binary) {
    const bool v1 = sh.v1.load();
    auto pos = reader.Position(data, binary, v1);
    if (!pos) {
      // #info OutdatedCursor comes first after a clamped time cursor; check the event after it.
      return;
    }
    sh.check_first = false;
    const auto [seq, time_us] = *pos;
    const uint64_t asked_seq = sh.asked_seq.load();
    const int64_t asked_time = sh.asked_time_us.load();
    const bool by_seq = !v1 && !sh.by_time.load() && asked_seq > 0 && seq > 0;
    if (by_seq && seq < asked_seq) {
      // Replay is inclusive, so the first event is asked_seq again, or later when the host lost
      // it. An earlier seq means our cursor is past the host's tip, which it answers with the live
      // tip: it numbers its events anew (FutureCursor; a restored or replaced instance). What it
      // sent before that tip would be lost: drop this connection and resume by witnessed time.
      sh.by_time = true;
      sh.future_cursors.fetch_add(1);
      sh.last_seq = 0;
      std::lock_guard<std::mutex> lock(sh.mu);
      sh.renumbered = true;
      sh.pending_gaps.push_back(
          {{"future_cursor", "seq " + std::to_string(asked_seq),
            "resumed after seq " + std::to_string(asked_seq) +
                " but the host's first event is seq " + std::to_string(seq) +
                ": the host numbers its events anew (our cursor is past its tip); resuming from "
                "the witnessed time " +
                std::to_string(asked_time) + " instead"},
           "future_cursors",
           0});
      return;
    }
    const bool gap = by_seq ? seq > asked_seq : time_us > asked_time;
    if (!gap) return;
    const double seconds = static_cast<double>(time_us - asked_time) / 1e6;
    char span[64];
    std::snprintf(span, sizeof span, "%.3f s", seconds);
    std::string message;
    uint64_t events = 0;
    if (!v1 && seq > 0 && asked_seq > 0 && seq > asked_seq) {
      events = seq - asked_seq - 1;
      message = "resumed after seq " + std::to_string(asked_seq) +
                " but the host's first event is seq " + std::to_string(seq) + ": " +
                std::to_string(events) + " event(s) (" + span + " of the stream) were not received";
    } else {
      message = "resumed at time_us " + std::to_string(asked_time) +
                " but the host's first event is at " + std::to_string(time_us) + ": " + span +
                " of the stream were not received (the host no longer keeps them)";
    }
    sh.gaps.fetch_add(1);
    sh.gap_events.fetch_add(events);
    std::lock_guard<std::mutex> lock(sh.mu);
    std::string key = by_seq || (!v1 && asked_seq > 0) ? "seq " + std::to_string(asked_seq)
                                                       : "time_us " + std::to_string(asked_time);
    sh.pending_gaps.push_back(
        {{"stream_gap", std::move(key), std::move(message)}, "stream_gaps", events});
  }

  // CursorTooOld on v2 with a gap replay configured: the gap goes to a replay job and the stream
  // resumes at the archive's sealed tip. False when it did not (the caller resumes by time).
  static bool ReplayGap(Shared& sh, const std::function<Result<JetstreamOptions::GapReplay>(
                                        uint64_t, const std::string&)>& gap_replay) {
    uint64_t last = sh.last_seq.load();
    if (!gap_replay || sh.v1.load() || sh.by_time.load() || last == 0) return false;
    // A consumer told to start at start_seq has not applied that event yet.
    const bool nothing_seen = sh.start_from_oldest.load() && sh.last_time_us.load() == 0;
    if (nothing_seen) --last;
    std::string host;
    {
      std::lock_guard<std::mutex> lock(sh.host_mu);
      host = sh.host;
    }
    auto g = gap_replay(last, host);
    std::lock_guard<std::mutex> lock(sh.mu);
    const std::string key = "seq " + std::to_string(last);
    if (!g.ok() || g->resume_after_seq <= last) {
      const std::string why = g.ok() ? "the archive holds nothing after seq " + std::to_string(last)
                                     : g.status().message();
      sh.pending_gaps.push_back(
          {{"gap_replay_failed", key,
            "cursor seq " + std::to_string(last) +
                " is below the host's lookback floor (CursorTooOld) and the gap cannot be "
                "replayed from the archive (" +
                why +
                "): resuming from the host's floor by witnessed time; a backfill is the way to "
                "recover what the stream skipped"},
           "gap_replay_failures",
           0});
      return false;
    }
    const uint64_t events = g->resume_after_seq - last;
    sh.last_seq = g->resume_after_seq;
    sh.start_from_oldest = false;  // the stream resumes after the gap, not at start_seq
    sh.gaps.fetch_add(1);
    sh.gap_events.fetch_add(events);
    sh.gap_replays.fetch_add(1);
    sh.pending_gaps.push_back(
        {{"stream_gap", key,
          "cursor seq " + std::to_string(last) +
              " is below the host's lookback floor (CursorTooOld): replay job " +
              std::to_string(g->job_id) + " replays seqs " + std::to_string(last + 1) + ".." +
              std::to_string(g->resume_after_seq) +
              " from the archive; the stream resumes after seq " +
              std::to_string(g->resume_after_seq)},
         "stream_gaps",
         events});
    return true;
  }

  JetstreamOptions options;
  state::KvStore* kv = nullptr;
  std::unique_ptr<net::WebSocketClient> ws;
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  std::shared_ptr<const ZstdDictionary> v2_dict;
  std::shared_ptr<const ZstdDictionary> v1_dict;
  int64_t started_ms = 0;
  bool idle_exit = false;

  std::string UrlFor(const std::string& host) const {
    std::string base = host;
    while (!base.empty() && base.back() == '/') base.pop_back();
    uint64_t seq = shared->last_seq.load();
    int64_t time_us = shared->last_time_us.load();
    // Only a position an event was seen at (decoded, or saved with the cursor) is checked.
    shared->asked_seq = time_us > 0 ? seq : 0;
    shared->asked_time_us = time_us;
    // Seqs are per Jetstream instance: on another host than the one the seq came from, resume by
    // witnessed time, a little earlier, and count seqs in the new host's numbering from here on.
    // The first event cannot be checked for a gap (the instances' times differ slightly).
    const int here = HostIndex(host);
    const int seq_host = shared->seq_host.load();
    bool other_host = false;
    if (seq_host != -1 && seq_host != here && time_us > 0) {
      other_host = true;
      time_us = std::max<int64_t>(time_us - kFailoverMarginUs, 1);
      seq = 0;
      shared->last_seq = 0;
      shared->asked_seq = 0;
      shared->asked_time_us = 0;
    }
    shared->seq_host = here;
    std::string q;
    auto add = [&q](std::string_view k, std::string_view v) {
      q += q.empty() ? "?" : "&";
      q += std::string(k) + "=" + PercentEncodeQueryValue(v);
    };
    if (shared->v1.load()) {
      for (const auto& c : *Collections()) add("wantedCollections", c);
      for (const auto& d : options.dids) add("wantedDids", d);
      // v1 hosts take the witnessed time (the legacy server knows nothing else); a start
      // before any event asks for the oldest event kept (time 1 is clamped up to it).
      if (time_us > 0) {
        add("cursor", std::to_string(time_us));
      } else if (shared->start_from_oldest.load()) {
        add("cursor", "1000000000000000");
      }
      if (v1_dict) add("compress", "true");
      add("maxMessageSizeBytes", std::to_string(options.max_message_bytes));
      return base + "/subscribe" + q;
    }
    for (const auto& c : *Collections()) add("collections", c);
    if (shared->filter_pending.exchange(false)) shared->filter_from_seq = seq;
    for (const auto& d : options.dids) add("dids", d);
    if ((shared->by_time.load() || other_host) && time_us > 0) {
      add("cursor", std::to_string(time_us));
    } else if (shared->by_time.load()) {
      // Below the host's floor with no witnessed time known (start_seq, or a cursor saved without
      // one): the oldest event it keeps (a time before every event is clamped up to its floor).
      add("cursor", "1000000000000000");
    } else if (seq > 0) {
      add("cursor", std::to_string(seq));  // inclusive: the last event comes again
    }
    if (shared->v2_compress.load() && v2_dict) add("zstdDictionary", std::to_string(v2_dict->id()));
    add("maxMessageSizeBytes", std::to_string(options.max_message_bytes));
    return base + "/xrpc/network.bsky.jetstream.subscribeEvents" + q;
  }

  Status LoadV2Dictionary() {
    if (!options.compress || options.protocol == JetstreamProtocol::kV1) return Status::OK();
    const std::string key = "jetstream/dictionary/" + options.hosts.front();
    ATFILL_ASSIGN_OR_RETURN(auto cached, kv->Get(state::Family::kMeta, key));
    if (cached) {
      auto dict = ZstdDictionary::Load(AsBytes(*cached));
      if (dict.ok()) {
        v2_dict = *dict;
        shared->v2_compress = true;
        return Status::OK();
      }
    }
    return FetchV2Dictionary();
  }

  // GET getZstdDictionary from the first host; without one the stream runs uncompressed.
  Status FetchV2Dictionary() {
    net::HttpClientOptions ho;
    ho.allow_private_addresses = true;  // the configured host (see Create)
    ho.retry.max_attempts = 2;
    ho.timeout_ms = 10'000;
    ATFILL_ASSIGN_OR_RETURN(auto http, net::HttpClient::Start(ho));
    net::HttpRequest req;
    req.url = HttpBase(options.hosts.front()) + "/xrpc/network.bsky.jetstream.getZstdDictionary";
    auto resp = http->Fetch(req);
    if (!resp.ok() || resp->status != 200) {
      shared->v2_compress = false;
      return Status::OK();
    }
    auto dict = ZstdDictionary::Load(AsBytes(resp->body));
    if (!dict.ok()) {
      shared->v2_compress = false;
      return Status::OK();
    }
    v2_dict = *dict;
    shared->v2_compress = true;
    state::WriteBatch b;
    b.Put(state::Family::kMeta, "jetstream/dictionary/" + options.hosts.front(), resp->body);
    return kv->Write(b);
  }

  Status StartSession() {
    net::WebSocketHandlers handlers;
    std::shared_ptr<Shared> sh = shared;
    const uint64_t cap = options.max_buffered_bytes;
    const bool auto_protocol = options.protocol == JetstreamProtocol::kAuto;
    const bool have_v1_dict = v1_dict != nullptr;
    net::WebSocketClient* client = ws.get();
    auto dicts = std::make_shared<FirstFrameReader>(v1_dict, v2_dict, options.max_message_bytes);
    handlers.on_message = [sh, cap, have_v1_dict, client, dicts](std::string_view data,
                                                                 bool binary) {
      if (sh->check_first) CheckFirstEvent(*sh, *dicts, data, binary);
      Message m;
      m.data.assign(data);
      const bool v1 = sh->v1.load();
      m.flags = static_cast<uint8_t>((binary ? kBinary : 0) | (v1 ? kV1Frame : 0) |
                                     ((sh->conn_host.load() + 1) << kHostShift));
      if (binary) m.flags |= v1 ? (have_v1_dict ? kDictV1 : 0) : kDictV2;
      sh->messages.fetch_add(1);
      sh->bytes.fetch_add(data.size());
      sh->last_message_ms.store(SteadyMs());
      bool queued = false;
      bool close = false;
      {
        std::lock_guard<std::mutex> lock(sh->mu);
        if (sh->renumbered) {
          // This connection began at a renumbered host's tip: nothing of it is kept.
          close = !sh->reopen;
        } else {
          queued = true;
          sh->queued_bytes += m.data.size();
          sh->queue.push_back(std::move(m));
          close = sh->queued_bytes > cap && !sh->reopen;
          if (close) sh->overflow_drops.fetch_add(1);
        }
        if (close) sh->reopen = true;
      }
      if (queued) sh->cv.notify_one();
      // From the loop thread this only asks; Read reopens when drained.
      if (close) client->Close();
    };
    auto host_index = [hosts = options.hosts](const std::string& h) {
      return HostIndexIn(hosts, h);
    };
    handlers.on_event = [sh, auto_protocol, host_index,
                         gap_replay = options.gap_replay](const net::ConnectionEvent& e) {
      {
        std::lock_guard<std::mutex> lock(sh->host_mu);
        sh->host = e.host;
      }
      bool handled_refusal = false;
      if (e.kind != net::ConnectionEventKind::kConnected &&
          e.kind != net::ConnectionEventKind::kStopped) {
        sh->attempts.fetch_add(1);
      }
      switch (e.kind) {
        case net::ConnectionEventKind::kConnected:
          sh->connections.fetch_add(1);
          sh->conn_host = host_index(e.host);
          sh->check_first = sh->asked_time_us.load() > 0;
          break;
        case net::ConnectionEventKind::kRefused: {
          const net::XrpcError x = net::ParseXrpcError(e.body);
          handled_refusal = true;
          if (e.http_status == 404 && auto_protocol && !sh->v1.load()) {
            sh->v1 = true;  // no v2 here: v1 until the process restarts
            sh->v1_fallbacks.fetch_add(1);
          } else if (x.error == "CursorTooOld") {
            sh->cursor_too_old.fetch_add(1);
            if (!ReplayGap(*sh, gap_replay)) sh->by_time = true;
          } else if (x.error == "UnknownZstdDictionary") {
            sh->v2_compress = false;
          } else {
            handled_refusal = false;
          }
          break;
        }
        case net::ConnectionEventKind::kStopped:
          MarkSessionStopped(*sh);
          break;
        default:
          break;
      }
      if (auto bad = EndedBadly(e, handled_refusal)) {
        sh->connection_failures.fetch_add(1);
        std::lock_guard<std::mutex> lock(sh->mu);
        sh->last_error = bad->kind + ": " + bad->message;
        sh->pending_gaps.push_back({std::move(*bad), "live_connection_failures", 0});
      }
      return net::SessionAction::kContinue;
    };
    return StartLiveSession(
        *ws, *shared, options.hosts, [this](const std::string& host) { return UrlFor(host); },
        std::move(handlers), [this] { shared->renumbered = false; });
  }
};

JetstreamSource::JetstreamSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

JetstreamSource::~JetstreamSource() {
  if (impl_->ws) impl_->ws->Close();
}

Result<std::unique_ptr<JetstreamSource>> JetstreamSource::Create(JetstreamOptions options,
                                                                 state::KvStore* kv) {
  // The hosts come from the operator's config, not from the network: a self-hosted Jetstream on
  // localhost or in a private network is the usual set-up, so their addresses are not checked.
  options.websocket.allow_private_addresses = true;
  options.websocket.max_message_bytes = options.max_message_bytes;
  if (options.protocol != JetstreamProtocol::kV1) {
    options.websocket.subprotocol = "xrpc.v1.json";
  }
  ATFILL_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->kv = kv;
  impl->shared->v1 = impl->options.protocol == JetstreamProtocol::kV1;
  impl->shared->collections =
      std::make_shared<const std::vector<std::string>>(impl->options.collections);
  if (!impl->options.v1_dictionary_path.empty()) {
    std::ifstream in(impl->options.v1_dictionary_path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      return Status::IoError("live: v1_dictionary " + impl->options.v1_dictionary_path +
                             ": cannot be read");
    }
    auto dict = ZstdDictionary::Load(AsBytes(bytes));
    if (!dict.ok()) return dict.status().WithContext("live: v1_dictionary");
    impl->v1_dict = *dict;
  }
  ATFILL_ASSIGN_OR_RETURN(impl->ws, net::WebSocketClient::Start(impl->options.websocket));
  return std::unique_ptr<JetstreamSource>(new JetstreamSource(std::move(impl)));
}

Status JetstreamSource::Seek(const std::string& resume_cursor) {
  Impl& s = *impl_;
  if (resume_cursor.empty() && s.options.start_seq > 0) {
    s.shared->last_seq = s.options.start_seq;
    s.shared->start_from_oldest = true;
  }
  if (!resume_cursor.empty()) {
    // "<seq>:<time_us>:<host>" (the host the seq is numbered by; cursors saved before it was
    // recorded have none and count as the first host's).
    const size_t colon = resume_cursor.find(':');
    const size_t colon2 =
        colon == std::string::npos ? std::string::npos : resume_cursor.find(':', colon + 1);
    uint64_t seq = 0;
    int64_t time_us = 0;
    try {
      seq = std::stoull(resume_cursor.substr(0, colon));
      if (colon != std::string::npos) {
        time_us = std::stoll(resume_cursor.substr(colon + 1, colon2 - colon - 1));
      }
    } catch (const std::exception&) {
      return Status::Corrupt("Jetstream cursor " + QuoteForMessage(resume_cursor) +
                             " is not <seq>:<time_us>[:<host>]");
    }
    s.shared->last_seq = seq;
    s.shared->last_time_us = time_us;
    s.shared->seq_host =
        colon2 == std::string::npos ? 0 : s.HostIndex(resume_cursor.substr(colon2 + 1));
  }
  ATFILL_RETURN_IF_ERROR(s.LoadV2Dictionary());
  s.started_ms = SteadyMs();
  s.shared->last_message_ms = s.started_ms;
  return s.StartSession();
}

Result<bool> JetstreamSource::Read(pipeline::EventChunk* chunk) {
  Impl& s = *impl_;
  Impl::Shared& sh = *s.shared;
  std::unique_lock<std::mutex> lock(sh.mu);
  if (sh.queue.empty()) {
    sh.cv.wait_for(lock, std::chrono::milliseconds(s.options.tick_ms),
                   [&] { return !sh.queue.empty(); });
  }
  uint32_t n = 0;
  while (!sh.queue.empty() && n < s.options.chunk_messages) {
    Impl::Message& m = sh.queue.front();
    chunk->raw.push_back(static_cast<char>(m.flags));
    const uint32_t len = static_cast<uint32_t>(m.data.size());
    char b[4];
    std::memcpy(b, &len, 4);
    chunk->raw.append(b, 4);
    chunk->raw.append(m.data);
    sh.queued_bytes -= m.data.size();
    chunk->bytes_read += m.data.size();
    sh.queue.pop_front();
    ++n;
  }
  for (auto& r : sh.pending_gaps) {
    chunk->counters.emplace_back(r.counter, 1);
    if (r.events > 0) {
      chunk->counters.emplace_back("stream_gap_events", static_cast<int64_t>(r.events));
    }
    chunk->errors.push_back(std::move(r.error));
  }
  sh.pending_gaps.clear();
  const bool drained = sh.queue.empty();
  const bool reconnect =
      sh.reopen && sh.stopped && sh.queued_bytes < s.options.max_buffered_bytes / 2;
  const uint64_t seq = chunk->seq;  // the engine's number for this chunk
  if (n > 0) sh.read_through = seq + 1;
  // A changed filter reconnects at once; what the old connection still sends meanwhile is kept.
  const bool refilter = sh.filter_reopen;
  sh.filter_reopen = false;
  lock.unlock();
  chunk->units_read = n;
  if (refilter) sh.filter_pending = true;
  if (reconnect || refilter) ATFILL_RETURN_IF_ERROR(s.StartSession());
  if (n == 0) {
    if (s.options.idle_exit_ms > 0 && drained &&
        SteadyMs() - sh.last_message_ms.load() >= s.options.idle_exit_ms) {
      s.idle_exit = true;
      return false;
    }
    chunk->tick = true;
  }
  return true;
}

void JetstreamSource::Decode(pipeline::EventChunk* chunk) const {
  const std::shared_ptr<const std::vector<std::string>> wanted =
      impl_->CollectionsOfChunk(chunk->seq);
  int64_t unwanted = 0;
  DecodeFrames(chunk, [&](JetstreamFrame& frame) {
    if (auto event = frame.TakeEvent()) {
      if (auto* a = std::get_if<pipeline::AccountEvent>(&*event); a != nullptr && a->resync) {
        a->resync_collections = *wanted;  // the collections it indexes
      }
      if (const auto* r = std::get_if<pipeline::RecordEvent>(&*event);
          r != nullptr && !MatchesAnyPattern(*wanted, r->collection)) {
        ++unwanted;  // sent before the host took a changed filter
        return;
      }
      chunk->events.push_back(std::move(*event));
    }
  });
  if (unwanted > 0) chunk->counters.emplace_back("live_unwanted", unwanted);
}

void JetstreamSource::DecodeFrames(
    pipeline::EventChunk* chunk, const std::function<void(JetstreamFrame& frame)>& on_frame) const {
  const Impl& s = *impl_;
  // One decoder per thread and dictionary.
  thread_local std::unordered_map<const ZstdDictionary*, std::unique_ptr<ZstdFrameDecoder>>
      decoders;
  thread_local std::string text;
  std::string_view raw = chunk->raw;
  size_t pos = 0;
  uint64_t last_seq = 0;
  int64_t last_time = 0;
  int last_host = -1;
  while (pos + 5 <= raw.size()) {
    const uint8_t flags = static_cast<uint8_t>(raw[pos]);
    uint32_t len = 0;
    std::memcpy(&len, raw.data() + pos + 1, 4);
    std::string_view data = raw.substr(pos + 5, len);
    pos += 5 + size_t{len};
    std::string kind;
    std::string_view json = data;
    size_t readable = 0;
    if ((flags & kBinary) != 0) {
      const ZstdDictionary* dict = (flags & 0x0c) == kDictV2   ? s.v2_dict.get()
                                   : (flags & 0x0c) == kDictV1 ? s.v1_dict.get()
                                                               : nullptr;
      auto& dec = decoders[dict];
      if (!dec) {
        std::shared_ptr<const ZstdDictionary> owner = dict == s.v2_dict.get()   ? s.v2_dict
                                                      : dict == s.v1_dict.get() ? s.v1_dict
                                                                                : nullptr;
        auto made = ZstdFrameDecoder::Create(owner, s.options.max_message_bytes);
        if (!made.ok()) {
          chunk->errors.push_back({"bad_zstd", "message", made.status().message()});
          continue;
        }
        dec = std::make_unique<ZstdFrameDecoder>(std::move(*made));
      }
      Status st = dec->Decompress(AsBytes(data), &text, &kind);
      if (!st.ok()) {
        chunk->errors.push_back({kind.empty() ? "bad_zstd" : kind,
                                 "message after seq " + std::to_string(last_seq), st.message()});
        ++chunk->dropped;
        continue;
      }
      json = text;
      readable = text.capacity();
    }
    JetstreamFrame frame;
    Status st = (flags & kV1Frame) != 0
                    ? DecodeJetstreamV1(json, readable, pipeline::Origin::kLive, &frame, &kind)
                    : DecodeJetstreamV2(json, readable, pipeline::Origin::kLive, &frame, &kind);
    if (!st.ok()) {
      chunk->errors.push_back({kind.empty() ? "bad_event" : kind,
                               "message after seq " + std::to_string(last_seq), st.message()});
      ++chunk->dropped;
      continue;
    }
    if (frame.advances_cursor()) {
      last_seq = frame.seq;
      last_time = frame.time_us;
      last_host = (flags >> kHostShift) - 1;
    }
    on_frame(frame);
  }
  if (last_seq != 0) {
    chunk->resume_cursor = std::to_string(last_seq) + ":" + std::to_string(last_time);
    if (last_host >= 0) chunk->resume_cursor += ":" + s.options.hosts[last_host];
    // The reconnect cursor: the newest seq decoded so far (chunks decode out of order), in the
    // numbering of the host the consumer resumes on.
    if (last_host < 0 || last_host == s.shared->seq_host.load()) {
      uint64_t prev = s.shared->last_seq.load();
      while (prev < last_seq && !s.shared->last_seq.compare_exchange_weak(prev, last_seq)) {
      }
    }
    int64_t prev_t = s.shared->last_time_us.load();
    while (prev_t < last_time && !s.shared->last_time_us.compare_exchange_weak(prev_t, last_time)) {
    }
  }
}

std::string JetstreamSource::Describe() const {
  return DescribeLiveStream(
      "jetstream (" + std::string(JetstreamProtocolName(impl_->options.protocol)) + ")",
      impl_->options.hosts);
}

state::StopReason JetstreamSource::Unfinished() const {
  return IdleStopReason(impl_->idle_exit, impl_->options.idle_exit_ms);
}

JetstreamStats JetstreamSource::stats() const {
  const Impl::Shared& sh = *impl_->shared;
  JetstreamStats st;
  st.messages = sh.messages.load();
  st.bytes = sh.bytes.load();
  st.connections = sh.connections.load();
  st.reconnects = st.connections > 0 ? st.connections - 1 : 0;
  st.v1_fallbacks = sh.v1_fallbacks.load();
  st.gap_replays = sh.gap_replays.load();
  st.overflow_drops = sh.overflow_drops.load();
  st.cursor_too_old = sh.cursor_too_old.load();
  st.gaps = sh.gaps.load();
  st.gap_events = sh.gap_events.load();
  st.future_cursors = sh.future_cursors.load();
  st.attempts = sh.attempts.load();
  st.connection_failures = sh.connection_failures.load();
  st.protocol = sh.v1.load() ? "v1" : "v2";
  st.last_seq = sh.last_seq.load();
  st.last_time_us = sh.last_time_us.load();
  st.filter_changes = sh.filter_changes.load();
  st.filter_from_seq = sh.filter_from_seq.load();
  {
    std::lock_guard<std::mutex> lock(impl_->shared->host_mu);
    st.host = impl_->shared->host;
  }
  {
    std::lock_guard<std::mutex> lock(impl_->shared->mu);
    st.buffered_bytes = impl_->shared->queued_bytes;
    st.last_error = impl_->shared->last_error;
  }
  return st;
}

std::vector<std::string> JetstreamSource::collections() const { return *impl_->Collections(); }

bool JetstreamSource::Consumes(std::string_view collection) const {
  return MatchesAnyPattern(*impl_->Collections(), collection);
}

void JetstreamSource::Committed(uint64_t through_seq) {
  Impl::Shared& sh = *impl_->shared;
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    sh.committed = std::max(sh.committed, through_seq + 1);
  }
  sh.committed_cv.notify_all();
}

Status JetstreamSource::WaitFilterApplied(std::chrono::milliseconds timeout) const {
  Impl::Shared& sh = *impl_->shared;
  std::unique_lock<std::mutex> lock(sh.mu);
  const bool done =
      sh.committed_cv.wait_for(lock, timeout, [&] { return sh.committed >= sh.fence; });
  if (done) return Status::OK();
  return Status::Unavailable(
      "the live consumer did not commit the events received before the change within " +
      std::to_string(timeout.count()) + " ms");
}

Status JetstreamSource::SetCollections(std::vector<std::string> collections) {
  if (collections.empty()) {
    return Status::Invalid(
        "live: collections: at least one collection is needed (an empty filter takes every "
        "collection)");
  }
  JetstreamOptions check = impl_->options;
  check.collections = collections;
  ATFILL_RETURN_IF_ERROR(check.Validate());
  Impl::Shared& sh = *impl_->shared;
  {
    // Both locks at once, so no chunk is read between taking the fence and installing the
    // filter it starts (Read holds mu while it fills a chunk; filter_mu is only ever taken alone
    // or inside mu).
    std::lock_guard<std::mutex> lock(sh.mu);
    std::lock_guard<std::mutex> filter_lock(sh.filter_mu);
    sh.fence = sh.read_through;
    sh.collections = std::make_shared<const std::vector<std::string>>(std::move(collections));
    // Entries whose successor starts at or before the committed chunks are decoded already.
    while (sh.filters.size() > 1 && sh.filters[1].first <= sh.committed) {
      sh.filters.erase(sh.filters.begin());
    }
    sh.filters.emplace_back(sh.fence, sh.collections);
  }
  sh.filter_changes.fetch_add(1);
  if (sh.v1.load()) {
    // v1 replaces the open connection's filter in place (SPEC 1.3); when no connection is open
    // the next one asks for the new filter in its URL.
    JsonWriter w;
    w.BeginObject().Key("type").String("options_update").Key("payload").BeginObject();
    w.Key("wantedCollections").BeginArray();
    for (const auto& c : *impl_->Collections()) w.String(c);
    w.EndArray().Key("wantedDids").BeginArray();
    for (const auto& d : impl_->options.dids) w.String(d);
    w.EndArray().Key("maxMessageSizeBytes").Uint(impl_->options.max_message_bytes);
    w.EndObject().EndObject();
    sh.filter_from_seq = sh.last_seq.load();
    (void)impl_->ws->Send(w.Take());  // Unavailable: between connections, the URL carries it
    return Status::OK();
  }
  // v2 filters are fixed per connection: Read (on the engine's thread, where waiting for the
  // close is fine) opens a new connection from the newest seq decoded.
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    sh.filter_reopen = true;
  }
  sh.cv.notify_one();
  return Status::OK();
}

}  // namespace atfill::sources
