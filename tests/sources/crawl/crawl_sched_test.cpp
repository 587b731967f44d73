// The crawl's scheduler against loopback test servers (a PLC directory and a few PDS hosts, each
// server a host of its own): one resolution per DID for all of its units, hosts opened by ready
// units within the fetch client's limits (nothing queued inside the client), a resolution failure
// applied to every unit of the DID, and a resume after a deferral.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"
#include "sources/crawl/crawl_source.hpp"
#include "state/resolver_cache.hpp"
#include "tests/common/http_test_server.hpp"
#include "tests/common/job_harness.hpp"
#include "tests/common/process.hpp"

namespace atfill {
namespace {

using sources::CrawlOptions;
using sources::CrawlSource;
using testing::HttpTestServer;
using testing::JsonResponse;
using testing::TempDir;
using testing::TestRequest;
using testing::TestResponse;

constexpr auto kWait = std::chrono::seconds(20);

// A valid did:plc (24 base32 characters) per index.
std::string PlcDid(size_t i) {
  std::string id(24, 'a');
  for (size_t pos = id.size(); i > 0 && pos > 0; i /= 26)
    id[--pos] = static_cast<char>('a' + i % 26);
  return "did:plc:" + id;
}

std::string Document(const std::string& did, const std::string& pds) {
  return R"({"id":")" + did +
         R"(","service":[{"id":"#atproto_pds","type":"AtprotoPersonalDataServer",)"
         R"("serviceEndpoint":")" +
         pds + R"("}]})";
}

// The PDS hosts: every listRecords answer is an empty page (the unit ends after one request),
// `delay_ms` late.
struct Pds {
  std::vector<std::unique_ptr<HttpTestServer>> servers;
  std::shared_ptr<testing::ConcurrencyGauge> gauge = std::make_shared<testing::ConcurrencyGauge>();

  Pds(size_t hosts, int64_t delay_ms) {
    for (size_t i = 0; i < hosts; ++i) {
      servers.push_back(std::make_unique<HttpTestServer>(
          [delay_ms](const TestRequest&) {
            TestResponse r = JsonResponse(200, R"({"records":[]})");
            r.delay_ms = delay_ms;
            return r;
          },
          gauge));
    }
  }
  std::string Url(size_t host) const { return servers[host]->Url(""); }
  int64_t Requests() const {
    int64_t n = 0;
    for (const auto& s : servers) n += s->requests();
    return n;
  }
};

// The PLC directory: documents of the DIDs it knows (pointing at their PDS), 404 for the others,
// 500 (30 ms late) for the DIDs in `failing` while `fail` is set. Counts requests per DID.
class Plc {
 public:
  explicit Plc(std::map<std::string, std::string> pds_of, std::set<std::string> failing = {})
      : pds_of_(std::move(pds_of)),
        failing_(std::move(failing)),
        server_([this](const TestRequest& req) { return Answer(req); }) {}

  std::string Url() const { return server_.Url(""); }
  void StopFailing() { fail_ = false; }
  int64_t Requests(const std::string& did) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = requests_.find(did);
    return it == requests_.end() ? 0 : it->second;
  }
  int64_t Requests() const { return server_.requests(); }

 private:
  TestResponse Answer(const TestRequest& req) {
    const std::string did = req.target.substr(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++requests_[did];
    }
    if (fail_ && failing_.count(did) != 0) {
      TestResponse r = testing::XrpcErrorResponse(500, "InternalServerError", "down");
      r.delay_ms = 30;
      return r;
    }
    auto it = pds_of_.find(did);
    if (it == pds_of_.end()) return testing::XrpcErrorResponse(404, "NotFound", "no such DID");
    return JsonResponse(200, Document(did, it->second));
  }

  const std::map<std::string, std::string> pds_of_;
  const std::set<std::string> failing_;
  std::atomic<bool> fail_{true};
  mutable std::mutex mu_;
  std::map<std::string, int64_t> requests_;
  HttpTestServer server_;
};

CrawlOptions Options(const Plc& plc, std::vector<std::string> dids,
                     std::vector<std::string> collections) {
  CrawlOptions o;
  o.discovery = sources::Discovery::kDidList;
  o.dids = std::move(dids);
  o.collections = std::move(collections);
  o.resolver.plc_url = plc.Url();
  o.allow_loopback_endpoints = true;
  o.retry_delay_ms = 50;
  o.tick_ms = 20;
  o.http.timeout_ms = 10'000;
  o.resolver_http.retry.max_attempts = 1;
  return o;
}

struct JobRun {
  testing::SourceJobRun run;
  sources::CrawlStats stats;
};

// Runs (or resumes) the crawl job with its state in `dir`. `source` (when set) is pointed at the
// source while the job runs, and cleared before the source is destroyed.
JobRun RunJob(const TempDir& dir, const CrawlOptions& options,
              const std::function<void(state::KvStore&)>& prepare = nullptr,
              std::atomic<CrawlSource*>* source = nullptr) {
  JobRun out;
  std::unique_ptr<CrawlSource> made;
  out.run = testing::RunSourceJob(
      dir.path() / "state", (dir.path() / "db.sqlite").string(), "backfill", "crawl",
      [&](state::KvStore& kv,
          const state::JobRecord& j) -> Result<std::unique_ptr<pipeline::Source>> {
        ATFILL_ASSIGN_OR_RETURN(made, CrawlSource::Create(options, j.id, &kv));
        if (source != nullptr) source->store(made.get());
        return testing::Borrow(made.get());
      },
      prepare,
      [&](state::KvStore&, const state::JobRecord&) {
        if (source != nullptr) source->store(nullptr);
        if (made != nullptr) out.stats = made->stats();
        made.reset();
      });
  return out;
}

std::string Describe(const testing::SourceJobRun& run) {
  std::string s = std::string(state::JobStatusName(run.job.status)) + " (" +
                  run.job.stop_reason.code + ": " + run.job.stop_reason.sentence + ")";
  for (size_t i = 0; i < run.errors.size() && i < 5; ++i) {
    s += "\n  " + run.errors[i].kind + " " + run.errors[i].key + ": " + run.errors[i].message;
  }
  return s;
}

TEST(CrawlSchedulerTest, ADidWithSeveralCollectionsCostsOneResolution) {
  Pds pds(2, 0);
  std::map<std::string, std::string> pds_of;
  std::vector<std::string> dids;
  for (size_t i = 0; i < 12; ++i) {
    dids.push_back(PlcDid(i + 1));
    pds_of[dids.back()] = pds.Url(i % 2);
  }
  Plc plc(pds_of);
  TempDir dir;
  const JobRun job = RunJob(
      dir,
      Options(plc, dids, {"app.bsky.feed.post", "app.bsky.feed.like", "app.bsky.graph.follow"}));
  ASSERT_EQ(job.run.job.status, state::JobStatus::kCompleted) << Describe(job.run);
  EXPECT_EQ(job.stats.units_queued, 36u);
  EXPECT_EQ(job.stats.units_finished, 36u);
  EXPECT_EQ(job.stats.units_failed, 0u);
  // One Resolve per DID for its three units, and one PLC request each.
  EXPECT_EQ(job.stats.resolutions, 12u);
  EXPECT_EQ(plc.Requests(), 12);
  for (const auto& did : dids) EXPECT_EQ(plc.Requests(did), 1) << did;
  EXPECT_EQ(pds.Requests(), 36);
  EXPECT_EQ(job.stats.fetch_requests, 36u);
}

// 4 hosts of 8 units each, 2 hosts served at once with 3 requests each: the crawl opens two hosts,
// keeps 3 requests in flight on each and submits nothing the client would have to queue; the other
// two hosts open only when the first two are done.
TEST(CrawlSchedulerTest, OpenHostsKeepTheirPerHostSlotsFullAndTheClientQueuesNothing) {
  Pds pds(4, 0);
  for (auto& s : pds.servers) s->SetHold(true);
  std::map<std::string, std::string> pds_of;
  std::vector<std::string> dids;
  for (size_t i = 0; i < 32; ++i) {
    dids.push_back(PlcDid(i + 1));
    pds_of[dids.back()] = pds.Url(i % 4);  // queue order interleaves the hosts
  }
  Plc plc(pds_of);
  CrawlOptions o = Options(plc, dids, {"app.bsky.feed.post"});
  o.http.max_hosts = 2;
  o.http.max_per_host = 3;
  o.http.timeout_ms = 120'000;  // held answers are not retried
  TempDir dir;
  std::atomic<CrawlSource*> source{nullptr};
  JobRun job;
  std::thread runner([&] { job = RunJob(dir, o, nullptr, &source); });
  // However the test ends, the held answers go out and the job ends.
  struct Release {
    Pds& pds;
    std::thread& runner;
    ~Release() {
      for (auto& server : pds.servers) server->SetHold(false);
      if (runner.joinable()) runner.join();
    }
  } release{pds, runner};
  // Every request the holding hosts read is parked (a request counts as served from when it is
  // read, as held once its answer is parked).
  auto settle = [&](const std::vector<size_t>& holding) {
    for (size_t i : holding) {
      EXPECT_TRUE(pds.servers[i]->WaitForHeld(pds.servers[i]->concurrent(), kWait)) << i;
    }
  };

  // Two hosts with 3 requests each, the others none.
  ASSERT_TRUE(pds.gauge->WaitForCurrent(6, kWait));
  settle({0, 1, 2, 3});
  std::vector<size_t> first, second;
  for (size_t i = 0; i < 4; ++i) {
    const int held = pds.servers[i]->held();
    EXPECT_TRUE(held == 0 || held == 3) << "host " << i << " holds " << held;
    (held == 3 ? first : second).push_back(i);
  }
  EXPECT_EQ(first.size(), 2u);
  CrawlSource* s = source.load();
  ASSERT_NE(s, nullptr);
  net::HttpClientStats http = s->http_stats();
  EXPECT_EQ(http.queued, 0);
  EXPECT_EQ(http.in_flight, 6);

  // The first two hosts finish; the other two open, again with 3 requests each.
  for (size_t i : first) pds.servers[i]->SetHold(false);
  for (size_t i : second) EXPECT_TRUE(pds.servers[i]->WaitForHeld(3, kWait)) << "host " << i;
  settle(second);
  // (A first host may have closed while some of its units were still resolving; those come back
  // later, so its 8 requests are checked at the end.)
  for (size_t i : second) EXPECT_EQ(pds.servers[i]->held(), 3) << "host " << i;
  http = s->http_stats();
  EXPECT_EQ(http.queued, 0);
  EXPECT_EQ(http.in_flight, 6);

  for (auto& server : pds.servers) server->SetHold(false);
  runner.join();
  EXPECT_EQ(pds.gauge->max(), 6);
  ASSERT_EQ(job.run.job.status, state::JobStatus::kCompleted) << Describe(job.run);
  EXPECT_EQ(job.stats.units_finished, 32u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(pds.servers[i]->requests(), 8) << "host " << i;
    EXPECT_EQ(pds.servers[i]->max_concurrent(), 3) << "host " << i;
  }
}

// With every DID resolved in the cache, all units are ready at once: one host at a time (2
// requests each), the one with the most ready units first, whatever the queue order.
TEST(CrawlSchedulerTest, TheHostWithTheMostReadyUnitsOpensFirst) {
  Pds pds(3, 20);
  const std::vector<size_t> units_on = {2, 4, 6};  // hosts 0, 1, 2; queued in that order
  std::map<std::string, std::string> pds_of;
  std::vector<std::string> dids;
  for (size_t host = 0; host < 3; ++host) {
    for (size_t k = 0; k < units_on[host]; ++k) {
      dids.push_back(PlcDid(dids.size() + 1));
      pds_of[dids.back()] = pds.Url(host);
    }
  }
  Plc plc(pds_of);
  CrawlOptions o = Options(plc, dids, {"app.bsky.feed.post"});
  o.http.max_hosts = 1;
  o.http.max_per_host = 2;
  TempDir dir;
  const JobRun job = RunJob(dir, o, [&](state::KvStore& kv) {
    state::ResolverCache cache(kv);
    const int64_t now = pipeline::NowMicros();
    for (const auto& [did, url] : pds_of) {
      state::ResolvedDid entry;
      entry.pds_endpoint = url;
      entry.resolved_at_us = now;
      entry.expires_at_us = now + int64_t{3600} * 1'000'000;
      ASSERT_TRUE(cache.Store(did, entry).ok());
    }
  });
  ASSERT_EQ(job.run.job.status, state::JobStatus::kCompleted) << Describe(job.run);
  EXPECT_EQ(job.stats.units_finished, 12u);
  EXPECT_EQ(plc.Requests(), 0);  // every DID from the cache
  // Host 2 (6 ready) is served first, then host 1 (4), then host 0 (2): each host's requests all
  // arrive before the next host's first.
  // Arrival times in microseconds since the first request.
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::time_point::max();
  for (const auto& server : pds.servers) {
    for (const auto& r : server->received()) start = std::min(start, r.arrived);
  }
  auto arrivals = [&](size_t host) {
    std::vector<int64_t> t;
    for (const auto& r : pds.servers[host]->received()) {
      t.push_back(std::chrono::duration_cast<std::chrono::microseconds>(r.arrived - start).count());
    }
    EXPECT_EQ(t.size(), units_on[host]) << "host " << host;
    std::sort(t.begin(), t.end());
    return t;
  };
  const auto h0 = arrivals(0), h1 = arrivals(1), h2 = arrivals(2);
  ASSERT_FALSE(h0.empty() || h1.empty() || h2.empty());
  EXPECT_LT(h2.back(), h1.front());
  EXPECT_LT(h1.back(), h0.front());
  for (size_t host = 0; host < 3; ++host) {
    EXPECT_EQ(pds.servers[host]->max_concurrent(), 2) << "host " << host;
  }
}

// A DID the PLC does not know: its three units end with did_not_found after one request. A DID
// whose resolution keeps failing with 500: its three units are tried again together and deferred
// together (one PLC request per try); the resume resolves it once more and finishes them.
TEST(CrawlSchedulerTest, AResolutionFailureEndsOrDefersEveryUnitOfTheDidAndAResumeFinishesThem) {
  Pds pds(1, 0);
  const std::string good = PlcDid(1), unknown = PlcDid(2), failing = PlcDid(3);
  Plc plc({{good, pds.Url(0)}, {failing, pds.Url(0)}}, {failing});
  CrawlOptions o = Options(plc, {good, unknown, failing},
                           {"app.bsky.feed.post", "app.bsky.feed.like", "app.bsky.graph.follow"});
  o.unit_attempts = 2;
  TempDir dir;
  const JobRun first = RunJob(dir, o);
  ASSERT_EQ(first.run.job.status, state::JobStatus::kPaused) << Describe(first.run);
  EXPECT_EQ(first.run.job.stop_reason.code, "unfinished_units");
  EXPECT_EQ(first.run.error_kinds.at("did_not_found"), 3u) << Describe(first.run);
  EXPECT_EQ(first.run.error_kinds.at("unit_deferred"), 3u) << Describe(first.run);
  EXPECT_EQ(first.stats.units_finished, 6u);
  EXPECT_EQ(first.stats.units_failed, 3u);
  EXPECT_EQ(first.stats.units_deferred, 3u);
  EXPECT_EQ(first.stats.retries, 3u);
  EXPECT_EQ(plc.Requests(good), 1);
  EXPECT_EQ(plc.Requests(unknown), 1);
  EXPECT_EQ(plc.Requests(failing), 2);  // one per try, for its three units together
  EXPECT_EQ(first.stats.resolutions, 4u);
  EXPECT_EQ(pds.Requests(), 3);

  plc.StopFailing();
  const JobRun second = RunJob(dir, o);
  EXPECT_EQ(second.run.job.id, first.run.job.id);
  ASSERT_EQ(second.run.job.status, state::JobStatus::kCompleted) << Describe(second.run);
  EXPECT_EQ(second.stats.units_queued, 0u);  // the list was done; the units came from the queue
  EXPECT_EQ(second.stats.units_finished, 3u);
  EXPECT_EQ(second.stats.resolutions, 1u);
  EXPECT_EQ(plc.Requests(failing), 3);
  EXPECT_EQ(plc.Requests(good), 1);  // finished units are not fetched again
  EXPECT_EQ(pds.Requests(), 6);
}

}  // namespace
}  // namespace atfill
