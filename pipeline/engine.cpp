#include "pipeline/engine.hpp"

#include "base/clock.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "pipeline/engine_graph.hpp"
#include "pipeline/tsan.hpp"

namespace atfill::pipeline {
namespace internal {

struct SealedBatch {
  PendingBatch batch;
  // The ordered stages' state writes for this batch (tombstones...), committed with the cursor.
  state::WriteBatch writes;
};

}  // namespace internal

namespace {

// Keeps the first failure of a run and cancels the graph; later failures are consequences.
class FailureLatch {
 public:
  void Attach(internal::GraphHandle* graph) { graph_ = graph; }
  // True when `status` is the run's first failure.
  bool Fail(Status status) {
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (first_.ok()) {
        first_ = std::move(status);
        first = true;
      }
    }
    failed_.store(true, std::memory_order_release);
    if (graph_ != nullptr) graph_->Cancel();
    return first;
  }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  Status first() const {
    std::lock_guard<std::mutex> lock(mu_);
    return first_;
  }

 private:
  internal::GraphHandle* graph_ = nullptr;
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

// Per-worker states of an unordered transform, one per thread that runs it. (Not oneTBB's
// enumerable_thread_specific: this file keeps oneTBB's templates out, see engine_graph.cpp.)
class TransformStates {
 public:
  explicit TransformStates(const Transform* t) : transform_(t) {}
  TransformState* Local() {
    std::lock_guard<std::mutex> lock(mu_);
    auto& state = states_[std::this_thread::get_id()];
    if (!state) state = transform_->NewState();
    return state.get();
  }
  const Transform* transform() const { return transform_; }

 private:
  const Transform* transform_;
  std::mutex mu_;
  std::unordered_map<std::thread::id, std::unique_ptr<TransformState>> states_;
};

// The run's chunks, reused: the in-flight limit bounds how many exist, and a reused chunk keeps
// its buffers' capacity. A released chunk is cleared when it is next acquired, on the reading
// thread, so freeing a batch's events costs the serial sink node nothing. Thread-safe.
class ChunkPool {
 public:
  static constexpr size_t kKeptEventCapacity = 2048;

  EventChunk* Acquire() {
    EventChunk* c = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (free_.empty()) {
        all_.push_back(std::make_unique<EventChunk>());
        return all_.back().get();
      }
      c = free_.back();
      free_.pop_back();
    }
    c->raw.clear();
    c->payload.reset();
    c->events.clear();
    // A batch's worth of events came back on this chunk: keep a chunk's worth of capacity only.
    if (c->events.capacity() > kKeptEventCapacity) std::vector<Event>().swap(c->events);
    c->errors.clear();
    c->resolved_errors.clear();
    c->resume_cursor.clear();
    c->seq = c->raw_first_position = c->units_read = c->bytes_read = c->input_done = 0;
    c->dropped = c->refused = 0;
    c->tick = c->seal = false;
    c->state_writes.Clear();
    c->counters.clear();
    c->stage.reset();
    return c;
  }
  void Release(EventChunk* c) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(c);
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<EventChunk>> all_;
  std::vector<EventChunk*> free_;
};

}  // namespace

int64_t NowMicros() { return SystemNowUs(); }

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

namespace {

// One run of the engine: what each node of the graph does.
//
// Hand-offs are annotated for ThreadSanitizer (pipeline/tsan.hpp): a chunk or sealed batch is
// released by the body that filled it and acquired by the next; each serial body (read, order,
// write) has a token that orders its calls, which TBB runs on whatever thread is free.
class EngineRun : public internal::GraphBodies {
 public:
  EngineRun(const EngineOptions& options, Source* source,
            const std::vector<const Transform*>& transforms, Sink* sink, state::KvStore* state,
            Committer* committer, const std::function<int64_t()>& now_us)
      : options_(options),
        source_(source),
        sink_(sink),
        state_(state),
        committer_(committer),
        now_us_(now_us),
        batcher_(options.batch) {
    // The source's own ordered stage comes first among the ordered ones (pipeline/source.hpp).
    if (const Transform* own = source->OrderedStage()) {
      ordered_.push_back(own);
      ordered_states_.push_back(own->NewState());
    }
    for (const Transform* t : transforms) {
      if (t->ordered()) {
        ordered_.push_back(t);
        ordered_states_.push_back(t->NewState());
      } else {
        unordered_.push_back(std::make_unique<TransformStates>(t));
      }
    }
  }

  void Attach(internal::GraphHandle* graph) override {
    if (graph == nullptr) {
      // The graph is idle: every body happened before this.
      HappensAfter(&source_token_);
      HappensAfter(&work_token_);
      HappensAfter(&order_token_);
      HappensAfter(&write_token_);
      HappensAfter(&answer_token_);
    }
    graph_ = graph;
    latch_.Attach(graph);
    if (graph != nullptr) {
      // Everything before the run (this object, the stages, the caller's objects, and stack
      // memory an earlier run used) happens before every body: oneTBB starts them in its
      // uninstrumented library.
      HappensBefore(&source_token_);
      HappensBefore(&order_token_);
      HappensBefore(&write_token_);
    }
  }

  EventChunk* Read() override {
    HappensAfter(&source_token_);
    EventChunk* out = nullptr;
    Guarded(&latch_, "source " + source_->Describe(), [&] {
      if (latch_.failed()) return;
      if (committer_->StopRequested()) {
        stopped_.store(true);
        return;
      }
      EventChunk* chunk = pool_.Acquire();
      chunk->seq = next_seq_;  // the source may read it; the number is taken when Read fills it
      auto more = source_->Read(chunk);
      if (!more.ok() || !*more) {
        if (!more.ok()) latch_.Fail(more.status().WithContext("reading " + source_->Describe()));
        pool_.Release(chunk);
        return;
      }
      chunk->seq = next_seq_++;
      out = chunk;
    });
    if (out != nullptr) HappensBefore(out);
    HappensBefore(&source_token_);
    return out;
  }

  bool Work(EventChunk* chunk) override {
    HappensAfter(chunk);
    bool ready = true;
    Guarded(&latch_, "decode", [&] {
      if (latch_.failed()) return;
      // A chunk an asynchronous stage gave back resumes after that stage.
      size_t first = 0;
      bool resumed = false;
      bool again = false;  // back to the same stage's Start
      if (resuming_.load(std::memory_order_acquire) != 0) {
        std::lock_guard<std::mutex> lock(resume_mu_);
        if (auto it = resume_at_.find(chunk); it != resume_at_.end()) {
          first = it->second.stage;
          again = it->second.again;
          resumed = true;
          resume_at_.erase(it);
          resuming_.fetch_sub(1, std::memory_order_relaxed);
        }
      }
      if (!resumed) source_->Decode(chunk);
      for (size_t i = first; i < unordered_.size(); ++i) {
        const Transform* t = unordered_[i]->transform();
        if (const AsyncTransform* async = t->AsAsync()) {
          const internal::GraphHandle::Resumer resume = graph_->Hold();
          HappensBefore(chunk);
          const bool handed_off =
              async->Start(unordered_[i]->Local(), chunk, again && i == first,
                           [this, resume, chunk, t, i](Status s, bool again) {
                             if (!s.ok()) latch_.Fail(s.WithContext(std::string(t->name())));
                             {
                               std::lock_guard<std::mutex> lock(resume_mu_);
                               resume_at_[chunk] = {again ? i : i + 1, again};
                               resuming_.fetch_add(1, std::memory_order_release);
                             }
                             HappensBefore(chunk);
                             // The graph ends (and Attach(nullptr) runs) once the last hold is
                             // released.
                             HappensBefore(&answer_token_);
                             resume(chunk);
                           });
          if (handed_off) {
            ready = false;
            return;
          }
          graph_->Unhold();  // it finished at once
          continue;
        }
        Status s = t->Process(unordered_[i]->Local(), chunk);
        if (!s.ok()) {
          latch_.Fail(s.WithContext(std::string(t->name())));
          return;
        }
      }
    });
    if (ready) HappensBefore(chunk);
    HappensBefore(&work_token_);
    return ready;
  }

  internal::SealedBatch* Order(EventChunk* chunk) override {
    HappensAfter(chunk);
    HappensAfter(&order_token_);
    internal::SealedBatch* sealed = nullptr;
    Guarded(&latch_, "ordered stages", [&] {
      if (latch_.failed()) return;
      for (size_t i = 0; i < ordered_.size(); ++i) {
        Status s = ordered_[i]->Process(ordered_states_[i].get(), chunk);
        if (!s.ok()) {
          latch_.Fail(s.WithContext(std::string(ordered_[i]->name())));
          return;
        }
      }
      ++summary_.chunks;
      summary_.units_read += chunk->units_read;
      const int64_t now = now_us_();
      batcher_.Add(chunk, now);
      if (batcher_.ShouldFlush(now)) sealed = Seal();
    });
    HappensBefore(&order_token_);
    if (sealed != nullptr) HappensBefore(sealed);
    return sealed;
  }

  void Write(internal::SealedBatch* sealed) override {
    HappensAfter(sealed);
    HappensAfter(&write_token_);
    Guarded(&latch_, "sink", [&] {
      if (!latch_.failed()) WriteSealed(sealed, true);
    });
    HappensBefore(&write_token_);
  }

  // After the graph is idle: commits what is left (also after a stop request, so a pause keeps
  // everything it read) and returns the outcome.
  Result<RunSummary> Finish() {
    HappensAfter(&source_token_);
    HappensAfter(&order_token_);
    HappensAfter(&write_token_);
    if (!latch_.failed()) {
      Guarded(&latch_, "final commit", [&] {
        if (internal::SealedBatch* sealed = Seal()) WriteSealed(sealed, false);
      });
    }
    if (latch_.failed()) {
      // Batches sealed but never made durable.
      std::lock_guard<std::mutex> lock(sealed_mu_);
      for (size_t n = 0; n < sealed_.size(); ++n) {
        for (size_t i = 0; i < ordered_.size(); ++i) {
          ordered_[i]->OnCommitted(ordered_states_[i].get(), false);
        }
      }
      if (stopped_in_sink_wait_.load()) {
        summary_.stopped = true;
        return summary_;
      }
      return latch_.first();
    }
    summary_.stopped = stopped_.load();
    if (!summary_.stopped) summary_.unfinished = source_->Unfinished();
    return summary_;
  }

 private:
  // Hands what the batcher holds to the sink side, with the ordered stages' writes for it;
  // nullptr when nothing is pending or a stage failed.
  internal::SealedBatch* Seal() {
    PendingBatch batch = batcher_.Take();
    if (batch.empty()) return nullptr;
    auto sealed = std::make_unique<internal::SealedBatch>();
    sealed->batch = std::move(batch);
    for (size_t i = 0; i < ordered_.size(); ++i) {
      Status s = ordered_[i]->SealBatch(ordered_states_[i].get(), &sealed->writes);
      if (!s.ok()) {
        latch_.Fail(s.WithContext(std::string(ordered_[i]->name())));
        return nullptr;
      }
    }
    std::lock_guard<std::mutex> lock(sealed_mu_);
    sealed_.push_back(std::move(sealed));
    return sealed_.back().get();
  }

  // Writes a sealed batch to the sink (retrying transient failures), then commits its state
  // writes; false when the run must end.
  bool WriteSealed(internal::SealedBatch* sealed, bool release) {
    {
      std::lock_guard<std::mutex> lock(sealed_mu_);
      if (sealed_.empty() || sealed_.front().get() != sealed) {
        latch_.Fail(Status::Internal("a batch reached the sink out of the order it was sealed"));
        return false;
      }
    }
    PendingBatch& batch = sealed->batch;
    BatchReport report;
    report.batch_no = summary_.batches;
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
      const Status failed =
          err.WithContext("sink " + std::string(sink_->name()) + " failed batch " +
                          std::to_string(report.batch_no) + " after " +
                          std::to_string(report.attempts) + " attempt(s)");
      if (!transient || out_of_attempts || latch_.failed()) {
        latch_.Fail(failed);
        return false;
      }
      if (committer_->StopRequested()) {
        // A pause or a cancel while the sink refuses a batch (a full disk, a database restart):
        // the run ends as stopped, not failed. This batch and those after it stay unwritten and
        // uncommitted, so the job's cursor is before them and a resume reads them again.
        if (latch_.Fail(failed)) stopped_in_sink_wait_.store(true);
        return false;
      }
      committer_->OnSinkRetry({report.batch_no, report.attempts, err, delay_ms, start});
      // A sink outage pauses ingest instead of skipping; sleep in short steps so a stop request
      // is noticed.
      for (int64_t waited = 0; waited < delay_ms && !committer_->StopRequested(); waited += 50) {
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(50, delay_ms)));
      }
      delay_ms = std::min(delay_ms * 2, options_.sink_retry.max_delay_ms);
    }
    report.write_us = now_us_() - start;

    state::WriteBatch& writes = sealed->writes;
    for (const EventChunk* c : batch.chunks) writes.Append(c->state_writes);
    Status s = committer_->PrepareCommit(report, &writes);
    if (s.ok()) s = state_->Write(writes);
    if (!s.ok()) {
      latch_.Fail(s.WithContext("committing batch " + std::to_string(report.batch_no)));
      return false;
    }
    for (size_t i = 0; i < ordered_.size(); ++i) {
      ordered_[i]->OnCommitted(ordered_states_[i].get(), true);
    }
    committer_->OnCommitted(report);
    if (!batch.chunks.empty()) source_->Committed(batch.chunks.back()->seq);
    ++summary_.batches;
    summary_.events += batch.events.size();
    summary_.stats += report.stats;
    const size_t chunks = batch.chunks.size();
    // The batch's events go back with its first chunk, to be freed (and their vector reused) by
    // the reading thread.
    if (!batch.chunks.empty()) batch.chunks.front()->events = std::move(batch.events);
    for (EventChunk* c : batch.chunks) pool_.Release(c);
    {
      std::lock_guard<std::mutex> lock(sealed_mu_);
      // Batches are written in the order they were sealed.
      sealed_.pop_front();
    }
    if (release) graph_->Release(chunks);
    return true;
  }

  const EngineOptions& options_;
  Source* source_;
  Sink* sink_;
  state::KvStore* state_;
  Committer* committer_;
  const std::function<int64_t()>& now_us_;
  internal::GraphHandle* graph_ = nullptr;
  FailureLatch latch_;
  ChunkPool pool_;
  std::vector<std::unique_ptr<TransformStates>> unordered_;
  std::vector<const Transform*> ordered_;
  std::vector<std::unique_ptr<TransformState>> ordered_states_;
  // Owned by the serial source body.
  uint64_t next_seq_ = 0;
  char source_token_ = 0;
  // Owned by the serial ordered body (summary_: chunks and units_read).
  Batcher batcher_;
  char order_token_ = 0;
  // Owned by the serial write body (summary_: the rest).
  RunSummary summary_;
  char write_token_ = 0;
  char work_token_ = 0;
  // Released by every answer of an asynchronous stage.
  char answer_token_ = 0;
  // Chunks an asynchronous stage gave back, with the index of the unordered stage they resume at
  // (the one after it, or the same one after done.Again()).
  std::mutex resume_mu_;
  struct ResumeAt {
    size_t stage = 0;
    bool again = false;
  };
  std::unordered_map<const EventChunk*, ResumeAt> resume_at_;
  std::atomic<size_t> resuming_{0};
  // Sealed batches not yet written, oldest first.
  std::mutex sealed_mu_;
  std::deque<std::unique_ptr<internal::SealedBatch>> sealed_;
  std::atomic<bool> stopped_{false};
  // Set when a stop request ended the run while the sink refused a batch (WriteSealed).
  std::atomic<bool> stopped_in_sink_wait_{false};
};

}  // namespace

Result<RunSummary> Engine::Run(const std::string& resume_cursor) {
  ATFILL_RETURN_IF_ERROR(options_.Validate());
  ATFILL_RETURN_IF_ERROR(source_->Seek(resume_cursor));
  const uint32_t workers =
      options_.workers != 0 ? options_.workers : std::max(1u, std::thread::hardware_concurrency());
  const uint32_t in_flight =
      options_.max_chunks_in_flight != 0
          ? options_.max_chunks_in_flight
          : static_cast<uint32_t>(options_.batch.max_chunks) + 2 * workers + 2;
  EngineRun run(options_, source_, transforms_, sink_, state_, committer_, now_us_);
  internal::RunGraph(&run, workers, in_flight);
  return run.Finish();
}

}  // namespace atfill::pipeline
