// HttpArchive: a Jetstream v2 archive read over its XRPC API (SPEC §3): listSegments,
// planSnapshot and getBlock, plus ranged getSegment reads of each planned segment's header and
// block index (see "Plans" below).
//
// Requests run on an HttpClient the archive owns (one libcurl-multi loop thread). Every method
// blocks its caller until the answer is in, retries included: the replay source's Read may block
// on archive I/O, flow-graph node bodies must not call these.
//
// Plans. planSnapshot names blocks only by index (ranges, or a whole segment for mode "segment"),
// but a replay needs each block's seq bounds (its resume cursor advances block by block) and its
// uncompressed size. So for every segment a plan names, the archive reads that segment's 256-byte
// header and its block index (block_count x 52 bytes at block_index_offset) with two `Range`
// getSegment requests pinned to the plan's checksum with `If-Range` (a server that answers 200
// with the whole file instead is handled too; a compaction rewrite keeps every block and its
// bounds, so a changed checksum is harmless). Block indexes are cached per (segment, checksum).
// A mode "segment" entry becomes every block of the segment that has rows and lies in the
// request's window; a mode "blocks" entry becomes exactly the listed blocks.
//
// Spooling. With `spool_dir` set, a segment planned whole (mode "segment", at most
// max_spool_segment_bytes) is downloaded whole when its first planned block is asked for:
// getSegment in spool_chunk_bytes ranges pinned with If-Range to its checksum, into
// `<spool_dir>/<name>.<checksum>.part`, on a thread of its own; each GetBlock of the segment waits
// until its block's bytes are there (blocks are decoded as they arrive). A chunk that fails is
// retried like any request, the download resuming where it stopped (a .part file left by an earlier
// process is resumed too); a server that answers 200 instead of 206 (the file changed) gives the
// whole file at once. One segment is spooled at a time: moving to another deletes the file. If the
// download fails for good, the segment's blocks are fetched with getBlock. Everything else (a plan
// of block ranges, blocks asked out of order by a refold) is fetched block by block with getBlock.
//
// Auth. `key` is sent as `Authorization: Bearer <key>` on planSnapshot, getSegment and getBlock,
// and only to the archive's own origin (scheme, host and port of base_url): redirects are followed
// by hand, and one that leaves the origin is followed without the key. listSegments is public and
// never carries the key. 401 (no key, or one the archive wants) and 403 (key refused) are final
// errors (Invalid) whose message says so.
//
// Retries. 500, 502, 504 and other 5xx (not 501), 408, and requests with no answer (connect
// failure, reset, timeout, truncated body) are retried `retry_delays_ms.size()` times, waiting
// those delays (default 6 retries over about 30 s). 503 is retried `unavailable_retries` times,
// waiting its Retry-After (delta-seconds or HTTP-date, capped at max_retry_after_ms; the delay
// schedule when absent). 429 is waited out (RateLimit-Reset, Retry-After, else
// throttle_default_wait_ms) for as long as it takes: only a request throttled max_throttled_ms
// in total fails (ResourceExhausted). Status codes of final errors: 404 NotFound, 501 and 405
// Unsupported (so a caller can tell "no archive here" from a failure), 401/403 and other 4xx
// Invalid, exhausted retries Unavailable. Every message names the URL and the reason.
//
// Quota. An archive may advertise a byte quota with the response header
//   X-Archive-Quota-Bytes-Per-Second: <decimal bytes per second>
// (0 = no quota). Once seen, every request to that archive is paced to it: a token bucket of
// response body bytes, with no burst allowance, shared by every HttpArchive in the process that
// uses the same origin and key. A request waits until the bucket is not in debt, reserves the
// average response size, and is charged its real size when it completes. A later value replaces
// the rate; responses without the header leave it as it is.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "net/http_client.hpp"
#include "sources/archive.hpp"

namespace atfill::sources {

// The response header naming an archive's byte quota (see above).
inline constexpr std::string_view kArchiveQuotaHeader = "X-Archive-Quota-Bytes-Per-Second";

struct HttpArchiveOptions {
  // The archive host, "https://jetstream.example" (requests go to <base_url>/xrpc/<nsid>); a
  // trailing slash is ignored. http or https.
  std::string base_url;
  // Bearer key, sent only on planSnapshot/getSegment/getBlock to the archive's origin; empty =
  // none.
  std::string key;
  // Allow loopback and private addresses (tests, simnet, an archive on the local network).
  bool allow_private_addresses = false;
  // Connection setup time allowed, milliseconds.
  int64_t connect_timeout_ms = 10'000;
  // Time allowed per attempt (a whole block download), milliseconds.
  int64_t request_timeout_ms = 300'000;
  // Requests to the archive at once (over all callers of this instance); 1..1000.
  int max_connections = 4;
  // Largest getBlock body accepted, bytes.
  uint64_t max_frame_bytes = uint64_t{256} << 20;
  // Largest JSON body (listSegments, planSnapshot) accepted, bytes.
  uint64_t max_json_bytes = uint64_t{64} << 20;
  // Waits before each retry of a 5xx (other than 501/503), 408 or unanswered request,
  // milliseconds; one entry per retry (empty = never retry).
  std::vector<int64_t> retry_delays_ms = {1'000, 2'000, 4'000, 7'000, 8'000, 8'000};
  // Retries of a 503; 0..100.
  uint32_t unavailable_retries = 5;
  // Longest Retry-After a 503 is granted, milliseconds.
  int64_t max_retry_after_ms = 60'000;
  // Wait after a 429 that names no reset time, milliseconds.
  int64_t throttle_default_wait_ms = 5'000;
  // Total time one request may spend throttled (429) before it fails, milliseconds.
  int64_t max_throttled_ms = 15 * 60'000;
  // Segments whose header and block index are read at once while planning; 1..64.
  int index_fetch_concurrency = 4;
  // Block indexes kept in memory (segments; least recently used are dropped); at least 1.
  size_t index_cache_segments = 256;
  // Redirects followed per request; 0..20.
  int max_redirects = 5;
  // The whole User-Agent; empty = the HttpClient's default.
  std::string user_agent;
  // Where segments planned whole are downloaded (see "Spooling"); empty = never, every block by
  // getBlock. Created when missing.
  std::string spool_dir;
  // Largest segment spooled, bytes (larger ones are read block by block).
  uint64_t max_spool_segment_bytes = uint64_t{1} << 30;
  // getSegment range size while spooling, bytes.
  uint64_t spool_chunk_bytes = uint64_t{8} << 20;

  Status Validate() const;
};

// Counters since the archive was opened.
struct HttpArchiveStats {
  uint64_t requests = 0;          // HTTP attempts made
  uint64_t retries = 0;           // attempts after a 5xx, 408, 503 or no answer
  uint64_t throttled = 0;         // 429 answers
  uint64_t bytes = 0;             // response body bytes received
  int64_t paced_ms = 0;           // time spent waiting for the quota
  uint64_t index_fetches = 0;     // segment block indexes read (cache misses)
  uint64_t spooled_segments = 0;  // segments downloaded whole
  uint64_t spooled_blocks = 0;    // blocks read from a spooled segment
  uint64_t spool_failures = 0;    // spooled downloads that failed (their blocks by getBlock)
};

class HttpArchive : public Archive {
 public:
  // Validates the options and starts the HTTP client; no request is made yet.
  static Result<std::unique_ptr<HttpArchive>> Open(HttpArchiveOptions options);
  ~HttpArchive() override;
  HttpArchive(const HttpArchive&) = delete;
  HttpArchive& operator=(const HttpArchive&) = delete;

  // "archive <base_url>". Thread-safe.
  std::string Describe() const override;
  // Every sealed segment (listSegments, pages of 1000). Blocking; thread-safe.
  Result<std::vector<SegmentInfo>> ListSegments() override;
  // One planSnapshot page, with every planned segment's blocks and their bounds (see "Plans").
  // Blocking; thread-safe. NotFound / Unsupported when the host serves no archive.
  Result<Plan> PlanSnapshot(const PlanRequest& request) override;
  // getBlock: the raw frame, delivered as received (decoding it is the caller's business).
  // Blocking; thread-safe; idempotent.
  Result<std::string> GetBlock(const SegmentInfo& segment, uint32_t block) override;

  // Wakes every waiting call and makes it, and every later one, return Cancelled. Thread-safe.
  void Cancel();
  // Thread-safe snapshot.
  HttpArchiveStats stats() const;

  struct Quota;  // the process-wide byte bucket of one (origin, key)

 private:
  struct Call;
  struct BlockIndex;
  struct Spool;
  explicit HttpArchive(HttpArchiveOptions options);

  // One logical request with redirects, retries, throttling and pacing.
  Result<net::HttpResponse> Execute(Call call);
  // Sleeps `ms` unless cancelled first; false when cancelled.
  bool Wait(int64_t ms);
  Result<std::shared_ptr<const BlockIndex>> FetchIndex(const std::string& name,
                                                       const std::string& checksum);
  Result<std::shared_ptr<const BlockIndex>> Index(const std::string& name,
                                                  const std::string& checksum);
  // The block from the segment's spool (started when `block` is its first planned one, or a .part
  // file of it is there); nullopt when the block is not to be read from a spool.
  Result<std::optional<std::string>> SpooledBlock(const SegmentInfo& segment, uint32_t block);
  // The download thread of `spool`.
  void Download(Spool* spool);

  HttpArchiveOptions options_;
  std::string base_;    // base_url without a trailing slash
  std::string origin_;  // "scheme://host:port", lower-case
  std::shared_ptr<Quota> quota_;
  std::unique_ptr<net::HttpClient> http_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;
  HttpArchiveStats stats_;
  // Block index cache, by segment name; `lru_` holds names, most recent first.
  std::map<std::string,
           std::pair<std::shared_ptr<const BlockIndex>, std::list<std::string>::iterator>>
      indexes_;
  std::list<std::string> lru_;
  // Segments planned whole, by name: their first planned block.
  std::map<std::string, uint32_t> whole_;
  // The segment being spooled (at most one).
  std::shared_ptr<Spool> spool_;
};

}  // namespace atfill::sources
