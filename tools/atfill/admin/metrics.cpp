#include "tools/atfill/admin/metrics.hpp"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "pipeline/engine.hpp"

namespace atfill::admin {
namespace {

constexpr state::JobStatus kAllStatuses[] = {
    state::JobStatus::kRunning,    state::JobStatus::kPausing,   state::JobStatus::kPaused,
    state::JobStatus::kCancelling, state::JobStatus::kCancelled, state::JobStatus::kCompleted,
    state::JobStatus::kFailed,
};

// Batches commit in milliseconds when the sink keeps up and in seconds when it does not.
const prometheus::Histogram::BucketBoundaries kBatchBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

}  // namespace

void CounterHandle::Add(uint64_t n) const {
  if (counter_ != nullptr && n != 0) counter_->Increment(static_cast<double>(n));
}

struct Metrics::Impl {
  prometheus::Registry registry;
  prometheus::Family<prometheus::Counter>& stage_events =
      prometheus::BuildCounter()
          .Name("atfill_stage_events_total")
          .Help("Items (events, repos, records) that entered a stage")
          .Register(registry);
  prometheus::Family<prometheus::Counter>& stage_records = prometheus::BuildCounter()
                                                               .Name("atfill_stage_records_total")
                                                               .Help("Records a stage passed on")
                                                               .Register(registry);
  prometheus::Family<prometheus::Counter>& errors = prometheus::BuildCounter()
                                                        .Name("atfill_errors_total")
                                                        .Help("Errors by kind")
                                                        .Register(registry);
  prometheus::Family<prometheus::Counter>& http =
      prometheus::BuildCounter()
          .Name("atfill_http_requests_total")
          .Help("Outbound HTTP requests by the class of their answer (error = no answer)")
          .Register(registry);
  prometheus::Family<prometheus::Histogram>& sink_batch =
      prometheus::BuildHistogram()
          .Name("atfill_sink_batch_seconds")
          .Help("Time to write and commit one sink batch, seconds")
          .Register(registry);
  prometheus::Family<prometheus::Gauge>& live_lag =
      prometheus::BuildGauge()
          .Name("atfill_live_lag_seconds")
          .Help("How far the live consumer is behind the network, seconds")
          .Register(registry);
  prometheus::Family<prometheus::Gauge>& queue_depth =
      prometheus::BuildGauge()
          .Name("atfill_queue_depth")
          .Help("Units waiting in the work queue of an unfinished job")
          .Register(registry);
  prometheus::Family<prometheus::Gauge>& sink_waiting =
      prometheus::BuildGauge()
          .Name("atfill_sink_waiting_seconds")
          .Help(
              "How long a job has waited for a sink that refuses writes (a full disk, a "
              "database restart), seconds")
          .Register(registry);
  prometheus::Family<prometheus::Gauge>& jobs =
      prometheus::BuildGauge().Name("atfill_jobs").Help("Jobs by status").Register(registry);

  prometheus::Family<prometheus::Counter>& labels =
      prometheus::BuildCounter()
          .Name("atfill_labels_total")
          .Help("Labels from labelers by outcome (stored, negated, stale, refused, bad_frame)")
          .Register(registry);
  prometheus::Family<prometheus::Counter>& labels_refused =
      prometheus::BuildCounter()
          .Name("atfill_labels_refused_total")
          .Help("Labels refused, by the reason's kind")
          .Register(registry);
  prometheus::Family<prometheus::Counter>& label_connection_errors =
      prometheus::BuildCounter()
          .Name("atfill_label_connection_errors_total")
          .Help("Connections to labelers that failed, were refused or were dropped")
          .Register(registry);
  prometheus::Family<prometheus::Gauge>& labeler_cursor =
      prometheus::BuildGauge()
          .Name("atfill_labeler_cursor")
          .Help("The seq of the last label written from a labeler")
          .Register(registry);

  // Series looked up once; prometheus-cpp's Family::Add returns the same series for the same
  // labels, and the references stay valid until removed.
  prometheus::Counter* http_class[6] = {};  // 1xx..5xx, error
  prometheus::Histogram* batch = nullptr;
  std::map<state::JobStatus, prometheus::Gauge*> by_status;

  // Refresh's own state: the queue series it set, so it can remove those of ended jobs.
  std::mutex refresh_mu;
  std::map<uint64_t, prometheus::Gauge*> queue_series;
  std::map<uint64_t, prometheus::Gauge*> waiting_series;
  prometheus::Gauge* lag = nullptr;
  // The label job's counters as last seen, by series: a counter grows by what they grew.
  std::map<prometheus::Counter*, uint64_t> label_seen;

  // Brings `series` up to `value` (a job counter that only grows; a smaller value, as after the
  // job was replaced, adds nothing and becomes the new base).
  void CountUpTo(prometheus::Counter& series, uint64_t value) {
    auto it = label_seen.emplace(&series, 0).first;
    if (value > it->second) series.Increment(static_cast<double>(value - it->second));
    it->second = value;
  }
};

namespace {

// One series per job of `values` (times `scale`) in `family`; the series of jobs not in `values`
// are removed. `series` is the family's series as this function last set them.
void SetJobSeries(prometheus::Family<prometheus::Gauge>& family,
                  std::map<uint64_t, prometheus::Gauge*>& series,
                  const std::map<uint64_t, uint64_t>& values, double scale) {
  for (auto it = series.begin(); it != series.end();) {
    if (values.count(it->first) == 0) {
      family.Remove(it->second);
      it = series.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [id, value] : values) {
    auto& gauge = series[id];
    if (gauge == nullptr) gauge = &family.Add({{"job", std::to_string(id)}});
    gauge->Set(static_cast<double>(value) * scale);
  }
}

}  // namespace

Metrics::Metrics() : impl_(std::make_unique<Impl>()) {
  static const char* const kClasses[] = {"1xx", "2xx", "3xx", "4xx", "5xx", "error"};
  for (int i = 0; i < 6; ++i) impl_->http_class[i] = &impl_->http.Add({{"class", kClasses[i]}});
  impl_->batch = &impl_->sink_batch.Add({}, kBatchBuckets);
  // The series AddJobCounters feeds exist from the start (at 0), so every family is exposed
  // before the first job moves.
  for (const char* stage : {"source", "resolver", "fetcher", "sink"}) StageEvents(stage);
  StageRecords("sink");
  Errors("record");
  for (state::JobStatus s : kAllStatuses) {
    impl_->by_status[s] = &impl_->jobs.Add({{"status", std::string(state::JobStatusName(s))}});
  }
}

Metrics::~Metrics() = default;

CounterHandle Metrics::StageEvents(std::string_view stage) {
  return CounterHandle(&impl_->stage_events.Add({{"stage", std::string(stage)}}));
}

CounterHandle Metrics::StageRecords(std::string_view stage) {
  return CounterHandle(&impl_->stage_records.Add({{"stage", std::string(stage)}}));
}

CounterHandle Metrics::Errors(std::string_view kind) {
  return CounterHandle(&impl_->errors.Add({{"kind", std::string(kind)}}));
}

void Metrics::AddStageEvents(std::string_view stage, uint64_t n) { StageEvents(stage).Add(n); }

void Metrics::AddStageRecords(std::string_view stage, uint64_t n) { StageRecords(stage).Add(n); }

void Metrics::AddErrors(std::string_view kind, uint64_t n) { Errors(kind).Add(n); }

void Metrics::AddJobCounters(const state::JobCounters& before, const state::JobCounters& after) {
  const auto add = [](CounterHandle (Metrics::*series)(std::string_view), Metrics* self,
                      const char* label, uint64_t b, uint64_t a) {
    if (a > b) (self->*series)(label).Add(a - b);
  };
  add(&Metrics::StageEvents, this, "source", before.events_read, after.events_read);
  add(&Metrics::StageEvents, this, "resolver", before.resolved_repos, after.resolved_repos);
  add(&Metrics::StageEvents, this, "fetcher", before.processed_repos, after.processed_repos);
  add(&Metrics::StageEvents, this, "sink", before.total_records, after.total_records);
  add(&Metrics::StageRecords, this, "sink", before.records_written, after.records_written);
  add(&Metrics::Errors, this, "record", before.failed_records, after.failed_records);
}

void Metrics::CountHttpResponse(int status) {
  const int cls = status >= 100 && status <= 599 ? status / 100 - 1 : 5;
  impl_->http_class[cls]->Increment();
}

void Metrics::ObserveSinkBatch(double seconds) { impl_->batch->Observe(seconds); }

void Metrics::Refresh(const std::vector<JobSummary>& jobs, const LiveStatus& live) {
  std::lock_guard<std::mutex> lock(impl_->refresh_mu);
  std::map<state::JobStatus, uint64_t> counts;
  std::map<uint64_t, uint64_t> depths;
  std::map<uint64_t, uint64_t> waits;
  const int64_t now_us = pipeline::NowMicros();
  for (const auto& j : jobs) {
    ++counts[j.job.status];
    if (!state::IsTerminal(j.job.status)) depths[j.job.id] = j.queued_units;
    if (!j.job.waiting.empty()) {
      waits[j.job.id] =
          static_cast<uint64_t>(std::max<int64_t>(0, now_us - j.job.waiting_since_us));
    }
  }
  for (const auto& [status, gauge] : impl_->by_status) {
    auto it = counts.find(status);
    gauge->Set(it == counts.end() ? 0.0 : static_cast<double>(it->second));
  }
  SetJobSeries(impl_->queue_depth, impl_->queue_series, depths, 1);
  SetJobSeries(impl_->sink_waiting, impl_->waiting_series, waits, 1e-6);
  const LabelsStatus& l = live.labels;
  if (l.configured) {
    const std::pair<const char*, uint64_t> outcomes[] = {{"stored", l.stored},
                                                         {"negated", l.negated},
                                                         {"stale", l.stale},
                                                         {"refused", l.refused},
                                                         {"bad_frame", l.bad_frames}};
    for (const auto& [outcome, n] : outcomes) {
      impl_->CountUpTo(impl_->labels.Add({{"outcome", outcome}}), n);
    }
    for (const auto& [kind, n] : l.refused_by) {
      impl_->CountUpTo(impl_->labels_refused.Add({{"kind", kind}}), n);
    }
    impl_->CountUpTo(impl_->label_connection_errors.Add({}), l.connection_errors);
    for (const LabelerCursor& c : l.labelers) {
      impl_->labeler_cursor.Add({{"labeler", c.did}}).Set(static_cast<double>(c.cursor));
    }
  }
  const bool has_lag = live.configured && live.lag_s >= 0;
  if (has_lag) {
    if (impl_->lag == nullptr) impl_->lag = &impl_->live_lag.Add({});
    impl_->lag->Set(live.lag_s);
  } else if (impl_->lag != nullptr) {
    impl_->live_lag.Remove(impl_->lag);
    impl_->lag = nullptr;
  }
}

std::string Metrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(impl_->registry.Collect());
}

}  // namespace atfill::admin
