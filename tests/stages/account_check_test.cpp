// The account check with a fake lookup: what it drops and logs for each answer, that it hands a
// chunk with deletions off and gives it back once every answer is in, and in the engine that a
// check waiting on its PDS does not hold a worker (also run under TSan).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <span>
#include <thread>

#include "pipeline/engine.hpp"
#include "stages/account_check.hpp"

namespace atfill::stages {
namespace {

using pipeline::AccountEvent;
using pipeline::AccountStatus;
using pipeline::AccountStatusAnswer;
using pipeline::EventChunk;
using pipeline::RecordEvent;
using Verdict = pipeline::AccountStatusAnswer::Verdict;

constexpr auto kPatience = std::chrono::seconds(20);

RecordEvent Record(const std::string& did, const std::string& rkey) {
  RecordEvent r;
  r.did = did;
  r.collection = "app.bsky.feed.post";
  r.rkey = rkey;
  r.body = "{}";
  return r;
}

AccountEvent Deleted(const std::string& did) {
  AccountEvent a;
  a.did = did;
  a.status = AccountStatus::kDeleted;
  return a;
}

std::vector<std::string> Described(const EventChunk& chunk) {
  std::vector<std::string> out;
  for (const auto& e : chunk.events) {
    if (const auto* r = std::get_if<RecordEvent>(&e)) {
      out.push_back(r->did + "/" + r->rkey);
    } else {
      out.push_back("account " + std::get<AccountEvent>(e).did);
    }
  }
  return out;
}

// Answers by DID from a table. Questions wait until the test answers them (from its own thread, as
// an event loop would).
class FakeLookup : public pipeline::AccountStatusLookup {
 public:
  void Lookup(const std::string& did, int64_t timeout_ms, Done done) const override {
    std::lock_guard<std::mutex> lock(mu);
    asked.push_back(did);
    last_timeout_ms = timeout_ms;
    waiting.emplace_back(did, std::move(done));
    cv.notify_all();
  }
  AccountStatusAnswer Answer(const std::string& did) const {
    auto it = table.find(did);
    if (it == table.end()) return {Verdict::kUnknown, "no answer"};
    return {it->second, it->second == Verdict::kActive ? "the PDS says the repo is active"
                                                       : "the PDS says deleted"};
  }
  // Waits (bounded) until `n` questions wait; answers them, newest first.
  bool AnswerAll(size_t n) const {
    std::vector<std::pair<std::string, Done>> now;
    {
      std::unique_lock<std::mutex> lock(mu);
      if (!cv.wait_for(lock, kPatience, [&] { return waiting.size() >= n; })) return false;
      now = std::move(waiting);
      waiting.clear();
    }
    for (auto it = now.rbegin(); it != now.rend(); ++it) it->second(Answer(it->first));
    return true;
  }
  size_t Waiting() const {
    std::lock_guard<std::mutex> lock(mu);
    return waiting.size();
  }

  std::map<std::string, Verdict> table;
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  mutable std::vector<std::string> asked;
  mutable int64_t last_timeout_ms = 0;
  mutable std::vector<std::pair<std::string, Done>> waiting;
};

TEST(AccountCheckTest, AChunkWithoutDeletionsIsDoneAtOnce) {
  FakeLookup lookup;
  AccountCheck check(&lookup);
  EventChunk chunk;
  chunk.events.push_back(Record("did:plc:a", "1"));
  AccountEvent taken = Deleted("did:plc:b");
  taken.status = AccountStatus::kTakendown;  // moderation purges without asking
  chunk.events.push_back(taken);
  AccountEvent resync = Deleted("did:plc:c");
  resync.resync = true;
  chunk.events.push_back(resync);
  bool called = false;
  EXPECT_FALSE(check.Start(nullptr, &chunk, false, [&](Status, bool) { called = true; }));
  EXPECT_FALSE(called);
  EXPECT_TRUE(lookup.asked.empty());
  EXPECT_EQ(chunk.events.size(), 3u);
  EXPECT_TRUE(chunk.counters.empty());
}

// Every deletion is asked about at once; the chunk comes back (once) only when the last answer
// is in, whatever order they come in, with its events in their order: the active account's
// deletion dropped and logged, the others kept.
TEST(AccountCheckTest, AsksEveryDeletionAndAppliesTheAnswersInOrder) {
  FakeLookup lookup;
  lookup.table = {{"did:plc:alive", Verdict::kActive}, {"did:plc:gone", Verdict::kGone}};
  AccountCheck check(&lookup, AccountCheckOptions{.timeout_ms = 1234});
  EventChunk chunk;
  chunk.events.push_back(Record("did:plc:alive", "1"));
  chunk.events.push_back(Deleted("did:plc:alive"));
  chunk.events.push_back(Deleted("did:plc:gone"));
  chunk.events.push_back(Record("did:plc:x", "2"));
  chunk.events.push_back(Deleted("did:plc:mute"));
  chunk.events.push_back(Record("did:plc:alive", "3"));
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  Status result = Status::Internal("not called");
  ASSERT_TRUE(check.Start(nullptr, &chunk, false, [&](Status s, bool) {
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
    result = s;
    cv.notify_all();
  }));
  EXPECT_EQ(lookup.Waiting(), 3u);  // all asked before any answer
  EXPECT_EQ(lookup.last_timeout_ms, 1234);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(calls, 0);
  }
  std::thread io([&] { EXPECT_TRUE(lookup.AnswerAll(3)); });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kPatience, [&] { return calls > 0; }));
  }
  io.join();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(result.ok()) << result.ToString();
  EXPECT_EQ(Described(chunk),
            (std::vector<std::string>{"did:plc:alive/1", "account did:plc:gone", "did:plc:x/2",
                                      "account did:plc:mute", "did:plc:alive/3"}));
  EXPECT_EQ(chunk.dropped, 1u);
  ASSERT_EQ(chunk.errors.size(), 1u);
  EXPECT_EQ(chunk.errors[0].kind, "account_status_mismatch");
  EXPECT_EQ(chunk.errors[0].key, "did:plc:alive");
  EXPECT_NE(chunk.errors[0].message.find("the PDS says the repo is active"), std::string::npos);
  const auto counters =
      std::map<std::string, int64_t>(chunk.counters.begin(), chunk.counters.end());
  EXPECT_EQ(counters, (std::map<std::string, int64_t>{{"account_checks", 3},
                                                      {"account_purges_refused", 1},
                                                      {"account_purges_unconfirmed", 1}}));
  const AccountCheckStats s = check.stats();
  EXPECT_EQ(s.checks, 3u);
  EXPECT_EQ(s.refused, 1u);
  EXPECT_EQ(s.unconfirmed, 1u);
}

class Records : public pipeline::Source {
 public:
  explicit Records(uint64_t chunks) : chunks_(chunks) {}
  Status Seek(const std::string&) override { return Status::OK(); }
  Result<bool> Read(EventChunk* chunk) override {
    if (next_ >= chunks_) return false;
    const std::string n = std::to_string(next_);
    chunk->events.push_back(Record("did:plc:r" + n, n));
    // The first chunk holds a deletion the PDS denies.
    if (next_ == 0) chunk->events.push_back(Deleted("did:plc:alive"));
    ++next_;
    chunk->resume_cursor = n;
    return true;
  }
  std::string Describe() const override { return "records"; }

 private:
  uint64_t chunks_, next_ = 0;
};

class Rkeys : public pipeline::Sink {
 public:
  Result<pipeline::WriteStats> Write(std::span<const pipeline::Event> batch) override {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& e : batch) {
      if (const auto* r = std::get_if<RecordEvent>(&e)) {
        rkeys.push_back(r->rkey);
      } else {
        rkeys.push_back("account");
      }
    }
    cv.notify_all();
    return pipeline::WriteStats{};
  }
  std::string_view name() const override { return "rkeys"; }
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> rkeys;
};

class Counting : public pipeline::Committer {
 public:
  Status PrepareCommit(const pipeline::BatchReport& report, state::WriteBatch*) override {
    for (const EventChunk* c : report.batch->chunks) {
      for (const auto& [name, delta] : c->counters) counters[name] += delta;
    }
    return Status::OK();
  }
  void OnCommitted(const pipeline::BatchReport&) override {}
  bool StopRequested() const override { return false; }
  std::map<std::string, int64_t> counters;
};

// A stage after the check: counts the chunks that passed it.
class Passed : public pipeline::Transform {
 public:
  std::string_view name() const override { return "passed"; }
  Status Process(pipeline::TransformState*, EventChunk*) const override {
    std::lock_guard<std::mutex> lock(mu);
    ++n;
    cv.notify_all();
    return Status::OK();
  }
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  mutable size_t n = 0;
};

// In the engine with one worker: while the first chunk's deletion waits for its PDS, the worker
// takes the chunks after it through the check and the stage after it; none of them commits before
// the first, and once the PDS answers, everything lands in order with the denied deletion dropped.
TEST(AccountCheckTest, APendingCheckDoesNotHoldAWorker) {
  FakeLookup lookup;
  lookup.table = {{"did:plc:alive", Verdict::kActive}};
  AccountCheck check(&lookup);
  Passed passed;
  Records source(20);
  Rkeys sink;
  Counting committer;
  auto kv = state::NewMemoryKvStore();
  pipeline::EngineOptions options;
  options.workers = 1;
  options.batch = {.max_events = 4, .max_delay_ms = 60'000, .max_chunks = 2};
  options.max_chunks_in_flight = 10;
  pipeline::Engine engine(options, &source, {&check, &passed}, &sink, kv.get(), &committer);
  Result<pipeline::RunSummary> summary = Status::Internal("not run");
  std::thread run([&] { summary = engine.Run(""); });
  {
    std::unique_lock<std::mutex> lock(passed.mu);
    EXPECT_TRUE(passed.cv.wait_for(lock, kPatience, [&] { return passed.n >= 6; }));
  }
  EXPECT_EQ(lookup.Waiting(), 1u);  // the first chunk's question is still open
  {
    std::lock_guard<std::mutex> lock(sink.mu);
    EXPECT_TRUE(sink.rkeys.empty());
  }
  std::thread io([&] { EXPECT_TRUE(lookup.AnswerAll(1)); });
  io.join();
  run.join();
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  std::vector<std::string> want;
  for (int i = 0; i < 20; ++i) want.push_back(std::to_string(i));
  EXPECT_EQ(sink.rkeys, want);
  EXPECT_EQ(committer.counters["account_checks"], 1);
  EXPECT_EQ(committer.counters["account_purges_refused"], 1);
}

}  // namespace
}  // namespace atfill::stages
