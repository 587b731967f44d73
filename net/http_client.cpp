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
namespace {

std::atomic<void (*)(int)> g_response_observer{nullptr};

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A response whose headers exceed this is abandoned (libcurl 7.88 bounds single headers only).
constexpr size_t kMaxHeaderBytes = 256 * 1024;
// The loop re-checks its stop flag and timers at least this often, in milliseconds.
constexpr int64_t kMaxPollMs = 1000;

int64_t SystemNowUnixMs() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t ToNanos(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

Status CurlGlobalInit() {
  // Thread-safe since libcurl 7.84 and guarded by the static's initialisation anyway.
  static const CURLcode code = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (code != CURLE_OK) {
    return Status::Internal(std::string("curl_global_init failed: ") + curl_easy_strerror(code));
  }
  return Status::OK();
}

// Transport failures that say nothing definitive about the request: the next attempt may work.
bool IsRetryableTransport(CURLcode code) {
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
bool IsRetryableStatus(int status) {
  return status == 408 || (status >= 500 && status <= 599 && status != 501 && status != 505);
}

bool IsTokenChar(unsigned char c) {
  return std::isalnum(c) ||
         std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

bool IsToken(std::string_view s) {
  return !s.empty() && s.size() <= 256 &&
         std::all_of(s.begin(), s.end(), [](char c) { return IsTokenChar(c); });
}

Status ValidateRequest(const HttpRequest& request) {
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

std::string_view TrimView(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && EqualsIgnoreCase(s.substr(0, prefix.size()), prefix);
}

// A redirect's Location resolved against the URL that answered (RFC 3986 §5.2, without dot
// segment removal: servers send absolute paths in practice).
std::string ResolveLocation(const std::string& url, std::string_view location) {
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

bool IsRedirect(int status) {
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

std::shared_ptr<QuotaBucket> QuotaBucketFor(const ByteQuotaPolicy& policy,
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
Status Bounded(std::string_view field, T value, T low, T high) {
  if (value < low || value > high) {
    return Status::Invalid("HttpClientOptions." + std::string(field) + " must be in " +
                           std::to_string(low) + ".." + std::to_string(high) + ", got " +
                           std::to_string(value));
  }
  return Status::OK();
}

}  // namespace

std::string_view HttpResponse::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (EqualsIgnoreCase(key, name)) return value;
  }
  return {};
}

Status HttpClientOptions::Validate() const {
  constexpr int64_t kDay = 24LL * 3600 * 1000;
  ATFILL_RETURN_IF_ERROR(Bounded("max_in_flight", max_in_flight, 1, 100'000));
  ATFILL_RETURN_IF_ERROR(Bounded("max_per_host", max_per_host, 1, 1'000));
  ATFILL_RETURN_IF_ERROR(Bounded("max_hosts", max_hosts, 1, 100'000));
  ATFILL_RETURN_IF_ERROR(Bounded<int64_t>("connect_timeout_ms", connect_timeout_ms, 1, kDay));
  ATFILL_RETURN_IF_ERROR(Bounded<int64_t>("timeout_ms", timeout_ms, 1, kDay));
  ATFILL_RETURN_IF_ERROR(
      Bounded<uint64_t>("max_response_bytes", max_response_bytes, 1, uint64_t{1} << 40));
  ATFILL_RETURN_IF_ERROR(Bounded("max_redirects", max_redirects, 0, 50));
  ATFILL_RETURN_IF_ERROR(Bounded("host_failure_threshold", host_failure_threshold, 1, 1'000));
  ATFILL_RETURN_IF_ERROR(Bounded<int64_t>("host_down_ms", host_down_ms, 0, kDay));
  if (Status st = retry.Validate(); !st.ok()) return st.WithContext("HttpClientOptions.retry");
  if (Status st = rate_limit.Validate(); !st.ok()) {
    return st.WithContext("HttpClientOptions.rate_limit");
  }
  if (user_agent.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
    return Status::Invalid("HttpClientOptions.user_agent has a line break or NUL");
  }
  if (version.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
    return Status::Invalid("HttpClientOptions.version has a line break or NUL");
  }
  return Status::OK();
}

class HttpClient::Impl {
 public:
  explicit Impl(HttpClientOptions options) : options_(std::move(options)) {
    if (!options_.now_unix_ms) options_.now_unix_ms = &SystemNowUnixMs;
    if (options_.user_agent.empty()) options_.user_agent = DefaultUserAgent(options_.version);
    rng_.seed(options_.random_seed != 0 ? options_.random_seed : std::random_device{}());
  }

  ~Impl() {
    RequestStop();
    Join();
    if (multi_ != nullptr) curl_multi_cleanup(multi_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
  }

  Status Init() {
    ATFILL_RETURN_IF_ERROR(CurlGlobalInit());
    // The loop waits in epoll for the sockets libcurl names (its socket interface), so each
    // wake-up costs what happened on it, not a pass over every transfer and socket
    // (curl_multi_perform and curl_multi_poll are linear in them, which a crawl's hundreds of
    // transfers made measurable in bench/crawl_bench).
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) return Status::Internal(std::string("epoll_create1: ") + strerror(errno));
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return Status::Internal(std::string("eventfd: ") + strerror(errno));
    epoll_event wake{};
    wake.events = EPOLLIN;
    wake.data.fd = wake_fd_;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &wake) != 0) {
      return Status::Internal(std::string("epoll_ctl: ") + strerror(errno));
    }
    multi_ = curl_multi_init();
    if (multi_ == nullptr) return Status::Internal("curl_multi_init failed");
    CURLMcode rc = curl_multi_setopt(multi_, CURLMOPT_PIPELINING,
                                     options_.http2 ? CURLPIPE_MULTIPLEX : CURLPIPE_NOTHING);
    if (rc == CURLM_OK) {
      rc = curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS,
                             static_cast<long>(std::max(options_.max_in_flight, 16)));
    }
    if (rc == CURLM_OK) rc = curl_multi_setopt(multi_, CURLMOPT_SOCKETFUNCTION, &OnCurlSocket);
    if (rc == CURLM_OK) rc = curl_multi_setopt(multi_, CURLMOPT_SOCKETDATA, this);
    if (rc == CURLM_OK) rc = curl_multi_setopt(multi_, CURLMOPT_TIMERFUNCTION, &OnCurlTimer);
    if (rc == CURLM_OK) rc = curl_multi_setopt(multi_, CURLMOPT_TIMERDATA, this);
    if (rc != CURLM_OK) {
      return Status::Internal(std::string("curl_multi_setopt failed: ") + curl_multi_strerror(rc));
    }
    accepting_ = true;
    thread_ = std::thread([this] { Run(); });
    return Status::OK();
  }

  void Submit(HttpRequest request, HttpCallback done) {
    auto transfer = std::make_unique<Transfer>();
    transfer->request = std::move(request);
    transfer->done = std::move(done);
    transfer->submitted = Clock::now();
    transfer->impl = this;
    counters_.submitted.fetch_add(1, std::memory_order_relaxed);
    {
      std::lock_guard lock(pending_mu_);
      if (accepting_) {
        pending_.push_back(std::move(transfer));
        // Under the lock: the loop clears accepting_ under it before the handle can go away.
        Wake();
        return;
      }
    }
    counters_.cancelled.fetch_add(1, std::memory_order_relaxed);
    counters_.completed.fetch_add(1, std::memory_order_relaxed);
    Deliver(transfer->done,
            Status::Cancelled("HTTP client is shut down; " + transfer->request.method + " " +
                              transfer->request.url + " not sent"));
  }

  void After(int64_t delay_ms, std::function<void()> fn) {
    Alarm alarm{Clock::now() + milliseconds(std::max<int64_t>(delay_ms, 0)), std::move(fn)};
    {
      std::lock_guard lock(pending_mu_);
      if (accepting_) {
        pending_alarms_.push_back(std::move(alarm));
        Wake();
        return;
      }
    }
    Ring(alarm);
  }

  void RequestStop() {
    std::lock_guard lock(pending_mu_);
    stop_.store(true);
    if (accepting_) Wake();
  }

  // Any thread: makes the loop's epoll_wait return.
  void Wake() {
    const uint64_t one = 1;
    // A full counter (it never is: the loop reads it on every wake-up) still wakes the loop.
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  }

  void Join() {
    std::lock_guard lock(join_mu_);
    if (thread_.joinable() && !OnLoopThread()) thread_.join();
  }

  // For a client destroyed from its own callback: the loop finishes on its own.
  void Detach() {
    std::lock_guard lock(join_mu_);
    if (thread_.joinable()) thread_.detach();
  }

  bool OnLoopThread() const { return std::this_thread::get_id() == loop_id_.load(); }

  HttpClientStats Stats() const {
    HttpClientStats s;
    auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    s.submitted = get(counters_.submitted);
    s.completed = get(counters_.completed);
    s.responses_2xx = get(counters_.by_class[2]);
    s.responses_3xx = get(counters_.by_class[3]);
    s.responses_4xx = get(counters_.by_class[4]);
    s.responses_5xx = get(counters_.by_class[5]);
    s.transport_errors = get(counters_.transport_errors);
    s.retries = get(counters_.retries);
    s.rate_limited = get(counters_.rate_limited);
    s.hosts_marked_down = get(counters_.hosts_marked_down);
    s.deferred = get(counters_.deferred);
    s.cancelled = get(counters_.cancelled);
    s.bytes_received = get(counters_.bytes_received);
    s.bytes_sent = get(counters_.bytes_sent);
    s.attempts = get(counters_.attempts);
    s.paced_ms = counters_.paced_ms.load(std::memory_order_relaxed);
    s.in_flight = counters_.in_flight.load(std::memory_order_relaxed);
    s.queued = std::max<int64_t>(0, counters_.live.load(std::memory_order_relaxed) - s.in_flight);
    s.active_hosts = counters_.active_hosts.load(std::memory_order_relaxed);
    return s;
  }

  HostStatus HostState(std::string_view key) const {
    HostStatus out;
    std::shared_lock lock(hosts_mu_);
    auto it = hosts_.find(std::string(key));
    if (it == hosts_.end()) return out;
    const Host& h = *it->second;
    out.known = true;
    out.in_flight = h.in_flight.load(std::memory_order_relaxed);
    out.queued = h.queued.load(std::memory_order_relaxed);
    out.consecutive_failures = h.consecutive_failures.load(std::memory_order_relaxed);
    out.down = h.down.load(std::memory_order_relaxed);
    const int64_t left_ns =
        h.cooldown_until_ns.load(std::memory_order_relaxed) - ToNanos(Clock::now());
    out.cooldown_remaining_ms = left_ns > 0 ? (left_ns + 999'999) / 1'000'000 : 0;
    return out;
  }

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

  static void Deliver(HttpCallback& done, Result<HttpResponse> outcome) noexcept {
    if (done) done(std::move(outcome));
  }

  static void Ring(Alarm& alarm) noexcept {
    if (alarm.fn) alarm.fn();
  }

  // ---- libcurl callbacks (loop thread) ----

  static size_t OnBody(char* data, size_t size, size_t count, void* user) {
    auto* t = static_cast<Transfer*>(user);
    const size_t n = size * count;
    if (t->response.body.size() + n > t->max_bytes) {
      t->body_over_cap = true;
      return 0;  // anything but n aborts the transfer
    }
    if (t->response.body.empty()) {
      // Large bodies (repository CARs) would otherwise be copied through every doubling.
      curl_off_t announced = -1;
      if (curl_easy_getinfo(t->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &announced) == CURLE_OK &&
          announced > 0 && static_cast<uint64_t>(announced) <= t->max_bytes) {
        t->response.body.reserve(static_cast<size_t>(announced));
      }
    }
    t->response.body.append(data, n);
    t->impl->counters_.bytes_received.fetch_add(n, std::memory_order_relaxed);
    return n;
  }

  static size_t OnHeader(char* data, size_t size, size_t count, void* user) {
    auto* t = static_cast<Transfer*>(user);
    const size_t n = size * count;
    t->header_bytes += n;
    if (t->header_bytes > kMaxHeaderBytes) {
      t->headers_over_cap = true;
      return 0;
    }
    std::string_view line(data, n);
    if (line.starts_with("HTTP/")) {
      // A new response begins (after a redirect or an interim 1xx): keep only the last one's.
      t->response.headers.clear();
      return n;
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return n;
    std::string name(TrimView(line.substr(0, colon)));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    t->response.headers.emplace_back(std::move(name),
                                     std::string(TrimView(line.substr(colon + 1))));
    return n;
  }

  // Checks the address each connection is about to use, so a host name that resolves to a
  // private address (at any time, DNS rebinding included) is never connected to.
  static curl_socket_t OnOpenSocket(void* user, curlsocktype purpose, curl_sockaddr* address) {
    auto* t = static_cast<Transfer*>(user);
    if (purpose == CURLSOCKTYPE_IPCXN) {
      Status verdict = CheckPublicAddress(&address->addr, address->addrlen);
      if (!verdict.ok()) {
        t->refused = verdict.message();
        return CURL_SOCKET_BAD;
      }
    }
    return socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
  }

  // ---- the loop ----

  void Run() {
    loop_id_.store(std::this_thread::get_id());
    while (!stop_.load()) {
      DrainSubmissions();
      FireTimers();
      FireAlarms();
      if (schedule_needed_) {
        schedule_needed_ = false;
        Schedule();
      }
      int running = 0;
      if (curl_due_ && Clock::now() >= curl_deadline_) {
        curl_due_ = false;
        curl_multi_socket_action(multi_, CURL_SOCKET_TIMEOUT, 0, &running);
      }
      if (HarvestCompletions()) {
        schedule_needed_ = true;
        continue;  // freed slots: schedule before sleeping
      }
      std::array<epoll_event, 64> events;
      const int n =
          ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), NextWaitMs());
      for (int i = 0; i < n; ++i) {
        const int fd = events[static_cast<size_t>(i)].data.fd;
        const uint32_t what = events[static_cast<size_t>(i)].events;
        if (fd == wake_fd_) {
          uint64_t count = 0;
          [[maybe_unused]] ssize_t r = ::read(wake_fd_, &count, sizeof(count));
          continue;
        }
        int mask = 0;
        if ((what & EPOLLIN) != 0) mask |= CURL_CSELECT_IN;
        if ((what & EPOLLOUT) != 0) mask |= CURL_CSELECT_OUT;
        if ((what & (EPOLLERR | EPOLLHUP)) != 0) mask |= CURL_CSELECT_ERR;
        curl_multi_socket_action(multi_, fd, mask, &running);
      }
    }
    CancelEverything();
  }

  // libcurl's socket interface: which events of which socket it waits for.
  static int OnCurlSocket(CURL* /*easy*/, curl_socket_t fd, int what, void* user,
                          void* /*socket_data*/) {
    auto* self = static_cast<Impl*>(user);
    if (what == CURL_POLL_REMOVE) {
      // The socket may be closed already, which removed it from the set.
      ::epoll_ctl(self->epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
      return 0;
    }
    epoll_event ev{};
    ev.data.fd = fd;
    if (what == CURL_POLL_IN || what == CURL_POLL_INOUT) ev.events |= EPOLLIN;
    if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT) ev.events |= EPOLLOUT;
    if (::epoll_ctl(self->epoll_fd_, EPOLL_CTL_MOD, fd, &ev) != 0 && errno == ENOENT) {
      ::epoll_ctl(self->epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    }
    return 0;
  }

  // libcurl's socket interface: when it wants CURL_SOCKET_TIMEOUT (-1: no timer).
  static int OnCurlTimer(CURLM* /*multi*/, long timeout_ms, void* user) {
    auto* self = static_cast<Impl*>(user);
    self->curl_due_ = timeout_ms >= 0;
    if (timeout_ms >= 0) self->curl_deadline_ = Clock::now() + milliseconds(timeout_ms);
    return 0;
  }

  int NextWaitMs() {
    int64_t wait = kMaxPollMs;
    if (curl_due_) {
      const int64_t left_ms =
          std::chrono::ceil<milliseconds>(curl_deadline_ - Clock::now()).count();
      wait = std::min(wait, std::max<int64_t>(left_ms, 0));
    }
    if (!alarms_.empty()) {
      const auto left = alarms_.begin()->first - Clock::now();
      wait = std::min(wait, std::max<int64_t>(std::chrono::ceil<milliseconds>(left).count(), 0));
    }
    if (!timers_.empty()) {
      const auto left = timers_.top().when - Clock::now();
      // Rounded up so the loop does not wake just before the timer and spin.
      const int64_t left_ms = std::chrono::ceil<milliseconds>(left).count();
      wait = std::min(wait, std::max<int64_t>(left_ms, 0));
    }
    return static_cast<int>(wait);
  }

  void DrainSubmissions() {
    std::vector<std::unique_ptr<Transfer>> batch;
    std::vector<Alarm> alarms;
    {
      std::lock_guard lock(pending_mu_);
      batch.swap(pending_);
      alarms.swap(pending_alarms_);
    }
    for (auto& transfer : batch) Accept(std::move(transfer));
    for (Alarm& alarm : alarms) {
      const Clock::time_point when = alarm.when;
      alarms_.emplace(when, std::move(alarm));
    }
  }

  void FireAlarms() {
    const auto now = Clock::now();
    while (!alarms_.empty() && alarms_.begin()->first <= now) {
      // Taken out first: the alarm may call After(), which only queues.
      Alarm alarm = std::move(alarms_.begin()->second);
      alarms_.erase(alarms_.begin());
      Ring(alarm);
    }
  }

  void Accept(std::unique_ptr<Transfer> owned) {
    HttpRequest& request = owned->request;
    Status valid = ValidateRequest(request);
    Result<std::string> key = valid.ok() ? HostKey(request.url) : Result<std::string>(valid);
    if (!key.ok()) {
      counters_.completed.fetch_add(1, std::memory_order_relaxed);
      Deliver(owned->done, key.status().WithContext(request.method + " " + request.url));
      return;
    }
    owned->retry = request.retry.value_or(options_.retry);
    owned->origin = *key;
    owned->max_bytes =
        request.max_response_bytes > 0 ? request.max_response_bytes : options_.max_response_bytes;
    owned->timeout_ms = request.timeout_ms > 0 ? request.timeout_ms : options_.timeout_ms;
    Host* host = GetOrCreateHost(*key);
    owned->host = host;
    owned->id = next_id_++;
    Transfer* t = owned.get();
    transfers_.emplace(t->id, std::move(owned));
    counters_.live.fetch_add(1, std::memory_order_relaxed);
    if (host->down.load() && Clock::now() < host->down_until) {
      FinishDeferred(t);
      return;
    }
    Enqueue(t, /*front=*/false);
  }

  Host* GetOrCreateHost(const std::string& key) {
    if (auto it = hosts_.find(key); it != hosts_.end()) return it->second.get();
    auto host = std::make_unique<Host>(key);
    if (!options_.quota.header.empty()) host->quota = QuotaBucketFor(options_.quota, key);
    std::unique_lock lock(hosts_mu_);
    return hosts_.emplace(key, std::move(host)).first->second.get();
  }

  // Drops a host that carries no state, so a long crawl over many hosts keeps memory flat.
  void MaybeForget(Host* h) {
    // While CancelEverything runs, transfers not yet finished may still point at the host.
    if (cancelling_ || h->in_ready || !h->queue.empty() || !h->backing_off.empty() ||
        h->in_flight.load() > 0 || h->down.load() || h->consecutive_failures.load() > 0 ||
        h->cooldown_until > Clock::now() || h->paced_until > Clock::now()) {
      return;
    }
    std::unique_lock lock(hosts_mu_);
    hosts_.erase(h->key);
  }

  void PublishQueued(Host* h) {
    h->queued.store(static_cast<int>(h->queue.size() + h->backing_off.size()));
  }

  void Enqueue(Transfer* t, bool front) {
    Host* h = t->host;
    if (front) {
      h->queue.push_front(t->id);
    } else {
      h->queue.push_back(t->id);
    }
    PublishQueued(h);
    if (!h->in_ready) {
      h->in_ready = true;
      ready_.push_back(h);
    }
    schedule_needed_ = true;
  }

  Transfer* Find(uint64_t id) {
    auto it = transfers_.find(id);
    return it == transfers_.end() ? nullptr : it->second.get();
  }

  void FireTimers() {
    const auto now = Clock::now();
    while (!timers_.empty() && timers_.top().when <= now) {
      const uint64_t id = timers_.top().id;
      timers_.pop();
      schedule_needed_ = true;
      if (id == 0) continue;
      Transfer* t = Find(id);
      if (t == nullptr || t->host->backing_off.erase(id) == 0) continue;  // already completed
      Host* h = t->host;
      PublishQueued(h);
      if (h->down.load() && now < h->down_until) {
        FinishDeferred(t);
      } else {
        Enqueue(t, /*front=*/true);
      }
    }
  }

  // Starts queued requests, visiting hosts round-robin so that one busy host cannot starve the
  // others of global slots.
  void Schedule() {
    const auto now = Clock::now();
    for (size_t n = ready_.size(); n > 0 && InFlight() < options_.max_in_flight; --n) {
      Host* h = ready_.front();
      ready_.pop_front();
      if (h->queue.empty()) {
        h->in_ready = false;
        MaybeForget(h);
        continue;
      }
      const bool down = h->down.load();
      if (down && now < h->down_until) {
        h->in_ready = false;
        DeferWaiting(h);
        continue;
      }
      const bool idle = h->in_flight.load() == 0;
      if (h->cooldown_until > now || h->paced_until > now ||
          (idle && counters_.active_hosts.load() >= options_.max_hosts)) {
        ready_.push_back(h);
        continue;
      }
      // A down host past its wait gets one probe at a time, with no retries.
      const int limit = down ? 1 : options_.max_per_host;
      while (!h->queue.empty() && h->in_flight.load() < limit &&
             InFlight() < options_.max_in_flight) {
        double reserved = 0;
        if (h->quota) {
          if (const int64_t wait = h->quota->Acquire(&reserved); wait > 0) {
            h->paced_until = now + milliseconds(wait);
            counters_.paced_ms.fetch_add(wait, std::memory_order_relaxed);
            timers_.push(Timer{h->paced_until, 0});
            break;
          }
        }
        Transfer* t = Find(h->queue.front());
        h->queue.pop_front();
        if (t == nullptr) {
          if (h->quota) h->quota->Settle(reserved, 0, {});
          continue;
        }
        t->probe = down;
        t->reserved = reserved;
        StartAttempt(t);
      }
      PublishQueued(h);
      if (h->queue.empty()) {
        h->in_ready = false;
        MaybeForget(h);
      } else {
        ready_.push_back(h);
      }
    }
  }

  int64_t InFlight() const { return counters_.in_flight.load(std::memory_order_relaxed); }

  void StartAttempt(Transfer* t) {
    ++t->attempts;
    counters_.attempts.fetch_add(1, std::memory_order_relaxed);
    t->response = HttpResponse{};
    t->header_bytes = 0;
    t->body_over_cap = false;
    t->headers_over_cap = false;
    t->refused.clear();
    t->error_buffer[0] = '\0';
    CURL* easy = AcquireEasy();
    if (easy == nullptr) {
      Finish(t, Status::Internal("curl_easy_init failed (out of memory)"));
      return;
    }
    if (Status st = Configure(easy, t); !st.ok()) {
      curl_slist_free_all(t->header_list);
      t->header_list = nullptr;
      ReleaseEasy(easy);
      Finish(t, st.WithContext(t->request.method + " " + t->request.url));
      return;
    }
    if (CURLMcode rc = curl_multi_add_handle(multi_, easy); rc != CURLM_OK) {
      curl_slist_free_all(t->header_list);
      t->header_list = nullptr;
      ReleaseEasy(easy);
      Finish(t, Status::Internal(std::string("curl_multi_add_handle failed: ") +
                                 curl_multi_strerror(rc)));
      return;
    }
    t->easy = easy;
    if (t->host->in_flight.fetch_add(1) == 0) counters_.active_hosts.fetch_add(1);
    counters_.in_flight.fetch_add(1);
    counters_.bytes_sent.fetch_add(t->request.body.size(), std::memory_order_relaxed);
  }

  Status Configure(CURL* e, Transfer* t) {
    const HttpRequest& r = t->request;
    CURLcode rc = CURLE_OK;
    // Variadic setopt: every value is passed with the exact type libcurl reads.
    auto set = [&](CURLoption option, auto value) {
      if (rc == CURLE_OK) rc = curl_easy_setopt(e, option, value);
    };
    set(CURLOPT_URL, r.url.c_str());
    set(CURLOPT_PRIVATE, static_cast<void*>(t));
    set(CURLOPT_ERRORBUFFER, t->error_buffer.data());
    set(CURLOPT_NOSIGNAL, 1L);
    set(CURLOPT_PROTOCOLS_STR, "http,https");
    set(CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    // Environment proxies would bypass the address check and make behaviour depend on the shell.
    set(CURLOPT_PROXY, "");
    // A request with credentials follows its redirects in OnAttemptDone, so that they never
    // leave their origin.
    const bool follow = options_.max_redirects > 0 && r.credentials.empty();
    set(CURLOPT_FOLLOWLOCATION, follow ? 1L : 0L);
    set(CURLOPT_MAXREDIRS, static_cast<long>(options_.max_redirects));
    set(CURLOPT_USERAGENT, options_.user_agent.c_str());
    set(CURLOPT_ACCEPT_ENCODING, "");  // every encoding libcurl decodes; caps apply after decoding
    set(CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout_ms));
    set(CURLOPT_TIMEOUT_MS, static_cast<long>(t->timeout_ms));
    set(CURLOPT_TCP_KEEPALIVE, 1L);
    set(CURLOPT_MAXFILESIZE_LARGE,
        static_cast<curl_off_t>(std::min<uint64_t>(t->max_bytes, INT64_MAX)));
    if (options_.http2) {
      set(CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_2TLS));
      // Only TLS negotiates HTTP/2; on plain http waiting would just serialise new hosts.
      if (r.url.size() >= 6 && EqualsIgnoreCase(std::string_view(r.url).substr(0, 6), "https:")) {
        set(CURLOPT_PIPEWAIT, 1L);
      }
    } else {
      set(CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
    }
    set(CURLOPT_WRITEFUNCTION, &Impl::OnBody);
    set(CURLOPT_WRITEDATA, static_cast<void*>(t));
    set(CURLOPT_HEADERFUNCTION, &Impl::OnHeader);
    set(CURLOPT_HEADERDATA, static_cast<void*>(t));
    if (!options_.allow_private_addresses && !r.trusted_endpoint) {
      set(CURLOPT_OPENSOCKETFUNCTION, &Impl::OnOpenSocket);
      set(CURLOPT_OPENSOCKETDATA, static_cast<void*>(t));
    }
    if (r.method == "HEAD") {
      set(CURLOPT_NOBODY, 1L);
    } else if (r.method == "GET" && r.body.empty()) {
      set(CURLOPT_HTTPGET, 1L);
    } else if (r.method == "POST" || !r.body.empty()) {
      set(CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
      set(CURLOPT_POSTFIELDS, r.body.data());
      if (r.method != "POST") set(CURLOPT_CUSTOMREQUEST, r.method.c_str());
    } else {
      set(CURLOPT_CUSTOMREQUEST, r.method.c_str());
    }
    // "Expect:" stops libcurl from waiting for a 100-continue before large bodies.
    curl_slist* list = curl_slist_append(nullptr, "Expect:");
    HttpHeaders headers = r.headers;
    if (!r.credentials.empty()) {
      const Result<std::string> here = HostKey(r.url);
      if (here.ok() && *here == t->origin) {
        headers.insert(headers.end(), r.credentials.begin(), r.credentials.end());
      }
    }
    for (const auto& [name, value] : headers) {
      if (list == nullptr) break;
      // "Name;" is libcurl's spelling of a header with an empty value.
      const std::string line = value.empty() ? name + ";" : name + ": " + value;
      curl_slist* grown = curl_slist_append(list, line.c_str());
      if (grown == nullptr) {
        curl_slist_free_all(list);
        list = nullptr;
      }
      list = grown;
    }
    if (list == nullptr) return Status::Internal("out of memory building request headers");
    t->header_list = list;
    set(CURLOPT_HTTPHEADER, list);
    if (rc != CURLE_OK) {
      return Status::Internal(std::string("curl_easy_setopt failed: ") + curl_easy_strerror(rc));
    }
    return Status::OK();
  }

  CURL* AcquireEasy() {
    if (!idle_easy_.empty()) {
      CURL* e = idle_easy_.back();
      idle_easy_.pop_back();
      return e;
    }
    return curl_easy_init();
  }

  // Connections live in the multi handle's cache, so resetting an easy handle keeps them alive.
  void ReleaseEasy(CURL* e) {
    curl_easy_reset(e);
    if (idle_easy_.size() < static_cast<size_t>(options_.max_in_flight)) {
      idle_easy_.push_back(e);
    } else {
      curl_easy_cleanup(e);
    }
  }

  void DetachEasy(Transfer* t) {
    if (t->easy == nullptr) return;
    curl_multi_remove_handle(multi_, t->easy);
    ReleaseEasy(t->easy);
    t->easy = nullptr;
    curl_slist_free_all(t->header_list);
    t->header_list = nullptr;
    if (t->host->in_flight.fetch_sub(1) == 1) counters_.active_hosts.fetch_sub(1);
    counters_.in_flight.fetch_sub(1);
  }

  bool HarvestCompletions() {
    bool any = false;
    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi_, &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      CURL* e = msg->easy_handle;
      const CURLcode code = msg->data.result;
      char* user = nullptr;
      curl_easy_getinfo(e, CURLINFO_PRIVATE, &user);
      auto* t = reinterpret_cast<Transfer*>(user);
      long status = 0;
      curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
      char* effective = nullptr;
      if (curl_easy_getinfo(e, CURLINFO_EFFECTIVE_URL, &effective) == CURLE_OK && effective) {
        t->response.effective_url = effective;
      }
      DetachEasy(t);
      any = true;
      if (t->host->quota) {
        t->host->quota->Settle(
            t->reserved, code == CURLE_OK ? t->response.body.size() : 0,
            code == CURLE_OK ? t->response.Header(options_.quota.header) : std::string_view());
        t->reserved = 0;
      }
      if (auto* observe = g_response_observer.load(std::memory_order_relaxed)) {
        observe(code == CURLE_OK ? static_cast<int>(status) : 0);
      }
      OnAttemptDone(t, code, static_cast<int>(status));
    }
    return any;
  }

  void OnAttemptDone(Transfer* t, CURLcode code, int status) {
    Host* h = t->host;
    const std::string what = t->request.method + " " + t->request.url;
    // Attempts that used none of the retries (503s and 429s with budgets of their own, redirect
    // hops) leave the failures' count alone.
    const int failures = t->attempts - t->free_attempts;
    const bool exhausted = t->probe || failures >= MaxAttempts(t->retry);
    if (code != CURLE_OK) {
      if (t->body_over_cap || code == CURLE_FILESIZE_EXCEEDED) {
        Finish(t, Status::ResourceExhausted(what + ": response body exceeds the cap of " +
                                            std::to_string(t->max_bytes) + " bytes"));
        return;
      }
      if (t->headers_over_cap) {
        Finish(t, Status::ResourceExhausted(what + ": response headers exceed " +
                                            std::to_string(kMaxHeaderBytes) + " bytes"));
        return;
      }
      if (!t->refused.empty()) {
        Finish(t, Status::Invalid(what + ": refused to connect: " + t->refused));
        return;
      }
      counters_.transport_errors.fetch_add(1, std::memory_order_relaxed);
      std::string error = curl_easy_strerror(code);
      if (t->error_buffer[0] != '\0') error += std::string(" (") + t->error_buffer.data() + ")";
      t->last_transport_error = error;
      if (code == CURLE_URL_MALFORMAT || code == CURLE_UNSUPPORTED_PROTOCOL) {
        Finish(t, Status::Invalid(what + ": " + error));
        return;
      }
      NoteFailure(h, error);
      if (!IsRetryableTransport(code) || exhausted) {
        Finish(t,
               Status::Unavailable(what + ": " + error + " (after " + std::to_string(t->attempts) +
                                   " attempt" + (t->attempts == 1 ? "" : "s") + ")"));
      } else if (h->down.load()) {
        FinishDeferred(t);
      } else {
        Retry(t, RetryDelayMs(t->retry, failures, uniform_(rng_)));
      }
      return;
    }

    t->response.status = status;
    const int status_class = status / 100;
    if (status_class >= 1 && status_class <= 5) {
      counters_.by_class[status_class].fetch_add(1, std::memory_order_relaxed);
    }
    const int64_t now_unix_ms = options_.now_unix_ms();
    if (status == 429) {
      counters_.rate_limited.fetch_add(1, std::memory_order_relaxed);
      int64_t wait = RateLimitWaitMs(options_.rate_limit, t->response.ratelimit_reset(),
                                     t->response.retry_after(), now_unix_ms);
      if (const int64_t cap = t->retry.max_throttled_ms; cap > 0) {
        ++t->free_attempts;
        if (t->throttled_ms >= cap) {
          Finish(t, Status::ResourceExhausted(what + ": throttled (HTTP 429) for " +
                                              std::to_string(t->throttled_ms) +
                                              " ms in all; giving up"));
          return;
        }
        wait = std::clamp<int64_t>(wait, 1, cap - t->throttled_ms);
        t->throttled_ms += wait;
        Cooldown(h, wait);
        Enqueue(t, /*front=*/true);  // the host's cooldown holds it back
        return;
      }
      Cooldown(h, wait);
      if (exhausted) {
        Finish(t, std::move(t->response));
      } else {
        Retry(t, 0);  // the host's cooldown holds it back
      }
      return;
    }
    const int64_t max_retry_after = t->retry.max_retry_after_ms >= 0
                                        ? t->retry.max_retry_after_ms
                                        : options_.rate_limit.max_wait_ms;
    if (status == 503 && t->retry.unavailable_retries >= 0) {
      NoteFailure(h, "HTTP 503");
      ++t->free_attempts;
      if (t->probe || t->unavailable >= t->retry.unavailable_retries) {
        Finish(t, std::move(t->response));
      } else if (h->down.load()) {
        FinishDeferred(t);
      } else {
        ++t->unavailable;
        int64_t delay = ParseRetryAfterMs(t->response.retry_after(), now_unix_ms);
        if (delay < 0) delay = RetryDelayMs(t->retry, t->unavailable, uniform_(rng_));
        Retry(t, std::min(delay, max_retry_after));
      }
      return;
    }
    if (IsRetryableStatus(status)) {
      NoteFailure(h, "HTTP " + std::to_string(status));
      if (exhausted) {
        Finish(t, std::move(t->response));
      } else if (h->down.load()) {
        FinishDeferred(t);
      } else {
        int64_t delay = RetryDelayMs(t->retry, failures, uniform_(rng_));
        // A 503 with Retry-After states how long the server needs; honour it up to the cap.
        if (int64_t asked = ParseRetryAfterMs(t->response.retry_after(), now_unix_ms); asked > 0) {
          delay = std::max(delay, std::min(asked, max_retry_after));
        }
        Retry(t, delay);
      }
      return;
    }
    NoteAnswer(h);
    if (IsRedirect(status) && !t->request.credentials.empty() && options_.max_redirects > 0) {
      FollowRedirect(t, what);
      return;
    }
    // A server that announces its quota is used up gets a cooldown now rather than a 429 later.
    if (status_class == 2 && TrimView(t->response.ratelimit_remaining()) == "0") {
      RateLimitPolicy reset_only = options_.rate_limit;
      reset_only.default_wait_ms = 0;
      Cooldown(h, RateLimitWaitMs(reset_only, t->response.ratelimit_reset(), {}, now_unix_ms));
    }
    Finish(t, std::move(t->response));
  }

  // A redirect of a request with credentials (see HttpRequest::credentials): the same transfer
  // goes on at the Location, queued on that URL's host.
  void FollowRedirect(Transfer* t, const std::string& what) {
    const int status = t->response.status;
    const std::string_view location = t->response.Header("location");
    if (location.empty()) {
      Finish(t, std::move(t->response));  // nowhere to go: the 3xx is the answer
      return;
    }
    if (++t->redirects > options_.max_redirects) {
      Finish(t, Status::Invalid(what + ": more than " + std::to_string(options_.max_redirects) +
                                " redirects"));
      return;
    }
    std::string next = ResolveLocation(t->request.url, location);
    Result<std::string> key = HostKey(next);
    if (!key.ok()) {
      Finish(t, Status::Invalid(what + ": redirected to '" + next.substr(0, 200) +
                                "', not an http(s) URL"));
      return;
    }
    ++t->free_attempts;
    HttpRequest& r = t->request;
    r.url = std::move(next);
    if ((status == 303 && r.method != "HEAD") ||
        ((status == 301 || status == 302) && r.method == "POST")) {
      r.method = "GET";
      r.body.clear();
      std::erase_if(r.headers,
                    [](const auto& h) { return EqualsIgnoreCase(h.first, "content-type"); });
    }
    Host* from = t->host;
    t->host = GetOrCreateHost(*key);
    Enqueue(t, /*front=*/true);
    MaybeForget(from);
  }

  void Retry(Transfer* t, int64_t delay_ms) {
    counters_.retries.fetch_add(1, std::memory_order_relaxed);
    if (delay_ms <= 0) {
      Enqueue(t, /*front=*/true);
      return;
    }
    t->host->backing_off.insert(t->id);
    PublishQueued(t->host);
    timers_.push(Timer{Clock::now() + milliseconds(delay_ms), t->id});
  }

  void Cooldown(Host* h, int64_t wait_ms) {
    if (wait_ms <= 0) return;
    const auto until = Clock::now() + milliseconds(wait_ms);
    if (until <= h->cooldown_until) return;
    h->cooldown_until = until;
    h->cooldown_until_ns.store(ToNanos(until));
    timers_.push(Timer{until, 0});
  }

  void NoteFailure(Host* h, const std::string& error) {
    h->last_error = error;
    if (h->consecutive_failures.fetch_add(1) + 1 >= options_.host_failure_threshold) MarkDown(h);
  }

  // Any answer that is not a failure proves the host is alive.
  void NoteAnswer(Host* h) {
    h->consecutive_failures.store(0);
    h->down.store(false);
  }

  void MarkDown(Host* h) {
    if (!h->down.exchange(true)) {
      counters_.hosts_marked_down.fetch_add(1, std::memory_order_relaxed);
    }
    h->down_until = Clock::now() + milliseconds(options_.host_down_ms);
    DeferWaiting(h);
  }

  // Completes every request of `h` that is not running with the deferral error.
  void DeferWaiting(Host* h) {
    std::vector<uint64_t> ids(h->queue.begin(), h->queue.end());
    ids.insert(ids.end(), h->backing_off.begin(), h->backing_off.end());
    h->queue.clear();
    h->backing_off.clear();
    PublishQueued(h);
    for (uint64_t id : ids) {
      if (Transfer* t = Find(id)) FinishDeferred(t);
    }
  }

  void FinishDeferred(Transfer* t) {
    const Host* h = t->host;
    counters_.deferred.fetch_add(1, std::memory_order_relaxed);
    std::string message = "host " + h->key + " failed " +
                          std::to_string(h->consecutive_failures.load()) +
                          " times in a row; deferred";
    if (!h->last_error.empty()) message += " (last error: " + h->last_error + ")";
    Finish(t, Status::Unavailable(std::move(message)));
  }

  // Removes `t` and runs its callback last, when no loop structure refers to it any more.
  void Finish(Transfer* t, Result<HttpResponse> outcome) {
    auto node = transfers_.extract(t->id);
    std::unique_ptr<Transfer> owned = std::move(node.mapped());
    if (outcome.ok()) {
      HttpResponse& r = outcome.value();
      r.attempts = owned->attempts;
      r.elapsed_ms =
          std::chrono::duration_cast<milliseconds>(Clock::now() - owned->submitted).count();
      r.last_transport_error = owned->last_transport_error;
      r.throttled_ms = owned->throttled_ms;
    }
    HttpCallback done = std::move(owned->done);
    Host* h = owned->host;
    owned.reset();
    counters_.live.fetch_sub(1, std::memory_order_relaxed);
    counters_.completed.fetch_add(1, std::memory_order_relaxed);
    MaybeForget(h);
    Deliver(done, std::move(outcome));
  }

  void CancelEverything() {
    std::vector<std::unique_ptr<Transfer>> batch;
    std::vector<Alarm> alarms;
    {
      std::lock_guard lock(pending_mu_);
      accepting_ = false;
      batch.swap(pending_);
      alarms.swap(pending_alarms_);
    }
    cancelling_ = true;
    const Status cancelled = Status::Cancelled("HTTP client shut down");
    for (auto& t : batch) {
      counters_.cancelled.fetch_add(1, std::memory_order_relaxed);
      counters_.completed.fetch_add(1, std::memory_order_relaxed);
      Deliver(t->done, cancelled.WithContext(t->request.method + " " + t->request.url));
    }
    std::vector<uint64_t> ids;
    ids.reserve(transfers_.size());
    for (const auto& [id, t] : transfers_) ids.push_back(id);
    for (uint64_t id : ids) {
      Transfer* t = Find(id);
      if (t == nullptr) continue;
      DetachEasy(t);
      t->host->queue.clear();
      t->host->backing_off.clear();
      t->host->in_ready = false;
      counters_.cancelled.fetch_add(1, std::memory_order_relaxed);
      Finish(t, cancelled.WithContext(t->request.method + " " + t->request.url));
    }
    for (CURL* e : idle_easy_) curl_easy_cleanup(e);
    idle_easy_.clear();
    ready_.clear();
    // Alarms ring early rather than never: their owners wait for them as for a request.
    for (auto& [when, alarm] : alarms_) alarms.push_back(std::move(alarm));
    alarms_.clear();
    for (Alarm& alarm : alarms) Ring(alarm);
  }

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

Result<std::unique_ptr<HttpClient>> HttpClient::Start(HttpClientOptions options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>(std::move(options));
  ATFILL_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<HttpClient>(new HttpClient(std::move(impl)));
}

HttpClient::HttpClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpClient::~HttpClient() {
  if (impl_ && impl_->OnLoopThread()) {
    // Destroyed from its own callback, against the contract: let the loop wind down on its own
    // rather than free what it is still using.
    impl_->RequestStop();
    impl_->Detach();
    static_cast<void>(impl_.release());
    return;
  }
  Shutdown();
}

void HttpClient::Submit(HttpRequest request, HttpCallback done) {
  impl_->Submit(std::move(request), std::move(done));
}

Result<HttpResponse> HttpClient::Fetch(HttpRequest request) {
  if (impl_->OnLoopThread()) {
    return Status::Internal(
        "HttpClient::Fetch called on the client's loop thread (it would wait "
        "for itself); use Submit from callbacks");
  }
  auto promise = std::make_shared<std::promise<Result<HttpResponse>>>();
  std::future<Result<HttpResponse>> future = promise->get_future();
  Submit(std::move(request),
         [promise](Result<HttpResponse> outcome) { promise->set_value(std::move(outcome)); });
  return future.get();
}

void HttpClient::After(int64_t delay_ms, std::function<void()> fn) {
  impl_->After(delay_ms, std::move(fn));
}

void HttpClient::Shutdown() {
  impl_->RequestStop();
  impl_->Join();
}

HttpClientStats HttpClient::stats() const { return impl_->Stats(); }

HostStatus HttpClient::HostState(std::string_view host) const { return impl_->HostState(host); }

const HttpClientOptions& HttpClient::options() const { return impl_->options(); }

void SetResponseObserver(void (*observer)(int status)) {
  g_response_observer.store(observer, std::memory_order_relaxed);
}

}  // namespace atfill::net
