// Asynchronous stages in the engine: a chunk handed off to I/O frees its worker, comes back to the
// stages after it, and still commits in source order (also run under TSan).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "pipeline/delay_queue.hpp"
#include "pipeline/engine.hpp"

namespace atfill::pipeline {
namespace {

constexpr auto kPatience = std::chrono::seconds(20);

// Emits `chunks` chunks of `per_chunk` records; positions count up from 1.
class Numbers : public Source {
 public:
  Numbers(uint64_t chunks, uint64_t per_chunk) : chunks_(chunks), per_chunk_(per_chunk) {}
  Status Seek(const std::string&) override { return Status::OK(); }
  Result<bool> Read(EventChunk* chunk) override {
    if (next_ >= chunks_) return false;
    for (uint64_t i = 0; i < per_chunk_; ++i) {
      RecordEvent r;
      r.did = "did:plc:" + std::to_string(i % 3);
      r.collection = "app.bsky.feed.post";
      r.rkey = "r" + std::to_string(next_ * per_chunk_ + i + 1);
      r.body = "{}";
      r.position = next_ * per_chunk_ + i + 1;
      chunk->events.push_back(std::move(r));
    }
    chunk->units_read = per_chunk_;
    chunk->resume_cursor = std::to_string(++next_);
    return true;
  }
  std::string Describe() const override { return "numbers"; }

 private:
  uint64_t chunks_, per_chunk_, next_ = 0;
};

class Positions : public Sink {
 public:
  Result<WriteStats> Write(std::span<const Event> batch) override {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& e : batch) positions.push_back(PositionOf(e));
    WriteStats s;
    s.inserted = batch.size();
    return s;
  }
  std::string_view name() const override { return "positions"; }
  std::vector<uint64_t> Snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return positions;
  }

  std::mutex mu;
  std::vector<uint64_t> positions;
};

class Cursor : public Committer {
 public:
  Status PrepareCommit(const BatchReport&, state::WriteBatch*) override { return Status::OK(); }
  void OnCommitted(const BatchReport&) override {}
  bool StopRequested() const override { return false; }
};

// Parks the chunks with the chosen seqs (their `done` waits for the test to call it, as an I/O
// thread would); the others it finishes at once, some by returning false and some by calling
// `done` inline before Start returns.
class Parking : public AsyncTransform {
 public:
  explicit Parking(std::vector<uint64_t> parked) : parked_(std::move(parked)) {}
  std::string_view name() const override { return "parking"; }
  bool Start(TransformState*, EventChunk* chunk, bool, Done done) const override {
    if (std::find(parked_.begin(), parked_.end(), chunk->seq) != parked_.end()) {
      std::lock_guard<std::mutex> lock(mu);
      waiting.push_back(std::move(done));
      cv.notify_all();
      return true;
    }
    if (chunk->seq % 2 == 0) {
      done(Status::OK());
      return true;
    }
    return false;
  }
  // Waits (bounded) until `n` chunks are parked; their callbacks, taken.
  std::vector<Done> Take(size_t n) const {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, kPatience, [&] { return waiting.size() >= n; });
    return std::move(waiting);
  }

  mutable std::mutex mu;
  mutable std::condition_variable cv;
  mutable std::vector<Done> waiting;

 private:
  std::vector<uint64_t> parked_;
};

// A CPU stage after the asynchronous one: counts the chunks that reached it.
class Tally : public Transform {
 public:
  std::string_view name() const override { return "tally"; }
  Status Process(TransformState*, EventChunk* chunk) const override {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(chunk->seq);
    cv.notify_all();
    return Status::OK();
  }
  // Waits (bounded) until `n` chunks passed.
  size_t WaitFor(size_t n) const {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, kPatience, [&] { return seen.size() >= n; });
    return seen.size();
  }
  bool Saw(uint64_t seq) const {
    std::lock_guard<std::mutex> lock(mu);
    return std::find(seen.begin(), seen.end(), seq) != seen.end();
  }

  mutable std::mutex mu;
  mutable std::condition_variable cv;
  mutable std::vector<uint64_t> seen;
};

EngineOptions OneWorker() {
  EngineOptions o;
  o.workers = 1;
  o.batch.max_events = 10;
  o.batch.max_chunks = 2;
  o.batch.max_delay_ms = 60'000;
  o.max_chunks_in_flight = 12;
  return o;
}

// With one worker, chunk 0 waiting in the asynchronous stage does not stop the chunks after it
// from passing every stage; nothing commits before chunk 0 (commits stay in source order), and
// once its answer comes the chunk runs the stages after the asynchronous one and all of it lands
// in order.
TEST(EngineAsyncTest, AChunkWaitingOnIoFreesItsWorker) {
  Numbers source(30, 5);
  Parking parking({0});
  Tally tally;
  Positions sink;
  Cursor committer;
  auto kv = state::NewMemoryKvStore();
  Engine engine(OneWorker(), &source, {&parking, &tally}, &sink, kv.get(), &committer);
  Result<RunSummary> summary = Status::Internal("not run");
  std::thread run([&] { summary = engine.Run(""); });
  std::vector<AsyncTransform::Done> parked = parking.Take(1);
  ASSERT_EQ(parked.size(), 1u);
  // The single worker went on with later chunks while chunk 0 waits (up to the in-flight limit).
  EXPECT_GE(tally.WaitFor(8), 8u);
  EXPECT_FALSE(tally.Saw(0));
  EXPECT_TRUE(sink.Snapshot().empty());
  parked[0](Status::OK());
  run.join();
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_TRUE(tally.Saw(0));
  EXPECT_EQ(tally.seen.size(), 30u);
  const std::vector<uint64_t> got = sink.Snapshot();
  ASSERT_EQ(got.size(), 150u);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], i + 1);
}

// Answers that come back in the reverse order of the chunks still commit in source order.
TEST(EngineAsyncTest, AnswersOutOfOrderCommitInOrder) {
  Numbers source(12, 3);
  Parking parking({1, 3, 5, 7});
  Tally tally;
  Positions sink;
  Cursor committer;
  auto kv = state::NewMemoryKvStore();
  EngineOptions options = OneWorker();
  options.workers = 2;
  Engine engine(options, &source, {&parking, &tally}, &sink, kv.get(), &committer);
  Result<RunSummary> summary = Status::Internal("not run");
  std::thread run([&] { summary = engine.Run(""); });
  std::vector<AsyncTransform::Done> parked = parking.Take(4);
  ASSERT_EQ(parked.size(), 4u);
  // From another thread, as an event loop would answer.
  std::thread io([&] {
    for (auto it = parked.rbegin(); it != parked.rend(); ++it) (*it)(Status::OK());
  });
  io.join();
  run.join();
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  const std::vector<uint64_t> got = sink.Snapshot();
  ASSERT_EQ(got.size(), 36u);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], i + 1);
}

// A failure the asynchronous stage reports is the run's failure, named after the stage.
TEST(EngineAsyncTest, AFailedAnswerEndsTheRun) {
  Numbers source(20, 2);
  Parking parking({4});
  Positions sink;
  Cursor committer;
  auto kv = state::NewMemoryKvStore();
  Engine engine(OneWorker(), &source, {&parking}, &sink, kv.get(), &committer);
  Result<RunSummary> summary = Status::Internal("not run");
  std::thread run([&] { summary = engine.Run(""); });
  std::vector<AsyncTransform::Done> parked = parking.Take(1);
  ASSERT_EQ(parked.size(), 1u);
  parked[0](Status::Unavailable("the PDS loop went away"));
  run.join();
  ASSERT_FALSE(summary.ok());
  EXPECT_NE(summary.status().message().find("parking"), std::string::npos)
      << summary.status().ToString();
  EXPECT_NE(summary.status().message().find("the PDS loop went away"), std::string::npos);
  for (uint64_t p : sink.Snapshot()) EXPECT_LE(p, 8u);  // nothing from chunk 4 on
}

// Process on an asynchronous stage is a mistake of the caller, not a silent no-op.
TEST(EngineAsyncTest, ProcessOnAnAsyncStageFails) {
  Parking parking({});
  EventChunk chunk;
  EXPECT_FALSE(parking.Process(nullptr, &chunk).ok());
  EXPECT_EQ(parking.AsAsync(), &parking);
}

// The delay queue runs callbacks by due time (ties in the order given), and its destructor runs
// what still waits at once rather than dropping it (a chunk waiting on it would never come back).
TEST(DelayQueueTest, RunsByDueTimeAndFlushesOnDestruction) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> ran;
  auto note = [&](int n) {
    return [&, n] {
      std::lock_guard<std::mutex> lock(mu);
      ran.push_back(n);
      cv.notify_all();
    };
  };
  {
    DelayQueue q;
    q.After(std::chrono::milliseconds(30), note(3));
    q.After(std::chrono::milliseconds(0), note(1));
    q.After(std::chrono::milliseconds(0), note(2));
    {
      std::unique_lock<std::mutex> lock(mu);
      ASSERT_TRUE(cv.wait_for(lock, kPatience, [&] { return ran.size() == 3; }));
    }
    q.After(std::chrono::hours(1), note(4));
  }
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace atfill::pipeline
