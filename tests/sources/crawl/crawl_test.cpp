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
#include "sources/crawl/crawl_source.hpp"
#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
#include "state/crawl_log.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/tombstones.hpp"
#include "state/work_queue.hpp"
#include "tests/common/crawl_job.hpp"
#include "tests/common/job_harness.hpp"
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

std::map<std::string, std::string> Table(const std::vector<sinks::RecordRow>& rows) {
  std::map<std::string, std::string> out;
  for (const auto& r : rows) out[r.uri] = r.cid;
  return out;
}

std::map<std::string, std::string> Table(const std::string& db) {
  auto rows = sinks::ReadAllRecords(db);
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  return rows.ok() ? Table(*rows) : std::map<std::string, std::string>();
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

using CrawlRun = testing::CrawlJobRun;

// Runs (or resumes) the crawl job with its state and table in `dir`.
CrawlRun RunCrawl(const std::filesystem::path& dir, const CrawlOptions& options) {
  return testing::RunCrawlJob(dir / "state", (dir / "db.sqlite").string(), options);
}

std::string Kinds(const std::map<std::string, uint64_t>& kinds) {
  return testing::KindCounts(kinds);
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
  // Only the deactivated and taken-down accounts did not give their records, each unit for
  // being unavailable.
  uint64_t unavailable = 0;
  for (const auto& a : (*net)->network().accounts()) {
    if (a.status == simnet::AccountStatus::kActive) continue;
    uint64_t listed = 0;
    for (uint32_t n : a.collection_counts) listed += n > 0;
    unavailable += GetParam() == FetchMode::kGetRepo ? (listed > 0) : listed;
  }
  ASSERT_GT(unavailable, 0u);
  EXPECT_EQ(Kinds(run.error_kinds), "repo_unavailable=" + std::to_string(unavailable) + " ");
  // Logged, but outcomes the network reported, not failed units nor errors of the job.
  EXPECT_EQ(run.stats.units_unavailable, unavailable);
  EXPECT_EQ(run.stats.units_failed, 0u);
  EXPECT_EQ(run.job.counters.failed_records, 0u);
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

TEST(CrawlTest, RateLimitsAndServerErrorsOnAFifthOfAnswersLoseNothing) {
  // 10% 429 (with RateLimit-Reset) and 10% 5xx on every PDS, 10% 5xx on the relay and the PLC.
  auto net = simnet::Simnet::Start(
      Network(100, 5, "pds:rate_limit=0.1,reset_s=1,error=0.1;relay:error=0.1;plc:error=0.1"));
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  auto truth = (*net)->Truth();
  ASSERT_TRUE(truth.ok());
  TempDir dir;
  CrawlOptions o = Crawl(**net, FetchMode::kListRecords);
  o.unit_attempts = 5;
  CrawlRun run = RunCrawl(dir.path(), o);
  EXPECT_EQ(run.job.status, state::JobStatus::kCompleted) << run.job.stop_reason.sentence;
  const auto want = Expected(*truth, FetchMode::kListRecords);
  const auto got = Table((dir.path() / "db.sqlite").string());
  EXPECT_EQ(got, want) << Diff(want, got);
  const auto stats = (*net)->stats();
  EXPECT_GT(stats.rate_limited, 10u);
  EXPECT_GT(stats.server_errors, 10u);
  EXPECT_EQ(run.error_kinds.count("unit_deferred"), 0u) << Kinds(run.error_kinds);
}

TEST(CrawlTest, BadInputEndsInTheErrorLogWithItsKindNeverInTheTable) {
  // Per PDS account index: every 7th commit signed with another key, every 11th DID document
  // pointing at a private address, every 13th at an ftp:// URL; per record index: every 9th
  // stated with a wrong CID in listRecords, every 40th oversize.
  const std::string faults =
      "pds:bad_signature=1/7,private_endpoint=1/11,bad_scheme=1/13,cid_mismatch=1/9,"
      "oversize=1/40";
  for (FetchMode mode : {FetchMode::kListRecords, FetchMode::kGetRepo}) {
    SCOPED_TRACE(std::string(sources::FetchModeName(mode)));
    simnet::SimnetOptions so = Network(90, 3, faults);
    so.deactivated_share = 0;
    so.takendown_share = 0;
    so.oversize_record_bytes = 1200 * 1024;
    auto net = simnet::Simnet::Start(so);
    ASSERT_TRUE(net.ok()) << net.status().ToString();
    auto truth = (*net)->Truth();
    ASSERT_TRUE(truth.ok());
    TempDir dir;
    CrawlOptions o = Crawl(**net, mode);
    // Plus two accounts nobody has: an unknown did:plc and a did:web on no host.
    CrawlRun run = RunCrawl(dir.path(), o);
    EXPECT_EQ(run.job.status, state::JobStatus::kCompleted) << run.job.stop_reason.sentence;
    const auto want = Expected(*truth, mode);
    const auto got = Table((dir.path() / "db.sqlite").string());
    EXPECT_EQ(got, want) << Diff(want, got);

    uint64_t bad_endpoint = 0, bad_signature = 0, cid_mismatch = 0, oversize = 0;
    for (const auto& a : truth->accounts) {
      if (a.bad_endpoint) {
        uint64_t listed = 0;
        for (const auto& acct : (*net)->network().accounts()) {
          if (acct.did != a.did) continue;
          for (uint32_t n : acct.collection_counts) listed += n > 0;
        }
        bad_endpoint += mode == FetchMode::kGetRepo ? (listed > 0) : listed;
      } else if (a.bad_signature && mode == FetchMode::kGetRepo && a.records > 0) {
        ++bad_signature;
      }
    }
    for (const auto& r : truth->records) {
      if (r.faults.find("bad_endpoint") != std::string::npos) continue;
      if (mode == FetchMode::kGetRepo && r.faults.find("bad_signature") != std::string::npos) {
        continue;
      }
      if (r.faults.find("oversize") != std::string::npos) {
        ++oversize;
      } else if (mode == FetchMode::kListRecords &&
                 r.faults.find("cid_mismatch") != std::string::npos) {
        ++cid_mismatch;
      }
    }
    ASSERT_GT(bad_endpoint, 0u);
    ASSERT_GT(oversize, 0u);
    std::map<std::string, uint64_t> kinds = {{"bad_endpoint", bad_endpoint},
                                             {"oversize_record", oversize}};
    if (mode == FetchMode::kGetRepo) {
      ASSERT_GT(bad_signature, 0u);
      kinds["bad_signature"] = bad_signature;
    } else {
      ASSERT_GT(cid_mismatch, 0u);
      kinds["cid_mismatch"] = cid_mismatch;
    }
    EXPECT_EQ(Kinds(run.error_kinds), Kinds(kinds));
    if (Kinds(run.error_kinds) != Kinds(kinds)) {
      auto kv = state::OpenRocksDb({.path = (dir.path() / "state").string()});
      state::ErrorLog errors(**kv);
      auto entries = errors.List(run.job.id, 0, 1000);
      ASSERT_TRUE(entries.ok());
      for (const auto& e : *entries) {
        if (e.kind == "bad_endpoint") {
          std::string counts;
          for (const auto& a : (*net)->network().accounts()) {
            if (e.key.find(a.did) != std::string::npos) {
              for (uint32_t n : a.collection_counts) counts += std::to_string(n) + ",";
            }
          }
          ADD_FAILURE() << e.key << " x" << e.attempts << " counts " << counts;
        }
      }
    }
  }
}

TEST(CrawlTest, AnAccountBackfillTakesTheDidsGivenAndLogsTheOnesThatDoNotResolve) {
  auto net = simnet::Simnet::Start(Network(40, 3, ""));
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  auto truth = (*net)->Truth();
  ASSERT_TRUE(truth.ok());
  TempDir dir;
  CrawlOptions o = Crawl(**net, FetchMode::kGetRepo);
  o.discovery = Discovery::kDidList;
  o.relay_url.clear();
  std::map<std::string, std::string> want;
  for (const auto& a : truth->accounts) {
    if (a.status != simnet::AccountStatus::kActive || a.records == 0) continue;
    o.dids.push_back(a.did);
    if (o.dids.size() == 5) break;
  }
  ASSERT_EQ(o.dids.size(), 5u);
  for (const auto& r : truth->records) {
    for (const auto& d : o.dids) {
      if (r.uri.rfind("at://" + d + "/", 0) == 0) want[r.uri] = r.cid;
    }
  }
  o.dids.push_back("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa");  // valid, unknown to the directory
  CrawlRun run = RunCrawl(dir.path(), o);
  EXPECT_EQ(run.job.status, state::JobStatus::kCompleted) << run.job.stop_reason.sentence;
  EXPECT_EQ(run.stats.listing_pages, 0u);
  const auto got = Table((dir.path() / "db.sqlite").string());
  EXPECT_EQ(got, want) << Diff(want, got);
  EXPECT_EQ(Kinds(run.error_kinds), "did_not_found=1 ");
}

TEST(CrawlTest, AHostThatStaysDownPausesTheJobAndAResumeFinishesIt) {
  simnet::SimnetOptions so = Network(60, 3, "pds-0002:error=always,error_status=503");
  so.deactivated_share = 0;
  so.takendown_share = 0;
  auto down = simnet::Simnet::Start(so);
  ASSERT_TRUE(down.ok()) << down.status().ToString();
  const uint16_t port = (*down)->port();
  auto truth = (*down)->Truth();
  ASSERT_TRUE(truth.ok());
  TempDir dir;
  CrawlOptions o = Crawl(**down, FetchMode::kGetRepo);
  o.unit_attempts = 2;
  o.http.retry.max_attempts = 2;
  CrawlRun first = RunCrawl(dir.path(), o);
  EXPECT_EQ(first.job.status, state::JobStatus::kPaused);
  EXPECT_EQ(first.job.stop_reason.code, "unfinished_units") << first.job.stop_reason.sentence;
  EXPECT_GT(first.stats.units_deferred, 0u);
  EXPECT_EQ(first.error_kinds["unit_deferred"], first.stats.units_deferred);
  const auto partial = Table((dir.path() / "db.sqlite").string());
  (*down)->Stop();

  // The host is back (same network, same port): the resume fetches only what was left.
  so.faults.clear();
  so.port = port;
  auto up = simnet::Simnet::Start(so);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  CrawlRun second = RunCrawl(dir.path(), Crawl(**up, FetchMode::kGetRepo));
  EXPECT_EQ(second.job.id, first.job.id);
  EXPECT_EQ(second.job.status, state::JobStatus::kCompleted) << second.job.stop_reason.sentence;
  EXPECT_EQ(second.stats.units_queued, 0u);  // discovery had finished; nothing listed again
  EXPECT_EQ(second.stats.units_finished, first.stats.units_deferred);
  const auto want = Expected(*truth, FetchMode::kGetRepo);
  const auto got = Table((dir.path() / "db.sqlite").string());
  EXPECT_LT(partial.size(), want.size());
  EXPECT_EQ(got, want) << Diff(want, got);
}

// The launcher's side of the same: `atfill backfill` ends paused with work left (exit 4, the
// reason named), and after the host recovers `atfill run` resumes that job to the end.
TEST(CrawlTest, AtfillRunResumesABackfillPausedWithWorkLeft) {
  simnet::SimnetOptions so = Network(50, 3, "pds-0003:error=always,error_status=502");
  so.deactivated_share = 0;
  so.takendown_share = 0;
  auto down = simnet::Simnet::Start(so);
  ASSERT_TRUE(down.ok()) << down.status().ToString();
  const uint16_t port = (*down)->port();
  auto truth = (*down)->Truth();
  ASSERT_TRUE(truth.ok());
  TempDir dir;
  const std::string config = (dir.path() / "atfill.toml").string();
  testing::WriteFile(config,
                     "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"db.sqlite\"\n"
                     "[progress]\ninterval_s = 60\n[crawl]\nrelay = \"" +
                         (*down)->relay_url() +
                         "\"\ncollections = [\"app.bsky.feed.post\"]\n"
                         "allow_loopback_endpoints = true\nunit_attempts = 1\n"
                         "[net]\nretries = 1\n[resolver]\nplc = \"" +
                         (*down)->plc_url() + "\"\n");
  auto first = testing::RunProcess({ATFILL_BINARY, "backfill", config}, dir.path());
  EXPECT_EQ(first.exit_code, 4) << first.err;
  EXPECT_NE(first.err.find("unfinished_units"), std::string::npos) << first.err;
  (*down)->Stop();

  so.faults.clear();
  so.port = port;
  auto up = simnet::Simnet::Start(so);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  auto resumed = testing::RunProcess({ATFILL_BINARY, "run", config}, dir.path());
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resuming backfill job 1"), std::string::npos) << resumed.err;
  std::map<std::string, std::string> want;
  for (const auto& [uri, cid] : Expected(*truth, FetchMode::kListRecords)) {
    if (uri.find("/app.bsky.feed.post/") != std::string::npos) want[uri] = cid;
  }
  const auto got = Table((dir.path() / "db.sqlite").string());
  EXPECT_EQ(got, want) << Diff(want, got);
  auto again = testing::RunProcess({ATFILL_BINARY, "run", config}, dir.path());
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("no unfinished job"), std::string::npos) << again.err;
}

// `atfill backfill` as a user runs it, killed with SIGKILL five times at random points, then run
// to the end: the table equals the ground truth and no finished repo was fetched twice.
TEST(CrawlTest, FiveSigkillsAndRestartsEndWithTheGroundTruthAndNoRepoFetchedTwice) {
  simnet::SimnetOptions so = Network(400, 10, "");
  so.latency_ms = 15;
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  auto truth = (*net)->Truth();
  ASSERT_TRUE(truth.ok());
  TempDir dir;
  const std::string config = (dir.path() / "atfill.toml").string();
  testing::WriteFile(config,
                     "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"db.sqlite\"\n"
                     "[engine]\nbatch_ms = 50\nbatch_records = 500\n[progress]\ninterval_s = 60\n"
                     "[crawl]\nrelay = \"" +
                         (*net)->relay_url() +
                         "\"\ncollections = [\"app.bsky.feed.post\", \"app.bsky.feed.like\"]\n"
                         "mode = \"getRepo\"\nlist_repos_limit = 40\nmax_active_units = 24\n"
                         "allow_loopback_endpoints = true\nretry_delay_ms = 100\n"
                         "batch_records = 500\nbatch_ms = 50\n"
                         "[net]\nper_host = 2\n[resolver]\nplc = \"" +
                         (*net)->plc_url() + "\"\n");
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("ATFILL_TEST_SEED=" + std::to_string(seed));
  const auto want = Expected(*truth, FetchMode::kGetRepo);
  const std::string db = (dir.path() / "db.sqlite").string();
  // Five kill points, as row counts the crashed table reaches, spread over the whole run.
  const int kills =
      testing::KillAtRowCounts({ATFILL_BINARY, "backfill", config}, dir.path(), db,
                               testing::KillPoints(rng, 5, want.size() / 20, want.size() * 9 / 10));
  EXPECT_EQ(kills, 5);
  auto last = testing::RunProcess({ATFILL_BINARY, "backfill", config}, dir.path());
  // 0: completed; the repos simnet's inactive accounts refuse are logged as outcomes, not errors.
  ASSERT_EQ(last.exit_code, 0) << last.err;

  const auto got = Table((dir.path() / "db.sqlite").string());
  EXPECT_EQ(got, want) << Diff(want, got);

  auto kv = state::OpenRocksDb({.path = (dir.path() / "state").string()});
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  // The only errors left standing are those repos: what a kill interrupted was finished later.
  auto logged = state::ErrorLog(**kv).List(1, 0, 10'000);
  ASSERT_TRUE(logged.ok()) << logged.status().ToString();
  size_t standing = 0;
  for (const state::ErrorEntry& e : *logged) {
    if (e.resolved) continue;
    ++standing;
    EXPECT_EQ(e.kind, "repo_unavailable") << e.key << ": " << e.message;
  }
  EXPECT_GT(standing, 0u);
  state::JobStore jobs(**kv);
  auto all = jobs.List();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u) << "every restart resumes the same job";
  EXPECT_EQ(all->front().status, state::JobStatus::kCompleted);
  state::WorkQueue queue(**kv);
  EXPECT_EQ(*queue.Count(all->front().id), 0u);
  // Each repo that finished is logged once, in the commit that removed it from the queue: a
  // repo fetched again after it finished would appear twice.
  state::CrawlLog log(**kv);
  auto recent = log.Recent(all->front().id);
  ASSERT_TRUE(recent.ok());
  std::map<std::string, int> times;
  for (const auto& r : *recent) ++times[r.did];
  uint64_t listed = 0;
  for (const auto& a : (*net)->network().accounts()) {
    uint64_t n = 0;
    for (uint32_t c : a.collection_counts) n += c;
    listed += n > 0;
  }
  EXPECT_EQ(times.size(), listed);
  for (const auto& [did, n] : times) EXPECT_EQ(n, 1) << did << " finished " << n << " times";
  // The per-PDS summary: every host's units all done or failed, records adding up to the table.
  auto hosts = log.Hosts(all->front().id);
  ASSERT_TRUE(hosts.ok());
  EXPECT_EQ(hosts->size(), 10u);
  uint64_t records = 0, units = 0, ended = 0;
  for (const auto& h : *hosts) {
    records += h.records;
    units += h.units;
    ended += h.done + h.errors;
  }
  EXPECT_EQ(units, ended);
  EXPECT_EQ(units, listed);
  EXPECT_EQ(records, got.size());
  kv->reset();
  auto shown =
      testing::RunProcess({ATFILL_BINARY, "job", config, "1", "--hosts", "--recent"}, dir.path());
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("http://pds-0001.localhost:"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find(times.begin()->first), std::string::npos) << shown.out;
}

}  // namespace
}  // namespace atfill
