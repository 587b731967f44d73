// The labeler subscription: com.atproto.label.subscribeLabels of each configured labeler into the
// sink's label tables (pipeline/label.hpp), resuming from each labeler's saved cursor.
//
//   labeler WebSocket ─ label decoder ─ signature check ─ label batcher ─ LabelSink ─ cursors
//
// Each labeler is resolved through its DID document: the service #atproto_labeler gives the
// endpoint (refused, as a PDS's would be, when it is not http(s) or points at loopback or private
// addresses, unless allowed), the verification method #atproto_label the key every label must be
// signed with. A label that fails (another src, no or a bad signature, a ver other than 1, a
// malformed field) is refused, counted and logged with the reason, in the labels job's error log
// too; the rest of its frame is stored.
//
// Delivery: labels are written in batches (batch_labels or batch_ms, whichever first), one
// transaction each; only then is each labeler's cursor (the seq of its last frame in the batch)
// saved in state, under "labels/<did>". A crash replays from the saved cursor, and the sinks'
// rules (labels and negations alike upserted by (uri, src, val), the newer by cts kept) make the
// replay converge: nothing lost, nothing doubled. A labeler never seen starts at
// cursor 0, which replays the history it keeps.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "base/status.hpp"
#include "net/http_client.hpp"
#include "net/reconnect_policy.hpp"
#include "pipeline/components.hpp"
#include "pipeline/label.hpp"
#include "sources/crawl/resolver.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"

namespace atfill::sources {

struct LabelerOptions {
  // DIDs of the labelers to follow ([labels] labelers); none: no subscription.
  std::vector<std::string> labelers;
  // A batch is written once it holds this many labels...
  uint64_t batch_labels = 1000;
  // ...or its oldest label has waited this long, in milliseconds.
  int64_t batch_ms = 200;
  // Labels received and not yet written, at most; past it the connection is closed and opened
  // again from the last label kept once the writer has caught up.
  uint64_t max_pending_labels = 100'000;
  // Accept labeler endpoints on loopback and private addresses (tests, simnet, private networks).
  bool allow_private_endpoints = false;
  // Stop once every labeler has sent nothing for this long (milliseconds; 0 = run until asked).
  int64_t idle_exit_ms = 0;
  // Time without any frame after which a connection is considered dead (milliseconds).
  int64_t idle_timeout_ms = 90'000;
  net::ReconnectPolicy reconnect;
  // How DID documents are fetched (plc_url, timeouts); the cache is not used.
  ResolverOptions resolver;
  net::HttpClientOptions http;

  Status Validate() const;
};

// The cursor of one labeler in state.
std::string LabelCursorName(std::string_view labeler);

struct LabelerStats {
  uint64_t frames = 0;   // #labels frames received
  uint64_t labels = 0;   // labels accepted (stored, negations and stale ones)
  uint64_t stored = 0;   // LabelWriteStats::stored
  uint64_t negated = 0;  // LabelWriteStats::negated
  uint64_t stale = 0;    // LabelWriteStats::stale
  uint64_t refused = 0;  // labels refused (bad label, bad version, wrong source, bad signature)
  std::map<std::string, uint64_t> refused_by;  // the same by kind (label_frames.hpp)
  uint64_t bad_frames = 0;                     // messages that were not a frame of subscribeLabels
  uint64_t connection_errors = 0;  // connections that failed, were refused or were dropped
  uint64_t batches = 0;            // batches written
  uint64_t applied_seq = 0;        // the saved cursor
  uint64_t received_seq = 0;       // the seq of the last frame received
};

struct LabelRunSummary {
  std::map<std::string, LabelerStats> labelers;  // by DID
  bool idle = false;                             // ended by idle_exit_ms
};

// Where a run keeps what `atfill jobs`, `atfill status`, the admin API and /metrics show of it
// (all read the job record and its error log); every member is optional.
struct LabelJobContext {
  // The "labels" job (FindOrCreateLabelsJob): its counters and heartbeat are saved with the
  // cursors after each batch, its status when the run ends.
  state::JobStore* jobs = nullptr;
  state::JobRecord job;
  // Refusals (kinds of label_frames.hpp, and bad_frame) and connection errors
  // (connection_failed, connection_refused, connection_lost, connection_closed), under the job.
  state::ErrorLog* errors = nullptr;
};

// The job of the label subscriptions: the unfinished "labels" job following the same labelers
// into the same sink, or a new one. Counters: events_read (frames), total_records (labels
// accepted), records_written (stored and negations), failed_records (refused), and in extra
// labels_stored, labels_negated, labels_stale, labels_refused_<kind>, labels_bad_frames,
// labels_connection_errors.
Result<state::JobRecord> FindOrCreateLabelsJob(const pipeline::Environment& env,
                                               const LabelerOptions& options,
                                               const std::string& started_by);

// Runs the subscriptions until `stop` answers true (polled every few milliseconds), every labeler
// is idle for idle_exit_ms, or something fails: a labeler that cannot be resolved, a sink write
// that fails other than Unavailable (Unavailable is retried with backoff), a state write. What was
// written before a failure stays written, its cursors saved. `log` receives one line per notable
// event ("atfill labels: ..."): connections, refusals with their reason, #info and error frames.
// What another process (atfill status, the admin API) reads of the label subscriptions: the
// newest "labels" job and each of its labelers' saved cursor.
struct LabelsView {
  std::optional<state::JobRecord> job;                    // none before the first run
  std::vector<std::pair<std::string, uint64_t>> cursors;  // (DID, saved seq), in the job's order
  // A counter of the job's extra (FindOrCreateLabelsJob), 0 when absent.
  uint64_t Extra(const std::string& name) const;
  // labels_refused_<kind> by kind.
  std::map<std::string, uint64_t> RefusedByKind() const;
};
Result<LabelsView> ReadLabelsView(const pipeline::Environment& env);

// With `job`, its record and error log are kept as LabelJobContext says.
Result<LabelRunSummary> RunLabelers(const LabelerOptions& options, pipeline::LabelSink* sink,
                                    state::KvStore* kv, const std::function<bool()>& stop,
                                    const std::function<void(std::string_view)>& log,
                                    LabelJobContext* job = nullptr);

// The subscriptions of [labels] on a thread of their own, beside the live consumer or alone, into
// the configured sink's label tables (pipeline::Components::OpenLabelSink): what `atfill run`
// does when [labels] labelers is set, and what a program embedding atfill does the same way.
class LabelThread {
 public:
  // Opens the label sink and starts the thread following `options` ([labels]); `env` (its
  // settings, state and log) and `options` must outlive the thread. Unsupported when the sink kind
  // stores no labels.
  static Result<std::unique_ptr<LabelThread>> Start(const pipeline::Environment& env,
                                                    const LabelerOptions& options);
  // Stop().
  ~LabelThread();
  LabelThread(const LabelThread&) = delete;
  LabelThread& operator=(const LabelThread&) = delete;

  // The run ended by itself (idle_exit_ms or a failure). Thread-safe.
  bool done() const { return done_.load(); }
  // Asks the run to end (what it holds is written first), waits for it and returns how it ended.
  // Idempotent: later calls return the same outcome.
  Result<LabelRunSummary> Stop();

 private:
  LabelThread() = default;
  std::unique_ptr<pipeline::LabelSink> sink_;
  LabelJobContext job_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  Result<LabelRunSummary> outcome_ = LabelRunSummary{};
  std::thread thread_;
};

}  // namespace atfill::sources
