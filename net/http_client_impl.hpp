// The HTTP client's private state, shared by http_client.cpp (the libcurl multi loop: sockets,
// timers, transfers, submissions) and http_policy.cpp (what a request's attempt ends with:
// retries, redirects, cooldowns, host health, quotas and per-host limits). Not for use outside
// net/.
#pragma once

#include "net/http_client.hpp"

#include <curl/curl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <queue>
#include <random>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "net/endpoint.hpp"

namespace atfill::net {

inline std::atomic<void (*)(int)> g_response_observer{nullptr};

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A response whose headers exceed this is abandoned (libcurl 7.88 bounds single headers only).
constexpr size_t kMaxHeaderBytes = 256 * 1024;
// The loop re-checks its stop flag and timers at least this often, in milliseconds.
constexpr int64_t kMaxPollMs = 1000;

inline int64_t SystemNowUnixMs() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline int64_t ToNanos(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

inline Status CurlGlobalInit() {
  // Thread-safe since libcurl 7.84 and guarded by the static's initialisation anyway.
  static const CURLcode code = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (code != CURLE_OK) {
    return Status::Internal(std::string("curl_global_init failed: ") + curl_easy_strerror(code));
  }
  return Status::OK();
}

// Transport failures that say nothing definitive about the request: the next attempt may work.
inline bool IsRetryableTransport(CURLcode code) {
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

// 5xx says the server is in trouble, except 501 and 505 which are definitive refusals.
inline bool IsRetryableStatus(int status) {
  return status == 408 || (status >= 500 && status <= 599 && status != 501 && status != 505);
}

inline bool IsTokenChar(unsigned char c) {
  return std::isalnum(c) ||
         std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

inline bool IsToken(std::string_view s) {
  return !s.empty() && s.size() <= 256 &&
         std::all_of(s.begin(), s.end(), [](char c) { return IsTokenChar(c); });
}

inline Status ValidateRequest(const HttpRequest& request) {
  if (!IsToken(request.method)) {
    return Status::Invalid("HTTP method '" + request.method + "' is not a valid token");
  }
  HttpHeaders all = request.headers;
  all.insert(all.end(), request.credentials.begin(), request.credentials.end());
  for (const auto& [name, value] : all) {
    if (!IsToken(name)) return Status::Invalid("request header name '" + name + "' is not a token");
    if (value.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
      return Status::Invalid("request header '" + name + "' has a line break or NUL in its value");
    }
  }
  if (request.timeout_ms < 0) {
    return Status::Invalid("request timeout_ms must not be negative, got " +
                           std::to_string(request.timeout_ms));
  }
  if (request.retry) ATFILL_RETURN_IF_ERROR(request.retry->Validate());
  return Status::OK();
}

inline std::string_view TrimView(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

inline bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

inline bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && EqualsIgnoreCase(s.substr(0, prefix.size()), prefix);
}

// A redirect's Location resolved against the URL that answered (RFC 3986 §5.2, without dot
// segment removal: servers send absolute paths in practice).
inline std::string ResolveLocation(const std::string& url, std::string_view location) {
  if (StartsWithNoCase(location, "http://") || StartsWithNoCase(location, "https://")) {
    return std::string(location);
  }
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return std::string(location);
  if (location.substr(0, 2) == "//") return url.substr(0, scheme_end + 1) + std::string(location);
  const size_t path_start = url.find_first_of("/?#", scheme_end + 3);
  const std::string root = url.substr(0, path_start);
  if (!location.empty() && location.front() == '/') return root + std::string(location);
  std::string path = path_start == std::string::npos ? "/" : url.substr(path_start);
  if (!location.empty() && location.front() == '?') {
    return root + path.substr(0, path.find_first_of("?#")) + std::string(location);
  }
  path = path.substr(0, path.find_first_of("?#"));
  return root + path.substr(0, path.rfind('/') + 1) + std::string(location);
}

inline bool IsRedirect(int status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

// One byte quota (ByteQuotaPolicy): a token bucket with no burst allowance, in debt while
// tokens < 0. Shared by the clients of the process, so guarded by its own mutex.
class QuotaBucket {
 public:
  // 0 when a request may start now (`*reserved` bytes are then held for it), else the wait in
  // milliseconds before asking again.
  int64_t Acquire(double* reserved) {
    std::lock_guard lock(mu_);
    Refill(Clock::now());
    *reserved = 0;
    if (rate_ <= 0) return 0;
    if (tokens_ < 0) {
      return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(-tokens_ / rate_ * 1e3)));
    }
    *reserved = average_;
    tokens_ -= average_;
    return 0;
  }

  // Charges a completed attempt its `bytes` (less what it reserved) and takes the rate the
  // answer advertised, if any.
  void Settle(double reserved, uint64_t bytes, std::string_view advertised) {
    std::lock_guard lock(mu_);
    Refill(Clock::now());
    advertised = TrimView(advertised);
    uint64_t value = 0;
    const auto [end, ec] =
        std::from_chars(advertised.data(), advertised.data() + advertised.size(), value);
    const bool valid =
        !advertised.empty() && ec == std::errc() && end == advertised.data() + advertised.size();
    if (valid && static_cast<double>(value) != rate_) {
      // A quota that starts or ends starts a clean bucket: what was reserved under another rate
      // means nothing under this one.
      if (rate_ <= 0 || value == 0) {
        tokens_ = 0;
        reserved = 0;
      }
      rate_ = static_cast<double>(value);
    }
    if (rate_ > 0) tokens_ -= static_cast<double>(bytes) - reserved;
    const double b = static_cast<double>(bytes);
    average_ = average_ == 0 ? b : 0.8 * average_ + 0.2 * b;
  }

 private:
  void Refill(Clock::time_point now) {
    const double dt = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    if (rate_ > 0) tokens_ = std::min(0.0, tokens_ + rate_ * dt);
  }

  std::mutex mu_;
  double rate_ = 0;    // bytes per second; 0 = none advertised
  double tokens_ = 0;  // <= 0: the debt, in bytes
  double average_ = 0;
  Clock::time_point last_ = Clock::now();
};

inline std::shared_ptr<QuotaBucket> QuotaBucketFor(const ByteQuotaPolicy& policy,
                                                   const std::string& host_key) {
  // Kept for the life of the process: a quota outlives the clients and the idle hosts that learnt
  // it (one bucket per host and scope of the clients that name a quota header). Never destroyed:
  // clients may be torn down during static destruction.
  static auto* mu = new std::mutex;
  static auto* registry = new std::map<std::string, std::shared_ptr<QuotaBucket>>;
  const std::string key = policy.header + '\n' + policy.scope + '\n' + host_key;
  std::lock_guard lock(*mu);
  std::shared_ptr<QuotaBucket>& slot = (*registry)[key];
  if (!slot) slot = std::make_shared<QuotaBucket>();
  return slot;
}

template <typename T>
inline Status Bounded(std::string_view field, T value, T low, T high) {
  if (value < low || value > high) {
    return Status::Invalid("HttpClientOptions." + std::string(field) + " must be in " +
                           std::to_string(low) + ".." + std::to_string(high) + ", got " +
                           std::to_string(value));
  }
  return Status::OK();
}

class HttpClient::Impl {
 public:
  explicit Impl(HttpClientOptions options);
  ~Impl();
  Status Init();
  void Submit(HttpRequest request, HttpCallback done);
  void After(int64_t delay_ms, std::function<void()> fn);
  void RequestStop();

  // Any thread: makes the loop's epoll_wait return.
  void Wake();
  void Join();

  // For a client destroyed from its own callback: the loop finishes on its own.
  void Detach();
  bool OnLoopThread() const { return std::this_thread::get_id() == loop_id_.load(); }

  HttpClientStats Stats() const;
  HostStatus HostState(std::string_view key) const;
  const HttpClientOptions& options() const { return options_; }

 private:
  struct Host {
    explicit Host(std::string k) : key(std::move(k)) {}
    const std::string key;
    // Ids of requests ready to start, oldest first (retries go to the front).
    std::deque<uint64_t> queue;
    // Ids of requests waiting for a backoff timer.
    std::unordered_set<uint64_t> backing_off;
    bool in_ready = false;  // listed in ready_
    Clock::time_point cooldown_until{};
    Clock::time_point down_until{};
    // The host's byte quota bucket (ByteQuotaPolicy), and when it lets the next request start.
    std::shared_ptr<QuotaBucket> quota;
    Clock::time_point paced_until{};
    std::string last_error;
    // Written by the loop only; atomics so HostState() can read them from any thread.
    std::atomic<int> in_flight{0};
    std::atomic<int> queued{0};
    std::atomic<int> consecutive_failures{0};
    std::atomic<bool> down{false};
    std::atomic<int64_t> cooldown_until_ns{0};
  };
  struct Transfer {
    uint64_t id = 0;
    HttpRequest request;
    HttpCallback done;
    Impl* impl = nullptr;
    Host* host = nullptr;
    RetryPolicy retry;
    uint64_t max_bytes = 0;
    int64_t timeout_ms = 0;
    Clock::time_point submitted;
    int attempts = 0;
    bool probe = false;  // the single attempt let through to a down host
    std::string last_transport_error;
    std::string origin;     // host key of the request's URL: where `credentials` may go
    int free_attempts = 0;  // attempts that used none of the retries (503s, 429s, redirect hops)
    int unavailable = 0;    // 503s retried (RetryPolicy::unavailable_retries)
    int redirects = 0;      // hops followed by hand
    int64_t throttled_ms = 0;
    double reserved = 0;  // quota bytes the running attempt holds
    // State of the running attempt.
    CURL* easy = nullptr;
    curl_slist* header_list = nullptr;
    HttpResponse response;
    size_t header_bytes = 0;
    bool body_over_cap = false;
    bool headers_over_cap = false;
    std::string refused;
    std::array<char, CURL_ERROR_SIZE> error_buffer{};
  };
  struct Timer {
    Clock::time_point when;
    uint64_t id;  // a transfer to requeue, or 0 to re-run the scheduler (a cooldown ended)
    bool operator>(const Timer& other) const { return when > other.when; }
  };

  // A caller's timer (After()); kept apart from timers_, whose entries name transfers.
  struct Alarm {
    Clock::time_point when;
    std::function<void()> fn;
  };
  struct Counters {
    std::atomic<uint64_t> submitted{0}, completed{0}, transport_errors{0}, retries{0},
        rate_limited{0}, hosts_marked_down{0}, deferred{0}, cancelled{0}, bytes_received{0},
        bytes_sent{0}, attempts{0};
    std::atomic<int64_t> paced_ms{0};
    std::array<std::atomic<uint64_t>, 6> by_class{};
    std::atomic<int64_t> in_flight{0}, live{0}, active_hosts{0};
  };
  static void Deliver(HttpCallback& done, Result<HttpResponse> outcome) noexcept;
  static void Ring(Alarm& alarm) noexcept;

  // ---- libcurl callbacks (loop thread) ----

  static size_t OnBody(char* data, size_t size, size_t count, void* user);
  static size_t OnHeader(char* data, size_t size, size_t count, void* user);

  // Checks the address each connection is about to use, so a host name that resolves to a
  // private address (at any time, DNS rebinding included) is never connected to.
  static curl_socket_t OnOpenSocket(void* user, curlsocktype purpose, curl_sockaddr* address);

  // ---- the loop ----

  void Run();

  // libcurl's socket interface: which events of which socket it waits for.
  static int OnCurlSocket(CURL* /*easy*/, curl_socket_t fd, int what, void* user,
                          void* /*socket_data*/);

  // libcurl's socket interface: when it wants CURL_SOCKET_TIMEOUT (-1: no timer).
  static int OnCurlTimer(CURLM* /*multi*/, long timeout_ms, void* user);
  int NextWaitMs();
  void DrainSubmissions();
  void FireAlarms();
  void Accept(std::unique_ptr<Transfer> owned);
  Host* GetOrCreateHost(const std::string& key);

  // Drops a host that carries no state, so a long crawl over many hosts keeps memory flat.
  void MaybeForget(Host* h);
  void PublishQueued(Host* h);
  void Enqueue(Transfer* t, bool front);
  Transfer* Find(uint64_t id);
  void FireTimers();

  // Starts queued requests, visiting hosts round-robin so that one busy host cannot starve the
  // others of global slots.
  void Schedule();
  int64_t InFlight() const { return counters_.in_flight.load(std::memory_order_relaxed); }

  void StartAttempt(Transfer* t);
  Status Configure(CURL* e, Transfer* t);
  CURL* AcquireEasy();

  // Connections live in the multi handle's cache, so resetting an easy handle keeps them alive.
  void ReleaseEasy(CURL* e);
  void DetachEasy(Transfer* t);
  bool HarvestCompletions();
  void OnAttemptDone(Transfer* t, CURLcode code, int status);

  // A redirect of a request with credentials (see HttpRequest::credentials): the same transfer
  // goes on at the Location, queued on that URL's host.
  void FollowRedirect(Transfer* t, const std::string& what);
  void Retry(Transfer* t, int64_t delay_ms);
  void Cooldown(Host* h, int64_t wait_ms);
  void NoteFailure(Host* h, const std::string& error);

  // Any answer that is not a failure proves the host is alive.
  void NoteAnswer(Host* h);
  void MarkDown(Host* h);

  // Completes every request of `h` that is not running with the deferral error.
  void DeferWaiting(Host* h);
  void FinishDeferred(Transfer* t);

  // Removes `t` and runs its callback last, when no loop structure refers to it any more.
  void Finish(Transfer* t, Result<HttpResponse> outcome);
  void CancelEverything();
  HttpClientOptions options_;
  CURLM* multi_ = nullptr;
  int epoll_fd_ = -1;  // the sockets libcurl waits on, and wake_fd_
  int wake_fd_ = -1;   // an eventfd other threads write to wake the loop
  // libcurl's timer (OnCurlTimer): when the loop owes it a CURL_SOCKET_TIMEOUT call.
  bool curl_due_ = false;
  Clock::time_point curl_deadline_;
  std::thread thread_;
  std::atomic<std::thread::id> loop_id_{};
  std::mutex join_mu_;
  std::atomic<bool> stop_{false};

  // Submissions from any thread, drained by the loop.
  std::mutex pending_mu_;
  bool accepting_ = false;
  std::vector<std::unique_ptr<Transfer>> pending_;
  std::vector<Alarm> pending_alarms_;

  // Loop-thread state. hosts_ is also read by HostState(), so the loop changes its shape (insert,
  // erase) under hosts_mu_ and reads it without.
  mutable std::shared_mutex hosts_mu_;
  std::unordered_map<std::string, std::unique_ptr<Host>> hosts_;
  std::unordered_map<uint64_t, std::unique_ptr<Transfer>> transfers_;
  std::deque<Host*> ready_;  // hosts with queued requests, in round-robin order
  std::priority_queue<Timer, std::vector<Timer>, std::greater<>> timers_;
  std::multimap<Clock::time_point, Alarm> alarms_;
  std::vector<CURL*> idle_easy_;
  uint64_t next_id_ = 1;
  bool schedule_needed_ = false;
  bool cancelling_ = false;  // CancelEverything has begun; hosts are no longer forgotten
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
  Counters counters_;
};

}  // namespace atfill::net
