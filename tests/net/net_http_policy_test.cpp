// The parts of HttpClient's one retry policy that an archive needs (RetryPolicy's explicit
// schedule, 503s counted apart, 429s waited out up to a total cap, ByteQuotaPolicy pacing, and
// redirects followed by hand so that credentials stay on their origin), against loopback test
// servers. Waits are bounded; timing assertions are lower bounds only.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "net/http_client.hpp"
#include "net/retry_policy.hpp"
#include "tests/common/http_test_server.hpp"

namespace atfill::net {
namespace {

using Clock = std::chrono::steady_clock;
using testing::HttpTestServer;
using testing::TestRequest;
using testing::TestResponse;

int64_t MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

HttpClientOptions TestOptions() {
  HttpClientOptions o;
  o.allow_private_addresses = true;
  o.connect_timeout_ms = 2'000;
  o.timeout_ms = 5'000;
  o.retry.base_backoff_ms = 5;
  o.retry.max_backoff_ms = 20;
  o.random_seed = 7;
  o.host_failure_threshold = 1000;
  return o;
}

std::unique_ptr<HttpClient> StartClient(HttpClientOptions options) {
  auto client = HttpClient::Start(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(*client) : nullptr;
}

HttpRequest Get(std::string url) {
  HttpRequest r;
  r.url = std::move(url);
  return r;
}

TEST(RetryPolicyTest, AnExplicitScheduleReplacesTheBackoff) {
  RetryPolicy p;
  p.max_attempts = 2;
  EXPECT_EQ(MaxAttempts(p), 2);
  p.delays_ms = {100, 200, 300};
  EXPECT_EQ(MaxAttempts(p), 4);
  EXPECT_EQ(RetryDelayMs(p, 1, 0.99), 100);
  EXPECT_EQ(RetryDelayMs(p, 3, 0.0), 300);
  EXPECT_EQ(RetryDelayMs(p, 9, 0.5), 300);  // past the end: the last entry
  EXPECT_TRUE(p.Validate().ok());
  p.delays_ms = {-1};
  EXPECT_NE(p.Validate().message().find("delays_ms"), std::string::npos);
  p.delays_ms.assign(101, 1);
  EXPECT_NE(p.Validate().message().find("delays_ms"), std::string::npos);
  p.delays_ms.clear();
  p.unavailable_retries = 101;
  EXPECT_NE(p.Validate().message().find("unavailable_retries"), std::string::npos);
  p.unavailable_retries = 3;
  p.max_throttled_ms = -1;
  EXPECT_NE(p.Validate().message().find("max_throttled_ms"), std::string::npos);
  p.max_throttled_ms = 0;
  p.max_retry_after_ms = -2;
  EXPECT_NE(p.Validate().message().find("max_retry_after_ms"), std::string::npos);
}

TEST(HttpPolicyTest, TheScheduleIsWaitedAndCounted) {
  std::atomic<int> calls{0};
  HttpTestServer server([&](const TestRequest&) {
    calls.fetch_add(1);
    return testing::JsonResponse(500, "{}");
  });
  HttpClientOptions o = TestOptions();
  o.retry.max_attempts = 10;  // ignored: the schedule has two retries
  o.retry.delays_ms = {150, 250};
  auto client = StartClient(o);
  ASSERT_TRUE(client);
  const auto start = Clock::now();
  auto r = client->Fetch(Get(server.Url()));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 500);
  EXPECT_EQ(r->attempts, 3);
  EXPECT_EQ(calls.load(), 3);
  EXPECT_GE(MsSince(start), 400);
  const std::vector<TestRequest> seen = server.received();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_GE(std::chrono::duration_cast<std::chrono::milliseconds>(seen[2].arrived - seen[1].arrived)
                .count(),
            250);
  EXPECT_EQ(client->stats().retries, 2u);
  EXPECT_EQ(client->stats().attempts, 3u);
}

TEST(HttpPolicyTest, UnavailableRetriesAreCountedApart) {
  // Three 503s, then a 500, then the answer: the 503s use none of the one failure retry.
  std::atomic<int> calls{0};
  HttpTestServer server([&](const TestRequest&) {
    const int n = calls.fetch_add(1);
    if (n < 3) return testing::JsonResponse(503, "{}");
    if (n == 3) return testing::JsonResponse(500, "{}");
    return testing::JsonResponse(200, "ok");
  });
  HttpClientOptions o = TestOptions();
  o.retry.delays_ms = {10};
  o.retry.unavailable_retries = 3;
  auto client = StartClient(o);
  ASSERT_TRUE(client);
  auto r = client->Fetch(Get(server.Url()));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->attempts, 5);
  EXPECT_EQ(client->stats().retries, 4u);

  // Past its budget the 503 is the answer; a Retry-After is waited (here 1 s, under the cap).
  HttpTestServer busy([&](const TestRequest&) {
    TestResponse r = testing::JsonResponse(503, "{}");
    r.headers.emplace_back("Retry-After", "1");
    return r;
  });
  o.retry.unavailable_retries = 1;
  o.retry.max_retry_after_ms = 5'000;
  auto second = StartClient(o);
  ASSERT_TRUE(second);
  const auto start = Clock::now();
  auto answer = second->Fetch(Get(busy.Url()));
  ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  EXPECT_EQ(answer->status, 503);
  EXPECT_EQ(answer->attempts, 2);
  EXPECT_EQ(busy.requests(), 2);
  EXPECT_GE(MsSince(start), 950);
}

TEST(HttpPolicyTest, ThrottlingIsWaitedOutUpToItsCap) {
  // Eight 429s, then the answer, with one attempt allowed for failures: 429s use none.
  std::atomic<int> calls{0};
  HttpTestServer server([&](const TestRequest&) {
    if (calls.fetch_add(1) < 8) return testing::RateLimitedResponse(std::nullopt, std::nullopt);
    return testing::JsonResponse(200, "ok");
  });
  HttpClientOptions o = TestOptions();
  o.retry.max_attempts = 1;
  o.retry.max_throttled_ms = 10'000;
  o.rate_limit.default_wait_ms = 30;
  auto client = StartClient(o);
  ASSERT_TRUE(client);
  auto r = client->Fetch(Get(server.Url()));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->attempts, 9);
  EXPECT_EQ(r->throttled_ms, 8 * 30);
  EXPECT_EQ(client->stats().rate_limited, 8u);
  EXPECT_EQ(client->stats().retries, 0u) << "waiting out a 429 is not a retry";

  // Always throttled: the request gives up once it has waited the cap in all.
  HttpTestServer always([](const TestRequest&) {
    return testing::RateLimitedResponse(std::nullopt, std::string("1"));
  });
  o.retry.max_throttled_ms = 1'500;
  auto second = StartClient(o);
  ASSERT_TRUE(second);
  const auto start = Clock::now();
  auto failed = second->Fetch(Get(always.Url("/x")));
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(failed.status().message().find("throttled (HTTP 429) for 1500 ms"), std::string::npos)
      << failed.status().message();
  EXPECT_NE(failed.status().message().find(always.Url("/x")), std::string::npos);
  EXPECT_GE(MsSince(start), 1'450);
  EXPECT_EQ(always.requests(), 3);  // waits of 1000 and 500 ms, then the cap
}

TEST(HttpPolicyTest, CredentialsStayOnTheirOrigin) {
  // a/start -> b/hop (another origin) -> a/end; b answers 200 on /plain.
  std::unique_ptr<HttpTestServer> b;
  HttpTestServer a([&](const TestRequest& req) {
    if (req.target == "/start") {
      TestResponse r = testing::JsonResponse(302, "{}");
      r.headers.emplace_back("Location", b->Url("/hop"));
      return r;
    }
    if (req.target == "/post") {
      TestResponse r = testing::JsonResponse(303, "{}");
      r.headers.emplace_back("Location", "/end?from=post");
      return r;
    }
    if (req.target == "/loop") {
      TestResponse r = testing::JsonResponse(307, "{}");
      r.headers.emplace_back("Location", "/loop");
      return r;
    }
    return testing::JsonResponse(200, "end");
  });
  b = std::make_unique<HttpTestServer>([&](const TestRequest& req) {
    if (req.target == "/hop") {
      TestResponse r = testing::JsonResponse(307, "{}");
      r.headers.emplace_back("Location", a.Url("/end"));
      return r;
    }
    return testing::JsonResponse(200, "b");
  });
  HttpClientOptions o = TestOptions();
  o.max_redirects = 3;
  auto client = StartClient(o);
  ASSERT_TRUE(client);
  HttpRequest request = Get(a.Url("/start"));
  request.credentials.emplace_back("Authorization", "Bearer sekrit");
  auto r = client->Fetch(request);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "end");
  EXPECT_EQ(r->attempts, 3);
  const auto on_a = a.received();
  const auto on_b = b->received();
  ASSERT_EQ(on_a.size(), 2u);
  ASSERT_EQ(on_b.size(), 1u);
  EXPECT_EQ(on_a[0].Header("authorization"), "Bearer sekrit");
  EXPECT_EQ(on_a[1].target, "/end");
  EXPECT_EQ(on_a[1].Header("authorization"), "Bearer sekrit") << "back on its origin";
  EXPECT_EQ(on_b[0].Header("authorization"), "") << "never sent to another origin";
  EXPECT_EQ(client->stats().retries, 0u);

  // A 303 after a POST is a GET without the body.
  HttpRequest post = Get(a.Url("/post"));
  post.method = "POST";
  post.body = "{\"x\":1}";
  post.headers.emplace_back("Content-Type", "application/json");
  post.credentials.emplace_back("Authorization", "Bearer sekrit");
  auto posted = client->Fetch(post);
  ASSERT_TRUE(posted.ok()) << posted.status().ToString();
  EXPECT_EQ(posted->status, 200);
  const auto after_post = a.received();
  ASSERT_EQ(after_post.size(), 4u);
  EXPECT_EQ(after_post[3].method, "GET");
  EXPECT_EQ(after_post[3].target, "/end?from=post");
  EXPECT_EQ(after_post[3].body, "");
  EXPECT_EQ(after_post[3].Header("content-type"), "");

  // Endless redirects end.
  HttpRequest loop = Get(a.Url("/loop"));
  loop.credentials.emplace_back("Authorization", "Bearer sekrit");
  auto looped = client->Fetch(loop);
  ASSERT_FALSE(looped.ok());
  EXPECT_EQ(looped.status().code(), StatusCode::kInvalid);
  EXPECT_NE(looped.status().message().find("more than 3 redirects"), std::string::npos)
      << looped.status().message();
}

TEST(HttpPolicyTest, AnAdvertisedByteQuotaPacesTheHostForEveryClientOfTheScope) {
  constexpr uint64_t kQuota = 100'000;
  HttpTestServer server([](const TestRequest&) {
    TestResponse r = testing::HugeResponse(20'000, false);
    r.headers.emplace_back("X-Test-Quota", std::to_string(kQuota));
    return r;
  });
  HttpClientOptions o = TestOptions();
  o.quota.header = "X-Test-Quota";
  o.quota.scope = "policy-test";
  auto one = StartClient(o);
  auto two = StartClient(o);
  ASSERT_TRUE(one && two);
  const auto start = Clock::now();
  uint64_t bytes = 0;
  for (int i = 0; i < 8; ++i) {
    auto r = (i % 2 == 0 ? one : two)->Fetch(Get(server.Url()));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    bytes += r->body.size();
  }
  const int64_t ms = MsSince(start);
  ASSERT_EQ(bytes, 160'000u);
  // The first answer names the quota; the 140,000 bytes after it cannot come sooner than it
  // allows.
  EXPECT_GE(ms, 1'100);
  EXPECT_GT(one->stats().paced_ms + two->stats().paced_ms, 900);

  // A client that names no quota header is not paced.
  HttpClientOptions plain = TestOptions();
  auto three = StartClient(plain);
  ASSERT_TRUE(three);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(three->Fetch(Get(server.Url())).ok());
  EXPECT_EQ(three->stats().paced_ms, 0);
}

}  // namespace
}  // namespace atfill::net
