#include "net/websocket.hpp"

#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <cctype>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "net/endpoint.hpp"

namespace atfill::net {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

constexpr uint64_t kMaxMessageCap = uint64_t{1} << 30;
// A read buffer grown beyond this by one large message is released after it.
constexpr size_t kKeepBufferBytes = size_t{1} << 20;
// Close() gives up on Beast's own close timer this long after it should have fired.
constexpr int64_t kCloseGraceMs = 1'000;

bool HasControlOrSpace(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u <= 0x20 || u == 0x7f;
  });
}

bool HasLineBreakOrNul(std::string_view s) {
  return s.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos;
}

// RFC 9110 token characters (header names, subprotocol tokens).
bool IsToken(std::string_view s) {
  static constexpr std::string_view kExtra = "!#$%&'*+-.^_`|~";
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 ||
           kExtra.find(c) != std::string_view::npos;
  });
}

std::string Str(beast::string_view s) { return std::string(s.data(), s.size()); }

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string FormatEndpoint(const tcp::endpoint& ep) {
  const std::string address = ep.address().to_string();
  const std::string port = std::to_string(ep.port());
  return ep.address().is_v6() ? "[" + address + "]:" + port : address + ":" + port;
}

// Counters shared with stats(); relaxed atomics (they order nothing).
struct Counters {
  std::atomic<uint64_t> attempts{0};
  std::atomic<uint64_t> connections{0};
  std::atomic<uint64_t> refusals{0};
  std::atomic<uint64_t> failures{0};
  std::atomic<uint64_t> closes{0};
  std::atomic<uint64_t> messages{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> pings_received{0};
  std::atomic<uint64_t> pongs_received{0};
  std::atomic<uint64_t> messages_sent{0};
};

void Bump(std::atomic<uint64_t>& counter, uint64_t by = 1) {
  counter.fetch_add(by, std::memory_order_relaxed);
}

// One attempt and, if it opens, one connection.
class Connection {
 public:
  virtual ~Connection() = default;
  // Resolves, connects, upgrades and then reads until the end, which is reported once.
  virtual void Start() = 0;
  // Ends it at once and silently: nothing is reported afterwards.
  virtual void Abort() = 0;
  // Sends close 1000 on an open connection and reports the end when the handshake completes
  // (bounded); an attempt that is not open yet is aborted instead and false returned.
  virtual bool CloseGracefully() = 0;
  virtual void Write(std::string text) = 0;
  virtual bool open() const = 0;
};

// What a connection reports to its owner. All calls happen on the loop thread.
class ConnectionOwner {
 public:
  virtual void OnOpen(const Connection* connection, std::string subprotocol,
                      std::string remote) = 0;
  virtual void OnMessage(std::string_view data, bool binary) = 0;
  // The connection is over; `event` has kind, the kind-specific fields and `error` filled in.
  virtual void OnEnded(const Connection* connection, ConnectionEvent event) = 0;
  virtual Counters& counters() = 0;

 protected:
  ~ConnectionOwner() = default;
};

template <bool kTls>
class WsConnection final : public Connection,
                           public std::enable_shared_from_this<WsConnection<kTls>> {
 public:
  using NextLayer =
      std::conditional_t<kTls, beast::ssl_stream<beast::tcp_stream>, beast::tcp_stream>;
  using Stream = websocket::stream<NextLayer, false>;

  WsConnection(ConnectionOwner* owner, const WebSocketOptions& options, WebSocketUrl url,
               std::string url_text, asio::io_context& io, ssl::context* tls)
      : owner_(owner),
        options_(options),
        url_(std::move(url)),
        url_text_(std::move(url_text)),
        resolver_(io),
        ws_(MakeStream(io, tls)),
        deadline_(io) {}

  void Start() override {
    auto self = this->shared_from_this();
    deadline_.expires_after(Millis(options_.connect_timeout_ms));
    deadline_.async_wait([self](beast::error_code ec) {
      if (ec || self->aborted_ || self->phase_ != Phase::kConnecting) return;
      self->timed_out_ = true;
      self->resolver_.cancel();
      beast::get_lowest_layer(self->ws_).close();
    });
    // "localhost" and "*.localhost" are loopback by definition (RFC 6761 section 6.3), as
    // libcurl treats them, whatever the system resolver knows.
    const std::string& h = url_.host;
    const bool local =
        h == "localhost" || (h.size() > 10 && h.compare(h.size() - 10, 10, ".localhost") == 0);
    resolver_.async_resolve(local ? std::string("127.0.0.1") : h, std::to_string(url_.port),
                            [self](beast::error_code ec, tcp::resolver::results_type results) {
                              self->OnResolved(ec, std::move(results));
                            });
  }

  void Abort() override {
    aborted_ = true;
    deadline_.cancel();
    resolver_.cancel();
    beast::get_lowest_layer(ws_).close();
  }

  bool CloseGracefully() override {
    if (phase_ != Phase::kOpen) {
      Abort();
      return false;
    }
    if (closing_) return true;
    closing_ = true;
    websocket::stream_base::timeout timeouts;
    timeouts.handshake_timeout = Millis(options_.close_timeout_ms);
    timeouts.idle_timeout = websocket::stream_base::none();
    timeouts.keep_alive_pings = false;
    ws_.set_option(timeouts);
    auto self = this->shared_from_this();
    ws_.async_close(websocket::close_code::normal, [self](beast::error_code ec) {
      self->close_done_ = true;
      self->close_error_ = ec;
      self->MaybeReportClose();
    });
    // Beast's close timer bounds the handshake; this bounds a close stuck behind a stalled write.
    deadline_.expires_after(Millis(options_.close_timeout_ms + kCloseGraceMs));
    deadline_.async_wait([self](beast::error_code ec) {
      if (ec || self->reported_) return;
      beast::get_lowest_layer(self->ws_).close();
    });
    return true;
  }

  void Write(std::string text) override {
    if (phase_ != Phase::kOpen || closing_) return;
    outbox_.push_back(std::move(text));
    if (!writing_) WriteNext();
  }

  bool open() const override { return phase_ == Phase::kOpen && !reported_; }

 private:
  enum class Phase { kConnecting, kUpgrading, kOpen, kDone };

  static Stream MakeStream(asio::io_context& io, ssl::context* tls) {
    if constexpr (kTls) {
      return Stream(io, *tls);
    } else {
      (void)tls;
      return Stream(io);
    }
  }

  void OnResolved(beast::error_code ec, tcp::resolver::results_type results) {
    if (aborted_) return;
    if (ec) {
      if (timed_out_) return FailConnectTimeout();
      return Fail(Status::Unavailable("cannot resolve host '" + url_.host + "' of " + url_text_ +
                                      ": " + ec.message()));
    }
    auto self = this->shared_from_this();
    beast::get_lowest_layer(ws_).async_connect(
        results,
        [self](const beast::error_code&, const tcp::endpoint& ep) {
          return self->AddressAllowed(ep);
        },
        [self](beast::error_code ec, const tcp::endpoint& ep) { self->OnConnected(ec, ep); });
  }

  // The SSRF guard, run before the socket connects to each resolved address.
  bool AddressAllowed(const tcp::endpoint& ep) {
    if (options_.allow_private_addresses) return true;
    Status st = CheckPublicAddress(ep.data(), ep.size());
    if (st.ok()) return true;
    refused_.push_back(st.message());
    return false;
  }

  void OnConnected(beast::error_code ec, const tcp::endpoint& ep) {
    if (aborted_) return;
    if (ec) {
      if (timed_out_) return FailConnectTimeout();
      std::string refusals;
      for (const std::string& r : refused_) refusals += (refusals.empty() ? "" : "; ") + r;
      if (ec == asio::error::not_found && !refused_.empty()) {
        return Fail(Status::Invalid("refused to connect to " + url_text_ + ": " + refusals));
      }
      return Fail(Status::Unavailable("cannot connect to " + url_.host_header + " (" + url_text_ +
                                      "): " + ec.message() +
                                      (refusals.empty() ? "" : "; also refused: " + refusals)));
    }
    // The address the socket actually holds, checked again (the resolver's list and the socket
    // cannot disagree, but the guard must not depend on that).
    beast::error_code peer_ec;
    const tcp::endpoint peer = beast::get_lowest_layer(ws_).socket().remote_endpoint(peer_ec);
    if (peer_ec) {
      return Fail(Status::Unavailable("connection to " + url_text_ +
                                      " dropped at once: " + peer_ec.message()));
    }
    if (!options_.allow_private_addresses) {
      if (Status st = CheckPublicAddress(peer.data(), peer.size()); !st.ok()) {
        return Fail(Status::Invalid("refused to connect to " + url_text_ + ": " + st.message()));
      }
    }
    remote_ = FormatEndpoint(ep);
    beast::error_code ignored;
    beast::get_lowest_layer(ws_).socket().set_option(tcp::no_delay(true), ignored);
    if constexpr (kTls) {
      StartTls();
    } else {
      StartUpgrade();
    }
  }

  void StartTls() {
    if constexpr (kTls) {
      SSL* handle = ws_.next_layer().native_handle();
      bool configured = true;
      if (url_.host_is_ip) {
        configured = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(handle), url_.host.c_str()) == 1;
      } else {
        configured = SSL_set_tlsext_host_name(handle, url_.host.c_str()) == 1 &&
                     SSL_set1_host(handle, url_.host.c_str()) == 1;
      }
      if (!configured) {
        return Fail(Status::Invalid("cannot set up TLS name checks for host '" + url_.host +
                                    "' of " + url_text_));
      }
      ws_.next_layer().set_verify_mode(ssl::verify_peer);
      auto self = this->shared_from_this();
      ws_.next_layer().async_handshake(ssl::stream_base::client,
                                       [self](beast::error_code ec) { self->OnTls(ec); });
    }
  }

  void OnTls(beast::error_code ec) {
    if constexpr (kTls) {
      if (aborted_) return;
      if (ec) {
        if (timed_out_) return FailConnectTimeout();
        std::string detail = ec.message();
        const long verify = SSL_get_verify_result(ws_.next_layer().native_handle());
        if (verify != X509_V_OK) {
          detail +=
              std::string(" (certificate rejected: ") + X509_verify_cert_error_string(verify) + ")";
        }
        return Fail(Status::Unavailable("TLS handshake with " + url_.host_header + " (" +
                                        url_text_ + ") failed: " + detail));
      }
      StartUpgrade();
    } else {
      (void)ec;
    }
  }

  void StartUpgrade() {
    phase_ = Phase::kUpgrading;
    deadline_.cancel();
    websocket::stream_base::timeout timeouts;
    timeouts.handshake_timeout = Millis(options_.handshake_timeout_ms);
    if (options_.idle_timeout_ms > 0) {
      timeouts.idle_timeout = Millis(options_.idle_timeout_ms);
      timeouts.keep_alive_pings = true;
    } else {
      timeouts.idle_timeout = websocket::stream_base::none();
      timeouts.keep_alive_pings = false;
    }
    ws_.set_option(timeouts);
    ws_.read_message_max(options_.max_message_bytes);
    ws_.set_option(
        websocket::stream_base::decorator([options = &options_](websocket::request_type& request) {
          request.set(http::field::user_agent, options->user_agent);
          if (!options->subprotocol.empty()) {
            request.set(http::field::sec_websocket_protocol, options->subprotocol);
          }
          for (const auto& [name, value] : options->headers) request.insert(name, value);
        }));
    Counters* counters = &owner_->counters();
    ws_.control_callback([counters](websocket::frame_type kind, beast::string_view) {
      if (kind == websocket::frame_type::ping) Bump(counters->pings_received);
      if (kind == websocket::frame_type::pong) Bump(counters->pongs_received);
    });
    auto self = this->shared_from_this();
    ws_.async_handshake(response_, url_.host_header, url_.target,
                        [self](beast::error_code ec) { self->OnUpgraded(ec); });
  }

  void OnUpgraded(beast::error_code ec) {
    if (aborted_) return;
    if (ec == websocket::error::upgrade_declined) {
      ConnectionEvent event;
      event.kind = ConnectionEventKind::kRefused;
      event.http_status = static_cast<int>(response_.result_int());
      event.body = std::move(response_.body());
      for (const auto& field : response_) {
        event.headers.emplace_back(Lower(Str(field.name_string())), Str(field.value()));
      }
      return End(std::move(event));
    }
    if (ec == beast::error::timeout) {
      return Fail(Status::Unavailable("upgrade of " + url_text_ + " got no answer within " +
                                      std::to_string(options_.handshake_timeout_ms) + " ms"));
    }
    if (ec) {
      if (response_.result_int() == 101) {
        return Fail(Status::Invalid("the upgrade answer of " + url_text_ +
                                    " breaks RFC 6455: " + ec.message()));
      }
      return Fail(Status::Unavailable("upgrade of " + url_text_ + " failed: " + ec.message()));
    }
    const std::string echoed = Str(response_[http::field::sec_websocket_protocol]);
    if (!echoed.empty() && echoed != options_.subprotocol) {
      return Fail(Status::Invalid("server " + url_text_ + " chose subprotocol '" + echoed + "', " +
                                  (options_.subprotocol.empty()
                                       ? std::string("but none was offered")
                                       : "not the offered '" + options_.subprotocol + "'")));
    }
    phase_ = Phase::kOpen;
    owner_->OnOpen(static_cast<const Connection*>(this), echoed, remote_);
    if (!aborted_) Read();
  }

  void Read() {
    auto self = this->shared_from_this();
    ws_.async_read(buffer_, [self](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (aborted_) return;
    if (closing_) {
      // Close() is waiting for the close handshake; what still arrives is not delivered.
      read_done_ = true;
      return MaybeReportClose();
    }
    if (!ec) {
      const auto bytes = buffer_.data();
      owner_->OnMessage(std::string_view(static_cast<const char*>(bytes.data()), bytes.size()),
                        ws_.got_binary());
      buffer_.consume(buffer_.size());
      if (buffer_.capacity() > kKeepBufferBytes) buffer_.shrink_to_fit();
      if (!aborted_ && !closing_) Read();
      return;
    }
    ConnectionEvent event;
    if (ec == websocket::error::closed) {
      event.kind = ConnectionEventKind::kClosed;
      SetCloseReason(&event);
    } else if (ec == websocket::error::message_too_big) {
      event.kind = ConnectionEventKind::kFailed;
      event.close_code = static_cast<int>(websocket::close_code::too_big);
      event.error = Status::ResourceExhausted(
          "a message from " + url_text_ + " exceeds max_message_bytes (" +
          std::to_string(options_.max_message_bytes) + " bytes); closed with 1009");
    } else if (ec == beast::error::timeout) {
      event.kind = ConnectionEventKind::kFailed;
      event.error = Status::Unavailable("no frame from " + url_text_ + " for " +
                                        std::to_string(options_.idle_timeout_ms) +
                                        " ms (idle timeout; the keep-alive ping went unanswered)");
    } else {
      event.kind = ConnectionEventKind::kFailed;
      event.error = Status::Unavailable("connection to " + url_text_ +
                                        " lost without a close frame: " + ec.message());
    }
    End(std::move(event));
  }

  void SetCloseReason(ConnectionEvent* event) const {
    const websocket::close_reason& reason = ws_.reason();
    event->close_code = reason.code == websocket::close_code::none
                            ? static_cast<int>(websocket::close_code::no_status)
                            : static_cast<int>(reason.code);
    event->close_reason = std::string(reason.reason.data(), reason.reason.size());
  }

  // Reports a close the client started once both the close and the pending read are done.
  void MaybeReportClose() {
    if (!close_done_ || !read_done_ || reported_) return;
    ConnectionEvent event;
    event.closed_by_client = true;
    if (!close_error_) {
      event.kind = ConnectionEventKind::kClosed;
      SetCloseReason(&event);
    } else {
      event.kind = ConnectionEventKind::kFailed;
      event.close_code = static_cast<int>(websocket::close_code::normal);
      // Beast's close timer (or the fallback deadline) closes the socket: the close then ends
      // with timeout or, when it was queued behind the pending read, operation_aborted.
      const bool timed_out =
          close_error_ == beast::error::timeout || close_error_ == asio::error::operation_aborted;
      event.error = timed_out
                        ? Status::Unavailable("server " + url_text_ +
                                              " did not answer the close frame within " +
                                              std::to_string(options_.close_timeout_ms) + " ms")
                        : Status::Unavailable("closing the connection to " + url_text_ +
                                              " failed: " + close_error_.message());
    }
    End(std::move(event));
  }

  void WriteNext() {
    if (outbox_.empty() || phase_ != Phase::kOpen || closing_) {
      writing_ = false;
      return;
    }
    writing_ = true;
    ws_.text(true);
    auto self = this->shared_from_this();
    ws_.async_write(asio::buffer(outbox_.front()), [self](beast::error_code ec, size_t) {
      if (self->aborted_) return;
      self->outbox_.pop_front();
      if (ec) {
        // The read side reports the end of the connection.
        self->outbox_.clear();
        self->writing_ = false;
        return;
      }
      Bump(self->owner_->counters().messages_sent);
      self->WriteNext();
    });
  }

  void FailConnectTimeout() {
    Fail(Status::Unavailable("connecting to " + url_text_ + " took longer than " +
                             std::to_string(options_.connect_timeout_ms) + " ms"));
  }

  void Fail(Status error) {
    ConnectionEvent event;
    event.kind = ConnectionEventKind::kFailed;
    event.error = std::move(error);
    End(std::move(event));
  }

  void End(ConnectionEvent event) {
    if (reported_) return;
    reported_ = true;
    phase_ = Phase::kDone;
    deadline_.cancel();
    outbox_.clear();
    beast::get_lowest_layer(ws_).close();
    owner_->OnEnded(static_cast<const Connection*>(this), std::move(event));
  }

  ConnectionOwner* owner_;
  const WebSocketOptions& options_;
  const WebSocketUrl url_;
  const std::string url_text_;
  tcp::resolver resolver_;
  Stream ws_;
  asio::steady_timer deadline_;  // the connect phase, then the fallback bound of Close()
  beast::flat_buffer buffer_;
  websocket::response_type response_;
  std::vector<std::string> refused_;  // addresses the SSRF guard refused, with reasons
  std::string remote_;
  std::deque<std::string> outbox_;
  Phase phase_ = Phase::kConnecting;
  bool aborted_ = false;
  bool timed_out_ = false;
  bool writing_ = false;
  bool closing_ = false;
  bool close_done_ = false;
  bool read_done_ = false;
  bool reported_ = false;
  beast::error_code close_error_;
};

}  // namespace

Result<WebSocketUrl> ParseWebSocketUrl(std::string_view url) {
  const std::string shown(url.substr(0, 512));
  auto bad = [&](const std::string& why) {
    return Status::Invalid("WebSocket URL '" + shown + "' " + why);
  };
  if (url.empty()) return Status::Invalid("empty WebSocket URL");
  if (HasControlOrSpace(url)) return bad("contains a space or a control character");
  WebSocketUrl out;
  const size_t colon = url.find("://");
  if (colon == std::string_view::npos) return bad("has no scheme");
  const std::string scheme = Lower(url.substr(0, colon));
  if (scheme == "wss") {
    out.tls = true;
  } else if (scheme != "ws") {
    return bad("has scheme '" + scheme + "'; only ws and wss are allowed");
  }
  std::string_view rest = url.substr(colon + 3);
  const size_t authority_end = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, authority_end);
  std::string_view tail =
      authority_end == std::string_view::npos ? std::string_view() : rest.substr(authority_end);
  if (authority.find('@') != std::string_view::npos) return bad("has user info");
  std::string_view host;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("has an unterminated IPv6 literal");
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("has text after its IPv6 literal");
      port = after.substr(1);
      if (port.empty()) return bad("has an empty port");
    }
    boost::system::error_code ec;
    const auto address = asio::ip::make_address_v6(std::string(host), ec);
    if (ec) return bad("has a malformed IPv6 literal");
    out.host = address.to_string();
    out.host_is_ip = true;
  } else {
    const size_t port_colon = authority.rfind(':');
    host = authority.substr(0, port_colon);
    if (port_colon != std::string_view::npos) {
      port = authority.substr(port_colon + 1);
      if (port.empty()) return bad("has an empty port");
    }
    if (host.empty()) return bad("has no host");
    const bool name_chars = std::all_of(host.begin(), host.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '.' || c == '_';
    });
    if (!name_chars) return bad("has a host with characters a host name cannot have");
    out.host = Lower(host);
    boost::system::error_code ec;
    asio::ip::make_address_v4(out.host, ec);
    out.host_is_ip = !ec;
  }
  out.port = out.tls ? 443 : 80;
  if (!port.empty()) {
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
      return bad("has port '" + std::string(port) + "'; a port is 1..65535");
    }
    out.port = static_cast<uint16_t>(value);
  }
  const size_t hash = tail.find('#');
  if (hash != std::string_view::npos) tail = tail.substr(0, hash);
  if (tail.empty()) {
    out.target = "/";
  } else if (tail.front() == '?') {
    out.target = "/" + std::string(tail);
  } else {
    out.target = std::string(tail);
  }
  const std::string host_part =
      out.host.find(':') != std::string::npos ? "[" + out.host + "]" : out.host;
  const bool default_port = out.port == (out.tls ? 443 : 80);
  out.host_header = default_port ? host_part : host_part + ":" + std::to_string(out.port);
  return out;
}

std::string_view ToString(ConnectionEventKind kind) {
  switch (kind) {
    case ConnectionEventKind::kConnected:
      return "connected";
    case ConnectionEventKind::kRefused:
      return "refused";
    case ConnectionEventKind::kClosed:
      return "closed";
    case ConnectionEventKind::kFailed:
      return "failed";
    case ConnectionEventKind::kStopped:
      return "stopped";
  }
  return "unknown";
}

Status WebSocketOptions::Validate() const {
  auto positive = [](const char* name, int64_t value) -> Status {
    if (value <= 0) {
      return Status::Invalid(std::string("WebSocketOptions.") + name + " must be positive, got " +
                             std::to_string(value));
    }
    return Status::OK();
  };
  ATFILL_RETURN_IF_ERROR(positive("connect_timeout_ms", connect_timeout_ms));
  ATFILL_RETURN_IF_ERROR(positive("handshake_timeout_ms", handshake_timeout_ms));
  ATFILL_RETURN_IF_ERROR(positive("close_timeout_ms", close_timeout_ms));
  if (idle_timeout_ms < 0) {
    return Status::Invalid("WebSocketOptions.idle_timeout_ms must not be negative, got " +
                           std::to_string(idle_timeout_ms));
  }
  if (max_message_bytes < 1 || max_message_bytes > kMaxMessageCap) {
    return Status::Invalid("WebSocketOptions.max_message_bytes must be in 1..1073741824, got " +
                           std::to_string(max_message_bytes));
  }
  if (HasLineBreakOrNul(user_agent) || HasLineBreakOrNul(version)) {
    return Status::Invalid("WebSocketOptions.user_agent or version has a line break or NUL");
  }
  if (!subprotocol.empty() && !IsToken(subprotocol)) {
    return Status::Invalid("WebSocketOptions.subprotocol '" + subprotocol +
                           "' is not a single token");
  }
  for (const auto& [name, value] : headers) {
    if (!IsToken(name)) {
      return Status::Invalid("WebSocketOptions.headers has a malformed name '" + name + "'");
    }
    const std::string lower = Lower(name);
    if (lower == "host" || lower == "upgrade" || lower == "connection" ||
        lower.rfind("sec-websocket-", 0) == 0) {
      return Status::Invalid("WebSocketOptions.headers must not set '" + name +
                             "'; the client sets it");
    }
    if (HasLineBreakOrNul(value)) {
      return Status::Invalid("WebSocketOptions.headers value of '" + name +
                             "' has a line break or NUL");
    }
  }
  return reconnect.Validate();
}

class WebSocketClient::Impl final : public ConnectionOwner {
 public:
  explicit Impl(WebSocketOptions options, std::unique_ptr<ssl::context> tls)
      : options_(std::move(options)),
        tls_(std::move(tls)),
        work_(asio::make_work_guard(io_)),
        backoff_(io_) {
    thread_ = std::thread([this] { io_.run(); });
  }

  ~Impl() {
    shutting_down_.store(true);
    Close();
    work_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  const WebSocketOptions& options() const { return options_; }
  Counters& counters() override { return counters_; }
  bool connected() const { return open_.load(); }

  Status Connect(WebSocketTarget target, WebSocketHandlers handlers) {
    if (target.hosts.empty()) return Status::Invalid("WebSocketTarget.hosts is empty");
    if (shutting_down_.load()) return Status::Cancelled("WebSocket client is shutting down");
    uint64_t id = 0;
    {
      std::lock_guard lock(mu_);
      const bool restarting_from_stopped =
          OnLoopThread() && delivering_stopped_ && started_ == session_id_;
      if (started_ != stopped_ && !restarting_from_stopped) {
        return Status::Invalid("a WebSocket session is already running; Close() it first");
      }
      id = ++started_;
    }
    asio::post(io_, [this, id, target = std::move(target), handlers = std::move(handlers)]() {
      StartSession(id, target, handlers);
    });
    return Status::OK();
  }

  Status Send(std::string text) {
    if (!open_.load()) return Status::Unavailable("no WebSocket connection is open");
    asio::post(io_, [this, text = std::move(text)]() mutable {
      if (conn_ && conn_->open()) conn_->Write(std::move(text));
    });
    return Status::OK();
  }

  void Close() {
    std::unique_lock lock(mu_);
    if (started_ == stopped_) return;
    const uint64_t id = started_;
    asio::post(io_, [this, id] { RequestStop(id); });
    if (OnLoopThread()) return;
    done_.wait(lock, [&] { return stopped_ >= id; });
  }

  WebSocketStats stats() const {
    auto get = [](const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); };
    WebSocketStats s;
    s.attempts = get(counters_.attempts);
    s.connections = get(counters_.connections);
    s.refusals = get(counters_.refusals);
    s.failures = get(counters_.failures);
    s.closes = get(counters_.closes);
    s.messages = get(counters_.messages);
    s.bytes_received = get(counters_.bytes_received);
    s.pings_received = get(counters_.pings_received);
    s.pongs_received = get(counters_.pongs_received);
    s.messages_sent = get(counters_.messages_sent);
    return s;
  }

  // ConnectionOwner, on the loop thread.
  void OnOpen(const Connection* connection, std::string subprotocol, std::string remote) override {
    if (connection != conn_.get()) return;
    open_.store(true);
    opened_at_ = Clock::now();
    connection_messages_ = 0;
    Bump(counters_.connections);
    ConnectionEvent event = BaseEvent(ConnectionEventKind::kConnected);
    event.subprotocol = std::move(subprotocol);
    event.remote_address = std::move(remote);
    Deliver(event);
  }

  void OnMessage(std::string_view data, bool binary) override {
    Bump(counters_.messages);
    Bump(counters_.bytes_received, data.size());
    ++connection_messages_;
    if (handlers_.on_message) handlers_.on_message(data, binary);
  }

  void OnEnded(const Connection* connection, ConnectionEvent ended) override {
    if (connection != conn_.get()) return;
    const bool was_open = open_.exchange(false);
    // The connection object stays alive until its own completion handler returns.
    conn_.reset();
    ConnectionEvent event = BaseEvent(ended.kind);
    event.http_status = ended.http_status;
    event.body = std::move(ended.body);
    event.headers = std::move(ended.headers);
    event.close_code = ended.close_code;
    event.close_reason = std::move(ended.close_reason);
    event.closed_by_client = ended.closed_by_client;
    event.error = std::move(ended.error);
    if (was_open) {
      event.connected_ms = std::chrono::duration_cast<Millis>(Clock::now() - opened_at_).count();
      event.messages = connection_messages_;
    }
    switch (event.kind) {
      case ConnectionEventKind::kRefused:
        Bump(counters_.refusals);
        break;
      case ConnectionEventKind::kClosed:
        Bump(counters_.closes);
        break;
      default:
        Bump(counters_.failures);
        break;
    }
    EndAttempt(std::move(event));
  }

 private:
  bool OnLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }

  ConnectionEvent BaseEvent(ConnectionEventKind kind) const {
    ConnectionEvent event;
    event.kind = kind;
    event.host = host_;
    event.url = url_;
    event.attempt = attempt_;
    return event;
  }

  SessionAction Deliver(const ConnectionEvent& event) {
    if (!handlers_.on_event) return SessionAction::kContinue;
    return handlers_.on_event(event);
  }

  void StartSession(uint64_t id, const WebSocketTarget& target, const WebSocketHandlers& handlers) {
    session_id_ = id;
    session_active_ = true;
    stop_requested_ = false;
    target_ = target;
    handlers_ = handlers;
    attempt_ = 0;
    schedule_.emplace(options_.reconnect, target_.hosts, options_.random_seed);
    StartAttempt();
  }

  void StartAttempt() {
    ++attempt_;
    Bump(counters_.attempts);
    host_ = schedule_->host();
    url_ = target_.url_for ? target_.url_for(host_) : host_;
    Result<WebSocketUrl> parsed = ParseWebSocketUrl(url_);
    if (!parsed.ok()) {
      Bump(counters_.failures);
      ConnectionEvent event = BaseEvent(ConnectionEventKind::kFailed);
      event.error = parsed.status();
      Deliver(event);
      return FinishSession();
    }
    if (parsed->tls) {
      conn_ = std::make_shared<WsConnection<true>>(this, options_, std::move(*parsed), url_, io_,
                                                   tls_.get());
    } else {
      conn_ = std::make_shared<WsConnection<false>>(this, options_, std::move(*parsed), url_, io_,
                                                    nullptr);
    }
    conn_->Start();
  }

  void EndAttempt(ConnectionEvent event) {
    if (stop_requested_) {
      Deliver(event);
      return FinishSession();
    }
    const ReconnectStep step = schedule_->AttemptEnded(event.connected_ms, event.messages);
    if (!step.give_up) {
      event.retry_in_ms = step.delay_ms;
      event.next_host = step.host;
    }
    const SessionAction action = Deliver(event);
    if (step.give_up || action == SessionAction::kStop || stop_requested_) {
      return FinishSession();
    }
    const uint64_t id = session_id_;
    backoff_.expires_after(Millis(step.delay_ms));
    backoff_.async_wait([this, id](beast::error_code ec) {
      if (ec || !session_active_ || stop_requested_ || id != session_id_) return;
      StartAttempt();
    });
  }

  void RequestStop(uint64_t id) {
    if (!session_active_ || id != session_id_ || stop_requested_) return;
    stop_requested_ = true;
    if (conn_) {
      // An open connection reports its end through OnEnded, which finishes the session.
      if (conn_->CloseGracefully()) return;
      conn_.reset();
      open_.store(false);
    }
    backoff_.cancel();
    FinishSession();
  }

  void FinishSession() {
    session_active_ = false;
    schedule_.reset();
    {
      std::lock_guard lock(mu_);
      delivering_stopped_ = true;
    }
    Deliver(BaseEvent(ConnectionEventKind::kStopped));
    handlers_ = {};
    target_ = {};
    std::lock_guard lock(mu_);
    delivering_stopped_ = false;
    stopped_ = std::max(stopped_, session_id_);
    done_.notify_all();
  }

  const WebSocketOptions options_;
  const std::unique_ptr<ssl::context> tls_;  // outlives io_ and every stream using it
  // Declared before every member holding sockets or timers, so it is destroyed after them.
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  asio::steady_timer backoff_;
  Counters counters_;
  std::atomic<bool> open_{false};
  std::atomic<bool> shutting_down_{false};

  // Sessions started by Connect() and finished by the loop; guarded by mu_.
  std::mutex mu_;
  std::condition_variable done_;
  uint64_t started_ = 0;
  uint64_t stopped_ = 0;
  bool delivering_stopped_ = false;  // the loop is inside the kStopped handler

  // Loop thread only (session_id_ is also read by Connect() on the loop thread).
  uint64_t session_id_ = 0;
  bool session_active_ = false;
  bool stop_requested_ = false;
  WebSocketTarget target_;
  WebSocketHandlers handlers_;
  std::optional<ReconnectSchedule> schedule_;
  std::shared_ptr<Connection> conn_;
  std::string host_;
  std::string url_;
  int attempt_ = 0;
  Clock::time_point opened_at_;
  uint64_t connection_messages_ = 0;  // data messages of the open connection

  std::thread thread_;
};

Result<std::unique_ptr<WebSocketClient>> WebSocketClient::Start(WebSocketOptions options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  if (options.user_agent.empty()) options.user_agent = DefaultUserAgent(options.version);
  std::unique_ptr<ssl::context> tls;
  try {
    tls = std::make_unique<ssl::context>(ssl::context::tls_client);
  } catch (const std::exception& e) {
    return Status::Internal(std::string("cannot create a TLS context: ") + e.what());
  }
  SSL_CTX_set_min_proto_version(tls->native_handle(), TLS1_2_VERSION);
  beast::error_code ec;
  // Without a system store wss connections fail their certificate check, which they report.
  tls->set_default_verify_paths(ec);
  if (!options.tls_ca_pem.empty()) {
    tls->add_certificate_authority(asio::buffer(options.tls_ca_pem), ec);
    if (ec) {
      return Status::Invalid("WebSocketOptions.tls_ca_pem is not usable PEM: " + ec.message());
    }
  }
  tls->set_verify_mode(ssl::verify_peer);
  auto impl = std::make_unique<Impl>(std::move(options), std::move(tls));
  return std::unique_ptr<WebSocketClient>(new WebSocketClient(std::move(impl)));
}

WebSocketClient::WebSocketClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WebSocketClient::~WebSocketClient() = default;

Status WebSocketClient::Connect(WebSocketTarget target, WebSocketHandlers handlers) {
  return impl_->Connect(std::move(target), std::move(handlers));
}
Status WebSocketClient::Send(std::string text) { return impl_->Send(std::move(text)); }
void WebSocketClient::Close() { impl_->Close(); }
bool WebSocketClient::connected() const { return impl_->connected(); }
WebSocketStats WebSocketClient::stats() const { return impl_->stats(); }
const WebSocketOptions& WebSocketClient::options() const { return impl_->options(); }

}  // namespace atfill::net
