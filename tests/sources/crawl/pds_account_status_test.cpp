// The account check over the network (stages::AccountCheck on sources::PdsAccountStatus) against
// loopback servers standing for the PLC directory and the account's PDS: its one deadline covers
// the DID's resolution and the PDS request together. Servers that do not answer in time park their
// responses (HttpTestServer::SetHold); every wait is bounded.
#include "sources/crawl/pds_account_status.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "net/http_client.hpp"
#include "sources/crawl/resolver.hpp"
#include "stages/account_check.hpp"
#include "tests/common/http_test_server.hpp"

namespace atfill::sources {
namespace {

using pipeline::AccountEvent;
using pipeline::AccountStatus;
using pipeline::AccountStatusAnswer;
using pipeline::EventChunk;
using pipeline::RecordEvent;
using std::chrono::milliseconds;
using testing::HttpTestServer;
using testing::JsonResponse;
using testing::TestRequest;
using testing::TestResponse;
using Verdict = pipeline::AccountStatusAnswer::Verdict;
using Clock = std::chrono::steady_clock;

constexpr milliseconds kPatience{20'000};  // bound on every wait; the tests finish far sooner
// How late past its deadline a check may end on a loaded machine: far below the resolver's and
// the client's own timeouts (a minute), which a check bounded by them alone would wait for.
constexpr milliseconds kSlack{3'000};
const std::string kDid = "did:plc:abcdefghijklmnopqrstuvwx";

std::string Document(const std::string& did, const std::string& endpoint) {
  return R"({"id":")" + did +
         R"(","service":[{"id":"#atproto_pds","type":"AtprotoPersonalDataServer",)"
         R"("serviceEndpoint":")" +
         endpoint + R"("}]})";
}

// A PLC directory that answers every DID with a document naming `pds`, and a PDS that says kDid's
// repo is active; each may be told to hold its answers.
struct Network {
  Network()
      : pds([](const TestRequest&) {
          return JsonResponse(200, R"({"did":")" + kDid + R"(","active":true})");
        }),
        plc([this](const TestRequest& r) {
          return JsonResponse(200, Document(r.target.substr(1), pds.Url("")));
        }) {
    net::HttpClientOptions o;
    o.allow_private_addresses = true;
    o.timeout_ms = 60'000;
    o.connect_timeout_ms = 60'000;
    auto started = net::HttpClient::Start(o);
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    if (started.ok()) http = std::move(*started);
    ResolverOptions r;
    r.plc_url = plc.Url("");
    r.allow_loopback_endpoints = true;
    r.timeout_ms = 60'000;
    r.cache_ttl_s = 0;
    resolver = std::make_unique<DidResolver>(http.get(), nullptr, r);
    lookup = std::make_unique<PdsAccountStatus>(resolver.get(), http.get());
  }
  ~Network() {
    plc.SetHold(false);
    pds.SetHold(false);
    if (http) http->Shutdown();
  }

  HttpTestServer pds;
  HttpTestServer plc;
  std::unique_ptr<net::HttpClient> http;
  std::unique_ptr<DidResolver> resolver;
  std::unique_ptr<PdsAccountStatus> lookup;
};

// Collects one lookup's answers (there must be exactly one).
struct Answers {
  pipeline::AccountStatusLookup::Done Callback() {
    return [this](AccountStatusAnswer a) {
      std::lock_guard<std::mutex> lock(mu);
      ++calls;
      answer = std::move(a);
      at = Clock::now();
      cv.notify_all();
    };
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, kPatience, [&] { return calls > 0; });
  }
  int Calls() {
    std::lock_guard<std::mutex> lock(mu);
    return calls;
  }

  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  AccountStatusAnswer answer;
  Clock::time_point at;
};

// The PLC directory takes the request and does not answer: the check ends by its deadline with the
// documented outcome (the purge goes ahead, counted as unconfirmed), and the resolution's late
// answer neither asks the PDS nor answers a second time.
TEST(PdsAccountStatusTest, AResolutionThatHangsEndsTheCheckAtItsDeadline) {
  Network net;
  ASSERT_NE(net.http, nullptr);
  net.plc.SetHold(true);
  constexpr int64_t kTimeoutMs = 400;
  stages::AccountCheck check(net.lookup.get(), stages::AccountCheckOptions{kTimeoutMs});
  EventChunk chunk;
  RecordEvent record;
  record.did = "did:plc:other";
  record.collection = "app.bsky.feed.post";
  record.rkey = "1";
  record.body = "{}";
  chunk.events.emplace_back(record);
  AccountEvent deleted;
  deleted.did = kDid;
  deleted.status = AccountStatus::kDeleted;
  chunk.events.emplace_back(deleted);

  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  Status result = Status::Internal("not called");
  const Clock::time_point start = Clock::now();
  Clock::time_point ended;
  ASSERT_TRUE(check.Start(nullptr, &chunk, false, [&](Status s, bool) {
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
    result = s;
    ended = Clock::now();
    cv.notify_all();
  }));
  ASSERT_TRUE(net.plc.WaitForHeld(1, kPatience));
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kPatience, [&] { return calls > 0; }));
  }
  EXPECT_GE(ended - start, milliseconds(kTimeoutMs));
  EXPECT_LT(ended - start, milliseconds(kTimeoutMs) + kSlack);
  EXPECT_TRUE(result.ok()) << result.ToString();
  ASSERT_EQ(chunk.events.size(), 2u);  // the deletion stays: the purge goes ahead
  EXPECT_TRUE(std::holds_alternative<AccountEvent>(chunk.events[1]));
  EXPECT_TRUE(chunk.errors.empty());
  const auto counters =
      std::map<std::string, int64_t>(chunk.counters.begin(), chunk.counters.end());
  EXPECT_EQ(counters, (std::map<std::string, int64_t>{{"account_checks", 1},
                                                      {"account_purges_unconfirmed", 1}}));
  const stages::AccountCheckStats s = check.stats();
  EXPECT_EQ(s.checks, 1u);
  EXPECT_EQ(s.refused, 0u);
  EXPECT_EQ(s.unconfirmed, 1u);

  // The directory answers now. A second lookup of the DID joins or follows the first's
  // resolution, so once it has its answer the first resolution's callback has run too.
  net.plc.SetHold(false);
  Answers second;
  net.lookup->Lookup(kDid, 20'000, second.Callback());
  ASSERT_TRUE(second.Wait());
  EXPECT_EQ(second.answer.verdict, Verdict::kActive) << second.answer.detail;
  EXPECT_EQ(net.pds.requests(), 1);  // the second lookup's only
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(calls, 1);
  }
}

// One deadline, not one per step: a resolution that takes most of it leaves the PDS request only
// the rest, and the answer names the step it was waiting on.
TEST(PdsAccountStatusTest, TheResolutionAndThePdsRequestShareOneDeadline) {
  Network net;
  ASSERT_NE(net.http, nullptr);
  net.pds.SetHold(true);
  constexpr int64_t kTimeoutMs = 800;
  // The directory answers after half the deadline (a delayed response, on the server's timer).
  HttpTestServer slow_plc([&net](const TestRequest& r) {
    return testing::DelayedResponse(
        JsonResponse(200, Document(r.target.substr(1), net.pds.Url(""))), kTimeoutMs / 2);
  });
  ResolverOptions r;
  r.plc_url = slow_plc.Url("");
  r.allow_loopback_endpoints = true;
  r.timeout_ms = 60'000;
  r.cache_ttl_s = 0;
  DidResolver resolver(net.http.get(), nullptr, r);
  PdsAccountStatus lookup(&resolver, net.http.get());

  Answers answers;
  const Clock::time_point start = Clock::now();
  lookup.Lookup(kDid, kTimeoutMs, answers.Callback());
  ASSERT_TRUE(answers.Wait());
  ASSERT_TRUE(net.pds.WaitForHeld(1, kPatience));  // the PDS was asked, and held its answer
  EXPECT_EQ(answers.answer.verdict, Verdict::kUnknown);
  EXPECT_EQ(answers.answer.detail, "no answer within 800 ms (asking the PDS)");
  EXPECT_GE(answers.at - start, milliseconds(kTimeoutMs));
  EXPECT_LT(answers.at - start, milliseconds(kTimeoutMs) + kSlack);
  EXPECT_EQ(answers.Calls(), 1);
}

// A resolution that hangs is named as such.
TEST(PdsAccountStatusTest, AnUnansweredResolutionIsNamedInTheAnswer) {
  Network net;
  ASSERT_NE(net.http, nullptr);
  net.plc.SetHold(true);
  Answers answers;
  net.lookup->Lookup(kDid, 200, answers.Callback());
  ASSERT_TRUE(answers.Wait());
  EXPECT_EQ(answers.answer.verdict, Verdict::kUnknown);
  EXPECT_EQ(answers.answer.detail, "no answer within 200 ms (resolving the DID)");
  EXPECT_EQ(net.pds.requests(), 0);
}

}  // namespace
}  // namespace atfill::sources
