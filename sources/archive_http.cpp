#include "sources/archive_http.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>
#include <utility>

#include "atproto/json.hpp"
#include "atproto/value.hpp"
#include "base/json_writer.hpp"
#include "base/strings.hpp"
#include "net/endpoint.hpp"
#include "net/retry_policy.hpp"
#include "net/xrpc_error.hpp"
#include "sources/jss.hpp"

#include <fcntl.h>
#include <unistd.h>

namespace atfill::sources {
namespace {

using atproto::Value;
using Clock = std::chrono::steady_clock;

constexpr int64_t kDayMs = 86'400'000;
constexpr std::string_view kNsid = "/xrpc/network.bsky.jetstream.";
// listSegments pages read before the listing is declared endless.
constexpr int kMaxListPages = 100'000;

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string LowerCopy(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = Lower(c);
  return out;
}

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (Lower(s[i]) != Lower(prefix[i])) return false;
  }
  return true;
}

// The scheme and authority of an absolute http(s) URL: "http://host:port" lower-cased, the
// default port spelled out, userinfo dropped. Empty when `url` is not an absolute http(s) URL
// with a host.
std::string OriginOf(std::string_view url) {
  std::string scheme;
  if (StartsWithNoCase(url, "http://")) {
    scheme = "http";
  } else if (StartsWithNoCase(url, "https://")) {
    scheme = "https";
  } else {
    return "";
  }
  std::string_view rest = url.substr(scheme.size() + 3);
  std::string_view authority = rest.substr(0, rest.find_first_of("/?#"));
  if (const size_t at = authority.rfind('@'); at != std::string_view::npos) {
    authority.remove_prefix(at + 1);
  }
  std::string_view host = authority;
  std::string_view port;
  const size_t bracket = authority.rfind(']');
  const size_t colon = authority.rfind(':');
  if (colon != std::string_view::npos && (bracket == std::string_view::npos || colon > bracket)) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty()) return "";
  if (port.empty()) port = scheme == "http" ? "80" : "443";
  return scheme + "://" + LowerCopy(host) + ":" + std::string(port);
}

// `location` (a redirect's Location) resolved against `url`.
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
  path = path.substr(0, path.find_first_of("?#"));
  return root + path.substr(0, path.rfind('/') + 1) + std::string(location);
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

uint64_t LoadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// "HTTP 503 (ServiceUnavailable: not ready)" for messages; the server's words are cut short.
std::string DescribeAnswer(const net::HttpResponse& r) {
  std::string out = "HTTP " + std::to_string(r.status);
  const net::XrpcError e = net::ParseXrpcError(r);
  if (!e.error.empty()) {
    out += " (" + QuoteForMessage(e.error, 64);
    if (!e.message.empty()) out += ": " + QuoteForMessage(e.message, 200);
    out += ")";
  }
  return out;
}

// --- JSON fields ---

class Fields {
 public:
  Fields(const Value& object, std::string where) : object_(object), where_(std::move(where)) {}

  Status Missing(std::string_view name, std::string_view what) const {
    return Status::Invalid(where_ + ": field \"" + std::string(name) + "\" is missing or not " +
                           std::string(what));
  }
  // Absent or null fields take `fallback` when given, else are an error.
  Result<uint64_t> Uint(std::string_view name, std::optional<uint64_t> fallback = {}) const {
    const Value* v = object_.Find(name);
    if ((v == nullptr || v->is_null()) && fallback) return *fallback;
    if (v == nullptr || v->kind() != Value::Kind::kInt || v->as_int() < 0) {
      return Missing(name, "a non-negative integer");
    }
    return static_cast<uint64_t>(v->as_int());
  }
  Result<int64_t> Int(std::string_view name, std::optional<int64_t> fallback = {}) const {
    const Value* v = object_.Find(name);
    if ((v == nullptr || v->is_null()) && fallback) return *fallback;
    if (v == nullptr || v->kind() != Value::Kind::kInt) return Missing(name, "an integer");
    return v->as_int();
  }
  Result<std::string> String(std::string_view name,
                             std::optional<std::string> fallback = {}) const {
    const Value* v = object_.Find(name);
    if ((v == nullptr || v->is_null()) && fallback) return *fallback;
    if (v == nullptr || v->kind() != Value::Kind::kString) return Missing(name, "a string");
    return v->as_string();
  }
  // Absent or null = empty.
  Result<const Value::Array*> Array(std::string_view name) const {
    static const Value::Array kEmpty;
    const Value* v = object_.Find(name);
    if (v == nullptr || v->is_null()) return &kEmpty;
    if (v->kind() != Value::Kind::kArray) return Missing(name, "an array");
    return &v->as_array();
  }

 private:
  const Value& object_;
  std::string where_;
};

Result<Value> ParseObject(const std::string& body, const std::string& where) {
  auto v = atproto::JsonObjectToValue(body);
  if (!v.ok()) {
    return Status::Invalid(where + ": the answer is not a JSON object: " + v.status().message());
  }
  return v;
}

Result<std::string> SegmentNameField(const Fields& f, const std::string& where) {
  ATFILL_ASSIGN_OR_RETURN(std::string name, f.String("name"));
  if (!jss::ParseSegmentName(name).ok()) {
    return Status::Invalid(where + ": " + QuoteForMessage(name) + " is not a segment name");
  }
  return name;
}

// Parses "bytes a-b/total".
bool ParseContentRange(std::string_view text, uint64_t* first, uint64_t* last, uint64_t* total) {
  if (!StartsWithNoCase(text, "bytes ")) return false;
  text.remove_prefix(6);
  const auto number = [&](char stop, uint64_t* out) {
    const size_t end = stop == 0 ? text.size() : text.find(stop);
    if (end == std::string_view::npos || end == 0) return false;
    const auto [p, ec] = std::from_chars(text.data(), text.data() + end, *out);
    if (ec != std::errc() || p != text.data() + end) return false;
    text.remove_prefix(stop == 0 ? end : end + 1);
    return true;
  };
  return number('-', first) && number('/', last) && number(0, total) && *first <= *last &&
         *last < *total;
}

}  // namespace

// --- quota ---

struct HttpArchive::Quota {
  std::mutex mu;
  double rate = 0;    // bytes per second; 0 = none advertised
  double tokens = 0;  // <= 0: the debt, in bytes
  double average = 0;
  Clock::time_point last = Clock::now();

  void Refill(Clock::time_point now) {
    const double dt = std::chrono::duration<double>(now - last).count();
    last = now;
    if (rate > 0) tokens = std::min(0.0, tokens + rate * dt);
  }
  // 0 when a request may start now (`*reserved` bytes are then held for it), else the wait in
  // milliseconds before asking again.
  int64_t Acquire(double* reserved) {
    std::lock_guard lock(mu);
    Refill(Clock::now());
    *reserved = 0;
    if (rate <= 0) return 0;
    if (tokens < 0)
      return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(-tokens / rate * 1e3)));
    *reserved = average;
    tokens -= average;
    return 0;
  }
  void Settle(double reserved, uint64_t bytes, std::string_view advertised) {
    std::lock_guard lock(mu);
    Refill(Clock::now());
    while (!advertised.empty() && advertised.front() == ' ') advertised.remove_prefix(1);
    while (!advertised.empty() && (advertised.back() == ' ' || advertised.back() == '\r')) {
      advertised.remove_suffix(1);
    }
    uint64_t value = 0;
    const auto [end, ec] =
        std::from_chars(advertised.data(), advertised.data() + advertised.size(), value);
    const bool valid =
        !advertised.empty() && ec == std::errc() && end == advertised.data() + advertised.size();
    if (valid && static_cast<double>(value) != rate) {
      if (rate <= 0 || value == 0) {
        tokens = 0;
        reserved = 0;
      }
      rate = static_cast<double>(value);
    }
    if (rate > 0) tokens -= static_cast<double>(bytes) - reserved;
    const double b = static_cast<double>(bytes);
    average = average == 0 ? b : 0.8 * average + 0.2 * b;
  }
};

namespace {

std::shared_ptr<HttpArchive::Quota> QuotaFor(const std::string& origin, const std::string& key) {
  // Never destroyed: archives may be torn down during static destruction.
  static auto* mu = new std::mutex;
  static auto* registry = new std::map<std::string, std::shared_ptr<HttpArchive::Quota>>;
  std::lock_guard lock(*mu);
  auto& slot = (*registry)[origin + '\n' + key];
  if (!slot) slot = std::make_shared<HttpArchive::Quota>();
  return slot;
}

}  // namespace

// --- options ---

Status HttpArchiveOptions::Validate() const {
  if (OriginOf(base_url).empty()) {
    return Status::Invalid("archive URL " + QuoteForMessage(base_url, 200) +
                           " is not an http:// or https:// URL with a host");
  }
  for (const char c : key) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x21 || u == 0x7F) {
      return Status::Invalid("the archive key holds a space or a control character");
    }
  }
  const auto positive = [](std::string_view name, int64_t v) {
    return v >= 1 && v <= kDayMs
               ? Status::OK()
               : Status::Invalid(std::string(name) + " must be 1.." + std::to_string(kDayMs) +
                                 " ms, not " + std::to_string(v));
  };
  ATFILL_RETURN_IF_ERROR(positive("connect_timeout_ms", connect_timeout_ms));
  ATFILL_RETURN_IF_ERROR(positive("request_timeout_ms", request_timeout_ms));
  if (max_connections < 1 || max_connections > 1000) {
    return Status::Invalid("max_connections must be 1..1000");
  }
  if (max_frame_bytes < 1 || max_frame_bytes > (uint64_t{1} << 40) || max_json_bytes < 1 ||
      max_json_bytes > (uint64_t{1} << 40)) {
    return Status::Invalid("max_frame_bytes and max_json_bytes must be 1 byte..1 TiB");
  }
  if (retry_delays_ms.size() > 100) return Status::Invalid("at most 100 retry delays");
  for (const int64_t d : retry_delays_ms) {
    if (d < 0 || d > kDayMs) return Status::Invalid("retry delays must be 0..86400000 ms");
  }
  if (unavailable_retries > 100) return Status::Invalid("unavailable_retries must be 0..100");
  if (max_retry_after_ms < 0 || throttle_default_wait_ms < 0 || max_throttled_ms < 0) {
    return Status::Invalid(
        "max_retry_after_ms, throttle_default_wait_ms and max_throttled_ms must not be negative");
  }
  if (spool_chunk_bytes < 1 || max_spool_segment_bytes < 1) {
    return Status::Invalid("spool_chunk_bytes and max_spool_segment_bytes must be positive");
  }
  if (index_fetch_concurrency < 1 || index_fetch_concurrency > 64) {
    return Status::Invalid("index_fetch_concurrency must be 1..64");
  }
  if (index_cache_segments < 1) return Status::Invalid("index_cache_segments must be at least 1");
  if (max_redirects < 0 || max_redirects > 20)
    return Status::Invalid("max_redirects must be 0..20");
  return Status::OK();
}

// --- the archive ---

struct HttpArchive::Call {
  std::string method = "GET";
  std::string url;
  std::string body;
  net::HttpHeaders headers;
  bool auth = false;  // send the key (to the archive's origin only)
  uint64_t max_bytes = 0;
};

struct HttpArchive::BlockIndex {
  std::string checksum;  // of the file the index was read from
  jss::Header header;
  uint64_t file_size = 0;
  std::vector<jss::BlockInfo> blocks;
};

// One segment being downloaded into a .part file, read back block by block as it arrives.
struct HttpArchive::Spool {
  std::string name, checksum, path;
  uint64_t size = 0;  // through the end of the last block
  int fd = -1;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t have = 0;  // bytes [0, have) are in the file
  bool done = false;  // the download ended (complete when have == size)
  bool stop = false;
  Status failed;
  std::thread thread;

  ~Spool() {
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
    if (fd >= 0) ::close(fd);
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

namespace {

Status PwriteAll(int fd, const char* data, size_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, data, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::IoError("writing " + path + ": " + std::strerror(errno));
    }
    data += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return Status::OK();
}

Status PreadAll(int fd, char* data, size_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, data, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return Status::IoError("reading " + path + ": " +
                             (r < 0 ? std::strerror(errno) : "unexpected end of file"));
    }
    data += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return Status::OK();
}

}  // namespace

HttpArchive::HttpArchive(HttpArchiveOptions options) : options_(std::move(options)) {}

HttpArchive::~HttpArchive() { Cancel(); }

Result<std::unique_ptr<HttpArchive>> HttpArchive::Open(HttpArchiveOptions options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<HttpArchive> a(new HttpArchive(std::move(options)));
  const HttpArchiveOptions& o = a->options_;
  std::string_view base = o.base_url;
  while (!base.empty() && base.back() == '/') base.remove_suffix(1);
  a->base_ = std::string(base);
  a->origin_ = OriginOf(a->base_);
  a->quota_ = QuotaFor(a->origin_, o.key);

  net::HttpClientOptions h;
  h.user_agent = o.user_agent;
  h.max_in_flight = o.max_connections;
  h.max_per_host = o.max_connections;
  h.connect_timeout_ms = o.connect_timeout_ms;
  h.timeout_ms = o.request_timeout_ms;
  h.max_response_bytes = std::max(o.max_frame_bytes, o.max_json_bytes);
  h.max_redirects = 0;  // followed here, so the key never leaves the archive's origin
  h.retry.max_attempts = 1;
  h.retry.base_backoff_ms = 0;
  h.retry.max_backoff_ms = 0;
  h.rate_limit.default_wait_ms = o.throttle_default_wait_ms;
  h.rate_limit.max_wait_ms = std::max(o.max_throttled_ms, o.throttle_default_wait_ms);
  // Retries are counted here; the client's circuit breaker would cut them short.
  h.host_failure_threshold = 1000;
  h.allow_private_addresses = o.allow_private_addresses;
  ATFILL_ASSIGN_OR_RETURN(a->http_, net::HttpClient::Start(std::move(h)));
  return a;
}

std::string HttpArchive::Describe() const { return "archive " + base_; }

void HttpArchive::Cancel() {
  {
    std::lock_guard lock(mu_);
    cancelled_ = true;
  }
  cv_.notify_all();
  if (http_) http_->Shutdown();
}

HttpArchiveStats HttpArchive::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

bool HttpArchive::Wait(int64_t ms) {
  std::unique_lock lock(mu_);
  return !cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(ms, 0)),
                       [this] { return cancelled_; });
}

Result<net::HttpResponse> HttpArchive::Execute(Call call) {
  size_t server_retries = 0;
  uint32_t unavailable_retries = 0;
  int redirects = 0;
  int64_t throttled_ms = 0;
  const auto cancelled = [&] {
    return Status::Cancelled("archive " + call.method + " " + call.url + ": cancelled");
  };
  // A retry after a 5xx or no answer; false when they are used up or the wait was cancelled.
  const auto retry_server = [&]() -> bool {
    if (server_retries >= options_.retry_delays_ms.size()) return false;
    const int64_t delay = options_.retry_delays_ms[server_retries++];
    {
      std::lock_guard lock(mu_);
      ++stats_.retries;
    }
    return Wait(delay);
  };
  while (true) {
    {
      std::lock_guard lock(mu_);
      if (cancelled_) return cancelled();
    }
    const std::string where = "archive " + call.method + " " + call.url;
    double reserved = 0;
    while (true) {
      const int64_t wait = quota_->Acquire(&reserved);
      if (wait <= 0) break;
      {
        std::lock_guard lock(mu_);
        stats_.paced_ms += wait;
      }
      if (!Wait(wait)) return cancelled();
    }
    net::HttpRequest request;
    request.method = call.method;
    request.url = call.url;
    request.headers = call.headers;
    request.body = call.body;
    request.max_response_bytes = call.max_bytes;
    if (call.auth && !options_.key.empty() && OriginOf(call.url) == origin_) {
      request.headers.emplace_back("Authorization", "Bearer " + options_.key);
    }
    Result<net::HttpResponse> r = http_->Fetch(std::move(request));
    quota_->Settle(reserved, r.ok() ? r->body.size() : 0,
                   r.ok() ? r->Header(kArchiveQuotaHeader) : std::string_view());
    {
      std::lock_guard lock(mu_);
      ++stats_.requests;
      if (r.ok()) stats_.bytes += r->body.size();
    }
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kUnavailable) {
        if (retry_server()) continue;
        {
          std::lock_guard lock(mu_);
          if (cancelled_) return cancelled();
        }
        return Status::Unavailable(where + ": no answer after " +
                                   std::to_string(server_retries + 1) +
                                   " attempts: " + r.status().message());
      }
      if (r.status().code() == StatusCode::kCancelled) return cancelled();
      return r.status().WithContext("archive");
    }
    net::HttpResponse& resp = *r;
    const int st = resp.status;
    if ((st >= 200 && st < 300) || st == 304) return r;
    if (st == 301 || st == 302 || st == 303 || st == 307 || st == 308) {
      const std::string_view location = resp.Header("location");
      if (location.empty()) {
        return Status::Invalid(where + ": HTTP " + std::to_string(st) + " without a Location");
      }
      if (++redirects > options_.max_redirects) {
        return Status::Invalid(where + ": more than " + std::to_string(options_.max_redirects) +
                               " redirects");
      }
      const std::string next = ResolveLocation(call.url, location);
      if (OriginOf(next).empty()) {
        return Status::Invalid(where + ": redirected to " + QuoteForMessage(next, 200) +
                               ", not an http(s) URL");
      }
      call.url = next;
      if (st == 303 || ((st == 301 || st == 302) && call.method == "POST")) {
        call.method = "GET";
        call.body.clear();
        std::erase_if(call.headers,
                      [](const auto& h) { return LowerCopy(h.first) == "content-type"; });
      }
      continue;
    }
    if (st == 429) {
      {
        std::lock_guard lock(mu_);
        ++stats_.throttled;
      }
      if (throttled_ms >= options_.max_throttled_ms) {
        return Status::ResourceExhausted(where + ": throttled (HTTP 429) for " +
                                         std::to_string(throttled_ms) + " ms in all; giving up");
      }
      net::RateLimitPolicy policy;
      policy.default_wait_ms = options_.throttle_default_wait_ms;
      policy.max_wait_ms = std::max(options_.max_throttled_ms, policy.default_wait_ms);
      int64_t wait =
          net::RateLimitWaitMs(policy, resp.ratelimit_reset(), resp.retry_after(), NowUnixMs());
      wait = std::clamp<int64_t>(wait, 1, options_.max_throttled_ms - throttled_ms);
      throttled_ms += wait;
      if (!Wait(wait)) return cancelled();
      continue;
    }
    if (st == 503) {
      if (unavailable_retries < options_.unavailable_retries) {
        int64_t wait = net::ParseRetryAfterMs(resp.retry_after(), NowUnixMs());
        if (wait < 0) {
          const auto& d = options_.retry_delays_ms;
          wait = d.empty() ? 0 : d[std::min<size_t>(unavailable_retries, d.size() - 1)];
        }
        ++unavailable_retries;
        {
          std::lock_guard lock(mu_);
          ++stats_.retries;
        }
        if (!Wait(std::min(wait, options_.max_retry_after_ms))) return cancelled();
        continue;
      }
      return Status::Unavailable(where + ": " + DescribeAnswer(resp) + " after " +
                                 std::to_string(unavailable_retries) + " retries");
    }
    if (st == 501 || st == 405) {
      return Status::Unsupported(where + ": " + DescribeAnswer(resp) +
                                 ": the host does not serve this archive method");
    }
    if (st >= 500 || st == 408) {
      if (retry_server()) continue;
      {
        std::lock_guard lock(mu_);
        if (cancelled_) return cancelled();
      }
      return Status::Unavailable(where + ": " + DescribeAnswer(resp) + " after " +
                                 std::to_string(server_retries) + " retries");
    }
    if (st == 401 || st == 403) {
      const std::string answer = DescribeAnswer(resp);
      if (options_.key.empty()) {
        return Status::Invalid(where + ": " + answer +
                               ": the archive asks for a key and none is configured");
      }
      return Status::Invalid(where + ": " + answer + ": the archive refused the key");
    }
    if (st == 404) return Status::NotFound(where + ": " + DescribeAnswer(resp));
    return Status::Invalid(where + ": " + DescribeAnswer(resp));
  }
}

Result<std::vector<SegmentInfo>> HttpArchive::ListSegments() {
  std::vector<SegmentInfo> out;
  std::string cursor;
  for (int page = 0; page < kMaxListPages; ++page) {
    Call call;
    call.url = base_ + std::string(kNsid) + "listSegments?limit=1000";
    if (!cursor.empty()) {
      call.url += "&cursor=";
      net::AppendPercentEncoded(cursor, &call.url);
    }
    call.max_bytes = options_.max_json_bytes;
    const std::string where = "archive listSegments " + call.url;
    ATFILL_ASSIGN_OR_RETURN(net::HttpResponse r, Execute(call));
    if (r.status != 200) {
      return Status::Invalid(where + ": unexpected HTTP " + std::to_string(r.status));
    }
    ATFILL_ASSIGN_OR_RETURN(Value root, ParseObject(r.body, where));
    const Fields f(root, where);
    ATFILL_ASSIGN_OR_RETURN(const Value::Array* segments, f.Array("segments"));
    for (size_t i = 0; i < segments->size(); ++i) {
      const std::string at = where + ": segments[" + std::to_string(i) + "]";
      const Value& s = (*segments)[i];
      if (s.kind() != Value::Kind::kMap) return Status::Invalid(at + " is not an object");
      const Fields g(s, at);
      SegmentInfo info;
      ATFILL_ASSIGN_OR_RETURN(info.name, SegmentNameField(g, at));
      ATFILL_ASSIGN_OR_RETURN(info.index, g.Uint("index"));
      ATFILL_ASSIGN_OR_RETURN(info.min_seq, g.Uint("minSeq"));
      ATFILL_ASSIGN_OR_RETURN(info.max_seq, g.Uint("maxSeq"));
      ATFILL_ASSIGN_OR_RETURN(info.min_witnessed_at, g.Int("minWitnessedAt", 0));
      ATFILL_ASSIGN_OR_RETURN(info.max_witnessed_at, g.Int("maxWitnessedAt", 0));
      ATFILL_ASSIGN_OR_RETURN(info.event_count, g.Uint("eventCount", 0));
      ATFILL_ASSIGN_OR_RETURN(info.size_bytes, g.Uint("sizeBytes", 0));
      ATFILL_ASSIGN_OR_RETURN(info.checksum, g.String("checksum", ""));
      if (!out.empty() && info.index <= out.back().index) {
        return Status::Invalid(at + ": segment " + info.name + " is out of order");
      }
      out.push_back(std::move(info));
    }
    ATFILL_ASSIGN_OR_RETURN(std::string next, f.String("cursor", ""));
    if (next.empty()) return out;
    if (next == cursor) {
      return Status::Invalid(where + ": the listing cursor did not advance");
    }
    cursor = std::move(next);
  }
  return Status::Invalid("archive " + base_ + ": listSegments did not end after " +
                         std::to_string(kMaxListPages) + " pages");
}

namespace {

// Reads `count` 52-byte block index entries.
Result<std::vector<jss::BlockInfo>> ParseBlockIndex(std::string_view bytes, uint32_t count,
                                                    const std::string& where) {
  if (bytes.size() != uint64_t{count} * jss::kBlockIndexEntrySize) {
    return Status::Corrupt(where + ": block index of " + std::to_string(bytes.size()) +
                           " bytes for " + std::to_string(count) + " blocks");
  }
  std::vector<jss::BlockInfo> out(count);
  for (uint32_t i = 0; i < count; ++i) {
    const char* p = bytes.data() + size_t{i} * jss::kBlockIndexEntrySize;
    jss::BlockInfo& b = out[i];
    b.offset = LoadU64(p);
    b.compressed_size = LoadU32(p + 8);
    b.uncompressed_size = LoadU32(p + 12);
    b.event_count = LoadU32(p + 16);
    b.min_seq = LoadU64(p + 20);
    b.max_seq = LoadU64(p + 28);
    b.min_witnessed_at = static_cast<int64_t>(LoadU64(p + 36));
    b.max_witnessed_at = static_cast<int64_t>(LoadU64(p + 44));
  }
  return out;
}

}  // namespace

Result<std::shared_ptr<const HttpArchive::BlockIndex>> HttpArchive::FetchIndex(
    const std::string& name, const std::string& checksum) {
  // One ranged getSegment read, pinned to `etag` (empty = unpinned). `whole` is set when the
  // server sent the whole file instead (no range support, or the file changed).
  struct Read {
    std::string body;
    uint64_t file_size = 0;
    bool whole = false;
  };
  const auto read = [&](const std::string& etag, uint64_t offset, uint64_t length) -> Result<Read> {
    Call call;
    call.url = base_ + std::string(kNsid) + "getSegment?name=";
    net::AppendPercentEncoded(name, &call.url);
    call.auth = true;
    call.max_bytes = options_.max_json_bytes;
    call.headers.emplace_back(
        "Range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + length - 1));
    if (!etag.empty()) call.headers.emplace_back("If-Range", "\"" + etag + "\"");
    const std::string where = "archive getSegment " + call.url;
    ATFILL_ASSIGN_OR_RETURN(net::HttpResponse r, Execute(call));
    Read out;
    if (r.status == 200) {
      out.file_size = r.body.size();
      out.body = std::move(r.body);
      out.whole = true;
      return out;
    }
    if (r.status != 206) {
      return Status::Invalid(where + ": unexpected HTTP " + std::to_string(r.status));
    }
    uint64_t first = 0, last = 0;
    if (!ParseContentRange(r.content_range(), &first, &last, &out.file_size) || first != offset ||
        last - first + 1 != r.body.size() || r.body.size() != length) {
      return Status::Invalid(where + ": bad Content-Range " +
                             QuoteForMessage(r.content_range(), 100) + " for bytes " +
                             std::to_string(offset) + "+" + std::to_string(length) + " (" +
                             std::to_string(r.body.size()) + " bytes received)");
    }
    out.body = std::move(r.body);
    return out;
  };
  const std::string where = "archive " + base_ + " segment " + name;
  auto index = std::make_shared<BlockIndex>();
  // Header and index from the whole file.
  const auto from_file = [&](const std::string& file) -> Result<std::shared_ptr<const BlockIndex>> {
    auto header = jss::ParseHeader(AsBytes(file), file.size());
    if (!header.ok()) return header.status().WithContext(where);
    index->header = *header;
    index->file_size = file.size();
    index->checksum = Hex16(header->checksum);
    const jss::Header& h = index->header;
    ATFILL_ASSIGN_OR_RETURN(
        index->blocks, ParseBlockIndex(std::string_view(file).substr(
                                           h.block_index_offset,
                                           uint64_t{h.block_count} * jss::kBlockIndexEntrySize),
                                       h.block_count, where));
    return std::shared_ptr<const BlockIndex>(std::move(index));
  };
  ATFILL_ASSIGN_OR_RETURN(Read head, read(checksum, 0, jss::kHeaderSize));
  if (head.whole) return from_file(head.body);
  auto header = jss::ParseHeader(AsBytes(head.body), head.file_size);
  if (!header.ok()) return header.status().WithContext(where);
  index->header = *header;
  index->file_size = head.file_size;
  index->checksum = Hex16(header->checksum);
  const jss::Header& h = index->header;
  const uint64_t index_bytes = uint64_t{h.block_count} * jss::kBlockIndexEntrySize;
  if (h.block_index_offset + index_bytes > h.did_bloom_offset) {
    return Status::Corrupt(where + ": the block index of " + std::to_string(h.block_count) +
                           " blocks runs past the DID bloom at " +
                           std::to_string(h.did_bloom_offset));
  }
  if (index_bytes > options_.max_json_bytes) {
    return Status::OutOfRange(where + ": the block index of " + std::to_string(h.block_count) +
                              " blocks is over max_json_bytes");
  }
  if (h.block_count > 0) {
    ATFILL_ASSIGN_OR_RETURN(Read bytes, read(index->checksum, h.block_index_offset, index_bytes));
    if (bytes.whole) return from_file(bytes.body);
    ATFILL_ASSIGN_OR_RETURN(index->blocks, ParseBlockIndex(bytes.body, h.block_count, where));
  }
  return std::shared_ptr<const BlockIndex>(std::move(index));
}

Result<std::shared_ptr<const HttpArchive::BlockIndex>> HttpArchive::Index(
    const std::string& name, const std::string& checksum) {
  {
    std::lock_guard lock(mu_);
    auto it = indexes_.find(name);
    if (it != indexes_.end() && (checksum.empty() || it->second.first->checksum == checksum)) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return it->second.first;
    }
  }
  ATFILL_ASSIGN_OR_RETURN(std::shared_ptr<const BlockIndex> index, FetchIndex(name, checksum));
  std::lock_guard lock(mu_);
  ++stats_.index_fetches;
  auto it = indexes_.find(name);
  if (it != indexes_.end()) {
    lru_.erase(it->second.second);
    indexes_.erase(it);
  }
  lru_.push_front(name);
  indexes_.emplace(name, std::make_pair(index, lru_.begin()));
  while (indexes_.size() > options_.index_cache_segments) {
    indexes_.erase(lru_.back());
    lru_.pop_back();
  }
  return index;
}

Result<Plan> HttpArchive::PlanSnapshot(const PlanRequest& request) {
  JsonWriter w;
  w.BeginObject();
  const bool nothing = !request.commits && !request.markers;
  if (!request.commits || !request.markers) {
    w.Key("kinds").BeginArray();
    if (request.commits || nothing) w.String("commit");
    if (request.markers) w.String("account").String("identity").String("sync");
    w.EndArray();
  }
  if (!request.dids.empty()) {
    w.Key("dids").BeginArray();
    for (const std::string& d : request.dids) w.String(d);
    w.EndArray();
  }
  if (request.commits && !request.collections.empty()) {
    w.Key("collections").BeginArray();
    for (const std::string& c : request.collections) w.String(c);
    w.EndArray();
  }
  w.Key("afterSeq").Uint(request.after_seq);
  if (request.before_seq != 0) w.Key("beforeSeq").Uint(request.before_seq);
  w.EndObject();

  Call call;
  call.method = "POST";
  call.url = base_ + std::string(kNsid) + "planSnapshot";
  call.body = w.Take();
  call.headers.emplace_back("Content-Type", "application/json");
  call.auth = true;
  call.max_bytes = options_.max_json_bytes;
  const std::string where = "archive planSnapshot " + call.url;
  ATFILL_ASSIGN_OR_RETURN(net::HttpResponse r, Execute(call));
  if (r.status != 200) {
    return Status::Invalid(where + ": unexpected HTTP " + std::to_string(r.status));
  }
  ATFILL_ASSIGN_OR_RETURN(Value root, ParseObject(r.body, where));
  const Fields f(root, where);
  Plan plan;
  ATFILL_ASSIGN_OR_RETURN(plan.sealed_tip, f.Uint("sealedTipSeq"));
  ATFILL_ASSIGN_OR_RETURN(plan.planned_through, f.Uint("plannedThroughSeq", plan.sealed_tip));
  ATFILL_ASSIGN_OR_RETURN(const Value::Array* segments, f.Array("segments"));

  // The plan's entries, then their block indexes (fetched a few at a time).
  struct Entry {
    std::string name, checksum;
    bool whole = false;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
  };
  std::vector<Entry> entries;
  for (size_t i = 0; i < (nothing ? 0 : segments->size()); ++i) {
    const std::string at = where + ": segments[" + std::to_string(i) + "]";
    const Value& s = (*segments)[i];
    if (s.kind() != Value::Kind::kMap) return Status::Invalid(at + " is not an object");
    const Fields g(s, at);
    Entry e;
    ATFILL_ASSIGN_OR_RETURN(e.name, SegmentNameField(g, at));
    ATFILL_ASSIGN_OR_RETURN(e.checksum, g.String("checksum", ""));
    ATFILL_ASSIGN_OR_RETURN(std::string mode, g.String("mode"));
    if (mode == "segment") {
      e.whole = true;
    } else if (mode == "blocks") {
      ATFILL_ASSIGN_OR_RETURN(const Value::Array* blocks, g.Array("blocks"));
      for (size_t j = 0; j < blocks->size(); ++j) {
        const std::string bat = at + ".blocks[" + std::to_string(j) + "]";
        const Value& range = (*blocks)[j];
        if (range.kind() != Value::Kind::kMap) return Status::Invalid(bat + " is not an object");
        const Fields rf(range, bat);
        ATFILL_ASSIGN_OR_RETURN(uint64_t first, rf.Uint("first"));
        ATFILL_ASSIGN_OR_RETURN(uint64_t last, rf.Uint("last"));
        if (first > last || (!e.ranges.empty() && first <= e.ranges.back().second)) {
          return Status::Invalid(bat + ": range " + std::to_string(first) + ".." +
                                 std::to_string(last) + " is empty or out of order");
        }
        e.ranges.emplace_back(first, last);
      }
    } else {
      return Status::Invalid(at + ": unknown mode " + QuoteForMessage(mode));
    }
    entries.push_back(std::move(e));
  }

  std::vector<std::shared_ptr<const BlockIndex>> indexes(entries.size());
  std::vector<Status> errors(entries.size());
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i = next++; i < entries.size(); i = next++) {
      auto index = Index(entries[i].name, entries[i].checksum);
      if (index.ok()) {
        indexes[i] = std::move(*index);
      } else {
        errors[i] = index.status();
      }
    }
  };
  const size_t workers =
      std::min<size_t>(static_cast<size_t>(options_.index_fetch_concurrency), entries.size());
  if (workers <= 1) {
    work();
  } else {
    std::vector<std::thread> threads;
    for (size_t t = 0; t < workers; ++t) threads.emplace_back(work);
    for (std::thread& t : threads) t.join();
  }
  for (const Status& s : errors) ATFILL_RETURN_IF_ERROR(s);

  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    const BlockIndex& index = *indexes[i];
    const jss::Header& h = index.header;
    PlannedSegment p;
    SegmentInfo& info = p.segment;
    info.name = e.name;
    info.index = *jss::ParseSegmentName(e.name);
    info.min_seq = h.min_seq;
    info.max_seq = h.max_seq;
    info.min_witnessed_at = h.min_witnessed_at;
    info.max_witnessed_at = h.max_witnessed_at;
    info.event_count = h.event_count;
    info.size_bytes = index.file_size;
    info.checksum = index.checksum;
    const auto add = [&](uint32_t b) {
      const jss::BlockInfo& bi = index.blocks[b];
      p.blocks.push_back({b, bi.min_seq, bi.max_seq, bi.uncompressed_size});
    };
    if (e.whole) {
      for (uint32_t b = 0; b < index.blocks.size(); ++b) {
        const jss::BlockInfo& bi = index.blocks[b];
        if (bi.event_count == 0 || bi.max_seq <= request.after_seq) continue;
        if (request.before_seq != 0 && bi.min_seq > request.before_seq) continue;
        add(b);
      }
      if (!p.blocks.empty() && !options_.spool_dir.empty() &&
          index.file_size <= options_.max_spool_segment_bytes) {
        std::lock_guard lock(mu_);
        whole_[e.name] = p.blocks.front().index;
      }
    } else {
      for (const auto& [first, last] : e.ranges) {
        if (last >= index.blocks.size()) {
          return Status::Invalid(where + ": the plan names block " + std::to_string(last) + " of " +
                                 e.name + ", which has " + std::to_string(index.blocks.size()) +
                                 " blocks");
        }
        for (uint64_t b = first; b <= last; ++b) add(static_cast<uint32_t>(b));
      }
    }
    if (!p.blocks.empty()) plan.segments.push_back(std::move(p));
  }
  return plan;
}

void HttpArchive::Download(Spool* spool) {
  Status failed = Status::OK();
  while (true) {
    uint64_t offset = 0;
    {
      std::lock_guard lock(spool->mu);
      if (spool->stop) break;
      offset = spool->have;
    }
    if (offset >= spool->size) break;
    const uint64_t length = std::min(options_.spool_chunk_bytes, spool->size - offset);
    Call call;
    call.url = base_ + std::string(kNsid) + "getSegment?name=";
    net::AppendPercentEncoded(spool->name, &call.url);
    call.auth = true;
    call.max_bytes = options_.max_spool_segment_bytes;
    call.headers.emplace_back(
        "Range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + length - 1));
    call.headers.emplace_back("If-Range", "\"" + spool->checksum + "\"");
    const std::string where = "archive getSegment " + call.url;
    Result<net::HttpResponse> r = Execute(call);
    if (!r.ok()) {
      failed = r.status();
      break;
    }
    uint64_t first = 0, last = 0, total = 0;
    if (r->status == 200) {
      // The whole file (the segment changed since the plan, or no range support): its block
      // offsets may differ from the index read, so the spool is given up.
      failed = Status::Unavailable(where +
                                   ": the archive sent the whole segment (HTTP 200) for a "
                                   "ranged read pinned to checksum " +
                                   spool->checksum);
      break;
    }
    if (r->status != 206 || !ParseContentRange(r->content_range(), &first, &last, &total) ||
        first != offset || r->body.size() != length || last - first + 1 != length) {
      failed = Status::Invalid(where + ": bad ranged answer (HTTP " + std::to_string(r->status) +
                               ", Content-Range " + QuoteForMessage(r->content_range(), 100) +
                               ", " + std::to_string(r->body.size()) + " bytes for " +
                               std::to_string(offset) + "+" + std::to_string(length) + ")");
      break;
    }
    if (Status w = PwriteAll(spool->fd, r->body.data(), r->body.size(), offset, spool->path);
        !w.ok()) {
      failed = w;
      break;
    }
    {
      std::lock_guard lock(spool->mu);
      spool->have = offset + length;
    }
    spool->cv.notify_all();
  }
  if (!failed.ok()) {
    std::lock_guard lock(mu_);
    ++stats_.spool_failures;
  }
  {
    std::lock_guard lock(spool->mu);
    spool->done = true;
    spool->failed = failed;
  }
  spool->cv.notify_all();
}

Result<std::optional<std::string>> HttpArchive::SpooledBlock(const SegmentInfo& segment,
                                                             uint32_t block) {
  if (options_.spool_dir.empty() || segment.checksum.empty()) return std::optional<std::string>();
  const std::string path = (std::filesystem::path(options_.spool_dir) /
                            (segment.name + "." + segment.checksum + ".part"))
                               .string();
  std::shared_ptr<Spool> spool;
  std::shared_ptr<Spool> old;  // destroyed (its thread joined) outside the lock
  {
    std::lock_guard lock(mu_);
    if (spool_ != nullptr && spool_->name == segment.name && spool_->checksum == segment.checksum) {
      spool = spool_;
    } else {
      auto it = whole_.find(segment.name);
      std::error_code ec;
      const bool resumable = std::filesystem::exists(path, ec);
      if (it == whole_.end() || (it->second != block && !resumable)) {
        return std::optional<std::string>();
      }
      old = std::move(spool_);
    }
  }
  old.reset();
  ATFILL_ASSIGN_OR_RETURN(std::shared_ptr<const BlockIndex> index,
                          Index(segment.name, segment.checksum));
  if (block >= index->blocks.size()) return std::optional<std::string>();
  if (spool == nullptr) {
    auto made = std::make_shared<Spool>();
    made->name = segment.name;
    made->checksum = segment.checksum;
    made->path = path;
    // The blocks are all a replay reads (the index and blooms came with the plan).
    for (const jss::BlockInfo& bi : index->blocks) {
      made->size = std::max<uint64_t>(made->size, bi.offset + 8 + bi.compressed_size);
    }
    std::error_code ec;
    std::filesystem::create_directories(options_.spool_dir, ec);
    made->fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (made->fd < 0) {
      std::fprintf(stderr,
                   "atfill: archive: cannot spool %s to %s (%s); reading it block by block\n",
                   segment.name.c_str(), path.c_str(), std::strerror(errno));
      std::lock_guard lock(mu_);
      whole_.erase(segment.name);
      return std::optional<std::string>();
    }
    // A .part file of an earlier run holds a prefix of the same file (the name has its checksum).
    const off_t existing = ::lseek(made->fd, 0, SEEK_END);
    made->have = existing > 0 ? std::min<uint64_t>(static_cast<uint64_t>(existing), made->size) : 0;
    made->thread = std::thread([this, raw = made.get()] { Download(raw); });
    spool = made;
    std::lock_guard lock(mu_);
    ++stats_.spooled_segments;
    if (spool_ == nullptr) {
      spool_ = made;
    } else {
      old = std::move(spool_);  // another caller's; this one wins
      spool_ = made;
    }
  }
  old.reset();
  const jss::BlockInfo& b = index->blocks[block];
  const uint64_t end = b.offset + 8 + b.compressed_size;
  bool arrived = false;
  {
    std::unique_lock lock(spool->mu);
    spool->cv.wait(lock, [&] { return spool->have >= end || spool->done || spool->stop; });
    arrived = spool->have >= end;
    if (!arrived && !spool->failed.ok()) {
      std::fprintf(stderr, "atfill: archive: spooling %s failed (%s); reading it block by block\n",
                   segment.name.c_str(), spool->failed.message().c_str());
    }
  }
  if (!arrived) {
    // The download failed (or another segment took the spool): this segment by getBlock.
    {
      std::lock_guard lock(mu_);
      whole_.erase(segment.name);
      if (spool_ == spool) old = std::move(spool_);
    }
    old.reset();
    return std::optional<std::string>();
  }
  uint64_t prefix = 0;
  std::string frame(b.compressed_size, '\0');
  ATFILL_RETURN_IF_ERROR(
      PreadAll(spool->fd, reinterpret_cast<char*>(&prefix), 8, b.offset, spool->path));
  ATFILL_RETURN_IF_ERROR(
      PreadAll(spool->fd, frame.data(), frame.size(), b.offset + 8, spool->path));
  if (prefix != b.compressed_size) {
    return Status::Corrupt("archive segment " + segment.name + " (spooled): block " +
                           std::to_string(block) + " length prefix is " + std::to_string(prefix) +
                           ", block index says " + std::to_string(b.compressed_size));
  }
  {
    std::lock_guard lock(mu_);
    ++stats_.spooled_blocks;
  }
  return std::optional<std::string>(std::move(frame));
}

Result<std::string> HttpArchive::GetBlock(const SegmentInfo& segment, uint32_t block) {
  ATFILL_ASSIGN_OR_RETURN(std::optional<std::string> spooled, SpooledBlock(segment, block));
  if (spooled) return std::move(*spooled);
  Call call;
  call.url = base_ + std::string(kNsid) + "getBlock?segment=";
  net::AppendPercentEncoded(segment.name, &call.url);
  call.url += "&blockIndex=" + std::to_string(block);
  call.auth = true;
  call.max_bytes = options_.max_frame_bytes;
  ATFILL_ASSIGN_OR_RETURN(net::HttpResponse r, Execute(call));
  if (r.status != 200) {
    return Status::Invalid("archive getBlock " + call.url + ": unexpected HTTP " +
                           std::to_string(r.status));
  }
  return std::move(r.body);
}

}  // namespace atfill::sources
