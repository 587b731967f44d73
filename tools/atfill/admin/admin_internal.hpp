// The admin server's private parts, shared by admin_server.cpp (the server: connections, routes,
// handlers, event streams), admin_http.cpp (requests and answers: routes matched, bodies parsed,
// the HTTP transport) and admin_json.cpp (what the API answers, as JSON). Not for use outside
// tools/atfill/admin/.
#pragma once

#include "base/low_port.hpp"
#include "tools/atfill/admin/admin_server.hpp"

#include <simdjson.h>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <future>
#include <initializer_list>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "pipeline/job_details.hpp"

#include "atproto/syntax.hpp"
#include "base/json_writer.hpp"
#include "base/sha256.hpp"
#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"

namespace atfill::admin {

using Clock = std::chrono::steady_clock;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr const char* kJsonType = "application/json";
constexpr const char* kMetricsType = "text/plain; version=0.0.4; charset=utf-8";
// The dashboard loads nothing but its own files and talks only to its own origin.
constexpr const char* kPagePolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

struct EventStream;
class StreamSlot;

// A request as the handlers see it: the path and the query decoded, the id segment of a
// "{id}" route taken out.
struct Request {
  std::string method;
  std::string path;
  std::string id_segment;
  std::multimap<std::string, std::string> params;
  http::fields headers;
  std::string body;

  bool has_header(std::string_view name) const {
    return headers.find(beast::string_view(name.data(), name.size())) != headers.end();
  }
  std::string get_header_value(std::string_view name) const {
    auto it = headers.find(beast::string_view(name.data(), name.size()));
    return it == headers.end() ? std::string() : std::string(it->value());
  }
  bool has_param(const std::string& name) const { return params.count(name) != 0; }
  std::string get_param_value(const std::string& name) const {
    auto it = params.find(name);
    return it == params.end() ? std::string() : it->second;
  }
};

// An answer as the handlers make it. One with `stream` set is an event stream: its head is
// sent, then what the stream's polls produce, in chunks.
struct Response {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::shared_ptr<EventStream> stream;
  std::shared_ptr<StreamSlot> slot;  // the stream's place among max_event_streams

  void set_header(std::string_view name, std::string_view value) {
    headers.emplace_back(name, value);
  }
  void set_content(std::string content, std::string_view type) {
    body = std::move(content);
    set_header("Content-Type", type);
  }
  void set_content(const char* data, size_t size, std::string_view type) {
    set_content(std::string(data, size), type);
  }
};

// --- JSON ---

void WriteCounters(JsonWriter& w, const state::JobCounters& c);

void WriteProgress(JsonWriter& w, const state::JobRecord& job, int64_t now_us);

void WriteStopReason(JsonWriter& w, const state::StopReason& reason);

// What a running job waits for (JobRecord::waiting): null, or its code, sentence and start.
void WriteWaiting(JsonWriter& w, const state::JobRecord& job);

// Job parameters that hold a list, one item a line (as the verbs store them): answered as arrays
// of strings, empty lines skipped.
constexpr std::string_view kListParams[] = {"blocks", "collections", "dids", "files", "hosts"};

void WriteParams(JsonWriter& w, const std::map<std::string, std::string>& params);

// The members of `atfill job --json`'s "job" object, into an object the caller opened, with the
// same names so the API and the CLI agree.
void WriteJobFields(JsonWriter& w, const state::JobRecord& job, int64_t now_us);

void WriteHosts(JsonWriter& w, const std::vector<state::HostSummary>& hosts);

void WriteRecent(JsonWriter& w, const std::vector<state::RecentRepo>& recent);

void WriteErrorsByKind(JsonWriter& w, const std::map<std::string, uint64_t>& counts);

void WriteStageChange(JsonWriter& w, uint64_t job_id, const StageChange& c);

std::string BatchesJson(uint64_t id, uint64_t from, const std::vector<state::BatchAudit>& batches);

std::string LiveHistoryJson(const std::vector<LiveSample>& samples, int64_t interval_ms);

std::string ErrorJson(std::string_view message);

void WriteLabels(JsonWriter& w, const LabelsStatus& l);

std::string LiveJson(const LiveStatus& live);

// --- HTTP answers ---

int HttpStatusFor(const Status& s);

void SendJson(Response& res, int status, std::string body);

void SendError(Response& res, int status, std::string_view message);

void SendStatus(Response& res, const Status& s);

void SendUnauthorized(Response& res);

// --- Routes ---

enum class RouteId : uint8_t {
  kList,
  kStart,
  kClearAll,
  kGet,
  kPause,
  kResume,
  kCancel,
  kRetryFailed,
  kClearOne,
  kEvents,
  kBatches,
  kLive,
  kLiveHistory,
  kCollections,
  kChangeCollections,
  kLexicons,
  kAddLexicon,
  kRemoveLexicon,
  kMetrics,
};

struct Route {
  std::string_view method;
  std::string_view pattern;  // "{id}" stands for one path segment: a job id, or an NSID
  RouteId id;
};

// A literal route comes before a "{id}" one that also matches its path.
constexpr Route kRoutes[] = {
    {"GET", "/admin/backfill", RouteId::kList},
    {"POST", "/admin/backfill", RouteId::kStart},
    {"DELETE", "/admin/backfill/details", RouteId::kClearAll},
    {"GET", "/admin/backfill/{id}", RouteId::kGet},
    {"POST", "/admin/backfill/{id}/pause", RouteId::kPause},
    {"POST", "/admin/backfill/{id}/resume", RouteId::kResume},
    {"POST", "/admin/backfill/{id}/cancel", RouteId::kCancel},
    {"POST", "/admin/backfill/{id}/retry-failed", RouteId::kRetryFailed},
    {"DELETE", "/admin/backfill/{id}/details", RouteId::kClearOne},
    {"GET", "/admin/backfill/{id}/events", RouteId::kEvents},
    {"GET", "/admin/backfill/{id}/batches", RouteId::kBatches},
    {"GET", "/admin/jetstream/status", RouteId::kLive},
    {"GET", "/admin/jetstream/history", RouteId::kLiveHistory},
    {"GET", "/admin/collections", RouteId::kCollections},
    {"POST", "/admin/collections", RouteId::kChangeCollections},
    {"GET", "/admin/lexicons", RouteId::kLexicons},
    {"POST", "/admin/lexicons", RouteId::kAddLexicon},
    {"DELETE", "/admin/lexicons/{id}", RouteId::kRemoveLexicon},
    {"GET", "/metrics", RouteId::kMetrics},
};

// The longest job id segment a route takes; a longer one matches no route and is answered 404.
constexpr size_t kMaxIdSegment = 64;

// Segment by segment; a "{id}" segment matches any non-empty one, which goes to `id` when given.
bool MatchPath(std::string_view pattern, std::string_view path, std::string* id = nullptr);

bool IsProtected(std::string_view path);

// An unsigned decimal number (a job id, a query parameter), at most 2^64-1.
bool ParseUint(std::string_view text, uint64_t* out);

// A job id: 1 to 2^64-1 in decimal digits.
bool ParseJobId(std::string_view text, uint64_t* id);

// GET /admin/backfill/{id}/batches answers this many entries unless `limit` says, at most the
// second.
constexpr uint64_t kDefaultBatches = 1000;
constexpr uint64_t kMaxBatches = 10000;

Status ParseStringArray(simdjson::dom::element value, std::string_view field,
                        Status (*validate)(std::string_view), std::vector<std::string>* out);

Status ParseChoice(simdjson::dom::element value, std::string_view field,
                   std::initializer_list<std::string_view> choices, std::string* out);

// A request body: a JSON object whose fields `on_field` takes one at a time (a field given twice
// is refused before it sees it). Every problem is Invalid with a sentence for the client.
Status ForEachField(
    std::string_view body,
    const std::function<Status(std::string_view key, simdjson::dom::element value)>& on_field);

// The body of POST /admin/backfill.
Result<BackfillRequest> ParseBackfillRequest(std::string_view body);

// The body of POST /admin/collections.
Result<CollectionsRequest> ParseCollectionsRequest(std::string_view body);

std::string CollectionsJson(const CollectionsAnswer& a, bool change);
std::string LexiconsJson(const std::vector<LexiconInfo>& lexicons);
// POST (`added`) or DELETE /admin/lexicons.
std::string LexiconAnswerJson(const LexiconAnswer& a, bool added);

// --- Event streams ---

// Statuses after which a stream ends: nothing moves the job until someone acts.
bool EndsStream(state::JobStatus s);

std::string SseEvent(std::string_view name, std::string_view json);

struct EventStream {
  uint64_t id = 0;
  std::string pending;    // written by the first pump (the snapshot, maybe the end)
  bool finished = false;  // the end event is written or pending
  uint64_t next_stage = 0;
  state::JobRecord last;  // what the client has been told
  uint64_t queued_units = 0;
  uint64_t failed_blocks = 0;
  std::map<std::string, uint64_t> errors_by_kind;
  std::vector<state::HostSummary> hosts;
  std::vector<state::RecentRepo> recent;
  Clock::time_point last_poll;
  Clock::time_point last_write;

  void Remember(const JobDetails& d) {
    last = d.job;
    queued_units = d.queued_units;
    failed_blocks = d.failed_blocks;
    errors_by_kind = d.errors_by_kind;
    hosts = d.hosts;
    recent = d.recent;
  }
};

// A stream's place among max_event_streams, given back when the last holder lets go of it: the
// connection serving the stream, or the answer that would have opened it.
class StreamSlot {
 public:
  explicit StreamSlot(std::function<void()> release) : release_(std::move(release)) {}
  ~StreamSlot() { release_(); }
  StreamSlot(const StreamSlot&) = delete;
  StreamSlot& operator=(const StreamSlot&) = delete;

 private:
  std::function<void()> release_;
};

std::string EndEvent(uint64_t id, state::JobStatus status, std::string_view reason);

std::string CountersJson(const JobDetails& d, int64_t now_us);

std::string HostsJson(const JobDetails& d);

std::string StatusJson(const state::JobRecord& before, const state::JobRecord& now);

// Equal time-independent digests of two tokens, compared without an early exit, so the answer
// time tells nothing about how much of a guess was right (nor its length).
bool SameDigest(const Sha256Digest& a, const Sha256Digest& b);

std::string_view Trim(std::string_view s);

// --- HTTP transport ---

// A request head larger than this is refused with 431; a target longer than the second, 414.
constexpr size_t kMaxHeadBytes = 16 * 1024;
constexpr size_t kMaxTargetBytes = 8 * 1024;
// How long a connection closed after its answer may go on sending what the server will not read,
// so that the answer is not lost to a reset.
constexpr auto kLingerTime = std::chrono::seconds(1);

int HexValue(char c);

// %XX decoded (a malformed escape is kept as it is); in a query, '+' is a space as well.
std::string PercentDecode(std::string_view s, bool query);

// The target's path and query parameters, decoded, into `req`.
void SplitTarget(std::string_view target, Request* req);

// The head and body of a whole answer (the head only for HEAD), or the head of a stream's.
std::string SerializeAnswer(const Response& res, bool keep_alive, bool head_only);

// One chunk of a chunked answer.
std::string Chunk(std::string_view data);

constexpr std::string_view kLastChunk = "0\r\n\r\n";

// The answer to a request the transport refuses before any route sees it.
Response ProtocolError(int status);

}  // namespace atfill::admin
