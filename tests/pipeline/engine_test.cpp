// The flow-graph engine with fakes: order, batching, retries, failures, stops, bounded memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "pipeline/engine.hpp"

namespace atfill::pipeline {
namespace {

RecordEvent MakeRecord(uint64_t n) {
  RecordEvent r;
  r.did = "did:plc:" + std::to_string(n % 7);
  r.collection = "app.bsky.feed.post";
  r.rkey = "r" + std::to_string(n);
  r.body = "{}";
  r.position = n;
  return r;
}

// Emits `chunks` chunks of `per_chunk` records each; positions count up from 1.
class CountingSource : public Source {
 public:
  CountingSource(uint64_t chunks, uint64_t per_chunk) : chunks_(chunks), per_chunk_(per_chunk) {}
  Status Seek(const std::string& cursor) override {
    next_ = cursor.empty() ? 0 : std::stoull(cursor);
    return Status::OK();
  }
  Result<bool> Read(EventChunk* chunk) override {
    if (next_ >= chunks_) return false;
    for (uint64_t i = 0; i < per_chunk_; ++i)
      chunk->events.push_back(MakeRecord(next_ * per_chunk_ + i + 1));
    chunk->units_read = per_chunk_;
    ++next_;
    chunk->resume_cursor = std::to_string(next_);
    produced.fetch_add(1);
    return true;
  }
  std::string Describe() const override { return "counting source"; }

  std::atomic<uint64_t> produced{0};

 private:
  uint64_t chunks_;
  uint64_t per_chunk_;
  uint64_t next_ = 0;
};

class RecordingSink : public Sink {
 public:
  Result<WriteStats> Write(std::span<const Event> batch) override {
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
    if (fail_transient > 0) {
      --fail_transient;
      return Status::Unavailable("database is locked");
    }
    if (fail_final) return Status::Corrupt("disk image is malformed");
    batch_sizes.push_back(batch.size());
    for (const auto& e : batch) positions.push_back(PositionOf(e));
    WriteStats s;
    s.inserted = batch.size();
    return s;
  }
  std::string_view name() const override { return "recording"; }

  std::mutex mu;
  int calls = 0;
  int fail_transient = 0;
  bool fail_final = false;
  std::vector<size_t> batch_sizes;
  std::vector<uint64_t> positions;
};

class RecordingCommitter : public Committer {
 public:
  Status PrepareCommit(const BatchReport& report, state::WriteBatch* batch) override {
    batch->Put(state::Family::kCursors, "test", report.batch->chunks.back()->resume_cursor);
    attempts.push_back(report.attempts);
    return Status::OK();
  }
  void OnCommitted(const BatchReport& report) override {
    committed_chunks += report.batch->chunks.size();
    last_cursor = report.batch->chunks.back()->resume_cursor;
  }
  bool StopRequested() const override { return stop.load(); }
  void OnSinkRetry(const SinkRetry& retry) override { retries.push_back(retry); }

  std::atomic<bool> stop{false};
  std::vector<SinkRetry> retries;
  uint64_t committed_chunks = 0;
  std::string last_cursor;
  std::vector<uint32_t> attempts;
};

// Spins for a chunk-dependent while, so parallel workers finish out of order.
class ShuffleTransform : public Transform {
 public:
  std::string_view name() const override { return "shuffle"; }
  Status Process(TransformState*, EventChunk* chunk) const override {
    volatile uint64_t x = 0;
    const uint64_t spins = ((chunk->seq * 7919) % 13) * 20000;
    for (uint64_t i = 0; i < spins; ++i) x = x + i;
    return Status::OK();
  }
};

// Ordered: checks it sees chunks in sequence.
class OrderCheck : public Transform {
 public:
  std::string_view name() const override { return "order_check"; }
  bool ordered() const override { return true; }
  Status Process(TransformState*, EventChunk* chunk) const override {
    if (chunk->seq != next_) {
      return Status::Internal("chunk " + std::to_string(chunk->seq) + " arrived before " +
                              std::to_string(next_));
    }
    ++next_;
    return Status::OK();
  }
  mutable uint64_t next_ = 0;
};

class Throwing : public Transform {
 public:
  std::string_view name() const override { return "thrower"; }
  Status Process(TransformState*, EventChunk* chunk) const override {
    if (chunk->seq == 3) throw std::runtime_error("boom");
    return Status::OK();
  }
};

EngineOptions SmallBatches() {
  EngineOptions o;
  o.batch.max_events = 100;
  o.batch.max_chunks = 8;
  o.batch.max_delay_ms = 60'000;
  o.workers = 2;
  o.sink_retry.initial_delay_ms = 1;
  o.sink_retry.max_delay_ms = 2;
  return o;
}

TEST(EngineTest, DeliversEverythingInOrderInBoundedBatches) {
  CountingSource source(50, 30);
  ShuffleTransform shuffle;
  OrderCheck order;
  RecordingSink sink;
  RecordingCommitter committer;
  auto kv = state::NewMemoryKvStore();
  Engine engine(SmallBatches(), &source, {&shuffle, &order}, &sink, kv.get(), &committer);
  auto summary = engine.Run("");
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->events, 1500u);
  EXPECT_EQ(summary->units_read, 1500u);
  EXPECT_FALSE(summary->stopped);
  ASSERT_EQ(sink.positions.size(), 1500u);
  for (size_t i = 0; i < sink.positions.size(); ++i) ASSERT_EQ(sink.positions[i], i + 1);
  for (size_t s : sink.batch_sizes) EXPECT_LE(s, 100u + 30u);
  EXPECT_EQ(committer.last_cursor, "50");
  EXPECT_EQ(committer.committed_chunks, 50u);
  auto stored = kv->Get(state::Family::kCursors, "test");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->value_or(""), "50");
}

// A source that skips a Read now and then (returns false only at the end) and records the number
// the engine gave each chunk while Read filled it; its own ordered stage tags every chunk before
// the caller's ordered stages see it.
class NumberedSource : public Source {
 public:
  class Tag : public Transform {
   public:
    std::string_view name() const override { return "source's own"; }
    bool ordered() const override { return true; }
    Status Process(TransformState*, EventChunk* chunk) const override {
      for (Event& e : chunk->events) std::get<RecordEvent>(e).rkey += "-tagged";
      return Status::OK();
    }
  };
  Status Seek(const std::string&) override { return Status::OK(); }
  Result<bool> Read(EventChunk* chunk) override {
    if (reads_ == 20) return false;
    seen.push_back(chunk->seq);
    chunk->events.push_back(MakeRecord(++reads_));
    chunk->units_read = 1;
    chunk->resume_cursor = std::to_string(reads_);
    return true;
  }
  const Transform* OrderedStage() const override { return &tag_; }
  std::string Describe() const override { return "numbered source"; }

  std::vector<uint64_t> seen;

 private:
  Tag tag_;
  uint64_t reads_ = 0;
};

// Sees every event tagged by the source's stage (it runs after it).
class TagCheck : public Transform {
 public:
  std::string_view name() const override { return "tag_check"; }
  bool ordered() const override { return true; }
  Status Process(TransformState*, EventChunk* chunk) const override {
    for (const Event& e : chunk->events) {
      if (!std::get<RecordEvent>(e).rkey.ends_with("-tagged")) {
        return Status::Internal("an event reached the caller's stage before the source's");
      }
    }
    return Status::OK();
  }
};

TEST(EngineTest, ASourceReadsItsChunksNumberAndItsOwnStageRunsFirstInOrder) {
  NumberedSource source;
  OrderCheck order;
  TagCheck check;
  RecordingSink sink;
  RecordingCommitter committer;
  auto kv = state::NewMemoryKvStore();
  Engine engine(SmallBatches(), &source, {&check, &order}, &sink, kv.get(), &committer);
  auto summary = engine.Run("");
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  ASSERT_EQ(source.seen.size(), 20u);
  for (uint64_t i = 0; i < source.seen.size(); ++i) EXPECT_EQ(source.seen[i], i);
  EXPECT_EQ(sink.positions.size(), 20u);
}

TEST(EngineTest, ResumesFromCursor) {
  CountingSource source(10, 5);
  RecordingSink sink;
  RecordingCommitter committer;
  auto kv = state::NewMemoryKvStore();
  Engine engine(SmallBatches(), &source, {}, &sink, kv.get(), &committer);
  auto summary = engine.Run("7");
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->events, 15u);
  ASSERT_FALSE(sink.positions.empty());
  EXPECT_EQ(sink.positions.front(), 36u);
}

TEST(EngineTest, RetriesATransientSinkFailure) {
  CountingSource source(3, 10);
  RecordingSink sink;
  sink.fail_transient = 3;
  RecordingCommitter committer;
  auto kv = state::NewMemoryKvStore();
  Engine engine(SmallBatches(), &source, {}, &sink, kv.get(), &committer);
  auto summary = engine.Run("");
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(sink.positions.size(), 30u);
  ASSERT_FALSE(committer.attempts.empty());
  EXPECT_EQ(committer.attempts.front(), 4u);
  // Each failed attempt is said to the committer before the wait, with the sink's reason and the
  // doubling wait (SmallBatches: 1 ms, then at most 2).
  ASSERT_EQ(committer.retries.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(committer.retries[i].batch_no, 0u);
    EXPECT_EQ(committer.retries[i].attempts, i + 1);
    EXPECT_EQ(committer.retries[i].error.code(), StatusCode::kUnavailable);
    EXPECT_EQ(committer.retries[i].error.message(), "database is locked");
    EXPECT_GT(committer.retries[i].since_us, 0);
  }
  EXPECT_EQ(committer.retries[0].retry_in_ms, 1);
  EXPECT_EQ(committer.retries[2].retry_in_ms, 2);
}

TEST(EngineTest, AFinalSinkFailureEndsTheRunWithoutCommitting) {
  CountingSource source(3, 10);
  RecordingSink sink;
  sink.fail_final = true;
  RecordingCommitter committer;
  auto kv = state::NewMemoryKvStore();
  Engine engine(SmallBatches(), &source, {}, &sink, kv.get(), &committer);
  auto summary = engine.Run("");
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(summary.status().message().find("recording"), std::string::npos);
  EXPECT_EQ(committer.committed_chunks, 0u);
  auto stored = kv->Get(state::Family::kCursors, "test");
  ASSERT_TRUE(stored.ok());
  EXPECT_FALSE(stored->has_value());
}

TEST(EngineTest, SinkRetryGivesUpAfterMaxAttempts) {
  CountingSource source(1, 10);
  RecordingSink sink;
  sink.fail_transient = 100;
  RecordingCommitter committer;
  auto kv = state::NewMemoryKvStore();
  EngineOptions options = SmallBatches();
  options.sink_retry.max_attempts = 3;
  Engine engine(options, &source, {}, &sink, kv.get(), &committer);
  auto summary = engine.Run("");
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(sink.calls, 3);
}

TEST(EngineTest, AnExceptionInAStageBecomesTheRunsError) {
  CountingSource source(1000, 10);
  Throwing thrower;
  RecordingSink sink;
  RecordingCommitter committer;
  auto kv = state::NewMemoryKvStore();
  Engine engine(SmallBatches(), &source, {&thrower}, &sink, kv.get(), &committer);
  auto summary = engine.Run("");
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), StatusCode::kInternal);
  EXPECT_NE(summary.status().message().find("boom"), std::string::npos);
  // The graph was cancelled: the source did not read everything.
  EXPECT_LT(source.produced.load(), 1000u);
}

// Stops once the committer has seen a few batches; everything read is still committed.
class StoppingCommitter : public RecordingCommitter {
 public:
  void OnCommitted(const BatchReport& report) override {
    RecordingCommitter::OnCommitted(report);
    if (committed_chunks >= 10) stop.store(true);
  }
};

TEST(EngineTest, AStopRequestEndsReadingAndCommitsWhatWasRead) {
  CountingSource source(10'000, 10);
  RecordingSink sink;
  StoppingCommitter committer;
  auto kv = state::NewMemoryKvStore();
  Engine engine(SmallBatches(), &source, {}, &sink, kv.get(), &committer);
  auto summary = engine.Run("");
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_TRUE(summary->stopped);
  EXPECT_LT(source.produced.load(), 10'000u);
  EXPECT_EQ(committer.committed_chunks, source.produced.load());
  EXPECT_EQ(sink.positions.size(), source.produced.load() * 10);
}

TEST(EngineTest, InFlightChunksStayBounded) {
  class Watching : public Committer {
   public:
    explicit Watching(CountingSource* s) : source_(s) {}
    Status PrepareCommit(const BatchReport&, state::WriteBatch*) override { return Status::OK(); }
    void OnCommitted(const BatchReport& report) override {
      committed_ += report.batch->chunks.size();
      max_seen = std::max<uint64_t>(
          max_seen, source_->produced.load() - committed_ + report.batch->chunks.size());
    }
    bool StopRequested() const override { return false; }
    uint64_t max_seen = 0;

   private:
    CountingSource* source_;
    uint64_t committed_ = 0;
  };
  CountingSource source(2000, 4);
  RecordingSink sink;
  Watching committer(&source);
  auto kv = state::NewMemoryKvStore();
  EngineOptions options = SmallBatches();
  options.max_chunks_in_flight = 12;
  Engine engine(options, &source, {}, &sink, kv.get(), &committer);
  ASSERT_TRUE(engine.Run("").ok());
  EXPECT_GT(committer.max_seen, 0u);
  EXPECT_LE(committer.max_seen, 12u + 1u);
}

// The live consumer's watermark: a gate holds chunk 5 in its worker while the chunks after it
// complete. The committed cursor never passes chunk 5 and nothing after it reaches the sink; once
// the gate opens, everything lands in order. Every commit made while the gate is shut is checked
// as it happens, and the gate stays shut until the run has done all it can around the held chunk:
// the chunks before it committed (batches of 2: chunks 0..3) and every chunk the in-flight limit
// admits after it (16 uncommitted: chunks 4..19) through the stages.
TEST(EngineTest, TheCursorNeverPassesAChunkStillInAStage) {
  // What the stages and the commits report, one lock and one condition for the test to wait on.
  struct Observed {
    std::mutex mu;
    std::condition_variable cv;
    bool held = false;   // chunk 5 is in the gate
    bool open = false;   // the gate let it go
    uint64_t later = 0;  // chunks after 5 through the gate
    uint64_t commits = 0;
    uint64_t highest = 0;  // the newest cursor committed: chunks [0, highest) are applied
    std::vector<std::string> violations;  // commits past chunk 5 while it was held
  };
  class Gate : public Transform {
   public:
    explicit Gate(Observed* o) : o_(o) {}
    std::string_view name() const override { return "gate"; }
    Status Process(TransformState*, EventChunk* chunk) const override {
      std::unique_lock<std::mutex> lock(o_->mu);
      if (chunk->seq == 5) {
        o_->held = true;
        o_->cv.notify_all();
        o_->cv.wait(lock, [&] { return o_->open; });
      } else if (chunk->seq > 5) {
        ++o_->later;
        o_->cv.notify_all();
      }
      return Status::OK();
    }

   private:
    Observed* o_;
  };
  class Watermark : public Committer {
   public:
    explicit Watermark(Observed* o) : o_(o) {}
    Status PrepareCommit(const BatchReport&, state::WriteBatch*) override { return Status::OK(); }
    void OnCommitted(const BatchReport& report) override {
      std::lock_guard<std::mutex> lock(o_->mu);
      ++o_->commits;
      const uint64_t cursor = std::stoull(report.batch->chunks.back()->resume_cursor);
      o_->highest = std::max(o_->highest, cursor);
      if (!o_->open) {
        if (cursor > 5) o_->violations.push_back("cursor " + std::to_string(cursor));
        for (const auto& e : report.batch->events) {
          if (PositionOf(e) > 50)
            o_->violations.push_back("position " + std::to_string(PositionOf(e)));
        }
      }
      o_->cv.notify_all();
    }
    bool StopRequested() const override { return false; }

   private:
    Observed* o_;
  };
  Observed observed;
  CountingSource source(40, 10);
  Gate gate(&observed);
  RecordingSink sink;
  Watermark committer(&observed);
  auto kv = state::NewMemoryKvStore();
  EngineOptions options = SmallBatches();
  options.workers = 4;
  options.batch.max_chunks = 2;
  options.max_chunks_in_flight = 16;
  Engine engine(options, &source, {&gate}, &sink, kv.get(), &committer);
  Result<RunSummary> summary = Status::Internal("not run");
  std::thread run([&] { summary = engine.Run(""); });
  {
    std::unique_lock<std::mutex> lock(observed.mu);
    const bool reached = observed.cv.wait_for(lock, std::chrono::seconds(20), [&] {
      return observed.held && observed.later >= 14 && observed.commits >= 2;
    });
    EXPECT_TRUE(reached) << "held " << observed.held << ", later " << observed.later << ", commits "
                         << observed.commits;
    EXPECT_EQ(observed.commits, 2u);  // chunks 0..3; chunk 4 waits for 5 in the batcher
    EXPECT_EQ(observed.highest, 4u);
    EXPECT_EQ(observed.later, 14u);  // the in-flight limit admits no chunk past 19
    EXPECT_TRUE(observed.violations.empty()) << observed.violations.front();
    observed.open = true;
  }
  observed.cv.notify_all();
  run.join();
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_TRUE(observed.violations.empty());
  ASSERT_EQ(sink.positions.size(), 400u);
  for (size_t i = 0; i < sink.positions.size(); ++i) ASSERT_EQ(sink.positions[i], i + 1);
  EXPECT_EQ(observed.highest, 40u);
}

}  // namespace
}  // namespace atfill::pipeline
