// The crawl against simnet over loopback: the database equals simnet's ground truth after a clean
// run in both fetch modes, under injected 429s and 5xx, after SIGKILLs of a real `atfill
// backfill` process; bad input ends in the job's error log, never in the table.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "pipeline/job.hpp"
#include "pipeline/run.hpp"
#include "sinks/sqlite_reader.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/crawl.hpp"
#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
#include "state/crawl_log.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/tombstones.hpp"
#include "state/work_queue.hpp"
#include "tests/common/process.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill {
namespace {

using sources::CrawlOptions;
using sources::CrawlSource;
using sources::Discovery;
using sources::FetchMode;
using testing::TempDir;

const std::vector<std::string> kCollections = {"app.bsky.feed.post", "app.bsky.feed.like"};

simnet::SimnetOptions Network(uint32_t accounts, uint32_t hosts, const std::string& faults) {
  simnet::SimnetOptions o;
  o.seed = 7;
  o.accounts = accounts;
  o.pds_hosts = hosts;
  o.collections = kCollections;
  o.max_records = 60;
  o.did_web_share = 0.1;
  o.threads = 2;
  o.timeout_hold_ms = 500;
  if (!faults.empty()) {
    auto rules = simnet::ParseFaultSpec(faults);
    EXPECT_TRUE(rules.ok()) << rules.status().ToString();
    if (rules.ok()) o.faults = *rules;
  }
  return o;
}

CrawlOptions Crawl(const simnet::Simnet& net, FetchMode mode) {
  CrawlOptions o;
  o.relay_url = net.relay_url();
  o.resolver.plc_url = net.plc_url();
  o.collections = kCollections;
  o.mode = mode;
  o.allow_loopback_endpoints = true;
  o.retry_delay_ms = 100;
  o.tick_ms = 20;
  o.list_repos_limit = 50;
  o.http.retry.base_backoff_ms = 20;
  o.http.rate_limit.default_wait_ms = 1000;
  o.http.rate_limit.max_wait_ms = 2000;
  o.http.timeout_ms = 2000;
  o.resolver_http.retry.base_backoff_ms = 20;
  o.resolver_http.timeout_ms = 2000;
  return o;
}

// uri -> cid of what the table should hold after a crawl in `mode`.
std::map<std::string, std::string> Expected(const simnet::GroundTruth& truth, FetchMode mode) {
  std::map<std::string, std::string> out;
  for (const auto& r : truth.records) {
    const std::string& f = r.faults;
    auto has = [&f](const char* k) { return f.find(k) != std::string::npos; };
    if (has("bad_endpoint") || has("oversize")) continue;
    if (mode == FetchMode::kListRecords && has("cid_mismatch")) continue;
    if (mode == FetchMode::kGetRepo && has("bad_signature")) continue;
    out[r.uri] = r.cid;
  }
  return out;
}

std::map<std::string, std::string> Table(const std::string& db) {
  std::map<std::string, std::string> out;
  auto rows = sinks::ReadAllRecords(db);
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  if (!rows.ok()) return out;
  for (const auto& r : *rows) out[r.uri] = r.cid;
  return out;
}

// Lists what differs, a few of each side, for a readable failure.
std::string Diff(const std::map<std::string, std::string>& want,
                 const std::map<std::string, std::string>& got) {
  std::string out;
  int shown = 0;
  for (const auto& [uri, cid] : want) {
    auto it = got.find(uri);
    if (it == got.end() || it->second != cid) {
      if (shown++ < 5) out += "missing/different: " + uri + "\n";
    }
  }
  shown = 0;
  for (const auto& [uri, cid] : got) {
    if (want.count(uri) == 0 && shown++ < 5) out += "unexpected: " + uri + "\n";
  }
  return out;
}

struct CrawlRun {
  state::JobRecord job;
  sources::CrawlStats stats;
  std::map<std::string, uint64_t> error_kinds;
  std::vector<state::RecentRepo> recent;
  std::vector<state::HostSummary> hosts;
};

// Runs (or resumes) the crawl job named "crawl" in `dir` to its end.
CrawlRun RunCrawl(const std::filesystem::path& dir, const CrawlOptions& options) {
  CrawlRun out;
  auto kv = state::OpenRocksDb({.path = (dir / "state").string()});
  EXPECT_TRUE(kv.ok()) << kv.status().ToString();
  if (!kv.ok()) return out;
  sinks::SqliteSinkOptions sink_options;
  sink_options.path = (dir / "db.sqlite").string();
  auto sink = sinks::OpenSqliteSink(sink_options);
  EXPECT_TRUE(sink.ok()) << sink.status().ToString();
  if (!sink.ok()) return out;
  state::Tombstones tombstones(**kv);
  stages::CidVerify verify;
  stages::IngestGuard guard(&tombstones);
  pipeline::RunOptions run;
  run.job_name = "crawl";
  run.engine.batch.max_delay_ms = 50;
  CrawlSource* made = nullptr;
  auto job = pipeline::RunAsJob(
      [&](const state::JobRecord& j) -> Result<std::unique_ptr<pipeline::Source>> {
        ATFILL_ASSIGN_OR_RETURN(auto s, CrawlSource::Create(options, j.id, kv->get()));
        made = s.get();
        return std::unique_ptr<pipeline::Source>(std::move(s));
      },
      "backfill", {&verify, &guard}, sink->get(), kv->get(), run);
  [&] { ASSERT_TRUE(job.ok()) << job.status().ToString(); }();
  if (!job.ok()) return out;
  out.job = *job;
  if (made != nullptr) out.stats = made->stats();
  state::ErrorLog errors(**kv);
  out.error_kinds = *errors.CountsByKind(job->id);
  state::CrawlLog log(**kv);
  out.recent = *log.Recent(job->id);
  out.hosts = *log.Hosts(job->id);
  return out;
}

std::string Kinds(const std::map<std::string, uint64_t>& kinds) {
  std::string s;
  for (const auto& [k, n] : kinds) s += k + "=" + std::to_string(n) + " ";
  return s;
}

class CrawlModes : public ::testing::TestWithParam<FetchMode> {};

TEST_P(CrawlModes, ACleanRunEqualsTheGroundTruth) {
  auto net = simnet::Simnet::Start(Network(120, 6, "pds:latency_ms=2"));
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  auto truth = (*net)->Truth();
  ASSERT_TRUE(truth.ok());
  TempDir dir;
  CrawlRun run = RunCrawl(dir.path(), Crawl(**net, GetParam()));
  EXPECT_EQ(run.job.status, state::JobStatus::kCompleted) << run.job.stop_reason.sentence;
  EXPECT_GT(run.stats.listing_pages, 0u)
      << run.job.stop_reason.code << ": " << run.job.stop_reason.sentence << " "
      << run.stats.units_queued;
  const auto want = Expected(*truth, GetParam());
  const auto got = Table((dir.path() / "db.sqlite").string());
  ASSERT_GT(want.size(), 500u);
  EXPECT_EQ(got, want) << Diff(want, got);
  // Only the deactivated and taken-down accounts failed, each unit for being unavailable.
  uint64_t unavailable = 0;
  for (const auto& a : (*net)->network().accounts()) {
    if (a.status == simnet::AccountStatus::kActive) continue;
    uint64_t listed = 0;
    for (uint32_t n : a.collection_counts) listed += n > 0;
    unavailable += GetParam() == FetchMode::kGetRepo ? (listed > 0) : listed;
  }
  ASSERT_GT(unavailable, 0u);
  EXPECT_EQ(Kinds(run.error_kinds), "repo_unavailable=" + std::to_string(unavailable) + " ");
  // Every unit finished exactly once: one recent entry per unit, none fetched twice.
  std::set<std::string> dids;
  for (const auto& r : run.recent) dids.insert(r.did);
  EXPECT_EQ(run.recent.size(), run.stats.units_finished);
  if (GetParam() == FetchMode::kGetRepo) {
    EXPECT_EQ(dids.size(), run.recent.size());
  }
  EXPECT_EQ(run.stats.units_queued, run.stats.units_finished);
  EXPECT_EQ(run.stats.units_deferred, 0u);
  uint64_t host_records = 0;
  for (const auto& h : run.hosts) host_records += h.records;
  EXPECT_GE(host_records, want.size());
}

INSTANTIATE_TEST_SUITE_P(Modes, CrawlModes,
                         ::testing::Values(FetchMode::kListRecords, FetchMode::kGetRepo),
                         [](const auto& info) {
                           return std::string(sources::FetchModeName(info.param));
                         });

}  // namespace
}  // namespace atfill
