#include "sources/labels/labeler.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "atproto/crypto.hpp"
#include "net/websocket.hpp"
#include "pipeline/run.hpp"
#include "sources/labels/label_frames.hpp"
#include "state/cursors.hpp"

namespace atfill::sources {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kSubscribePath = "/xrpc/com.atproto.label.subscribeLabels";

// One frame's accepted labels (possibly none: its seq still moves the cursor).
struct Received {
  size_t labeler = 0;
  uint64_t seq = 0;
  std::vector<pipeline::Label> labels;
  Clock::time_point at;
};

// What the connections' handlers (on their clients' loop threads) hand the writer (the caller's
// thread). Guarded by `mu`.
struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Received> queue;
  uint64_t queued_labels = 0;
  std::vector<std::string> lines;       // log lines, printed by the writer
  std::vector<state::NewError> errors;  // for the job's error log, appended by the writer
};

int64_t UnixMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Saves `job`'s record as a run leaves it: `status` and `reason`, with the counters it holds.
void SaveLabelsJob(LabelJobContext* job, state::KvStore* kv, state::JobStatus status,
                   state::StopReason reason, const std::function<void(std::string_view)>& log) {
  if (job == nullptr || job->jobs == nullptr || job->job.id == 0) return;
  state::JobRecord& j = job->job;
  const int64_t now = UnixMicros();
  j.status = status;
  j.stop_reason = std::move(reason);
  j.updated_us = j.heartbeat_us = now;
  if (state::IsTerminal(status)) j.finished_us = now;
  state::WriteBatch wb;
  Status st = job->jobs->Put(&wb, j);
  if (st.ok()) st = kv->Write(wb);
  if (!st.ok()) log("atfill labels: saving job " + std::to_string(j.id) + ": " + st.message());
}

// A refusal or a connection error: its log line and its entry of the job's error log.
void Report(Shared* shared, std::string kind, std::string key, std::string line,
            std::string message) {
  shared->lines.push_back(std::move(line));
  shared->errors.push_back(
      state::NewError{std::move(kind), std::move(key), std::move(message), UnixMicros()});
}

// One labeler. Its fields below `mu`'s comment are guarded by Shared::mu; the rest is set before
// its connection starts.
struct Subscription {
  size_t index = 0;
  std::string did;
  std::string endpoint;  // http(s)://host[:port] from the DID document
  std::optional<atproto::PublicKey> key;
  std::unique_ptr<net::WebSocketClient> client;
  // Guarded by Shared::mu:
  uint64_t received_seq = 0;  // the seq of the last frame queued (where a reconnection resumes)
  bool overflowed = false;    // closed because the queue was full; reopened once it drains
  bool stopped = false;       // its session ended (kStopped)
  Clock::time_point last_message;
  LabelerStats stats;
};

std::string WsBase(const std::string& endpoint) {
  if (endpoint.starts_with("https://")) return "wss://" + endpoint.substr(8);
  if (endpoint.starts_with("http://")) return "ws://" + endpoint.substr(7);
  return endpoint;
}

// The handler of one message, on the loop thread: decoded and verified here (cheap next to the
// network), queued for the writer.
void OnMessage(Subscription* sub, Shared* shared, uint64_t max_pending, std::string_view data) {
  auto frame = DecodeLabelFrame(AsBytes(data));
  std::lock_guard lock(shared->mu);
  sub->last_message = Clock::now();
  if (sub->overflowed) return;
  if (!frame.ok()) {
    ++sub->stats.bad_frames;
    const std::string why =
        "a message of " + std::to_string(data.size()) +
        " bytes is not a subscribeLabels frame, skipped: " + frame.status().message();
    Report(shared, "bad_frame", sub->did + " after seq " + std::to_string(sub->received_seq),
           "atfill labels: " + sub->did + ": " + why, why);
    return;
  }
  switch (frame->kind) {
    case LabelFrame::Kind::kInfo:
      shared->lines.push_back("atfill labels: " + sub->did + " says " + frame->name +
                              (frame->message.empty() ? "" : ": " + frame->message));
      return;
    case LabelFrame::Kind::kError:
      shared->lines.push_back("atfill labels: " + sub->did + " ended the stream with error " +
                              frame->name + (frame->message.empty() ? "" : ": " + frame->message));
      return;
    case LabelFrame::Kind::kUnknown:
      return;  // a frame type this reader does not know
    case LabelFrame::Kind::kLabels:
      break;
  }
  const uint64_t seq = static_cast<uint64_t>(frame->seq);
  if (seq <= sub->received_seq) return;  // sent again after a reconnection
  if (shared->queued_labels >= max_pending) {
    // The writer is behind: stop reading and come back for the rest from here.
    sub->overflowed = true;
    sub->client->Close();
    return;
  }
  ++sub->stats.frames;
  Received r{sub->index, seq, {}, Clock::now()};
  for (const LabelError& e : frame->errors) {
    ++sub->stats.refused;
    ++sub->stats.refused_by[e.kind];
    Report(
        shared, e.kind, sub->did + " " + e.key,
        "atfill labels: refused " + e.kind + " from " + sub->did + " (" + e.key + "): " + e.message,
        e.message);
  }
  for (RawLabel& raw : frame->labels) {
    std::string kind;
    if (Status st = VerifyLabel(raw, sub->did, *sub->key, &kind); !st.ok()) {
      ++sub->stats.refused;
      ++sub->stats.refused_by[kind];
      const std::string where =
          "seq " + std::to_string(seq) + ", " + raw.label.val + " on " + raw.label.uri;
      Report(shared, kind, sub->did + " " + where,
             "atfill labels: refused " + kind + " from " + sub->did + " (" + where +
                 "): " + st.message(),
             st.message());
      continue;
    }
    r.labels.push_back(std::move(raw.label));
  }
  sub->stats.labels += r.labels.size();
  shared->queued_labels += r.labels.size();
  sub->received_seq = seq;
  sub->stats.received_seq = seq;
  shared->queue.push_back(std::move(r));
  shared->cv.notify_one();
}

// Connection events, on the loop thread: logged; the session goes on (with the policy's backoff)
// unless it was closed on purpose.
net::SessionAction OnEvent(Subscription* sub, Shared* shared, const net::ConnectionEvent& e) {
  std::lock_guard lock(shared->mu);
  // Kinds as the live consumer names them (sources/jetstream/jetstream.hpp), keyed by the labeler.
  const auto error = [&](const char* kind, const std::string& why) {
    ++sub->stats.connection_errors;
    Report(shared, kind, sub->did, "atfill labels: " + sub->did + ": " + why, why);
  };
  switch (e.kind) {
    case net::ConnectionEventKind::kConnected:
      shared->lines.push_back("atfill labels: connected to " + sub->did + " at " + e.url);
      break;
    case net::ConnectionEventKind::kRefused:
      error("connection_refused", "refused " + e.url + ": HTTP " + std::to_string(e.http_status) +
                                      " " + e.body.substr(0, 200));
      break;
    case net::ConnectionEventKind::kFailed:
      error(e.connected_ms >= 0 ? "connection_lost" : "connection_failed",
            "the connection to " + e.url + " failed: " + e.error.message());
      break;
    case net::ConnectionEventKind::kClosed:
      if (!e.closed_by_client) {
        error("connection_closed", "the labeler closed the connection (" +
                                       std::to_string(e.close_code) + " " + e.close_reason + ")");
      }
      break;
    case net::ConnectionEventKind::kStopped:
      sub->stopped = true;
      shared->cv.notify_one();
      break;
  }
  return net::SessionAction::kContinue;
}

// Resolves `did`'s labeler endpoint and key (a blocking wait: the writer's thread is not a graph
// node).
Status Resolve(const LabelerOptions& options, net::HttpClient* http, Subscription* sub) {
  ResolverOptions ro = options.resolver;
  ro.service_id = "#atproto_labeler";
  ro.key_id = "#atproto_label";
  ro.cache_ttl_s = 0;
  ro.allow_loopback_endpoints = ro.allow_loopback_endpoints || options.allow_private_endpoints;
  ro.allow_private_endpoints = ro.allow_private_endpoints || options.allow_private_endpoints;
  DidResolver resolver(http, nullptr, ro);
  std::promise<ResolveOutcome> done;
  auto answer = done.get_future();
  resolver.Resolve(sub->did, [&done](ResolveOutcome o) { done.set_value(std::move(o)); });
  ResolveOutcome outcome = answer.get();
  if (!outcome.ok()) {
    return Status::Unavailable("labeler " + sub->did + ": " + outcome.message + " (" +
                               outcome.error_kind + ")");
  }
  if (outcome.doc->signing_key.empty()) {
    return Status::Invalid("labeler " + sub->did +
                           ": its DID document has no #atproto_label verification method");
  }
  auto key = atproto::PublicKey::FromMultibase(outcome.doc->signing_key);
  if (!key.ok()) {
    return Status::Invalid("labeler " + sub->did +
                           ": its #atproto_label key: " + key.status().message());
  }
  sub->key = std::move(*key);
  sub->endpoint = outcome.doc->pds_endpoint;
  return Status::OK();
}

// The writer: batches of queued frames into the sink, then the cursors into state.
class Writer {
 public:
  Writer(const LabelerOptions& options, pipeline::LabelSink* sink, state::KvStore* kv,
         std::vector<std::unique_ptr<Subscription>>* subs, Shared* shared,
         const std::function<bool()>& stop, const std::function<void(std::string_view)>& log,
         LabelJobContext* job)
      : options_(options),
        sink_(sink),
        kv_(kv),
        subs_(*subs),
        shared_(*shared),
        stop_(stop),
        log_(log),
        job_(job) {
    if (job_ != nullptr) base_ = job_->job.counters;
  }

  Status Connect(Subscription* sub) {
    net::WebSocketTarget target;
    target.hosts = {WsBase(sub->endpoint)};
    target.url_for = [sub, shared = &shared_](const std::string& host) {
      std::lock_guard lock(shared->mu);
      return host + std::string(kSubscribePath) + "?cursor=" + std::to_string(sub->received_seq);
    };
    net::WebSocketHandlers handlers;
    const uint64_t max_pending = options_.max_pending_labels;
    handlers.on_message = [sub, shared = &shared_, max_pending](std::string_view data, bool) {
      OnMessage(sub, shared, max_pending, data);
    };
    handlers.on_event = [sub, shared = &shared_](const net::ConnectionEvent& e) {
      return OnEvent(sub, shared, e);
    };
    {
      std::lock_guard lock(shared_.mu);
      sub->stopped = false;
      sub->overflowed = false;
    }
    return sub->client->Connect(std::move(target), std::move(handlers));
  }

  // Runs until stopped, idle or failed.
  Result<bool> Run() {
    const auto idle_after = std::chrono::milliseconds(options_.idle_exit_ms);
    for (;;) {
      const bool stopping = stop_();
      bool idle = false;
      {
        std::unique_lock lock(shared_.mu);
        if (!stopping && shared_.queue.empty()) {
          shared_.cv.wait_for(lock, std::chrono::milliseconds(20));
        }
        TakeLocked();
        if (options_.idle_exit_ms > 0 && shared_.queue.empty()) {
          idle = std::all_of(subs_.begin(), subs_.end(), [&](const auto& s) {
            return Clock::now() - s->last_message >= idle_after;
          });
        }
      }
      PrintLines();
      const bool due = !batch_.empty() &&
                       (batch_labels_ >= options_.batch_labels ||
                        Clock::now() - oldest_ >= std::chrono::milliseconds(options_.batch_ms));
      if (due || ((stopping || idle) && !batch_.empty())) ATFILL_RETURN_IF_ERROR(Flush());
      if (stopping) return false;
      if (idle && batch_.empty()) return true;
      ATFILL_RETURN_IF_ERROR(ReopenOverflowed());
    }
  }

 private:
  // Moves queued frames into the batch, up to batch_labels.
  void TakeLocked() {
    while (!shared_.queue.empty() && batch_labels_ < options_.batch_labels) {
      Received& r = shared_.queue.front();
      if (batch_.empty()) oldest_ = r.at;
      batch_labels_ += r.labels.size();
      shared_.queued_labels -= r.labels.size();
      batch_.push_back(std::move(r));
      shared_.queue.pop_front();
    }
  }

  // Prints the lines the handlers queued and appends their errors to the job's log.
  void PrintLines() {
    std::vector<std::string> lines;
    std::vector<state::NewError> errors;
    {
      std::lock_guard lock(shared_.mu);
      lines.swap(shared_.lines);
      errors.swap(shared_.errors);
    }
    for (const std::string& line : lines) log_(line);
    if (job_ != nullptr && job_->errors != nullptr && job_->job.id != 0 && !errors.empty()) {
      // The log is for people; a failure to keep an entry is said, not fatal to the labels.
      if (auto added = job_->errors->AppendAll(job_->job.id, errors); !added.ok()) {
        log_("atfill labels: the error log of job " + std::to_string(job_->job.id) + ": " +
             added.status().message());
      }
    }
  }

 public:
  // The last lines and errors of the handlers, once no handler runs any more.
  void Flushed() { PrintLines(); }

  // The job's counters: what it had when this run started plus this run's. Under shared_.mu.
  state::JobCounters CountersLocked() const {
    state::JobCounters c = base_;
    auto& x = c.extra;
    for (const auto& sub : subs_) {
      const LabelerStats& s = sub->stats;
      c.events_read += s.frames;
      c.total_records += s.labels;
      c.records_written += s.stored + s.negated;
      c.failed_records += s.refused;
      x["labels_stored"] += s.stored;
      x["labels_negated"] += s.negated;
      x["labels_stale"] += s.stale;
      x["labels_bad_frames"] += s.bad_frames;
      x["labels_connection_errors"] += s.connection_errors;
      for (const auto& [kind, n] : s.refused_by) x["labels_refused_" + kind] += n;
    }
    return c;
  }

  // Saves the job as the run leaves it, with this run's counters.
  void SaveJob(state::JobStatus status, state::StopReason reason) {
    if (job_ == nullptr) return;
    {
      std::lock_guard lock(shared_.mu);
      job_->job.counters = CountersLocked();
    }
    SaveLabelsJob(job_, kv_, status, std::move(reason), log_);
  }

 private:
  Status Flush() {
    std::vector<pipeline::Label> labels;
    labels.reserve(batch_labels_);
    std::map<size_t, uint64_t> seqs;
    for (Received& r : batch_) {
      for (pipeline::Label& l : r.labels) labels.push_back(std::move(l));
      seqs[r.labeler] = std::max(seqs[r.labeler], r.seq);
    }
    auto backoff = std::chrono::milliseconds(50);
    Result<pipeline::LabelWriteStats> written = sink_->WriteLabels(labels);
    // A database that is down or locked is waited for, as the engine waits for its sink.
    while (!written.ok() && written.status().code() == StatusCode::kUnavailable && !stop_()) {
      log_("atfill labels: " + written.status().message() + "; retrying");
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
      written = sink_->WriteLabels(labels);
    }
    if (!written.ok()) return written.status();
    state::WriteBatch wb;
    state::Cursors cursors(*kv_);
    for (const auto& [index, seq] : seqs) {
      cursors.SetUint64(&wb, LabelCursorName(subs_[index]->did), seq);
    }
    {
      std::lock_guard lock(shared_.mu);
      for (const auto& [index, seq] : seqs) {
        LabelerStats& s = subs_[index]->stats;
        s.applied_seq = seq;
        ++s.batches;
      }
      // The batch's write statistics are the sink's, for all labelers together: each labeler's
      // share is counted on the first labeler of the batch when several share one.
      LabelerStats& first = subs_[seqs.begin()->first]->stats;
      first.stored += written->stored;
      first.negated += written->negated;
      first.stale += written->stale;
      if (job_ != nullptr && job_->jobs != nullptr && job_->job.id != 0) {
        // With the cursors, so that the job's counters never run ahead of what is saved.
        job_->job.counters = CountersLocked();
        job_->job.updated_us = job_->job.heartbeat_us = UnixMicros();
      }
    }
    if (job_ != nullptr && job_->jobs != nullptr && job_->job.id != 0) {
      ATFILL_RETURN_IF_ERROR(job_->jobs->Put(&wb, job_->job));
    }
    ATFILL_RETURN_IF_ERROR(kv_->Write(wb).WithContext("saving the labelers' cursors"));
    batch_.clear();
    batch_labels_ = 0;
    return Status::OK();
  }

  Status ReopenOverflowed() {
    for (auto& sub : subs_) {
      bool reopen = false;
      {
        std::lock_guard lock(shared_.mu);
        reopen = sub->overflowed && sub->stopped &&
                 shared_.queued_labels <= options_.max_pending_labels / 2;
      }
      if (reopen) ATFILL_RETURN_IF_ERROR(Connect(sub.get()));
    }
    return Status::OK();
  }

  const LabelerOptions& options_;
  pipeline::LabelSink* sink_;
  state::KvStore* kv_;
  std::vector<std::unique_ptr<Subscription>>& subs_;
  Shared& shared_;
  const std::function<bool()>& stop_;
  const std::function<void(std::string_view)>& log_;
  LabelJobContext* job_;
  state::JobCounters base_;
  std::vector<Received> batch_;
  uint64_t batch_labels_ = 0;
  Clock::time_point oldest_;
};

}  // namespace

Result<LabelRunSummary> RunLabelers(const LabelerOptions& options, pipeline::LabelSink* sink,
                                    state::KvStore* kv, const std::function<bool()>& stop,
                                    const std::function<void(std::string_view)>& log,
                                    LabelJobContext* job) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  LabelRunSummary summary;
  if (options.labelers.empty()) return summary;
  net::HttpClientOptions http_options = options.http;
  http_options.allow_private_addresses =
      http_options.allow_private_addresses || options.allow_private_endpoints;
  ATFILL_ASSIGN_OR_RETURN(auto http, net::HttpClient::Start(http_options));
  // Declared before the subscriptions: their clients' handlers use it until they are destroyed.
  Shared shared;
  std::vector<std::unique_ptr<Subscription>> subs;
  state::Cursors cursors(*kv);
  for (const std::string& did : options.labelers) {
    auto sub = std::make_unique<Subscription>();
    sub->index = subs.size();
    sub->did = did;
    ATFILL_RETURN_IF_ERROR(Resolve(options, http.get(), sub.get()));
    ATFILL_ASSIGN_OR_RETURN(auto saved, cursors.GetUint64(LabelCursorName(did)));
    sub->received_seq = saved.value_or(0);
    sub->stats.applied_seq = sub->received_seq;
    sub->stats.received_seq = sub->received_seq;
    sub->last_message = Clock::now();
    net::WebSocketOptions ws;
    ws.allow_private_addresses = options.allow_private_endpoints;
    ws.idle_timeout_ms = options.idle_timeout_ms;
    ws.reconnect = options.reconnect;
    ATFILL_ASSIGN_OR_RETURN(sub->client, net::WebSocketClient::Start(ws));
    log("atfill labels: following " + did + " at " + sub->endpoint + " from seq " +
        std::to_string(sub->received_seq));
    subs.push_back(std::move(sub));
  }
  Writer writer(options, sink, kv, &subs, &shared, stop, log, job);
  Status connected = Status::OK();
  for (auto& sub : subs) {
    if (connected.ok()) connected = writer.Connect(sub.get());
  }
  Result<bool> idle = connected.ok() ? writer.Run() : Result<bool>(connected);
  for (auto& sub : subs) sub->client->Close();
  for (auto& sub : subs) sub->client.reset();  // no handler runs past here
  writer.Flushed();
  if (!idle.ok()) {
    writer.SaveJob(state::JobStatus::kFailed, {"labels_failed", idle.status().message()});
  } else {
    writer.SaveJob(state::JobStatus::kPaused,
                   *idle ? state::StopReason{"idle",
                                             "every labeler was quiet for [labels] "
                                             "idle_exit_ms"}
                         : state::StopReason{"stopped", "stopped on request"});
  }
  for (auto& sub : subs) {
    std::lock_guard lock(shared.mu);
    summary.labelers[sub->did] = sub->stats;
  }
  subs.clear();
  if (!idle.ok()) return idle.status();
  summary.idle = *idle;
  return summary;
}

std::string LabelCursorName(std::string_view labeler) { return "labels/" + std::string(labeler); }

uint64_t LabelsView::Extra(const std::string& name) const {
  if (!job) return 0;
  auto it = job->counters.extra.find(name);
  return it == job->counters.extra.end() ? 0 : it->second;
}

std::map<std::string, uint64_t> LabelsView::RefusedByKind() const {
  std::map<std::string, uint64_t> out;
  if (!job) return out;
  constexpr std::string_view kPrefix = "labels_refused_";
  for (const auto& [name, n] : job->counters.extra) {
    if (name.starts_with(kPrefix)) out[name.substr(kPrefix.size())] = n;
  }
  return out;
}

Result<LabelsView> ReadLabelsView(const pipeline::Environment& env) {
  LabelsView view;
  ATFILL_ASSIGN_OR_RETURN(auto jobs, env.jobs->List());
  for (auto& j : jobs) {
    if (j.kind == "labels" && (!view.job || j.id > view.job->id)) view.job = std::move(j);
  }
  if (!view.job) return view;
  state::Cursors cursors(*env.kv);
  auto labelers = view.job->params.find("labelers");
  if (labelers == view.job->params.end()) return view;
  for (const std::string& did : pipeline::SplitLines(labelers->second)) {
    ATFILL_ASSIGN_OR_RETURN(auto seq, cursors.GetUint64(LabelCursorName(did)));
    view.cursors.emplace_back(did, seq.value_or(0));
  }
  return view;
}

Result<state::JobRecord> FindOrCreateLabelsJob(const pipeline::Environment& env,
                                               const LabelerOptions& options,
                                               const std::string& started_by) {
  state::JobRecord prototype =
      pipeline::NewJobRecord("labels", state::JobStage::kReplaying, started_by);
  prototype.params = {{"labelers", pipeline::JoinLines(options.labelers)},
                      {"sink", env.components->SinkLocation(*env.settings)}};
  bool resumed = false;
  ATFILL_ASSIGN_OR_RETURN(
      state::JobRecord job,
      pipeline::FindOrCreateJob(env.jobs, prototype, {"labelers", "sink"}, &resumed));
  if (resumed) {
    const int64_t now = pipeline::NowMicros();
    job.status = state::JobStatus::kRunning;
    job.stop_reason = {};
    job.finished_us = 0;
    job.started_us = job.updated_us = job.heartbeat_us = now;
    state::WriteBatch wb;
    ATFILL_RETURN_IF_ERROR(env.jobs->Put(&wb, job));
    ATFILL_RETURN_IF_ERROR(env.kv->Write(wb));
  }
  return job;
}

Status LabelerOptions::Validate() const {
  if (batch_labels == 0) return Status::Invalid("[labels] batch_labels must be at least 1");
  if (batch_ms < 1) return Status::Invalid("[labels] batch_ms must be at least 1");
  if (max_pending_labels == 0) {
    return Status::Invalid("[labels] max_pending_labels must be at least 1");
  }
  for (const std::string& did : labelers) {
    if (!did.starts_with("did:plc:") && !did.starts_with("did:web:")) {
      return Status::Invalid("[labels] labelers: '" + did + "' is not a did:plc or did:web DID");
    }
  }
  return resolver.Validate();
}

Result<std::unique_ptr<LabelThread>> LabelThread::Start(const pipeline::Environment& env,
                                                        const LabelerOptions& options) {
  std::unique_ptr<LabelThread> t(new LabelThread());
  auto sink = env.components->OpenLabelSink(*env.settings);
  if (!sink.ok()) return sink.status().WithContext("[labels]: the label tables");
  t->sink_ = std::move(*sink);
  if (env.jobs != nullptr) {
    auto job = FindOrCreateLabelsJob(env, options, "cli");
    if (!job.ok()) return job.status().WithContext("[labels]: the labels job");
    t->job_.jobs = env.jobs;
    t->job_.job = std::move(*job);
    t->job_.errors = env.errors;
    env.Log("atfill labels: job " + std::to_string(t->job_.job.id));
  }
  LabelThread* self = t.get();
  t->thread_ = std::thread([self, &options, env] {
    self->outcome_ = RunLabelers(
        options, self->sink_.get(), env.kv, [self] { return self->stop_.load(); },
        [&env](std::string_view line) { env.Log(line); }, &self->job_);
    if (!self->outcome_.ok()) {
      env.Log("atfill labels: the subscriptions stopped: " + self->outcome_.status().message());
      // A run that failed before its first connection (a labeler not resolved) left the job
      // running: say how it ended.
      if (self->job_.job.status == state::JobStatus::kRunning) {
        SaveLabelsJob(&self->job_, env.kv, state::JobStatus::kFailed,
                      {"labels_failed", self->outcome_.status().message()},
                      [&env](std::string_view line) { env.Log(line); });
      }
    }
    self->done_ = true;
  });
  return t;
}

LabelThread::~LabelThread() { (void)Stop(); }

Result<LabelRunSummary> LabelThread::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  return outcome_;
}

}  // namespace atfill::sources
