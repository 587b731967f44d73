// A loopback HTTP/1.1 server for tests: 127.0.0.1 on a free port below 32768, keep-alive, many
// connections at once, and the faults a crawler meets (latency, 429s, dropped connections,
// resets, huge bodies). Distinct instances are distinct hosts ("http://127.0.0.1:<port>").
//
// Threading: the server runs on its own io thread(s). The handler is called on them, possibly
// for several requests at once when threads > 1, so it must be thread-safe; it must return
// quickly (latency is asked for with TestResponse::delay_ms, served by a timer). Every other
// method is thread-safe. The destructor stops the server and drops open connections.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tools/simnet/http_reply.hpp"

namespace atfill::testing {

using TestHeaders = std::vector<std::pair<std::string, std::string>>;

struct TestRequest {
  std::string method;
  std::string target;   // path and query, as sent
  TestHeaders headers;  // names lower-cased
  std::string body;
  uint64_t connection = 0;  // 1-based number of the connection it arrived on
  std::chrono::steady_clock::time_point arrived;

  // The first header named `name` (lower-case), or "" when absent.
  std::string_view Header(std::string_view name) const;
};

// A response, its delay, or a fault of the connection (tools/simnet/http_reply.hpp).
using TestResponse = simnet::HttpReply;
// Response helpers.
TestResponse JsonResponse(int status, std::string body);
// {"error":<error>,"message":<message>} with `status`.
TestResponse XrpcErrorResponse(int status, std::string_view error, std::string_view message);
// A 429 carrying the headers that are given.
TestResponse RateLimitedResponse(std::optional<int64_t> ratelimit_reset_unix_s,
                                 std::optional<std::string> retry_after);
TestResponse DelayedResponse(TestResponse response, int64_t delay_ms);
// 200 with `total_bytes` announced and half of them sent before the connection closes.
TestResponse DropMidBodyResponse(size_t total_bytes);
TestResponse FaultResponse(TestResponse::Fault fault);
// 200 with a body of `bytes` bytes of 'x'.
TestResponse HugeResponse(size_t bytes, bool chunked);

// A 127.0.0.1 port held bound but never listening while this object lives: connections to it are
// refused, and no other socket (of this or a parallel test process) can take it meanwhile.
class RefusingPort {
 public:
  RefusingPort();
  ~RefusingPort();
  RefusingPort(const RefusingPort&) = delete;
  RefusingPort& operator=(const RefusingPort&) = delete;

  uint16_t port() const { return port_; }
  // "http://127.0.0.1:<port><path>".
  std::string Url(std::string_view path = "/") const;

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// Counts requests being served (read, and not yet answered) across one or more servers.
class ConcurrencyGauge {
 public:
  void Enter();
  void Leave();
  int current() const;
  int max() const;
  // Waits (bounded by `timeout`) until at least `count` requests are being served.
  bool WaitForCurrent(int count, std::chrono::milliseconds timeout) const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  int current_ = 0;
  int max_ = 0;
};

class HttpTestServer {
 public:
  using Handler = std::function<TestResponse(const TestRequest&)>;

  // Listens on 127.0.0.1 at a free port below 32768 and starts serving. `shared_gauge`, when given,
  // also counts this server's requests (to measure concurrency across several servers).
  explicit HttpTestServer(Handler handler, std::shared_ptr<ConcurrencyGauge> shared_gauge = {},
                          int threads = 1);
  ~HttpTestServer();
  HttpTestServer(const HttpTestServer&) = delete;
  HttpTestServer& operator=(const HttpTestServer&) = delete;

  uint16_t port() const;
  // "http://127.0.0.1:<port><path>".
  std::string Url(std::string_view path = "/") const;
  // The client's host key for this server: "http://127.0.0.1:<port>".
  std::string HostKey() const;

  // While on, every response is parked (after the handler ran) until hold is turned off, which
  // sends the parked ones. Parked requests count as being served.
  void SetHold(bool hold);

  int64_t requests() const;     // requests read so far
  int64_t connections() const;  // connections accepted so far
  int concurrent() const;       // requests being served now
  int max_concurrent() const;   // the most served at once so far
  int held() const;             // responses parked now
  // Copies of every request read so far, in arrival order.
  std::vector<TestRequest> received() const;

  // Wait (bounded by `timeout`) until the condition holds; false on timeout.
  bool WaitForHeld(int count, std::chrono::milliseconds timeout) const;
  bool WaitForRequests(int64_t count, std::chrono::milliseconds timeout) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace atfill::testing
