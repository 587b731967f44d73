#include "tools/atfill/admin/admin_internal.hpp"

#include "base/strings.hpp"

namespace atfill::admin {

std::string FormatTime(int64_t unix_us) { return pipeline::FormatUtc(unix_us); }

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
  void Lexicons(Response& res);
  void AddLexicon(const Request& req, Response& res);
  void RemoveLexicon(const Request& req, Response& res);
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
  if (route.pattern.find("{id}") != std::string_view::npos && route.id != RouteId::kRemoveLexicon) {
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
    case RouteId::kLexicons:
      return Lexicons(res);
    case RouteId::kAddLexicon:
      return AddLexicon(req, res);
    case RouteId::kRemoveLexicon:
      return RemoveLexicon(req, res);
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

void AdminServer::Impl::Lexicons(Response& res) {
  auto lexicons = backend->Lexicons();
  if (!lexicons.ok()) return SendStatus(res, lexicons.status());
  SendJson(res, 200, LexiconsJson(*lexicons));
}

// The body is the lexicon document as it is (a file of the atproto lexicons, say); ?backfill=false
// adds it without backfilling its collection.
void AdminServer::Impl::AddLexicon(const Request& req, Response& res) {
  bool backfill = true;
  if (req.has_param("backfill")) {
    const std::string v = req.get_param_value("backfill");
    if (v != "true" && v != "false") {
      return SendError(res, 400, "backfill must be true or false, not " + QuoteForMessage(v));
    }
    backfill = v == "true";
  }
  auto answer = backend->AddLexicon(req.body, backfill);
  if (!answer.ok()) {
    if (answer.status().code() == StatusCode::kInvalid) {
      return SendError(res, 400, "not a valid lexicon: " + answer.status().message());
    }
    return SendStatus(res, answer.status());
  }
  SendJson(res, answer->replaced ? 200 : 201, LexiconAnswerJson(*answer, true));
}

void AdminServer::Impl::RemoveLexicon(const Request& req, Response& res) {
  if (Status s = atproto::ValidateNsid(req.id_segment); !s.ok()) {
    return SendError(res, 404,
                     "no lexicon " + QuoteForMessage(req.id_segment) + ": " + s.message());
  }
  auto answer = backend->RemoveLexicon(req.id_segment);
  if (!answer.ok()) return SendStatus(res, answer.status());
  SendJson(res, 200, LexiconAnswerJson(*answer, false));
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
  enum class Then : uint8_t { kNextRequest, kLinger, kStream, kStreamEnded, kReadBody };

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
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
      // The client holds its body back until it hears this (curl does so for a body over
      // 1 KiB, and otherwise waits a second first).
      return Write("HTTP/1.1 100 Continue\r\n\r\n", Then::kReadBody);
    }
    ReadBody();
  }

  void ReadBody() {
    phase_ = Phase::kWaiting;  // on the client again, as while its head came in
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
      case Then::kReadBody:  // after an interim 100 Continue
        return ReadBody();
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
      const size_t longest =
          r.id == RouteId::kRemoveLexicon ? atproto::kMaxNsidLength : kMaxIdSegment;
      if (!MatchPath(r.pattern, req.path, &id) || id.size() > longest) continue;
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
