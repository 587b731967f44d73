// The network-free parts of net/: host keys, the SSRF guard, retry and rate-limit waits, XRPC
// error classification and option validation.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstring>
#include <string>

#include "net/endpoint.hpp"
#include "net/http_client.hpp"
#include "net/retry_policy.hpp"
#include "net/xrpc_error.hpp"

namespace atfill::net {
namespace {

TEST(HostKeyTest, NormalisesSchemeHostAndPort) {
  struct Case {
    const char* url;
    const char* key;
  };
  const Case cases[] = {
      {"https://PDS.Example.com/xrpc/com.atproto.sync.getRepo?did=x",
       "https://pds.example.com:443"},
      {"http://example.com", "http://example.com:80"},
      {"HTTP://127.0.0.1:8080/a", "http://127.0.0.1:8080"},
      {"https://[::1]:2583/", "https://[::1]:2583"},
  };
  for (const Case& c : cases) {
    Result<std::string> key = HostKey(c.url);
    ASSERT_TRUE(key.ok()) << c.url << ": " << key.status().ToString();
    EXPECT_EQ(*key, c.key) << c.url;
  }
}

TEST(HostKeyTest, RejectsWhatIsNotHttp) {
  for (const char* url :
       {"file:///etc/passwd", "ftp://example.com/", "gopher://x/", "", "not a url", "http://",
        "https://:443/", "http://[::1/", "//example.com/"}) {
    Result<std::string> key = HostKey(url);
    EXPECT_FALSE(key.ok()) << url;
    EXPECT_EQ(key.status().code(), StatusCode::kInvalid) << url;
  }
  EXPECT_NE(HostKey("file:///etc/passwd").status().message().find("only http and https"),
            std::string::npos);
}

Status CheckLiteral(const char* text) {
  sockaddr_in v4{};
  if (inet_pton(AF_INET, text, &v4.sin_addr) == 1) {
    v4.sin_family = AF_INET;
    return CheckPublicAddress(reinterpret_cast<const sockaddr*>(&v4), sizeof(v4));
  }
  sockaddr_in6 v6{};
  EXPECT_EQ(inet_pton(AF_INET6, text, &v6.sin6_addr), 1) << text;
  v6.sin6_family = AF_INET6;
  return CheckPublicAddress(reinterpret_cast<const sockaddr*>(&v6), sizeof(v6));
}

TEST(CheckPublicAddressTest, RefusesEveryNonPublicClass) {
  struct Case {
    const char* address;
    const char* cls;
  };
  const Case refused[] = {
      {"0.0.0.0", "unspecified"},
      {"127.0.0.1", "loopback"},
      {"127.255.0.9", "loopback"},
      {"10.1.2.3", "private"},
      {"172.16.0.1", "private"},
      {"172.31.255.255", "private"},
      {"192.168.1.1", "private"},
      {"169.254.169.254", "link-local"},
      {"100.64.0.1", "shared (CGNAT)"},
      {"100.127.255.254", "shared (CGNAT)"},
      {"224.0.0.1", "multicast"},
      {"239.255.255.250", "multicast"},
      {"255.255.255.255", "broadcast"},
      {"240.0.0.1", "reserved"},
      {"192.0.2.7", "reserved"},
      {"::", "unspecified"},
      {"::1", "loopback"},
      {"fc00::1", "private"},
      {"fd12:3456::1", "private"},
      {"fe80::1", "link-local"},
      {"febf::1", "link-local"},
      {"ff02::1", "multicast"},
      {"::ffff:127.0.0.1", "loopback"},
      {"::ffff:10.0.0.1", "private"},
      {"64:ff9b::a9fe:a9fe", "link-local"},
      {"2001:db8::1", "reserved"},
  };
  for (const Case& c : refused) {
    Status st = CheckLiteral(c.address);
    EXPECT_EQ(st.code(), StatusCode::kInvalid) << c.address;
    EXPECT_NE(st.message().find(c.cls), std::string::npos) << c.address << ": " << st.message();
  }
  for (const char* ok :
       {"1.1.1.1", "8.8.8.8", "172.15.255.255", "172.32.0.1", "100.63.255.255", "100.128.0.1",
        "169.253.0.1", "2606:4700:4700::1111", "::ffff:93.184.216.34", "2a01:4f8::1"}) {
    EXPECT_TRUE(CheckLiteral(ok).ok()) << ok << ": " << CheckLiteral(ok).ToString();
  }
}

TEST(CheckPublicAddressTest, RefusesOtherFamiliesAndShortAddresses) {
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  EXPECT_FALSE(CheckPublicAddress(reinterpret_cast<const sockaddr*>(&v4), 4).ok());
  sockaddr unix_like{};
  unix_like.sa_family = AF_UNIX;
  EXPECT_FALSE(CheckPublicAddress(&unix_like, sizeof(unix_like)).ok());
  EXPECT_FALSE(CheckPublicAddress(nullptr, 0).ok());
}

TEST(CheckPublicEndpointTest, LoopbackRefusedUnlessAllowed) {
  Status refused = CheckPublicEndpoint("http://127.0.0.1:2583/xrpc/x", false);
  EXPECT_EQ(refused.code(), StatusCode::kInvalid);
  EXPECT_NE(refused.message().find("loopback"), std::string::npos) << refused.message();
  EXPECT_TRUE(CheckPublicEndpoint("http://127.0.0.1:2583/xrpc/x", true).ok());

  // "localhost" resolves through /etc/hosts, without a network.
  EXPECT_EQ(CheckPublicEndpoint("http://localhost:2583/", false).code(), StatusCode::kInvalid);
  for (const char* url :
       {"http://10.0.0.1/", "https://[::1]/", "http://169.254.169.254/latest", "http://100.64.1.1/",
        "https://[fe80::1]/", "http://[::ffff:127.0.0.1]/", "http://0.0.0.0:80/"}) {
    EXPECT_EQ(CheckPublicEndpoint(url, false).code(), StatusCode::kInvalid) << url;
  }
  // Public IP literals need no DNS.
  EXPECT_TRUE(CheckPublicEndpoint("https://1.1.1.1/", false).ok());
  EXPECT_TRUE(CheckPublicEndpoint("http://[2606:4700:4700::1111]:8080/", false).ok());
}

TEST(CheckPublicEndpointTest, NonHttpSchemesRefusedEvenWhenPrivateAllowed) {
  for (bool allow : {false, true}) {
    for (const char* url :
         {"file:///etc/passwd", "ftp://1.1.1.1/", "gopher://1.1.1.1/", "dict://127.0.0.1:11211/"}) {
      Status st = CheckPublicEndpoint(url, allow);
      EXPECT_EQ(st.code(), StatusCode::kInvalid) << url;
      EXPECT_NE(st.message().find("only http and https"), std::string::npos) << st.message();
    }
  }
}

TEST(BackoffTest, FullJitterWithinDoublingCeiling) {
  RetryPolicy policy;
  policy.base_backoff_ms = 250;
  policy.max_backoff_ms = 30'000;
  EXPECT_EQ(BackoffDelayMs(policy, 1, 0.0), 0);
  EXPECT_EQ(BackoffDelayMs(policy, 1, 0.999999), 250);
  EXPECT_EQ(BackoffDelayMs(policy, 2, 0.999999), 500);
  EXPECT_EQ(BackoffDelayMs(policy, 3, 0.5), 500);
  EXPECT_EQ(BackoffDelayMs(policy, 8, 0.999999), 30'000);   // 250 * 128 = 32000, capped
  EXPECT_EQ(BackoffDelayMs(policy, 60, 0.999999), 30'000);  // no overflow for many retries
  for (int retry = 1; retry <= 10; ++retry) {
    for (double u : {0.0, 0.1, 0.5, 0.9, 0.999}) {
      const int64_t d = BackoffDelayMs(policy, retry, u);
      EXPECT_GE(d, 0);
      EXPECT_LE(d, 30'000);
    }
  }
  policy.base_backoff_ms = 0;
  policy.max_backoff_ms = 0;
  EXPECT_EQ(BackoffDelayMs(policy, 3, 0.9), 0);
}

constexpr int64_t kNowMs = 1'700'000'000'000;  // 2023-11-14T22:13:20Z, a whole second

TEST(RateLimitWaitTest, RateLimitResetIsUnixSeconds) {
  RateLimitPolicy policy;
  EXPECT_EQ(RateLimitWaitMs(policy, "1700000001", "", kNowMs), 1000);
  EXPECT_EQ(RateLimitWaitMs(policy, " 1700000030 ", "7", kNowMs), 30'000);  // wins over Retry-After
  EXPECT_EQ(RateLimitWaitMs(policy, "1700086400", "", kNowMs), 120'000);    // capped
}

TEST(RateLimitWaitTest, FallsBackToRetryAfterThenDefault) {
  RateLimitPolicy policy;
  EXPECT_EQ(RateLimitWaitMs(policy, "", "7", kNowMs), 7000);
  EXPECT_EQ(RateLimitWaitMs(policy, "1699999999", "3", kNowMs), 3000);  // reset in the past
  EXPECT_EQ(RateLimitWaitMs(policy, "soon", "2", kNowMs), 2000);        // reset malformed
  EXPECT_EQ(RateLimitWaitMs(policy, "", "0", kNowMs), 0);
  EXPECT_EQ(RateLimitWaitMs(policy, "", "99999999999999999999999", kNowMs), 120'000);
  // An HTTP-date 90 s after kNowMs.
  EXPECT_EQ(RateLimitWaitMs(policy, "", "Tue, 14 Nov 2023 22:14:50 GMT", kNowMs), 90'000);
  EXPECT_EQ(RateLimitWaitMs(policy, "", "", kNowMs), 5000);
  EXPECT_EQ(RateLimitWaitMs(policy, "", "later", kNowMs), 5000);
  EXPECT_EQ(RateLimitWaitMs(policy, "", "-5", kNowMs), 5000);
  EXPECT_EQ(RateLimitWaitMs(policy, "", "Tue, 14 Nov 2023 22:00:00 GMT", kNowMs), 5000);  // past
  policy.default_wait_ms = 250;
  policy.max_wait_ms = 1000;
  EXPECT_EQ(RateLimitWaitMs(policy, "", "", kNowMs), 250);
  EXPECT_EQ(RateLimitWaitMs(policy, "", "60", kNowMs), 1000);
}

TEST(RateLimitWaitTest, ParseRetryAfter) {
  EXPECT_EQ(ParseRetryAfterMs("120", kNowMs), 120'000);
  EXPECT_EQ(ParseRetryAfterMs("Tue, 14 Nov 2023 22:13:21 GMT", kNowMs), 1000);
  EXPECT_EQ(ParseRetryAfterMs("Tuesday, 14-Nov-23 22:13:25 GMT", kNowMs), 5000);  // RFC 850
  EXPECT_EQ(ParseRetryAfterMs("", kNowMs), -1);
  EXPECT_EQ(ParseRetryAfterMs("1.5", kNowMs), -1);
  EXPECT_EQ(ParseRetryAfterMs(std::string(100, '9') + "x", kNowMs), -1);
}

TEST(XrpcErrorTest, ParsesErrorAndMessage) {
  XrpcError e =
      ParseXrpcError(R"({"error":"RepoNotFound","message":"Could not find repo: did:plc:x"})");
  EXPECT_EQ(e.error, "RepoNotFound");
  EXPECT_EQ(e.message, "Could not find repo: did:plc:x");
  e = ParseXrpcError(R"({"error":"InvalidRequest"})");
  EXPECT_EQ(e.error, "InvalidRequest");
  EXPECT_EQ(e.message, "");
  for (const char* body : {"", "not json", "[]", "{}", R"({"error":42})", R"({"message":"x"})",
                           "<html>502 Bad Gateway</html>", R"({"error":"RepoNotFound")"}) {
    EXPECT_EQ(ParseXrpcError(body).error, "") << body;
  }
}

// An account's state is an outcome of the crawl; a refused request (InvalidRequest) is an error.
TEST(XrpcErrorTest, AccountStatesAreTheFinalAnswersThatNameTheAccount) {
  auto state_for = [](int status, const char* error) {
    return IsAccountStateXrpcError(status, XrpcError{error, ""});
  };
  EXPECT_TRUE(state_for(400, "RepoNotFound"));
  EXPECT_TRUE(state_for(404, "RepoNotFound"));
  EXPECT_TRUE(state_for(400, "RepoTakendown"));
  EXPECT_TRUE(state_for(400, "RepoDeactivated"));
  EXPECT_TRUE(state_for(400, "RepoSuspended"));
  EXPECT_FALSE(state_for(400, "InvalidRequest"));
  EXPECT_FALSE(state_for(500, "RepoDeactivated"));
  EXPECT_FALSE(state_for(429, "RepoTakendown"));
  EXPECT_FALSE(state_for(401, "AuthRequired"));
  EXPECT_FALSE(state_for(200, "RepoNotFound"));
}

TEST(XrpcErrorTest, FinalForDefinitiveAnswersOnly) {
  auto final_for = [](int status, const char* error) {
    return IsFinalXrpcError(status, XrpcError{error, ""});
  };
  EXPECT_TRUE(final_for(404, "RepoNotFound"));
  EXPECT_TRUE(final_for(400, "RepoNotFound"));
  EXPECT_TRUE(final_for(400, "InvalidRequest"));
  EXPECT_TRUE(final_for(400, "RepoTakendown"));
  EXPECT_TRUE(final_for(400, "RepoDeactivated"));
  EXPECT_TRUE(final_for(400, "RepoSuspended"));
  EXPECT_FALSE(final_for(500, "RepoNotFound"));
  EXPECT_FALSE(final_for(502, "InternalServerError"));
  EXPECT_FALSE(final_for(429, "RateLimitExceeded"));
  EXPECT_FALSE(final_for(429, "InvalidRequest"));
  EXPECT_FALSE(final_for(408, "InvalidRequest"));
  EXPECT_FALSE(final_for(401, "AuthRequired"));
  EXPECT_FALSE(final_for(404, ""));
  EXPECT_FALSE(final_for(200, "RepoNotFound"));

  HttpResponse response;
  response.status = 404;
  response.body = R"({"error":"RepoNotFound","message":"nope"})";
  EXPECT_TRUE(IsFinalXrpcError(response));
  response.status = 503;
  EXPECT_FALSE(IsFinalXrpcError(response));
  response.status = 404;
  response.body = "<html>Not Found</html>";
  EXPECT_FALSE(IsFinalXrpcError(response));
}

TEST(HttpResponseTest, HeaderLookupIgnoresCase) {
  HttpResponse response;
  response.headers = {{"content-type", "application/json"}, {"ratelimit-reset", "17"}};
  EXPECT_EQ(response.Header("Content-Type"), "application/json");
  EXPECT_EQ(response.content_type(), "application/json");
  EXPECT_EQ(response.ratelimit_reset(), "17");
  EXPECT_EQ(response.retry_after(), "");
}

TEST(HttpClientOptionsTest, DefaultsAreValid) {
  HttpClientOptions options;
  EXPECT_TRUE(options.Validate().ok());
  EXPECT_EQ(options.max_in_flight, 192);
  EXPECT_EQ(options.max_per_host, 3);
  EXPECT_EQ(options.max_hosts, 64);
  EXPECT_EQ(options.connect_timeout_ms, 10'000);
  EXPECT_EQ(options.timeout_ms, 30'000);
  EXPECT_EQ(options.max_response_bytes, uint64_t{64} << 20);
  EXPECT_EQ(options.retry.max_attempts, 5);
  EXPECT_EQ(options.retry.base_backoff_ms, 250);
  EXPECT_EQ(options.retry.max_backoff_ms, 30'000);
  EXPECT_EQ(options.rate_limit.default_wait_ms, 5'000);
  EXPECT_EQ(options.rate_limit.max_wait_ms, 120'000);
  EXPECT_EQ(options.host_failure_threshold, 5);
  EXPECT_FALSE(options.allow_private_addresses);
}

TEST(HttpClientOptionsTest, ValidateNamesTheBadField) {
  struct Case {
    void (*mutate)(HttpClientOptions&);
    const char* field;
  };
  const Case cases[] = {
      {[](HttpClientOptions& o) { o.max_in_flight = 0; }, "max_in_flight"},
      {[](HttpClientOptions& o) { o.max_per_host = -1; }, "max_per_host"},
      {[](HttpClientOptions& o) { o.max_hosts = 0; }, "max_hosts"},
      {[](HttpClientOptions& o) { o.connect_timeout_ms = 0; }, "connect_timeout_ms"},
      {[](HttpClientOptions& o) { o.timeout_ms = -5; }, "timeout_ms"},
      {[](HttpClientOptions& o) { o.max_response_bytes = 0; }, "max_response_bytes"},
      {[](HttpClientOptions& o) { o.max_redirects = -1; }, "max_redirects"},
      {[](HttpClientOptions& o) { o.host_failure_threshold = 0; }, "host_failure_threshold"},
      {[](HttpClientOptions& o) { o.host_down_ms = -1; }, "host_down_ms"},
      {[](HttpClientOptions& o) { o.retry.max_attempts = 0; }, "max_attempts"},
      {[](HttpClientOptions& o) { o.retry.max_backoff_ms = 10; }, "max_backoff_ms"},
      {[](HttpClientOptions& o) { o.rate_limit.max_wait_ms = 1; }, "max_wait_ms"},
      {[](HttpClientOptions& o) { o.user_agent = "x\r\nInjected: 1"; }, "user_agent"},
  };
  for (const Case& c : cases) {
    HttpClientOptions options;
    c.mutate(options);
    Status st = options.Validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalid) << c.field;
    EXPECT_NE(st.message().find(c.field), std::string::npos) << st.message();
    EXPECT_FALSE(HttpClient::Start(options).ok()) << c.field;
  }
}

}  // namespace
}  // namespace atfill::net
