// The replay source over a directory archive written by ArchiveWriter: the exact filter, the
// account sweep (markers as of their time), failed blocks, the stop after blocks failed in a row,
// and resuming from a cursor. The source is driven by hand (Read, Decode, the chunk's state writes
// applied, Committed), as the engine would.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "atproto/cid.hpp"
#include "atproto/json.hpp"
#include "pipeline/engine.hpp"
#include "sources/archive/archive.hpp"
#include "sources/archive/archive_writer.hpp"
#include "sources/archive/jss.hpp"
#include "sources/archive/replay.hpp"
#include "state/failed_blocks.hpp"
#include "state/kv_store.hpp"

namespace atfill::sources {
namespace {

namespace fs = std::filesystem;
using pipeline::AccountEvent;
using pipeline::Event;
using pipeline::RecordEvent;

// The scratch folders of this process, removed when it exits.
std::vector<fs::path>& ScratchFolders() {
  static std::vector<fs::path> folders;
  static const bool registered = [] {
    return std::atexit([] {
             std::error_code ec;
             for (const fs::path& p : ScratchFolders()) fs::remove_all(p, ec);
           }) == 0;
  }();
  (void)registered;
  return folders;
}

fs::path Scratch(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("atfill-replay-test-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  ScratchFolders().push_back(p);
  return p;
}

constexpr int64_t kT0 = 1'780'000'000'000'000;
constexpr int64_t kHour = 3'600'000'000;

RecordEvent Create(const std::string& did, const std::string& collection, const std::string& rkey,
                   const std::string& rev, const std::string& text) {
  RecordEvent r;
  r.did = did;
  r.collection = collection;
  r.rkey = rkey;
  r.rev = rev;
  r.operation = pipeline::Operation::kCreate;
  r.body = R"({"$type":")" + collection + R"(","createdAt":"2026-01-01T00:00:00.000Z","text":")" +
           text + R"("})";
  return r;
}

RecordEvent Delete(const std::string& did, const std::string& collection, const std::string& rkey,
                   const std::string& rev) {
  RecordEvent r;
  r.did = did;
  r.collection = collection;
  r.rkey = rkey;
  r.rev = rev;
  r.operation = pipeline::Operation::kDelete;
  return r;
}

AccountEvent Account(const std::string& did, bool active, pipeline::AccountStatus status) {
  AccountEvent a;
  a.did = did;
  a.active = active;
  a.status = status;
  return a;
}

constexpr const char* kPost = "app.bsky.feed.post";
constexpr const char* kLike = "app.bsky.feed.like";
const std::string kA = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa";
const std::string kB = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb";
const std::string kC = "did:plc:cccccccccccccccccccccccc";

// Writes events (with their witnessed times) to a new archive in `dir`.
void WriteArchive(const fs::path& dir,
                  const std::vector<std::pair<JetstreamFrame::Payload, int64_t>>& events,
                  uint32_t rows_per_block, uint64_t segment_bytes = uint64_t{256} << 20) {
  ArchiveWriterOptions o;
  o.rows_per_block = rows_per_block;
  o.segment_bytes = segment_bytes;
  auto w = ArchiveWriter::Open(dir.string(), o);
  ASSERT_TRUE(w.ok()) << w.status().message();
  for (const auto& [e, t] : events) {
    auto seq = (*w)->Append(e, t);
    ASSERT_TRUE(seq.ok()) << seq.status().message();
  }
  ASSERT_TRUE((*w)->Finish().ok());
}

// What a run of the source produced.
struct RunResult {
  std::vector<Event> events;
  std::vector<pipeline::EventError> errors;
  Status status;
  std::string last_cursor;
};

// Runs the source to its end as the engine would: each chunk decoded, its state writes applied,
// then reported committed.
RunResult Drive(ReplaySource& source, state::KvStore& kv, size_t max_chunks = SIZE_MAX) {
  RunResult out;
  uint64_t seq = 0;
  for (size_t n = 0; n < max_chunks; ++n) {
    pipeline::EventChunk chunk;
    auto more = source.Read(&chunk);
    if (!more.ok()) {
      out.status = more.status();
      return out;
    }
    if (!*more) break;
    source.Decode(&chunk);
    for (auto& e : chunk.events) out.events.push_back(std::move(e));
    for (auto& e : chunk.errors) out.errors.push_back(std::move(e));
    if (!chunk.resume_cursor.empty()) out.last_cursor = chunk.resume_cursor;
    EXPECT_TRUE(kv.Write(chunk.state_writes).ok());
    source.Committed(seq++);
  }
  return out;
}

std::string Describe(const Event& e) {
  if (const auto* r = std::get_if<RecordEvent>(&e)) {
    return std::string(pipeline::OperationName(r->operation)) + " " + r->Uri();
  }
  const auto& a = std::get<AccountEvent>(e);
  return (a.resync ? std::string("resync ")
                   : "account " + std::string(pipeline::AccountStatusName(a.status)) + " ") +
         a.did;
}

std::vector<std::string> Describe(const std::vector<Event>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) out.push_back(Describe(e));
  return out;
}

TEST(ReplayTest, TheRecordsSweepKeepsOnlyTheJobsCollectionsWithCidsOfTheStoredRecords) {
  const fs::path dir = Scratch("filter");
  std::vector<std::pair<JetstreamFrame::Payload, int64_t>> events;
  for (int i = 0; i < 100; ++i) {
    const std::string did = i % 2 ? kA : kB;
    events.emplace_back(
        Create(did, i % 3 ? kPost : kLike, "r" + std::to_string(i),
               "3l3qo2vuowo2" + std::to_string(i % 10), "text " + std::to_string(i)),
        kT0 + i);
  }
  events.emplace_back(Delete(kA, kPost, "r1", "3l3qo2vuowo2z"), kT0 + 100);
  WriteArchive(dir, events, 16);
  auto archive = LocalArchive::Open(dir.string());
  ASSERT_TRUE(archive.ok()) << archive.status().message();
  auto kv = state::NewMemoryKvStore();
  ReplayOptions o;
  o.collections = {kPost};
  ReplaySource source(archive->get(), o, 7, kv.get());
  ASSERT_TRUE(source.Seek("").ok());
  RunResult run = Drive(source, *kv);
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  EXPECT_TRUE(run.errors.empty());
  EXPECT_EQ(source.tip(), 101u);
  size_t creates = 0;
  uint64_t last = 0;
  for (const Event& e : run.events) {
    const auto& r = std::get<RecordEvent>(e);
    EXPECT_EQ(r.collection, kPost);
    EXPECT_GT(r.position, last) << "events in seq order";
    last = r.position;
    EXPECT_EQ(r.origin, pipeline::Origin::kReplay);
    if (r.operation == pipeline::Operation::kCreate) {
      ++creates;
      auto cid = atproto::CidOfRecord(r.body);
      ASSERT_TRUE(cid.ok()) << cid.status().message();
      EXPECT_EQ(*cid, r.cid) << r.Uri();
      EXPECT_EQ(r.created_at, "2026-01-01T00:00:00.000Z");
    }
  }
  EXPECT_EQ(creates, 66u);  // i % 3 != 0 of 0..99
  EXPECT_EQ(run.events.size(), 67u);
  EXPECT_EQ(Describe(run.events.back()), "delete at://" + kA + "/" + kPost + "/r1");
  // Both accounts are remembered with their last record's seq.
  auto a = kv->Get(state::Family::kQueue, ReplayDidKey(7, kA));
  ASSERT_TRUE(a.ok() && a->has_value());
  auto none = kv->Get(state::Family::kQueue, ReplayDidKey(7, kC));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(ReplayTest, MarkersApplyAsOfTheirTimeToAccountsThatHoldRecords) {
  const fs::path dir = Scratch("markers");
  using S = pipeline::AccountStatus;
  std::vector<std::pair<JetstreamFrame::Payload, int64_t>> events = {
      {Create(kA, kPost, "a1", "3l3qo2vuowo21", "before the takedown"), kT0 + 1},  // seq 1
      {Create(kC, kPost, "c1", "3l3qo2vuowo21", "c's post"), kT0 + 2},             // seq 2
      {Account(kA, false, S::kTakendown), kT0 + 3},                                // seq 3
      {Account(kB, false, S::kTakendown), kT0 + 4},  // seq 4: no records
      {Account(kA, true, S::kActive), kT0 + 5},      // seq 5
      {Create(kA, kPost, "a2", "3l3qo2vuowo22", "after reinstatement"), kT0 + 6},  // seq 6
      {Create(kA, kLike, "l1", "3l3qo2vuowo23", "a like"), kT0 + 7},               // seq 7
      {Account(kC, false, S::kDeleted), kT0 + 8},                                  // seq 8
  };
  WriteArchive(dir, events, 2);
  auto archive = LocalArchive::Open(dir.string());
  ASSERT_TRUE(archive.ok()) << archive.status().message();
  auto kv = state::NewMemoryKvStore();
  ReplayOptions o;
  o.collections = {kPost};
  o.marker_tail_hours = 0;  // the whole archive
  ReplaySource source(archive->get(), o, 1, kv.get());
  ASSERT_TRUE(source.Seek("").ok());
  RunResult run = Drive(source, *kv);
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  EXPECT_TRUE(run.errors.empty());
  const std::vector<std::string> want = {
      // the records sweep
      "create at://" + kA + "/app.bsky.feed.post/a1",
      "create at://" + kC + "/app.bsky.feed.post/c1",
      "create at://" + kA + "/app.bsky.feed.post/a2",
      // the account sweep: A's takedown, then A's rows after it again, in order
      "account takendown " + kA,
      "account active " + kA,
      "create at://" + kA + "/app.bsky.feed.post/a2",
      // B wrote nothing in the collections: its marker is not applied; C's deletion is
      "account deleted " + kC,
  };
  EXPECT_EQ(Describe(run.events), want);
  // Both kills (A's takedown, C's deletion) looked for the account's later rows.
  EXPECT_EQ(source.stats().refolded_dids, 2u);
  EXPECT_EQ(source.account_sweep_start(), 0u);
}

TEST(ReplayTest, TheAccountSweepStartsAtTheSegmentWithinTheTailOfTheNewest) {
  const fs::path dir = Scratch("tail");
  using S = pipeline::AccountStatus;
  std::vector<std::pair<JetstreamFrame::Payload, int64_t>> events = {
      {Create(kA, kPost, "a1", "3l3qo2vuowo21", "old"), kT0},
      {Create(kC, kPost, "c1", "3l3qo2vuowo21", "old"), kT0 + 1},
      {Account(kA, false, S::kTakendown), kT0 + 2},  // 30 h before the newest: outside the tail
      {Account(kC, false, S::kTakendown), kT0 + 26 * kHour},  // 4 h before the newest
      {Create(kB, kPost, "b1", "3l3qo2vuowo21", "new"), kT0 + 30 * kHour},
  };
  // One row per block and per segment: every event in its own segment.
  WriteArchive(dir, events, 1, 1);
  auto archive = LocalArchive::Open(dir.string());
  ASSERT_TRUE(archive.ok()) << archive.status().message();
  auto segments = (*archive)->ListSegments();
  ASSERT_TRUE(segments.ok());
  ASSERT_EQ(segments->size(), 5u);
  for (double tail : {12.0, 0.0}) {
    auto kv = state::NewMemoryKvStore();
    ReplayOptions o;
    o.collections = {kPost};
    o.marker_tail_hours = tail;
    ReplaySource source(archive->get(), o, 1, kv.get());
    ASSERT_TRUE(source.Seek("").ok());
    RunResult run = Drive(source, *kv);
    ASSERT_TRUE(run.status.ok()) << run.status.message();
    std::vector<std::string> want = {
        "create at://" + kA + "/app.bsky.feed.post/a1",
        "create at://" + kC + "/app.bsky.feed.post/c1",
        "create at://" + kB + "/app.bsky.feed.post/b1",
    };
    if (tail == 0) want.push_back("account takendown " + kA);
    want.push_back("account takendown " + kC);
    EXPECT_EQ(Describe(run.events), want) << "tail " << tail;
    EXPECT_EQ(source.account_sweep_start(), tail == 0 ? 0u : 4u) << "tail " << tail;
  }
}

// Flips bytes inside block `block`'s frame of the segment file.
void CorruptBlock(const fs::path& segment, size_t block) {
  auto reader = jss::SegmentReader::Open(segment.string());
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  const jss::BlockInfo info = reader->footer().blocks.at(block);
  std::fstream f(segment, std::ios::in | std::ios::out | std::ios::binary);
  const uint64_t at = info.offset + 8 + info.compressed_size / 2;
  f.seekp(static_cast<std::streamoff>(at));
  const char junk[4] = {'\x5a', '\x5a', '\x5a', '\x5a'};
  f.write(junk, sizeof(junk));
}

TEST(ReplayTest, ABlockThatDoesNotDecodeIsRecordedAsFailedAndTheRestLands) {
  const fs::path dir = Scratch("corrupt");
  std::vector<std::pair<JetstreamFrame::Payload, int64_t>> events;
  for (int i = 0; i < 40; ++i) {
    events.emplace_back(Create(kA, kPost, "r" + std::to_string(i), "3l3qo2vuowo21",
                               "a longer text so the frame has a middle " + std::to_string(i)),
                        kT0 + i);
  }
  WriteArchive(dir, events, 10);  // blocks of seq 1-10, 11-20, 21-30, 31-40
  CorruptBlock(dir / jss::SegmentName(0), 1);
  auto archive = LocalArchive::Open(dir.string());
  ASSERT_TRUE(archive.ok()) << archive.status().message();
  auto kv = state::NewMemoryKvStore();
  ReplayOptions o;
  ReplaySource source(archive->get(), o, 3, kv.get());
  ASSERT_TRUE(source.Seek("").ok());
  RunResult run = Drive(source, *kv);
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  EXPECT_EQ(run.events.size(), 30u);
  for (const Event& e : run.events) {
    const uint64_t p = pipeline::PositionOf(e);
    EXPECT_TRUE(p <= 10 || p > 20) << p;
  }
  ASSERT_EQ(run.errors.size(), 1u);
  EXPECT_EQ(run.errors[0].kind, "bad_block");
  EXPECT_EQ(run.errors[0].key, jss::SegmentName(0) + "/1");
  state::FailedBlocks failed(*kv);
  auto fb = failed.Get(3, jss::SegmentName(0) + "/1");
  ASSERT_TRUE(fb.ok());
  ASSERT_TRUE(fb->has_value());
  EXPECT_NE((*fb)->reason.find("bad_block"), std::string::npos);
  EXPECT_EQ(source.stats().failed_blocks, 1u);
}

TEST(ReplayTest, ARowWhosePayloadIsNotADagCborMapIsSkippedAndLoggedAndTheRestLands) {
  const fs::path dir = Scratch("bad-rows");
  fs::create_directories(dir);
  auto writer = jss::SegmentWriter::Create((dir / jss::SegmentName(0)).string());
  ASSERT_TRUE(writer.ok()) << writer.status().message();
  Bytes good;
  ASSERT_TRUE(atproto::JsonToCbor(R"({"$type":"app.bsky.feed.post","createdAt":"2026-01-01",)"
                                  R"("text":"kept"})",
                                  &good)
                  .ok());
  const Bytes integer = {0x01};                                       // a DAG-CBOR integer
  const Bytes unsorted = {0xa2, 0x61, 0x62, 0x01, 0x61, 0x61, 0x02};  // {"b":1,"a":2}
  const std::vector<std::pair<std::string, Bytes>> rows = {
      {"r1", good}, {"r2", integer}, {"r3", unsorted}, {"r4", good}};
  for (size_t i = 0; i < rows.size(); ++i) {
    jss::Row row;
    row.seq = i + 1;
    row.witnessed_at = kT0 + static_cast<int64_t>(i);
    row.kind = jss::Kind::kCreate;
    row.collection = kPost;
    row.did = kA;
    row.rkey = rows[i].first;
    row.rev = "3l3qo2vuowo21";
    row.payload = rows[i].second;
    ASSERT_TRUE(writer->Append(row).ok());
  }
  ASSERT_TRUE(writer->Seal().ok());
  auto archive = LocalArchive::Open(dir.string());
  ASSERT_TRUE(archive.ok()) << archive.status().message();
  auto kv = state::NewMemoryKvStore();
  ReplaySource source(archive->get(), ReplayOptions{}, 4, kv.get());
  ASSERT_TRUE(source.Seek("").ok());
  RunResult run = Drive(source, *kv);
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  ASSERT_EQ(Describe(run.events),
            (std::vector<std::string>{"create at://" + kA + "/" + kPost + "/r1",
                                      "create at://" + kA + "/" + kPost + "/r4"}));
  const auto& kept = std::get<RecordEvent>(run.events[0]);
  EXPECT_EQ(kept.body, R"({"text":"kept","$type":"app.bsky.feed.post","createdAt":"2026-01-01"})");
  EXPECT_EQ(kept.created_at, "2026-01-01");
  EXPECT_EQ(kept.cid, atproto::Cid::Compute(atproto::Cid::Codec::kDagCbor, good));
  ASSERT_EQ(run.errors.size(), 2u);
  EXPECT_EQ(run.errors[0].kind, "bad_record");
  EXPECT_EQ(run.errors[0].key, "at://" + kA + "/" + kPost + "/r2");
  EXPECT_EQ(run.errors[0].message, "seq 2: the record is not a DAG-CBOR map");
  EXPECT_EQ(run.errors[1].key, "at://" + kA + "/" + kPost + "/r3");
  EXPECT_EQ(run.errors[1].message,
            "seq 3: the record is not a DAG-CBOR map: at byte 4: map keys out of order: \"a\" "
            "after \"b\"");
}

// An archive whose blocks `fail` are not delivered.
class FlakyArchive : public Archive {
 public:
  FlakyArchive(Archive* inner, std::set<uint32_t> fail) : inner_(inner), fail_(std::move(fail)) {}
  std::string Describe() const override { return "flaky " + inner_->Describe(); }
  Result<std::vector<SegmentInfo>> ListSegments() override { return inner_->ListSegments(); }
  Result<Plan> PlanSnapshot(const PlanRequest& r) override { return inner_->PlanSnapshot(r); }
  Result<std::string> GetBlock(const SegmentInfo& s, uint32_t block) override {
    if (fail_.count(block)) return Status::Unavailable("503 after 5 attempts");
    return inner_->GetBlock(s, block);
  }

 private:
  Archive* inner_;
  std::set<uint32_t> fail_;
};

// An archive whose block answers wait until the test gives them, as an archive over the network
// answers later (on its own thread, after the request was handed over).
class HeldArchive : public Archive {
 public:
  explicit HeldArchive(Archive* inner) : inner_(inner) {}
  std::string Describe() const override { return "held " + inner_->Describe(); }
  Result<std::vector<SegmentInfo>> ListSegments() override { return inner_->ListSegments(); }
  Result<Plan> PlanSnapshot(const PlanRequest& r) override { return inner_->PlanSnapshot(r); }
  Result<std::string> GetBlock(const SegmentInfo& s, uint32_t block) override {
    return inner_->GetBlock(s, block);
  }
  void StartGetBlock(const SegmentInfo& s, uint32_t block,
                     ArchiveCallback<std::string> done) override {
    std::lock_guard lock(mu_);
    held_.emplace(block, std::make_pair(s, std::move(done)));
    max_out_ = std::max(max_out_, held_.size());
    ++asked_;
  }
  // Answers the request for `block`; false when there is none.
  bool Answer(uint32_t block) {
    std::pair<SegmentInfo, ArchiveCallback<std::string>> request;
    {
      std::lock_guard lock(mu_);
      auto it = held_.find(block);
      if (it == held_.end()) return false;
      request = std::move(it->second);
      held_.erase(it);
    }
    request.second(inner_->GetBlock(request.first, block));
    return true;
  }
  // The blocks asked for and not answered, highest first.
  std::vector<uint32_t> Out() const {
    std::lock_guard lock(mu_);
    std::vector<uint32_t> out;
    for (auto it = held_.rbegin(); it != held_.rend(); ++it) out.push_back(it->first);
    return out;
  }
  size_t asked() const {
    std::lock_guard lock(mu_);
    return asked_;
  }
  size_t max_out() const {
    std::lock_guard lock(mu_);
    return max_out_;
  }

 private:
  Archive* inner_;
  mutable std::mutex mu_;
  std::map<uint32_t, std::pair<SegmentInfo, ArchiveCallback<std::string>>> held_;
  size_t asked_ = 0;
  size_t max_out_ = 0;
};

// Blocks are asked for ahead of the reader, at most prefetch_blocks at once; Read hands out a
// tick (instead of waiting) while the block it needs next is out, whatever arrived after it, and
// the blocks come out in order however their answers arrive.
TEST(ReplayTest, BlocksAreAskedForAheadOfTheReaderAndReadTicksWhileItsNextIsOut) {
  const fs::path dir = Scratch("prefetch");
  std::vector<std::pair<JetstreamFrame::Payload, int64_t>> events;
  for (int i = 0; i < 40; ++i) {
    events.emplace_back(Create(kA, kPost, "r" + std::to_string(i), "3l3qo2vuowo21", "t"), kT0 + i);
  }
  WriteArchive(dir, events, 1);  // one row per block: blocks 0..39
  auto local = LocalArchive::Open(dir.string());
  ASSERT_TRUE(local.ok());
  HeldArchive held(local->get());
  auto kv = state::NewMemoryKvStore();
  ReplayOptions o;
  o.accounts = false;
  o.prefetch_blocks = 4;
  o.tick_ms = 1;
  ReplaySource source(&held, o, 1, kv.get());
  ASSERT_TRUE(source.Seek("").ok());

  pipeline::EventChunk first;
  auto more = source.Read(&first);
  ASSERT_TRUE(more.ok() && *more) << more.status().message();
  EXPECT_TRUE(first.tick);
  EXPECT_EQ(held.Out(), (std::vector<uint32_t>{3, 2, 1, 0}));

  ASSERT_TRUE(held.Answer(2));
  pipeline::EventChunk second;
  more = source.Read(&second);
  ASSERT_TRUE(more.ok() && *more);
  EXPECT_TRUE(second.tick) << "block 0 is still out";
  EXPECT_EQ(held.asked(), 4u);

  ASSERT_TRUE(held.Answer(0));
  pipeline::EventChunk third;
  more = source.Read(&third);
  ASSERT_TRUE(more.ok() && *more);
  EXPECT_FALSE(third.tick);
  EXPECT_EQ(third.resume_cursor, "records 40 1");
  EXPECT_EQ(held.Out(), (std::vector<uint32_t>{4, 3, 1})) << "block 4 asked once 0 was read";

  // The rest, answered newest first each round.
  std::vector<uint64_t> positions;
  source.Decode(&third);
  for (const Event& e : third.events) positions.push_back(pipeline::PositionOf(e));
  uint64_t seq = 2;
  for (int round = 0; round < 1000; ++round) {
    for (uint32_t b : held.Out()) ASSERT_TRUE(held.Answer(b));
    pipeline::EventChunk chunk;
    more = source.Read(&chunk);
    ASSERT_TRUE(more.ok()) << more.status().message();
    if (!*more) break;
    source.Decode(&chunk);
    for (const Event& e : chunk.events) positions.push_back(pipeline::PositionOf(e));
    ASSERT_TRUE(kv->Write(chunk.state_writes).ok());
    source.Committed(seq++);
  }
  ASSERT_EQ(positions.size(), 40u);
  for (size_t i = 0; i < positions.size(); ++i) EXPECT_EQ(positions[i], i + 1);
  EXPECT_EQ(held.asked(), 40u);
  EXPECT_EQ(held.max_out(), 4u);
}

TEST(ReplayTest, SixteenUndeliveredBlocksInARowStopTheJobAndFifteenDoNot) {
  const fs::path dir = Scratch("in-a-row");
  std::vector<std::pair<JetstreamFrame::Payload, int64_t>> events;
  for (int i = 0; i < 40; ++i) {
    events.emplace_back(Create(kA, kPost, "r" + std::to_string(i), "3l3qo2vuowo21", "t"), kT0 + i);
  }
  WriteArchive(dir, events, 1);  // one row per block: blocks 0..39
  auto local = LocalArchive::Open(dir.string());
  ASSERT_TRUE(local.ok());
  {
    std::set<uint32_t> fail;
    for (uint32_t b = 5; b < 20; ++b) fail.insert(b);  // 15 in a row
    FlakyArchive flaky(local->get(), fail);
    auto kv = state::NewMemoryKvStore();
    ReplaySource source(&flaky, ReplayOptions{}, 1, kv.get());
    ASSERT_TRUE(source.Seek("").ok());
    RunResult run = Drive(source, *kv);
    ASSERT_TRUE(run.status.ok()) << run.status.message();
    EXPECT_EQ(run.events.size(), 25u);
    EXPECT_EQ(run.errors.size(), 15u);
    auto count = state::FailedBlocks(*kv).Count(1);
    ASSERT_TRUE(count.ok());
    EXPECT_EQ(*count, 15u);
  }
  {
    std::set<uint32_t> fail;
    for (uint32_t b = 5; b < 21; ++b) fail.insert(b);  // 16 in a row
    FlakyArchive flaky(local->get(), fail);
    auto kv = state::NewMemoryKvStore();
    ReplaySource source(&flaky, ReplayOptions{}, 1, kv.get());
    ASSERT_TRUE(source.Seek("").ok());
    RunResult run = Drive(source, *kv);
    ASSERT_FALSE(run.status.ok());
    EXPECT_EQ(run.status.message(),
              "the archive failed 16 blocks in a row; stopping (resume to continue)");
    EXPECT_EQ(run.events.size(), 5u);
    // The cursor stayed before the streak: resumed against an archive that answers again, the
    // job reads the whole streak, and its blocks leave the failed list.
    EXPECT_EQ(run.last_cursor, "records 40 5");
    auto before = state::FailedBlocks(*kv).Count(1);
    ASSERT_TRUE(before.ok());
    EXPECT_EQ(*before, 15u);  // the sixteenth stopped the job before its chunk was handed out
    ReplaySource again(local->get(), ReplayOptions{}, 1, kv.get());
    ASSERT_TRUE(again.Seek(run.last_cursor).ok());
    RunResult rest = Drive(again, *kv);
    ASSERT_TRUE(rest.status.ok()) << rest.status.message();
    ASSERT_EQ(rest.events.size(), 35u);
    EXPECT_EQ(pipeline::PositionOf(rest.events.front()), 6u);
    EXPECT_EQ(pipeline::PositionOf(rest.events.back()), 40u);
    auto after = state::FailedBlocks(*kv).Count(1);
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(*after, 0u);
    EXPECT_EQ(again.stats().failed_blocks, 0u);
  }
}

TEST(ReplayTest, AResumedReplayReadsOnlyRowsAfterItsCursorAndKeepsItsTip) {
  const fs::path dir = Scratch("resume");
  std::vector<std::pair<JetstreamFrame::Payload, int64_t>> events;
  for (int i = 0; i < 30; ++i) {
    events.emplace_back(Create(kA, kPost, "r" + std::to_string(i), "3l3qo2vuowo21", "t"), kT0 + i);
  }
  WriteArchive(dir, events, 7);
  // Rows added after the job pinned its tip (seq 30) are not replayed by it.
  {
    std::vector<std::pair<JetstreamFrame::Payload, int64_t>> more;
    more.emplace_back(Create(kA, kPost, "late", "3l3qo2vuowo22", "t"), kT0 + 99);
    WriteArchive(dir, more, 7);
  }
  auto archive = LocalArchive::Open(dir.string());
  ASSERT_TRUE(archive.ok());
  auto kv = state::NewMemoryKvStore();
  ReplaySource source(archive->get(), ReplayOptions{}, 1, kv.get());
  ASSERT_TRUE(source.Seek("records 30 12").ok());
  RunResult run = Drive(source, *kv);
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  ASSERT_EQ(run.events.size(), 18u);
  EXPECT_EQ(pipeline::PositionOf(run.events.front()), 13u);
  EXPECT_EQ(pipeline::PositionOf(run.events.back()), 30u);
  EXPECT_FALSE(source.Seek("records x").ok());
}

// In the engine, the account sweep waits for the records sweep's commit without polling: it seals
// the records sweep's last batch at once (the batch's delay and chunk limit are out of reach
// here) and is woken by the commit, so it sends out at most a tick or two, where a poll would send
// a tick every few milliseconds until a batch of ticks filled up.
TEST(ReplayTest, TheAccountSweepWaitsForTheRecordsCommitWithoutPolling) {
  const fs::path dir = Scratch("engine");
  using S = pipeline::AccountStatus;
  std::vector<std::pair<JetstreamFrame::Payload, int64_t>> events;
  for (int i = 0; i < 20; ++i) {
    events.emplace_back(Create(kA, kPost, "r" + std::to_string(i), "3l3qo2vuowo21", "t"), kT0 + i);
  }
  events.emplace_back(Account(kA, false, S::kTakendown), kT0 + 50);
  WriteArchive(dir, events, 4);
  auto archive = LocalArchive::Open(dir.string());
  ASSERT_TRUE(archive.ok()) << archive.status().message();
  auto kv = state::NewMemoryKvStore();
  ReplayOptions o;
  o.collections = {kPost};
  o.marker_tail_hours = 0;
  ReplaySource source(archive->get(), o, 1, kv.get());

  class Events : public pipeline::Sink {
   public:
    Result<pipeline::WriteStats> Write(std::span<const Event> batch) override {
      for (const auto& e : batch) described.push_back(Describe(e));
      return pipeline::WriteStats{};
    }
    std::string_view name() const override { return "events"; }
    std::vector<std::string> described;  // the sink node's alone
  };
  class Ticks : public pipeline::Committer {
   public:
    Status PrepareCommit(const pipeline::BatchReport& r, state::WriteBatch*) override {
      for (const pipeline::EventChunk* c : r.batch->chunks) ticks += c->tick ? 1 : 0;
      return Status::OK();
    }
    void OnCommitted(const pipeline::BatchReport&) override {}
    bool StopRequested() const override { return false; }
    uint64_t ticks = 0;
  };
  Events sink;
  Ticks committer;
  pipeline::EngineOptions eo;
  eo.workers = 2;
  eo.batch = {.max_events = 1'000'000, .max_delay_ms = 600'000, .max_chunks = 1000};
  pipeline::Engine engine(eo, &source, {}, &sink, kv.get(), &committer);
  auto summary = engine.Run("");
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  ASSERT_EQ(sink.described.size(), 21u);  // the 20 creates, then the takedown
  EXPECT_EQ(sink.described[20], "account takendown " + kA);
  EXPECT_GE(committer.ticks, 1u);  // the tick that sealed the records sweep
  EXPECT_LE(committer.ticks, 3u);
}

}  // namespace
}  // namespace atfill::sources
