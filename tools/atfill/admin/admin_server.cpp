#include "tools/atfill/admin/admin_server.hpp"
#include "base/low_port.hpp"

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

std::string FormatTime(int64_t unix_us) { return pipeline::FormatUtc(unix_us); }

namespace {

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

void WriteCounters(JsonWriter& w, const state::JobCounters& c) {
  w.BeginObject();
  w.Key("total_repos").Uint(c.total_repos).Key("resolved_repos").Uint(c.resolved_repos);
  w.Key("processed_repos").Uint(c.processed_repos).Key("total_records").Uint(c.total_records);
  w.Key("records_written").Uint(c.records_written).Key("failed_records").Uint(c.failed_records);
  w.Key("bytes").Uint(c.bytes).Key("events_read").Uint(c.events_read);
  for (const auto& [k, v] : c.extra) w.Key(k).Uint(v);
  w.EndObject();
}

void WriteProgress(JsonWriter& w, const state::JobRecord& job, int64_t now_us) {
  const auto p = pipeline::DeriveProgress(job, now_us);
  w.BeginObject();
  if (p.percent >= 0) {
    w.Key("percent").Double(p.percent);
  } else {
    w.Key("percent").Null();
  }
  w.Key("records_per_s").Double(p.records_per_s).Key("events_per_s").Double(p.events_per_s);
  if (p.eta_s >= 0) {
    w.Key("eta_s").Int(p.eta_s);
  } else {
    w.Key("eta_s").Null();
  }
  w.EndObject();
}

void WriteStopReason(JsonWriter& w, const state::StopReason& reason) {
  if (reason.empty()) {
    w.Null();
    return;
  }
  w.BeginObject().Key("code").String(reason.code);
  w.Key("sentence").String(reason.sentence).EndObject();
}

// What a running job waits for (JobRecord::waiting): null, or its code, sentence and start.
void WriteWaiting(JsonWriter& w, const state::JobRecord& job) {
  if (job.waiting.empty()) {
    w.Null();
    return;
  }
  w.BeginObject().Key("code").String(job.waiting.code);
  w.Key("sentence").String(job.waiting.sentence);
  w.Key("since").String(FormatTime(job.waiting_since_us)).EndObject();
}

// Job parameters that hold a list, one item a line (as the verbs store them): answered as arrays
// of strings, empty lines skipped.
constexpr std::string_view kListParams[] = {"blocks", "collections", "dids", "files", "hosts"};

void WriteParams(JsonWriter& w, const std::map<std::string, std::string>& params) {
  w.BeginObject();
  for (const auto& [k, v] : params) {
    w.Key(k);
    if (std::find(std::begin(kListParams), std::end(kListParams), k) == std::end(kListParams)) {
      w.String(v);
      continue;
    }
    w.BeginArray();
    std::string_view rest = v;
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      const std::string_view item = rest.substr(0, nl);
      if (!item.empty()) w.String(item);
      rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    }
    w.EndArray();
  }
  w.EndObject();
}

// The members of `atfill job --json`'s "job" object, into an object the caller opened, with the
// same names so the API and the CLI agree.
void WriteJobFields(JsonWriter& w, const state::JobRecord& job, int64_t now_us) {
  w.Key("id").Uint(job.id).Key("kind").String(job.kind);
  w.Key("status").String(state::JobStatusName(job.status));
  w.Key("stage").String(state::JobStageName(job.stage));
  w.Key("started_by").String(job.started_by);
  w.Key("created_at").String(FormatTime(job.created_us));
  w.Key("started_at").String(FormatTime(job.started_us));
  w.Key("updated_at").String(FormatTime(job.updated_us));
  w.Key("finished_at").String(FormatTime(job.finished_us));
  w.Key("heartbeat_at").String(FormatTime(job.heartbeat_us));
  w.Key("counters");
  WriteCounters(w, job.counters);
  w.Key("progress");
  WriteProgress(w, job, now_us);
  w.Key("stop_reason");
  WriteStopReason(w, job.stop_reason);
  w.Key("waiting");
  WriteWaiting(w, job);
  w.Key("params");
  WriteParams(w, job.params);
}

void WriteHosts(JsonWriter& w, const std::vector<state::HostSummary>& hosts) {
  w.BeginArray();
  for (const auto& h : hosts) {
    w.BeginObject().Key("host").String(h.host).Key("units").Uint(h.units);
    w.Key("done").Uint(h.done).Key("errors").Uint(h.errors).Key("records").Uint(h.records);
    w.EndObject();
  }
  w.EndArray();
}

void WriteRecent(JsonWriter& w, const std::vector<state::RecentRepo>& recent) {
  w.BeginArray();
  for (const auto& r : recent) {
    w.BeginObject().Key("seq").Uint(r.seq).Key("did").String(r.did).Key("host").String(r.host);
    w.Key("rev").String(r.rev).Key("records").Uint(r.records).Key("outcome").String(r.outcome);
    w.Key("fetched_at").String(FormatTime(r.fetched_at_us)).EndObject();
  }
  w.EndArray();
}

void WriteErrorsByKind(JsonWriter& w, const std::map<std::string, uint64_t>& counts) {
  w.BeginObject();
  for (const auto& [k, v] : counts) w.Key(k).Uint(v);
  w.EndObject();
}

void WriteStageChange(JsonWriter& w, uint64_t job_id, const StageChange& c) {
  w.BeginObject();
  if (job_id != 0) w.Key("id").Uint(job_id);
  w.Key("index").Uint(c.index);
  w.Key("from").String(state::JobStageName(c.from)).Key("to").String(state::JobStageName(c.to));
  w.Key("at").String(FormatTime(c.at_us)).EndObject();
}

std::string BatchesJson(uint64_t id, uint64_t from, const std::vector<state::BatchAudit>& batches) {
  JsonWriter w;
  w.BeginObject().Key("id").Uint(id).Key("batches").BeginArray();
  for (const auto& b : batches) {
    w.BeginObject().Key("batch").Uint(b.batch_no).Key("from").String(b.first_position);
    w.Key("to").String(b.last_position).Key("count").Uint(b.count);
    w.Key("failures").Uint(b.failures).Key("duration_us").Int(b.duration_us);
    w.Key("attempts").Uint(b.attempts).Key("committed_at").String(FormatTime(b.committed_at_us));
    w.Key("committed_us").Int(b.committed_at_us).EndObject();
  }
  w.EndArray();
  w.Key("next").Uint(batches.empty() ? from : batches.back().batch_no + 1);
  w.EndObject();
  return w.Take();
}

std::string LiveHistoryJson(const std::vector<LiveSample>& samples, int64_t interval_ms) {
  JsonWriter w;
  w.BeginObject().Key("interval_ms").Int(interval_ms).Key("samples").BeginArray();
  for (const auto& s : samples) {
    w.BeginObject().Key("at_us").Int(s.at_us).Key("lag_s");
    if (s.lag_s >= 0) {
      w.Double(s.lag_s);
    } else {
      w.Null();
    }
    w.Key("cursor").Uint(s.cursor).EndObject();
  }
  w.EndArray().EndObject();
  return w.Take();
}

std::string ErrorJson(std::string_view message) {
  JsonWriter w;
  w.BeginObject().Key("error").String(message).EndObject();
  return w.Take();
}

void WriteLabels(JsonWriter& w, const LabelsStatus& l) {
  w.BeginObject().Key("configured").Bool(l.configured);
  {
    w.Key("status").String(l.status).Key("job_id");
    if (l.job_id != 0) {
      w.Uint(l.job_id);
    } else {
      w.Null();
    }
    w.Key("labelers").BeginArray();
    for (const LabelerCursor& c : l.labelers) {
      w.BeginObject().Key("did").String(c.did).Key("cursor").Uint(c.cursor).EndObject();
    }
    w.EndArray();
    w.Key("labels_per_s").Double(l.labels_per_s);
    w.Key("frames").Uint(l.frames).Key("labels").Uint(l.labels);
    w.Key("stored").Uint(l.stored).Key("negated").Uint(l.negated).Key("stale").Uint(l.stale);
    w.Key("refused").Uint(l.refused).Key("refused_by").BeginObject();
    for (const auto& [kind, n] : l.refused_by) w.Key(kind).Uint(n);
    w.EndObject();
    w.Key("bad_frames").Uint(l.bad_frames).Key("connection_errors").Uint(l.connection_errors);
    w.Key("error");
    if (!l.error.empty()) {
      w.String(l.error);
    } else {
      w.Null();
    }
  }
  w.EndObject();
}

std::string LiveJson(const LiveStatus& live) {
  JsonWriter w;
  w.BeginObject().Key("configured").Bool(live.configured);
  if (live.configured) {
    w.Key("status").String(live.status).Key("host").String(live.host);
    w.Key("protocol").String(live.protocol).Key("cursor").Uint(live.cursor);
    w.Key("witnessed_at").String(FormatTime(live.witnessed_us));
    w.Key("witnessed_us").Int(live.witnessed_us);
    w.Key("lag_s");
    if (live.lag_s >= 0) {
      w.Double(live.lag_s);
    } else {
      w.Null();
    }
    w.Key("events_per_s").Double(live.events_per_s);
    w.Key("records_per_s").Double(live.records_per_s);
    w.Key("job_id");
    if (live.job_id != 0) {
      w.Uint(live.job_id);
    } else {
      w.Null();
    }
    w.Key("error");
    if (!live.error.empty()) {
      w.String(live.error);
    } else {
      w.Null();
    }
  }
  if (live.labels.configured) {
    w.Key("labels");
    WriteLabels(w, live.labels);
  }
  w.EndObject();
  return w.Take();
}

// --- HTTP answers ---

int HttpStatusFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kInvalid:
      return 400;
    case StatusCode::kUnsupported:
      return 409;
    case StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

void SendJson(Response& res, int status, std::string body) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_content(std::move(body), kJsonType);
}

void SendError(Response& res, int status, std::string_view message) {
  SendJson(res, status, ErrorJson(message));
}

void SendStatus(Response& res, const Status& s) {
  SendError(res, HttpStatusFor(s), s.message().empty() ? s.ToString() : s.message());
}

void SendUnauthorized(Response& res) {
  res.set_header("WWW-Authenticate", "Bearer realm=\"atfill admin\"");
  SendError(res, 401, "missing or wrong bearer token (Authorization: Bearer <token>)");
}

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
  kMetrics,
};

struct Route {
  std::string_view method;
  std::string_view pattern;  // "{id}" stands for one path segment, the job id
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
    {"GET", "/metrics", RouteId::kMetrics},
};

// The longest job id segment a route takes; a longer one matches no route and is answered 404.
constexpr size_t kMaxIdSegment = 64;

// Segment by segment; a "{id}" segment matches any non-empty one, which goes to `id` when given.
bool MatchPath(std::string_view pattern, std::string_view path, std::string* id = nullptr) {
  for (;;) {
    const size_t p = pattern.find('/', 1);
    const size_t q = path.find('/', 1);
    const std::string_view pseg = pattern.substr(0, p);
    const std::string_view qseg = path.substr(0, q);
    if (pseg == "/{id}") {
      if (qseg.size() < 2) return false;
      if (id != nullptr) *id = std::string(qseg.substr(1));
    } else if (pseg != qseg) {
      return false;
    }
    if (p == std::string_view::npos || q == std::string_view::npos) {
      return p == std::string_view::npos && q == std::string_view::npos;
    }
    pattern.remove_prefix(p);
    path.remove_prefix(q);
  }
}

bool IsProtected(std::string_view path) {
  return path == "/admin" || path.starts_with("/admin/") || path == "/metrics" ||
         path.starts_with("/metrics/");
}

// An unsigned decimal number (a job id, a query parameter), at most 2^64-1.
bool ParseUint(std::string_view text, uint64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - digit) / 10) return false;
    v = v * 10 + digit;
  }
  *out = v;
  return true;
}

// A job id: 1 to 2^64-1 in decimal digits.
bool ParseJobId(std::string_view text, uint64_t* id) { return ParseUint(text, id) && *id != 0; }

// GET /admin/backfill/{id}/batches answers this many entries unless `limit` says, at most the
// second.
constexpr uint64_t kDefaultBatches = 1000;
constexpr uint64_t kMaxBatches = 10000;

Status ParseStringArray(simdjson::dom::element value, std::string_view field,
                        Status (*validate)(std::string_view), std::vector<std::string>* out) {
  simdjson::dom::array array;
  if (value.get_array().get(array) != simdjson::SUCCESS) {
    return Status::Invalid("'" + std::string(field) + "' must be an array of strings");
  }
  size_t i = 0;
  for (simdjson::dom::element item : array) {
    std::string_view s;
    const std::string where = std::string(field) + "[" + std::to_string(i) + "]";
    if (item.get_string().get(s) != simdjson::SUCCESS) {
      return Status::Invalid("'" + where + "' must be a string");
    }
    if (Status st = validate(s); !st.ok()) return Status::Invalid(where + ": " + st.message());
    out->emplace_back(s);
    ++i;
  }
  return Status::OK();
}

Status ParseChoice(simdjson::dom::element value, std::string_view field,
                   std::initializer_list<std::string_view> choices, std::string* out) {
  std::string_view s;
  std::string names;
  for (std::string_view c : choices) names += (names.empty() ? "" : ", ") + std::string(c);
  if (value.get_string().get(s) != simdjson::SUCCESS) {
    return Status::Invalid("'" + std::string(field) + "' must be a string: one of " + names);
  }
  for (std::string_view c : choices) {
    if (s == c) {
      *out = std::string(s);
      return Status::OK();
    }
  }
  return Status::Invalid("'" + std::string(field) + "' is '" + std::string(s) + "', not one of " +
                         names);
}

// A request body: a JSON object whose fields `on_field` takes one at a time (a field given twice
// is refused before it sees it). Every problem is Invalid with a sentence for the client.
Status ForEachField(
    std::string_view body,
    const std::function<Status(std::string_view key, simdjson::dom::element value)>& on_field) {
  simdjson::dom::parser parser;
  const simdjson::padded_string padded(body);
  simdjson::dom::element root;
  if (auto err = parser.parse(padded).get(root); err != simdjson::SUCCESS) {
    return Status::Invalid(std::string("the body is not JSON: ") + simdjson::error_message(err));
  }
  simdjson::dom::object object;
  if (root.get_object().get(object) != simdjson::SUCCESS) {
    return Status::Invalid("the body must be a JSON object");
  }
  std::set<std::string_view> seen;
  for (simdjson::dom::key_value_pair field : object) {
    if (!seen.insert(field.key).second) {
      return Status::Invalid("field '" + std::string(field.key) + "' appears twice");
    }
    ATFILL_RETURN_IF_ERROR(on_field(field.key, field.value));
  }
  return Status::OK();
}

// The body of POST /admin/backfill.
Result<BackfillRequest> ParseBackfillRequest(std::string_view body) {
  BackfillRequest request;
  ATFILL_RETURN_IF_ERROR(ForEachField(body, [&](std::string_view key, auto value) -> Status {
    if (key == "collections") {
      return ParseStringArray(value, key, atproto::ValidateNsid, &request.collections);
    }
    if (key == "dids") return ParseStringArray(value, key, atproto::ValidateDid, &request.dids);
    if (key == "source")
      return ParseChoice(value, key, {"crawl", "auto", "replay"}, &request.source);
    if (key == "mode") return ParseChoice(value, key, {"listRecords", "getRepo"}, &request.mode);
    return Status::Invalid("unknown field '" + std::string(key) +
                           "' (known: collections, dids, source, mode)");
  }));
  if (request.collections.empty() && request.dids.empty()) {
    return Status::Invalid("give at least one of 'collections' or 'dids'");
  }
  return request;
}

// The body of POST /admin/collections.
Result<CollectionsRequest> ParseCollectionsRequest(std::string_view body) {
  CollectionsRequest request;
  ATFILL_RETURN_IF_ERROR(ForEachField(body, [&](std::string_view key, auto value) -> Status {
    if (key == "add") return ParseStringArray(value, key, atproto::ValidateNsid, &request.add);
    if (key == "remove") {
      return ParseStringArray(value, key, atproto::ValidateNsid, &request.remove);
    }
    if (key == "backfill" || key == "purge") {
      if (value.get(key == "backfill" ? request.backfill : request.purge) != simdjson::SUCCESS) {
        return Status::Invalid("field '" + std::string(key) + "' must be true or false");
      }
      return Status::OK();
    }
    return Status::Invalid("unknown field '" + std::string(key) +
                           "' (known: add, remove, backfill, purge)");
  }));
  if (request.add.empty() && request.remove.empty()) {
    return Status::Invalid("give at least one of 'add' or 'remove'");
  }
  return request;
}

std::string CollectionsJson(const CollectionsAnswer& a, bool change) {
  JsonWriter w;
  w.BeginObject().Key("collections").BeginArray();
  for (const auto& c : a.collections) w.String(c);
  w.EndArray();
  if (change) {
    w.Key("added").BeginArray();
    for (const auto& c : a.added) w.String(c);
    w.EndArray().Key("removed").BeginArray();
    for (const auto& c : a.removed) w.String(c);
    w.EndArray();
    if (a.backfill_job != 0) {
      w.Key("backfill_job").Uint(a.backfill_job);
    } else {
      w.Key("backfill_job").Null();
    }
    w.Key("purged").BeginObject();
    for (const auto& [c, n] : a.purged) w.Key(c).Uint(n);
    w.EndObject();
  }
  w.EndObject();
  return w.Take();
}

// --- Event streams ---

// Statuses after which a stream ends: nothing moves the job until someone acts.
bool EndsStream(state::JobStatus s) {
  return state::IsTerminal(s) || s == state::JobStatus::kPaused;
}

std::string SseEvent(std::string_view name, std::string_view json) {
  // JsonWriter writes one line (control characters in strings are escaped), as SSE needs.
  std::string out;
  out.reserve(name.size() + json.size() + 16);
  out.append("event: ").append(name).append("\ndata: ").append(json).append("\n\n");
  return out;
}

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

std::string EndEvent(uint64_t id, state::JobStatus status, std::string_view reason) {
  JsonWriter w;
  w.BeginObject().Key("id").Uint(id).Key("status").String(state::JobStatusName(status));
  w.Key("reason").String(reason).EndObject();
  return SseEvent("end", w.str());
}

std::string CountersJson(const JobDetails& d, int64_t now_us) {
  JsonWriter w;
  w.BeginObject().Key("id").Uint(d.job.id).Key("counters");
  WriteCounters(w, d.job.counters);
  w.Key("progress");
  WriteProgress(w, d.job, now_us);
  w.Key("queued_units").Uint(d.queued_units).Key("failed_blocks").Uint(d.failed_blocks);
  w.Key("errors_by_kind");
  WriteErrorsByKind(w, d.errors_by_kind);
  w.Key("updated_at").String(FormatTime(d.job.updated_us));
  w.Key("heartbeat_at").String(FormatTime(d.job.heartbeat_us));
  w.Key("waiting");
  WriteWaiting(w, d.job);
  w.EndObject();
  return w.Take();
}

std::string HostsJson(const JobDetails& d) {
  JsonWriter w;
  w.BeginObject().Key("id").Uint(d.job.id).Key("hosts");
  WriteHosts(w, d.hosts);
  w.Key("recent");
  WriteRecent(w, d.recent);
  w.EndObject();
  return w.Take();
}

std::string StatusJson(const state::JobRecord& before, const state::JobRecord& now) {
  JsonWriter w;
  w.BeginObject().Key("id").Uint(now.id);
  w.Key("from").String(state::JobStatusName(before.status));
  w.Key("to").String(state::JobStatusName(now.status));
  w.Key("stage").String(state::JobStageName(now.stage));
  w.Key("stop_reason");
  WriteStopReason(w, now.stop_reason);
  w.Key("finished_at").String(FormatTime(now.finished_us));
  w.EndObject();
  return w.Take();
}

// Equal time-independent digests of two tokens, compared without an early exit, so the answer
// time tells nothing about how much of a guess was right (nor its length).
bool SameDigest(const Sha256Digest& a, const Sha256Digest& b) {
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = static_cast<uint8_t>(diff | (a[i] ^ b[i]));
  return diff == 0;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// --- HTTP transport ---

// A request head larger than this is refused with 431; a target longer than the second, 414.
constexpr size_t kMaxHeadBytes = 16 * 1024;
constexpr size_t kMaxTargetBytes = 8 * 1024;
// How long a connection closed after its answer may go on sending what the server will not read,
// so that the answer is not lost to a reset.
constexpr auto kLingerTime = std::chrono::seconds(1);

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX decoded (a malformed escape is kept as it is); in a query, '+' is a space as well.
std::string PercentDecode(std::string_view s, bool query) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out += static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2]));
      i += 2;
    } else if (query && s[i] == '+') {
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return out;
}

// The target's path and query parameters, decoded, into `req`.
void SplitTarget(std::string_view target, Request* req) {
  const size_t q = target.find('?');
  req->path = PercentDecode(target.substr(0, q), false);
  if (q == std::string_view::npos) return;
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    rest.remove_prefix(amp == std::string_view::npos ? rest.size() : amp + 1);
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    req->params.emplace(
        PercentDecode(pair.substr(0, eq), true),
        eq == std::string_view::npos ? std::string() : PercentDecode(pair.substr(eq + 1), true));
  }
}

// The head and body of a whole answer (the head only for HEAD), or the head of a stream's.
std::string SerializeAnswer(const Response& res, bool keep_alive, bool head_only) {
  const auto status = static_cast<unsigned>(res.status);
  std::string out = "HTTP/1.1 " + std::to_string(status) + " ";
  const beast::string_view reason = http::obsolete_reason(http::int_to_status(status));
  out.append(reason.data(), reason.size());
  out += "\r\n";
  for (const auto& [name, value] : res.headers)
    out.append(name).append(": ").append(value) += "\r\n";
  if (res.stream) {
    out += "Transfer-Encoding: chunked\r\n";
  } else {
    out += "Content-Length: " + std::to_string(res.body.size()) + "\r\n";
  }
  if (!keep_alive) out += "Connection: close\r\n";
  out += "\r\n";
  if (!head_only && !res.stream) out += res.body;
  return out;
}

// One chunk of a chunked answer.
std::string Chunk(std::string_view data) {
  char size[20];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string out(size);
  out.append(data) += "\r\n";
  return out;
}

constexpr std::string_view kLastChunk = "0\r\n\r\n";

// The answer to a request the transport refuses before any route sees it.
Response ProtocolError(int status) {
  Response res;
  const char* what = status == 413   ? "the request body is too large"
                     : status == 414 ? "the request URI is too long"
                     : status == 431 ? "the request head is too large"
                                     : "malformed request";
  SendError(res, status, what);
  return res;
}

}  // namespace

// --- Public JSON ---

std::string JobJson(const state::JobRecord& job, int64_t now_us) {
  JsonWriter w;
  w.BeginObject();
  WriteJobFields(w, job, now_us);
  w.EndObject();
  return w.Take();
}

std::string JobSummaryJson(const JobSummary& job, int64_t now_us) {
  JsonWriter w;
  w.BeginObject();
  WriteJobFields(w, job.job, now_us);
  w.Key("queued_units").Uint(job.queued_units);
  w.EndObject();
  return w.Take();
}

std::string JobDetailsJson(const JobDetails& d, const std::vector<StageChange>& changes,
                           int64_t now_us) {
  JsonWriter w;
  w.BeginObject();
  WriteJobFields(w, d.job, now_us);
  w.Key("queued_units").Uint(d.queued_units);
  w.Key("hosts");
  WriteHosts(w, d.hosts);
  w.Key("recent");
  WriteRecent(w, d.recent);
  w.Key("failed_blocks").Uint(d.failed_blocks);
  w.Key("errors_by_kind");
  WriteErrorsByKind(w, d.errors_by_kind);
  w.Key("stage_changes").BeginArray();
  for (const auto& c : changes) WriteStageChange(w, 0, c);
  w.EndArray();
  w.EndObject();
  return w.Take();
}

// --- Options ---

Status AdminServerOptions::Validate() const {
  if (address.empty()) return Status::Invalid("admin address is empty");
  if (token.empty()) {
    return Status::Invalid("admin token is empty: the admin API does not run without one");
  }
  for (char c : token) {
    if (c <= ' ' || c > '~') {
      return Status::Invalid("admin token must be printable ASCII without spaces");
    }
  }
  if (sse_interval_ms < 10 || sse_interval_ms > 60000) {
    return Status::Invalid("admin sse_interval_ms must be 10..60000, not " +
                           std::to_string(sse_interval_ms));
  }
  if (keepalive_interval_ms < sse_interval_ms) {
    return Status::Invalid("admin keepalive_interval_ms must be at least sse_interval_ms");
  }
  if (threads < 2 || threads > 1024) return Status::Invalid("admin threads must be 2..1024");
  if (max_event_streams < 1 || max_event_streams >= threads) {
    return Status::Invalid("admin max_event_streams must be 1..threads-1");
  }
  if (max_body_bytes < 1024) return Status::Invalid("admin max_body_bytes must be at least 1024");
  if (max_connections <= max_event_streams || max_connections > 100000) {
    return Status::Invalid("admin max_connections must be max_event_streams+1..100000, not " +
                           std::to_string(max_connections));
  }
  if (header_timeout_s < 1 || body_timeout_s < 1 || idle_timeout_s < 1 || io_timeout_s < 1) {
    return Status::Invalid(
        "admin header_timeout_s, body_timeout_s, idle_timeout_s and io_timeout_s must be at "
        "least 1");
  }
  return Status::OK();
}

// --- The server ---

struct AdminServer::Impl {
  class Connection;

  AdminServerOptions options;
  AdminBackend* backend = nullptr;
  Metrics* metrics = nullptr;
  Sha256Digest token_digest{};
  uint16_t port = 0;
  bool started = false;

  std::mutex stop_mu;  // serialises Start and Stop
  bool stopped = false;

  // Stop waits on cv for the open event streams to end.
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  int open_streams = 0;

  // The sockets are served by one I/O thread running ioc, the handlers by the workers. After mu
  // and cv: a handler ioc still holds when it is destroyed may release a stream's slot.
  std::optional<asio::io_context> ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::steady_timer> accept_retry;
  std::optional<asio::thread_pool> workers;
  std::thread io_thread;
  // The open connections; only the I/O thread touches the list.
  std::list<std::shared_ptr<Connection>> connections;

  bool Stopping() {
    std::lock_guard<std::mutex> lock(mu);
    return stopping;
  }
  void Accept();
  void OnAccept(const beast::error_code& ec, tcp::socket socket);
  bool MakeRoom();
  // Routes one request and runs its handler; on a worker.
  void Serve(Request& req, Response& res);

  bool Authorized(const Request& req) const;
  void Handle(const Route& route, const Request& req, Response& res);
  void NoRoute(const Request& req, Response& res);
  void ServeFile(const EmbeddedFile& file, Response& res) const;

  void List(Response& res);
  void StartBackfill(const Request& req, Response& res);
  void Get(uint64_t id, Response& res);
  void Steer(RouteId route, uint64_t id, Response& res);
  void RetryFailed(uint64_t id, Response& res);
  void ClearOne(uint64_t id, Response& res);
  void ClearAll(Response& res);
  void Events(uint64_t id, Response& res);
  void Batches(uint64_t id, const Request& req, Response& res);
  void Live(Response& res);
  void LiveHistory(Response& res);
  void Collections(Response& res);
  void ChangeCollections(const Request& req, Response& res);
  void ServeMetrics(Response& res);

  std::string Poll(EventStream& stream);
};

bool AdminServer::Impl::Authorized(const Request& req) const {
  if (!req.has_header("Authorization")) return false;
  const std::string value = req.get_header_value("Authorization");
  std::string_view v = value;
  // The scheme is case-insensitive (RFC 7235).
  constexpr std::string_view kScheme = "bearer ";
  if (v.size() <= kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(v[i])) != kScheme[i]) return false;
  }
  const std::string_view given = Trim(v.substr(kScheme.size()));
  return SameDigest(Sha256(AsBytes(given)), token_digest);
}

void AdminServer::Impl::ServeFile(const EmbeddedFile& file, Response& res) const {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Content-Security-Policy", kPagePolicy);
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_header("X-Frame-Options", "DENY");
  res.set_content(file.bytes.data(), file.bytes.size(),
                  std::string(file.content_type) + "; charset=utf-8");
}

void AdminServer::Impl::Handle(const Route& route, const Request& req, Response& res) {
  if (!Authorized(req)) return SendUnauthorized(res);
  uint64_t id = 0;
  if (route.pattern.find("{id}") != std::string_view::npos) {
    const std::string& text = req.id_segment;
    if (!ParseJobId(text, &id)) return SendError(res, 404, "no job '" + text + "'");
  }
  switch (route.id) {
    case RouteId::kList:
      return List(res);
    case RouteId::kStart:
      return StartBackfill(req, res);
    case RouteId::kClearAll:
      return ClearAll(res);
    case RouteId::kGet:
      return Get(id, res);
    case RouteId::kPause:
    case RouteId::kResume:
    case RouteId::kCancel:
      return Steer(route.id, id, res);
    case RouteId::kRetryFailed:
      return RetryFailed(id, res);
    case RouteId::kClearOne:
      return ClearOne(id, res);
    case RouteId::kEvents:
      return Events(id, res);
    case RouteId::kBatches:
      return Batches(id, req, res);
    case RouteId::kLive:
      return Live(res);
    case RouteId::kLiveHistory:
      return LiveHistory(res);
    case RouteId::kCollections:
      return Collections(res);
    case RouteId::kChangeCollections:
      return ChangeCollections(req, res);
    case RouteId::kMetrics:
      return ServeMetrics(res);
  }
  SendError(res, 500, "unhandled route");
}

// A request no route or file takes: 401 first on protected paths, 405 when another method has
// the path, else 404.
void AdminServer::Impl::NoRoute(const Request& req, Response& res) {
  const std::string& path = req.path;
  if (IsProtected(path) && !Authorized(req)) {
    return SendUnauthorized(res);
  }
  const std::string_view method = req.method == "HEAD" ? "GET" : std::string_view(req.method);
  std::string allow;
  bool same_method = false;
  for (const Route& r : kRoutes) {
    if (!MatchPath(r.pattern, path)) continue;
    if (r.method == method) same_method = true;
    if (allow.find(r.method) == std::string::npos) {
      allow += (allow.empty() ? "" : ", ") + std::string(r.method);
    }
  }
  for (const EmbeddedFile& f : DashboardFiles()) {
    if (f.path == path) allow = "GET, HEAD";
  }
  if (same_method) {
    // Only an id too long for the route's pattern gets here.
    SendError(res, 404, "no such job");
  } else if (!allow.empty()) {
    res.set_header("Allow", allow);
    SendError(res, 405,
              "method " + req.method + " is not allowed on " + path + " (allowed: " + allow + ")");
  } else {
    SendError(res, 404, "no route " + path);
  }
}

void AdminServer::Impl::List(Response& res) {
  auto jobs = backend->ListJobs();
  if (!jobs.ok()) return SendStatus(res, jobs.status());
  const int64_t now = pipeline::NowMicros();
  JsonWriter w;
  w.BeginObject().Key("jobs").BeginArray();
  for (const auto& j : *jobs) w.Raw(JobSummaryJson(j, now));
  w.EndArray().EndObject();
  SendJson(res, 200, w.Take());
}

void AdminServer::Impl::Collections(Response& res) {
  auto answer = backend->Collections();
  if (!answer.ok()) return SendStatus(res, answer.status());
  SendJson(res, 200, CollectionsJson(*answer, false));
}

void AdminServer::Impl::ChangeCollections(const Request& req, Response& res) {
  auto request = ParseCollectionsRequest(req.body);
  if (!request.ok()) return SendError(res, 400, request.status().message());
  auto answer = backend->ChangeCollections(*request);
  if (!answer.ok()) return SendStatus(res, answer.status());
  SendJson(res, 200, CollectionsJson(*answer, true));
}

void AdminServer::Impl::StartBackfill(const Request& req, Response& res) {
  auto request = ParseBackfillRequest(req.body);
  if (!request.ok()) return SendError(res, 400, request.status().message());
  auto id = backend->StartBackfill(*request);
  if (!id.ok()) return SendStatus(res, id.status());
  JsonWriter w;
  w.BeginObject().Key("id").Uint(*id).EndObject();
  SendJson(res, 202, w.Take());
}

void AdminServer::Impl::Get(uint64_t id, Response& res) {
  auto changes = backend->StageChanges(id, 0);
  if (!changes.ok()) return SendStatus(res, changes.status());
  auto details = backend->GetJob(id);
  if (!details.ok()) return SendStatus(res, details.status());
  SendJson(res, 200, JobDetailsJson(*details, *changes, pipeline::NowMicros()));
}

void AdminServer::Impl::Steer(RouteId route, uint64_t id, Response& res) {
  Result<state::JobRecord> job = route == RouteId::kPause    ? backend->Pause(id)
                                 : route == RouteId::kResume ? backend->Resume(id)
                                                             : backend->Cancel(id);
  if (!job.ok()) return SendStatus(res, job.status());
  SendJson(res, 202, JobJson(*job, pipeline::NowMicros()));
}

void AdminServer::Impl::RetryFailed(uint64_t id, Response& res) {
  auto retry = backend->RetryFailed(id);
  if (!retry.ok()) return SendStatus(res, retry.status());
  JsonWriter w;
  w.BeginObject().Key("id").Uint(*retry).Key("retry_of").Uint(id).EndObject();
  SendJson(res, 202, w.Take());
}

void AdminServer::Impl::ClearOne(uint64_t id, Response& res) {
  if (Status s = backend->ClearDetails(id); !s.ok()) return SendStatus(res, s);
  JsonWriter w;
  w.BeginObject().Key("id").Uint(id).Key("cleared").Bool(true).EndObject();
  SendJson(res, 200, w.Take());
}

void AdminServer::Impl::ClearAll(Response& res) {
  auto cleared = backend->ClearAllDetails();
  if (!cleared.ok()) return SendStatus(res, cleared.status());
  JsonWriter w;
  w.BeginObject().Key("cleared").Uint(*cleared).EndObject();
  SendJson(res, 200, w.Take());
}

void AdminServer::Impl::Live(Response& res) {
  auto live = backend->Live();
  if (!live.ok()) return SendStatus(res, live.status());
  SendJson(res, 200, LiveJson(*live));
}

void AdminServer::Impl::Batches(uint64_t id, const Request& req, Response& res) {
  uint64_t from = 0;
  uint64_t limit = kDefaultBatches;
  if (req.has_param("from") && !ParseUint(req.get_param_value("from"), &from)) {
    return SendError(res, 400, "'from' must be a batch number (0 or more)");
  }
  if (req.has_param("limit") &&
      (!ParseUint(req.get_param_value("limit"), &limit) || limit == 0 || limit > kMaxBatches)) {
    return SendError(res, 400, "'limit' must be 1.." + std::to_string(kMaxBatches));
  }
  auto batches = backend->Batches(id, from, static_cast<size_t>(limit));
  if (!batches.ok()) return SendStatus(res, batches.status());
  SendJson(res, 200, BatchesJson(id, from, *batches));
}

void AdminServer::Impl::LiveHistory(Response& res) {
  int64_t interval_ms = 0;
  auto samples = backend->LiveHistory(&interval_ms);
  if (!samples.ok()) return SendStatus(res, samples.status());
  SendJson(res, 200, LiveHistoryJson(*samples, interval_ms));
}

void AdminServer::Impl::ServeMetrics(Response& res) {
  // A backend that cannot answer leaves the gauges as they were: the scrape still serves the
  // counters the engine keeps.
  auto jobs = backend->ListJobs();
  auto live = backend->Live();
  if (jobs.ok()) metrics->Refresh(*jobs, live.ok() ? *live : LiveStatus{});
  res.status = 200;
  res.set_header("Cache-Control", "no-store");
  res.set_content(metrics->Serialize(), kMetricsType);
}

void AdminServer::Impl::Events(uint64_t id, Response& res) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping) return SendError(res, 503, "the admin server is stopping");
    if (open_streams >= options.max_event_streams) {
      return SendError(res, 503,
                       "too many open event streams (" + std::to_string(options.max_event_streams) +
                           "); try again later");
    }
    ++open_streams;
  }
  auto slot = std::make_shared<StreamSlot>([this] {
    {
      std::lock_guard<std::mutex> lock(mu);
      --open_streams;
    }
    cv.notify_all();  // Stop waits for the last stream
  });
  // The transitions first, then the job: a transition that happens in between is sent as a
  // stage event even though the snapshot shows its result; none is lost.
  auto changes = backend->StageChanges(id, 0);
  if (!changes.ok()) return SendStatus(res, changes.status());
  auto details = backend->GetJob(id);
  if (!details.ok()) return SendStatus(res, details.status());
  auto stream = std::make_shared<EventStream>();
  stream->id = id;
  stream->next_stage = changes->empty() ? 0 : changes->back().index + 1;
  stream->pending = SseEvent("snapshot", JobDetailsJson(*details, *changes, pipeline::NowMicros()));
  stream->Remember(*details);
  if (EndsStream(details->job.status)) {
    stream->pending += EndEvent(id, details->job.status, "final");
    stream->finished = true;
  }
  stream->last_poll = stream->last_write = Clock::now();
  res.status = 200;
  res.set_header("Cache-Control", "no-store");
  res.set_header("X-Accel-Buffering", "no");
  res.set_header("Content-Type", "text/event-stream");
  res.stream = std::move(stream);
  res.slot = std::move(slot);
}

// One poll of a stream's job: the events for what changed since the last, in the order stage
// transitions, counters, hosts, status, then end when the status ends the stream.
std::string AdminServer::Impl::Poll(EventStream& s) {
  std::string out;
  const auto fail = [&](const Status& st) {
    out += SseEvent("error", ErrorJson(st.message().empty() ? st.ToString() : st.message()));
    out += EndEvent(s.id, s.last.status, "error");
    s.finished = true;
    return out;
  };
  // The job first, then its transitions: a backend records a transition before the status that
  // follows it, so when this job shows a final status every transition is in the list.
  auto details = backend->GetJob(s.id);
  if (!details.ok()) return fail(details.status());
  auto changes = backend->StageChanges(s.id, s.next_stage);
  if (!changes.ok()) return fail(changes.status());
  for (const StageChange& c : *changes) {
    if (c.index < s.next_stage) continue;
    JsonWriter w;
    WriteStageChange(w, s.id, c);
    out += SseEvent("stage", w.str());
    s.next_stage = c.index + 1;
  }
  const JobDetails& d = *details;
  if (d.job.counters != s.last.counters || d.queued_units != s.queued_units ||
      d.failed_blocks != s.failed_blocks || d.errors_by_kind != s.errors_by_kind) {
    out += SseEvent("counters", CountersJson(d, pipeline::NowMicros()));
  }
  if (d.hosts != s.hosts || d.recent != s.recent) out += SseEvent("hosts", HostsJson(d));
  if (d.job.status != s.last.status) out += SseEvent("status", StatusJson(s.last, d.job));
  s.Remember(d);
  if (EndsStream(d.job.status)) {
    out += EndEvent(s.id, d.job.status, "final");
    s.finished = true;
  }
  return out;
}

// --- The transport ---

// One client connection, driven on the I/O thread: its request is read under the header and body
// deadlines, handed to a worker, and its answer written under the write deadline; an event
// stream's polls run on a worker too, between timer ticks. Every handler checks for kClosed
// first: Close() (a deadline, eviction, Stop) may have run while it was pending.
class AdminServer::Impl::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Impl& server, tcp::socket socket)
      : server_(server), stream_(std::move(socket)), timer_(stream_.get_executor()) {}

  void Start(std::list<std::shared_ptr<Connection>>::iterator entry) {
    entry_ = entry;
    since_ = Clock::now();
    ReadHead();
  }

  // Waiting on its client: for a request, the rest of one, or to go away after its answer.
  bool Waiting() const { return phase_ == Phase::kWaiting; }
  // Since when it has been waiting.
  Clock::time_point since() const { return since_; }

  // An event stream's next tick comes now (Stop ends the streams this way).
  void WakeStream() {
    if (sse_) timer_.cancel();
  }

  void Close() {
    if (phase_ == Phase::kClosed) return;
    auto self = shared_from_this();
    phase_ = Phase::kClosed;
    server_.connections.erase(entry_);
    timer_.cancel();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    sse_.reset();
    slot_.reset();
  }

 private:
  enum class Phase : uint8_t { kWaiting, kBusy, kClosed };
  // What follows a write.
  enum class Then : uint8_t { kNextRequest, kLinger, kStream, kStreamEnded };

  void ReadHead() {
    phase_ = Phase::kWaiting;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(kMaxHeadBytes));
    parser_->body_limit(server_.options.max_body_bytes);
    stream_.expires_after(std::chrono::seconds(server_.options.header_timeout_s));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHead(ec); });
  }

  void OnHead(const beast::error_code& ec) {
    if (phase_ == Phase::kClosed) return;
    if (ec == beast::error::timeout) return Fail("admin_header_timeout");
    if (ec == http::error::header_limit) return Refuse(431);
    // A Content-Length over body_limit is refused as soon as the head is in.
    if (ec == http::error::body_limit) return Refuse(413);
    if (ec) return ClosedOrMalformed(ec);
    if (parser_->get().target().size() > kMaxTargetBytes) return Refuse(414);
    if (parser_->is_done()) return Dispatch();
    if (parser_->content_length() && *parser_->content_length() > server_.options.max_body_bytes) {
      return Refuse(413);
    }
    stream_.expires_after(std::chrono::seconds(server_.options.body_timeout_s));
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(const beast::error_code& ec) {
    if (phase_ == Phase::kClosed) return;
    if (ec == beast::error::timeout) return Fail("admin_body_timeout");
    if (ec == http::error::body_limit) return Refuse(413);
    if (ec) return ClosedOrMalformed(ec);
    Dispatch();
  }

  // A read ended early: the client went away (nothing to answer), or sent what is not HTTP.
  void ClosedOrMalformed(const beast::error_code& ec) {
    if (ec.category() == http::make_error_code(http::error::bad_target).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      return Refuse(400);
    }
    Close();
  }

  void Fail(std::string_view kind) {
    server_.metrics->AddErrors(kind);
    Close();
  }

  // Answers a request no handler sees, then closes: what follows it in the stream cannot be
  // trusted to start a request.
  void Refuse(int status) {
    server_.metrics->AddErrors("admin_bad_request");
    keep_alive_ = false;
    head_only_ = false;
    Write(SerializeAnswer(ProtocolError(status), false, false), Then::kLinger);
  }

  void Dispatch() {
    phase_ = Phase::kBusy;
    stream_.expires_never();
    http::request<http::string_body> msg = parser_->release();
    parser_.reset();
    keep_alive_ = msg.keep_alive();
    head_only_ = msg.method() == http::verb::head;
    Request req;
    req.method = std::string(msg.method_string());
    SplitTarget(std::string_view(msg.target().data(), msg.target().size()), &req);
    req.headers = msg.base();
    req.body = std::move(msg.body());
    // The worker touches the connection only to post the answer back to the I/O thread.
    asio::post(*server_.workers, [self = shared_from_this(), ex = stream_.get_executor(),
                                  req = std::move(req)]() mutable {
      Response res;
      self->server_.Serve(req, res);
      asio::post(ex, [self, res = std::move(res)]() mutable { self->OnAnswer(std::move(res)); });
    });
  }

  void OnAnswer(Response res) {
    if (phase_ == Phase::kClosed) return;
    if (!res.stream) {
      return Write(SerializeAnswer(res, keep_alive_, head_only_),
                   keep_alive_ ? Then::kNextRequest : Then::kLinger);
    }
    std::string out = SerializeAnswer(res, keep_alive_, true);
    sse_ = std::move(res.stream);
    slot_ = std::move(res.slot);
    out += Chunk(sse_->pending);
    sse_->pending.clear();
    sse_->last_write = Clock::now();
    if (sse_->finished) out += kLastChunk;
    Write(std::move(out), sse_->finished ? Then::kStreamEnded : Then::kStream);
  }

  void Write(std::string out, Then then) {
    phase_ = Phase::kBusy;
    out_ = std::move(out);
    stream_.expires_after(std::chrono::seconds(server_.options.io_timeout_s));
    asio::async_write(stream_, asio::buffer(out_),
                      [self = shared_from_this(), then](beast::error_code ec, size_t) {
                        self->OnWritten(ec, then);
                      });
  }

  void OnWritten(const beast::error_code& ec, Then then) {
    if (phase_ == Phase::kClosed) return;
    if (ec == beast::error::timeout) return Fail("admin_write_timeout");
    if (ec) return Close();
    switch (then) {
      case Then::kStream:
        return NextTick();
      case Then::kStreamEnded:
        sse_.reset();
        slot_.reset();
        [[fallthrough]];
      case Then::kNextRequest:
        if (keep_alive_ && !server_.Stopping()) return WaitForRequest();
        [[fallthrough]];
      case Then::kLinger:
        return Linger();
    }
  }

  void WaitForRequest() {
    phase_ = Phase::kWaiting;
    since_ = Clock::now();
    // A pipelined request is there already; its head deadline runs from now.
    if (buffer_.size() > 0) return ReadHead();
    stream_.expires_after(std::chrono::seconds(server_.options.idle_timeout_s));
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (self->phase_ == Phase::kClosed) return;
                              // An idle timeout is the end of a keep-alive, not an error.
                              if (ec) return self->Close();
                              self->buffer_.commit(n);
                              self->ReadHead();
                            });
  }

  // Closes after the answer: no more is sent, and what the client still sends is read and
  // dropped for a moment, so its unread bytes do not make the close a reset that loses the answer.
  void Linger() {
    phase_ = Phase::kWaiting;
    since_ = Clock::now();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(kLingerTime);
    Drain();
  }

  void Drain() {
    stream_.async_read_some(asio::buffer(scratch_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (self->phase_ == Phase::kClosed) return;
                              if (ec) return self->Close();
                              self->Drain();
                            });
  }

  // --- Event streams ---

  void NextTick() {
    if (server_.Stopping()) return EndStream("shutdown");
    phase_ = Phase::kBusy;
    stream_.expires_never();
    timer_.expires_at(sse_->last_poll + std::chrono::milliseconds(server_.options.sse_interval_ms));
    timer_.async_wait([self = shared_from_this()](beast::error_code) {
      if (self->phase_ == Phase::kClosed) return;
      if (self->server_.Stopping()) return self->EndStream("shutdown");
      self->sse_->last_poll = Clock::now();
      asio::post(*self->server_.workers, [self, sse = self->sse_,
                                          ex = self->stream_.get_executor()] {
        std::string out = self->server_.Stopping() ? std::string() : self->server_.Poll(*sse);
        asio::post(ex, [self, out = std::move(out)]() mutable { self->OnPolled(std::move(out)); });
      });
    });
  }

  void OnPolled(std::string out) {
    if (phase_ == Phase::kClosed) return;
    const auto now = Clock::now();
    if (out.empty() && now - sse_->last_write >=
                           std::chrono::milliseconds(server_.options.keepalive_interval_ms)) {
      out = ": keep-alive\n\n";
    }
    if (out.empty()) return NextTick();
    sse_->last_write = now;
    std::string chunk = Chunk(out);
    if (sse_->finished) chunk += kLastChunk;
    Write(std::move(chunk), sse_->finished ? Then::kStreamEnded : Then::kStream);
  }

  void EndStream(std::string_view reason) {
    sse_->finished = true;
    Write(Chunk(EndEvent(sse_->id, sse_->last.status, reason)) + std::string(kLastChunk),
          Then::kStreamEnded);
  }

  Impl& server_;
  beast::tcp_stream stream_;
  asio::steady_timer timer_;  // an event stream's next poll
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::list<std::shared_ptr<Connection>>::iterator entry_;
  Phase phase_ = Phase::kWaiting;
  Clock::time_point since_;
  bool keep_alive_ = false;
  bool head_only_ = false;
  std::string out_;  // the bytes being written
  std::shared_ptr<EventStream> sse_;
  std::shared_ptr<StreamSlot> slot_;
  std::array<char, 4096> scratch_{};
};

void AdminServer::Impl::Accept() {
  acceptor->async_accept(
      [this](beast::error_code ec, tcp::socket socket) { OnAccept(ec, std::move(socket)); });
}

void AdminServer::Impl::OnAccept(const beast::error_code& ec, tcp::socket socket) {
  if (ec == asio::error::operation_aborted || !acceptor->is_open()) return;
  if (ec) {
    // Out of descriptors, most likely: accepting again at once would spin, so after a pause.
    metrics->AddErrors("admin_accept_failed");
    accept_retry->expires_after(std::chrono::milliseconds(100));
    accept_retry->async_wait([this](beast::error_code e) {
      if (!e) Accept();
    });
    return;
  }
  if (connections.size() >= static_cast<size_t>(options.max_connections) && !MakeRoom()) {
    metrics->AddErrors("admin_connection_refused");
    beast::error_code ignored;
    socket.close(ignored);
  } else {
    auto c = std::make_shared<Connection>(*this, std::move(socket));
    connections.push_back(c);
    c->Start(std::prev(connections.end()));
  }
  Accept();
}

// Closes the connection that has waited longest on its client; false when none waits.
bool AdminServer::Impl::MakeRoom() {
  Connection* oldest = nullptr;
  for (const auto& c : connections) {
    if (c->Waiting() && (oldest == nullptr || c->since() < oldest->since())) oldest = c.get();
  }
  if (oldest == nullptr) return false;
  metrics->AddErrors("admin_connection_evicted");
  oldest->Close();
  return true;
}

void AdminServer::Impl::Serve(Request& req, Response& res) {
  // No exception may reach the worker pool: it would end the process.
  try {
    if (Stopping()) return SendError(res, 503, "the admin server is stopping");
    const std::string_view method = req.method == "HEAD" ? "GET" : std::string_view(req.method);
    // A literal route comes before a "{id}" one that also matches its path (kRoutes' order).
    for (const Route& r : kRoutes) {
      if (r.method != method) continue;
      std::string id;
      if (!MatchPath(r.pattern, req.path, &id) || id.size() > kMaxIdSegment) continue;
      req.id_segment = std::move(id);
      return Handle(r, req, res);
    }
    if (method == "GET") {
      for (const EmbeddedFile& f : DashboardFiles()) {
        if (f.path == req.path) return ServeFile(f, res);
      }
    }
    NoRoute(req, res);
  } catch (const std::exception& e) {
    res = Response{};
    SendError(res, 500, std::string("internal error: ") + e.what());
  }
}

AdminServer::AdminServer() : impl_(std::make_unique<Impl>()) {}

AdminServer::~AdminServer() { Stop(); }

uint16_t AdminServer::port() const { return impl_->port; }

Status AdminServer::Start(const AdminServerOptions& options, AdminBackend* backend,
                          Metrics* metrics) {
  std::lock_guard<std::mutex> stop_lock(impl_->stop_mu);
  Impl& m = *impl_;
  if (m.started) return Status::Invalid("the admin server was started already");
  if (backend == nullptr || metrics == nullptr) {
    return Status::Invalid("the admin server needs a backend and metrics");
  }
  ATFILL_RETURN_IF_ERROR(options.Validate());
  m.options = options;
  m.backend = backend;
  m.metrics = metrics;
  m.token_digest = Sha256(AsBytes(options.token));

  m.acceptor.reset();  // a start that failed before left its own
  m.ioc.emplace(1);
  m.acceptor.emplace(*m.ioc);
  const auto fail = [&](uint16_t port, const beast::error_code& ec) {
    beast::error_code ignored;
    m.acceptor->close(ignored);
    return Status::IoError("admin server: cannot listen on " + options.address + ":" +
                           std::to_string(port) + ": " + ec.message());
  };
  beast::error_code ec;
  tcp::resolver resolver(*m.ioc);
  const auto found = resolver.resolve(options.address, std::to_string(options.port),
                                      tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || found.empty()) return fail(options.port, ec);
  tcp::endpoint endpoint = found.begin()->endpoint();
  const auto try_bind = [&](uint16_t port) {
    ec.clear();
    beast::error_code ignored;
    if (m.acceptor->is_open()) m.acceptor->close(ignored);
    endpoint.port(port);
    m.acceptor->open(endpoint.protocol(), ec);
    // SO_REUSEADDR alone only allows rebinding past TIME_WAIT; SO_REUSEPORT, never set, would
    // let a second process bind the same port and take a share of the connections.
    if (!ec) m.acceptor->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) m.acceptor->bind(endpoint, ec);
    if (!ec) m.acceptor->listen(asio::socket_base::max_listen_connections, ec);
    return !ec;
  };
  if (options.port == 0) {
    // Any free port: one below the ephemeral range (base/low_port.hpp).
    const auto port = BindLowPort(try_bind);
    if (!port) return fail(0, ec);
    m.port = *port;
  } else {
    if (!try_bind(options.port)) return fail(options.port, ec);
    m.port = options.port;
  }
  m.accept_retry.emplace(*m.ioc);
  m.workers.emplace(static_cast<size_t>(options.threads));
  m.work.emplace(m.ioc->get_executor());
  m.Accept();
  m.io_thread = std::thread([&m] { m.ioc->run(); });
  m.started = true;
  return Status::OK();
}

void AdminServer::Stop() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> stop_lock(m.stop_mu);
  if (!m.started || m.stopped) return;
  m.stopped = true;
  // First the event streams: each writes `end` and finishes its answer. A stream blocked on a
  // stalled client ends by the write deadline.
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stopping = true;
  }
  asio::post(*m.ioc, [&m] {
    for (const auto& c : m.connections) c->WakeStream();
  });
  {
    std::unique_lock<std::mutex> lock(m.mu);
    m.cv.wait_for(lock,
                  std::chrono::seconds(m.options.io_timeout_s) +
                      std::chrono::milliseconds(m.options.sse_interval_ms),
                  [&m] { return m.open_streams == 0; });
  }
  std::promise<void> closed;
  asio::post(*m.ioc, [&m, &closed] {
    beast::error_code ignored;
    m.acceptor->close(ignored);
    m.accept_retry->cancel();
    while (!m.connections.empty()) m.connections.front()->Close();
    closed.set_value();
  });
  closed.get_future().wait();
  // The calls in flight end (those queued see `stopping` and call nothing); what they post back
  // finds its connection closed.
  m.workers->join();
  m.work.reset();
  m.ioc->stop();
  m.io_thread.join();
  m.acceptor.reset();
  m.accept_retry.reset();
  m.ioc.reset();
}

}  // namespace atfill::admin
