#include "sources/archive_http.hpp"

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <list>
#include <optional>
#include <thread>
#include <utility>

#include "atproto/json.hpp"
#include "atproto/value.hpp"
#include "base/json_writer.hpp"
#include "base/strings.hpp"
#include "net/endpoint.hpp"
#include "net/xrpc_error.hpp"
#include "sources/jss.hpp"

#include <fcntl.h>
#include <unistd.h>

namespace atfill::sources {
namespace {

using atproto::Value;

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
  bool auth = false;  // send the key (net keeps it on the archive's origin)
  uint64_t max_bytes = 0;
};

struct HttpArchive::BlockIndex {
  std::string checksum;  // of the file the index was read from
  jss::Header header;
  uint64_t file_size = 0;
  std::vector<jss::BlockInfo> blocks;
};

// One segment being downloaded into a .part file; a block asked for waits in `waiters` until its
// bytes are there.
struct HttpArchive::Spool {
  struct Waiter {
    uint32_t block = 0;
    ArchiveCallback<std::string> done;
  };
  SegmentInfo segment;
  std::string path;
  std::shared_ptr<const BlockIndex> index;
  uint64_t size = 0;  // through the end of the last block
  int fd = -1;
  std::mutex mu;
  uint64_t have = 0;  // bytes [0, have) are in the file
  bool done = false;  // the download ended (complete when have == size)
  bool stop = false;
  std::vector<Waiter> waiters;
  std::thread thread;

  uint64_t End(uint32_t block) const {
    const jss::BlockInfo& b = index->blocks[block];
    return b.offset + 8 + b.compressed_size;
  }

  ~Spool() {
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    if (thread.joinable()) thread.join();
    if (fd >= 0) ::close(fd);
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

struct HttpArchive::ListJob {
  std::vector<SegmentInfo> out;
  std::string cursor;
  int page = 0;
  ArchiveCallback<std::vector<SegmentInfo>> done;
};

struct HttpArchive::PlanJob {
  struct Entry {
    std::string name, checksum;
    bool whole = false;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
  };
  PlanRequest request;
  std::string where;
  Plan plan;
  std::vector<Entry> entries;
  std::vector<std::shared_ptr<const BlockIndex>> indexes;
  ArchiveCallback<Plan> done;

  std::mutex mu;
  size_t next = 0;      // the next entry whose index is wanted
  size_t active = 0;    // index fetches running
  size_t finished = 0;  // entries with their index
  Status error;
  bool reported = false;
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

// The archive's reading of a final answer (see "Retries" in the header): 2xx and 304 pass, every
// other status becomes the error the caller is told.
Result<net::HttpResponse> Classify(const std::string& where, bool has_key,
                                   Result<net::HttpResponse> r) {
  if (!r.ok()) {
    switch (r.status().code()) {
      case StatusCode::kCancelled:
        return Status::Cancelled(where + ": cancelled");
      case StatusCode::kUnavailable:
        return Status::Unavailable(where + ": no answer: " + r.status().message());
      default:
        return r.status().WithContext("archive");
    }
  }
  const net::HttpResponse& resp = *r;
  const int st = resp.status;
  const std::string retries = std::to_string(std::max(resp.attempts - 1, 0));
  if ((st >= 200 && st < 300) || st == 304) return r;
  if (st >= 300 && st < 400) {
    return Status::Invalid(
        where + ": HTTP " + std::to_string(st) +
        (resp.Header("location").empty() ? " without a Location" : " (redirect not followed)"));
  }
  if (st == 429) {
    return Status::ResourceExhausted(where + ": throttled (HTTP 429) for " +
                                     std::to_string(resp.throttled_ms) + " ms in all; giving up");
  }
  if (st == 501 || st == 405) {
    return Status::Unsupported(where + ": " + DescribeAnswer(resp) +
                               ": the host does not serve this archive method");
  }
  if (st >= 500 || st == 408) {
    return Status::Unavailable(where + ": " + DescribeAnswer(resp) + " after " + retries +
                               " retries");
  }
  if (st == 401 || st == 403) {
    const std::string answer = DescribeAnswer(resp);
    if (!has_key) {
      return Status::Invalid(where + ": " + answer +
                             ": the archive asks for a key and none is configured");
    }
    return Status::Invalid(where + ": " + answer + ": the archive refused the key");
  }
  if (st == 404) return Status::NotFound(where + ": " + DescribeAnswer(resp));
  return Status::Invalid(where + ": " + DescribeAnswer(resp));
}

// Starts `start` (which takes a callback) and waits for its answer.
template <typename T, typename Start>
Result<T> Await(Start&& start) {
  auto promise = std::make_shared<std::promise<Result<T>>>();
  std::future<Result<T>> future = promise->get_future();
  start([promise](Result<T> r) { promise->set_value(std::move(r)); });
  return future.get();
}

// One page of listSegments into `out`; `*next` is its cursor ("" at the end).
Status ParseSegmentsPage(const std::string& body, const std::string& where,
                         std::vector<SegmentInfo>* out, std::string* next) {
  ATFILL_ASSIGN_OR_RETURN(Value root, ParseObject(body, where));
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
    if (!out->empty() && info.index <= out->back().index) {
      return Status::Invalid(at + ": segment " + info.name + " is out of order");
    }
    out->push_back(std::move(info));
  }
  ATFILL_ASSIGN_OR_RETURN(*next, f.String("cursor", ""));
  return Status::OK();
}

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

// A block read back from a spool file.
Result<std::string> ReadSpooled(int fd, const std::string& path, const std::string& name,
                                uint32_t block, const jss::BlockInfo& b) {
  uint64_t prefix = 0;
  std::string frame(b.compressed_size, '\0');
  ATFILL_RETURN_IF_ERROR(PreadAll(fd, reinterpret_cast<char*>(&prefix), 8, b.offset, path));
  ATFILL_RETURN_IF_ERROR(PreadAll(fd, frame.data(), frame.size(), b.offset + 8, path));
  if (prefix != b.compressed_size) {
    return Status::Corrupt("archive segment " + name + " (spooled): block " +
                           std::to_string(block) + " length prefix is " + std::to_string(prefix) +
                           ", block index says " + std::to_string(b.compressed_size));
  }
  return frame;
}

}  // namespace

HttpArchive::HttpArchive(HttpArchiveOptions options) : options_(std::move(options)) {}

HttpArchive::~HttpArchive() {
  Cancel();
  // The download threads end once their request is cancelled; their files go with them.
  std::list<std::shared_ptr<Spool>> spools;
  {
    std::lock_guard lock(mu_);
    spools.swap(spools_);
    spools.splice(spools.end(), retired_);
  }
  spools.clear();
}

Result<std::unique_ptr<HttpArchive>> HttpArchive::Open(HttpArchiveOptions options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<HttpArchive> a(new HttpArchive(std::move(options)));
  const HttpArchiveOptions& o = a->options_;
  std::string_view base = o.base_url;
  while (!base.empty() && base.back() == '/') base.remove_suffix(1);
  a->base_ = std::string(base);

  net::HttpClientOptions h;
  h.user_agent = o.user_agent;
  h.max_in_flight = o.max_connections;
  h.max_per_host = o.max_connections;
  h.connect_timeout_ms = o.connect_timeout_ms;
  h.timeout_ms = o.request_timeout_ms;
  h.max_response_bytes = std::max(o.max_frame_bytes, o.max_json_bytes);
  h.max_redirects = o.max_redirects;
  // The archive's schedule, exactly: no retry when it is empty.
  h.retry.max_attempts = 1;
  h.retry.base_backoff_ms = 0;
  h.retry.max_backoff_ms = 0;
  h.retry.delays_ms = o.retry_delays_ms;
  h.retry.unavailable_retries = static_cast<int>(o.unavailable_retries);
  h.retry.max_retry_after_ms = o.max_retry_after_ms;
  // 0 would let a 429 use an attempt; the shortest cap is the nearest to "fail when throttled".
  h.retry.max_throttled_ms = std::max<int64_t>(o.max_throttled_ms, 1);
  h.rate_limit.default_wait_ms = o.throttle_default_wait_ms;
  h.rate_limit.max_wait_ms = std::max(o.max_throttled_ms, o.throttle_default_wait_ms);
  h.quota.header = std::string(kArchiveQuotaHeader);
  h.quota.scope = o.key;
  // The schedule bounds a request's retries; the client's circuit breaker would cut them short.
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
    for (const auto& spool : spools_) {
      std::lock_guard spool_lock(spool->mu);
      spool->stop = true;
    }
  }
  if (http_) http_->Shutdown();
}

HttpArchiveStats HttpArchive::stats() const {
  const net::HttpClientStats h = http_->stats();
  HttpArchiveStats s;
  s.requests = h.attempts;
  s.retries = h.retries;
  s.throttled = h.rate_limited;
  s.bytes = h.bytes_received;
  s.paced_ms = h.paced_ms;
  std::lock_guard lock(mu_);
  s.index_fetches = index_fetches_;
  s.spooled_segments = spooled_segments_;
  s.spooled_blocks = spooled_blocks_;
  s.spool_failures = spool_failures_;
  return s;
}

void HttpArchive::Execute(Call call, std::function<void(Result<net::HttpResponse>)> done) {
  std::string where = "archive " + call.method + " " + call.url;
  {
    std::lock_guard lock(mu_);
    if (cancelled_) return done(Status::Cancelled(where + ": cancelled"));
  }
  net::HttpRequest request;
  request.method = std::move(call.method);
  request.url = std::move(call.url);
  request.headers = std::move(call.headers);
  request.body = std::move(call.body);
  request.max_response_bytes = call.max_bytes;
  if (call.auth && !options_.key.empty()) {
    request.credentials.emplace_back("Authorization", "Bearer " + options_.key);
  }
  http_->Submit(std::move(request),
                [where = std::move(where), has_key = !options_.key.empty(), done = std::move(done)](
                    Result<net::HttpResponse> r) { done(Classify(where, has_key, std::move(r))); });
}

Result<net::HttpResponse> HttpArchive::ExecuteAndWait(Call call) {
  return Await<net::HttpResponse>([&](auto done) { Execute(std::move(call), std::move(done)); });
}

// --- listSegments ---

Result<std::vector<SegmentInfo>> HttpArchive::ListSegments() {
  return Await<std::vector<SegmentInfo>>([&](auto done) { StartListSegments(std::move(done)); });
}

void HttpArchive::StartListSegments(ArchiveCallback<std::vector<SegmentInfo>> done) {
  auto job = std::make_shared<ListJob>();
  job->done = std::move(done);
  ListPage(std::move(job));
}

void HttpArchive::ListPage(std::shared_ptr<ListJob> job) {
  if (job->page++ >= kMaxListPages) {
    return job->done(Status::Invalid("archive " + base_ + ": listSegments did not end after " +
                                     std::to_string(kMaxListPages) + " pages"));
  }
  Call call;
  call.url = base_ + std::string(kNsid) + "listSegments?limit=1000";
  if (!job->cursor.empty()) {
    call.url += "&cursor=";
    net::AppendPercentEncoded(job->cursor, &call.url);
  }
  call.max_bytes = options_.max_json_bytes;
  std::string where = "archive listSegments " + call.url;
  Execute(std::move(call), [this, job, where = std::move(where)](Result<net::HttpResponse> r) {
    if (!r.ok()) return job->done(r.status());
    if (r->status != 200) {
      return job->done(Status::Invalid(where + ": unexpected HTTP " + std::to_string(r->status)));
    }
    std::string next;
    if (Status st = ParseSegmentsPage(r->body, where, &job->out, &next); !st.ok()) {
      return job->done(st);
    }
    if (next.empty()) return job->done(std::move(job->out));
    if (next == job->cursor) {
      return job->done(Status::Invalid(where + ": the listing cursor did not advance"));
    }
    job->cursor = std::move(next);
    ListPage(job);
  });
}

// --- block indexes ---

void HttpArchive::FetchIndex(const std::string& name, const std::string& checksum,
                             IndexCallback done) {
  // One ranged getSegment read, pinned to `etag` (empty = unpinned). `whole` is set when the
  // server sent the whole file instead (no range support, or the file changed).
  struct Read {
    std::string body;
    uint64_t file_size = 0;
    bool whole = false;
  };
  using ReadCallback = std::function<void(Result<Read>)>;
  const auto read = [this, name](const std::string& etag, uint64_t offset, uint64_t length,
                                 ReadCallback then) {
    Call call;
    call.url = base_ + std::string(kNsid) + "getSegment?name=";
    net::AppendPercentEncoded(name, &call.url);
    call.auth = true;
    call.max_bytes = options_.max_json_bytes;
    call.headers.emplace_back(
        "Range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + length - 1));
    if (!etag.empty()) call.headers.emplace_back("If-Range", "\"" + etag + "\"");
    std::string where = "archive getSegment " + call.url;
    Execute(std::move(call), [where = std::move(where), offset, length,
                              then = std::move(then)](Result<net::HttpResponse> r) {
      if (!r.ok()) return then(r.status());
      Read out;
      if (r->status == 200) {
        out.file_size = r->body.size();
        out.body = std::move(r->body);
        out.whole = true;
        return then(std::move(out));
      }
      if (r->status != 206) {
        return then(Status::Invalid(where + ": unexpected HTTP " + std::to_string(r->status)));
      }
      uint64_t first = 0, last = 0;
      if (!ParseContentRange(r->content_range(), &first, &last, &out.file_size) ||
          first != offset || last - first + 1 != r->body.size() || r->body.size() != length) {
        return then(Status::Invalid(where + ": bad Content-Range " +
                                    QuoteForMessage(r->content_range(), 100) + " for bytes " +
                                    std::to_string(offset) + "+" + std::to_string(length) + " (" +
                                    std::to_string(r->body.size()) + " bytes received)"));
      }
      out.body = std::move(r->body);
      then(std::move(out));
    });
  };
  const std::string where = "archive " + base_ + " segment " + name;
  // Header and index from the whole file.
  const auto from_file =
      [where](const std::string& file) -> Result<std::shared_ptr<const BlockIndex>> {
    auto index = std::make_shared<BlockIndex>();
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
  read(checksum, 0, jss::kHeaderSize,
       [this, read, from_file, where, done = std::move(done)](Result<Read> head) {
         if (!head.ok()) return done(head.status());
         if (head->whole) return done(from_file(head->body));
         auto header = jss::ParseHeader(AsBytes(head->body), head->file_size);
         if (!header.ok()) return done(header.status().WithContext(where));
         auto index = std::make_shared<BlockIndex>();
         index->header = *header;
         index->file_size = head->file_size;
         index->checksum = Hex16(header->checksum);
         const jss::Header& h = index->header;
         const uint64_t index_bytes = uint64_t{h.block_count} * jss::kBlockIndexEntrySize;
         if (h.block_index_offset + index_bytes > h.did_bloom_offset) {
           return done(Status::Corrupt(
               where + ": the block index of " + std::to_string(h.block_count) +
               " blocks runs past the DID bloom at " + std::to_string(h.did_bloom_offset)));
         }
         if (index_bytes > options_.max_json_bytes) {
           return done(Status::OutOfRange(where + ": the block index of " +
                                          std::to_string(h.block_count) +
                                          " blocks is over max_json_bytes"));
         }
         if (h.block_count == 0) return done(std::shared_ptr<const BlockIndex>(std::move(index)));
         const std::string etag = index->checksum;
         const uint64_t offset = h.block_index_offset;
         read(etag, offset, index_bytes, [index, from_file, where, done](Result<Read> bytes) {
           if (!bytes.ok()) return done(bytes.status());
           if (bytes->whole) return done(from_file(bytes->body));
           auto blocks = ParseBlockIndex(bytes->body, index->header.block_count, where);
           if (!blocks.ok()) return done(blocks.status());
           index->blocks = std::move(*blocks);
           done(std::shared_ptr<const BlockIndex>(index));
         });
       });
}

std::shared_ptr<const HttpArchive::BlockIndex> HttpArchive::CachedIndex(
    const std::string& name, const std::string& checksum) {
  std::lock_guard lock(mu_);
  auto it = indexes_.find(name);
  if (it == indexes_.end() || (!checksum.empty() && it->second.first->checksum != checksum)) {
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, it->second.second);
  return it->second.first;
}

void HttpArchive::Index(const std::string& name, const std::string& checksum, IndexCallback done) {
  if (auto cached = CachedIndex(name, checksum)) return done(std::move(cached));
  FetchIndex(name, checksum,
             [this, name, done = std::move(done)](Result<std::shared_ptr<const BlockIndex>> r) {
               if (r.ok()) {
                 std::lock_guard lock(mu_);
                 ++index_fetches_;
                 auto it = indexes_.find(name);
                 if (it != indexes_.end()) {
                   lru_.erase(it->second.second);
                   indexes_.erase(it);
                 }
                 lru_.push_front(name);
                 indexes_.emplace(name, std::make_pair(*r, lru_.begin()));
                 while (indexes_.size() > options_.index_cache_segments) {
                   indexes_.erase(lru_.back());
                   lru_.pop_back();
                 }
               }
               done(std::move(r));
             });
}

// --- planSnapshot ---

Result<Plan> HttpArchive::PlanSnapshot(const PlanRequest& request) {
  return Await<Plan>([&](auto done) { StartPlanSnapshot(request, std::move(done)); });
}

void HttpArchive::StartPlanSnapshot(const PlanRequest& request, ArchiveCallback<Plan> done) {
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
  auto job = std::make_shared<PlanJob>();
  job->request = request;
  job->where = "archive planSnapshot " + call.url;
  job->done = std::move(done);
  Execute(std::move(call), [this, job, nothing](Result<net::HttpResponse> r) {
    const std::string& where = job->where;
    if (!r.ok()) return job->done(r.status());
    if (r->status != 200) {
      return job->done(Status::Invalid(where + ": unexpected HTTP " + std::to_string(r->status)));
    }
    const auto parse = [&]() -> Status {
      ATFILL_ASSIGN_OR_RETURN(Value root, ParseObject(r->body, where));
      const Fields f(root, where);
      ATFILL_ASSIGN_OR_RETURN(job->plan.sealed_tip, f.Uint("sealedTipSeq"));
      ATFILL_ASSIGN_OR_RETURN(job->plan.planned_through,
                              f.Uint("plannedThroughSeq", job->plan.sealed_tip));
      ATFILL_ASSIGN_OR_RETURN(const Value::Array* segments, f.Array("segments"));
      for (size_t i = 0; i < (nothing ? 0 : segments->size()); ++i) {
        const std::string at = where + ": segments[" + std::to_string(i) + "]";
        const Value& s = (*segments)[i];
        if (s.kind() != Value::Kind::kMap) return Status::Invalid(at + " is not an object");
        const Fields g(s, at);
        PlanJob::Entry e;
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
            if (range.kind() != Value::Kind::kMap) {
              return Status::Invalid(bat + " is not an object");
            }
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
        job->entries.push_back(std::move(e));
      }
      return Status::OK();
    };
    if (Status st = parse(); !st.ok()) return job->done(st);
    job->indexes.resize(job->entries.size());
    NextIndexes(job);
  });
}

void HttpArchive::NextIndexes(const std::shared_ptr<PlanJob>& job) {
  const size_t limit = static_cast<size_t>(options_.index_fetch_concurrency);
  while (true) {
    size_t i = 0;
    {
      std::lock_guard lock(job->mu);
      const bool over = !job->error.ok() || job->finished == job->entries.size();
      if (over && job->active == 0) {
        if (job->reported) return;
        job->reported = true;
        break;  // finish below, outside the lock
      }
      if (!job->error.ok() || job->next >= job->entries.size() || job->active >= limit) return;
      i = job->next++;
      // Cached indexes are taken here, so that a plan of many cached segments does not recurse.
      if (auto cached = CachedIndex(job->entries[i].name, job->entries[i].checksum)) {
        job->indexes[i] = std::move(cached);
        ++job->finished;
        continue;
      }
      ++job->active;
    }
    Index(job->entries[i].name, job->entries[i].checksum,
          [this, job, i](Result<std::shared_ptr<const BlockIndex>> index) {
            {
              std::lock_guard lock(job->mu);
              --job->active;
              ++job->finished;
              if (index.ok()) {
                job->indexes[i] = std::move(*index);
              } else if (job->error.ok()) {
                job->error = index.status();
              }
            }
            NextIndexes(job);
          });
  }
  if (!job->error.ok()) return job->done(job->error);
  FinishPlan(job);
}

void HttpArchive::FinishPlan(const std::shared_ptr<PlanJob>& job) {
  const PlanRequest& request = job->request;
  Plan& plan = job->plan;
  for (size_t i = 0; i < job->entries.size(); ++i) {
    const PlanJob::Entry& e = job->entries[i];
    const BlockIndex& index = *job->indexes[i];
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
          return job->done(Status::Invalid(job->where + ": the plan names block " +
                                           std::to_string(last) + " of " + e.name + ", which has " +
                                           std::to_string(index.blocks.size()) + " blocks"));
        }
        for (uint64_t b = first; b <= last; ++b) add(static_cast<uint32_t>(b));
      }
    }
    if (!p.blocks.empty()) plan.segments.push_back(std::move(p));
  }
  job->done(std::move(plan));
}

// --- blocks ---

Result<std::string> HttpArchive::GetBlock(const SegmentInfo& segment, uint32_t block) {
  return Await<std::string>([&](auto done) { StartGetBlock(segment, block, std::move(done)); });
}

void HttpArchive::StartGetBlock(const SegmentInfo& segment, uint32_t block,
                                ArchiveCallback<std::string> done) {
  if (SpoolBlock(segment, block, &done)) return;
  FetchBlock(segment, block, std::move(done));
}

void HttpArchive::FetchBlock(const SegmentInfo& segment, uint32_t block,
                             ArchiveCallback<std::string> done) {
  Call call;
  call.url = base_ + std::string(kNsid) + "getBlock?segment=";
  net::AppendPercentEncoded(segment.name, &call.url);
  call.url += "&blockIndex=" + std::to_string(block);
  call.auth = true;
  call.max_bytes = options_.max_frame_bytes;
  std::string where = "archive getBlock " + call.url;
  Execute(std::move(call), [where = std::move(where),
                            done = std::move(done)](Result<net::HttpResponse> r) {
    if (!r.ok()) return done(r.status());
    if (r->status != 200) {
      return done(Status::Invalid(where + ": unexpected HTTP " + std::to_string(r->status)));
    }
    done(std::move(r->body));
  });
}

bool HttpArchive::SpoolBlock(const SegmentInfo& segment, uint32_t block,
                             ArchiveCallback<std::string>* done) {
  if (options_.spool_dir.empty() || segment.checksum.empty()) return false;
  const std::string path = (std::filesystem::path(options_.spool_dir) /
                            (segment.name + "." + segment.checksum + ".part"))
                               .string();
  std::shared_ptr<Spool> spool;
  std::list<std::shared_ptr<Spool>> dead;  // destroyed (threads joined) outside the lock
  {
    std::lock_guard lock(mu_);
    if (cancelled_) return false;
    for (auto it = retired_.begin(); it != retired_.end();) {
      std::lock_guard spool_lock((*it)->mu);
      auto here = it++;
      if ((*here)->done) dead.splice(dead.end(), retired_, here);
    }
    for (const auto& s : spools_) {
      if (s->segment.name == segment.name && s->segment.checksum == segment.checksum) spool = s;
    }
    if (spool == nullptr) {
      auto it = whole_.find(segment.name);
      std::error_code ec;
      if (it == whole_.end() || (it->second != block && !std::filesystem::exists(path, ec))) {
        return false;
      }
      std::shared_ptr<const BlockIndex> index;
      if (auto cached = indexes_.find(segment.name);
          cached != indexes_.end() && cached->second.first->checksum == segment.checksum) {
        index = cached->second.first;
      }
      if (index == nullptr || block >= index->blocks.size()) return false;
      auto made = std::make_shared<Spool>();
      made->segment = segment;
      made->path = path;
      made->index = index;
      // The blocks are all a replay reads (the index and blooms came with the plan).
      for (const jss::BlockInfo& bi : index->blocks) {
        made->size = std::max<uint64_t>(made->size, bi.offset + 8 + bi.compressed_size);
      }
      std::filesystem::create_directories(options_.spool_dir, ec);
      made->fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (made->fd < 0) {
        std::fprintf(stderr,
                     "atfill: archive: cannot spool %s to %s (%s); reading it block by block\n",
                     segment.name.c_str(), path.c_str(), std::strerror(errno));
        whole_.erase(segment.name);
        made->path.clear();  // not ours to remove
        dead.push_back(std::move(made));
        return false;
      }
      // A .part file of an earlier run holds a prefix of the same file (the name has its
      // checksum).
      const off_t existing = ::lseek(made->fd, 0, SEEK_END);
      made->have =
          existing > 0 ? std::min<uint64_t>(static_cast<uint64_t>(existing), made->size) : 0;
      // The spools no block waits for are behind the reader: they go.
      for (auto it = spools_.begin(); it != spools_.end();) {
        auto here = it++;
        std::lock_guard spool_lock((*here)->mu);
        if ((*here)->waiters.empty()) {
          (*here)->stop = true;
          retired_.splice(retired_.end(), spools_, here);
        }
      }
      ++spooled_segments_;
      made->thread = std::thread([this, raw = made.get()] { Download(raw); });
      spools_.push_back(made);
      spool = std::move(made);
    }
  }
  dead.clear();
  const uint64_t end = block < spool->index->blocks.size() ? spool->End(block) : UINT64_MAX;
  {
    std::lock_guard lock(spool->mu);
    if (end == UINT64_MAX || (spool->have < end && spool->done)) {
      // Not in this file, or its download failed: by getBlock.
      return false;
    }
    if (spool->have < end) {
      spool->waiters.push_back({block, std::move(*done)});
      return true;
    }
  }
  auto frame =
      ReadSpooled(spool->fd, spool->path, segment.name, block, spool->index->blocks[block]);
  if (frame.ok()) {
    std::lock_guard lock(mu_);
    ++spooled_blocks_;
  }
  (*done)(std::move(frame));
  return true;
}

void HttpArchive::Download(Spool* spool) {
  Status failed = Status::OK();
  const std::string& name = spool->segment.name;
  // Answers the waiters whose blocks are in the file; with `all`, hands the others to getBlock.
  const auto serve = [&](bool all) {
    std::vector<Spool::Waiter> ready, rest;
    {
      std::lock_guard lock(spool->mu);
      for (Spool::Waiter& w : spool->waiters) {
        (spool->have >= spool->End(w.block) ? ready : rest).push_back(std::move(w));
      }
      spool->waiters.clear();
      if (all) {
        spool->done = true;
      } else {
        spool->waiters = std::move(rest);
        rest.clear();
      }
    }
    for (Spool::Waiter& w : ready) {
      auto frame =
          ReadSpooled(spool->fd, spool->path, name, w.block, spool->index->blocks[w.block]);
      if (frame.ok()) {
        std::lock_guard lock(mu_);
        ++spooled_blocks_;
      }
      w.done(std::move(frame));
    }
    for (Spool::Waiter& w : rest) FetchBlock(spool->segment, w.block, std::move(w.done));
  };
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
    net::AppendPercentEncoded(name, &call.url);
    call.auth = true;
    call.max_bytes = options_.max_spool_segment_bytes;
    call.headers.emplace_back(
        "Range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + length - 1));
    call.headers.emplace_back("If-Range", "\"" + spool->segment.checksum + "\"");
    const std::string where = "archive getSegment " + call.url;
    // This thread is the spool's own: it waits here so that the file is written in order.
    Result<net::HttpResponse> r = ExecuteAndWait(std::move(call));
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
                                   spool->segment.checksum);
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
    serve(false);
  }
  if (!failed.ok()) {
    std::lock_guard lock(mu_);
    if (failed.code() != StatusCode::kCancelled) {
      ++spool_failures_;
      std::fprintf(stderr, "atfill: archive: spooling %s failed (%s); reading it block by block\n",
                   name.c_str(), failed.message().c_str());
    }
    whole_.erase(name);
  }
  serve(true);
}

}  // namespace atfill::sources
