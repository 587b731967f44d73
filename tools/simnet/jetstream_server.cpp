#include "tools/simnet/jetstream_server.hpp"
#include "tools/simnet/mix.hpp"

#include <zstd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/websocket.hpp>

#include <simdjson.h>
#include <charconv>
#include <unordered_set>
#include <vector>

#include "atproto/syntax.hpp"
#include "base/json_writer.hpp"
#include "tools/simnet/http_util.hpp"

namespace atfill::simnet {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using HttpAnswer = JetstreamServer::HttpAnswer;

constexpr std::string_view kSubscribe = "/subscribe";
constexpr std::string_view kSubscribeEvents = "/xrpc/network.bsky.jetstream.subscribeEvents";
constexpr std::string_view kGetDictionary = "/xrpc/network.bsky.jetstream.getZstdDictionary";
constexpr std::string_view kV1DictionaryPath = "/simnet/legacy_subscribe.zdict";
constexpr std::string_view kSubprotocol = "xrpc.v1.json";
// Cursors from here on are unix-µs timestamps, below it seqs (SPEC §0).
constexpr int64_t kTimestampCursor = 1'000'000'000'000'000;
// Events a session scans before yielding its strand.
constexpr int kScanSlice = 4096;
// Sample frames the dictionaries are trained on, and their sizes (those of the real ones).
constexpr uint64_t kTrainingEvents = 3000;
constexpr size_t kV1DictionaryCapacity = 112'640;
constexpr size_t kV2DictionaryCapacity = 65'536;

HttpAnswer Xrpc(int status, std::string_view error, std::string_view message) {
  JsonWriter w;
  w.BeginObject().Key("error").String(error);
  if (!message.empty()) w.Key("message").String(message);
  w.EndObject();
  return HttpAnswer{status, "application/json", w.Take()};
}

// Go's http.Error: plain text and a newline.
HttpAnswer Plain(int status, std::string_view text) {
  return HttpAnswer{status, "text/plain; charset=utf-8", std::string(text) + "\n"};
}

// Every value of a (possibly repeated) header.
std::vector<std::string> HeaderValues(const http::request<http::string_body>& req,
                                      http::field field) {
  std::vector<std::string> out;
  auto [lo, hi] = req.equal_range(field);
  for (auto it = lo; it != hi; ++it) out.emplace_back(it->value().data(), it->value().size());
  return out;
}

bool HeaderContains(const http::request<http::string_body>& req, http::field field,
                    std::string_view needle) {
  for (const std::string& v : HeaderValues(req, field)) {
    std::string lower = v;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower.find(needle) != std::string::npos) return true;
  }
  return false;
}

// True when a Sec-WebSocket-Protocol list offers `token` exactly (case-sensitive).
bool OffersSubprotocol(const http::request<http::string_body>& req, std::string_view token) {
  for (const std::string& v : HeaderValues(req, http::field::sec_websocket_protocol)) {
    std::string_view rest = v;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
      while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
      if (item == token) return true;
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return false;
}

template <typename T>
bool ParseWhole(std::string_view text, T* out) {
  if (text.empty() || text.front() == '+') return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

// What one connection asked for, validated.
struct Subscription {
  int version = 2;
  uint64_t start = 1;  // first seq to scan
  // The tip when the connection was resolved: from there on the connection is live (subject to
  // the slow-consumer rule), whether or not it ever caught up.
  uint64_t live_from = 1;
  std::unordered_set<std::string> dids;
  std::unordered_set<std::string> collections;
  std::vector<std::string> prefixes;  // "app.bsky.feed." for "app.bsky.feed.*"
  bool want_commit = true;
  bool want_identity = true;
  bool want_account = true;
  bool want_sync = true;
  uint64_t max_size = 0;  // 0 = no cap
  bool compress = false;
  std::string info;  // v2: the OutdatedCursor message to send first; empty = none
  std::string subprotocol;
};

class WsSession : public std::enable_shared_from_this<WsSession> {
 public:
  WsSession(JetstreamServer* server, beast::tcp_stream&& stream, Subscription sub, uint64_t id)
      : server_(server),
        log_(server->log()),
        options_(server->log().options()),
        ws_(std::move(stream)),
        sub_(std::move(sub)),
        id_(id),
        timer_(ws_.get_executor()),
        watch_(ws_.get_executor()),
        next_(sub_.start) {}

  ~WsSession() {
    if (cctx_ != nullptr) ZSTD_freeCCtx(cctx_);
  }

  void Start(http::request<http::string_body>&& req) {
    req_ = std::move(req);
    beast::get_lowest_layer(ws_).expires_never();
    websocket::stream_base::timeout timeout{};
    timeout.handshake_timeout = std::chrono::seconds(30);
    // A ping after 30 s without traffic from the client; closed after 60 s.
    timeout.idle_timeout = std::chrono::seconds(60);
    timeout.keep_alive_pings = true;
    ws_.set_option(timeout);
    ws_.set_option(websocket::stream_base::decorator(
        [proto = sub_.subprotocol](websocket::response_type& res) {
          res.set(http::field::server, "atfill-simnet");
          if (!proto.empty()) res.set(http::field::sec_websocket_protocol, proto);
        }));
    if (sub_.version == 1 && !sub_.compress) {
      websocket::permessage_deflate pmd;
      pmd.server_enable = true;
      ws_.set_option(pmd);
    }
    ws_.read_message_max(sub_.version == 1 ? 10'000'000 : 1u << 20);
    if (options_.send_buffer_bytes > 0) {
      beast::error_code ignored;
      beast::get_lowest_layer(ws_).socket().set_option(
          asio::socket_base::send_buffer_size(options_.send_buffer_bytes), ignored);
    }
    ws_.async_accept(req_,
                     [self = shared_from_this()](beast::error_code ec) { self->OnAccept(ec); });
  }

 private:
  enum class Ending { kNone, kTooSlow, kClientData };

  void OnAccept(beast::error_code ec) {
    if (ec) return;
    ++server_->connections;
    server_->RecordFilterStart({id_, sub_.version, next_, FilterNames(), false});
    if (sub_.compress) {
      cctx_ = ZSTD_createCCtx();
      if (cctx_ == nullptr ||
          ZSTD_isError(ZSTD_CCtx_refCDict(cctx_, server_->cdict(sub_.version))) ||
          ZSTD_isError(ZSTD_CCtx_setParameter(cctx_, ZSTD_c_windowLog, 17))) {
        return HardClose();
      }
    }
    DoRead();
    if (options_.max_send_queue > 0) Watch();
    Pump();
  }

  void DoRead() {
    ws_.async_read(rbuf_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  std::vector<std::string> FilterNames() const {
    std::vector<std::string> names(sub_.collections.begin(), sub_.collections.end());
    for (const std::string& p : sub_.prefixes) names.push_back(p + "*");
    std::sort(names.begin(), names.end());
    return names;
  }

  // A v1 options_update (SPEC 1.3): replaces the whole filter from the next event scanned. An
  // empty reason: applied, or not an update (ignored); else the close code and reason.
  std::pair<websocket::close_code, std::string> OptionsUpdate(std::string_view text) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    if (parser.parse(text.data(), text.size()).get(doc) != simdjson::SUCCESS) {
      return {websocket::close_code::bad_payload, "bad envelope JSON"};
    }
    std::string_view type;
    if (doc["type"].get(type) != simdjson::SUCCESS || type != "options_update") return {};
    simdjson::dom::object payload;
    if (doc["payload"].get(payload) != simdjson::SUCCESS) {
      return {websocket::close_code::bad_payload, "bad payload JSON"};
    }
    Subscription next = sub_;
    next.collections.clear();
    next.prefixes.clear();
    next.dids.clear();
    simdjson::dom::array list;
    if (payload["wantedCollections"].get(list) == simdjson::SUCCESS) {
      for (auto item : list) {
        std::string_view c;
        if (item.get(c) != simdjson::SUCCESS) {
          return {websocket::close_code::policy_error, "wantedCollections holds a non-string"};
        }
        if (c.ends_with(".*")) {
          next.prefixes.emplace_back(c.substr(0, c.size() - 1));
        } else if (c.find('*') != std::string_view::npos ||
                   !atproto::ValidateNsid(std::string(c)).ok()) {
          return {websocket::close_code::policy_error, "invalid wantedCollections value"};
        } else {
          next.collections.emplace(c);
        }
      }
    }
    if (payload["wantedDids"].get(list) == simdjson::SUCCESS) {
      for (auto item : list) {
        std::string_view d;
        if (item.get(d) != simdjson::SUCCESS || !atproto::ValidateDid(std::string(d)).ok()) {
          return {websocket::close_code::policy_error, "invalid wantedDids value"};
        }
        next.dids.emplace(d);
      }
    }
    int64_t size = 0;
    if (payload["maxMessageSizeBytes"].get(size) == simdjson::SUCCESS) {
      next.max_size = size > 0 ? static_cast<uint64_t>(size) : 0;
    }
    sub_ = std::move(next);
    server_->RecordFilterStart({id_, 1, next_, FilterNames(), true});
    return {};
  }

  void OnRead(beast::error_code ec) {
    if (ec) return Closed();
    if (sub_.version == 1) {
      const std::string text = beast::buffers_to_string(rbuf_.data());
      rbuf_.consume(rbuf_.size());
      auto [code, why] =
          ws_.got_text() ? OptionsUpdate(text) : std::pair<websocket::close_code, std::string>{};
      if (why.empty()) return DoRead();
      // A real server closes with `code` (1007/1008); a write may be pending here, which a close
      // frame must not overlap, so simnet drops the connection.
      static_cast<void>(code);
      return HardClose();
    }
    rbuf_.consume(rbuf_.size());
    ending_ = Ending::kClientData;
    Finish();
  }

  bool Matches(uint64_t seq) const {
    const JetstreamKind kind = log_.event(seq).kind;
    const bool commit = log_.IsCommit(seq);
    if (commit && !sub_.want_commit) return false;
    if (kind == JetstreamKind::kIdentity && !sub_.want_identity) return false;
    if (kind == JetstreamKind::kAccount && !sub_.want_account) return false;
    if (kind == JetstreamKind::kSync && !sub_.want_sync) return false;
    if (!sub_.dids.empty() && !sub_.dids.contains(log_.Did(seq))) return false;
    if (!commit || (sub_.collections.empty() && sub_.prefixes.empty())) return true;
    const std::string& collection = log_.Collection(seq);
    if (sub_.collections.contains(collection)) return true;
    for (const std::string& p : sub_.prefixes) {
      if (collection.starts_with(p)) return true;
    }
    return false;
  }

  // Writes the next frame, or waits for the next publication; one of the two at a time.
  void Pump() {
    if (closed_ || writing_ || waiting_) return;
    if (ending_ != Ending::kNone) return Finish();
    if (!sub_.info.empty()) {
      JsonWriter w;
      w.BeginObject().Key("$type").String("message").Key("payload").BeginObject();
      w.Key("$type").String("network.bsky.jetstream.subscribeEvents#info");
      w.Key("message").String(sub_.info).Key("name").String("OutdatedCursor");
      w.EndObject().EndObject();
      sub_.info.clear();
      return Send(w.Take());
    }
    const uint64_t published = server_->Published();
    for (int scanned = 0; next_ <= published; ++scanned) {
      if (scanned == kScanSlice) {
        waiting_ = true;
        asio::post(ws_.get_executor(), [self = shared_from_this()] {
          self->waiting_ = false;
          self->Pump();
        });
        return;
      }
      const uint64_t seq = next_++;
      if (seq >= sub_.live_from) live_ = true;
      if (!Matches(seq)) continue;
      if (sub_.version == 2) {
        if (const std::string* ready = server_->PrerenderedV2(seq, sub_.compress)) {
          if (sub_.max_size > 0 && server_->PrerenderedV2(seq, false)->size() > sub_.max_size) {
            continue;
          }
          return SendReady(*ready);
        }
      }
      Result<std::string> frame = sub_.version == 1 ? log_.FrameV1(seq) : log_.FrameV2(seq);
      if (!frame.ok()) return HardClose();
      if (frame->empty()) continue;  // not carried on this version (#sync on v1)
      if (sub_.max_size > 0 && frame->size() > sub_.max_size) continue;
      return Send(std::move(*frame));
    }
    live_ = true;
    if (next_ > log_.size()) return;  // everything is out: the connection stays open, idle
    waiting_ = true;
    timer_.expires_at(server_->start() + log_.PublishTime(next_));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      self->waiting_ = false;
      if (!ec) self->Pump();
    });
  }

  void Send(std::string text) {
    writing_ = true;
    if (sub_.compress) {
      out_.resize(ZSTD_compressBound(text.size()));
      const size_t size = ZSTD_compress2(cctx_, out_.data(), out_.size(), text.data(), text.size());
      if (ZSTD_isError(size)) {
        writing_ = false;
        return HardClose();
      }
      out_.resize(size);
      ws_.binary(true);
    } else {
      out_ = std::move(text);
      ws_.text(true);
    }
    ws_.async_write(asio::buffer(out_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->OnWrite(ec);
    });
  }

  // A prerendered frame (compressed when the connection is): sent from the server's copy.
  void SendReady(const std::string& frame) {
    writing_ = true;
    ws_.binary(sub_.compress);
    ws_.async_write(asio::buffer(frame), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->OnWrite(ec);
    });
  }

  void OnWrite(beast::error_code ec) {
    writing_ = false;
    if (ec) return Closed();
    if (finishing_) return HardClose();  // the error frame is out
    ++server_->frames;
    ++frames_;
    const bool cut =
        (options_.disconnect_after_frames > 0 && frames_ >= options_.disconnect_after_frames) ||
        (options_.disconnect_probability > 0 &&
         static_cast<double>(Mix(Mix(log_.network().options().seed ^ Mix(id_)) ^ frames_) >> 11) *
                 0x1.0p-53 <
             options_.disconnect_probability);
    if (cut) {
      ++server_->disconnects;
      return HardClose();
    }
    Pump();
  }

  // Slow-consumer checks, every 20 ms while events remain to be written.
  void Watch() {
    watch_.expires_after(std::chrono::milliseconds(20));
    watch_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_ || self->ending_ != Ending::kNone) return;
      if (self->live_) {
        const uint64_t published = self->server_->Published();
        const uint64_t behind = published >= self->next_ ? published - self->next_ + 1 : 0;
        if (behind > self->options_.max_send_queue) {
          self->ending_ = Ending::kTooSlow;
          ++self->server_->slow_drops;
          self->Finish();
          if (self->closed_) return;
          // A write the client never drains must not hold the connection forever.
          self->watch_.expires_after(std::chrono::milliseconds(self->options_.slow_drop_grace_ms));
          self->watch_.async_wait([self](beast::error_code ec2) {
            if (!ec2 && !self->closed_) self->HardClose();
          });
          return;
        }
      }
      if (self->next_ <= self->log_.size()) self->Watch();
    });
  }

  // Ends the connection as `ending_` says, once no write is pending.
  void Finish() {
    if (closed_ || finishing_ || writing_) return;
    finishing_ = true;
    timer_.cancel();
    if (ending_ == Ending::kClientData) {
      writing_ = true;
      ws_.async_close(websocket::close_reason(websocket::close_code::policy_error,
                                              "subscribeEvents is server-push only"),
                      [self = shared_from_this()](beast::error_code) {
                        self->writing_ = false;
                        self->HardClose();
                      });
      return;
    }
    if (sub_.version == 2) {
      JsonWriter w;
      w.BeginObject().Key("$type").String("error").Key("error").String("ConsumerTooSlow");
      w.Key("message").String("consumer fell more than " + std::to_string(options_.max_send_queue) +
                              " events behind the tip; reconnect from your last seq");
      w.EndObject();
      return Send(w.Take());
    }
    HardClose();  // v1: dropped without a frame
  }

  void Closed() {
    closed_ = true;
    timer_.cancel();
    watch_.cancel();
  }

  // Closes the socket without a close frame.
  void HardClose() {
    Closed();
    beast::error_code ignored;
    auto& socket = beast::get_lowest_layer(ws_).socket();
    socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
  }

  JetstreamServer* server_;
  const JetstreamLog& log_;
  const JetstreamOptions& options_;
  websocket::stream<beast::tcp_stream> ws_;
  Subscription sub_;
  uint64_t id_;
  asio::steady_timer timer_;  // the next publication
  asio::steady_timer watch_;  // slow-consumer checks, then the drop's grace period
  http::request<http::string_body> req_;
  beast::flat_buffer rbuf_;
  std::string out_;
  ZSTD_CCtx* cctx_ = nullptr;
  uint64_t next_;        // next seq to scan
  uint64_t frames_ = 0;  // frames written (info and events)
  bool writing_ = false;
  bool waiting_ = false;  // a timer or a posted continuation will call Pump
  bool live_ = false;     // past Subscription::live_from, or caught up with the tip
  bool closed_ = false;
  bool finishing_ = false;
  Ending ending_ = Ending::kNone;
};

// Resolves ?cursor= (SPEC §0) into sub->start; an answer when the request is refused.
std::optional<HttpAnswer> ResolveCursor(const JetstreamServer& server, const Target& t,
                                        Subscription* sub) {
  const JetstreamLog& log = server.log();
  const bool v1 = sub->version == 1;
  const uint64_t published = server.Published();
  const uint64_t tip = published + 1;
  const uint64_t retention = log.options().retention_events;
  const uint64_t floor = retention > 0 && published > retention ? published - retention + 1 : 1;
  const std::optional<std::string> text = t.Param("cursor");
  sub->start = tip;
  sub->live_from = tip;
  if (!text || text->empty()) return std::nullopt;
  int64_t cursor = 0;
  if (!ParseWhole(*text, &cursor) || cursor < 0) {
    const std::string why = "invalid cursor \"" + *text + "\": not a non-negative integer";
    return v1 ? Plain(400, why) : Xrpc(400, "InvalidRequest", why);
  }
  if (cursor < kTimestampCursor) {
    // This instance's numbering (JetstreamOptions::seq_offset) back to the log's.
    const auto offset = static_cast<int64_t>(log.options().seq_offset);
    const uint64_t seq = static_cast<uint64_t>(std::max<int64_t>(cursor - offset, 1));
    if (seq >= tip) return std::nullopt;
    if (seq < floor) {
      if (!v1) {
        return Xrpc(400, "CursorTooOld",
                    "cursor " + std::to_string(cursor) + " below lookback floor " +
                        std::to_string(floor + static_cast<uint64_t>(offset)) +
                        "; re-backfill from your last seq");
      }
      sub->start = floor;
      return std::nullopt;
    }
    sub->start = seq;
    return std::nullopt;
  }
  if (published == 0 || cursor > log.TimeUs(published)) return std::nullopt;
  uint64_t seq = log.SeqAtTime(cursor);
  if (seq < floor) {
    if (!v1) {
      sub->info = "cursor " + std::to_string(cursor) +
                  " is older than the lookback window; replaying from seq " +
                  std::to_string(floor + log.options().seq_offset);
    }
    seq = floor;
  }
  sub->start = seq;
  return std::nullopt;
}

bool SocketEncodingZstd(const http::request<http::string_body>& req) {
  auto [lo, hi] = req.equal_range("Socket-Encoding");
  for (auto it = lo; it != hi; ++it) {
    std::string lower(it->value().data(), it->value().size());
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower.find("zstd") != std::string::npos) return true;
  }
  return false;
}

std::optional<HttpAnswer> ParseV1(const JetstreamServer& server, const Target& t,
                                  const http::request<http::string_body>& req, Subscription* sub) {
  sub->version = 1;
  const std::vector<std::string> collections = t.Params("wantedCollections");
  if (collections.size() > 10'000) return Plain(400, "too many wantedCollections (over 10000)");
  for (const std::string& c : collections) {
    if (c.ends_with(".*")) {
      const std::string prefix = c.substr(0, c.size() - 1);
      if (std::find(sub->prefixes.begin(), sub->prefixes.end(), prefix) == sub->prefixes.end()) {
        sub->prefixes.push_back(prefix);
      }
    } else if (c.find('*') != std::string::npos || !atproto::ValidateNsid(c).ok()) {
      return Plain(400, "invalid wantedCollections value \"" + c + "\"");
    } else {
      sub->collections.insert(c);
    }
  }
  if (sub->collections.size() + sub->prefixes.size() > 100) {
    return Plain(400, "too many wantedCollections (over 100 unique)");
  }
  const std::vector<std::string> dids = t.Params("wantedDids");
  if (dids.size() > 1'000'000) return Plain(400, "too many wantedDids (over 1000000)");
  for (const std::string& d : dids) {
    if (!atproto::ValidateDid(d).ok()) return Plain(400, "invalid wantedDids value \"" + d + "\"");
    sub->dids.insert(d);
  }
  if (sub->dids.size() > 10'000) return Plain(400, "too many wantedDids (over 10000 unique)");
  if (std::optional<std::string> size = t.Param("maxMessageSizeBytes")) {
    int64_t value = 0;
    sub->max_size = ParseWhole(*size, &value) && value > 0 ? static_cast<uint64_t>(value) : 0;
  }
  sub->compress = t.Param("compress").value_or("") == "true" || SocketEncodingZstd(req);
  if (sub->compress &&
      HeaderContains(req, http::field::sec_websocket_extensions, "permessage-deflate")) {
    return Plain(400, "zstd compression and permessage-deflate cannot be combined");
  }
  return ResolveCursor(server, t, sub);
}

std::optional<HttpAnswer> ParseV2(const JetstreamServer& server, const Target& t,
                                  const http::request<http::string_body>& req, Subscription* sub) {
  sub->version = 2;
  const auto invalid = [](const std::string& why) { return Xrpc(400, "InvalidRequest", why); };
  for (const char* name : {"wantedDids", "wantedCollections", "requireHello"}) {
    if (t.Param(name)) {
      return invalid(std::string(name) + " is a /subscribe parameter; subscribeEvents takes " +
                     "dids, collections and kinds");
    }
  }
  if (t.Param("compress").value_or("") == "true" || SocketEncodingZstd(req)) {
    return invalid("subscribeEvents compresses only with zstdDictionary=<id>");
  }
  const std::vector<std::string> kinds = t.Params("kinds");
  if (kinds.size() > 4) return invalid("at most 4 kinds");
  if (!kinds.empty()) {
    sub->want_commit = sub->want_identity = sub->want_account = sub->want_sync = false;
    for (const std::string& k : kinds) {
      if (k == "commit") {
        sub->want_commit = true;
      } else if (k == "identity") {
        sub->want_identity = true;
      } else if (k == "account") {
        sub->want_account = true;
      } else if (k == "sync") {
        sub->want_sync = true;
      } else {
        return invalid("unknown kind \"" + k + "\" (commit, identity, account, sync)");
      }
    }
  }
  const std::vector<std::string> dids = t.Params("dids");
  if (dids.size() > 10'000) return invalid("at most 10000 dids");
  for (const std::string& d : dids) {
    if (Status s = atproto::ValidateDid(d); !s.ok()) {
      return invalid("invalid did \"" + d + "\": " + s.message());
    }
    sub->dids.insert(d);
  }
  const std::vector<std::string> collections = t.Params("collections");
  if (collections.size() > 100) return invalid("at most 100 collections");
  for (const std::string& c : collections) {
    if (c.ends_with(".*")) {
      const std::string prefix = c.substr(0, c.size() - 1);
      if (!atproto::ValidateNsid(prefix + "x").ok()) {
        return invalid("invalid collection wildcard \"" + c + "\"");
      }
      sub->prefixes.push_back(prefix);
    } else if (Status s = atproto::ValidateNsid(c); !s.ok()) {
      return invalid("invalid collection \"" + c + "\": " + s.message());
    } else {
      sub->collections.insert(c);
    }
  }
  if (!collections.empty() && !sub->want_commit) {
    return invalid("collections filter commits, but kinds excludes commit");
  }
  const std::vector<std::string> sizes = t.Params("maxMessageSizeBytes");
  if (sizes.size() > 1) return invalid("maxMessageSizeBytes given more than once");
  if (sizes.size() == 1) {
    uint32_t value = 0;
    if (!ParseWhole(sizes[0], &value)) {
      return invalid("maxMessageSizeBytes \"" + sizes[0] + "\" is not an unsigned 32-bit integer");
    }
    sub->max_size = value;
  }
  if (std::optional<std::string> dict = t.Param("zstdDictionary")) {
    uint32_t id = 0;
    if (!ParseWhole(*dict, &id) || id == 0) {
      return invalid("zstdDictionary \"" + *dict + "\" is not a positive 32-bit integer");
    }
    const uint32_t current = server.log().options().v2_dictionary_id;
    if (id != current) {
      return Xrpc(400, "UnknownZstdDictionary",
                  "zstd dictionary " + std::to_string(id) +
                      " is unknown; the current dictionary id is " + std::to_string(current));
    }
    sub->compress = true;
  }
  if (OffersSubprotocol(req, kSubprotocol)) sub->subprotocol = std::string(kSubprotocol);
  return ResolveCursor(server, t, sub);
}

}  // namespace

Result<std::unique_ptr<JetstreamServer>> JetstreamServer::Create(const Network& net,
                                                                 const JetstreamOptions& options) {
  std::unique_ptr<JetstreamServer> s(new JetstreamServer());
  ATFILL_ASSIGN_OR_RETURN(s->log_, JetstreamLog::Generate(net, options));
  JetstreamOptions sample;
  sample.events = kTrainingEvents;
  sample.start_time_us = options.start_time_us;
  sample.interval_us = options.interval_us;
  ATFILL_ASSIGN_OR_RETURN(std::unique_ptr<JetstreamLog> samples,
                          JetstreamLog::Generate(net, sample, /*salt=*/1));
  ATFILL_ASSIGN_OR_RETURN(
      s->v1_dict_, TrainJetstreamDictionary(*samples, 1, options.v1_dictionary_id, kTrainingEvents,
                                            kV1DictionaryCapacity));
  ATFILL_ASSIGN_OR_RETURN(
      s->v2_dict_, TrainJetstreamDictionary(*samples, 2, options.v2_dictionary_id, kTrainingEvents,
                                            kV2DictionaryCapacity));
  s->v1_cdict_ = ZSTD_createCDict(s->v1_dict_.data(), s->v1_dict_.size(), ZSTD_CLEVEL_DEFAULT);
  s->v2_cdict_ = ZSTD_createCDict(s->v2_dict_.data(), s->v2_dict_.size(), 1);
  if (s->v1_cdict_ == nullptr || s->v2_cdict_ == nullptr) {
    return Status::Internal("libzstd refused a trained jetstream dictionary");
  }
  if (options.prerender) {
    // Compressed exactly as a connection compresses (WsSession: the v2 CDict, window 128 KiB).
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    if (cctx == nullptr || ZSTD_isError(ZSTD_CCtx_refCDict(cctx, s->v2_cdict_)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_windowLog, 17))) {
      ZSTD_freeCCtx(cctx);
      return Status::Internal("cannot set up zstd to prerender the jetstream frames");
    }
    const uint64_t n = s->log_->size();
    s->v2_text_.resize(n + 1);
    s->v2_zstd_.resize(n + 1);
    for (uint64_t seq = 1; seq <= n; ++seq) {
      auto frame = s->log_->FrameV2(seq);
      if (!frame.ok()) {
        ZSTD_freeCCtx(cctx);
        return frame.status();
      }
      std::string& z = s->v2_zstd_[seq];
      z.resize(ZSTD_compressBound(frame->size()));
      const size_t size = ZSTD_compress2(cctx, z.data(), z.size(), frame->data(), frame->size());
      if (ZSTD_isError(size)) {
        ZSTD_freeCCtx(cctx);
        return Status::Internal(std::string("zstd: ") + ZSTD_getErrorName(size));
      }
      z.resize(size);
      z.shrink_to_fit();
      s->v2_text_[seq] = std::move(*frame);
    }
    ZSTD_freeCCtx(cctx);
  }
  s->start_ = std::chrono::steady_clock::now();
  return s;
}

JetstreamServer::~JetstreamServer() {
  ZSTD_freeCDict(v1_cdict_);
  ZSTD_freeCDict(v2_cdict_);
}

std::optional<HttpAnswer> JetstreamServer::Handle(http::request<http::string_body>&& req,
                                                  beast::tcp_stream& stream) {
  const Target t = ParseTarget(std::string_view(req.target().data(), req.target().size()));
  const bool get = req.method() == http::verb::get;
  if (t.path == "/xrpc/_health")
    return HttpAnswer{200, "application/json", "{\"version\":\"atfill-simnet\"}"};
  if (t.path == kGetDictionary || t.path == kV1DictionaryPath) {
    if (!get) return Xrpc(405, "MethodNotAllowed", "getZstdDictionary is a GET query");
    const ByteView dict = dictionary(t.path == kGetDictionary ? 2 : 1);
    return HttpAnswer{200, "application/octet-stream", std::string(AsChars(dict))};
  }
  const bool v1 = t.path == kSubscribe;
  if (!v1 && t.path != kSubscribeEvents) {
    if (t.path.starts_with("/xrpc/")) {
      return Xrpc(501, "MethodNotImplemented", "method not implemented: " + t.path.substr(6));
    }
    return Plain(404, "404 page not found");
  }
  if (!get) {
    return v1 ? Plain(405, "Method Not Allowed")
              : Xrpc(405, "MethodNotAllowed", "subscribeEvents is a GET WebSocket endpoint");
  }
  Subscription sub;
  if (std::optional<HttpAnswer> refused =
          v1 ? ParseV1(*this, t, req, &sub) : ParseV2(*this, t, req, &sub)) {
    return refused;
  }
  if (!websocket::is_upgrade(req)) {
    return v1 ? Plain(400, "Bad Request: the client is not using the websocket protocol")
              : Xrpc(400, "InvalidRequest", "subscribeEvents is a WebSocket endpoint");
  }
  auto session =
      std::make_shared<WsSession>(this, std::move(stream), std::move(sub), next_connection_++);
  session->Start(std::move(req));
  return std::nullopt;
}

std::vector<JetstreamFilterStart> JetstreamServer::filter_starts() const {
  std::lock_guard<std::mutex> lock(filters_mu_);
  return filter_starts_;
}

void JetstreamServer::RecordFilterStart(JetstreamFilterStart start) {
  std::lock_guard<std::mutex> lock(filters_mu_);
  filter_starts_.push_back(std::move(start));
}

}  // namespace atfill::simnet
