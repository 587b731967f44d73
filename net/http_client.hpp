// An asynchronous HTTP client: one libcurl-multi event loop on its own thread, per-host and global
// limits, retries with jittered backoff, host cooldowns on 429, a host circuit breaker, size caps
// and an SSRF guard on the address actually connected.
//
// Threading contract:
// - Start() creates the loop thread. It alone owns the CURLM handle, every easy handle (pooled,
//   so connections are kept alive and HTTP/2 streams are multiplexed) and every per-host queue.
// - Submit(), Fetch(), stats(), HostState() and Shutdown() may be called from any thread.
// - Completion callbacks run ON THE LOOP THREAD, exactly once per Submit(). They must be cheap and
//   must not block (no I/O, no waiting on locks held across I/O): while one runs, no transfer
//   makes progress. The intended use is a tbb::flow::async_node gateway's try_put, or a
//   promise's set_value. A callback may call Submit(); it must not call Fetch(), Shutdown() or
//   destroy the client, and must not throw (an exception escaping it ends the process).
// - Fetch() blocks its caller until the request completes: for tools and tests, never inside a
//   flow-graph node body.
// - Shutdown() (also run by the destructor) completes every queued, waiting and in-flight request
//   with Cancelled, then joins the loop thread. It is idempotent.
//
// What a request completes with:
// - an HttpResponse for every HTTP answer that is final: 2xx, 3xx (when redirects are not
//   followed), 4xx (except 408 and 429, which are retried), 501/505, and the last 5xx, 408, 503 or
//   429 when the retries are used up (see RetryPolicy). A definitive XRPC answer (404
//   RepoNotFound...) is therefore a normal response; see xrpc_error.hpp to classify it.
// - ResourceExhausted for a request throttled longer than RetryPolicy::max_throttled_ms in all.
// - Unavailable for a transport failure (connect, reset, timeout, TLS) once retries are used up,
//   and for a request whose host is down: "host <key> failed N times in a row; deferred ...".
// - ResourceExhausted when the body exceeds the response cap (the message names the cap).
// - Invalid for a malformed request (URL, scheme, method, header), an address refused by the
//   SSRF guard, or a redirect followed by hand that has no usable Location or is one too many;
//   Cancelled after Shutdown().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.hpp"
#include "net/retry_policy.hpp"

namespace atfill::net {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  // Any HTTP token; GET, HEAD and POST are the common ones.
  std::string method = "GET";
  // An http:// or https:// URL.
  std::string url;
  // Extra request headers, sent as given (set Content-Type for a body yourself).
  HttpHeaders headers;
  // The request body; sent for POST and for any other method when non-empty.
  std::string body;
  // Total time allowed per attempt, in milliseconds; 0 = HttpClientOptions::timeout_ms.
  int64_t timeout_ms = 0;
  // Largest response body accepted, in bytes; 0 = HttpClientOptions::max_response_bytes.
  uint64_t max_response_bytes = 0;
  // Headers sent only to the origin (scheme, host and port) of `url`: credentials such as
  // Authorization. A request that carries any follows its redirects itself (up to
  // HttpClientOptions::max_redirects; 303, and 301/302 after a POST, turn into a body-less GET)
  // and sends them on no hop to another origin; a hop is an attempt but uses none of the retries.
  HttpHeaders credentials;
  // Replaces HttpClientOptions::retry for this request.
  std::optional<RetryPolicy> retry;
  // The URL is the operator's (written in the config: a relay, a PLC directory), not one the
  // network handed us: its connections skip the address check of allow_private_addresses, so a
  // relay on localhost or in a private network is reached. Endpoints read from DID documents
  // must leave it false.
  bool trusted_endpoint = false;
};

struct HttpResponse {
  // The HTTP status code of the final attempt.
  int status = 0;
  // The body, decoded from any content encoding.
  std::string body;
  // Headers of the final response (after redirects), names lower-cased, in arrival order.
  HttpHeaders headers;
  // The URL that answered (differs from the request's after a redirect).
  std::string effective_url;
  // Attempts made, this one included (1 when no retry happened; redirect hops followed by hand
  // count).
  int attempts = 0;
  // Time the request spent waiting out 429s (RetryPolicy::max_throttled_ms), in milliseconds.
  int64_t throttled_ms = 0;
  // From Submit() to completion, retries and cooldowns included, in milliseconds.
  int64_t elapsed_ms = 0;
  // The transport error of the last attempt that failed at the transport level (for example
  // "Timeout was reached"), or empty when none did.
  std::string last_transport_error;

  // The first header named `name` (any case), or "" when absent.
  std::string_view Header(std::string_view name) const;
  std::string_view content_type() const { return Header("content-type"); }
  std::string_view content_range() const { return Header("content-range"); }
  std::string_view retry_after() const { return Header("retry-after"); }
  std::string_view ratelimit_limit() const { return Header("ratelimit-limit"); }
  std::string_view ratelimit_remaining() const { return Header("ratelimit-remaining"); }
  std::string_view ratelimit_reset() const { return Header("ratelimit-reset"); }
};

// Runs on the loop thread; see the threading contract above.
using HttpCallback = std::function<void(Result<HttpResponse>)>;

struct HttpClientOptions {
  // atfill's version, named in the User-Agent; empty = the version this library was built as.
  std::string version;
  // The whole User-Agent; empty = "atfill/<version> (+https://github.com/atfill)".
  std::string user_agent;
  // Transfers running at once over all hosts; 1..100000.
  int max_in_flight = 192;
  // Transfers running at once per host (scheme + host + port, see HostKey()); 1..1000.
  int max_per_host = 3;
  // Distinct hosts with transfers running at once; 1..100000.
  int max_hosts = 64;
  // Time allowed to establish a connection (TCP and TLS), in milliseconds.
  int64_t connect_timeout_ms = 10'000;
  // Total time allowed per attempt, in milliseconds (a request may override it).
  int64_t timeout_ms = 30'000;
  // Largest response body accepted, in bytes (a request may override it).
  uint64_t max_response_bytes = uint64_t{64} << 20;
  // Redirects followed per attempt; 0 = return 3xx responses as they are.
  int max_redirects = 5;
  // Retries of 5xx, 408 and transport failures (a request may override it).
  RetryPolicy retry;
  // Host cooldown after a 429.
  RateLimitPolicy rate_limit;
  // Pacing to a byte quota hosts advertise (off unless a header is named).
  ByteQuotaPolicy quota;
  // Consecutive failed attempts (transport failure, 5xx or 408) that mark a host down; 1..1000.
  int host_failure_threshold = 5;
  // How long a down host refuses requests at once before letting a single probe through, in
  // milliseconds; the probe's success brings the host back.
  int64_t host_down_ms = 30'000;
  // Allow connecting to loopback, private, link-local and other non-public addresses (tests and
  // simnet); when false every connection's address is checked as it is opened, except for
  // requests marked trusted_endpoint.
  bool allow_private_addresses = false;
  // Negotiate HTTP/2 over TLS (ALPN) and multiplex requests to a host over one connection.
  bool http2 = true;
  // Wall clock in unix milliseconds, read to interpret RateLimit-Reset and HTTP-dates; empty =
  // the system clock. Timers always run on the steady clock.
  std::function<int64_t()> now_unix_ms;
  // Seed of the backoff jitter; 0 = seeded from std::random_device.
  uint64_t random_seed = 0;

  // OK, or Invalid naming the first field out of range and its value.
  Status Validate() const;
};

// Counters since Start(); gauges are instantaneous. Responses are counted per attempt.
struct HttpClientStats {
  uint64_t submitted = 0;          // Submit() calls
  uint64_t completed = 0;          // callbacks run
  uint64_t responses_2xx = 0;      // attempts answered 2xx
  uint64_t responses_3xx = 0;      // attempts answered 3xx
  uint64_t responses_4xx = 0;      // attempts answered 4xx (429 included)
  uint64_t responses_5xx = 0;      // attempts answered 5xx
  uint64_t transport_errors = 0;   // attempts that got no HTTP answer
  uint64_t retries = 0;            // attempts scheduled after a failed one
  uint64_t rate_limited = 0;       // 429 answers
  uint64_t hosts_marked_down = 0;  // times a host was marked down
  uint64_t deferred = 0;           // requests completed at once because their host was down
  uint64_t cancelled = 0;          // requests completed by Shutdown()
  uint64_t bytes_received = 0;     // response body bytes, after decoding
  uint64_t bytes_sent = 0;         // request body bytes
  uint64_t attempts = 0;           // attempts started (redirect hops followed by hand included)
  int64_t paced_ms = 0;            // time hosts were held back by their byte quota, ms
  int64_t in_flight = 0;           // transfers running now
  int64_t queued = 0;              // requests accepted and not running (queue, backoff, cooldown)
  int64_t active_hosts = 0;        // hosts with a transfer running now
};

// One host's state as last published by the loop.
struct HostStatus {
  bool known = false;            // false when the client holds no state for the host
  int in_flight = 0;             // transfers running now
  int queued = 0;                // requests waiting for a slot, the cooldown or a backoff
  int consecutive_failures = 0;  // failed attempts since the last answer that was not a failure
  bool down = false;             // requests are deferred (see host_failure_threshold)
  int64_t cooldown_remaining_ms = 0;  // time left before new requests may start (after a 429)
};

// Process-wide: called on the client's loop thread for every HTTP attempt that ends, with its
// status (<= 0 when no answer came: connection failure, timeout), by every HttpClient of the
// process; for metrics. nullptr (the default) calls nothing. Must be fast and must not throw.
void SetResponseObserver(void (*observer)(int status));

class HttpClient {
 public:
  // Validates `options`, initialises libcurl and starts the loop thread.
  static Result<std::unique_ptr<HttpClient>> Start(HttpClientOptions options);

  // Shutdown(). Must not run on the loop thread (that is, inside a callback).
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Queues `request`; `done` runs once on the loop thread with the outcome. After Shutdown(),
  // `done` runs at once on the calling thread with Cancelled. Thread-safe; never blocks on I/O.
  void Submit(HttpRequest request, HttpCallback done);

  // Submit() and wait. Blocks the calling thread: tools and tests only. Internal error when called
  // on the loop thread.
  Result<HttpResponse> Fetch(HttpRequest request);

  // Runs `fn` once on the loop thread when `delay_ms` (steady clock) have passed, so that a caller
  // can bound a chain of requests by one deadline without a thread of its own. `fn` follows the
  // callback rules above. When the client shuts down first, `fn` runs then (on the loop thread, as
  // it stops), and after Shutdown() at once on the calling thread: it always runs once.
  // Thread-safe; never blocks.
  void After(int64_t delay_ms, std::function<void()> fn);

  // Completes every request with Cancelled and stops the loop thread; idempotent, thread-safe.
  // Called from a callback it only asks the loop to stop; the destructor then joins it.
  void Shutdown();

  // Thread-safe snapshot of the counters.
  HttpClientStats stats() const;
  // Thread-safe snapshot of one host, named by its HostKey() ("http://127.0.0.1:8080").
  HostStatus HostState(std::string_view host) const;

  const HttpClientOptions& options() const;

 private:
  class Impl;
  explicit HttpClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace atfill::net
