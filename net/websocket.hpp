// A WebSocket client (RFC 6455; Boost.Beast over Boost.Asio, OpenSSL for wss) for long-lived
// server-push streams such as Jetstream: size-capped messages, automatic pongs, an idle timeout,
// refused upgrades surfaced with their HTTP status and body, close codes reported, and
// reconnection with jittered backoff and failover along a list of hosts (see reconnect_policy.hpp).
//
// Threading contract:
// - Start() creates the client's loop thread (one io_context). It alone owns the socket, the
//   reconnect schedule and every timer.
// - Connect(), Send(), Close(), connected() and stats() may be called from any thread.
// - The handlers and WebSocketTarget::url_for run ON THE LOOP THREAD, one at a time, in order.
//   They must be cheap and must not block: while one runs no frame is read, no ping answered.
//   on_message's view is valid only during the call; copy what you keep. A handler may call
//   Connect(), Send() and Close() (Close() then only asks, it does not wait); it must not destroy
//   the client and must not throw (an exception escaping it ends the process).
// - Close() from any other thread blocks until the session has stopped: at most about
//   close_timeout_ms when a connection is open, at once otherwise. The destructor calls Close()
//   and joins the loop thread; it must not run on the loop thread.
//
// One session at a time: Connect() starts it; it then connects, reads, and after every end
// (refusal, close, failure) asks on_event whether to go on and waits the schedule's backoff
// before the next attempt, until Close(), a handler answering kStop, or the policy giving up.
// Every session ends with exactly one kStopped event; Connect() may then start another.
//
// Errors carried by kFailed events:
// - Unavailable: DNS, TCP, TLS (certificate checks included), timeouts (connect, handshake, idle)
//   and a connection lost without a close frame.
// - Invalid: a malformed URL from url_for (the session then stops), an address refused by the
//   SSRF guard, an upgrade answer that breaks RFC 6455, a subprotocol the client did not offer.
// - ResourceExhausted: a message larger than max_message_bytes (the client closes with 1009).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "net/http_client.hpp"
#include "net/reconnect_policy.hpp"

namespace atfill::net {

// A ws:// or wss:// URL taken apart.
struct WebSocketUrl {
  bool tls = false;         // wss
  std::string host;         // lower-cased; an IPv6 literal without its brackets
  uint16_t port = 0;        // explicit, or 80 / 443
  std::string target;       // path and query as given ("/" when the URL has none); no fragment
  std::string host_header;  // the Host header: host[:port], brackets kept, port only if not default
  bool host_is_ip = false;  // the host is an IPv4 or IPv6 literal
};

// Invalid naming the URL and the reason when it is not ws:// or wss://, has user info, no host,
// a bad port, or a space or control character anywhere.
Result<WebSocketUrl> ParseWebSocketUrl(std::string_view url);

struct WebSocketOptions {
  // atfill's version, named in the User-Agent; empty = the version this library was built as.
  std::string version;
  // The whole User-Agent; empty = "atfill/<version> (+https://github.com/atfill)".
  std::string user_agent;
  // The subprotocol offered in Sec-WebSocket-Protocol; empty = none offered. The server may echo
  // it or echo nothing; any other echoed token fails the attempt (Invalid).
  std::string subprotocol;
  // Extra upgrade request headers, sent as given (no Host, Upgrade, Connection or Sec-WebSocket-*).
  HttpHeaders headers;
  // Time allowed for DNS, TCP connect and the TLS handshake, in milliseconds.
  int64_t connect_timeout_ms = 10'000;
  // Time allowed for the HTTP upgrade (request sent to response read), in milliseconds.
  int64_t handshake_timeout_ms = 10'000;
  // With no frame of any kind from the server for half this long the client sends a ping; with
  // still nothing after the whole of it the connection fails (Unavailable), in milliseconds;
  // 0 = never. Jetstream pings every 30 s, so the default leaves room for two missed pings.
  int64_t idle_timeout_ms = 90'000;
  // Time Close() waits for the server's answering close frame, in milliseconds.
  int64_t close_timeout_ms = 5'000;
  // Largest message accepted, in bytes (all frames of it together); a larger one fails the
  // connection with ResourceExhausted and close code 1009 sent. 1 .. 1 GiB.
  uint64_t max_message_bytes = uint64_t{32} << 20;
  // Allow connecting to loopback, private, link-local and other non-public addresses (tests and
  // simnet); when false every address is checked before the socket connects to it.
  bool allow_private_addresses = false;
  // Extra trust anchors for wss, PEM (one or more certificates), added to the system store.
  // Certificates are always verified, and the host name (or IP literal) always checked.
  std::string tls_ca_pem;
  // Backoff, failover and give-up of the reconnect loop.
  ReconnectPolicy reconnect;
  // Seed of the backoff jitter; 0 = seeded from std::random_device.
  uint64_t random_seed = 0;

  // OK, or Invalid naming the first field out of range and its value.
  Status Validate() const;
};

enum class ConnectionEventKind {
  kConnected,  // the upgrade succeeded; messages follow
  kRefused,    // the server answered the upgrade with an HTTP status other than 101
  kClosed,     // the connection ended with a close frame, from either side
  kFailed,     // an attempt or a connection failed without a close handshake (see `error`)
  kStopped,    // the session is over: no event follows before the next Connect()
};

std::string_view ToString(ConnectionEventKind kind);

struct ConnectionEvent {
  ConnectionEventKind kind = ConnectionEventKind::kStopped;
  // The entry of the target's host list this attempt used, and the URL url_for made of it.
  std::string host;
  std::string url;
  // 1-based number of the attempt within the session.
  int attempt = 0;

  // kConnected: the subprotocol the server echoed (empty when none) and the peer address.
  std::string subprotocol;
  std::string remote_address;

  // kRefused: the HTTP answer to the upgrade request (header names lower-cased).
  int http_status = 0;
  std::string body;
  HttpHeaders headers;

  // kClosed: the code and reason of the close frame (the server's, or the echo of the client's;
  // 1005 when it carried no code). Also set on a kFailed the client closed with a code (1009).
  int close_code = 0;
  std::string close_reason;
  // kClosed: the client started the close handshake (Close()).
  bool closed_by_client = false;

  // kFailed: what went wrong (see the header comment for the codes).
  Status error;

  // kClosed and kFailed: how long the connection had been open, in milliseconds; -1 when the
  // attempt never opened one (always -1 for kRefused).
  int64_t connected_ms = -1;
  // kClosed and kFailed: data messages the connection delivered (0 when it never opened).
  uint64_t messages = 0;
  // kRefused, kClosed and kFailed: the wait the schedule plans before the next attempt and the
  // host it will use, or -1 and "" when the session stops (Close(), give-up, unusable URL).
  int64_t retry_in_ms = -1;
  std::string next_host;
};

enum class SessionAction { kContinue, kStop };

struct WebSocketHandlers {
  // Every data message, whole, in order. `binary` tells binary from text frames.
  std::function<void(std::string_view data, bool binary)> on_message;
  // Every connection event. For kRefused, kClosed and kFailed the answer decides whether the
  // session goes on (after retry_in_ms, unless that is -1); it is ignored for kConnected and
  // kStopped. Empty = always kContinue.
  std::function<SessionAction(const ConnectionEvent& event)> on_event;
};

struct WebSocketTarget {
  // Hosts to try, in order, wrapping around (each is passed to url_for); at least one.
  std::vector<std::string> hosts;
  // The ws:// or wss:// URL (path and query included) for one attempt on `host`, called before
  // every attempt, so a resume cursor can go into the query. Empty = the host is the URL.
  std::function<std::string(const std::string& host)> url_for;
};

struct WebSocketStats {
  uint64_t attempts = 0;        // connection attempts started
  uint64_t connections = 0;     // upgrades that succeeded
  uint64_t refusals = 0;        // upgrades answered with another HTTP status
  uint64_t failures = 0;        // kFailed events
  uint64_t closes = 0;          // kClosed events
  uint64_t messages = 0;        // data messages delivered
  uint64_t bytes_received = 0;  // data message bytes delivered
  uint64_t pings_received = 0;  // pings from the server (each answered with a pong)
  uint64_t pongs_received = 0;  // pongs from the server
  uint64_t messages_sent = 0;   // Send() messages written
};

class WebSocketClient {
 public:
  // Validates `options`, loads the TLS trust store and starts the loop thread.
  static Result<std::unique_ptr<WebSocketClient>> Start(WebSocketOptions options);

  // Close() and join the loop thread. Must not run on the loop thread.
  ~WebSocketClient();
  WebSocketClient(const WebSocketClient&) = delete;
  WebSocketClient& operator=(const WebSocketClient&) = delete;

  // Starts a session over `target` (see the header comment). Invalid for an empty host list and
  // when a session is already running (Close() it first; a kStopped handler may call Connect()
  // to start the next one); Cancelled once the destructor has begun. Thread-safe.
  Status Connect(WebSocketTarget target, WebSocketHandlers handlers);

  // Queues a text message on the open connection. Unavailable when no connection is open at the
  // time of the call; a message queued when the connection ends is dropped. Thread-safe.
  Status Send(std::string text);

  // Ends the session: an open connection is closed with 1000 (waiting at most close_timeout_ms
  // for the server's answer), an attempt in progress or a backoff wait is abandoned, and
  // kStopped is delivered. Idempotent; thread-safe; see the contract above for blocking.
  void Close();

  // A connection is open now.
  bool connected() const;
  // Thread-safe snapshot of the counters since Start().
  WebSocketStats stats() const;
  const WebSocketOptions& options() const;

 private:
  class Impl;
  explicit WebSocketClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace atfill::net
