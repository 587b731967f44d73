// HttpClient against loopback test servers: limits, keep-alive, retries, 429 cooldowns, the host
// circuit breaker, caps, the SSRF guard and shutdown. Synchronisation is by futures, server-side
// holds and condition variables; the only timing assertions are cooldown lower bounds.
#include "net/http_client.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "net/endpoint.hpp"
#include "net/xrpc_error.hpp"
#include "tests/common/http_test_server.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::net {
namespace {

using std::chrono::milliseconds;
using testing::ConcurrencyGauge;
using testing::HttpTestServer;
using testing::TestRequest;
using testing::TestResponse;

constexpr milliseconds kWait{10'000};  // bound on every wait; tests finish far sooner

HttpClientOptions TestOptions() {
  HttpClientOptions o;
  o.version = "9.9.9";
  o.allow_private_addresses = true;
  o.connect_timeout_ms = 2'000;
  o.timeout_ms = 5'000;
  o.retry.base_backoff_ms = 5;
  o.retry.max_backoff_ms = 20;
  o.random_seed = 42;
  return o;
}

std::unique_ptr<HttpClient> StartClient(HttpClientOptions options) {
  Result<std::unique_ptr<HttpClient>> client = HttpClient::Start(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(*client) : nullptr;
}

HttpRequest Get(std::string url) {
  HttpRequest r;
  r.url = std::move(url);
  return r;
}

// Collects callback outcomes by index; must outlive the client that calls into it.
class Outcomes {
 public:
  explicit Outcomes(size_t n) : results_(n) {}

  HttpCallback At(size_t i) {
    return [this, i](Result<HttpResponse> r) {
      std::lock_guard lock(mu_);
      results_[i].emplace(std::move(r));
      ++done_;
      changed_.notify_all();
    };
  }

  bool WaitAll(milliseconds timeout = kWait) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, timeout, [&] { return done_ == results_.size(); });
  }

  size_t done() const {
    std::lock_guard lock(mu_);
    return done_;
  }

  const Result<HttpResponse>& operator[](size_t i) const {
    std::lock_guard lock(mu_);
    return *results_[i];
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::optional<Result<HttpResponse>>> results_;
  size_t done_ = 0;
};

milliseconds Between(const TestRequest& a, const TestRequest& b) {
  return std::chrono::duration_cast<milliseconds>(b.arrived - a.arrived);
}

TEST(HttpClientTest, GetReturnsStatusBodyAndHeaders) {
  HttpTestServer server([](const TestRequest& req) {
    TestResponse r = testing::JsonResponse(200, R"({"path":")" + req.target + R"("})");
    r.headers.emplace_back("X-Trace", "abc");
    return r;
  });
  auto client = StartClient(TestOptions());
  ASSERT_TRUE(client);
  HttpRequest request = Get(server.Url("/xrpc/com.atproto.sync.listRepos?limit=5"));
  request.headers.emplace_back("Accept", "application/json");
  request.headers.emplace_back("X-Atfill-Test", "yes");
  Result<HttpResponse> response = client->Fetch(request);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, R"({"path":"/xrpc/com.atproto.sync.listRepos?limit=5"})");
  EXPECT_EQ(response->content_type(), "application/json");
  EXPECT_EQ(response->Header("X-TRACE"), "abc");
  EXPECT_EQ(response->attempts, 1);
  EXPECT_EQ(response->effective_url, request.url);
  EXPECT_TRUE(response->last_transport_error.empty());

  ASSERT_EQ(server.requests(), 1);
  const TestRequest seen = server.received()[0];
  EXPECT_EQ(seen.method, "GET");
  EXPECT_EQ(seen.Header("user-agent"), "atfill/9.9.9 (+https://github.com/atfill)");
  EXPECT_EQ(seen.Header("x-atfill-test"), "yes");
  EXPECT_EQ(seen.Header("accept"), "application/json");

  const HttpClientStats stats = client->stats();
  EXPECT_EQ(stats.submitted, 1u);
  EXPECT_EQ(stats.completed, 1u);
  EXPECT_EQ(stats.responses_2xx, 1u);
  EXPECT_EQ(stats.bytes_received, response->body.size());
  EXPECT_EQ(stats.in_flight, 0);
  EXPECT_EQ(stats.queued, 0);
}

TEST(HttpClientTest, PostSendsBodyAndHeaders) {
  HttpTestServer server([](const TestRequest& req) {
    return testing::JsonResponse(201, "echo:" + req.method + ":" + req.body);
  });
  auto client = StartClient(TestOptions());
  ASSERT_TRUE(client);
  HttpRequest request;
  request.method = "POST";
  request.url = server.Url("/xrpc/com.atproto.repo.createRecord");
  request.body = std::string(5000, 'b') + R"({"k":"v"})";  // large enough to tempt Expect: 100
  request.headers.emplace_back("Content-Type", "application/json");
  Result<HttpResponse> response = client->Fetch(request);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 201);
  EXPECT_EQ(response->body, "echo:POST:" + request.body);
  const TestRequest seen = server.received().at(0);
  EXPECT_EQ(seen.method, "POST");
  EXPECT_EQ(seen.body, request.body);
  EXPECT_EQ(seen.Header("content-type"), "application/json");
  EXPECT_EQ(seen.Header("expect"), "");
  EXPECT_EQ(client->stats().bytes_sent, request.body.size());

  HttpRequest put = request;
  put.method = "PUT";
  put.body = "x";
  Result<HttpResponse> put_response = client->Fetch(put);
  ASSERT_TRUE(put_response.ok()) << put_response.status().ToString();
  EXPECT_EQ(put_response->body, "echo:PUT:x");
}

TEST(HttpClientTest, InvalidRequestsFailWithoutTraffic) {
  HttpTestServer server([](const TestRequest&) { return testing::JsonResponse(200, "{}"); });
  auto client = StartClient(TestOptions());
  ASSERT_TRUE(client);
  HttpRequest bad_method = Get(server.Url());
  bad_method.method = "GE T";
  HttpRequest bad_header = Get(server.Url());
  bad_header.headers.emplace_back("X-Evil", "a\r\nInjected: 1");
  for (const HttpRequest& request : {Get("file:///etc/passwd"), Get("ftp://127.0.0.1/"),
                                     Get("not a url"), bad_method, bad_header}) {
    Result<HttpResponse> response = client->Fetch(request);
    ASSERT_FALSE(response.ok()) << request.url;
    EXPECT_EQ(response.status().code(), StatusCode::kInvalid) << response.status().ToString();
  }
  EXPECT_EQ(server.requests(), 0);
}

TEST(HttpClientTest, KeepAliveReusesOneConnection) {
  HttpTestServer server([](const TestRequest&) { return testing::JsonResponse(200, "{}"); });
  auto client = StartClient(TestOptions());
  ASSERT_TRUE(client);
  for (int i = 0; i < 10; ++i) {
    Result<HttpResponse> response = client->Fetch(Get(server.Url("/r" + std::to_string(i))));
    ASSERT_TRUE(response.ok()) << response.status().ToString();
    EXPECT_EQ(response->status, 200);
  }
  EXPECT_EQ(server.requests(), 10);
  EXPECT_EQ(server.connections(), 1);
}

TEST(HttpClientTest, PerHostLimitHoldsWhileAnotherHostProceeds) {
  HttpTestServer busy([](const TestRequest&) { return testing::JsonResponse(200, "busy"); });
  HttpTestServer other([](const TestRequest&) { return testing::JsonResponse(200, "other"); });
  busy.SetHold(true);
  HttpClientOptions options = TestOptions();
  options.max_per_host = 3;
  constexpr size_t kBusy = 10;
  Outcomes outcomes(kBusy);
  auto client = StartClient(options);
  ASSERT_TRUE(client);
  for (size_t i = 0; i < kBusy; ++i) client->Submit(Get(busy.Url()), outcomes.At(i));
  ASSERT_TRUE(busy.WaitForHeld(3, kWait));

  // The busy host is saturated; another host is not held back by it.
  for (int i = 0; i < 3; ++i) {
    Result<HttpResponse> response = client->Fetch(Get(other.Url()));
    ASSERT_TRUE(response.ok()) << response.status().ToString();
    EXPECT_EQ(response->body, "other");
  }
  EXPECT_EQ(busy.held(), 3);
  EXPECT_EQ(busy.max_concurrent(), 3);
  EXPECT_EQ(outcomes.done(), 0u);
  const HostStatus state = client->HostState(busy.HostKey());
  EXPECT_TRUE(state.known);
  EXPECT_EQ(state.in_flight, 3);
  EXPECT_EQ(state.queued, static_cast<int>(kBusy) - 3);

  busy.SetHold(false);
  ASSERT_TRUE(outcomes.WaitAll());
  for (size_t i = 0; i < kBusy; ++i) {
    ASSERT_TRUE(outcomes[i].ok()) << outcomes[i].status().ToString();
    EXPECT_EQ(outcomes[i]->body, "busy");
  }
  EXPECT_EQ(busy.requests(), static_cast<int64_t>(kBusy));
  EXPECT_EQ(busy.max_concurrent(), 3);  // never above max_per_host over the whole run
  EXPECT_LE(busy.connections(), 3);
}

TEST(HttpClientTest, GlobalCapBoundsAllHosts) {
  auto gauge = std::make_shared<ConcurrencyGauge>();
  auto ok = [](const TestRequest&) { return testing::JsonResponse(200, "{}"); };
  HttpTestServer a(ok, gauge), b(ok, gauge), c(ok, gauge);
  for (HttpTestServer* s : {&a, &b, &c}) s->SetHold(true);
  HttpClientOptions options = TestOptions();
  options.max_in_flight = 4;
  options.max_per_host = 3;
  Outcomes outcomes(9);
  auto client = StartClient(options);
  ASSERT_TRUE(client);
  size_t n = 0;
  for (HttpTestServer* s : {&a, &b, &c}) {
    for (int i = 0; i < 3; ++i) client->Submit(Get(s->Url()), outcomes.At(n++));
  }
  ASSERT_TRUE(gauge->WaitForCurrent(4, kWait));
  const HttpClientStats stats = client->stats();
  EXPECT_EQ(stats.in_flight, 4);
  EXPECT_EQ(stats.queued, 5);
  EXPECT_EQ(gauge->current(), 4);
  for (HttpTestServer* s : {&a, &b, &c}) s->SetHold(false);
  ASSERT_TRUE(outcomes.WaitAll());
  for (size_t i = 0; i < 9; ++i) EXPECT_TRUE(outcomes[i].ok()) << outcomes[i].status().ToString();
  EXPECT_EQ(gauge->max(), 4);
  for (HttpTestServer* s : {&a, &b, &c}) {
    EXPECT_LE(s->max_concurrent(), 3);
    EXPECT_EQ(s->requests(), 3);
  }
}

TEST(HttpClientTest, MaxHostsBoundsDistinctActiveHosts) {
  auto ok = [](const TestRequest&) { return testing::JsonResponse(200, "{}"); };
  HttpTestServer a(ok), b(ok);
  a.SetHold(true);
  HttpClientOptions options = TestOptions();
  options.max_hosts = 1;
  Outcomes outcomes(3);
  auto client = StartClient(options);
  ASSERT_TRUE(client);
  client->Submit(Get(a.Url()), outcomes.At(0));
  ASSERT_TRUE(a.WaitForHeld(1, kWait));
  client->Submit(Get(b.Url()), outcomes.At(1));
  client->Submit(Get(a.Url()), outcomes.At(2));  // same active host: allowed
  ASSERT_TRUE(a.WaitForHeld(2, kWait));
  EXPECT_EQ(client->HostState(b.HostKey()).in_flight, 0);
  EXPECT_EQ(client->HostState(b.HostKey()).queued, 1);
  EXPECT_EQ(client->stats().active_hosts, 1);
  EXPECT_EQ(b.requests(), 0);
  a.SetHold(false);
  ASSERT_TRUE(outcomes.WaitAll());
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(outcomes[i].ok()) << outcomes[i].status().ToString();
  EXPECT_EQ(b.requests(), 1);
}

constexpr int64_t kFakeNowMs = 1'700'000'000'000;  // a whole second, so waits are exact

TEST(HttpClientTest, RateLimitResetCoolsDownTheWholeHost) {
  std::atomic<int> calls{0};
  HttpTestServer limited([&](const TestRequest&) {
    if (calls.fetch_add(1) == 0) {
      return testing::RateLimitedResponse(kFakeNowMs / 1000 + 1, std::nullopt);
    }
    return testing::JsonResponse(200, "{}");
  });
  HttpTestServer other([](const TestRequest&) { return testing::JsonResponse(200, "{}"); });
  HttpClientOptions options = TestOptions();
  options.max_per_host = 1;  // the second request waits behind the first
  options.now_unix_ms = [] { return kFakeNowMs; };
  Outcomes outcomes(2);
  auto client = StartClient(options);
  ASSERT_TRUE(client);
  client->Submit(Get(limited.Url("/x")), outcomes.At(0));
  client->Submit(Get(limited.Url("/y")), outcomes.At(1));
  ASSERT_TRUE(limited.WaitForRequests(1, kWait));

  // Another host is not cooled down.
  Result<HttpResponse> elsewhere = client->Fetch(Get(other.Url()));
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status().ToString();
  EXPECT_EQ(outcomes.done(), 0u);

  ASSERT_TRUE(outcomes.WaitAll());
  ASSERT_TRUE(outcomes[0].ok()) << outcomes[0].status().ToString();
  ASSERT_TRUE(outcomes[1].ok()) << outcomes[1].status().ToString();
  EXPECT_EQ(outcomes[0]->status, 200);
  EXPECT_EQ(outcomes[0]->attempts, 2);
  EXPECT_EQ(outcomes[1]->attempts, 1);
  const std::vector<TestRequest> seen = limited.received();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].target, "/x");
  EXPECT_EQ(seen[1].target, "/x");  // the retry goes first once the cooldown ends
  EXPECT_EQ(seen[2].target, "/y");
  // Reset is 1 s after the (fake) now: neither request may reach the host sooner. The upper
  // bound shows RateLimit-Reset was used rather than the 5 s default.
  EXPECT_GE(Between(seen[0], seen[1]), milliseconds(950));
  EXPECT_GE(Between(seen[0], seen[2]), milliseconds(950));
  EXPECT_LT(Between(seen[0], seen[1]), milliseconds(4'000));
  EXPECT_EQ(client->stats().rate_limited, 1u);
  EXPECT_EQ(client->stats().retries, 1u);
}

TEST(HttpClientTest, RetryAfterSecondsHonoured) {
  std::atomic<int> calls{0};
  HttpTestServer server([&](const TestRequest&) {
    if (calls.fetch_add(1) == 0) return testing::RateLimitedResponse(std::nullopt, "1");
    return testing::JsonResponse(200, "{}");
  });
  auto client = StartClient(TestOptions());
  ASSERT_TRUE(client);
  Result<HttpResponse> response = client->Fetch(Get(server.Url()));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->attempts, 2);
  const std::vector<TestRequest> seen = server.received();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_GE(Between(seen[0], seen[1]), milliseconds(950));
  EXPECT_LT(Between(seen[0], seen[1]), milliseconds(4'000));
}

TEST(HttpClientTest, RateLimitedUntilAttemptsRunOutReturnsThe429) {
  HttpTestServer server(
      [](const TestRequest&) { return testing::RateLimitedResponse(std::nullopt, "0"); });
  HttpClientOptions options = TestOptions();
  options.retry.max_attempts = 3;
  auto client = StartClient(options);
  ASSERT_TRUE(client);
  Result<HttpResponse> response = client->Fetch(Get(server.Url()));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 429);
  EXPECT_EQ(response->attempts, 3);
  EXPECT_EQ(ParseXrpcError(*response).error, "RateLimitExceeded");
  EXPECT_FALSE(IsFinalXrpcError(*response));
  EXPECT_EQ(server.requests(), 3);
}

TEST(HttpClientTest, QuotaExhaustedResponseStartsCooldown) {
  HttpTestServer server([](const TestRequest&) {
    TestResponse r = testing::JsonResponse(200, "{}");
    r.headers.emplace_back("RateLimit-Remaining", "0");
    r.headers.emplace_back("RateLimit-Reset", std::to_string(kFakeNowMs / 1000 + 2));
    return r;
  });
  HttpClientOptions options = TestOptions();
  options.now_unix_ms = [] { return kFakeNowMs; };
  auto client = StartClient(options);
  ASSERT_TRUE(client);
  Result<HttpResponse> response = client->Fetch(Get(server.Url()));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->ratelimit_remaining(), "0");
  // The cooldown is set before the callback runs, so it is visible now.
  const HostStatus state = client->HostState(server.HostKey());
  EXPECT_TRUE(state.known);
  EXPECT_GT(state.cooldown_remaining_ms, 0);
  EXPECT_LE(state.cooldown_remaining_ms, 2'000);
}

TEST(HttpClientTest, ServerErrorsRetriedThenSucceed) {
  std::atomic<int> calls{0};
  HttpTestServer server([&](const TestRequest&) {
    if (calls.fetch_add(1) < 2) return testing::XrpcErrorResponse(503, "Unavailable", "busy");
    return testing::JsonResponse(200, "ok");
  });
  auto client = StartClient(TestOptions());
  ASSERT_TRUE(client);
  Result<HttpResponse> response = client->Fetch(Get(server.Url()));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "ok");
  EXPECT_EQ(response->attempts, 3);
  EXPECT_EQ(server.requests(), 3);
  const HttpClientStats stats = client->stats();
  EXPECT_EQ(stats.retries, 2u);
  EXPECT_EQ(stats.responses_5xx, 2u);
  EXPECT_EQ(stats.responses_2xx, 1u);
  EXPECT_EQ(client->HostState(server.HostKey()).consecutive_failures, 0);
}

TEST(HttpClientTest, ServerErrorsExhaustedReturnTheLastResponse) {
  std::atomic<int> calls{0};
  HttpTestServer server([&](const TestRequest&) {
    return testing::JsonResponse(500, "failure " + std::to_string(calls.fetch_add(1) + 1));
  });
  HttpClientOptions options = TestOptions();
  options.retry.max_attempts = 3;
  auto client = StartClient(options);
  ASSERT_TRUE(client);
  Result<HttpResponse> response = client->Fetch(Get(server.Url()));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 500);
  EXPECT_EQ(response->body, "failure 3");
  EXPECT_EQ(response->attempts, 3);
  EXPECT_EQ(server.requests(), 3);
  EXPECT_FALSE(IsFinalXrpcError(*response));
}

TEST(HttpClientTest, PerRequestRetryPolicyOverrides) {
  HttpTestServer server([](const TestRequest&) { return testing::JsonResponse(502, "{}"); });
  auto client = StartClient(TestOptions());
  ASSERT_TRUE(client);
  HttpRequest request = Get(server.Url());
  request.retry = RetryPolicy{.max_attempts = 1, .base_backoff_ms = 0, .max_backoff_ms = 0};
  Result<HttpResponse> response = client->Fetch(request);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 502);
  EXPECT_EQ(response->attempts, 1);
  EXPECT_EQ(server.requests(), 1);
}

TEST(HttpClientTest, TimeoutIsRetried) {
  std::atomic<int> calls{0};
  HttpTestServer server([&](const TestRequest&) {
    TestResponse r = testing::JsonResponse(200, "late");
    if (calls.fetch_add(1) == 0) r.delay_ms = 5'000;
    return r;
  });
  auto client = StartClient(TestOptions());
  ASSERT_TRUE(client);
  HttpRequest request = Get(server.Url());
  request.timeout_ms = 1'000;  // generous: the second attempt must fit in it on a loaded machine
  Result<HttpResponse> response = client->Fetch(request);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->attempts, 2);
  EXPECT_NE(response->last_transport_error.find("Timeout"), std::string::npos)
      << response->last_transport_error;
  EXPECT_EQ(client->stats().transport_errors, 1u);
}

class TransportFaultTest : public ::testing::TestWithParam<TestResponse::Fault> {};

TEST_P(TransportFaultTest, FaultIsRetried) {
  std::atomic<int> calls{0};
  HttpTestServer server([&](const TestRequest&) {
    if (calls.fetch_add(1) == 0) {
      if (GetParam() == TestResponse::Fault::kDropMidBody) {
        return testing::DropMidBodyResponse(10'000);
      }
      return testing::FaultResponse(GetParam());
    }
    return testing::JsonResponse(200, "fine");
  });
  auto client = StartClient(TestOptions());
  ASSERT_TRUE(client);
  Result<HttpResponse> response = client->Fetch(Get(server.Url()));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->body, "fine");
  EXPECT_EQ(response->attempts, 2);
  EXPECT_FALSE(response->last_transport_error.empty());
  EXPECT_EQ(server.requests(), 2);
  EXPECT_EQ(client->stats().transport_errors, 1u);
}

INSTANTIATE_TEST_SUITE_P(Faults, TransportFaultTest,
                         ::testing::Values(TestResponse::Fault::kReset,
                                           TestResponse::Fault::kDropMidBody,
                                           TestResponse::Fault::kCloseWithoutResponse),
                         [](const ::testing::TestParamInfo<TestResponse::Fault>& info) {
                           switch (info.param) {
                             case TestResponse::Fault::kReset:
                               return std::string("Reset");
                             case TestResponse::Fault::kDropMidBody:
                               return std::string("DropMidBody");
                             case TestResponse::Fault::kCloseWithoutResponse:
                               return std::string("CloseWithoutResponse");
                             case TestResponse::Fault::kNone:
                               break;
                           }
                           return std::string("None");
                         });

TEST(HttpClientTest, ResponseSizeCapAbortsAndNamesTheCap) {
  HttpTestServer server([](const TestRequest& req) {
    return testing::HugeResponse(3 << 20, /*chunked=*/req.target == "/chunked");
  });
  auto client = StartClient(TestOptions());
  ASSERT_TRUE(client);
  // With Content-Length the cap trips before the body; chunked, in the write callback.
  for (const char* path : {"/sized", "/chunked"}) {
    HttpRequest request = Get(server.Url(path));
    request.max_response_bytes = 1 << 20;
    Result<HttpResponse> response = client->Fetch(request);
    ASSERT_FALSE(response.ok()) << path;
    EXPECT_EQ(response.status().code(), StatusCode::kResourceExhausted) << path;
    EXPECT_NE(response.status().message().find("cap of 1048576 bytes"), std::string::npos)
        << response.status().message();
  }
  EXPECT_EQ(server.requests(), 2);  // a cap is final: no retry

  HttpRequest fits = Get(server.Url("/chunked"));
  fits.max_response_bytes = 4 << 20;
  Result<HttpResponse> response = client->Fetch(fits);
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->body.size(), size_t{3} << 20);
}

TEST(HttpClientTest, HostDownDefersQueuedRequestsAndRecoversAfterSuccess) {
  std::atomic<bool> failing{true};
  HttpTestServer server([&](const TestRequest&) {
    return failing ? testing::JsonResponse(503, "down") : testing::JsonResponse(200, "up");
  });
  HttpClientOptions options = TestOptions();
  options.max_per_host = 1;
  options.retry.max_attempts = 1;
  options.host_failure_threshold = 5;
  options.host_down_ms = 0;  // the next new request is a probe
  constexpr size_t kRequests = 8;
  Outcomes outcomes(kRequests);
  auto client = StartClient(options);
  ASSERT_TRUE(client);
  // Every request is queued before the first answer comes back; otherwise a request submitted
  // after the host went down would be a new probe (host_down_ms is 0), not a deferred one.
  server.SetHold(true);
  for (size_t i = 0; i < kRequests; ++i) client->Submit(Get(server.Url()), outcomes.At(i));
  ASSERT_TRUE(server.WaitForHeld(1, kWait));
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return client->HostState(server.HostKey()).queued == static_cast<int>(kRequests) - 1; },
      kWait))
      << "requests never queued";
  server.SetHold(false);
  ASSERT_TRUE(outcomes.WaitAll());
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(outcomes[i].ok()) << i << ": " << outcomes[i].status().ToString();
    EXPECT_EQ(outcomes[i]->status, 503);
  }
  const std::string reason =
      "host " + server.HostKey() + " failed 5 times in a row; deferred (last error: HTTP 503)";
  for (size_t i = 5; i < kRequests; ++i) {
    ASSERT_FALSE(outcomes[i].ok()) << i;
    EXPECT_EQ(outcomes[i].status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(outcomes[i].status().message(), reason);
  }
  EXPECT_EQ(server.requests(), 5);
  HostStatus state = client->HostState(server.HostKey());
  EXPECT_TRUE(state.down);
  EXPECT_EQ(state.consecutive_failures, 5);
  EXPECT_EQ(client->stats().hosts_marked_down, 1u);
  EXPECT_EQ(client->stats().deferred, kRequests - 5);

  failing = false;
  Result<HttpResponse> probe = client->Fetch(Get(server.Url()));
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  EXPECT_EQ(probe->status, 200);
  state = client->HostState(server.HostKey());
  EXPECT_FALSE(state.down);
  EXPECT_EQ(state.consecutive_failures, 0);
  Result<HttpResponse> after = client->Fetch(Get(server.Url()));
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->status, 200);
}

TEST(HttpClientTest, UnreachableHostRetriesThenRefusesWhileDown) {
  const testing::RefusingPort refusing;
  const std::string url = refusing.Url();
  HttpClientOptions options = TestOptions();
  options.host_down_ms = 60'000;
  auto client = StartClient(options);
  ASSERT_TRUE(client);
  Result<HttpResponse> first = client->Fetch(Get(url));
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(first.status().message().find("after 5 attempts"), std::string::npos)
      << first.status().message();
  EXPECT_EQ(client->stats().transport_errors, 5u);
  EXPECT_EQ(client->stats().retries, 4u);
  const std::string key = *HostKey(url);
  EXPECT_TRUE(client->HostState(key).down);

  Result<HttpResponse> second = client->Fetch(Get(url));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("host " + key + " failed 5 times in a row; deferred"),
            std::string::npos)
      << second.status().message();
  EXPECT_EQ(client->stats().transport_errors, 5u);  // no new attempt was made
  EXPECT_EQ(client->stats().deferred, 1u);
}

TEST(HttpClientTest, XrpcRepoNotFoundIsFinalWithoutRetry) {
  HttpTestServer server([](const TestRequest&) {
    return testing::XrpcErrorResponse(404, "RepoNotFound", "Could not find repo: did:plc:abc");
  });
  auto client = StartClient(TestOptions());
  ASSERT_TRUE(client);
  Result<HttpResponse> response =
      client->Fetch(Get(server.Url("/xrpc/com.atproto.sync.getRepo?did=did:plc:abc")));
  ASSERT_TRUE(response.ok()) << response.status().ToString();
  EXPECT_EQ(response->status, 404);
  EXPECT_EQ(response->attempts, 1);
  EXPECT_EQ(server.requests(), 1);
  const XrpcError error = ParseXrpcError(*response);
  EXPECT_EQ(error.error, "RepoNotFound");
  EXPECT_EQ(error.message, "Could not find repo: did:plc:abc");
  EXPECT_TRUE(IsFinalXrpcError(*response));
  EXPECT_EQ(client->stats().retries, 0u);
}

TEST(HttpClientTest, LoopbackRefusedUnlessPrivateAddressesAllowed) {
  HttpTestServer server([](const TestRequest&) { return testing::JsonResponse(200, "{}"); });
  HttpClientOptions strict_options = TestOptions();
  strict_options.allow_private_addresses = false;
  auto strict = StartClient(strict_options);
  ASSERT_TRUE(strict);
  for (const std::string& url :
       {server.Url(), "http://localhost:" + std::to_string(server.port())}) {
    Result<HttpResponse> refused = strict->Fetch(Get(url));
    ASSERT_FALSE(refused.ok()) << url;
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalid);
    EXPECT_NE(refused.status().message().find("loopback"), std::string::npos)
        << refused.status().message();
  }
  EXPECT_EQ(server.requests(), 0);
  EXPECT_EQ(server.connections(), 0);
  EXPECT_EQ(strict->stats().retries, 0u);

  auto lenient = StartClient(TestOptions());
  ASSERT_TRUE(lenient);
  Result<HttpResponse> allowed = lenient->Fetch(Get(server.Url()));
  ASSERT_TRUE(allowed.ok()) << allowed.status().ToString();
  EXPECT_EQ(allowed->status, 200);
  EXPECT_EQ(server.requests(), 1);
}

// An endpoint from the operator's config (a relay, a PLC) is reached on loopback by a strict
// client; the next untrusted request to the same server (on a fresh client) is still refused.
TEST(HttpClientTest, ATrustedEndpointIsReachedWhereverItPoints) {
  HttpTestServer server([](const TestRequest&) { return testing::JsonResponse(200, "{}"); });
  HttpClientOptions strict_options = TestOptions();
  strict_options.allow_private_addresses = false;
  auto strict = StartClient(strict_options);
  ASSERT_TRUE(strict);
  for (const std::string& url :
       {server.Url(), "http://localhost:" + std::to_string(server.port())}) {
    HttpRequest trusted = Get(url);
    trusted.trusted_endpoint = true;
    Result<HttpResponse> reached = strict->Fetch(trusted);
    ASSERT_TRUE(reached.ok()) << url << ": " << reached.status().ToString();
    EXPECT_EQ(reached->status, 200);
  }
  auto fresh = StartClient(strict_options);
  ASSERT_TRUE(fresh);
  Result<HttpResponse> refused = fresh->Fetch(Get(server.Url()));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("loopback"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(server.requests(), 2);
}

TEST(HttpClientTest, CallbacksMaySubmitButNotFetch) {
  HttpTestServer server(
      [](const TestRequest& req) { return testing::JsonResponse(200, req.target); });
  auto client = StartClient(TestOptions());
  ASSERT_TRUE(client);
  std::promise<Status> fetch_in_callback;
  std::promise<std::string> chained;
  HttpClient* raw = client.get();
  client->Submit(Get(server.Url("/first")), [&, raw](Result<HttpResponse> first) {
    fetch_in_callback.set_value(raw->Fetch(Get(server.Url("/never"))).status());
    raw->Submit(Get(server.Url("/second")), [&, body = first.ok() ? first->body : std::string()](
                                                Result<HttpResponse> second) {
      chained.set_value(body + "+" + (second.ok() ? second->body : second.status().ToString()));
    });
  });
  ASSERT_EQ(chained.get_future().wait_for(kWait), std::future_status::ready);
  const Status fetch_status = fetch_in_callback.get_future().get();
  EXPECT_EQ(fetch_status.code(), StatusCode::kInternal);
  EXPECT_EQ(server.requests(), 2);
}

TEST(HttpClientTest, ShutdownCancelsQueuedWaitingAndRunningRequests) {
  HttpTestServer server([](const TestRequest&) { return testing::JsonResponse(200, "{}"); });
  server.SetHold(true);
  const testing::RefusingPort refusing;
  const std::string unreachable = refusing.Url();
  HttpClientOptions options = TestOptions();
  options.max_per_host = 2;
  Outcomes outcomes(5);
  auto client = StartClient(options);
  ASSERT_TRUE(client);
  for (size_t i = 0; i < 4; ++i) client->Submit(Get(server.Url()), outcomes.At(i));
  HttpRequest backing_off = Get(unreachable);
  backing_off.retry =
      RetryPolicy{.max_attempts = 5, .base_backoff_ms = 60'000, .max_backoff_ms = 60'000};
  client->Submit(backing_off, outcomes.At(4));
  ASSERT_TRUE(server.WaitForHeld(2, kWait));

  client->Shutdown();
  ASSERT_EQ(outcomes.done(), 5u);  // every callback ran before Shutdown returned
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_FALSE(outcomes[i].ok()) << i;
    EXPECT_EQ(outcomes[i].status().code(), StatusCode::kCancelled)
        << outcomes[i].status().ToString();
  }
  std::optional<Result<HttpResponse>> late;
  client->Submit(Get(server.Url()), [&](Result<HttpResponse> r) { late.emplace(std::move(r)); });
  ASSERT_TRUE(late.has_value());  // delivered at once, on this thread
  EXPECT_EQ(late->status().code(), StatusCode::kCancelled);
  client->Shutdown();  // idempotent
  const HttpClientStats stats = client->stats();
  EXPECT_EQ(stats.cancelled, 6u);
  EXPECT_EQ(stats.completed, 6u);
  EXPECT_EQ(stats.in_flight, 0);
  server.SetHold(false);
}

// After() runs its function once on the loop thread when the delay has passed, in the order of
// their times whatever the order of the calls; pending ones run when the client shuts down, and
// later ones at once on the caller's thread.
TEST(HttpClientTest, AfterRunsEachFunctionOnceWhenItsDelayHasPassed) {
  auto client = StartClient(TestOptions());
  ASSERT_TRUE(client);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> rang;
  std::vector<std::chrono::steady_clock::duration> waited;
  std::vector<std::thread::id> threads;
  const auto start = std::chrono::steady_clock::now();
  auto ring = [&](std::string name) {
    return [&, name] {
      std::lock_guard lock(mu);
      rang.push_back(name);
      waited.push_back(std::chrono::steady_clock::now() - start);
      threads.push_back(std::this_thread::get_id());
      cv.notify_all();
    };
  };
  client->After(300, ring("late"));
  client->After(100, ring("early"));
  client->After(600'000, ring("never due"));
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kWait, [&] { return rang.size() >= 2; }));
    EXPECT_EQ(rang, (std::vector<std::string>{"early", "late"}));
    EXPECT_GE(waited[0], milliseconds(100));
    EXPECT_GE(waited[1], milliseconds(300));
    EXPECT_NE(threads[0], std::this_thread::get_id());
  }
  client->Shutdown();
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(rang, (std::vector<std::string>{"early", "late", "never due"}));
    EXPECT_LT(waited[2], milliseconds(600'000));
  }
  client->After(600'000, ring("after shutdown"));
  std::lock_guard lock(mu);
  ASSERT_EQ(rang.size(), 4u);
  EXPECT_EQ(rang[3], "after shutdown");
  EXPECT_EQ(threads[3], std::this_thread::get_id());
}

// Shutting down with one request running and more queued for the same host: cancelling the
// running one must not drop the host's state while the queued ones still point at it (a crawl
// paused mid-run does exactly this; ASan caught a use after free here).
TEST(HttpClientTest, ShutdownWithRequestsQueuedBehindARunningOneOnTheSameHost) {
  HttpTestServer server([](const TestRequest&) { return testing::JsonResponse(200, "{}"); });
  server.SetHold(true);
  HttpClientOptions options = TestOptions();
  options.max_per_host = 1;
  constexpr size_t kRequests = 6;
  Outcomes outcomes(kRequests);
  auto client = StartClient(options);
  ASSERT_TRUE(client);
  for (size_t i = 0; i < kRequests; ++i) client->Submit(Get(server.Url()), outcomes.At(i));
  ASSERT_TRUE(server.WaitForHeld(1, kWait));
  client->Shutdown();
  ASSERT_EQ(outcomes.done(), kRequests);
  for (size_t i = 0; i < kRequests; ++i) {
    ASSERT_FALSE(outcomes[i].ok()) << i;
    EXPECT_EQ(outcomes[i].status().code(), StatusCode::kCancelled) << i;
  }
  EXPECT_EQ(client->stats().cancelled, kRequests);
  server.SetHold(false);
}

TEST(HttpClientTest, ManyConcurrentRequestsAllComplete) {
  std::vector<std::unique_ptr<HttpTestServer>> servers;
  for (int i = 0; i < 4; ++i) {
    servers.push_back(std::make_unique<HttpTestServer>([](const TestRequest& req) {
      return testing::DelayedResponse(testing::JsonResponse(200, req.target), 2);
    }));
  }
  HttpClientOptions options = TestOptions();
  options.max_in_flight = 8;
  constexpr size_t kCount = 200;
  Outcomes outcomes(kCount);
  auto client = StartClient(options);
  ASSERT_TRUE(client);
  for (size_t i = 0; i < kCount; ++i) {
    client->Submit(Get(servers[i % servers.size()]->Url("/" + std::to_string(i))), outcomes.At(i));
  }
  ASSERT_TRUE(outcomes.WaitAll());
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_TRUE(outcomes[i].ok()) << outcomes[i].status().ToString();
    EXPECT_EQ(outcomes[i]->body, "/" + std::to_string(i));
  }
  for (const auto& s : servers) {
    EXPECT_LE(s->max_concurrent(), 3);
    EXPECT_LE(s->connections(), 3);
  }
  EXPECT_EQ(client->stats().completed, kCount);
}

}  // namespace
}  // namespace atfill::net
