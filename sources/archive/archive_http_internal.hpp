// The HTTP archive client's private parts, shared by archive_http.cpp (options, listing,
// block indexes, snapshot plans) and archive_http_blocks.cpp (block fetches, segment spooling).
// Not for use outside sources/.
#pragma once

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
#include "sources/archive/jss.hpp"

#include <fcntl.h>
#include <unistd.h>

#include "sources/archive/archive_http.hpp"

namespace atfill::sources {

using atproto::Value;

constexpr int64_t kDayMs = 86'400'000;
constexpr std::string_view kNsid = "/xrpc/network.bsky.jetstream.";
// listSegments pages read before the listing is declared endless.
constexpr int kMaxListPages = 100'000;

inline char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

inline std::string LowerCopy(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = Lower(c);
  return out;
}

inline bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (Lower(s[i]) != Lower(prefix[i])) return false;
  }
  return true;
}

// The scheme and authority of an absolute http(s) URL: "http://host:port" lower-cased, the
// default port spelled out, userinfo dropped. Empty when `url` is not an absolute http(s) URL
// with a host.
inline std::string OriginOf(std::string_view url) {
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

inline std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

inline uint64_t LoadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
inline uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// "HTTP 503 (ServiceUnavailable: not ready)" for messages; the server's words are cut short.
inline std::string DescribeAnswer(const net::HttpResponse& r) {
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

inline Result<Value> ParseObject(const std::string& body, const std::string& where) {
  auto v = atproto::JsonObjectToValue(body);
  if (!v.ok()) {
    return Status::Invalid(where + ": the answer is not a JSON object: " + v.status().message());
  }
  return v;
}

inline Result<std::string> SegmentNameField(const Fields& f, const std::string& where) {
  ATFILL_ASSIGN_OR_RETURN(std::string name, f.String("name"));
  if (!jss::ParseSegmentName(name).ok()) {
    return Status::Invalid(where + ": " + QuoteForMessage(name) + " is not a segment name");
  }
  return name;
}

// Parses "bytes a-b/total".
inline bool ParseContentRange(std::string_view text, uint64_t* first, uint64_t* last,
                              uint64_t* total) {
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

inline Status PwriteAll(int fd, const char* data, size_t n, uint64_t offset,
                        const std::string& path) {
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

inline Status PreadAll(int fd, char* data, size_t n, uint64_t offset, const std::string& path) {
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
inline Result<net::HttpResponse> Classify(const std::string& where, bool has_key,
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
inline Result<T> Await(Start&& start) {
  auto promise = std::make_shared<std::promise<Result<T>>>();
  std::future<Result<T>> future = promise->get_future();
  start([promise](Result<T> r) { promise->set_value(std::move(r)); });
  return future.get();
}

// One page of listSegments into `out`; `*next` is its cursor ("" at the end).
inline Status ParseSegmentsPage(const std::string& body, const std::string& where,
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
inline Result<std::vector<jss::BlockInfo>> ParseBlockIndex(std::string_view bytes, uint32_t count,
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
inline Result<std::string> ReadSpooled(int fd, const std::string& path, const std::string& name,
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

}  // namespace atfill::sources
