#include "pipeline/engine.hpp"

#include <oneapi/tbb/enumerable_thread_specific.h>
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/task_group.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

namespace atfill::pipeline {
namespace {

using ChunkPtr = std::shared_ptr<EventChunk>;
namespace flow = tbb::flow;

// Keeps the first failure of a run and cancels the graph; later failures are consequences.
class FailureLatch {
 public:
  explicit FailureLatch(tbb::task_group_context* ctx) : ctx_(ctx) {}

  void Fail(Status status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (first_.ok()) first_ = std::move(status);
    }
    failed_.store(true, std::memory_order_release);
    ctx_->cancel_group_execution();
  }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  Status first() const {
    std::lock_guard<std::mutex> lock(mu_);
    return first_;
  }

 private:
  tbb::task_group_context* ctx_;
  mutable std::mutex mu_;
  Status first_;
  std::atomic<bool> failed_{false};
};

// Runs `fn` so that no exception leaves a node body: it becomes the run's failure.
template <typename Fn>
void Guarded(FailureLatch* latch, std::string_view where, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    latch->Fail(Status::Internal(std::string(where) + " threw: " + e.what()));
  } catch (...) {
    latch->Fail(Status::Internal(std::string(where) + " threw a non-standard exception"));
  }
}

// Per-worker states of the unordered transforms.
class TransformStates {
 public:
  explicit TransformStates(const Transform* t)
      : transform_(t), states_([t] { return t->NewState(); }) {}
  TransformState* Local() { return states_.local().get(); }
  const Transform* transform() const { return transform_; }

 private:
  const Transform* transform_;
  tbb::enumerable_thread_specific<std::unique_ptr<TransformState>> states_;
};

}  // namespace

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status SinkRetryOptions::Validate() const {
  if (initial_delay_ms <= 0) return Status::Invalid("sink retry initial delay must be positive");
  if (max_delay_ms < initial_delay_ms) {
    return Status::Invalid("sink retry max delay must be at least the initial delay");
  }
  return Status::OK();
}

Status EngineOptions::Validate() const {
  ATFILL_RETURN_IF_ERROR(batch.Validate());
  ATFILL_RETURN_IF_ERROR(sink_retry.Validate());
  if (max_chunks_in_flight != 0 && max_chunks_in_flight <= batch.max_chunks) {
    return Status::Invalid("max chunks in flight must exceed the batch chunk limit");
  }
  return Status::OK();
}

Engine::Engine(EngineOptions options, Source* source, std::vector<const Transform*> transforms,
               Sink* sink, state::KvStore* state, Committer* committer,
               std::function<int64_t()> now_us)
    : options_(options),
      source_(source),
      transforms_(std::move(transforms)),
      sink_(sink),
      state_(state),
      committer_(committer),
      now_us_(now_us ? std::move(now_us) : std::function<int64_t()>(NowMicros)) {}

Result<RunSummary> Engine::Run(const std::string& resume_cursor) {
  ATFILL_RETURN_IF_ERROR(options_.Validate());
  ATFILL_RETURN_IF_ERROR(source_->Seek(resume_cursor));

  const uint32_t workers =
      options_.workers != 0 ? options_.workers : std::max(1u, std::thread::hardware_concurrency());
  const uint32_t in_flight =
      options_.max_chunks_in_flight != 0
          ? options_.max_chunks_in_flight
          : static_cast<uint32_t>(options_.batch.max_chunks) + 2 * workers + 2;

  std::vector<std::unique_ptr<TransformStates>> unordered;
  std::vector<const Transform*> ordered;
  std::vector<std::unique_ptr<TransformState>> ordered_states;
  for (const Transform* t : transforms_) {
    if (t->ordered()) {
      ordered.push_back(t);
      ordered_states.push_back(t->NewState());
    } else {
      unordered.push_back(std::make_unique<TransformStates>(t));
    }
  }

  tbb::task_group_context ctx;
  FailureLatch latch(&ctx);
  flow::graph g(ctx);
  RunSummary summary;
  Batcher batcher(options_.batch);
  uint64_t next_seq = 0;
  std::atomic<bool> stopped{false};

  flow::limiter_node<ChunkPtr> limiter(g, in_flight);

  // Writes the pending batch to the sink (retrying transient failures), then commits the state
  // batch; false when the run must end. Runs on the serial commit node, or on this thread once
  // the graph is idle.
  auto flush = [&](bool release) -> bool {
    PendingBatch batch = batcher.Take();
    if (batch.empty()) return true;
    BatchReport report;
    report.batch_no = summary.batches;
    report.batch = &batch;
    const int64_t start = now_us_();
    int64_t delay_ms = options_.sink_retry.initial_delay_ms;
    for (;;) {
      ++report.attempts;
      auto written = sink_->Write(batch.events);
      if (written.ok()) {
        report.stats = *written;
        break;
      }
      const Status& err = written.status();
      const bool transient = err.code() == StatusCode::kUnavailable;
      const bool out_of_attempts = options_.sink_retry.max_attempts != 0 &&
                                   report.attempts >= options_.sink_retry.max_attempts;
      if (!transient || out_of_attempts || committer_->StopRequested() || latch.failed()) {
        latch.Fail(err.WithContext("sink " + std::string(sink_->name()) + " failed batch " +
                                   std::to_string(report.batch_no) + " after " +
                                   std::to_string(report.attempts) + " attempt(s)"));
        return false;
      }
      // A sink outage pauses ingest instead of skipping; sleep in short steps so a stop request
      // is noticed.
      for (int64_t waited = 0; waited < delay_ms && !committer_->StopRequested(); waited += 50) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      delay_ms = std::min(delay_ms * 2, options_.sink_retry.max_delay_ms);
    }
    report.write_us = now_us_() - start;

    state::WriteBatch writes;
    for (size_t i = 0; i < ordered.size(); ++i) {
      Status s = ordered[i]->PrepareCommit(ordered_states[i].get(), &writes);
      if (!s.ok()) {
        latch.Fail(s.WithContext(std::string(ordered[i]->name())));
        return false;
      }
    }
    Status s = committer_->PrepareCommit(report, &writes);
    if (s.ok()) s = state_->Write(writes);
    for (size_t i = 0; i < ordered.size(); ++i) {
      ordered[i]->OnCommitted(ordered_states[i].get(), s.ok());
    }
    if (!s.ok()) {
      latch.Fail(s.WithContext("committing batch " + std::to_string(report.batch_no)));
      return false;
    }
    committer_->OnCommitted(report);
    ++summary.batches;
    summary.events += batch.events.size();
    summary.stats += report.stats;
    if (release) {
      for (size_t i = 0; i < batch.chunks.size(); ++i) {
        limiter.decrementer().try_put(flow::continue_msg());
      }
    }
    return true;
  };

  flow::input_node<ChunkPtr> reader(g, [&](tbb::flow_control& fc) -> ChunkPtr {
    ChunkPtr out;
    Guarded(&latch, "source " + source_->Describe(), [&] {
      if (latch.failed()) return;
      if (committer_->StopRequested()) {
        stopped.store(true);
        return;
      }
      auto chunk = std::make_shared<EventChunk>();
      auto more = source_->Read(chunk.get());
      if (!more.ok()) {
        latch.Fail(more.status().WithContext("reading " + source_->Describe()));
        return;
      }
      if (!*more) return;
      chunk->seq = next_seq++;
      out = std::move(chunk);
    });
    if (!out) fc.stop();
    return out;
  });

  flow::function_node<ChunkPtr, ChunkPtr> work(g, workers, [&](ChunkPtr chunk) {
    Guarded(&latch, "decode", [&] {
      if (latch.failed()) return;
      source_->Decode(chunk.get());
      for (auto& states : unordered) {
        Status s = states->transform()->Process(states->Local(), chunk.get());
        if (!s.ok()) {
          latch.Fail(s.WithContext(std::string(states->transform()->name())));
          return;
        }
      }
    });
    return chunk;
  });

  flow::sequencer_node<ChunkPtr> sequencer(g, [](const ChunkPtr& c) { return c->seq; });

  flow::function_node<ChunkPtr, flow::continue_msg> commit(g, flow::serial, [&](ChunkPtr chunk) {
    Guarded(&latch, "commit", [&] {
      if (latch.failed()) return;
      for (size_t i = 0; i < ordered.size(); ++i) {
        Status s = ordered[i]->Process(ordered_states[i].get(), chunk.get());
        if (!s.ok()) {
          latch.Fail(s.WithContext(std::string(ordered[i]->name())));
          return;
        }
      }
      ++summary.chunks;
      summary.units_read += chunk->units_read;
      const int64_t now = now_us_();
      batcher.Add(std::move(chunk), now);
      if (batcher.ShouldFlush(now)) flush(true);
    });
    return flow::continue_msg();
  });

  flow::make_edge(reader, limiter);
  flow::make_edge(limiter, work);
  flow::make_edge(work, sequencer);
  flow::make_edge(sequencer, commit);
  reader.activate();
  g.wait_for_all();

  // The graph is idle: commit what is left of the input (also after a stop request, so a pause
  // keeps everything it read).
  if (!latch.failed()) {
    Guarded(&latch, "final commit", [&] { flush(false); });
  }
  if (latch.failed()) {
    for (size_t i = 0; i < ordered.size(); ++i) {
      ordered[i]->OnCommitted(ordered_states[i].get(), false);
    }
    return latch.first();
  }
  summary.stopped = stopped.load();
  return summary;
}

}  // namespace atfill::pipeline
