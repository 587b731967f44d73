// Runs one source through transforms into a sink on a oneTBB flow graph:
//
//   source.Read ─ limiter ─ Decode + unordered transforms (parallel) ─ sequencer ─
//     ordered transforms ─ batcher ─ sink.Write ─ commit (state) ─ limiter release
//
// The state write of a batch (the source's resume cursor, the job's counters and errors, the
// ordered transforms' writes) happens only after the sink said the batch is durable, so a crash at
// any point replays from the last committed cursor: at-least-once, and the sink's idempotent rules
// make the table exact.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "pipeline/batcher.hpp"
#include "pipeline/sink.hpp"
#include "pipeline/source.hpp"
#include "pipeline/transform.hpp"
#include "state/kv_store.hpp"

namespace atfill::pipeline {

struct SinkRetryOptions {
  // First wait after a transient sink failure (milliseconds); doubles up to max_delay_ms.
  int64_t initial_delay_ms = 100;
  int64_t max_delay_ms = 16000;
  // Attempts before giving up; 0 retries until the run is asked to stop.
  uint32_t max_attempts = 0;
  Status Validate() const;
};

struct EngineOptions {
  BatcherOptions batch;
  SinkRetryOptions sink_retry;
  // Chunks decoded and transformed at once; 0 = the machine's hardware threads.
  uint32_t workers = 0;
  // Chunks between the source and the commit at most (bounds memory); 0 = derived from the batch
  // chunk limit and the workers.
  uint32_t max_chunks_in_flight = 0;
  Status Validate() const;
};

// One committed (or failed) batch, as the job sees it.
struct BatchReport {
  uint64_t batch_no = 0;
  const PendingBatch* batch = nullptr;
  WriteStats stats;
  int64_t write_us = 0;  // time spent in the sink, retries included
  uint32_t attempts = 0;
};

// A transient sink failure the engine waits out (the batch is written again, nothing is skipped).
struct SinkRetry {
  uint64_t batch_no = 0;
  uint32_t attempts = 0;    // failed attempts at this batch so far
  Status error;             // the sink's last answer (Unavailable)
  int64_t retry_in_ms = 0;  // how long until the next attempt
  int64_t since_us = 0;     // when the first attempt at this batch started
};

// The job's side of the commit. PrepareCommit, OnCommitted and OnSinkRetry run on the engine's
// serial commit node, one batch at a time; StopRequested may be called from any thread.
class Committer {
 public:
  virtual ~Committer() = default;
  // Adds the job's writes for this batch (resume cursor, counters, error log, audit trail).
  virtual Status PrepareCommit(const BatchReport& report, state::WriteBatch* batch) = 0;
  // The state batch is durable.
  virtual void OnCommitted(const BatchReport& report) = 0;
  // Checkpoint between chunks: true stops reading; what was read is still committed.
  virtual bool StopRequested() const = 0;
  // The sink refused a batch with a transient failure; the engine waits `retry_in_ms`, then
  // writes it again. Called after each failed attempt, before the wait; must not block for long.
  // The next OnCommitted means the sink took the batch.
  virtual void OnSinkRetry(const SinkRetry& retry) { static_cast<void>(retry); }
};

struct RunSummary {
  uint64_t chunks = 0;
  uint64_t batches = 0;
  uint64_t units_read = 0;
  uint64_t events = 0;
  WriteStats stats;
  // Reading stopped because the committer asked (pause/cancel), not at the end of input.
  bool stopped = false;
  // At the end of input: the source's Unfinished() reason (empty when it finished everything).
  state::StopReason unfinished;
};

class Engine {
 public:
  // The engine borrows everything; all must outlive Run().
  Engine(EngineOptions options, Source* source, std::vector<const Transform*> transforms,
         Sink* sink, state::KvStore* state, Committer* committer,
         std::function<int64_t()> now_us = nullptr);

  // Seeks the source to `resume_cursor`, then runs until the input ends, a stop is requested, or
  // something fails. The first failure (a node's error or exception, a sink that stays down past
  // its retries, a state write that fails) cancels the graph and is returned; what was committed
  // before it stays committed. Not re-entrant.
  Result<RunSummary> Run(const std::string& resume_cursor);

 private:
  EngineOptions options_;
  Source* source_;
  std::vector<const Transform*> transforms_;
  Sink* sink_;
  state::KvStore* state_;
  Committer* committer_;
  std::function<int64_t()> now_us_;
};

int64_t NowMicros();

// The version of the oneTBB library this process runs with (TBB_runtime_version: the shared
// library loaded, which may be newer than the headers it was built with).
std::string TbbRuntimeVersion();

}  // namespace atfill::pipeline
