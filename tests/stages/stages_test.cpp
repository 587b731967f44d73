// The stages on their own, and the ingest guard inside the engine (also run under TSan).
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "atproto/json.hpp"
#include "pipeline/engine.hpp"
#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
#include "stages/lexicon_validate.hpp"
#include "state/kv_store.hpp"
#include "state/tombstones.hpp"

namespace atfill::stages {
namespace {

using pipeline::AccountEvent;
using pipeline::AccountStatus;
using pipeline::EventChunk;
using pipeline::Operation;
using pipeline::RecordEvent;

const std::string kDid = "did:plc:ewvi7nxzyoun6zhxrhs64oiz";

RecordEvent Record(Operation op, const std::string& rkey, const std::string& rev,
                   const std::string& text = "hi") {
  RecordEvent r;
  r.did = kDid;
  r.collection = "app.bsky.feed.post";
  r.rkey = rkey;
  r.operation = op;
  r.rev = rev;
  if (op != Operation::kDelete) {
    r.body = "{\"$type\":\"app.bsky.feed.post\",\"text\":\"" + text + "\"}";
    r.cid = *atproto::CidOfRecord(r.body);
  }
  return r;
}

AccountEvent Account(AccountStatus status, bool active) {
  AccountEvent a;
  a.did = kDid;
  a.status = status;
  a.active = active;
  return a;
}

std::vector<std::string> Kept(const EventChunk& chunk) {
  std::vector<std::string> out;
  for (const auto& e : chunk.events) {
    if (const auto* r = std::get_if<RecordEvent>(&e)) {
      out.push_back(std::string(pipeline::OperationName(r->operation)) + " " + r->rkey + "@" +
                    r->rev);
    } else {
      out.push_back("account");
    }
  }
  return out;
}

TEST(CidVerifyTest, KeepsMatchesDropsMismatchesAndBadBodies) {
  CidVerify verify;
  EventChunk chunk;
  chunk.events.push_back(Record(Operation::kCreate, "a", "3l2222222222a"));
  RecordEvent wrong = Record(Operation::kCreate, "b", "3l2222222222a");
  wrong.cid = *atproto::CidOfRecord("{\"$type\":\"x.y.z\"}");
  chunk.events.push_back(wrong);
  RecordEvent bad = Record(Operation::kUpdate, "c", "3l2222222222a");
  bad.body = "{\"$type\":\"app.bsky.feed.post\",\"n\":0.5}";
  chunk.events.push_back(bad);
  chunk.events.push_back(Record(Operation::kDelete, "d", "3l2222222222a"));
  ASSERT_TRUE(verify.Process(nullptr, &chunk).ok());
  EXPECT_EQ(Kept(chunk),
            (std::vector<std::string>{"create a@3l2222222222a", "delete d@3l2222222222a"}));
  EXPECT_EQ(chunk.dropped, 2u);
  ASSERT_EQ(chunk.errors.size(), 2u);
  EXPECT_EQ(chunk.errors[0].kind, "cid_mismatch");
  EXPECT_EQ(chunk.errors[0].key, "at://" + kDid + "/app.bsky.feed.post/b");
  EXPECT_EQ(chunk.errors[1].kind, "bad_record");
}

// One record type: app.bsky.feed.post with a required text of at most 5 graphemes.
constexpr const char* kPostLexicon = R"({"lexicon":1,"id":"app.bsky.feed.post","defs":{"main":{
    "type":"record","key":"any","record":{"type":"object","required":["text"],
    "properties":{"text":{"type":"string","maxGraphemes":5}}}}}})";

std::shared_ptr<LexiconRegistry> PostLexicon() {
  atproto::LexiconCatalog::Builder b;
  EXPECT_TRUE(b.Add(kPostLexicon).ok());
  return std::make_shared<LexiconRegistry>(std::move(b));
}

RecordEvent Other(const std::string& rkey) {
  RecordEvent r = Record(Operation::kCreate, rkey, "3l2222222222a");
  r.collection = "app.bsky.feed.like";
  r.body = R"({"$type":"app.bsky.feed.like"})";
  r.cid = *atproto::CidOfRecord(r.body);
  return r;
}

std::map<std::string, int64_t> Counters(const EventChunk& chunk) {
  std::map<std::string, int64_t> out;
  for (const auto& [name, n] : chunk.counters) out[name] += n;
  return out;
}

TEST(LexiconStageTest, RejectModeDropsRecordsThatDoNotMatchTheirLexicon) {
  // Both forms: CidVerify on its own parse, and the stage for jobs that do not verify CIDs.
  CidVerify verify(LexiconCheck(PostLexicon(), LexiconMode::kReject));
  LexiconValidate validate(LexiconCheck(PostLexicon(), LexiconMode::kReject));
  for (const pipeline::Transform* stage :
       std::initializer_list<const pipeline::Transform*>{&verify, &validate}) {
    EventChunk chunk;
    chunk.events.push_back(Record(Operation::kCreate, "a", "3l2222222222a", "short"));
    chunk.events.push_back(Record(Operation::kCreate, "b", "3l2222222222a", "too long"));
    chunk.events.push_back(Other("c"));
    chunk.events.push_back(Record(Operation::kDelete, "d", "3l2222222222a"));
    RecordEvent missing = Record(Operation::kUpdate, "e", "3l2222222222a");
    missing.body = R"({"$type":"app.bsky.feed.post"})";
    missing.cid = *atproto::CidOfRecord(missing.body);
    chunk.events.push_back(missing);
    ASSERT_TRUE(stage->Process(nullptr, &chunk).ok());
    EXPECT_EQ(Kept(chunk),
              (std::vector<std::string>{"create a@3l2222222222a", "create c@3l2222222222a",
                                        "delete d@3l2222222222a"}))
        << stage->name();
    EXPECT_EQ(chunk.dropped, 2u);
    ASSERT_EQ(chunk.errors.size(), 2u);
    EXPECT_EQ(chunk.errors[0].kind, "lexicon_invalid");
    EXPECT_EQ(chunk.errors[0].key, "at://" + kDid + "/app.bsky.feed.post/b");
    EXPECT_EQ(chunk.errors[0].message,
              "record does not match its lexicon: text: string is longer than 5 graphemes (8)");
    EXPECT_EQ(chunk.errors[1].message,
              "record does not match its lexicon: text: required field is missing");
    EXPECT_EQ(Counters(chunk),
              (std::map<std::string, int64_t>{
                  {"lexicon_invalid", 2}, {"lexicon_unknown", 1}, {"lexicon_valid", 1}}));
  }
}

TEST(LexiconStageTest, LogModeWritesAndLogsAndACidMismatchIsNotValidated) {
  CidVerify verify(LexiconCheck(PostLexicon(), LexiconMode::kLog));
  EventChunk chunk;
  chunk.events.push_back(Record(Operation::kCreate, "a", "3l2222222222a", "too long"));
  RecordEvent wrong = Record(Operation::kCreate, "b", "3l2222222222a", "also too long");
  wrong.cid = *atproto::CidOfRecord("{\"$type\":\"x.y.z\"}");
  chunk.events.push_back(wrong);
  ASSERT_TRUE(verify.Process(nullptr, &chunk).ok());
  EXPECT_EQ(Kept(chunk), (std::vector<std::string>{"create a@3l2222222222a"}));
  EXPECT_EQ(chunk.dropped, 1u);
  ASSERT_EQ(chunk.errors.size(), 2u);
  EXPECT_EQ(chunk.errors[0].kind, "lexicon_invalid");
  EXPECT_EQ(chunk.errors[0].message,
            "record does not match its lexicon: text: string is longer than 5 graphemes (8) "
            "(written: mode is log)");
  EXPECT_EQ(chunk.errors[1].kind, "cid_mismatch");
  EXPECT_EQ(Counters(chunk), (std::map<std::string, int64_t>{{"lexicon_invalid", 1}}));
}

TEST(LexiconStageTest, ACatalogReplacedWhileJobsRunIsUsedFromTheNextChunk) {
  auto registry = std::make_shared<LexiconRegistry>();
  CidVerify verify(LexiconCheck(registry, LexiconMode::kReject));
  auto run = [&] {
    EventChunk chunk;
    chunk.events.push_back(Record(Operation::kCreate, "a", "3l2222222222a", "too long"));
    EXPECT_TRUE(verify.Process(nullptr, &chunk).ok());
    return chunk.events.size();
  };
  auto kv = state::NewMemoryKvStore();
  state::LexiconStore store(*kv);
  EXPECT_EQ(run(), 1u);  // no lexicon: passes as unknown
  auto added = registry->Add(kPostLexicon, store);
  ASSERT_TRUE(added.ok()) << added.status().ToString();
  EXPECT_TRUE(added->record);
  EXPECT_EQ(run(), 0u);
  ASSERT_TRUE(registry->Remove("app.bsky.feed.post", store).ok());
  EXPECT_EQ(run(), 1u);
}

class GuardTest : public ::testing::Test {
 protected:
  std::unique_ptr<state::KvStore> kv_ = state::NewMemoryKvStore();
  state::Tombstones tombstones_{*kv_};
  IngestGuard guard_{&tombstones_, [] { return int64_t{1'000}; }};

  // Processes one chunk as the engine would, then seals and commits it.
  std::vector<std::string> Run(pipeline::TransformState* st, std::vector<pipeline::Event> events) {
    EventChunk chunk;
    chunk.events = std::move(events);
    EXPECT_TRUE(guard_.Process(st, &chunk).ok());
    state::WriteBatch batch;
    EXPECT_TRUE(guard_.SealBatch(st, &batch).ok());
    EXPECT_TRUE(kv_->Write(batch).ok());
    guard_.OnCommitted(st, true);
    return Kept(chunk);
  }
};

TEST_F(GuardTest, ADeleteRefusesOlderAndRevlessCreatesButNotNewerOnes) {
  auto st = guard_.NewState();
  auto kept = Run(st.get(), {Record(Operation::kCreate, "a", "3l2222222222c"),
                             Record(Operation::kDelete, "a", "3l2222222222e"),
                             Record(Operation::kCreate, "a", "3l2222222222d"),  // before the delete
                             Record(Operation::kUpdate, "a", "3l2222222222e"),  // at it
                             Record(Operation::kCreate, "a", ""),               // no rev
                             Record(Operation::kCreate, "a", "3l2222222222f")});  // after it
  EXPECT_EQ(kept, (std::vector<std::string>{"create a@3l2222222222c", "delete a@3l2222222222e",
                                            "create a@3l2222222222f"}));
  auto stored = tombstones_.GetRecord("at://" + kDid + "/app.bsky.feed.post/a");
  ASSERT_TRUE(stored.ok());
  ASSERT_TRUE(stored->has_value());
  EXPECT_EQ((*stored)->rev, "3l2222222222e");

  // A fresh guard (a restart) finds the committed tombstone in state.
  auto fresh = guard_.NewState();
  kept = Run(fresh.get(), {Record(Operation::kCreate, "a", "3l2222222222d"),
                           Record(Operation::kCreate, "b", "3l2222222222d")});
  EXPECT_EQ(kept, (std::vector<std::string>{"create b@3l2222222222d"}));
}

TEST_F(GuardTest, PurgedAccountsTakeNoWritesUntilActiveAgain) {
  auto st = guard_.NewState();
  auto kept = Run(st.get(), {Account(AccountStatus::kTakendown, false),
                             Record(Operation::kCreate, "a", "3l2222222222c"),
                             Account(AccountStatus::kDeactivated, false),
                             Record(Operation::kCreate, "b", "3l2222222222c")});
  EXPECT_EQ(kept, (std::vector<std::string>{"account", "account"}));
  auto stored = tombstones_.GetAccount(kDid);
  ASSERT_TRUE(stored.ok() && stored->has_value());
  EXPECT_EQ((*stored)->status, "takendown");
  kept = Run(st.get(), {Record(Operation::kCreate, "c", "3l2222222222d"),
                        Account(AccountStatus::kActive, true),
                        Record(Operation::kCreate, "d", "3l2222222222d")});
  EXPECT_EQ(kept, (std::vector<std::string>{"account", "create d@3l2222222222d"}));
  stored = tombstones_.GetAccount(kDid);
  ASSERT_TRUE(stored.ok());
  EXPECT_FALSE(stored->has_value());
}

// Under the live consumer's rule a delete leaves a tombstone only where a stale create could
// still arrive: the sink holds records of the account in that collection, this run let a create
// through there, or a running backfill covers the collection.
TEST(GuardRuleTest, DeletesLeaveTombstonesOnlyWhereAStaleCreateCouldArrive) {
  auto kv = state::NewMemoryKvStore();
  state::Tombstones tombstones(*kv);
  std::vector<std::string> asked;
  stages::DeleteTombstoneRule rule;
  rule.sink_holds = [&](const std::string& did, const std::string& collection) -> Result<bool> {
    asked.push_back(collection);
    if (collection == "app.bsky.graph.block") return Status::IoError("database gone");
    return did == kDid && collection == "app.bsky.feed.like";
  };
  rule.always = {"app.bsky.actor.*"};
  IngestGuard guard(
      &tombstones, [] { return int64_t{1'000}; }, rule);
  auto in = [](Operation op, const std::string& collection, const std::string& rkey) {
    RecordEvent r = Record(op, rkey, "3l2222222222e");
    r.collection = collection;
    if (op != Operation::kDelete) {
      r.body = "{\"$type\":\"" + collection + "\"}";
      r.cid = *atproto::CidOfRecord(r.body);
    }
    return pipeline::Event(r);
  };
  auto st = guard.NewState();
  EventChunk chunk;
  chunk.events = {in(Operation::kDelete, "app.bsky.feed.post", "a"),         // nothing there
                  in(Operation::kDelete, "app.bsky.feed.like", "b"),         // the sink holds likes
                  in(Operation::kDelete, "app.bsky.actor.profile", "self"),  // a backfill covers it
                  in(Operation::kDelete, "app.bsky.graph.block", "c"),       // the sink cannot say
                  in(Operation::kCreate, "app.bsky.feed.repost", "d"),
                  in(Operation::kDelete, "app.bsky.feed.repost", "e")};  // created in this run
  ASSERT_TRUE(guard.Process(st.get(), &chunk).ok());
  EXPECT_EQ(chunk.events.size(), 6u);  // deletes are never refused
  state::WriteBatch batch;
  ASSERT_TRUE(guard.SealBatch(st.get(), &batch).ok());
  ASSERT_TRUE(kv->Write(batch).ok());
  guard.OnCommitted(st.get(), true);
  auto tombstoned = [&](const std::string& collection, const std::string& rkey) {
    auto t = tombstones.GetRecord("at://" + kDid + "/" + collection + "/" + rkey);
    EXPECT_TRUE(t.ok());
    return t.ok() && t->has_value();
  };
  EXPECT_FALSE(tombstoned("app.bsky.feed.post", "a"));
  EXPECT_TRUE(tombstoned("app.bsky.feed.like", "b"));
  EXPECT_TRUE(tombstoned("app.bsky.actor.profile", "self"));
  EXPECT_TRUE(tombstoned("app.bsky.graph.block", "c"));
  EXPECT_TRUE(tombstoned("app.bsky.feed.repost", "e"));
  ASSERT_EQ(chunk.counters.size(), 1u);
  EXPECT_EQ(chunk.counters[0], (std::pair<std::string, int64_t>{"tombstones_skipped", 1}));
  // The sink was asked only where neither the run nor a backfill already decided.
  EXPECT_EQ(asked, (std::vector<std::string>{"app.bsky.feed.post", "app.bsky.feed.like",
                                             "app.bsky.graph.block"}));
}

TEST_F(GuardTest, ABatchWritesOnlyTheTombstonesItSet) {
  auto st = guard_.NewState();
  // Batch 1 deletes a; batch 2 (processed before batch 1 is durable) deletes b.
  EventChunk one, two;
  one.events = {Record(Operation::kDelete, "a", "3l2222222222c")};
  two.events = {Record(Operation::kDelete, "b", "3l2222222222c"),
                Record(Operation::kCreate, "a", "3l2222222222b")};
  ASSERT_TRUE(guard_.Process(st.get(), &one).ok());
  state::WriteBatch first, second;
  ASSERT_TRUE(guard_.SealBatch(st.get(), &first).ok());
  ASSERT_TRUE(guard_.Process(st.get(), &two).ok());
  EXPECT_EQ(Kept(two), (std::vector<std::string>{"delete b@3l2222222222c"}));
  ASSERT_TRUE(guard_.SealBatch(st.get(), &second).ok());
  EXPECT_EQ(first.size(), second.size());
  ASSERT_TRUE(kv_->Write(first).ok());
  guard_.OnCommitted(st.get(), true);
  auto a = tombstones_.GetRecord("at://" + kDid + "/app.bsky.feed.post/a");
  auto b = tombstones_.GetRecord("at://" + kDid + "/app.bsky.feed.post/b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->has_value());
  EXPECT_FALSE(b->has_value());
  ASSERT_TRUE(kv_->Write(second).ok());
  guard_.OnCommitted(st.get(), true);
  b = tombstones_.GetRecord("at://" + kDid + "/app.bsky.feed.post/b");
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->has_value());
}

// The guard in the engine: batches are written while later chunks are guarded (the sink node and
// the ordered node at once), which is what TSan checks here.
class ChurnSource : public pipeline::Source {
 public:
  Status Seek(const std::string&) override { return Status::OK(); }
  Result<bool> Read(EventChunk* chunk) override {
    if (n_ >= 400) return false;
    for (int i = 0; i < 50; ++i, ++k_) chunk->events.push_back(Event(k_));
    chunk->resume_cursor = std::to_string(++n_);
    return true;
  }
  std::string Describe() const override { return "churn"; }

  // Event k: record r<k % 97>, every third a delete, every fifth at a stale rev.
  static RecordEvent Event(int k) {
    const std::string rev =
        k % 5 == 4 ? std::string("3l0000000000a") : "3l" + std::to_string(1000000000 + k) + "a";
    return Record(k % 3 == 0 ? Operation::kDelete : Operation::kCreate,
                  "r" + std::to_string(k % 97), rev);
  }

 private:
  int n_ = 0;
  int k_ = 0;
};

class CountingSink : public pipeline::Sink {
 public:
  Result<pipeline::WriteStats> Write(std::span<const pipeline::Event> batch) override {
    pipeline::WriteStats s;
    s.inserted = batch.size();
    written += batch.size();
    return s;
  }
  std::string_view name() const override { return "counting"; }
  uint64_t written = 0;
};

class NullCommitter : public pipeline::Committer {
 public:
  Status PrepareCommit(const pipeline::BatchReport&, state::WriteBatch*) override {
    return Status::OK();
  }
  void OnCommitted(const pipeline::BatchReport&) override {}
  bool StopRequested() const override { return false; }
};

TEST(GuardInEngineTest, GuardsWhileEarlierBatchesAreWritten) {
  auto kv = state::NewMemoryKvStore();
  state::Tombstones tombstones(*kv);
  IngestGuard guard(&tombstones);
  ChurnSource source;
  CountingSink sink;
  NullCommitter committer;
  pipeline::EngineOptions options;
  options.batch.max_events = 120;
  options.workers = 2;
  pipeline::Engine engine(options, &source, {&guard}, &sink, kv.get(), &committer);
  auto summary = engine.Run("");
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  // The same rules, applied by hand in order.
  std::map<std::string, std::string> deleted_at;
  uint64_t expected = 0;
  for (int k = 0; k < 20'000; ++k) {
    const RecordEvent e = ChurnSource::Event(k);
    if (e.operation == Operation::kDelete) {
      deleted_at[e.rkey] = e.rev;
      ++expected;
    } else if (!deleted_at.count(e.rkey) || e.rev > deleted_at[e.rkey]) {
      ++expected;
    }
  }
  EXPECT_LT(expected, 20'000u);
  EXPECT_EQ(sink.written, expected);
  uint64_t tombs = 0;
  ASSERT_TRUE(tombstones.ForEachRecord([&](std::string_view) { return ++tombs, true; }).ok());
  EXPECT_EQ(tombs, 97u);
}

}  // namespace
}  // namespace atfill::stages
