// The small pipeline types every sink uses, and the dry-run sink.
#include <gtest/gtest.h>

#include <vector>

#include "pipeline/event.hpp"
#include "pipeline/sink.hpp"
#include "sinks/dry_run_sink.hpp"
#include "tests/common/sink_conformance.hpp"

namespace atfill {
namespace {

using pipeline::AccountStatus;
using pipeline::Event;
using pipeline::Operation;
using pipeline::Origin;
using pipeline::WriteStats;

TEST(PipelineTypesTest, OperationAndOriginNames) {
  EXPECT_EQ(pipeline::OperationName(Operation::kCreate), "create");
  EXPECT_EQ(pipeline::OperationName(Operation::kUpdate), "update");
  EXPECT_EQ(pipeline::OperationName(Operation::kDelete), "delete");
  EXPECT_EQ(pipeline::OriginName(Origin::kLive), "live");
  EXPECT_EQ(pipeline::OriginName(Origin::kCrawl), "crawl");
  EXPECT_EQ(pipeline::OriginName(Origin::kReplay), "replay");
}

TEST(PipelineTypesTest, RecordEventUri) {
  pipeline::RecordEvent e;
  e.did = "did:plc:abc";
  e.collection = "app.bsky.feed.post";
  e.rkey = "3kabc";
  EXPECT_EQ(e.Uri(), "at://did:plc:abc/app.bsky.feed.post/3kabc");
}

TEST(PipelineTypesTest, AccountStatusesRoundTripAndPurge) {
  struct Case {
    const char* text;
    AccountStatus status;
    bool purges;
  };
  const std::vector<Case> cases = {
      {"active", AccountStatus::kActive, false},
      {"deactivated", AccountStatus::kDeactivated, false},
      {"deleted", AccountStatus::kDeleted, true},
      {"takendown", AccountStatus::kTakendown, true},
      {"suspended", AccountStatus::kSuspended, true},
      {"desynchronized", AccountStatus::kDesynchronized, false},
      {"throttled", AccountStatus::kThrottled, false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(pipeline::ParseAccountStatus(c.text), c.status) << c.text;
    EXPECT_EQ(pipeline::AccountStatusName(c.status), c.text);
    EXPECT_EQ(pipeline::StatusPurgesRecords(c.status), c.purges) << c.text;
  }
  EXPECT_EQ(pipeline::ParseAccountStatus(""), AccountStatus::kActive);
  EXPECT_EQ(pipeline::ParseAccountStatus("hibernating"), AccountStatus::kOther);
  EXPECT_EQ(pipeline::ParseAccountStatus("Deleted"), AccountStatus::kOther);
  EXPECT_EQ(pipeline::AccountStatusName(AccountStatus::kOther), "other");
  EXPECT_FALSE(pipeline::StatusPurgesRecords(AccountStatus::kOther));
}

TEST(PipelineTypesTest, WriteStatsAddUp) {
  WriteStats a;
  a.inserted = 1;
  a.updated = 2;
  a.unchanged = 3;
  a.stale = 4;
  a.deleted = 5;
  a.purged_accounts = 6;
  a.purged_records = 7;
  WriteStats b = a;
  b += a;
  b += WriteStats{};
  EXPECT_EQ(b.inserted, 2u);
  EXPECT_EQ(b.updated, 4u);
  EXPECT_EQ(b.unchanged, 6u);
  EXPECT_EQ(b.stale, 8u);
  EXPECT_EQ(b.deleted, 10u);
  EXPECT_EQ(b.purged_accounts, 12u);
  EXPECT_EQ(b.purged_records, 14u);
  EXPECT_EQ(b.records_written(), 6u);
}

TEST(DryRunSinkTest, CountsWithoutWriting) {
  auto sink = sinks::NewDryRunSink();
  ASSERT_TRUE(sink.ok());
  EXPECT_EQ((*sink)->name(), "dry-run");
  const std::string body = R"({"text":"x"})";
  std::vector<Event> batch = {
      testing::MakeCreate("did:plc:a", "app.bsky.feed.post", "r", body, "3kaaaaaaaaa2a"),
      testing::MakeUpdate("did:plc:a", "app.bsky.feed.post", "r", body, "3kaaaaaaaaa2b"),
      testing::MakeDelete("did:plc:a", "app.bsky.feed.post", "r"),
      testing::MakeAccount("did:plc:a", AccountStatus::kTakendown),
      testing::MakeAccount("did:plc:a", AccountStatus::kDeactivated),
  };
  for (int round = 0; round < 2; ++round) {
    auto stats = (*sink)->Write(batch);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->inserted, 2u);
    EXPECT_EQ(stats->updated, 0u);
    EXPECT_EQ(stats->unchanged, 0u);
    EXPECT_EQ(stats->stale, 0u);
    EXPECT_EQ(stats->deleted, 1u);
    EXPECT_EQ(stats->purged_accounts, 1u);
    EXPECT_EQ(stats->purged_records, 0u);
  }
}

TEST(DryRunSinkTest, RejectsInvalidEventsLikeTheRealSinks) {
  auto sink = sinks::NewDryRunSink();
  ASSERT_TRUE(sink.ok());
  Event no_cid = testing::MakeCreate("did:plc:a", "app.bsky.feed.post", "r", "{}");
  std::get<pipeline::RecordEvent>(no_cid).cid = atproto::Cid();
  for (const Event& bad : {testing::MakeCreate("did:plc:a", "app.bsky.feed.post", "", "{}"), no_cid,
                           testing::MakeAccount("", AccountStatus::kDeleted)}) {
    auto stats = (*sink)->Write(std::vector<Event>{
        testing::MakeCreate("did:plc:a", "app.bsky.feed.post", "ok", "{}"), bad});
    ASSERT_FALSE(stats.ok());
    EXPECT_EQ(stats.status().code(), StatusCode::kInvalid);
    EXPECT_NE(stats.status().message().find("event 1"), std::string::npos)
        << stats.status().ToString();
  }
}

}  // namespace
}  // namespace atfill
