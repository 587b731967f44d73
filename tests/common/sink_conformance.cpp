#include "tests/common/sink_conformance.hpp"

#include <algorithm>
#include <array>
#include <random>
#include <thread>
#include <utility>

#include "atproto/cid.hpp"
#include "base/bytes.hpp"
#include "sinks/purge.hpp"

namespace atfill::testing {

using pipeline::AccountStatus;
using pipeline::Event;
using pipeline::Operation;
using pipeline::RecordEvent;
using pipeline::WriteStats;

std::ostream& operator<<(std::ostream& os, const TableRow& r) {
  return os << "{uri=" << r.uri << " cid=" << r.cid << " rev=" << r.rev
            << " created_at=" << r.created_at << " record=" << r.record << "}";
}

void PrintTo(const SinkConformanceParam& param, std::ostream* os) { *os << param.name; }

std::string SinkConformanceName(const ::testing::TestParamInfo<SinkConformanceParam>& info) {
  return info.param.name;
}

namespace {

Event MakeRecord(Operation op, std::string did, std::string collection, std::string rkey,
                 std::string body, std::string rev, std::string created_at) {
  RecordEvent e;
  e.did = std::move(did);
  e.collection = std::move(collection);
  e.rkey = std::move(rkey);
  e.operation = op;
  if (op != Operation::kDelete)
    e.cid = atproto::Cid::Compute(atproto::Cid::Codec::kDagCbor, AsBytes(body));
  e.rev = std::move(rev);
  e.body = std::move(body);
  e.created_at = std::move(created_at);
  return e;
}

}  // namespace

Event MakeCreate(std::string did, std::string collection, std::string rkey, std::string body,
                 std::string rev, std::string created_at) {
  return MakeRecord(Operation::kCreate, std::move(did), std::move(collection), std::move(rkey),
                    std::move(body), std::move(rev), std::move(created_at));
}

Event MakeUpdate(std::string did, std::string collection, std::string rkey, std::string body,
                 std::string rev) {
  return MakeRecord(Operation::kUpdate, std::move(did), std::move(collection), std::move(rkey),
                    std::move(body), std::move(rev), "");
}

Event MakeDelete(std::string did, std::string collection, std::string rkey, std::string rev) {
  return MakeRecord(Operation::kDelete, std::move(did), std::move(collection), std::move(rkey), "",
                    std::move(rev), "");
}

Event MakeAccount(std::string did, AccountStatus status) {
  pipeline::AccountEvent e;
  e.did = std::move(did);
  e.status = status;
  e.active = status == AccountStatus::kActive;
  return e;
}

std::string CidOf(std::string_view body) {
  return atproto::Cid::Compute(atproto::Cid::Codec::kDagCbor, AsBytes(body)).ToString();
}

Result<std::unique_ptr<pipeline::Sink>> SinkTestEnv::OpenSinkWith(const SinkTweaks&) {
  return Status::Internal("this sink's test env does not implement OpenSinkWith");
}
Result<std::unique_ptr<RecordLookup>> SinkTestEnv::OpenReader() {
  return Status::Internal("this sink's test env does not implement OpenReader");
}
Result<uint64_t> SinkTestEnv::PurgeCollection(const std::string&) {
  return Status::Internal("this sink's test env does not implement PurgeCollection");
}
Status SinkTestEnv::Exec(const std::string&) {
  return Status::Internal("this sink's test env does not implement Exec");
}
Result<std::vector<std::string>> SinkTestEnv::Column(const std::string&) {
  return Status::Internal("this sink's test env does not implement Column");
}

void SinkConformanceTest::SetUp() {
  auto env = GetParam().make_env([this] { return now_us_; });
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  env_ = std::move(env).value();
  auto sink = env_->OpenSink();
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  sink_ = std::move(sink).value();
}

WriteStats SinkConformanceTest::MustWrite(const std::vector<Event>& batch) {
  auto stats = sink_->Write(batch);
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  return stats.ok() ? *stats : WriteStats{};
}

std::vector<TableRow> SinkConformanceTest::MustReadAll() {
  auto rows = env_->reader().ReadAll();
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  return rows.ok() ? *rows : std::vector<TableRow>{};
}

std::optional<int64_t> SinkConformanceTest::MustIndexedAt(std::string_view uri) {
  auto at = env_->reader().IndexedAtUs(uri);
  EXPECT_TRUE(at.ok()) << at.status().ToString();
  return at.ok() ? *at : std::nullopt;
}

std::vector<std::string> SinkConformanceTest::MustColumn(const std::string& sql) {
  auto column = env_->Column(sql);
  EXPECT_TRUE(column.ok()) << sql << ": " << column.status().ToString();
  return column.ok() ? *column : std::vector<std::string>{};
}

namespace {

constexpr const char* kAlice = "did:plc:alice2ixhq5mvvcy4ygqtfp";
constexpr const char* kBob = "did:plc:bob7x3ohbx4kdyhrlqwv2mtq";
constexpr const char* kPost = "app.bsky.feed.post";
constexpr const char* kLike = "app.bsky.feed.like";
// Revs are TIDs; they sort as text in time order.
constexpr const char* kRev1 = "3kaaaaaaaaa2a";
constexpr const char* kRev2 = "3kbbbbbbbbb2a";
constexpr const char* kRev3 = "3kccccccccc2a";
constexpr const char* kRev4 = "3kddddddddd2a";

const std::string kBodyA =
    R"({"$type":"app.bsky.feed.post","text":"first","createdAt":"2024-01-01T00:00:00.000Z"})";
const std::string kBodyB =
    R"({"$type":"app.bsky.feed.post","text":"second","createdAt":"2024-01-01T00:00:00.000Z"})";
const std::string kBodyC =
    R"({"$type":"app.bsky.feed.post","text":"third","createdAt":"2024-01-01T00:00:00.000Z"})";

std::string Uri(std::string_view did, std::string_view collection, std::string_view rkey) {
  return "at://" + std::string(did) + "/" + std::string(collection) + "/" + std::string(rkey);
}

TableRow Row(std::string_view did, std::string_view collection, std::string_view rkey,
             const std::string& body, std::string rev, std::string created_at = "") {
  return TableRow{Uri(did, collection, rkey), CidOf(body), std::move(rev), body,
                  std::move(created_at)};
}

// Compares every counter so that a wrong classification anywhere fails.
void ExpectStats(const WriteStats& got, const WriteStats& want) {
  EXPECT_EQ(got.inserted, want.inserted) << "inserted";
  EXPECT_EQ(got.updated, want.updated) << "updated";
  EXPECT_EQ(got.unchanged, want.unchanged) << "unchanged";
  EXPECT_EQ(got.stale, want.stale) << "stale";
  EXPECT_EQ(got.deleted, want.deleted) << "deleted";
  EXPECT_EQ(got.purged_accounts, want.purged_accounts) << "purged_accounts";
  EXPECT_EQ(got.purged_records, want.purged_records) << "purged_records";
}

WriteStats Stats(uint64_t inserted, uint64_t updated, uint64_t unchanged, uint64_t stale,
                 uint64_t deleted, uint64_t purged_accounts = 0, uint64_t purged_records = 0) {
  WriteStats s;
  s.inserted = inserted;
  s.updated = updated;
  s.unchanged = unchanged;
  s.stale = stale;
  s.deleted = deleted;
  s.purged_accounts = purged_accounts;
  s.purged_records = purged_records;
  return s;
}

// indexed_at is written as ISO-8601 UTC with microseconds, which sorts as time, and reads back as
// the instant written, from the epoch to the end of the century.
TEST_P(SinkConformanceTest, IndexedAtTextSortsAndRoundTrips) {
  const std::vector<int64_t> times = {
      0, 1, 999'999, 1'000'000, 951'782'400'000'001, 1'796'029'200'123'456, 4'102'444'799'999'999};
  const std::vector<std::string> texts = {
      "1970-01-01T00:00:00.000000Z", "1970-01-01T00:00:00.000001Z", "1970-01-01T00:00:00.999999Z",
      "1970-01-01T00:00:01.000000Z", "2000-02-29T00:00:00.000001Z", "2026-11-30T09:00:00.123456Z",
      "2099-12-31T23:59:59.999999Z"};
  for (size_t i = 0; i < times.size(); ++i) {
    now_us_ = times[i];
    MustWrite({MakeCreate(kAlice, kPost, "t" + std::to_string(i), kBodyA)});
  }
  for (size_t i = 0; i < times.size(); ++i) {
    const std::string uri = Uri(kAlice, kPost, "t" + std::to_string(i));
    EXPECT_EQ(MustIndexedAt(uri), times[i]);
    auto text = env_->reader().IndexedAtText(uri);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(*text, texts[i]);
  }
}

TEST_P(SinkConformanceTest, EmptyBatchWritesNothing) {
  ExpectStats(MustWrite({}), Stats(0, 0, 0, 0, 0));
  EXPECT_TRUE(MustReadAll().empty());
}

TEST_P(SinkConformanceTest, CreatesInsertRows) {
  WriteStats stats = MustWrite({
      MakeCreate(kAlice, kPost, "3kp1", kBodyA, kRev1, "2024-01-01T00:00:00.000Z"),
      MakeCreate(kAlice, kLike, "3kl1", kBodyB, kRev1),
      MakeCreate(kBob, kPost, "3kp1", kBodyC),
  });
  ExpectStats(stats, Stats(3, 0, 0, 0, 0));
  std::vector<TableRow> want = {
      Row(kAlice, kLike, "3kl1", kBodyB, kRev1),
      Row(kAlice, kPost, "3kp1", kBodyA, kRev1, "2024-01-01T00:00:00.000Z"),
      Row(kBob, kPost, "3kp1", kBodyC, ""),
  };
  EXPECT_EQ(MustReadAll(), want);
  for (const TableRow& row : want) EXPECT_EQ(MustIndexedAt(row.uri), now_us_) << row.uri;
  EXPECT_EQ(MustIndexedAt(Uri(kBob, kLike, "3kp1")), std::nullopt);
}

TEST_P(SinkConformanceTest, RecordTextIsStoredExactly) {
  // Whitespace, key order, escapes and non-ASCII text survive byte for byte.
  const std::string body =
      "{ \"text\" : \"h\xc3\xa9llo \\u00e9 \\\"q\\\" \xf0\x9f\xa6\x8b\",\n\t\"$type\":\"x\"}";
  const std::string big = R"({"text":")" + std::string(100000, 'z') + R"("})";
  MustWrite({MakeCreate(kAlice, kPost, "a", body, kRev1), MakeCreate(kAlice, kPost, "b", big)});
  std::vector<TableRow> rows = MustReadAll();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].record, body);
  EXPECT_EQ(rows[1].record, big);
}

TEST_P(SinkConformanceTest, IdenticalRedeliveryKeepsRowAndIndexedAt) {
  MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA, kRev1)});
  const int64_t first = now_us_;
  now_us_ += 5'000'000;
  ExpectStats(MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA, kRev1)}), Stats(0, 0, 1, 0, 0));
  ExpectStats(MustWrite({MakeUpdate(kAlice, kPost, "r", kBodyA, kRev1)}), Stats(0, 0, 1, 0, 0));
  EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kAlice, kPost, "r", kBodyA, kRev1)});
  EXPECT_EQ(MustIndexedAt(Uri(kAlice, kPost, "r")), first);
}

TEST_P(SinkConformanceTest, RevlessRedeliveryOfRevlessRowIsUnchanged) {
  MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA)});
  const int64_t first = now_us_;
  now_us_ += 1;
  ExpectStats(MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA)}), Stats(0, 0, 1, 0, 0));
  EXPECT_EQ(MustIndexedAt(Uri(kAlice, kPost, "r")), first);
}

TEST_P(SinkConformanceTest, NewerRevReplacesRow) {
  MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA, kRev1, "2024-01-01T00:00:00.000Z")});
  now_us_ += 1'000;
  ExpectStats(MustWrite({MakeUpdate(kAlice, kPost, "r", kBodyB, kRev2)}), Stats(0, 1, 0, 0, 0));
  // The created_at of the new version replaces the old one (here: none).
  EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kAlice, kPost, "r", kBodyB, kRev2)});
  EXPECT_EQ(MustIndexedAt(Uri(kAlice, kPost, "r")), now_us_);
  // A create (as a re-crawl reports it) upserts the same way.
  now_us_ += 1'000;
  ExpectStats(MustWrite({MakeCreate(kAlice, kPost, "r", kBodyC, kRev3, "x")}),
              Stats(0, 1, 0, 0, 0));
  EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kAlice, kPost, "r", kBodyC, kRev3, "x")});
  EXPECT_EQ(MustIndexedAt(Uri(kAlice, kPost, "r")), now_us_);
}

TEST_P(SinkConformanceTest, OlderRevIsStale) {
  MustWrite({MakeCreate(kAlice, kPost, "r", kBodyB, kRev2)});
  const int64_t first = now_us_;
  now_us_ += 1'000;
  ExpectStats(MustWrite({MakeUpdate(kAlice, kPost, "r", kBodyA, kRev1)}), Stats(0, 0, 0, 1, 0));
  // Older even with the same CID: still stale, nothing changes.
  ExpectStats(MustWrite({MakeCreate(kAlice, kPost, "r", kBodyB, kRev1)}), Stats(0, 0, 0, 1, 0));
  EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kAlice, kPost, "r", kBodyB, kRev2)});
  EXPECT_EQ(MustIndexedAt(Uri(kAlice, kPost, "r")), first);
}

TEST_P(SinkConformanceTest, SameCidWithNewerRevKeepsRowButRaisesRev) {
  MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA, kRev1)});
  const int64_t first = now_us_;
  now_us_ += 1'000;
  ExpectStats(MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA, kRev3)}), Stats(0, 0, 1, 0, 0));
  EXPECT_EQ(MustIndexedAt(Uri(kAlice, kPost, "r")), first);
  EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kAlice, kPost, "r", kBodyA, kRev3)});
  // The repo re-created the record at rev3 after deleting it at rev2: the late rev2 delete must
  // not remove it.
  ExpectStats(MustWrite({MakeDelete(kAlice, kPost, "r", kRev2)}), Stats(0, 0, 0, 1, 0));
  EXPECT_EQ(MustReadAll().size(), 1u);
}

TEST_P(SinkConformanceTest, RevlessWriteDoesNotReplaceRevvedRow) {
  MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA, kRev2)});
  ExpectStats(MustWrite({MakeUpdate(kAlice, kPost, "r", kBodyB)}), Stats(0, 0, 0, 1, 0));
  EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kAlice, kPost, "r", kBodyA, kRev2)});
  // ...unless the CIDs match: then it is a redelivery and the stored rev stays.
  ExpectStats(MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA)}), Stats(0, 0, 1, 0, 0));
  EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kAlice, kPost, "r", kBodyA, kRev2)});
}

TEST_P(SinkConformanceTest, RevlessRowIsReplacedByAnyNewContent) {
  MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA)});
  ExpectStats(MustWrite({MakeUpdate(kAlice, kPost, "r", kBodyB)}), Stats(0, 1, 0, 0, 0));
  EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kAlice, kPost, "r", kBodyB, "")});
  ExpectStats(MustWrite({MakeUpdate(kAlice, kPost, "r", kBodyC, kRev1)}), Stats(0, 1, 0, 0, 0));
  EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kAlice, kPost, "r", kBodyC, kRev1)});
}

TEST_P(SinkConformanceTest, SameCidGivesRevToRevlessRow) {
  MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA)});
  ExpectStats(MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA, kRev2)}), Stats(0, 0, 1, 0, 0));
  EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kAlice, kPost, "r", kBodyA, kRev2)});
}

TEST_P(SinkConformanceTest, DeleteRemovesOnlyItsRow) {
  MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA, kRev1),
             MakeCreate(kAlice, kPost, "s", kBodyB, kRev1),
             MakeCreate(kBob, kPost, "r", kBodyA, kRev1)});
  ExpectStats(MustWrite({MakeDelete(kAlice, kPost, "r", kRev2)}), Stats(0, 0, 0, 0, 1));
  EXPECT_EQ(MustReadAll(), (std::vector<TableRow>{Row(kAlice, kPost, "s", kBodyB, kRev1),
                                                  Row(kBob, kPost, "r", kBodyA, kRev1)}));
}

TEST_P(SinkConformanceTest, DeleteAtTheStoredRevRemovesRow) {
  MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA, kRev2)});
  ExpectStats(MustWrite({MakeDelete(kAlice, kPost, "r", kRev2)}), Stats(0, 0, 0, 0, 1));
  EXPECT_TRUE(MustReadAll().empty());
}

TEST_P(SinkConformanceTest, StaleDeleteIsIgnored) {
  MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA, kRev3)});
  ExpectStats(MustWrite({MakeDelete(kAlice, kPost, "r", kRev2)}), Stats(0, 0, 0, 1, 0));
  EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kAlice, kPost, "r", kBodyA, kRev3)});
}

TEST_P(SinkConformanceTest, DeleteWithoutRevRemovesRow) {
  MustWrite(
      {MakeCreate(kAlice, kPost, "r", kBodyA, kRev3), MakeCreate(kAlice, kPost, "s", kBodyA)});
  ExpectStats(MustWrite({MakeDelete(kAlice, kPost, "r"), MakeDelete(kAlice, kPost, "s")}),
              Stats(0, 0, 0, 0, 2));
  EXPECT_TRUE(MustReadAll().empty());
}

TEST_P(SinkConformanceTest, DeleteOfMissingRowCountsNothing) {
  MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA, kRev1)});
  ExpectStats(
      MustWrite({MakeDelete(kAlice, kPost, "other", kRev2), MakeDelete(kAlice, kLike, "r", kRev2),
                 MakeDelete("did:plc:nobody", kPost, "r", kRev2)}),
      Stats(0, 0, 0, 0, 0));
  EXPECT_EQ(MustReadAll().size(), 1u);
}

TEST_P(SinkConformanceTest, PurgingAccountStatusesRemoveAllRowsOfTheDidOnly) {
  for (AccountStatus status :
       {AccountStatus::kDeleted, AccountStatus::kTakendown, AccountStatus::kSuspended}) {
    SCOPED_TRACE(std::string(pipeline::AccountStatusName(status)));
    MustWrite({MakeCreate(kAlice, kPost, "p1", kBodyA, kRev1),
               MakeCreate(kAlice, kPost, "p2", kBodyB, kRev1),
               MakeCreate(kAlice, kLike, "l1", kBodyC, kRev1),
               MakeCreate(kBob, kPost, "p1", kBodyA, kRev1)});
    ExpectStats(MustWrite({MakeAccount(kAlice, status)}), Stats(0, 0, 0, 0, 0, 1, 3));
    EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kBob, kPost, "p1", kBodyA, kRev1)});
    // Purging again finds nothing left.
    ExpectStats(MustWrite({MakeAccount(kAlice, status)}), Stats(0, 0, 0, 0, 0, 1, 0));
  }
  // A DID the sink never saw.
  ExpectStats(MustWrite({MakeAccount("did:plc:nobody", AccountStatus::kDeleted)}),
              Stats(0, 0, 0, 0, 0, 1, 0));
  EXPECT_EQ(MustReadAll().size(), 1u);
}

TEST_P(SinkConformanceTest, NonPurgingAccountStatusesChangeNothing) {
  MustWrite({MakeCreate(kAlice, kPost, "p1", kBodyA, kRev1)});
  for (AccountStatus status :
       {AccountStatus::kActive, AccountStatus::kDeactivated, AccountStatus::kDesynchronized,
        AccountStatus::kThrottled, AccountStatus::kOther}) {
    SCOPED_TRACE(std::string(pipeline::AccountStatusName(status)));
    ExpectStats(MustWrite({MakeAccount(kAlice, status)}), Stats(0, 0, 0, 0, 0, 0, 0));
    EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kAlice, kPost, "p1", kBodyA, kRev1)});
  }
}

TEST_P(SinkConformanceTest, ResyncReplacesTheDidsRowsInItsCollections) {
  auto resync = [](std::vector<std::string> collections) {
    pipeline::AccountEvent a;
    a.did = kAlice;
    a.resync = true;
    a.resync_collections = std::move(collections);
    return pipeline::Event(std::move(a));
  };
  MustWrite({MakeCreate(kAlice, kPost, "p1", kBodyA, kRev1),
             MakeCreate(kAlice, kPost, "p2", kBodyB, kRev1),
             MakeCreate(kAlice, kLike, "l1", kBodyC, kRev1),
             MakeCreate(kBob, kPost, "p1", kBodyA, kRev1)});
  // Only posts ("app.bsky.feed.*" would take likes too): the current post follows as a create.
  auto stats = MustWrite({resync({kPost}), MakeCreate(kAlice, kPost, "p2", kBodyB, kRev2)});
  EXPECT_EQ(stats.resyncs, 1u);
  EXPECT_EQ(stats.resynced_records, 2u);
  EXPECT_EQ(stats.purged_accounts, 0u);
  EXPECT_EQ(MustReadAll(), (std::vector<TableRow>{Row(kAlice, kLike, "l1", kBodyC, kRev1),
                                                  Row(kAlice, kPost, "p2", kBodyB, kRev2),
                                                  Row(kBob, kPost, "p1", kBodyA, kRev1)}));
  // A prefix pattern, then every collection.
  stats = MustWrite({resync({"app.bsky.feed.*"})});
  EXPECT_EQ(stats.resynced_records, 2u);
  MustWrite({MakeCreate(kAlice, kLike, "l2", kBodyC, kRev2)});
  stats = MustWrite({resync({})});
  EXPECT_EQ(stats.resynced_records, 1u);
  EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kBob, kPost, "p1", kBodyA, kRev1)});
  // A DID the sink never saw.
  pipeline::AccountEvent nobody;
  nobody.did = "did:plc:nobody";
  nobody.resync = true;
  stats = MustWrite({pipeline::Event(nobody)});
  EXPECT_EQ(stats.resyncs, 1u);
  EXPECT_EQ(stats.resynced_records, 0u);
}

TEST_P(SinkConformanceTest, APurgeOrResyncWithABoundRemovesOnlyOlderRows) {
  MustWrite({MakeCreate(kAlice, kPost, "p1", kBodyA, kRev1),
             MakeCreate(kAlice, kPost, "p2", kBodyB, kRev3),
             MakeCreate(kAlice, kLike, "l1", kBodyC, ""),
             MakeCreate(kAlice, kLike, "l2", kBodyC, kRev2),
             MakeCreate(kBob, kPost, "p1", kBodyA, kRev1)});
  // A takedown as of kRev2's time: rows older than it (and the revless one) go, kRev2 and later
  // stay.
  pipeline::Event purge = MakeAccount(kAlice, AccountStatus::kTakendown);
  std::get<pipeline::AccountEvent>(purge).purge_before_rev = kRev2;
  ExpectStats(MustWrite({purge}), Stats(0, 0, 0, 0, 0, 1, 2));
  EXPECT_EQ(MustReadAll(), (std::vector<TableRow>{Row(kAlice, kLike, "l2", kBodyC, kRev2),
                                                  Row(kAlice, kPost, "p2", kBodyB, kRev3),
                                                  Row(kBob, kPost, "p1", kBodyA, kRev1)}));
  // A resync of posts as of kRev4: p2 (kRev3) goes, the like stays (another collection).
  pipeline::AccountEvent resync;
  resync.did = kAlice;
  resync.resync = true;
  resync.resync_collections = {kPost};
  resync.purge_before_rev = kRev4;
  auto stats = MustWrite({pipeline::Event(resync)});
  EXPECT_EQ(stats.resynced_records, 1u);
  EXPECT_EQ(MustReadAll(), (std::vector<TableRow>{Row(kAlice, kLike, "l2", kBodyC, kRev2),
                                                  Row(kBob, kPost, "p1", kBodyA, kRev1)}));
}

TEST_P(SinkConformanceTest, EventsApplyInBatchOrder) {
  // create, delete, create again of one URI in one batch: the last create wins.
  ExpectStats(MustWrite({MakeCreate(kAlice, kPost, "r", kBodyA, kRev1),
                         MakeDelete(kAlice, kPost, "r", kRev2),
                         MakeCreate(kAlice, kPost, "r", kBodyB, kRev3)}),
              Stats(2, 0, 0, 0, 1));
  EXPECT_EQ(MustReadAll(), std::vector<TableRow>{Row(kAlice, kPost, "r", kBodyB, kRev3)});
  // create then update in one batch.
  ExpectStats(MustWrite({MakeCreate(kBob, kPost, "r", kBodyA, kRev1),
                         MakeUpdate(kBob, kPost, "r", kBodyC, kRev2)}),
              Stats(1, 1, 0, 0, 0));
  // A purge between two creates of the same DID removes only the first.
  ExpectStats(MustWrite({MakeCreate(kBob, kLike, "x", kBodyA, kRev3),
                         MakeAccount(kBob, AccountStatus::kDeleted),
                         MakeCreate(kBob, kLike, "y", kBodyB, kRev4)}),
              Stats(2, 0, 0, 0, 0, 1, 2));
  EXPECT_EQ(MustReadAll(), (std::vector<TableRow>{Row(kAlice, kPost, "r", kBodyB, kRev3),
                                                  Row(kBob, kLike, "y", kBodyB, kRev4)}));
}

TEST_P(SinkConformanceTest, InvalidEventFailsTheWholeBatch) {
  MustWrite({MakeCreate(kAlice, kPost, "keep", kBodyA, kRev1)});
  const std::vector<TableRow> before = MustReadAll();

  struct Case {
    const char* what;
    Event bad;
    const char* message;
  };
  Event no_cid = MakeCreate(kBob, kPost, "r", kBodyA, kRev1);
  std::get<RecordEvent>(no_cid).cid = atproto::Cid();
  Event no_body = MakeUpdate(kBob, kPost, "r", kBodyA, kRev1);
  std::get<RecordEvent>(no_body).body.clear();
  std::vector<Case> cases = {
      {"empty did", MakeCreate("", kPost, "r", kBodyA), "did"},
      {"empty collection", MakeCreate(kBob, "", "r", kBodyA), "collection"},
      {"empty rkey", MakeDelete(kBob, kPost, "", kRev1), "rkey"},
      {"no cid", no_cid, "CID"},
      {"no body", no_body, "body"},
      {"account without did", MakeAccount("", AccountStatus::kDeleted), "did"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    // Valid events before the bad one touch a new DID, a new collection, an existing row and a
    // purge: none of it may survive.
    std::vector<Event> batch = {
        MakeCreate("did:plc:newcomer", "com.example.new", "r", kBodyB, kRev1),
        MakeUpdate(kAlice, kPost, "keep", kBodyC, kRev2),
        MakeCreate(kBob, kPost, "r", kBodyB, kRev1),
        MakeAccount(kBob, AccountStatus::kDeleted),
        c.bad,
    };
    auto stats = sink_->Write(batch);
    ASSERT_FALSE(stats.ok());
    EXPECT_EQ(stats.status().code(), StatusCode::kInvalid) << stats.status().ToString();
    EXPECT_NE(stats.status().message().find("event 4"), std::string::npos)
        << stats.status().ToString();
    EXPECT_NE(stats.status().message().find(c.message), std::string::npos)
        << stats.status().ToString();
    EXPECT_EQ(MustReadAll(), before);
  }
  // The sink still works, and a DID and collection first seen in the failed batches are stored
  // correctly now (no id from a rolled-back transaction is reused).
  ExpectStats(MustWrite({MakeCreate("did:plc:newcomer", "com.example.new", "r", kBodyB, kRev1)}),
              Stats(1, 0, 0, 0, 0));
  EXPECT_EQ(MustReadAll(), (std::vector<TableRow>{
                               Row(kAlice, kPost, "keep", kBodyA, kRev1),
                               Row("did:plc:newcomer", "com.example.new", "r", kBodyB, kRev1)}));
}

TEST_P(SinkConformanceTest, BlockedDatabaseIsUnavailableAndAppliesNothing) {
  MustWrite({MakeCreate(kAlice, kPost, "keep", kBodyA, kRev1)});
  const std::vector<TableRow> before = MustReadAll();
  std::vector<Event> batch = {MakeCreate(kBob, kPost, "r", kBodyB, kRev1),
                              MakeUpdate(kAlice, kPost, "keep", kBodyC, kRev2)};
  {
    auto blocker = env_->BlockWrites();
    ASSERT_TRUE(blocker.ok()) << blocker.status().ToString();
    auto stats = sink_->Write(batch);
    ASSERT_FALSE(stats.ok());
    EXPECT_EQ(stats.status().code(), StatusCode::kUnavailable) << stats.status().ToString();
  }
  EXPECT_EQ(MustReadAll(), before);
  ExpectStats(MustWrite(batch), Stats(1, 1, 0, 0, 0));
  EXPECT_EQ(MustReadAll(), (std::vector<TableRow>{Row(kAlice, kPost, "keep", kBodyC, kRev2),
                                                  Row(kBob, kPost, "r", kBodyB, kRev1)}));
}

TEST_P(SinkConformanceTest, SameBatchTwiceLeavesTheSameTable) {
  MustWrite({MakeCreate(kAlice, kPost, "old", kBodyA, kRev1),
             MakeCreate(kBob, kLike, "gone", kBodyA, kRev1)});
  std::vector<Event> batch = {
      MakeCreate(kAlice, kPost, "new", kBodyA, kRev2),
      MakeUpdate(kAlice, kPost, "old", kBodyB, kRev2),
      MakeCreate(kAlice, kLike, "l", kBodyC),
      MakeDelete(kAlice, kPost, "missing", kRev2),
      MakeAccount(kBob, AccountStatus::kTakendown),
      MakeCreate("did:plc:carol", kPost, "c", kBodyC, kRev2, "2024"),
  };
  ExpectStats(MustWrite(batch), Stats(3, 1, 0, 0, 0, 1, 1));
  const std::vector<TableRow> once = MustReadAll();
  std::vector<std::optional<int64_t>> indexed_once;
  for (const TableRow& r : once) indexed_once.push_back(MustIndexedAt(r.uri));
  now_us_ += 60'000'000;
  ExpectStats(MustWrite(batch), Stats(0, 0, 4, 0, 0, 1, 0));
  EXPECT_EQ(MustReadAll(), once);
  std::vector<std::optional<int64_t>> indexed_twice;
  for (const TableRow& r : once) indexed_twice.push_back(MustIndexedAt(r.uri));
  EXPECT_EQ(indexed_twice, indexed_once);
  EXPECT_EQ(once.size(), 4u);
}

TEST_P(SinkConformanceTest, WritesConvergeInAnyDeliveryOrder) {
  // Four versions of one record; delivered in every order, one event per batch, the newest wins.
  std::array<int, 4> order = {0, 1, 2, 3};
  const std::array<const char*, 4> revs = {kRev1, kRev2, kRev3, kRev4};
  const std::array<std::string, 4> bodies = {kBodyA, kBodyB, kBodyC, R"({"text":"fourth"})"};
  int permutation = 0;
  std::vector<TableRow> want;
  do {
    std::string rkey = "p" + std::to_string(permutation++);
    for (int i : order) {
      MustWrite({i % 2 == 0 ? MakeCreate(kAlice, kPost, rkey, bodies[i], revs[i])
                            : MakeUpdate(kAlice, kPost, rkey, bodies[i], revs[i])});
    }
    want.push_back(Row(kAlice, kPost, rkey, bodies[3], kRev4));
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(permutation, 24);
  std::sort(want.begin(), want.end(),
            [](const TableRow& a, const TableRow& b) { return a.uri < b.uri; });
  EXPECT_EQ(MustReadAll(), want);
}

TEST_P(SinkConformanceTest, ManyRowsAcrossBatchesAndSinks) {
  std::vector<TableRow> want;
  for (int b = 0; b < 3; ++b) {
    std::vector<Event> batch;
    for (int i = 0; i < 1000; ++i) {
      std::string did = "did:plc:user" + std::to_string(i % 50);
      std::string collection = i % 3 == 0 ? kLike : kPost;
      std::string rkey = "k" + std::to_string(b) + "-" + std::to_string(i);
      std::string body = R"({"n":)" + std::to_string(b * 1000 + i) + "}";
      want.push_back(Row(did, collection, rkey, body, kRev1));
      batch.push_back(MakeCreate(did, collection, rkey, body, kRev1));
    }
    ExpectStats(MustWrite(batch), Stats(1000, 0, 0, 0, 0));
  }
  std::sort(want.begin(), want.end(),
            [](const TableRow& a, const TableRow& b) { return a.uri < b.uri; });
  EXPECT_EQ(MustReadAll(), want);

  // A second sink on the same database (a restarted process) applies the rules to the same rows.
  sink_.reset();
  auto reopened = env_->OpenSink();
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  sink_ = std::move(reopened).value();
  ExpectStats(MustWrite({MakeCreate("did:plc:user7", kPost, "k0-7", R"({"n":7})", kRev1),
                         MakeAccount("did:plc:user0", AccountStatus::kDeleted)}),
              Stats(0, 0, 1, 0, 0, 1, 60));
  EXPECT_EQ(MustReadAll().size(), 3000u - 60u);
}

TEST_P(SinkConformanceTest, LargeBatchesApplyAsEventByEvent) {
  // Random events over a small key space, so that most writes meet an existing row, repeat a key
  // earlier in their batch, carry an older rev or the same CID: applied in batches of 64-300 here
  // (the sizes at which a sink may group and reorder its work) and one event per batch in a
  // second database, the two tables and the summed counters must agree.
  std::mt19937 rng(20261201);
  const std::array<std::string, 4> bodies = {kBodyA, kBodyB, kBodyC, R"({"text":"fourth"})"};
  const std::array<const char*, 5> revs = {"", kRev1, kRev2, kRev3, kRev4};
  const std::array<const char*, 4> dids = {kAlice, kBob, "did:plc:carol", "did:plc:dave"};
  std::vector<Event> events;
  for (int i = 0; i < 3000; ++i) {
    const std::string did = dids[rng() % dids.size()];
    const std::string collection = rng() % 2 == 0 ? kPost : kLike;
    // Runs of fresh keys (as a backfill writes) between writes to a few hot ones.
    const std::string rkey =
        rng() % 3 == 0 ? "hot" + std::to_string(rng() % 8) : "k" + std::to_string(i);
    const std::string rev = revs[rng() % revs.size()];
    const std::string& body = bodies[rng() % bodies.size()];
    // Stretches of writes only (where a sink may gather many in a row), then stretches that
    // mix in deletes and account events.
    const bool writes_only = (i / 150) % 3 != 2;
    const unsigned op = rng() % 100;
    if (op < 60 || (writes_only && op < 70)) {
      events.push_back(MakeCreate(did, collection, rkey, body, rev, "2024"));
    } else if (op < 80 || writes_only) {
      events.push_back(MakeUpdate(did, collection, rkey, body, rev));
    } else if (op < 97) {
      events.push_back(MakeDelete(did, collection, "hot" + std::to_string(rng() % 8), rev));
    } else {
      events.push_back(
          MakeAccount(did, rng() % 2 == 0 ? AccountStatus::kDeleted : AccountStatus::kDeactivated));
    }
  }
  WriteStats batched;
  for (size_t at = 0; at < events.size();) {
    const size_t n = std::min<size_t>(64 + rng() % 237, events.size() - at);
    std::vector<Event> batch(events.begin() + at, events.begin() + at + n);
    batched += MustWrite(batch);
    at += n;
  }
  auto other_env = GetParam().make_env([this] { return now_us_; });
  ASSERT_TRUE(other_env.ok()) << other_env.status().ToString();
  auto other_sink = (*other_env)->OpenSink();
  ASSERT_TRUE(other_sink.ok()) << other_sink.status().ToString();
  WriteStats single;
  for (const Event& e : events) {
    auto stats = (*other_sink)->Write(std::vector<Event>{e});
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    single += *stats;
  }
  ExpectStats(batched, single);
  // The mix reaches every outcome.
  EXPECT_GT(single.inserted, 0u);
  EXPECT_GT(single.updated, 0u);
  EXPECT_GT(single.unchanged, 0u);
  EXPECT_GT(single.stale, 0u);
  EXPECT_GT(single.deleted, 0u);
  EXPECT_GT(single.purged_records, 0u);
  auto other_rows = (*other_env)->reader().ReadAll();
  ASSERT_TRUE(other_rows.ok()) << other_rows.status().ToString();
  const std::vector<TableRow> rows = MustReadAll();
  EXPECT_GT(rows.size(), 100u);
  EXPECT_EQ(rows, *other_rows);
}

// Sinks opening a database nobody has opened yet all at once (a backfill beside the live
// consumer, sharded processes): all open, and the schema is created once. They wait for each
// other's locks as long as a sink does by default (the env's short wait is for the cases that
// block the database on purpose).
TEST_P(SinkConformanceTest, SinksOpeningAFreshDatabaseAtOnceAllOpen) {
  SinkTweaks tweaks;
  tweaks.default_lock_timeout = true;
  for (int round = 0; round < 8; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto fresh = GetParam().make_env([this] { return now_us_; });
    ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
    Status results[3];
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i) {
      threads.emplace_back([&, i] { results[i] = (*fresh)->OpenSinkWith(tweaks).status(); });
    }
    for (auto& t : threads) t.join();
    for (const Status& st : results) EXPECT_TRUE(st.ok()) << st.ToString();
    auto version = (*fresh)->Column("SELECT count(*) FROM atfill_schema_version");
    ASSERT_TRUE(version.ok()) << version.status().ToString();
    EXPECT_EQ(*version, std::vector<std::string>{"1"});
  }
}

// Sinks on one database, one after another and side by side, share its rows and its interned
// DID and collection ids.
TEST_P(SinkConformanceTest, SinksOnOneDatabaseShareRowsAndIds) {
  MustWrite({MakeCreate(kAlice, kPost, "a", kBodyA, kRev1)});
  sink_.reset();
  auto reopened = env_->OpenSink();
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  auto beside = env_->OpenSink();
  ASSERT_TRUE(beside.ok()) << beside.status().ToString();
  auto stats = (*reopened)->Write(std::vector<Event>{MakeCreate(kAlice, kPost, "a", kBodyA, kRev1),
                                                     MakeCreate(kAlice, kLike, "l", kBodyB)});
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  ExpectStats(*stats, Stats(1, 0, 1, 0, 0));
  stats = (*beside)->Write(std::vector<Event>{MakeUpdate(kAlice, kPost, "a", kBodyC, kRev2)});
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  ExpectStats(*stats, Stats(0, 1, 0, 0, 0));
  EXPECT_EQ(MustReadAll(), (std::vector<TableRow>{Row(kAlice, kLike, "l", kBodyB, ""),
                                                  Row(kAlice, kPost, "a", kBodyC, kRev2)}));
  stats = (*reopened)->Write(std::vector<Event>{MakeAccount(kAlice, AccountStatus::kDeleted)});
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_TRUE(MustReadAll().empty());
  EXPECT_EQ(MustColumn("SELECT count(*) FROM atfill_dids"), std::vector<std::string>{"1"});
  EXPECT_EQ(MustColumn("SELECT count(*) FROM atfill_collections"), std::vector<std::string>{"2"});
}

// An intern cache far smaller than the ids in use evicts and looks up again, and every row still
// gets its own DID and collection.
TEST_P(SinkConformanceTest, SmallInternCacheStaysCorrect) {
  SinkTweaks tweaks;
  tweaks.intern_cache_entries = 2;
  auto small = env_->OpenSinkWith(tweaks);
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  std::vector<Event> batch;
  std::vector<TableRow> want;
  for (int i = 0; i < 60; ++i) {
    const std::string did = "did:plc:d" + std::to_string(i % 10);
    const std::string collection = "com.example.c" + std::to_string(i % 3);
    const std::string rkey = "r" + std::to_string(i);
    batch.push_back(MakeCreate(did, collection, rkey, kBodyA, kRev1));
    want.push_back(Row(did, collection, rkey, kBodyA, kRev1));
  }
  std::sort(want.begin(), want.end(),
            [](const TableRow& x, const TableRow& y) { return x.uri < y.uri; });
  auto first = (*small)->Write(batch);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->inserted, 60u);
  auto second = (*small)->Write(batch);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->unchanged, 60u);
  EXPECT_EQ(MustReadAll(), want);
  EXPECT_EQ(MustColumn("SELECT count(*) FROM atfill_dids"), std::vector<std::string>{"10"});
  EXPECT_EQ(MustColumn("SELECT count(*) FROM atfill_collections"), std::vector<std::string>{"3"});
}

// A database written by a newer atfill (a higher schema version) is refused by the sink and the
// reader alike, and refusing it changes nothing.
TEST_P(SinkConformanceTest, RefusesANewerSchemaVersion) {
  sink_.reset();
  ASSERT_TRUE(env_->Exec("UPDATE atfill_schema_version SET version = 99").ok());
  auto sink = env_->OpenSink();
  ASSERT_FALSE(sink.ok());
  EXPECT_EQ(sink.status().code(), StatusCode::kUnsupported) << sink.status().ToString();
  EXPECT_NE(sink.status().message().find("99"), std::string::npos) << sink.status().ToString();
  EXPECT_NE(sink.status().message().find("newer"), std::string::npos) << sink.status().ToString();
  const Status reader = env_->OpenReader().status();
  EXPECT_EQ(reader.code(), StatusCode::kUnsupported) << reader.ToString();
  EXPECT_EQ(MustColumn("SELECT version FROM atfill_schema_version"),
            std::vector<std::string>{"99"});
}

// The backend's reader finds a record by its AT URI or its parts, refuses what is not an AT URI,
// counts, answers whether an account holds records in a collection, runs read-only SQL, and sees
// each batch committed while it is open.
// A collection removed from the live consumer with purge: its rows go, in several transactions
// when there are more than one holds, and every other row stays.
TEST_P(SinkConformanceTest, PurgingACollectionDeletesItsRowsAlone) {
  std::vector<pipeline::Event> batch;
  const int posts = sinks::kPurgeRows + 7;
  for (int i = 0; i < posts; ++i) {
    batch.push_back(MakeCreate(i % 2 ? kAlice : kBob, kPost, "p" + std::to_string(i), kBodyA));
  }
  batch.push_back(MakeCreate(kAlice, kLike, "l1", kBodyB));
  batch.push_back(MakeCreate(kBob, kLike, "l2", kBodyB));
  MustWrite(batch);
  auto purged = env_->PurgeCollection(kPost);
  ASSERT_TRUE(purged.ok()) << purged.status().ToString();
  EXPECT_EQ(*purged, static_cast<uint64_t>(posts));
  auto rows = env_->reader().ReadAll();
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 2u);
  for (const auto& r : *rows) EXPECT_NE(r.uri.find(kLike), std::string::npos) << r.uri;
  auto again = env_->PurgeCollection(kPost);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, 0u);
  // The sink writes on after a purge.
  MustWrite({MakeCreate(kAlice, kPost, "p-after", kBodyA)});
  auto after = env_->reader().ReadAll();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->size(), 3u);
}

// What `atfill verify` reads: the DIDs holding records and one repo's keys, CIDs and revs.
TEST_P(SinkConformanceTest, ReaderListsAccountsAndARepoSRecords) {
  MustWrite({MakeCreate(kBob, kPost, "b2", kBodyB, kRev2), MakeCreate(kAlice, kPost, "a", kBodyA),
             MakeCreate(kAlice, kLike, "l", kBodyB, kRev1), MakeCreate(kBob, kLike, "x", kBodyA),
             MakeCreate(kBob, kPost, "b1", kBodyA, kRev1)});
  // Bob's like deleted: his account still holds records; one of a third account held none.
  MustWrite({MakeDelete(kBob, kLike, "x", ""), MakeCreate("did:plc:carol", kPost, "c", kBodyA),
             MakeDelete("did:plc:carol", kPost, "c", "")});
  auto reader = env_->OpenReader();
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  RecordLookup& r = **reader;
  auto dids = r.Dids();
  ASSERT_TRUE(dids.ok()) << dids.status().ToString();
  EXPECT_EQ(*dids, (std::vector<std::string>{kAlice, kBob}));
  auto alice = r.RepoRecords(kAlice);
  ASSERT_TRUE(alice.ok()) << alice.status().ToString();
  EXPECT_EQ(*alice, (std::vector<sinks::RepoRecordKey>{{kLike, "l", CidOf(kBodyB), kRev1},
                                                       {kPost, "a", CidOf(kBodyA), ""}}));
  auto bob = r.RepoRecords(kBob);
  ASSERT_TRUE(bob.ok()) << bob.status().ToString();
  EXPECT_EQ(*bob, (std::vector<sinks::RepoRecordKey>{{kPost, "b1", CidOf(kBodyA), kRev1},
                                                     {kPost, "b2", CidOf(kBodyB), kRev2}}));
  auto none = r.RepoRecords("did:plc:nobody");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->empty());
}

TEST_P(SinkConformanceTest, ReaderLooksUpByUri) {
  MustWrite(
      {MakeCreate(kAlice, kPost, "a", kBodyA, kRev1, "c"), MakeCreate(kAlice, kPost, "b", kBodyB)});
  auto reader = env_->OpenReader();
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  RecordLookup& r = **reader;
  const std::string uri = Uri(kAlice, kPost, "a");
  auto found = r.Get(uri);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_TRUE(found->has_value());
  const sinks::RecordRow want{
      uri,     kAlice, kPost, "a", kBodyA, CidOf(kBodyA), kRev1, "2026-11-30T09:00:00.000000Z",
      now_us_, "c"};
  EXPECT_EQ(**found, want);
  auto by_key = r.Get(kAlice, kPost, "a");
  ASSERT_TRUE(by_key.ok()) << by_key.status().ToString();
  EXPECT_EQ(*by_key, *found);
  auto b = r.Get(Uri(kAlice, kPost, "b"));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(b->has_value());
  EXPECT_EQ((*b)->record, kBodyB);
  EXPECT_EQ((*b)->rev, "");
  EXPECT_EQ((*b)->created_at, "");

  auto missing = r.Get(Uri(kAlice, kPost, "zzz"));
  ASSERT_TRUE(missing.ok()) << missing.status().ToString();
  EXPECT_FALSE(missing->has_value());
  auto other_account = r.Get(kBob, kPost, "a");
  ASSERT_TRUE(other_account.ok()) << other_account.status().ToString();
  EXPECT_FALSE(other_account->has_value());
  auto count = r.Count();
  ASSERT_TRUE(count.ok()) << count.status().ToString();
  EXPECT_EQ(*count, 2u);
  auto holds = r.HoldsRecords(kAlice, kPost);
  ASSERT_TRUE(holds.ok()) << holds.status().ToString();
  EXPECT_TRUE(*holds);
  auto holds_not = r.HoldsRecords(kAlice, kLike);
  ASSERT_TRUE(holds_not.ok()) << holds_not.status().ToString();
  EXPECT_FALSE(*holds_not);

  for (const char* bad :
       {"", "http://x/y/z", "at://did:plc:x", "at://did:plc:x/coll",
        "at://did:plc:x/coll/rkey/extra", "at:///coll/rkey", "at://d//rkey", "at://d/coll/"}) {
    auto got = r.Get(bad);
    ASSERT_FALSE(got.ok()) << bad;
    EXPECT_EQ(got.status().code(), StatusCode::kInvalid) << bad;
    EXPECT_NE(got.status().message().find("AT URI"), std::string::npos) << got.status().ToString();
  }

  // The reader's SQL is read-only.
  EXPECT_FALSE(r.Query("DELETE FROM atfill_record_rows").ok());
  auto query = r.Query("SELECT rkey, rev FROM atfill_records ORDER BY rkey");
  ASSERT_TRUE(query.ok()) << query.status().ToString();
  EXPECT_EQ(*query,
            (std::vector<std::vector<std::string>>{{"rkey", "rev"}, {"a", kRev1}, {"b", ""}}));

  // A reader open during later writes sees each committed batch.
  MustWrite({MakeDelete(kAlice, kPost, "a")});
  auto after = r.Get(uri);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_FALSE(after->has_value());
  auto count_after = r.Count();
  ASSERT_TRUE(count_after.ok()) << count_after.status().ToString();
  EXPECT_EQ(*count_after, 1u);
}

// A version table of more than one row is corruption, not a version to guess at.
TEST_P(SinkConformanceTest, RefusesABrokenVersionTable) {
  sink_.reset();
  ASSERT_TRUE(env_->Exec("INSERT INTO atfill_schema_version VALUES (1)").ok());
  auto sink = env_->OpenSink();
  ASSERT_FALSE(sink.ok());
  EXPECT_EQ(sink.status().code(), StatusCode::kCorrupt) << sink.status().ToString();
  EXPECT_NE(sink.status().message().find("2 rows"), std::string::npos) << sink.status().ToString();
}

// Two writers of the same records at once (a backfill beside the live consumer): a write that
// meets the other's lock is Unavailable and applies nothing, so retried writes are never half
// applied, and the newest version of every record wins whatever the interleaving.
TEST_P(SinkConformanceTest, ConcurrentWritersOfTheSameRecordsConverge) {
  SinkTweaks tweaks;
  tweaks.default_lock_timeout = true;
  auto first = env_->OpenSinkWith(tweaks);
  auto second = env_->OpenSinkWith(tweaks);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  const std::vector<std::string> revs = {kRev1, kRev2, kRev3, kRev4};
  auto body = [](int version, int k) {
    return R"({"v":)" + std::to_string(version) + R"(,"k":)" + std::to_string(k) + "}";
  };
  auto writer = [&](pipeline::Sink* sink, std::vector<int> versions, std::string* failure) {
    for (int round = 0; round < 30; ++round) {
      for (int version : versions) {
        std::vector<Event> batch;
        for (int k = 0; k < 200; ++k) {
          batch.push_back(MakeCreate(kAlice, kPost, "k" + std::to_string(k), body(version, k),
                                     revs[static_cast<size_t>(version)]));
        }
        for (;;) {
          auto stats = sink->Write(batch);
          if (stats.ok()) break;
          if (stats.status().code() != StatusCode::kUnavailable) {
            *failure = stats.status().ToString();
            return;
          }
        }
      }
    }
  };
  std::string f1, f2;
  std::thread a(writer, first->get(), std::vector<int>{0, 2}, &f1);
  std::thread b(writer, second->get(), std::vector<int>{1, 3}, &f2);
  a.join();
  b.join();
  EXPECT_EQ(f1, "");
  EXPECT_EQ(f2, "");
  std::vector<TableRow> want;
  for (int k = 0; k < 200; ++k) {
    want.push_back(Row(kAlice, kPost, "k" + std::to_string(k), body(3, k), kRev4));
  }
  std::sort(want.begin(), want.end(),
            [](const TableRow& x, const TableRow& y) { return x.uri < y.uri; });
  EXPECT_EQ(MustReadAll(), want);
}

}  // namespace
}  // namespace atfill::testing
