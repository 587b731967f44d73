#include "tools/simnet/labeler_server.hpp"
#include "tools/simnet/mix.hpp"

#include <boost/asio/steady_timer.hpp>
#include <boost/beast/websocket.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <map>

#include "atproto/syntax.hpp"
#include "base/json_writer.hpp"
#include "base/sha256.hpp"
#include "sources/labels/label_frames.hpp"
#include "tools/simnet/http_util.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill::simnet {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;

constexpr std::string_view kSubscribe = "/xrpc/com.atproto.label.subscribeLabels";
constexpr const char* kVals[] = {"spam", "rude", "nudity", "!hide", "misleading"};
// Label times: 2025-01-01T00:00:00Z plus one second per seq.
constexpr int64_t kStartUs = 1'735'689'600'000'000;
constexpr int64_t kFarFutureUs = 4'070'908'800'000'000;  // 2099-01-01T00:00:00Z

Result<atproto::PrivateKey> KeyFrom(std::string label) {
  for (int attempt = 0; attempt < 16; ++attempt, label.push_back('+')) {
    const Sha256Digest digest = Sha256(AsBytes(label));
    auto key = atproto::PrivateKey::FromBytes(atproto::KeyType::kSecp256k1,
                                              ByteView(digest.data(), digest.size()));
    if (key.ok()) return key;
  }
  return Status::Internal("no valid labeler key for " + label);
}

std::string Time(int64_t us) {
  auto t = atproto::Datetime::FromUnixMicros(us);
  return t.ok() ? t->str() : std::string();
}

// One subscription: the frames from `next` on, paced by frames_per_second, then idle until the
// client goes.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(LabelerServer* server, beast::tcp_stream&& stream, uint64_t next, bool future)
      : server_(server),
        ws_(std::move(stream)),
        timer_(ws_.get_executor()),
        next_(next),
        future_(future) {}

  void Start(http::request<http::string_body>&& req) {
    req_ = std::move(req);
    beast::get_lowest_layer(ws_).expires_never();
    ws_.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
    ws_.binary(true);
    ws_.async_accept(req_, [self = shared_from_this()](beast::error_code ec) {
      if (ec) return;
      ++self->server_->connections;
      self->start_ = std::chrono::steady_clock::now();
      self->Read();
      self->Pump();
    });
  }

 private:
  void Read() {
    ws_.async_read(rbuf_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return;  // the client went: the session ends with its last handler
      self->rbuf_.consume(self->rbuf_.size());
      self->Read();
    });
  }

  void Pump() {
    if (future_) {
      out_ = sources::EncodeErrorFrame("FutureCursor", "cursor is past the labeler's last seq");
      ws_.async_write(
          asio::buffer(out_), [self = shared_from_this()](beast::error_code ec, size_t) {
            if (ec) return;
            self->ws_.async_close(websocket::close_code::normal, [self](beast::error_code) {});
          });
      return;
    }
    const LabelerLog& log = server_->log();
    if (next_ > log.size()) return;  // the tip: idle, the read loop keeps the session
    const double rate = server_->options().frames_per_second;
    if (rate > 0) {
      const auto due = start_ + std::chrono::microseconds(static_cast<int64_t>(1e6 * sent_ / rate));
      if (std::chrono::steady_clock::now() < due) {
        timer_.expires_at(due);
        timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
          if (!ec) self->Pump();
        });
        return;
      }
    }
    const Bytes& frame = log.frame(next_);
    ws_.async_write(asio::buffer(frame.data(), frame.size()),
                    [self = shared_from_this()](beast::error_code ec, size_t) {
                      if (ec) return;
                      ++self->server_->frames_sent;
                      ++self->sent_;
                      ++self->next_;
                      self->Pump();
                    });
  }

  LabelerServer* server_;
  websocket::stream<beast::tcp_stream> ws_;
  asio::steady_timer timer_;
  http::request<http::string_body> req_;
  beast::flat_buffer rbuf_;
  Bytes out_;
  uint64_t next_;
  bool future_;
  uint64_t sent_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

Result<std::unique_ptr<LabelerLog>> LabelerLog::Generate(const Network& net,
                                                         const LabelerOptions& options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<LabelerLog> log(new LabelerLog());
  const uint64_t seed = net.options().seed;
  // did:plc: 24 base32 characters derived from the seed.
  static constexpr char kB32[] = "abcdefghijklmnopqrstuvwxyz234567";
  const Sha256Digest d = Sha256(AsBytes("simnet-labeler/" + std::to_string(seed)));
  log->did_ = "did:plc:";
  for (size_t c = 0; c < 24; ++c) log->did_.push_back(kB32[d[c] & 31]);
  ATFILL_ASSIGN_OR_RETURN(auto key, KeyFrom("simnet-labeler-key/" + std::to_string(seed)));
  ATFILL_ASSIGN_OR_RETURN(auto other, KeyFrom("simnet-labeler-other/" + std::to_string(seed)));
  log->key_ = key;
  const auto& accounts = net.accounts();
  if (accounts.empty()) return Status::Invalid("the labeler needs accounts to label");
  // Labels in force so far (for negations to pick from), by (uri, val).
  std::vector<std::pair<std::string, std::string>> in_force;
  std::map<std::pair<std::string, std::string>, size_t> in_force_at;
  for (uint64_t seq = 1; seq <= options.labels; ++seq) {
    const uint64_t r = Mix(seed ^ Mix(seq * 0x1ABE1));
    const double u = Unit(Mix(r));
    Entry e;
    e.cts = Time(kStartUs + static_cast<int64_t>(seq) * 1'000'000);
    double edge = options.negation_share;
    if (u < edge && !in_force.empty()) {
      const size_t pick = Mix(r ^ 7) % in_force.size();
      e.uri = in_force[pick].first;
      e.val = in_force[pick].second;
      e.neg = true;
      ++log->negations;
    } else {
      const auto& a = accounts[Mix(r ^ 3) % accounts.size()];
      // Half the labels are on an account, half on one of its (possibly made-up) posts.
      e.uri =
          (r & 1) ? a.did : "at://" + a.did + "/app.bsky.feed.post/3l" + std::to_string(r % 100000);
      e.val = kVals[(r >> 8) % std::size(kVals)];
      if (u >= edge && u < (edge += options.expired_share)) {
        e.exp = Time(kStartUs + static_cast<int64_t>(seq) * 1'000'000 + 60'000'000);
        ++log->expired;
      } else if (u >= edge && u < (edge += options.expiring_share)) {
        e.exp = Time(kFarFutureUs);
        ++log->expiring;
      } else if (u >= edge && u < (edge += options.bad_signature_share)) {
        e.bad_signature = true;
        ++log->bad_signatures;
      }
    }
    if (!e.exp.empty()) e.exp_us = atproto::Datetime::Parse(e.exp)->unix_micros();
    pipeline::Label l;
    l.src = log->did_;
    l.uri = e.uri;
    l.val = e.val;
    l.neg = e.neg;
    l.cts = e.cts;
    l.exp = e.exp;
    const Bytes unsigned_bytes = sources::EncodeLabel(l, {});
    ATFILL_ASSIGN_OR_RETURN(Bytes sig, (e.bad_signature ? other : key).Sign(unsigned_bytes));
    log->frames_.push_back(
        sources::EncodeLabelsFrame(static_cast<int64_t>(seq), {sources::EncodeLabel(l, sig)}));
    const auto k = std::make_pair(e.uri, e.val);
    if (!e.bad_signature) {
      auto it = in_force_at.find(k);
      if (e.neg && it != in_force_at.end()) {
        // Swap-remove from the list of labels in force.
        const size_t at = it->second;
        in_force_at[in_force.back()] = at;
        in_force[at] = in_force.back();
        in_force.pop_back();
        in_force_at.erase(k);
      } else if (!e.neg && it == in_force_at.end()) {
        in_force_at[k] = in_force.size();
        in_force.push_back(k);
      }
    }
    log->entries_.push_back(std::move(e));
  }
  return log;
}

std::vector<LabelTruth> LabelerLog::Truth(uint64_t through_seq) const {
  std::map<std::pair<std::string, std::string>, LabelTruth> held;
  const uint64_t n = std::min<uint64_t>(through_seq, entries_.size());
  for (uint64_t i = 0; i < n; ++i) {
    const Entry& e = entries_[i];
    if (e.bad_signature) continue;
    const auto k = std::make_pair(e.uri, e.val);
    if (e.neg) {
      held.erase(k);
    } else {
      held[k] = LabelTruth{e.uri, e.val, e.cts, e.exp, e.exp_us};
    }
  }
  std::vector<LabelTruth> out;
  for (auto& [k, t] : held) out.push_back(std::move(t));
  return out;
}

std::string LabelerLog::DidDocument(const std::string& endpoint) const {
  JsonWriter w;
  w.BeginObject();
  w.Key("@context").BeginArray();
  w.String("https://www.w3.org/ns/did/v1").String("https://w3id.org/security/multikey/v1");
  w.EndArray();
  w.Key("id").String(did_);
  w.Key("alsoKnownAs").BeginArray().String("at://labeler.simnet.test").EndArray();
  w.Key("verificationMethod").BeginArray().BeginObject();
  w.Key("id").String(did_ + "#atproto_label").Key("type").String("Multikey");
  w.Key("controller").String(did_);
  w.Key("publicKeyMultibase").String(key_->public_key().ToMultibase());
  w.EndObject().EndArray();
  w.Key("service").BeginArray().BeginObject();
  w.Key("id").String("#atproto_labeler").Key("type").String("AtprotoLabeler");
  w.Key("serviceEndpoint").String(endpoint);
  w.EndObject().EndArray();
  w.EndObject();
  return w.Take();
}

Result<std::unique_ptr<LabelerServer>> LabelerServer::Create(const Network& net,
                                                             const LabelerOptions& options) {
  std::unique_ptr<LabelerServer> server(new LabelerServer());
  server->options_ = options;
  ATFILL_ASSIGN_OR_RETURN(server->log_, LabelerLog::Generate(net, options));
  return server;
}

std::optional<std::pair<int, std::string>> LabelerServer::Handle(
    http::request<http::string_body>&& req, beast::tcp_stream& stream) {
  const Target t = ParseTarget(std::string_view(req.target().data(), req.target().size()));
  if (t.path == "/xrpc/_health") return std::make_pair(200, "{\"version\":\"atfill-simnet\"}");
  if (t.path != kSubscribe) {
    return std::make_pair(501, "{\"error\":\"MethodNotImplemented\"}");
  }
  if (!websocket::is_upgrade(req)) {
    return std::make_pair(400,
                          "{\"error\":\"InvalidRequest\",\"message\":\"subscribeLabels is a "
                          "WebSocket endpoint\"}");
  }
  uint64_t next = log_->size() + 1;  // no cursor: only what is published later
  bool future = false;
  if (std::optional<std::string> cursor = t.Param("cursor")) {
    uint64_t c = 0;
    auto [end, ec] = std::from_chars(cursor->data(), cursor->data() + cursor->size(), c);
    if (ec != std::errc() || end != cursor->data() + cursor->size()) {
      return std::make_pair(400, "{\"error\":\"InvalidRequest\",\"message\":\"bad cursor\"}");
    }
    future = c > log_->size();
    next = c + 1;
  }
  auto session = std::make_shared<Session>(this, std::move(stream), next, future);
  session->Start(std::move(req));
  return std::nullopt;
}

}  // namespace atfill::simnet
