// HttpArchive: a Jetstream v2 archive read over its XRPC API (SPEC §3): listSegments,
// planSnapshot and getBlock, plus ranged getSegment reads of each planned segment's header and
// block index (see "Plans" below).
//
// Requests run on an HttpClient the archive owns (one libcurl-multi loop thread), under net/'s
// retry policy (RetryPolicy, RateLimitPolicy, ByteQuotaPolicy) configured from the options below.
// The Start forms (StartListSegments, StartPlanSnapshot, StartGetBlock) hand a request to that
// loop and return at once; the answer comes through the callback, on the loop thread or on a spool
// download thread (see Archive). Waits for a retry, a Retry-After, a 429 or the quota run on the
// loop's timers and hold no caller's thread. The blocking forms (ListSegments, PlanSnapshot,
// GetBlock) are a Start form plus a wait for its answer: for tools and tests, never for a
// flow-graph thread or a source's Read (the replay source uses the Start forms).
//
// Plans. planSnapshot names blocks only by index (ranges, or a whole segment for mode "segment"),
// but a replay needs each block's seq bounds (its resume cursor advances block by block) and its
// uncompressed size. So for every segment a plan names, the archive reads that segment's 256-byte
// header and its block index (block_count x 52 bytes at block_index_offset) with two `Range`
// getSegment requests pinned to the plan's checksum with `If-Range` (a server that answers 200
// with the whole file instead is handled too; a compaction rewrite keeps every block and its
// bounds, so a changed checksum is harmless), index_fetch_concurrency segments at a time. Block
// indexes are cached per (segment, checksum).
// A mode "segment" entry becomes every block of the segment that has rows and lies in the
// request's window; a mode "blocks" entry becomes exactly the listed blocks.
//
// Spooling. With `spool_dir` set, a segment planned whole (mode "segment", at most
// max_spool_segment_bytes) is downloaded whole when its first planned block is asked for:
// getSegment in spool_chunk_bytes ranges pinned with If-Range to its checksum, into
// `<spool_dir>/<name>.<checksum>.part`, on a thread of its own; a block asked for is answered (on
// that thread) as soon as its bytes are there (blocks are decoded as they arrive). A chunk that
// fails is retried like any request, the download resuming where it stopped (a .part file left by
// an earlier process is resumed too); a server that answers 200 instead of 206 (the file changed)
// gives the whole file at once. Starting a segment's spool deletes the spools no block is waiting
// for (so with requests made ahead of the reader, the segment being read and the next ones are on
// disk, at most as many as blocks are asked for at once). If the download fails for good, the
// segment's blocks are fetched with getBlock. Everything else (a plan of block ranges, blocks
// asked out of order by a refold) is fetched block by block with getBlock.
//
// Auth. `key` is sent as `Authorization: Bearer <key>` on planSnapshot, getSegment and getBlock,
// and only to the archive's own origin (scheme, host and port of base_url): redirects are followed
// by hand, and one that leaves the origin is followed without the key. listSegments is public and
// never carries the key. 401 (no key, or one the archive wants) and 403 (key refused) are final
// errors (Invalid) whose message says so.
//
// Retries (net::RetryPolicy with the delays as its schedule). 500, 502, 504 and other 5xx (not
// 501/505), 408, and requests with no answer (connect failure, reset, timeout, truncated body)
// are retried `retry_delays_ms.size()` times, waiting those delays (default 6 retries over about
// 30 s). 503 is retried `unavailable_retries` times, waiting its Retry-After (delta-seconds or
// HTTP-date, capped at max_retry_after_ms; the delay schedule when absent). 429 is waited out
// (RateLimit-Reset, Retry-After, else throttle_default_wait_ms) for as long as it takes: only a
// request throttled max_throttled_ms in total fails (ResourceExhausted); while a 429's wait runs,
// the client holds every request to that host. Status codes of final errors: 404 NotFound, 501
// and 405 Unsupported (so a caller can tell "no archive here" from a failure), 401/403 and other
// 4xx Invalid, exhausted retries Unavailable. Every message names the URL and the reason.
//
// Quota (net::ByteQuotaPolicy). An archive may advertise a byte quota with the response header
//   X-Archive-Quota-Bytes-Per-Second: <decimal bytes per second>
// (0 = no quota). Once seen, every request to that archive's origin is paced to it: a token
// bucket of response body bytes, with no burst allowance, shared by every HttpArchive in the
// process that uses the same origin and key. A request waits until the bucket is not in debt,
// reserves the average response size, and is charged its real size when it completes. A later
// value replaces the rate; responses without the header leave it as it is. (A host a redirect
// leads to is paced by its own advertisement, if it makes one.)
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "net/http_client.hpp"
#include "sources/archive/archive.hpp"

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
  uint64_t requests = 0;          // HTTP attempts made (redirect hops included)
  uint64_t retries = 0;           // attempts after a 5xx, 408, 503 or no answer
  uint64_t throttled = 0;         // 429 answers
  uint64_t bytes = 0;             // response body bytes received
  int64_t paced_ms = 0;           // time requests were held back by the quota
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
  // Every sealed segment (listSegments, pages of 1000).
  Result<std::vector<SegmentInfo>> ListSegments() override;
  void StartListSegments(ArchiveCallback<std::vector<SegmentInfo>> done) override;
  // One planSnapshot page, with every planned segment's blocks and their bounds (see "Plans").
  // NotFound / Unsupported when the host serves no archive.
  Result<Plan> PlanSnapshot(const PlanRequest& request) override;
  void StartPlanSnapshot(const PlanRequest& request, ArchiveCallback<Plan> done) override;
  // getBlock (or the segment's spool): the raw frame, delivered as received (decoding it is the
  // caller's business). Idempotent.
  Result<std::string> GetBlock(const SegmentInfo& segment, uint32_t block) override;
  void StartGetBlock(const SegmentInfo& segment, uint32_t block,
                     ArchiveCallback<std::string> done) override;

  // Completes every pending call, and every later one, with Cancelled. Thread-safe; must not be
  // called from an archive callback.
  void Cancel();
  // Thread-safe snapshot.
  HttpArchiveStats stats() const;

 private:
  struct Call;
  struct BlockIndex;
  struct Spool;
  struct PlanJob;
  struct ListJob;
  using IndexCallback = std::function<void(Result<std::shared_ptr<const BlockIndex>>)>;
  explicit HttpArchive(HttpArchiveOptions options);

  // Submits one request; `done` gets its answer with the archive's status mapping (see
  // "Retries"), on the loop thread.
  void Execute(Call call, std::function<void(Result<net::HttpResponse>)> done);
  // Execute, waited for: the spool download thread only.
  Result<net::HttpResponse> ExecuteAndWait(Call call);
  void ListPage(std::shared_ptr<ListJob> job);
  void FetchIndex(const std::string& name, const std::string& checksum, IndexCallback done);
  // The cached index (nullptr when it is not cached).
  std::shared_ptr<const BlockIndex> CachedIndex(const std::string& name,
                                                const std::string& checksum);
  void Index(const std::string& name, const std::string& checksum, IndexCallback done);
  void NextIndexes(const std::shared_ptr<PlanJob>& job);
  void FinishPlan(const std::shared_ptr<PlanJob>& job);
  // Hands the block to the segment's spool (started when `block` is its first planned one, or a
  // .part file of it is there); false when the block is not to be read from a spool.
  bool SpoolBlock(const SegmentInfo& segment, uint32_t block, ArchiveCallback<std::string>* done);
  void FetchBlock(const SegmentInfo& segment, uint32_t block, ArchiveCallback<std::string> done);
  // The download thread of `spool`.
  void Download(Spool* spool);

  HttpArchiveOptions options_;
  std::string base_;  // base_url without a trailing slash
  std::unique_ptr<net::HttpClient> http_;

  mutable std::mutex mu_;
  bool cancelled_ = false;
  // The archive's own counters; the HTTP ones come from the client.
  uint64_t index_fetches_ = 0;
  uint64_t spooled_segments_ = 0;
  uint64_t spooled_blocks_ = 0;
  uint64_t spool_failures_ = 0;
  // Block index cache, by segment name; `lru_` holds names, most recent first.
  std::map<std::string,
           std::pair<std::shared_ptr<const BlockIndex>, std::list<std::string>::iterator>>
      indexes_;
  std::list<std::string> lru_;
  // Segments planned whole, by name: their first planned block.
  std::map<std::string, uint32_t> whole_;
  // The segments being spooled, oldest first, and the ones given up whose threads are ending.
  std::list<std::shared_ptr<Spool>> spools_;
  std::list<std::shared_ptr<Spool>> retired_;
};

}  // namespace atfill::sources
