// FirehoseChain: each repo's commit chain over a real state store (the in-memory KvStore): commits
// apply in order, redeliveries are stale, a broken link or a #sync desynchronizes the repo, its
// commits are held until the resync, and the resync replaces the repo's rows and replays the held
// commits newer than it.
#include "sources/firehose/firehose_chain.hpp"

#include <gtest/gtest.h>

#include <deque>
#include <memory>

#include "atproto/cbor.hpp"
#include "atproto/value.hpp"
#include "state/kv_store.hpp"

namespace atfill::sources {
namespace {

using atproto::Cid;
using atproto::Value;

constexpr const char* kDid = "did:plc:abcdefghijklmnopqrstuvwx";

Cid Data(int n) { return Cid::Compute(Cid::Codec::kDagCbor, AsBytes("data " + std::to_string(n))); }
std::string Rev(int n) { return "3l22222222" + std::string(1, static_cast<char>('a' + n)) + "22"; }

// A verified commit of kDid at rev n creating one post, linked to the tree of rev `prev`.
struct TestCommit {
  FirehoseCommit frame;
  VerifiedCommit verified;
};

std::unique_ptr<TestCommit> MakeCommit(int n, int prev,
                                       const char* collection = "app.bsky.feed.post") {
  static std::deque<Bytes> records;
  auto c = std::make_unique<TestCommit>();
  c->frame.seq = 100 + n;
  c->frame.repo = kDid;
  c->frame.rev = Rev(n);
  c->frame.prev_data = Data(prev);
  Value record = Value::MakeMap({{"$type", Value::String(collection)}, {"n", Value::Int(n)}});
  record.Canonicalize();
  records.push_back(atproto::EncodeCbor(record));
  const Cid cid = Cid::Compute(Cid::Codec::kDagCbor, records.back());
  c->frame.ops.push_back({FirehoseAction::kCreate,
                          std::string(collection) + "/k" + std::to_string(n), cid, std::nullopt});
  c->verified.commit.did = kDid;
  c->verified.commit.rev = Rev(n);
  c->verified.commit.data = Data(n);
  const std::string& path = c->frame.ops[0].path;
  c->verified.ops.push_back(
      {FirehoseAction::kCreate, std::string_view(path).substr(0, path.find('/')),
       std::string_view(path).substr(path.find('/') + 1), cid, records.back()});
  return c;
}

int64_t Counter(const pipeline::EventChunk& chunk, std::string_view name) {
  int64_t n = 0;
  for (const auto& [k, v] : chunk.counters) {
    if (k == name) n += v;
  }
  return n;
}

std::vector<std::string> Rkeys(const pipeline::EventChunk& chunk) {
  std::vector<std::string> out;
  for (const pipeline::Event& e : chunk.events) {
    if (const auto* r = std::get_if<pipeline::RecordEvent>(&e)) out.push_back(r->rkey);
    if (const auto* a = std::get_if<pipeline::AccountEvent>(&e)) {
      out.push_back("resync<" + a->purge_before_rev);
    }
  }
  return out;
}

class FirehoseChainTest : public ::testing::Test {
 protected:
  // Applies `c` in a chunk of its own, committing its state writes; returns the chunk.
  pipeline::EventChunk Apply(const TestCommit& c, bool* resync) {
    pipeline::EventChunk chunk;
    chunk.seq = next_seq_++;
    EXPECT_TRUE(chain_->Commit(c.frame, c.verified, &chunk, resync).ok());
    Commit(chunk);
    return chunk;
  }
  void Commit(pipeline::EventChunk& chunk) {
    ASSERT_TRUE(kv_->Write(chunk.state_writes).ok());
    chain_->Committed(chunk.seq);
  }

  std::unique_ptr<state::KvStore> kv_ = state::NewMemoryKvStore();
  state::RepoChains chains_{*kv_};
  std::unique_ptr<FirehoseChain> chain_ =
      std::make_unique<FirehoseChain>(&chains_, FirehoseChainOptions{});
  uint64_t next_seq_ = 0;
};

TEST_F(FirehoseChainTest, CommitsApplyInOrderAndRedeliveriesAreStale) {
  bool resync = true;
  auto c1 = MakeCommit(1, 0);
  pipeline::EventChunk chunk = Apply(*c1, &resync);
  EXPECT_FALSE(resync);
  EXPECT_EQ(Rkeys(chunk), std::vector<std::string>{"k1"}) << "a repo's first commit applies";
  EXPECT_EQ(Counter(chunk, "firehose_applied"), 1);
  EXPECT_EQ(**chains_.Get(kDid), (state::RepoChain{Rev(1), Data(1).ToString(), false}));

  // Two commits in one chunk: the second links to the first before it is durable.
  pipeline::EventChunk two;
  two.seq = next_seq_++;
  auto c2 = MakeCommit(2, 1);
  auto c3 = MakeCommit(3, 2);
  ASSERT_TRUE(chain_->Commit(c2->frame, c2->verified, &two, &resync).ok());
  ASSERT_TRUE(chain_->Commit(c3->frame, c3->verified, &two, &resync).ok());
  EXPECT_EQ(Rkeys(two), (std::vector<std::string>{"k2", "k3"}));
  Commit(two);

  pipeline::EventChunk again = Apply(*c2, &resync);
  EXPECT_TRUE(again.events.empty());
  EXPECT_EQ(Counter(again, "firehose_stale"), 1);
  EXPECT_FALSE(resync);

  // Ops on collections not indexed are not emitted; the link still moves.
  chain_ =
      std::make_unique<FirehoseChain>(&chains_, FirehoseChainOptions{{"app.bsky.feed.like"}, 1000});
  auto c4 = MakeCommit(4, 3);
  pipeline::EventChunk filtered = Apply(*c4, &resync);
  EXPECT_TRUE(filtered.events.empty());
  EXPECT_EQ(Counter(filtered, "firehose_applied"), 1);
  EXPECT_EQ((*chains_.Get(kDid))->rev, Rev(4));
}

TEST_F(FirehoseChainTest, ABrokenLinkHoldsTheRepoUntilItsResync) {
  bool resync = false;
  Apply(*MakeCommit(1, 0), &resync);
  // Rev 2 never arrived: rev 3's prevData is rev 2's tree.
  pipeline::EventChunk gap = Apply(*MakeCommit(3, 2), &resync);
  EXPECT_TRUE(resync);
  EXPECT_TRUE(gap.events.empty());
  EXPECT_EQ(Counter(gap, "firehose_desync"), 1);
  ASSERT_EQ(gap.errors.size(), 1u);
  EXPECT_EQ(gap.errors[0].kind, "repo_desync");
  EXPECT_NE(gap.errors[0].message.find(Data(2).ToString()), std::string::npos)
      << gap.errors[0].message;
  EXPECT_TRUE((*chains_.Get(kDid))->desynchronized);
  // Commits after it are held, without another report.
  pipeline::EventChunk held4 = Apply(*MakeCommit(4, 3), &resync);
  pipeline::EventChunk held5 = Apply(*MakeCommit(5, 4), &resync);
  EXPECT_FALSE(resync);
  EXPECT_TRUE(held4.events.empty() && held5.events.empty());
  EXPECT_EQ(Counter(held5, "firehose_desync"), 0);
  EXPECT_EQ(chain_->desynchronized(), 1u);

  // A failed resync leaves it so.
  pipeline::EventChunk failed;
  failed.seq = next_seq_++;
  chain_->ResyncFailed(kDid, "getRepo answered 503", &failed);
  EXPECT_EQ(Counter(failed, "firehose_failed"), 1);
  EXPECT_EQ(failed.errors.at(0).kind, "resync_failed");
  Commit(failed);

  // The fetched repo is at rev 4: rev 3 and 4 are in it, rev 5 follows it.
  FetchedRepo repo{Rev(4), Data(4).ToString(), {}};
  for (int k : {1, 3, 4}) {
    pipeline::RecordEvent r;
    r.did = kDid;
    r.collection = "app.bsky.feed.post";
    r.rkey = "k" + std::to_string(k);
    r.rev = Rev(4);
    repo.records.push_back(r);
  }
  pipeline::EventChunk resynced;
  resynced.seq = next_seq_++;
  ASSERT_TRUE(chain_->Resynced(kDid, repo, &resynced, &resync).ok());
  EXPECT_FALSE(resync);
  EXPECT_EQ(Rkeys(resynced),
            (std::vector<std::string>{"resync<" + Rev(4), "k1", "k3", "k4", "k5"}));
  EXPECT_EQ(Counter(resynced, "firehose_resynced"), 1);
  EXPECT_EQ(Counter(resynced, "firehose_stale"), 2)
      << "the held revs 3 and 4 are in the fetched repo";
  EXPECT_EQ(Counter(resynced, "firehose_applied"), 1);
  Commit(resynced);
  EXPECT_EQ(**chains_.Get(kDid), (state::RepoChain{Rev(5), Data(5).ToString(), false}));
  EXPECT_EQ(chain_->desynchronized(), 0u);
  Apply(*MakeCommit(6, 5), &resync);
  EXPECT_EQ((*chains_.Get(kDid))->rev, Rev(6));
}

TEST_F(FirehoseChainTest, ASyncDesynchronizesAndARestartResumesTheResync) {
  bool resync = false;
  Apply(*MakeCommit(1, 0), &resync);
  FirehoseSync sync;
  sync.seq = 200;
  sync.did = kDid;
  sync.rev = Rev(2);
  pipeline::EventChunk chunk;
  chunk.seq = next_seq_++;
  ASSERT_TRUE(chain_->Sync(sync, &chunk, &resync).ok());
  EXPECT_TRUE(resync);
  EXPECT_EQ(Counter(chunk, "firehose_desync"), 1);
  Commit(chunk);

  // A restart: the mark is in state; the repo's next commit is held and asks for the resync
  // without a second report.
  chain_ = std::make_unique<FirehoseChain>(&chains_, FirehoseChainOptions{});
  std::vector<std::string> marked;
  ASSERT_TRUE(chains_
                  .ScanDesynchronized([&](std::string_view did, const state::RepoChain&) {
                    marked.emplace_back(did);
                    return true;
                  })
                  .ok());
  EXPECT_EQ(marked, std::vector<std::string>{kDid});
  pipeline::EventChunk after = Apply(*MakeCommit(3, 2), &resync);
  EXPECT_TRUE(resync);
  EXPECT_TRUE(after.events.empty());
  EXPECT_EQ(Counter(after, "firehose_desync"), 0);
  pipeline::EventChunk resynced;
  resynced.seq = next_seq_++;
  ASSERT_TRUE(chain_->Resynced(kDid, {Rev(2), Data(2).ToString(), {}}, &resynced, &resync).ok());
  EXPECT_EQ(Rkeys(resynced), (std::vector<std::string>{"resync<" + Rev(2), "k3"}));
}

}  // namespace
}  // namespace atfill::sources
