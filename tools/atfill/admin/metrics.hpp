// Prometheus metrics of a running atfill, served by AdminServer at GET /metrics (docs/admin.md
// "Metrics"). The engine side adds to counters and observes the histogram as work happens; the
// server calls Refresh before each scrape to set the gauges from the backend.
//
// Families (every name is fixed here, so dashboards and alerts can rely on them):
//   atfill_stage_events_total{stage}    counter    items that entered a stage
//   atfill_stage_records_total{stage}   counter    records a stage passed on
//   atfill_errors_total{kind}           counter    errors by kind
//   atfill_http_requests_total{class}   counter    outbound HTTP answers: 1xx..5xx, "error"
//   atfill_sink_batch_seconds           histogram  time to write and commit one sink batch
//   atfill_live_lag_seconds             gauge      how far the live consumer is behind
//   atfill_queue_depth{job}             gauge      units waiting in an unfinished job's queue
//   atfill_sink_waiting_seconds{job}    gauge      how long a job has waited for a sink that
//                                                  refuses writes (present only while it waits)
//   atfill_jobs{status}                 gauge      jobs by status (every status, 0 included)
//   atfill_labels_total{outcome}        counter    labels from labelers: stored, negated, stale,
//                                                  refused, bad_frame
//   atfill_labels_refused_total{kind}   counter    refused labels by reason (bad_signature...)
//   atfill_label_connection_errors_total counter   labeler connections failed or dropped
//   atfill_labeler_cursor{labeler}      gauge      the seq of a labeler's last label written
//
// Thread-safe: every method may be called from any thread at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "state/job_store.hpp"
#include "tools/atfill/admin/admin_backend.hpp"

namespace prometheus {
class Counter;
}  // namespace prometheus

namespace atfill::admin {

// One counter series, looked up once: Add is a single atomic add, for hot paths. Valid as long
// as the Metrics that made it; a default-constructed handle ignores Add.
class CounterHandle {
 public:
  CounterHandle() = default;
  void Add(uint64_t n = 1) const;

 private:
  friend class Metrics;
  explicit CounterHandle(prometheus::Counter* counter) : counter_(counter) {}
  prometheus::Counter* counter_ = nullptr;
};

class Metrics {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Series handles (created on first use).
  CounterHandle StageEvents(std::string_view stage);
  CounterHandle StageRecords(std::string_view stage);
  CounterHandle Errors(std::string_view kind);

  // The same without keeping a handle (one label lookup per call).
  void AddStageEvents(std::string_view stage, uint64_t n);
  void AddStageRecords(std::string_view stage, uint64_t n);
  void AddErrors(std::string_view kind, uint64_t n = 1);

  // Feeds the stage and error counters from a job's counters, by the growth from `before` to
  // `after` (a counter that shrank adds nothing). Call it where a job's counters move (the
  // commit of a batch), with the counters before and after:
  //   events_read      -> atfill_stage_events_total{stage="source"}
  //   resolved_repos   -> atfill_stage_events_total{stage="resolver"}
  //   processed_repos  -> atfill_stage_events_total{stage="fetcher"}
  //   total_records    -> atfill_stage_events_total{stage="sink"}
  //   records_written  -> atfill_stage_records_total{stage="sink"}
  //   failed_records   -> atfill_errors_total{kind="record"}
  void AddJobCounters(const state::JobCounters& before, const state::JobCounters& after);

  // One outbound HTTP exchange: `status` is the HTTP status, or <= 0 when no answer came
  // (connection failure, timeout) which counts as class "error".
  void CountHttpResponse(int status);

  // One sink batch written and committed in `seconds`.
  void ObserveSinkBatch(double seconds);

  // Sets the gauges from the backend's view: atfill_jobs from every job's status;
  // atfill_queue_depth for each job that is not terminal (the series of jobs that ended or
  // disappeared are removed); atfill_sink_waiting_seconds for each job waiting for its sink;
  // atfill_live_lag_seconds from `live` when it is configured and knows its lag (else the series is
  // absent); the label series from `live.labels` when it is configured (its counters are the
  // labels job's, which survive restarts).
  void Refresh(const std::vector<JobSummary>& jobs, const LiveStatus& live);

  // The Prometheus text exposition format (version 0.0.4) of every family.
  std::string Serialize() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace atfill::admin
