// HttpArchive (the archive XRPC client) against simnet's archive host over loopback: listings,
// plans and blocks equal a LocalArchive over the same directory; paging; retries of 5xx, 503
// and unanswered requests; 429 waited out; corrupt frames delivered; keys refused and never sent
// off the archive's origin; "no archive" told apart; the advertised byte quota held, also across
// two archives sharing a key.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "pipeline/event.hpp"
#include "sources/archive/archive.hpp"
#include "sources/archive/archive_http.hpp"
#include "sources/archive/jss.hpp"
#include "tests/common/process.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill::sources {
namespace {

using Clock = std::chrono::steady_clock;
using simnet::ArchiveFault;
using simnet::ArchiveFaults;

int64_t MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// One decoded row, comparable.
using RowKey = std::tuple<uint64_t, int, std::string, std::string, std::string, size_t>;

bool Matches(const jss::Row& row, const PlanRequest& r) {
  if (row.seq <= r.after_seq || (r.before_seq != 0 && row.seq > r.before_seq)) return false;
  if (!r.dids.empty() && std::find(r.dids.begin(), r.dids.end(), row.did) == r.dids.end()) {
    return false;
  }
  const int k = static_cast<int>(row.kind);
  const bool commit = k <= 3 || k == 7;
  return commit ? r.commits && pipeline::CollectionMatches(row.collection, r.collections)
                : r.markers;
}

// Every row of `plan`'s blocks that matches `request` exactly, read through `archive`.
std::vector<RowKey> Rows(Archive& archive, const Plan& plan, const PlanRequest& request) {
  std::vector<RowKey> out;
  for (const PlannedSegment& s : plan.segments) {
    for (const PlannedBlock& b : s.blocks) {
      auto frame = archive.GetBlock(s.segment, b.index);
      EXPECT_TRUE(frame.ok()) << frame.status().ToString();
      if (!frame.ok()) continue;
      auto body = jss::DecompressFrame(AsBytes(*frame), b.uncompressed_size, 1u << 30);
      EXPECT_TRUE(body.ok()) << s.segment.name << "/" << b.index << ": "
                             << body.status().ToString();
      if (!body.ok()) continue;
      auto block = jss::Block::Parse(std::move(*body));
      EXPECT_TRUE(block.ok()) << block.status().ToString();
      if (!block.ok()) continue;
      for (size_t i = 0; i < block->size(); ++i) {
        const jss::Row row = block->row(i);
        EXPECT_GE(row.seq, b.min_seq);
        EXPECT_LE(row.seq, b.max_seq);
        if (!Matches(row, request)) continue;
        out.emplace_back(row.seq, static_cast<int>(row.kind), std::string(row.did),
                         std::string(row.collection), std::string(row.rkey), row.payload.size());
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Every page of a plan (the replay source's loop, SPEC §3.6 step 3) merged into one.
Result<Plan> AllPages(Archive& archive, PlanRequest request, int* pages) {
  Plan all;
  *pages = 0;
  while (true) {
    ATFILL_ASSIGN_OR_RETURN(Plan page, archive.PlanSnapshot(request));
    ++*pages;
    if (*pages == 1) {
      all.sealed_tip = page.sealed_tip;
      if (request.before_seq == 0) request.before_seq = page.sealed_tip;
    }
    for (PlannedSegment& s : page.segments) all.segments.push_back(std::move(s));
    all.planned_through = page.planned_through;
    if (page.planned_through >= all.sealed_tip) return all;
    if (page.planned_through <= request.after_seq) {
      return Status::Internal("the plan did not advance past " + std::to_string(request.after_seq));
    }
    request.after_seq = page.planned_through;
    if (*pages > 10'000) return Status::Internal("endless plan");
  }
}

std::string BlockName(const PlannedSegment& s, const PlannedBlock& b) {
  return s.segment.name + "/" + std::to_string(b.index);
}

class ArchiveHttpTest : public ::testing::Test {
 protected:
  // The archive every test serves: simnet's Jetstream log written as segments, small blocks.
  static void SetUpTestSuite() {
    temp_ = new testing::TempDir();
    simnet::SimnetOptions o;
    o.seed = 5;
    o.accounts = 40;
    o.pds_hosts = 2;
    o.jetstream.events = 12'000;
    o.jetstream.sync_share = 0.01;
    o.archive.dir = (*temp_ / "archive").string();
    o.archive.from_jetstream = true;
    o.archive.rows_per_block = 100;
    o.archive.segment_bytes = 150'000;
    auto net = simnet::Simnet::Start(o);
    ASSERT_TRUE(net.ok()) << net.status().ToString();
    (*net)->Stop();
  }
  static void TearDownTestSuite() {
    delete temp_;
    temp_ = nullptr;
  }
  static std::string Dir() { return (*temp_ / "archive").string(); }

  void SetUp() override {
    auto local = LocalArchive::Open(Dir());
    ASSERT_TRUE(local.ok()) << local.status().ToString();
    local_ = std::move(*local);
    auto segments = local_->ListSegments();
    ASSERT_TRUE(segments.ok());
    segments_ = *segments;
    ASSERT_GE(segments_.size(), 4u) << "the test archive should span several segments";
  }

  void Serve(simnet::ArchiveOptions a = {}) {
    simnet::SimnetOptions o;
    o.accounts = 3;
    o.pds_hosts = 1;
    a.dir = Dir();
    o.archive = a;
    auto net = simnet::Simnet::Start(o);
    ASSERT_TRUE(net.ok()) << net.status().ToString();
    net_ = std::move(*net);
  }

  HttpArchiveOptions Options() const {
    HttpArchiveOptions o;
    o.base_url = net_->archive_url();
    o.allow_private_addresses = true;
    o.connect_timeout_ms = 2'000;
    o.request_timeout_ms = 10'000;
    o.retry_delays_ms = {20, 20, 20, 20, 20, 20};
    o.throttle_default_wait_ms = 200;
    o.max_retry_after_ms = 5'000;
    return o;
  }

  std::unique_ptr<HttpArchive> Open(const HttpArchiveOptions& o) {
    auto a = HttpArchive::Open(o);
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    return a.ok() ? std::move(*a) : nullptr;
  }

  std::string LocalFrame(const SegmentInfo& s, uint32_t block) {
    auto f = local_->GetBlock(s, block);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    return f.ok() ? *f : std::string();
  }

  void SetFaults(ArchiveFaults f) { net_->SetArchiveFaults(std::move(f)); }

  static testing::TempDir* temp_;
  std::unique_ptr<LocalArchive> local_;
  std::vector<SegmentInfo> segments_;
  std::unique_ptr<simnet::Simnet> net_;
};

testing::TempDir* ArchiveHttpTest::temp_ = nullptr;

TEST_F(ArchiveHttpTest, ListPlanAndEveryBlockEqualTheLocalArchive) {
  Serve();
  auto http = Open(Options());
  ASSERT_NE(http, nullptr);
  EXPECT_EQ(http->Describe(), "archive " + net_->archive_url());

  auto listed = http->ListSegments();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), segments_.size());
  for (size_t i = 0; i < segments_.size(); ++i) {
    const SegmentInfo& a = (*listed)[i];
    const SegmentInfo& b = segments_[i];
    EXPECT_EQ(std::tie(a.name, a.index, a.min_seq, a.max_seq, a.min_witnessed_at,
                       a.max_witnessed_at, a.event_count, a.size_bytes, a.checksum),
              std::tie(b.name, b.index, b.min_seq, b.max_seq, b.min_witnessed_at,
                       b.max_witnessed_at, b.event_count, b.size_bytes, b.checksum))
        << b.name;
  }

  const PlanRequest everything;
  auto plan = http->PlanSnapshot(everything);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto want = local_->PlanSnapshot(everything);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(plan->sealed_tip, want->sealed_tip);
  EXPECT_EQ(plan->planned_through, want->planned_through);
  EXPECT_EQ(plan->sealed_tip, segments_.back().max_seq);
  ASSERT_EQ(plan->segments.size(), want->segments.size());
  size_t blocks = 0;
  for (size_t i = 0; i < want->segments.size(); ++i) {
    const PlannedSegment& got = plan->segments[i];
    const PlannedSegment& exp = want->segments[i];
    EXPECT_EQ(got.segment.name, exp.segment.name);
    EXPECT_EQ(got.segment.checksum, exp.segment.checksum);
    EXPECT_EQ(got.segment.size_bytes, exp.segment.size_bytes);
    EXPECT_EQ(got.segment.event_count, exp.segment.event_count);
    ASSERT_EQ(got.blocks.size(), exp.blocks.size()) << exp.segment.name;
    for (size_t j = 0; j < exp.blocks.size(); ++j) {
      const PlannedBlock& g = got.blocks[j];
      const PlannedBlock& e = exp.blocks[j];
      EXPECT_EQ(std::tie(g.index, g.min_seq, g.max_seq, g.uncompressed_size),
                std::tie(e.index, e.min_seq, e.max_seq, e.uncompressed_size))
          << BlockName(exp, e);
      auto frame = http->GetBlock(got.segment, g.index);
      ASSERT_TRUE(frame.ok()) << frame.status().ToString();
      EXPECT_EQ(*frame, LocalFrame(exp.segment, e.index)) << BlockName(exp, e);
      ++blocks;
    }
  }
  EXPECT_GT(blocks, 100u);
  // The same events after decoding, every row of the log.
  const std::vector<RowKey> rows = Rows(*http, *plan, everything);
  EXPECT_EQ(rows, Rows(*local_, *want, everything));
  EXPECT_EQ(rows.size(), plan->sealed_tip);

  // Block indexes are cached: planning again reads no segment.
  const uint64_t segment_reads = net_->archive_stats().get_segments;
  ASSERT_TRUE(http->PlanSnapshot(everything).ok());
  EXPECT_EQ(net_->archive_stats().get_segments, segment_reads);
  EXPECT_EQ(http->stats().index_fetches, segments_.size());
  EXPECT_EQ(net_->archive_stats().authorization_elsewhere, 0u);
}

// With a spool directory, segments planned whole are downloaded in ranges and read from there:
// every frame equals the local archive's, no block is fetched alone, and a .part file a killed
// run left (here: the first half of the first segment) is resumed, not downloaded again.
TEST_F(ArchiveHttpTest, WholeSegmentsAreSpooledAndAPartFileIsResumed) {
  Serve();
  testing::TempDir spool;
  HttpArchiveOptions o = Options();
  o.spool_dir = spool.path().string();
  o.spool_chunk_bytes = 10'000;
  const SegmentInfo& first = segments_.front();
  std::string head;
  {
    std::ifstream in(std::filesystem::path(Dir()) / first.name, std::ios::binary);
    head.assign(first.size_bytes / 2, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    ASSERT_TRUE(in.good());
  }
  testing::WriteFile(spool.path() / (first.name + "." + first.checksum + ".part"), head);
  auto http = Open(o);
  ASSERT_NE(http, nullptr);
  const PlanRequest everything;
  auto plan = http->PlanSnapshot(everything);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const uint64_t bytes_before = net_->archive_stats().bytes;
  size_t blocks = 0;
  for (const PlannedSegment& s : plan->segments) {
    for (const PlannedBlock& b : s.blocks) {
      auto frame = http->GetBlock(s.segment, b.index);
      ASSERT_TRUE(frame.ok()) << frame.status().ToString();
      EXPECT_EQ(*frame, LocalFrame(s.segment, b.index)) << BlockName(s, b);
      ++blocks;
    }
  }
  EXPECT_EQ(net_->archive_stats().get_blocks, 0u);
  EXPECT_EQ(http->stats().spooled_blocks, blocks);
  EXPECT_EQ(http->stats().spooled_segments, segments_.size());
  EXPECT_EQ(http->stats().spool_failures, 0u);
  // Every segment's blocks were served once, but for the half the .part file held.
  uint64_t total = 0;
  for (const SegmentInfo& seg : segments_) {
    auto reader = jss::SegmentReader::Open((std::filesystem::path(Dir()) / seg.name).string());
    ASSERT_TRUE(reader.ok());
    uint64_t end = 0;
    for (const jss::BlockInfo& b : reader->footer().blocks) {
      end = std::max<uint64_t>(end, b.offset + 8 + b.compressed_size);
    }
    total += seg.name == first.name ? end - std::min<uint64_t>(end, head.size()) : end;
  }
  EXPECT_EQ(net_->archive_stats().bytes - bytes_before, total);
  // Only the segment being read is on disk; none once the archive closes.
  http.reset();
  EXPECT_TRUE(std::filesystem::is_empty(spool.path()));
}

TEST_F(ArchiveHttpTest, FilteredPlansSelectTheSameRows) {
  Serve();
  auto http = Open(Options());
  ASSERT_NE(http, nullptr);
  // A DID that wrote rows, and a window inside the log.
  auto first = local_->PlanSnapshot({});
  ASSERT_TRUE(first.ok());
  const std::vector<RowKey> all = Rows(*local_, *first, {});
  ASSERT_FALSE(all.empty());
  const std::string did = std::get<2>(all[all.size() / 2]);

  std::vector<PlanRequest> requests(5);
  requests[0].collections = {"app.bsky.feed.like"};
  requests[0].markers = false;
  requests[1].dids = {did};
  requests[2].commits = false;
  requests[3].after_seq = 3'000;
  requests[3].before_seq = 7'500;
  requests[3].collections = {"app.bsky.feed.*"};
  requests[4].dids = {did, "did:plc:nobodynobodynobody"};
  requests[4].commits = false;
  for (size_t i = 0; i < requests.size(); ++i) {
    const PlanRequest& r = requests[i];
    auto got = http->PlanSnapshot(r);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().ToString();
    auto want = local_->PlanSnapshot(r);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(got->sealed_tip, want->sealed_tip) << i;
    const std::vector<RowKey> rows = Rows(*http, *got, r);
    EXPECT_EQ(rows, Rows(*local_, *want, r)) << "request " << i;
    EXPECT_FALSE(rows.empty()) << "request " << i;
    // Filters narrow the plan: a DID's blocks are a few of the whole log's.
    size_t blocks = 0;
    for (const PlannedSegment& s : got->segments) blocks += s.blocks.size();
    if (i == 1) {
      EXPECT_LT(blocks, 100u);
    }
  }
}

TEST_F(ArchiveHttpTest, ListingAndPlansArePaged) {
  simnet::ArchiveOptions a;
  a.max_list_page = 2;
  a.max_plan_entries = 2;
  Serve(a);
  auto http = Open(Options());
  ASSERT_NE(http, nullptr);
  auto listed = http->ListSegments();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), segments_.size());
  for (size_t i = 0; i < segments_.size(); ++i) EXPECT_EQ((*listed)[i].name, segments_[i].name);
  EXPECT_EQ(net_->archive_stats().list_segments, (segments_.size() + 1) / 2);

  auto first = local_->PlanSnapshot({});
  ASSERT_TRUE(first.ok());
  const std::vector<RowKey> all = Rows(*local_, *first, {});
  PlanRequest by_did;
  by_did.dids = {std::get<2>(all[all.size() / 3])};
  for (const PlanRequest& r : {PlanRequest{}, by_did}) {
    int pages = 0;
    auto got = AllPages(*http, r, &pages);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    auto want = local_->PlanSnapshot(r);
    ASSERT_TRUE(want.ok());
    EXPECT_GT(pages, 1);
    EXPECT_EQ(got->planned_through, want->sealed_tip);
    EXPECT_EQ(Rows(*http, *got, r), Rows(*local_, *want, r));
    // No block is planned twice across pages.
    std::set<std::string> seen;
    for (const PlannedSegment& s : got->segments) {
      for (const PlannedBlock& b : s.blocks) {
        EXPECT_TRUE(seen.insert(BlockName(s, b)).second) << BlockName(s, b);
      }
    }
  }
}

TEST_F(ArchiveHttpTest, ServerErrorsAndLostAnswersAreRetried) {
  Serve();
  ArchiveFaults f;
  const SegmentInfo& s = segments_[1];
  const auto block = [&](uint32_t b) { return s.name + "/" + std::to_string(b); };
  f.faults[block(0)] = {ArchiveFault::Kind::kStatus, 500, -1, false, 2};
  f.faults[block(1)] = {ArchiveFault::Kind::kStatus, 502, -1, false, 3};
  f.faults[block(2)] = {ArchiveFault::Kind::kStatus, 504, -1, false, 6};
  f.faults[block(3)] = {ArchiveFault::Kind::kDrop, 0, -1, false, 2};
  f.faults[block(4)] = {ArchiveFault::Kind::kTruncate, 0, -1, false, 1};
  f.faults["planSnapshot"] = {ArchiveFault::Kind::kStatus, 500, -1, false, 1};
  f.faults["listSegments"] = {ArchiveFault::Kind::kDrop, 0, -1, false, 1};
  SetFaults(f);
  auto http = Open(Options());
  ASSERT_NE(http, nullptr);
  for (uint32_t b = 0; b < 5; ++b) {
    auto frame = http->GetBlock(s, b);
    ASSERT_TRUE(frame.ok()) << block(b) << ": " << frame.status().ToString();
    EXPECT_EQ(*frame, LocalFrame(s, b)) << block(b);
    // (libcurl itself retries a request once when a reused connection closes unanswered, so
    // lost answers are not counted exactly.)
    if (b == 2) {
      EXPECT_EQ(http->stats().retries, 2u + 3u + 6u);
    }
  }
  EXPECT_TRUE(http->ListSegments().ok());
  EXPECT_TRUE(http->PlanSnapshot({}).ok());
  EXPECT_EQ(net_->archive_stats().faults, 14u + 2u);

  // A seventh failure in a row is one too many.
  f.faults[block(5)] = {ArchiveFault::Kind::kStatus, 500, -1, false, 7};
  SetFaults(f);
  const auto start = Clock::now();
  auto failed = http->GetBlock(s, 5);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(failed.status().message().find("getBlock?segment=" + s.name), std::string::npos)
      << failed.status().message();
  EXPECT_NE(failed.status().message().find("HTTP 500"), std::string::npos);
  EXPECT_LT(MsSince(start), 15'000);  // loose: shared CI machines stall
}

TEST_F(ArchiveHttpTest, RetriesSpreadOverTheirSchedule) {
  Serve();
  ArchiveFaults f;
  f.faults["getBlock"] = {ArchiveFault::Kind::kStatus, 500, -1, false, 0};
  SetFaults(f);
  HttpArchiveOptions o = Options();
  o.retry_delays_ms = {100, 200, 300};
  auto http = Open(o);
  ASSERT_NE(http, nullptr);
  const auto start = Clock::now();
  auto failed = http->GetBlock(segments_[0], 0);
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
  EXPECT_GE(MsSince(start), 600);
  EXPECT_EQ(net_->archive_stats().get_blocks, 4u);
}

TEST_F(ArchiveHttpTest, ServiceUnavailableWaitsOutRetryAfter) {
  Serve();
  const SegmentInfo& s = segments_[0];
  ArchiveFaults f;
  f.faults[s.name + "/1"] = {ArchiveFault::Kind::kStatus, 503, 1, false, 1};
  f.faults[s.name + "/2"] = {ArchiveFault::Kind::kStatus, 503, 2, true, 1};  // an HTTP-date
  SetFaults(f);
  auto http = Open(Options());
  ASSERT_NE(http, nullptr);
  for (uint32_t b : {1u, 2u}) {
    const auto start = Clock::now();
    auto frame = http->GetBlock(s, b);
    ASSERT_TRUE(frame.ok()) << frame.status().ToString();
    EXPECT_EQ(*frame, LocalFrame(s, b));
    EXPECT_GE(MsSince(start), 900) << "block " << b;
    EXPECT_LT(MsSince(start), 10'000) << "block " << b;
  }
  // Five retries, then the 503 is the answer.
  f.faults[s.name + "/3"] = {ArchiveFault::Kind::kStatus, 503, 0, false, 0};
  SetFaults(f);
  auto failed = http->GetBlock(s, 3);
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(failed.status().message().find("503"), std::string::npos);
  EXPECT_EQ(net_->archive_stats().get_blocks, 2u + 2u + 6u);
}

// The Start forms hand the request over and return: the answer comes later, on the archive's
// thread, here after a 503's Retry-After that the client waits out on its loop.
TEST_F(ArchiveHttpTest, StartFormsReturnBeforeTheirAnswer) {
  Serve();
  const SegmentInfo& s = segments_[0];
  ArchiveFaults f;
  f.faults[s.name + "/1"] = {ArchiveFault::Kind::kStatus, 503, 1, false, 1};
  f.faults["planSnapshot"] = {ArchiveFault::Kind::kStatus, 503, 1, false, 1};
  SetFaults(f);
  auto http = Open(Options());
  ASSERT_NE(http, nullptr);
  std::promise<Result<std::string>> block;
  std::promise<Result<Plan>> plan;
  const auto start = Clock::now();
  http->StartGetBlock(s, 1, [&](Result<std::string> r) { block.set_value(std::move(r)); });
  http->StartPlanSnapshot({}, [&](Result<Plan> r) { plan.set_value(std::move(r)); });
  auto block_answer = block.get_future();
  auto plan_answer = plan.get_future();
  EXPECT_EQ(block_answer.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  EXPECT_EQ(plan_answer.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  ASSERT_EQ(block_answer.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  ASSERT_EQ(plan_answer.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_GE(MsSince(start), 900);
  Result<std::string> frame = block_answer.get();
  ASSERT_TRUE(frame.ok()) << frame.status().ToString();
  EXPECT_EQ(*frame, LocalFrame(s, 1));
  Result<Plan> planned = plan_answer.get();
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  EXPECT_EQ(planned->sealed_tip, segments_.back().max_seq);
  EXPECT_EQ(http->stats().retries, 2u);
}

// Cancel completes a pending call at once (without it, the 503s would hold it for minutes), and
// every later one.
TEST_F(ArchiveHttpTest, CancelEndsWaitingCalls) {
  Serve();
  const SegmentInfo& s = segments_[0];
  ArchiveFaults f;
  f.faults[s.name + "/0"] = {ArchiveFault::Kind::kStatus, 503, 60, false, 0};
  SetFaults(f);
  HttpArchiveOptions o = Options();
  o.max_retry_after_ms = 60'000;
  auto http = Open(o);
  ASSERT_NE(http, nullptr);
  std::promise<Result<std::string>> block;
  http->StartGetBlock(s, 0, [&](Result<std::string> r) { block.set_value(std::move(r)); });
  // Queued, in flight or waiting out the minute the 503 asks for: cancelled all the same.
  http->Cancel();
  auto answer = block.get_future();
  ASSERT_EQ(answer.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_EQ(answer.get().status().code(), StatusCode::kCancelled);
  EXPECT_EQ(http->GetBlock(s, 1).status().code(), StatusCode::kCancelled);
}

TEST_F(ArchiveHttpTest, ThrottlingIsWaitedOut) {
  Serve();
  const SegmentInfo& s = segments_[0];
  ArchiveFaults f;
  // More 429s than there are retries of anything else: throttling does not use them up.
  f.faults[s.name + "/0"] = {ArchiveFault::Kind::kStatus, 429, 0, false, 12};
  f.faults[s.name + "/1"] = {ArchiveFault::Kind::kStatus, 429, 1, false, 1};
  SetFaults(f);
  auto http = Open(Options());
  ASSERT_NE(http, nullptr);
  auto frame = http->GetBlock(s, 0);
  ASSERT_TRUE(frame.ok()) << frame.status().ToString();
  EXPECT_EQ(*frame, LocalFrame(s, 0));
  EXPECT_EQ(http->stats().throttled, 12u);
  const auto start = Clock::now();
  frame = http->GetBlock(s, 1);
  ASSERT_TRUE(frame.ok()) << frame.status().ToString();
  EXPECT_GE(MsSince(start), 900);
}

TEST_F(ArchiveHttpTest, ThrottledForTooLongIsAFailure) {
  Serve();
  ArchiveFaults f;
  f.faults["planSnapshot"] = {ArchiveFault::Kind::kStatus, 429, 1, false, 0};
  SetFaults(f);
  HttpArchiveOptions o = Options();
  o.max_throttled_ms = 1'500;
  auto http = Open(o);
  ASSERT_NE(http, nullptr);
  const auto start = Clock::now();
  auto plan = http->PlanSnapshot({});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("throttled"), std::string::npos);
  EXPECT_NE(plan.status().message().find("planSnapshot"), std::string::npos);
  EXPECT_GE(MsSince(start), 1'400);
  EXPECT_LT(MsSince(start), 15'000);
}

TEST_F(ArchiveHttpTest, CorruptFramesAreDelivered) {
  Serve();
  const SegmentInfo& s = segments_[2];
  ArchiveFaults f;
  f.faults[s.name + "/4"] = {ArchiveFault::Kind::kCorrupt, 0, -1, false, 0};
  SetFaults(f);
  auto http = Open(Options());
  ASSERT_NE(http, nullptr);
  auto frame = http->GetBlock(s, 4);
  ASSERT_TRUE(frame.ok()) << frame.status().ToString();
  const std::string good = LocalFrame(s, 4);
  EXPECT_EQ(frame->size(), good.size());
  EXPECT_NE(*frame, good);
  EXPECT_FALSE(jss::DecompressFrame(AsBytes(*frame), 0, 1u << 30).ok());
  EXPECT_TRUE(jss::DecompressFrame(AsBytes(good), 0, 1u << 30).ok());
  EXPECT_EQ(http->stats().retries, 0u);
}

TEST_F(ArchiveHttpTest, BadJsonIsAnErrorNotACrash) {
  Serve();
  ArchiveFaults f;
  f.faults["planSnapshot"] = {ArchiveFault::Kind::kCorrupt, 0, -1, false, 0};
  f.faults["listSegments"] = {ArchiveFault::Kind::kCorrupt, 0, -1, false, 0};
  SetFaults(f);
  auto http = Open(Options());
  ASSERT_NE(http, nullptr);
  auto plan = http->PlanSnapshot({});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalid);
  EXPECT_NE(plan.status().message().find("planSnapshot"), std::string::npos);
  auto listed = http->ListSegments();
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), StatusCode::kInvalid);
  EXPECT_NE(listed.status().message().find("not a JSON object"), std::string::npos)
      << listed.status().message();
}

TEST_F(ArchiveHttpTest, KeysAreRequiredRefusedAndKeptOnTheArchive) {
  Serve();
  const SegmentInfo& s = segments_[0];
  ArchiveFaults f;
  f.required_key = "sekrit-key";
  f.faults[s.name + "/2"] = {ArchiveFault::Kind::kRedirect, 0, -1, false, 0};
  SetFaults(f);

  auto keyless = Open(Options());
  ASSERT_NE(keyless, nullptr);
  auto plan = keyless->PlanSnapshot({});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalid);
  EXPECT_NE(plan.status().message().find("asks for a key"), std::string::npos)
      << plan.status().message();
  EXPECT_NE(plan.status().message().find("401"), std::string::npos);
  EXPECT_NE(plan.status().message().find(net_->archive_url()), std::string::npos);
  // The public listing needs no key.
  EXPECT_TRUE(keyless->ListSegments().ok());

  HttpArchiveOptions wrong = Options();
  wrong.key = "not-the-key";
  auto refused = Open(wrong);
  ASSERT_NE(refused, nullptr);
  auto frame = refused->GetBlock(s, 0);
  ASSERT_FALSE(frame.ok());
  EXPECT_EQ(frame.status().code(), StatusCode::kInvalid);
  EXPECT_NE(frame.status().message().find("refused the key"), std::string::npos)
      << frame.status().message();
  EXPECT_NE(frame.status().message().find("403"), std::string::npos);
  EXPECT_EQ(refused->stats().requests, 1u) << "401/403 are not retried";

  HttpArchiveOptions right = Options();
  right.key = "sekrit-key";
  auto http = Open(right);
  ASSERT_NE(http, nullptr);
  ASSERT_TRUE(http->ListSegments().ok());
  ASSERT_TRUE(http->PlanSnapshot({}).ok());
  for (uint32_t b = 0; b < 3; ++b) {
    auto got = http->GetBlock(s, b);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, LocalFrame(s, b));
  }
  const simnet::ArchiveStats stats = net_->archive_stats();
  EXPECT_EQ(stats.cdn_requests, 1u) << "block 2 comes from the CDN";
  EXPECT_EQ(stats.key_rejections, 2u);
  // Neither the CDN nor listSegments ever saw the key.
  EXPECT_EQ(stats.authorization_elsewhere, 0u);
}

TEST_F(ArchiveHttpTest, NoArchiveIsToldApart) {
  for (const int status : {404, 501}) {
    simnet::ArchiveOptions a;
    a.faults.no_archive_status = status;
    Serve(a);
    auto http = Open(Options());
    ASSERT_NE(http, nullptr);
    const StatusCode want = status == 404 ? StatusCode::kNotFound : StatusCode::kUnsupported;
    auto plan = http->PlanSnapshot({});
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), want) << plan.status().ToString();
    EXPECT_NE(plan.status().message().find(std::to_string(status)), std::string::npos);
    EXPECT_EQ(http->ListSegments().status().code(), want);
    EXPECT_EQ(http->stats().retries, 0u);
    net_.reset();
  }
}

TEST_F(ArchiveHttpTest, QuotaIsHeld) {
  constexpr uint64_t kQuota = 200'000;
  simnet::ArchiveOptions a;
  a.faults.quota_bytes_per_second = kQuota;
  Serve(a);
  auto http = Open(Options());
  ASSERT_NE(http, nullptr);
  // Blocks from the local listing, so every byte counted is a getBlock body.
  uint64_t bytes = 0;
  size_t blocks = 0;
  const auto start = Clock::now();
  for (const SegmentInfo& s : segments_) {
    auto reader = jss::SegmentReader::Open((std::filesystem::path(Dir()) / s.name).string());
    ASSERT_TRUE(reader.ok());
    for (uint32_t b = 0; b < reader->footer().blocks.size() && bytes < 600'000; ++b) {
      auto frame = http->GetBlock(s, b);
      ASSERT_TRUE(frame.ok()) << frame.status().ToString();
      bytes += frame->size();
      ++blocks;
    }
  }
  const int64_t ms = MsSince(start);
  ASSERT_GE(bytes, 600'000u) << "the test archive is too small";
  const double rate = static_cast<double>(bytes) * 1000 / static_cast<double>(ms);
  EXPECT_GE(ms, 2'500) << bytes << " bytes in " << blocks << " blocks";
  EXPECT_LE(rate, kQuota * 1.1);
  EXPECT_GE(rate, kQuota * 0.3) << "pacing should not be much slower than the quota";
  EXPECT_EQ(net_->archive_stats().quota_rejections, 0u) << "the client paced itself";
  EXPECT_EQ(http->stats().throttled, 0u);
  EXPECT_GT(http->stats().paced_ms, 2'000);
}

TEST_F(ArchiveHttpTest, QuotaIsSharedByArchivesWithTheSameKey) {
  constexpr uint64_t kQuota = 200'000;
  simnet::ArchiveOptions a;
  a.faults.quota_bytes_per_second = kQuota;
  a.faults.required_key = "shared";
  Serve(a);
  HttpArchiveOptions o = Options();
  o.key = "shared";
  auto one = Open(o);
  auto two = Open(o);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  // Two workers, alternate blocks, ~300 KB each.
  std::vector<std::pair<const SegmentInfo*, uint32_t>> order;
  for (const SegmentInfo& s : segments_) {
    auto reader = jss::SegmentReader::Open((std::filesystem::path(Dir()) / s.name).string());
    ASSERT_TRUE(reader.ok());
    for (uint32_t b = 0; b < reader->footer().blocks.size(); ++b) order.emplace_back(&s, b);
  }
  std::atomic<uint64_t> total{0};
  const auto work = [&](HttpArchive* archive, size_t parity) {
    uint64_t mine = 0;
    for (size_t i = parity; i < order.size() && mine < 300'000; i += 2) {
      auto frame = archive->GetBlock(*order[i].first, order[i].second);
      EXPECT_TRUE(frame.ok()) << frame.status().ToString();
      if (frame.ok()) mine += frame->size();
    }
    total += mine;
  };
  const auto start = Clock::now();
  std::thread t1(work, one.get(), 0);
  std::thread t2(work, two.get(), 1);
  t1.join();
  t2.join();
  const int64_t ms = MsSince(start);
  ASSERT_GE(total.load(), 600'000u);
  const double rate = static_cast<double>(total.load()) * 1000 / static_cast<double>(ms);
  EXPECT_GE(ms, 2'500);
  EXPECT_LE(rate, kQuota * 1.1);
  EXPECT_EQ(net_->archive_stats().quota_rejections, 0u);
}

TEST_F(ArchiveHttpTest, OptionsAreValidated) {
  HttpArchiveOptions o;
  o.base_url = "ftp://archive.example";
  EXPECT_EQ(HttpArchive::Open(o).status().code(), StatusCode::kInvalid);
  o.base_url = "https://archive.example/";
  o.key = "two words";
  EXPECT_EQ(HttpArchive::Open(o).status().code(), StatusCode::kInvalid);
  o.key = "ok";
  o.max_connections = 0;
  EXPECT_EQ(HttpArchive::Open(o).status().code(), StatusCode::kInvalid);
  o.max_connections = 2;
  EXPECT_TRUE(HttpArchive::Open(o).ok());
}

}  // namespace
}  // namespace atfill::sources
