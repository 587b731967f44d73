// Live events held while their repo is backfilled (stages::LiveHold over state::LiveHolds), and the
// event encoding that keeps them in state.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "atproto/json.hpp"
#include "pipeline/event.hpp"
#include "stages/live_hold.hpp"
#include "state/kv_store.hpp"
#include "state/live_holds.hpp"

namespace atfill::stages {
namespace {

using pipeline::AccountEvent;
using pipeline::AccountStatus;
using pipeline::Event;
using pipeline::EventChunk;
using pipeline::Operation;
using pipeline::RecordEvent;

const std::string kA = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa";
const std::string kB = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb";

Event Rec(const std::string& did, const std::string& rkey, const std::string& rev,
          Operation op = Operation::kCreate) {
  RecordEvent r;
  r.did = did;
  r.collection = "app.bsky.feed.post";
  r.rkey = rkey;
  r.operation = op;
  r.rev = rev;
  r.position = 7;
  if (op != Operation::kDelete) {
    r.body = "{\"$type\":\"app.bsky.feed.post\",\"text\":\"" + rkey + "\"}";
    r.cid = *atproto::CidOfRecord(r.body);
    r.created_at = "2025-01-01T00:00:00Z";
  }
  return r;
}

Event Acct(const std::string& did, AccountStatus status) {
  AccountEvent a;
  a.did = did;
  a.status = status;
  a.active = status == AccountStatus::kActive;
  a.seq = 42;
  a.time_us = 1'735'689'600'000'000;
  return a;
}

// "A:rkey@rev" per record event, "A:account" per account event.
std::vector<std::string> Names(const EventChunk& chunk) {
  std::vector<std::string> out;
  for (const auto& e : chunk.events) {
    const std::string who = pipeline::DidOf(e) == kA ? "A" : "B";
    if (const auto* r = std::get_if<RecordEvent>(&e)) {
      out.push_back(who + ":" + r->rkey + "@" + r->rev);
    } else {
      out.push_back(who + ":account");
    }
  }
  return out;
}

int64_t Counter(const EventChunk& chunk, const std::string& name) {
  int64_t n = 0;
  for (const auto& [k, v] : chunk.counters) {
    if (k == name) n += v;
  }
  return n;
}

TEST(EventEncodingTest, RecordAndAccountEventsRoundTrip) {
  for (const Event& e : {Rec(kA, "r1", "3l2222222222e"), Rec(kA, "r2", "", Operation::kDelete),
                         Acct(kB, AccountStatus::kTakendown)}) {
    const std::string bytes = pipeline::EncodeEvent(e);
    auto back = pipeline::DecodeEvent(bytes);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(pipeline::EncodeEvent(*back), bytes);
    EXPECT_EQ(back->index(), e.index());
  }
  AccountEvent resync;
  resync.did = kA;
  resync.resync = true;
  resync.resync_collections = {"app.bsky.feed.*", "app.bsky.graph.follow"};
  auto back = pipeline::DecodeEvent(pipeline::EncodeEvent(resync));
  ASSERT_TRUE(back.ok());
  const auto& a = std::get<AccountEvent>(*back);
  EXPECT_TRUE(a.resync);
  EXPECT_EQ(a.resync_collections, resync.resync_collections);
  auto decoded = pipeline::DecodeEvent(pipeline::EncodeEvent(Rec(kA, "r1", "3l2222222222e")));
  ASSERT_TRUE(decoded.ok());
  const auto& r = std::get<RecordEvent>(*decoded);
  EXPECT_EQ(r.cid, std::get<RecordEvent>(Rec(kA, "r1", "x")).cid);
  EXPECT_EQ(r.created_at, "2025-01-01T00:00:00Z");
  EXPECT_EQ(r.position, 7u);
  // Truncated or foreign bytes are Corrupt, never a crash.
  std::string bytes = pipeline::EncodeEvent(Rec(kA, "r1", "3l2222222222e"));
  for (size_t n : {size_t{0}, size_t{1}, bytes.size() / 2, bytes.size() - 1}) {
    auto bad = pipeline::DecodeEvent(std::string_view(bytes).substr(0, n));
    EXPECT_FALSE(bad.ok()) << n;
  }
  EXPECT_FALSE(pipeline::DecodeEvent("\x01\x01\x01\x07").ok());  // kind 7
}

// Drives one LiveHold as the engine does: Process per chunk, SealBatch + commit per batch.
class LiveHoldTest : public ::testing::Test {
 protected:
  LiveHoldTest() : kv_(state::NewMemoryKvStore()), holds_(*kv_) {}

  void MakeHold() {
    LiveHoldOptions o;
    o.backfill_running = [this] { return running_; };
    o.hold_all = [this] { return hold_all_; };
    o.clock = [this] { return ++clock_; };
    o.consumes = consumes_;
    hold_ = std::make_unique<LiveHold>(&holds_, o);
    st_ = hold_->NewState();
  }
  EventChunk Process(std::vector<Event> events) {
    EventChunk chunk;
    chunk.events = std::move(events);
    Status s = hold_->Process(st_.get(), &chunk);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return chunk;
  }
  state::WriteBatch Seal() {
    state::WriteBatch b;
    EXPECT_TRUE(hold_->SealBatch(st_.get(), &b).ok());
    return b;
  }
  void Commit(const state::WriteBatch& b) {
    ASSERT_TRUE(kv_->Write(b).ok());
    hold_->OnCommitted(st_.get(), true);
  }
  void Crawl(const std::function<void(state::WriteBatch*)>& fn) {
    state::WriteBatch b;
    fn(&b);
    ASSERT_TRUE(kv_->Write(b).ok());
  }
  size_t HeldRepos() {
    size_t n = 0;
    EXPECT_TRUE(holds_
                    .ScanHeldRepos([&](std::string_view) {
                      ++n;
                      return true;
                    })
                    .ok());
    return n;
  }

  std::unique_ptr<state::KvStore> kv_;
  state::LiveHolds holds_;
  bool running_ = true;
  bool hold_all_ = false;
  uint64_t clock_ = 1000;
  std::unique_ptr<LiveHold> hold_;
  std::unique_ptr<pipeline::TransformState> st_;
  std::function<bool(std::string_view)> consumes_;
};

TEST_F(LiveHoldTest, AReposEventsWaitForItsCheckpointThenOnlyNewerOnesApply) {
  MakeHold();
  Crawl([&](state::WriteBatch* b) { holds_.MarkQueued(b, kA); });
  auto c1 = Process({Rec(kA, "a1", "3l0000000000a"), Rec(kB, "b1", "3l0000000000b"),
                     Rec(kA, "a2", "3l0000000000c"), Acct(kA, AccountStatus::kDeactivated)});
  EXPECT_EQ(Names(c1), (std::vector<std::string>{"B:b1@3l0000000000b"}));
  EXPECT_EQ(Counter(c1, "live_held"), 3);
  Commit(Seal());
  // Still queued: still held.
  auto c2 = Process({Rec(kA, "a3", "3l0000000000e")});
  EXPECT_TRUE(c2.events.empty());
  Commit(Seal());
  // The crawl writes the repo at rev ...c: a1 and a2 are in the snapshot; a3 and the account
  // event are not.
  Crawl([&](state::WriteBatch* b) {
    holds_.MarkFinished(b, kA);
    holds_.SetCheckpointRev(b, kA, "3l0000000000c");
  });
  auto c3 = Process({Rec(kB, "b2", "3l0000000000f"), Rec(kA, "a4", "3l0000000000g")});
  EXPECT_EQ(Names(c3), (std::vector<std::string>{"A:account", "A:a3@3l0000000000e",
                                                 "B:b2@3l0000000000f", "A:a4@3l0000000000g"}));
  EXPECT_EQ(Counter(c3, "live_released"), 2);
  EXPECT_EQ(Counter(c3, "live_hold_dropped"), 2);
  EXPECT_EQ(Counter(c3, "live_holds_released"), 1);
  Commit(Seal());
  EXPECT_EQ(HeldRepos(), 0u);
  auto ckpt = holds_.Checkpoint(kA);
  ASSERT_TRUE(ckpt.ok());
  EXPECT_FALSE(ckpt->has_value());
  auto c4 = Process({Rec(kA, "a5", "3l0000000000h")});
  EXPECT_EQ(Names(c4), (std::vector<std::string>{"A:a5@3l0000000000h"}));
}

// A backfill of one collection (added to the live consumer at run time) checkpoints the repo for
// that collection alone: held events of the repo's other collections at or below its rev are
// applied, not dropped (the fetched snapshot wrote none of them).
TEST_F(LiveHoldTest, ACheckpointDropsOnlyTheCollectionsItsCrawlWrote) {
  MakeHold();
  Crawl([&](state::WriteBatch* b) { holds_.MarkQueued(b, kA); });
  Event like = Rec(kA, "l1", "3l0000000000b");
  std::get<RecordEvent>(like).collection = "app.bsky.feed.like";
  auto c1 = Process({Rec(kA, "p1", "3l0000000000a"), like, Rec(kA, "p2", "3l0000000000d")});
  EXPECT_EQ(Counter(c1, "live_held"), 3);
  Commit(Seal());
  Crawl([&](state::WriteBatch* b) {
    holds_.MarkFinished(b, kA);
    holds_.SetCheckpointRev(b, kA, "3l0000000000c", {"app.bsky.feed.like"});
  });
  auto c2 = Process({});
  EXPECT_EQ(Names(c2), (std::vector<std::string>{"A:p1@3l0000000000a", "A:p2@3l0000000000d"}));
  EXPECT_EQ(Counter(c2, "live_hold_dropped"), 1);  // the like: in the snapshot
  Commit(Seal());

  // A collection the consumer no longer takes (removed while its events were held): dropped.
  consumes_ = [](std::string_view c) { return c != "app.bsky.feed.post"; };
  MakeHold();
  Crawl([&](state::WriteBatch* b) { holds_.MarkQueued(b, kB); });
  auto c3 = Process({Rec(kB, "p3", "3l0000000000e")});
  EXPECT_EQ(Counter(c3, "live_held"), 1);
  Commit(Seal());
  Crawl([&](state::WriteBatch* b) { holds_.MarkFinished(b, kB); });
  auto c4 = Process({});
  EXPECT_TRUE(c4.events.empty());
  EXPECT_EQ(Counter(c4, "live_unwanted"), 1);
  Commit(Seal());

  state::HoldCheckpoint all = state::HoldCheckpoint::Parse("3l0000000000c");
  EXPECT_EQ(all.rev, "3l0000000000c");
  EXPECT_TRUE(all.Covers("app.bsky.feed.post"));
  state::HoldCheckpoint some = state::HoldCheckpoint::Parse("3l0000000000c\napp.bsky.graph.*");
  EXPECT_EQ(some.rev, "3l0000000000c");
  EXPECT_TRUE(some.Covers("app.bsky.graph.follow"));
  EXPECT_FALSE(some.Covers("app.bsky.feed.post"));
}

TEST_F(LiveHoldTest, ARepoWithUnitsLeftStaysHeld) {
  MakeHold();
  // listRecords: one unit per collection; no rev at the checkpoint.
  Crawl([&](state::WriteBatch* b) {
    holds_.MarkQueued(b, kA);
    holds_.MarkQueued(b, kA);
  });
  EXPECT_TRUE(Process({Rec(kA, "a1", "3l0000000000a")}).events.empty());
  Commit(Seal());
  Crawl([&](state::WriteBatch* b) { holds_.MarkFinished(b, kA); });
  EXPECT_TRUE(Process({Rec(kA, "a2", "3l0000000000b")}).events.empty());
  Commit(Seal());
  Crawl([&](state::WriteBatch* b) { holds_.MarkFinished(b, kA); });
  auto c = Process({});
  EXPECT_EQ(Names(c), (std::vector<std::string>{"A:a1@3l0000000000a", "A:a2@3l0000000000b"}));
}

TEST_F(LiveHoldTest, AReleaseWaitsForHeldEventsNotYetDurable) {
  MakeHold();
  Crawl([&](state::WriteBatch* b) { holds_.MarkQueued(b, kA); });
  EXPECT_TRUE(Process({Rec(kA, "a1", "3l0000000000a")}).events.empty());
  state::WriteBatch first = Seal();  // batch 1 is being written to the sink
  Crawl([&](state::WriteBatch* b) { holds_.MarkFinished(b, kA); });
  // a1 is not in state yet: A is not released, and its next events keep holding behind a1.
  EXPECT_TRUE(Process({Rec(kA, "a2", "3l0000000000b")}).events.empty());
  state::WriteBatch second = Seal();
  Commit(first);
  Commit(second);
  auto c = Process({Rec(kA, "a3", "3l0000000000c")});
  EXPECT_EQ(Names(c), (std::vector<std::string>{"A:a1@3l0000000000a", "A:a2@3l0000000000b",
                                                "A:a3@3l0000000000c"}));
}

TEST_F(LiveHoldTest, HeldEventsSurviveARestartAndAreReleasedOnceNoCrawlRuns) {
  MakeHold();
  Crawl([&](state::WriteBatch* b) {
    holds_.MarkQueued(b, kA);
    holds_.MarkQueued(b, kB);
  });
  EXPECT_TRUE(
      Process({Rec(kA, "a1", "3l0000000000a"), Rec(kB, "b1", "3l0000000000b")}).events.empty());
  Commit(Seal());
  // The process stops while the crawl has neither repo written; the next run has no crawl.
  running_ = false;
  MakeHold();
  auto c = Process({Rec(kA, "a2", "3l0000000000c")});
  EXPECT_EQ(Names(c), (std::vector<std::string>{"A:a1@3l0000000000a", "B:b1@3l0000000000b",
                                                "A:a2@3l0000000000c"}));
  Commit(Seal());
  EXPECT_EQ(HeldRepos(), 0u);
  EXPECT_EQ(Names(Process({Rec(kB, "b2", "3l0000000000d")})),
            (std::vector<std::string>{"B:b2@3l0000000000d"}));
}

// A gap replay beside the stream: every event waits, whatever its repo, until the replay ends;
// then all are released in arrival order per repo, nothing dropped (no checkpoint).
TEST_F(LiveHoldTest, HoldAllHoldsEveryRepoUntilItTurnsOff) {
  running_ = false;
  hold_all_ = true;
  MakeHold();
  auto c = Process({Rec(kA, "a1", "3l0000000000a"), Acct(kB, AccountStatus::kTakendown),
                    Rec(kA, "a2", "3l0000000000b")});
  EXPECT_TRUE(c.events.empty());
  EXPECT_EQ(Counter(c, "live_held"), 3);
  Commit(Seal());
  EXPECT_EQ(HeldRepos(), 2u);
  EXPECT_TRUE(Process({Rec(kB, "b1", "3l0000000000c")}).events.empty());
  Commit(Seal());
  hold_all_ = false;
  auto released = Process({Rec(kA, "a3", "3l0000000000d")});
  EXPECT_EQ(Counter(released, "live_released"), 4);
  EXPECT_EQ(Counter(released, "live_hold_dropped"), 0);
  EXPECT_EQ(Names(released),
            (std::vector<std::string>{"A:a1@3l0000000000a", "A:a2@3l0000000000b", "B:account",
                                      "B:b1@3l0000000000c", "A:a3@3l0000000000d"}));
  Commit(Seal());
  EXPECT_EQ(HeldRepos(), 0u);
}

TEST_F(LiveHoldTest, NothingIsHeldWithoutMarks) {
  MakeHold();
  auto c = Process({Rec(kA, "a1", "3l0000000000a"), Acct(kB, AccountStatus::kTakendown)});
  EXPECT_EQ(c.events.size(), 2u);
  EXPECT_EQ(Counter(c, "live_held"), 0);
  state::WriteBatch b = Seal();
  EXPECT_TRUE(b.empty());
}

TEST_F(LiveHoldTest, AHeldEventThatDoesNotDecodeIsLoggedAndDropped) {
  MakeHold();
  Crawl([&](state::WriteBatch* b) {
    holds_.MarkQueued(b, kA);
    holds_.Hold(b, kA, 5, "garbage");
    holds_.MarkFinished(b, kA);
  });
  auto c = Process({Rec(kA, "a1", "3l0000000000a")});
  EXPECT_EQ(Names(c), (std::vector<std::string>{"A:a1@3l0000000000a"}));
  ASSERT_EQ(c.errors.size(), 1u);
  EXPECT_EQ(c.errors[0].kind, "bad_held_event");
  EXPECT_EQ(c.errors[0].key, kA);
  Commit(Seal());
  EXPECT_EQ(HeldRepos(), 0u);
}

}  // namespace
}  // namespace atfill::stages
