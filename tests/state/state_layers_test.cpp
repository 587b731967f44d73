// Conformance of the typed state layers (cursors, tombstones, error log, jobs, work queue, failed
// blocks, resolver cache): every test runs against the in-memory store and RocksDB.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "state/cursors.hpp"
#include "state/error_log.hpp"
#include "state/failed_blocks.hpp"
#include "state/job_store.hpp"
#include "state/repo_chains.hpp"
#include "state/resolver_cache.hpp"
#include "state/tombstones.hpp"
#include "state/work_queue.hpp"
#include "tests/state/state_test_util.hpp"

namespace atfill::state {
namespace {

using testing::BackendNames;
using testing::Backends;

constexpr int64_t kHourUs = int64_t{3600} * 1000000;

template <typename Backend>
class StateLayers : public testing::StoreFixture<Backend> {
 protected:
  void Commit(const WriteBatch& b) { ASSERT_TRUE(this->kv().Write(b).ok()); }
};

TYPED_TEST_SUITE(StateLayers, Backends, BackendNames);

// ---- Repo chains (the firehose's desync detection)

TEST(RepoChainsJudge, ApplyStaleAndDesync) {
  const RepoChain last{"3l2222222222b", "bafy-data-b", false};
  std::string why;
  EXPECT_EQ(JudgeCommit(std::nullopt, "3l2222222222a", "", &why), ChainVerdict::kApply)
      << "a repo without a link takes its first commit";
  EXPECT_EQ(JudgeCommit(last, "3l2222222222c", "bafy-data-b", &why), ChainVerdict::kApply);
  EXPECT_EQ(JudgeCommit(last, "3l2222222222b", "bafy-data-a", &why), ChainVerdict::kStale);
  EXPECT_EQ(JudgeCommit(last, "3l2222222222a", "bafy-data-a", &why), ChainVerdict::kStale);
  EXPECT_NE(why.find("3l2222222222a"), std::string::npos) << why;
  EXPECT_EQ(JudgeCommit(last, "3l2222222222c", "bafy-data-x", &why), ChainVerdict::kDesync);
  EXPECT_NE(why.find("bafy-data-x"), std::string::npos) << why;
  EXPECT_NE(why.find("bafy-data-b"), std::string::npos) << why;
  EXPECT_EQ(JudgeCommit(last, "3l2222222222c", "", &why), ChainVerdict::kDesync);
  EXPECT_NE(why.find("no prevData"), std::string::npos) << why;
  RepoChain broken = last;
  broken.desynchronized = true;
  EXPECT_EQ(JudgeCommit(broken, "3l2222222222c", "bafy-data-b", &why), ChainVerdict::kDesync);
  EXPECT_EQ(ChainVerdictName(ChainVerdict::kStale), "stale");
}

// The inactive marks live beside the links without being read as links.
TYPED_TEST(StateLayers, RepoChainsKeepInactiveMarksApartFromTheLinks) {
  RepoChains chains(this->kv());
  WriteBatch b;
  chains.Set(&b, "did:plc:a", {"3l2222222222a", "bafy-a", true});
  chains.SetInactive(&b, "did:plc:a", "deactivated");
  chains.SetInactive(&b, "did:plc:b", "takendown");
  this->Commit(b);
  auto marks = [&] {
    std::vector<std::string> out;
    EXPECT_TRUE(chains
                    .ScanInactive([&](std::string_view did, std::string_view status) {
                      out.push_back(std::string(did) + "=" + std::string(status));
                      return true;
                    })
                    .ok());
    return out;
  };
  EXPECT_EQ(marks(), (std::vector<std::string>{"did:plc:a=deactivated", "did:plc:b=takendown"}));
  size_t links = 0;
  ASSERT_TRUE(chains
                  .ScanDesynchronized([&](std::string_view, const RepoChain&) {
                    ++links;
                    return true;
                  })
                  .ok());
  EXPECT_EQ(links, 1u);
  EXPECT_FALSE(chains.Get("did:plc:b")->has_value());  // a mark is not a link
  WriteBatch clear;
  chains.ClearInactive(&clear, "did:plc:a");
  this->Commit(clear);
  EXPECT_EQ(marks(), (std::vector<std::string>{"did:plc:b=takendown"}));
  EXPECT_EQ(**chains.Get("did:plc:a"), (RepoChain{"3l2222222222a", "bafy-a", true}));
}

TYPED_TEST(StateLayers, RepoChainsSetGetAndScanDesynchronized) {
  RepoChains chains(this->kv());
  EXPECT_FALSE(chains.Get("did:plc:a")->has_value());
  WriteBatch b;
  chains.Set(&b, "did:plc:a", {"3l2222222222a", "bafy-a", false});
  chains.Set(&b, "did:plc:b", {"3l2222222222b", "bafy-b", true});
  chains.Set(&b, "did:plc:c", {"", "", true});
  this->Commit(b);
  EXPECT_EQ(**chains.Get("did:plc:a"), (RepoChain{"3l2222222222a", "bafy-a", false}));
  EXPECT_EQ(**chains.Get("did:plc:c"), (RepoChain{"", "", true}));
  std::vector<std::string> desync;
  ASSERT_TRUE(chains
                  .ScanDesynchronized([&](std::string_view did, const RepoChain& c) {
                    EXPECT_TRUE(c.desynchronized);
                    desync.emplace_back(did);
                    return true;
                  })
                  .ok());
  EXPECT_EQ(desync, (std::vector<std::string>{"did:plc:b", "did:plc:c"}));
  WriteBatch rm;
  chains.Remove(&rm, "did:plc:b");
  WriteBatch garbage;
  garbage.Put(Family::kCursors, "rc/did:plc:z", "no separators");
  this->Commit(rm);
  this->Commit(garbage);
  EXPECT_FALSE(chains.Get("did:plc:b")->has_value());
  auto bad = chains.Get("did:plc:z");
  EXPECT_EQ(bad.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(bad.status().message().find("did:plc:z"), std::string::npos);
  EXPECT_EQ(
      chains.ScanDesynchronized([](std::string_view, const RepoChain&) { return true; }).code(),
      StatusCode::kCorrupt);
}

// ---- Cursors

TYPED_TEST(StateLayers, CursorsSetGetAndList) {
  Cursors cursors(this->kv());
  auto missing = cursors.Get("relay/app.bsky.feed.post");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
  WriteBatch b;
  cursors.Set(&b, "relay/app.bsky.feed.post", "cursor-abc");
  cursors.Set(&b, "relay/app.bsky.feed.like", "cursor-xyz");
  cursors.SetUint64(&b, "jetstream/watermark", 1725911162329308);
  cursors.Set(&b, "archive/seq", "x");
  this->Commit(b);
  EXPECT_EQ(*cursors.Get("relay/app.bsky.feed.post"), "cursor-abc");
  auto wm = cursors.GetUint64("jetstream/watermark");
  ASSERT_TRUE(wm.ok());
  EXPECT_EQ(*wm, 1725911162329308u);
  std::vector<std::string> names;
  ASSERT_TRUE(cursors
                  .List("relay/",
                        [&](std::string_view n, std::string_view) {
                          names.emplace_back(n);
                          return true;
                        })
                  .ok());
  EXPECT_EQ(names,
            (std::vector<std::string>{"relay/app.bsky.feed.like", "relay/app.bsky.feed.post"}));
  WriteBatch rm;
  cursors.Remove(&rm, "relay/app.bsky.feed.like");
  this->Commit(rm);
  EXPECT_FALSE(cursors.Get("relay/app.bsky.feed.like")->has_value());
  auto absent = cursors.GetUint64("nope");
  ASSERT_TRUE(absent.ok());
  EXPECT_FALSE(absent->has_value());
}

TYPED_TEST(StateLayers, CursorUint64RejectsGarbage) {
  Cursors cursors(this->kv());
  WriteBatch b;
  for (const char* bad : {"x", "", "12a", "-1", "99999999999999999999999"}) {
    cursors.Set(&b, std::string("bad/") + bad, bad);
  }
  this->Commit(b);
  for (const char* bad : {"x", "", "12a", "-1", "99999999999999999999999"}) {
    auto r = cursors.GetUint64(std::string("bad/") + bad);
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << bad;
    EXPECT_NE(r.status().message().find("bad/"), std::string::npos);
  }
}

// ---- Tombstones

TYPED_TEST(StateLayers, TombstonesPutGetRemove) {
  Tombstones tomb(this->kv());
  const std::string uri = "at://did:plc:abc/app.bsky.feed.post/3k2a";
  EXPECT_FALSE(tomb.GetRecord(uri)->has_value());
  WriteBatch b;
  tomb.PutRecord(&b, uri, {"3k2arev", 1000});
  tomb.PutAccount(&b, "did:plc:abc", {"deleted", 2000});
  this->Commit(b);
  EXPECT_EQ(tomb.GetRecord(uri)->value(), (RecordTombstone{"3k2arev", 1000}));
  EXPECT_EQ(tomb.GetAccount("did:plc:abc")->value(), (AccountTombstone{"deleted", 2000}));
  // Record and account namespaces do not mix.
  EXPECT_FALSE(tomb.GetRecord("did:plc:abc")->has_value());
  EXPECT_FALSE(tomb.GetAccount(uri)->has_value());
  WriteBatch rm;
  tomb.RemoveRecord(&rm, uri);
  tomb.RemoveAccount(&rm, "did:plc:abc");
  this->Commit(rm);
  EXPECT_FALSE(tomb.GetRecord(uri)->has_value());
  EXPECT_FALSE(tomb.GetAccount("did:plc:abc")->has_value());
}

TYPED_TEST(StateLayers, TombstoneSweepRemovesOnlyExpired) {
  Tombstones tomb(this->kv());
  const int64_t now = 1'000 * kHourUs;
  WriteBatch b;
  // Records at now - 0h .. now - 99h; accounts likewise, every 10 hours.
  for (int h = 0; h < 100; ++h) {
    tomb.PutRecord(&b, "at://did:plc:x/c/" + std::to_string(h), {"rev", now - h * kHourUs});
    if (h % 10 == 0)
      tomb.PutAccount(&b, "did:plc:" + std::to_string(h), {"deleted", now - h * kHourUs});
  }
  this->Commit(b);
  // Default retention is 72 hours: ages 73..99 go (27 records) and accounts 80, 90.
  auto swept = tomb.Sweep(now);
  ASSERT_TRUE(swept.ok()) << swept.status().ToString();
  EXPECT_EQ(*swept, 29u);
  for (int h = 0; h < 100; ++h) {
    EXPECT_EQ(tomb.GetRecord("at://did:plc:x/c/" + std::to_string(h))->has_value(), h <= 72) << h;
  }
  EXPECT_TRUE(tomb.GetAccount("did:plc:70")->has_value());
  EXPECT_FALSE(tomb.GetAccount("did:plc:80")->has_value());
  // Nothing more to do at the same time.
  EXPECT_EQ(*tomb.Sweep(now), 0u);
  // An explicit retention.
  EXPECT_EQ(*tomb.Sweep(now, 10 * kHourUs), 62u + 6u);  // records 11..72, accounts 20..70
  EXPECT_TRUE(tomb.GetRecord("at://did:plc:x/c/10")->has_value());
  EXPECT_EQ(tomb.Sweep(now, -1).status().code(), StatusCode::kInvalid);
}

TYPED_TEST(StateLayers, TombstoneSweepHandlesOverwritesAndRemovals) {
  Tombstones tomb(this->kv());
  const int64_t now = 1'000 * kHourUs;
  const int64_t old = now - 100 * kHourUs;
  WriteBatch b;
  tomb.PutRecord(&b, "at://a", {"r1", old});
  tomb.PutRecord(&b, "at://b", {"r1", old});
  tomb.PutRecord(&b, "at://c", {"r1", old});
  this->Commit(b);
  WriteBatch b2;
  tomb.PutRecord(&b2, "at://a", {"r2", now});  // re-deleted recently: must survive
  tomb.RemoveRecord(&b2, "at://b");            // removed: its old index entry is stale
  this->Commit(b2);
  auto swept = tomb.Sweep(now);
  ASSERT_TRUE(swept.ok());
  EXPECT_EQ(*swept, 1u);  // only c
  EXPECT_EQ(tomb.GetRecord("at://a")->value(), (RecordTombstone{"r2", now}));
  EXPECT_FALSE(tomb.GetRecord("at://c")->has_value());
  // The stale index entries are gone too: a later sweep of a's new entry still works.
  EXPECT_EQ(*tomb.Sweep(now + 73 * kHourUs), 1u);
  EXPECT_FALSE(tomb.GetRecord("at://a")->has_value());
  // Nothing is left in the family at all.
  int left = 0;
  ASSERT_TRUE(
      this->kv().Scan(Family::kTombstones, "", [&](auto, auto) { return ++left, true; }).ok());
  EXPECT_EQ(left, 0);
}

TYPED_TEST(StateLayers, TombstoneSweepWorksInSmallBatchesAndNegativeTimes) {
  TombstoneOptions options;
  options.retention_us = 10;
  options.sweep_batch = 3;
  ASSERT_TRUE(options.Validate().ok());
  Tombstones tomb(this->kv(), options);
  WriteBatch b;
  for (int i = 0; i < 20; ++i) tomb.PutRecord(&b, "at://n/" + std::to_string(i), {"", i - 10});
  this->Commit(b);
  // Cutoff 5 - 10 = -5: times -10..-6 go.
  EXPECT_EQ(*tomb.Sweep(5), 5u);
  EXPECT_EQ(*tomb.Sweep(100), 15u);
  EXPECT_FALSE((TombstoneOptions{-1, 1}.Validate().ok()));
  EXPECT_FALSE((TombstoneOptions{1, 0}.Validate().ok()));
  EXPECT_EQ(Tombstones(this->kv(), TombstoneOptions{1, 0}).Sweep(0).status().code(),
            StatusCode::kInvalid);
}

TYPED_TEST(StateLayers, TombstoneSweepScalesWithExpiredNotTotal) {
  Tombstones tomb(this->kv());
  const int64_t now = 1'000 * kHourUs;
  constexpr int kLive = 20000;
  WriteBatch b;
  for (int i = 0; i < kLive; ++i) tomb.PutRecord(&b, "at://live/" + std::to_string(i), {"", now});
  for (int i = 0; i < 10; ++i) tomb.PutRecord(&b, "at://old/" + std::to_string(i), {"", 0});
  this->Commit(b);
  // Expired entries sort first in the time index, so they are found among many live ones.
  EXPECT_EQ(*tomb.Sweep(now), 10u);
  EXPECT_EQ(*tomb.Sweep(now), 0u);
  EXPECT_TRUE(tomb.GetRecord("at://live/19999")->has_value());
}

// ---- Error log

NewError Err(std::string kind, std::string key, int64_t t = 1, std::string msg = "m") {
  return {std::move(kind), std::move(key), std::move(msg), t};
}

TYPED_TEST(StateLayers, ErrorLogCoalescesByKindAndKey) {
  ErrorLog log(this->kv());
  auto r1 = log.Append(7, Err("cid_mismatch", "at://x/1", 100, "first"));
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  EXPECT_EQ(r1->added, 1u);
  auto r2 = log.Append(7, Err("cid_mismatch", "at://x/1", 300, "second"));
  EXPECT_EQ(r2->coalesced, 1u);
  ASSERT_TRUE(log.Append(7, Err("cid_mismatch", "at://x/1", 50, "third")).ok());
  ASSERT_TRUE(log.Append(7, Err("bad_json", "at://x/1", 10)).ok());      // another kind
  ASSERT_TRUE(log.Append(8, Err("cid_mismatch", "at://x/1", 10)).ok());  // another job
  auto entries = log.List(7, 0, 100);
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 2u);
  const ErrorEntry& e = (*entries)[0];
  EXPECT_EQ(e.seq, 1u);
  EXPECT_EQ(e.kind, "cid_mismatch");
  EXPECT_EQ(e.key, "at://x/1");
  EXPECT_EQ(e.message, "third");
  EXPECT_EQ(e.attempts, 3u);
  EXPECT_EQ(e.first_us, 50);
  EXPECT_EQ(e.last_us, 300);
  EXPECT_FALSE(e.resolved);
  EXPECT_EQ((*entries)[1].kind, "bad_json");
  EXPECT_EQ(*log.CountsByKind(7),
            (std::map<std::string, uint64_t>{{"bad_json", 1}, {"cid_mismatch", 3}}));
  EXPECT_EQ(*log.Totals(7), (ErrorTotals{4, 2, 0}));
  EXPECT_EQ(*log.Total(8), 1u);
  EXPECT_EQ(*log.Total(9), 0u);
  EXPECT_TRUE(log.CountsByKind(9)->empty());
}

TYPED_TEST(StateLayers, ErrorLogStagedAppendsLandWithTheCallersBatch) {
  ErrorLog log(this->kv());
  const std::vector<NewError> errors = {Err("bad_json", "line 2", 10),
                                        Err("bad_json", "line 9", 20)};
  WriteBatch batch;
  batch.Put(Family::kCursors, "job/1/file", "0:100:9");
  auto staged = log.AppendAll(1, errors, &batch);
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  EXPECT_EQ(staged->added, 2u);
  // Nothing is visible until the caller commits its batch, then all of it is.
  EXPECT_EQ(*log.Total(1), 0u);
  ASSERT_TRUE(this->kv().Write(batch).ok());
  EXPECT_EQ(*log.Total(1), 2u);
  EXPECT_EQ(log.List(1, 0, 10)->size(), 2u);
  // A later staged append builds on what was committed.
  WriteBatch next;
  auto again = log.AppendAll(1, std::vector<NewError>{Err("bad_json", "line 2", 30)}, &next);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->coalesced, 1u);
  ASSERT_TRUE(this->kv().Write(next).ok());
  EXPECT_EQ((*log.List(1, 0, 10))[0].attempts, 2u);
  EXPECT_EQ(*log.Total(1), 3u);
}

TYPED_TEST(StateLayers, ErrorLogCapKeepsExactCounts) {
  ErrorLogOptions options;
  options.max_entries_per_job = 5;
  ErrorLog log(this->kv(), options);
  for (int i = 0; i < 4; ++i) {
    auto r = log.Append(1, Err("bad_json", "line " + std::to_string(i)));
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->cap_reached) << i;
  }
  auto fifth = log.Append(1, Err("invalid_did", "line 4"));
  EXPECT_EQ(fifth->added, 1u);
  EXPECT_TRUE(fifth->cap_reached);
  for (int i = 5; i < 12; ++i) {
    auto r = log.Append(1, Err(i % 2 ? "bad_json" : "script_error", "line " + std::to_string(i)));
    EXPECT_EQ(r->dropped, 1u);
    EXPECT_TRUE(r->cap_reached);
  }
  // A stored key still coalesces beyond the cap.
  auto again = log.Append(1, Err("bad_json", "line 0", 9));
  EXPECT_EQ(again->coalesced, 1u);
  EXPECT_EQ((*log.List(1, 0, 100))[0].attempts, 2u);
  EXPECT_EQ(log.List(1, 0, 100)->size(), 5u);
  EXPECT_EQ(*log.CountsByKind(1),
            (std::map<std::string, uint64_t>{
                {"bad_json", 4 + 4 + 1}, {"invalid_did", 1}, {"script_error", 3}}));
  EXPECT_EQ(*log.Totals(1), (ErrorTotals{13, 5, 7}));
  // Other jobs have their own cap.
  EXPECT_FALSE(log.Append(2, Err("bad_json", "line 0"))->cap_reached);
}

TYPED_TEST(StateLayers, ErrorLogRealCapOfTenThousand) {
  ErrorLog log(this->kv());
  ASSERT_EQ(log.options().max_entries_per_job, 10000u);
  std::vector<NewError> chunk;
  bool reached = false;
  for (int i = 0; i < 10500; ++i) {
    chunk.push_back(
        Err(i % 3 == 0 ? "cid_mismatch" : "bad_json", "at://r/" + std::to_string(i), i));
    if (chunk.size() == 1500) {
      auto r = log.AppendAll(3, chunk);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      reached = reached || r->cap_reached;
      chunk.clear();
    }
  }
  auto last = log.AppendAll(3, chunk);
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(reached || last->cap_reached);
  EXPECT_EQ(*log.Totals(3), (ErrorTotals{10500, 10000, 500}));
  EXPECT_EQ(*log.CountsByKind(3),
            (std::map<std::string, uint64_t>{{"bad_json", 7000}, {"cid_mismatch", 3500}}));
  auto tail = log.List(3, 9998, 10);
  ASSERT_EQ(tail->size(), 2u);
  EXPECT_EQ((*tail)[1].key, "at://r/9999");
  EXPECT_EQ((*tail)[1].seq, 10000u);
}

TYPED_TEST(StateLayers, ErrorLogListPagesInFirstSeenOrder) {
  ErrorLog log(this->kv());
  std::vector<NewError> errors;
  for (int i = 0; i < 10; ++i) errors.push_back(Err("bad_json", "line " + std::to_string(i)));
  errors.push_back(Err("bad_json", "line 3"));  // coalesces within the call
  auto r = log.AppendAll(1, errors);
  EXPECT_EQ(r->added, 10u);
  EXPECT_EQ(r->coalesced, 1u);
  auto page = log.List(1, 4, 3);
  ASSERT_EQ(page->size(), 3u);
  EXPECT_EQ((*page)[0].key, "line 4");
  EXPECT_EQ((*page)[2].key, "line 6");
  EXPECT_EQ((*log.List(1, 3, 1))[0].attempts, 2u);
  EXPECT_TRUE(log.List(1, 10, 5)->empty());
  EXPECT_TRUE(log.List(1, 0, 0)->empty());
}

TYPED_TEST(StateLayers, ErrorLogResolveAndReopen) {
  ErrorLog log(this->kv());
  ASSERT_TRUE(log.Append(1, Err("fetch_failed", "did:plc:a")).ok());
  EXPECT_EQ(log.MarkResolved(1, "fetch_failed", "did:plc:b").code(), StatusCode::kNotFound);
  ASSERT_TRUE(log.MarkResolved(1, "fetch_failed", "did:plc:a").ok());
  EXPECT_TRUE((*log.List(1, 0, 1))[0].resolved);
  ASSERT_TRUE(log.Append(1, Err("fetch_failed", "did:plc:a")).ok());
  EXPECT_FALSE((*log.List(1, 0, 1))[0].resolved);
  EXPECT_EQ((*log.List(1, 0, 1))[0].attempts, 2u);
}

TYPED_TEST(StateLayers, ErrorLogValidatesKindAndTruncates) {
  ErrorLogOptions options;
  options.max_key_bytes = 5;
  options.max_message_bytes = 4;
  ErrorLog log(this->kv(), options);
  for (const std::string& bad :
       {std::string(), std::string("Bad"), std::string("with space"), std::string("nul\0x", 5)}) {
    EXPECT_EQ(log.Append(1, Err(bad, "k")).status().code(), StatusCode::kInvalid) << bad;
  }
  EXPECT_EQ(log.Append(1, Err(std::string(65, 'a'), "k")).status().code(), StatusCode::kInvalid);
  std::vector<NewError> mixed = {Err("ok", "k"), Err("NOT_OK", "k")};
  EXPECT_FALSE(log.AppendAll(1, mixed).ok());
  EXPECT_EQ(*log.Total(1), 0u);  // nothing of a refused call is stored
  // Cuts fall on character boundaries: key "ab€d" at 5 bytes is "ab€", message "xy€" at 4 is "xy".
  ASSERT_TRUE(log.Append(1, Err("ok",
                                "ab\xe2\x82\xac"
                                "d",
                                1, "xy\xe2\x82\xac"))
                  .ok());
  auto e = (*log.List(1, 0, 1))[0];
  EXPECT_EQ(e.key, "ab\xe2\x82\xac");
  EXPECT_EQ(e.message, "xy");
  // The truncated key coalesces with itself.
  EXPECT_EQ(log.Append(1, Err("ok",
                              "ab\xe2\x82\xac"
                              "zzz"))
                ->coalesced,
            1u);
  EXPECT_FALSE((ErrorLogOptions{0, 1, 1}.Validate().ok()));
  ErrorLog misconfigured(this->kv(), ErrorLogOptions{0, 1, 1});
  EXPECT_EQ(misconfigured.Append(2, Err("ok", "k")).status().code(), StatusCode::kInvalid);
}

TYPED_TEST(StateLayers, ErrorLogConcurrentAppendsStayConsistent) {
  ErrorLogOptions options;
  options.max_entries_per_job = 50;
  ErrorLog log(this->kv(), options);
  constexpr int kThreads = 4, kPer = 40;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPer; ++i) {
        // Keys overlap across threads (i % 30), so some coalesce and some hit the cap.
        EXPECT_TRUE(log.Append(1, Err(t % 2 ? "a" : "b", "k" + std::to_string(i % 30))).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  const ErrorTotals totals = *log.Totals(1);
  EXPECT_EQ(totals.occurrences, uint64_t{kThreads * kPer});
  EXPECT_EQ(totals.entries, 50u);
  auto entries = *log.List(1, 0, 1000);
  ASSERT_EQ(entries.size(), 50u);
  uint64_t attempts = 0;
  for (const auto& e : entries) attempts += e.attempts;
  EXPECT_EQ(attempts + totals.dropped, totals.occurrences);
  auto counts = *log.CountsByKind(1);
  EXPECT_EQ(counts["a"] + counts["b"], totals.occurrences);
}

TYPED_TEST(StateLayers, ErrorLogClear) {
  ErrorLog log(this->kv());
  ASSERT_TRUE(log.Append(1, Err("x", "1")).ok());
  ASSERT_TRUE(log.Append(2, Err("x", "1")).ok());
  ASSERT_TRUE(log.Clear(1).ok());
  EXPECT_EQ(*log.Total(1), 0u);
  EXPECT_TRUE(log.List(1, 0, 10)->empty());
  EXPECT_TRUE(log.CountsByKind(1)->empty());
  EXPECT_EQ(*log.Total(2), 1u);
  EXPECT_EQ(log.Append(1, Err("x", "1"))->added, 1u);
}

// ---- Jobs

JobRecord FullRecord() {
  JobRecord r;
  r.kind = "backfill";
  r.status = JobStatus::kPausing;
  r.stage = JobStage::kResolvingAndFetching;
  r.counters = {1, 2, 3, 4, 5, 6, UINT64_MAX, 8, {{"archive_segments", 9}, {"", 0}}};
  r.created_us = 1725911162329308;
  r.started_us = -5;
  r.updated_us = 3;
  r.finished_us = 0;
  r.heartbeat_us = INT64_MAX;
  r.stop_reason = {"unfinished_units", "3 units could not be fetched; see the error log"};
  r.waiting = {"sink_unavailable", "the sink refuses batch 4 (database or disk is full)"};
  r.waiting_since_us = 1780000000123456;
  r.started_by = "cli";
  r.params = {{"config", "/etc/atfill.toml"},
              {"collections", "app.bsky.feed.post\nx"},
              {std::string("bin\0", 4), std::string("\xff\0", 2)}};
  return r;
}

TYPED_TEST(StateLayers, JobCreateGetPutList) {
  JobStore jobs(this->kv());
  auto first = jobs.Create(FullRecord());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->id, 1u);
  JobRecord second_in;
  second_in.kind = "ingest";
  auto second = jobs.Create(second_in);
  EXPECT_EQ(second->id, 2u);
  JobRecord expected = FullRecord();
  expected.id = 1;
  EXPECT_EQ(*jobs.Get(1), expected);
  EXPECT_EQ(jobs.Get(3).status().code(), StatusCode::kNotFound);

  JobRecord updated = *second;
  updated.status = JobStatus::kCompleted;
  updated.stage = JobStage::kCompleted;
  updated.counters.records_written = 42;
  WriteBatch b;
  ASSERT_TRUE(jobs.Put(&b, updated).ok());
  this->Commit(b);
  EXPECT_EQ(*jobs.Get(2), updated);

  auto list = jobs.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].id, 2u);
  EXPECT_EQ((*list)[1].id, 1u);

  JobRecord no_id;
  WriteBatch bad;
  EXPECT_EQ(jobs.Put(&bad, no_id).code(), StatusCode::kInvalid);
  EXPECT_TRUE(bad.empty());
}

TYPED_TEST(StateLayers, JobIdsAreUniqueAcrossThreads) {
  JobStore jobs(this->kv());
  std::vector<std::thread> threads;
  std::vector<std::vector<uint64_t>> ids(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) ids[t].push_back(jobs.Create(JobRecord())->id);
    });
  }
  for (auto& th : threads) th.join();
  std::vector<uint64_t> all;
  for (auto& v : ids) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), 40u);
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], i + 1);
}

TYPED_TEST(StateLayers, JobAuditTrailIsWindowed) {
  JobStoreOptions options;
  options.max_audit_batches = 3;
  JobStore jobs(this->kv(), options);
  auto job = *jobs.Create(JobRecord());
  WriteBatch b;
  for (uint64_t n = 0; n < 6; ++n) {
    BatchAudit a{n, "pos" + std::to_string(n),   "pos" + std::to_string(n + 1), 5000, n, 1234,
                 1, static_cast<int64_t>(n * 10)};
    ASSERT_TRUE(jobs.PutBatchAudit(&b, job.id, a).ok());
  }
  this->Commit(b);
  auto all = jobs.ListBatchAudit(job.id, 0, 100);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0], (BatchAudit{3, "pos3", "pos4", 5000, 3, 1234, 1, 30}));
  EXPECT_EQ((*all)[2].batch_no, 5u);
  auto from4 = jobs.ListBatchAudit(job.id, 4, 1);
  ASSERT_EQ(from4->size(), 1u);
  EXPECT_EQ((*from4)[0].batch_no, 4u);
  EXPECT_TRUE(jobs.ListBatchAudit(job.id + 1, 0, 100)->empty());
  // The audit trail does not show up as jobs.
  EXPECT_EQ(jobs.List()->size(), 1u);
  WriteBatch bad;
  EXPECT_FALSE(jobs.PutBatchAudit(&bad, 0, BatchAudit{}).ok());
  JobStore misconfigured(this->kv(), JobStoreOptions{0});
  EXPECT_EQ(misconfigured.PutBatchAudit(&bad, job.id, BatchAudit{}).code(), StatusCode::kInvalid);
  EXPECT_TRUE(bad.empty());
}

TYPED_TEST(StateLayers, CorruptJobBytesAreAnErrorNotACrash) {
  JobStore jobs(this->kv());
  auto job = *jobs.Create(FullRecord());
  const std::string good = EncodeJobRecord(*jobs.Get(job.id));
  std::string key = "j";
  for (int s = 56; s >= 0; s -= 8) key.push_back(static_cast<char>(job.id >> s));
  for (const std::string& garbage :
       {std::string(), std::string("\x02", 1), std::string("\x01\x00", 2),
        std::string("\x01\x05\x7f", 3), std::string("{\"id\":1}"), good.substr(0, good.size() - 3),
        std::string("\x01\x03\x01\x63", 4) /* status 99 */}) {
    WriteBatch b;
    b.Put(Family::kJobs, key, garbage);
    this->Commit(b);
    auto got = jobs.Get(job.id);
    EXPECT_EQ(got.status().code(), StatusCode::kCorrupt) << ::testing::PrintToString(garbage);
    EXPECT_NE(got.status().message().find("job " + std::to_string(job.id)), std::string::npos);
    EXPECT_FALSE(jobs.List().ok());
  }
  // A record stored under another id.
  JobRecord other = FullRecord();
  other.id = 99;
  WriteBatch b;
  b.Put(Family::kJobs, key, EncodeJobRecord(other));
  this->Commit(b);
  EXPECT_EQ(jobs.Get(job.id).status().code(), StatusCode::kCorrupt);
}

// ---- Work queue

TYPED_TEST(StateLayers, WorkQueueOrderCountsAndRemoval) {
  WorkQueue queue(this->kv());
  WriteBatch b;
  std::vector<uint64_t> positions;
  for (const char* id : {"did:plc:c|post", "did:plc:a|post", "did:plc:b|like"}) {
    auto pos = queue.Push(&b, 1, id, std::string("payload of ") + id);
    ASSERT_TRUE(pos.ok());
    positions.push_back(pos->value());
  }
  ASSERT_TRUE(queue.Push(&b, 2, "other job", "").ok());
  EXPECT_EQ(*queue.Count(1), 0u);  // nothing before the commit
  this->Commit(b);
  EXPECT_EQ(positions, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(*queue.Count(1), 3u);
  EXPECT_EQ(*queue.Count(2), 1u);
  auto pending = *queue.Pending(1, 0, 10);
  ASSERT_EQ(pending.size(), 3u);
  EXPECT_EQ(pending[0], (WorkUnit{1, "did:plc:c|post", "payload of did:plc:c|post"}));
  EXPECT_EQ(pending[2].id, "did:plc:b|like");
  EXPECT_EQ(queue.Pending(1, 1, 10)->size(), 2u);
  EXPECT_EQ((*queue.Pending(1, 1, 1))[0].position, 2u);
  EXPECT_TRUE(queue.Pending(1, 3, 10)->empty());

  // A queued id is refused.
  WriteBatch dup;
  auto again = queue.Push(&dup, 1, "did:plc:a|post", "x");
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
  EXPECT_TRUE(dup.empty());
  EXPECT_EQ(queue.Push(&dup, 1, "", "x").status().code(), StatusCode::kInvalid);

  auto found = *queue.Find(1, "did:plc:a|post");
  ASSERT_TRUE(found.has_value());
  WriteBatch rm;
  queue.Remove(&rm, 1, *found);
  this->Commit(rm);
  EXPECT_EQ(*queue.Count(1), 2u);
  EXPECT_FALSE(queue.Find(1, "did:plc:a|post")->has_value());
  // Removed ids may come back, at a new position.
  WriteBatch back;
  EXPECT_EQ(**queue.Push(&back, 1, "did:plc:a|post", "again"), 4u);
  this->Commit(back);
  EXPECT_EQ(*queue.Count(1), 3u);
  std::vector<std::string> order;
  ASSERT_TRUE(
      queue.Scan(1, 0, [&](const WorkUnit& u) { return order.push_back(u.id), true; }).ok());
  EXPECT_EQ(order,
            (std::vector<std::string>{"did:plc:c|post", "did:plc:b|like", "did:plc:a|post"}));
}

TYPED_TEST(StateLayers, WorkQueueFinishedUnitsAreRememberedPerJob) {
  WorkQueue queue(this->kv());
  WriteBatch b;
  auto pos = queue.Push(&b, 1, "did:plc:a", "");
  ASSERT_TRUE(pos.ok() && pos->has_value());
  this->Commit(b);
  EXPECT_FALSE(*queue.IsFinished(1, "did:plc:a"));
  EXPECT_EQ(*queue.LastPosition(1), **pos);
  EXPECT_EQ(*queue.LastPosition(7), 0u);
  auto unit = *queue.Find(1, "did:plc:a");
  ASSERT_TRUE(unit.has_value());
  WriteBatch done;
  queue.Finish(&done, 1, *unit);
  EXPECT_FALSE(*queue.IsFinished(1, "did:plc:a"));  // not before the commit
  this->Commit(done);
  EXPECT_TRUE(*queue.IsFinished(1, "did:plc:a"));
  EXPECT_FALSE(*queue.IsFinished(2, "did:plc:a"));
  EXPECT_EQ(*queue.Count(1), 0u);
  EXPECT_FALSE(queue.Find(1, "did:plc:a")->has_value());
  ASSERT_TRUE(queue.Clear(1).ok());
  EXPECT_FALSE(*queue.IsFinished(1, "did:plc:a"));
}

TYPED_TEST(StateLayers, WorkQueueCountsStayExactAcrossBatchOrderAndDrops) {
  WorkQueue queue(this->kv());
  WriteBatch a, b, dropped;
  ASSERT_TRUE(queue.Push(&a, 1, "u1", "").ok());
  ASSERT_TRUE(queue.Push(&b, 1, "u2", "").ok());
  ASSERT_TRUE(queue.Push(&dropped, 1, "u3", "").ok());
  ASSERT_TRUE(queue.Push(&b, 1, "u4", "").ok());
  // Committed out of order; one batch never committed (its position stays unused).
  this->Commit(b);
  this->Commit(a);
  EXPECT_EQ(*queue.Count(1), 3u);
  auto units = *queue.Pending(1, 0, 10);
  ASSERT_EQ(units.size(), 3u);
  EXPECT_EQ(units[0].id, "u1");
  EXPECT_EQ(units[1].id, "u2");
  EXPECT_EQ(units[2].id, "u4");
  WriteBatch rm1, rm2;
  queue.Remove(&rm1, 1, units[0]);
  queue.Remove(&rm2, 1, units[2]);
  this->Commit(rm2);
  this->Commit(rm1);
  EXPECT_EQ(*queue.Count(1), 1u);
  EXPECT_EQ(*queue.Recount(1), 1u);
  EXPECT_EQ(*queue.Count(1), 1u);
}

TYPED_TEST(StateLayers, WorkQueuePositionsContinueInANewInstance) {
  {
    WorkQueue queue(this->kv());
    WriteBatch b;
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(queue.Push(&b, 9, "u" + std::to_string(i), "").ok());
    this->Commit(b);
  }
  WorkQueue fresh(this->kv());
  WriteBatch b;
  EXPECT_EQ(**fresh.Push(&b, 9, "next", ""), 6u);
  EXPECT_EQ(**fresh.Push(&b, 10, "first of job 10", ""), 1u);
  this->Commit(b);
  ASSERT_TRUE(fresh.Clear(9).ok());
  EXPECT_EQ(*fresh.Count(9), 0u);
  EXPECT_TRUE(fresh.Pending(9, 0, 10)->empty());
  EXPECT_EQ(*fresh.Count(10), 1u);
}

TYPED_TEST(StateLayers, WorkQueueRecountRepairsTheCounter) {
  WorkQueue queue(this->kv());
  WriteBatch b;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(queue.Push(&b, 1, "u" + std::to_string(i), "").ok());
  this->Commit(b);
  WriteBatch skew;  // a counter knocked off by a contract breach (a double removal)
  skew.Add(Family::kQueue, std::string("n\0\0\0\0\0\0\0\x01", 9), -2);
  this->Commit(skew);
  EXPECT_EQ(*queue.Count(1), 2u);
  EXPECT_EQ(*queue.Recount(1), 4u);
  EXPECT_EQ(*queue.Count(1), 4u);
}

// ---- Failed blocks and resolver cache

TYPED_TEST(StateLayers, FailedBlocksPutGetScanRemove) {
  FailedBlocks blocks(this->kv());
  WriteBatch b;
  ASSERT_TRUE(blocks.Put(&b, 1, {"seg2/7", "zstd: corrupt frame", 2, 100}).ok());
  ASSERT_TRUE(blocks.Put(&b, 1, {"seg1/0", "timeout", 1, 50}).ok());
  ASSERT_TRUE(blocks.Put(&b, 2, {"seg1/0", "other job", 1, 50}).ok());
  EXPECT_EQ(blocks.Put(&b, 1, {"", "no id", 1, 1}).code(), StatusCode::kInvalid);
  this->Commit(b);
  EXPECT_EQ(blocks.Get(1, "seg2/7")->value(),
            (FailedBlock{"seg2/7", "zstd: corrupt frame", 2, 100}));
  EXPECT_FALSE(blocks.Get(1, "seg9/9")->has_value());
  std::vector<std::string> ids;
  ASSERT_TRUE(
      blocks.Scan(1, [&](const FailedBlock& f) { return ids.push_back(f.block_id), true; }).ok());
  EXPECT_EQ(ids, (std::vector<std::string>{"seg1/0", "seg2/7"}));
  EXPECT_EQ(*blocks.Count(1), 2u);
  WriteBatch rm;
  blocks.Remove(&rm, 1, "seg1/0");
  this->Commit(rm);
  EXPECT_EQ(*blocks.Count(1), 1u);
  EXPECT_EQ(*blocks.Count(2), 1u);
}

TYPED_TEST(StateLayers, ResolverCacheExpires) {
  ResolverCache cache(this->kv());
  const ResolvedDid entry{"https://pds.example.com", "alice.example.com", "zQ3sh...", 1000, 5000};
  ASSERT_TRUE(cache.Store("did:plc:alice", entry).ok());
  WriteBatch b;
  cache.Put(&b, "did:web:bob.example.com", {"https://bob.example.com", "", "", 1000, 2000});
  this->Commit(b);
  EXPECT_EQ(cache.Get("did:plc:alice", 4999)->value(), entry);
  EXPECT_FALSE(cache.Get("did:plc:alice", 5000)->has_value());
  EXPECT_FALSE(cache.Get("did:plc:nobody", 0)->has_value());
  EXPECT_EQ(*cache.SweepExpired(3000), 1u);
  EXPECT_TRUE(cache.Get("did:plc:alice", 3000)->has_value());
  EXPECT_FALSE(cache.Get("did:web:bob.example.com", 0)->has_value());
  WriteBatch rm;
  cache.Remove(&rm, "did:plc:alice");
  this->Commit(rm);
  EXPECT_FALSE(cache.Get("did:plc:alice", 0)->has_value());
  // Garbage in the family is reported, not crashed on.
  WriteBatch junk;
  junk.Put(Family::kResolver, "did:plc:junk", "\x01\x05");
  this->Commit(junk);
  EXPECT_EQ(cache.Get("did:plc:junk", 0).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(cache.SweepExpired(0).status().code(), StatusCode::kCorrupt);
}

// ---- Encodings (backend-independent)

TEST(JobEncoding, EnumNamesRoundTrip) {
  for (int i = 0; i <= static_cast<int>(JobStatus::kFailed); ++i) {
    const auto s = static_cast<JobStatus>(i);
    EXPECT_EQ(*ParseJobStatus(JobStatusName(s)), s);
  }
  for (int i = 0; i <= static_cast<int>(JobStage::kCancelled); ++i) {
    const auto s = static_cast<JobStage>(i);
    EXPECT_EQ(*ParseJobStage(JobStageName(s)), s);
  }
  EXPECT_EQ(JobStatusName(JobStatus::kCancelling), "cancelling");
  EXPECT_EQ(JobStageName(JobStage::kResolvingAndFetching), "resolving_and_fetching");
  EXPECT_EQ(JobStageName(JobStage::kReplayingAccounts), "replaying_accounts");
  auto bad = ParseJobStatus("Running");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalid);
  EXPECT_NE(bad.status().message().find("pausing"), std::string::npos);
  EXPECT_FALSE(ParseJobStage("").ok());
  EXPECT_EQ(JobStatusName(static_cast<JobStatus>(50)), "?");
  EXPECT_TRUE(IsTerminal(JobStatus::kCompleted));
  EXPECT_TRUE(IsTerminal(JobStatus::kCancelled));
  EXPECT_TRUE(IsTerminal(JobStatus::kFailed));
  EXPECT_FALSE(IsTerminal(JobStatus::kPaused));
  EXPECT_FALSE(IsTerminal(JobStatus::kCancelling));
}

TEST(JobEncoding, RoundTripAndEveryTruncationIsSafe) {
  JobRecord r = FullRecord();
  r.id = 77;
  const std::string bytes = EncodeJobRecord(r);
  EXPECT_EQ(bytes[0], '\x01');
  EXPECT_EQ(*DecodeJobRecord(bytes), r);
  int errors = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto d = DecodeJobRecord(bytes.substr(0, n));
    if (!d.ok()) {
      ++errors;
      EXPECT_EQ(d.status().code(), StatusCode::kCorrupt);
    } else {
      EXPECT_NE(*d, r) << n;  // a prefix cut at a field boundary decodes, but loses fields
    }
  }
  EXPECT_GT(errors, static_cast<int>(bytes.size() / 2));
}

TEST(JobEncoding, RandomBytesNeverCrash) {
  std::mt19937 rng(12345);
  JobRecord r = FullRecord();
  r.id = 1;
  const std::string good = EncodeJobRecord(r);
  int decoded = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f)
      bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
    auto d = DecodeJobRecord(bytes);
    if (d.ok()) {
      ++decoded;
    } else {
      EXPECT_EQ(d.status().code(), StatusCode::kCorrupt);
    }
    std::string noise(rng() % 64, '\0');
    for (auto& c : noise) c = static_cast<char>(rng());
    if (!noise.empty()) noise[0] = '\x01';
    auto n = DecodeJobRecord(noise);
    if (!n.ok()) {
      EXPECT_EQ(n.status().code(), StatusCode::kCorrupt);
    }
    auto a = DecodeBatchAudit(noise);
    if (!a.ok()) {
      EXPECT_EQ(a.status().code(), StatusCode::kCorrupt);
    }
  }
  EXPECT_LT(decoded, 3000);
}

TEST(JobEncoding, UnknownFieldsAreSkippedAndVersionsChecked) {
  JobRecord r;
  r.id = 5;
  r.kind = "replay";
  std::string bytes = EncodeJobRecord(r);
  // A field from a future build: tag 200, 3 bytes.
  bytes += std::string("\xc8\x01\x03xyz", 6);
  auto d = DecodeJobRecord(bytes);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, r);
  bytes[0] = '\x02';
  auto v2 = DecodeJobRecord(bytes);
  EXPECT_EQ(v2.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(v2.status().message().find("version 2"), std::string::npos);
  auto missing = DecodeJobRecord(std::string("\x01", 1));
  EXPECT_NE(missing.status().message().find("missing id"), std::string::npos);
  const std::string audit = EncodeBatchAudit(BatchAudit{3, "a", "b", 1, 0, 7, 2, 9});
  EXPECT_EQ(*DecodeBatchAudit(audit), (BatchAudit{3, "a", "b", 1, 0, 7, 2, 9}));
  EXPECT_FALSE(DecodeBatchAudit(audit.substr(0, audit.size() - 1)).ok());
}

}  // namespace
}  // namespace atfill::state
