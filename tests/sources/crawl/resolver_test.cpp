// The DID resolver: DID document parsing and endpoint rules (pure), then resolution against a real
// in-process simnet (PLC and did:web hosts over "*.localhost" names) and against loopback test
// servers for the answers simnet does not give (5xx, holds, odd statuses). Synchronisation is by
// futures, condition variables and server-side holds, each wait bounded.
#include "sources/crawl/resolver.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "state/kv_store.hpp"
#include "state/resolver_cache.hpp"
#include "tests/common/http_test_server.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill::sources {
namespace {

using std::chrono::milliseconds;
using testing::HttpTestServer;
using testing::JsonResponse;
using testing::TestRequest;
using testing::TestResponse;

constexpr milliseconds kWait{20'000};  // bound on every wait; tests finish far sooner
constexpr int64_t kNow = int64_t{1'700'000'000} * 1'000'000;
constexpr int64_t kSecond = 1'000'000;
const std::string kDid = "did:plc:abcdefghijklmnopqrstuvwx";

// --- helpers ---

std::string Document(const std::string& did, const std::string& service_id,
                     const std::string& endpoint, const std::string& key_id = "#atproto") {
  return R"({"@context":["https://www.w3.org/ns/did/v1"],"id":")" + did +
         R"(","alsoKnownAs":["at://alice.example.com"],"verificationMethod":[{"id":")" + key_id +
         R"(","type":"Multikey","controller":")" + did +
         R"(","publicKeyMultibase":"zQ3shKey"}],"service":[{"id":")" + service_id +
         R"(","type":"AtprotoPersonalDataServer","serviceEndpoint":")" + endpoint + R"("}]})";
}

ResolverOptions Loopback() {
  ResolverOptions o;
  o.allow_loopback_endpoints = true;
  return o;
}

std::unique_ptr<net::HttpClient> StartClient() {
  net::HttpClientOptions o;
  o.allow_private_addresses = true;
  o.connect_timeout_ms = 2'000;
  o.timeout_ms = 5'000;
  o.retry.max_attempts = 3;
  o.retry.base_backoff_ms = 5;
  o.retry.max_backoff_ms = 20;
  o.random_seed = 7;
  Result<std::unique_ptr<net::HttpClient>> client = net::HttpClient::Start(o);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(*client) : nullptr;
}

struct Resolution {
  ResolveOutcome outcome;
  bool inline_call = false;  // `done` ran on the thread that called Resolve()
};

std::optional<Resolution> ResolveAndWait(DidResolver& resolver, const std::string& did) {
  auto promise = std::make_shared<std::promise<Resolution>>();
  std::future<Resolution> future = promise->get_future();
  const std::thread::id caller = std::this_thread::get_id();
  resolver.Resolve(did, [promise, caller](ResolveOutcome o) {
    promise->set_value({std::move(o), std::this_thread::get_id() == caller});
  });
  if (future.wait_for(kWait) != std::future_status::ready) return std::nullopt;
  return future.get();
}

// Outcomes of many resolutions in flight at once, by DID (each DID resolved once) or in order.
class Collector {
 public:
  std::function<void(ResolveOutcome)> Slot(std::string did) {
    return [this, did = std::move(did)](ResolveOutcome o) {
      std::lock_guard lock(mu_);
      by_did_[did] = o;
      all_.push_back(std::move(o));
      changed_.notify_all();
    };
  }
  bool WaitFor(size_t n) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, kWait, [&] { return all_.size() >= n; });
  }
  std::map<std::string, ResolveOutcome> by_did() {
    std::lock_guard lock(mu_);
    return by_did_;
  }
  std::vector<ResolveOutcome> all() {
    std::lock_guard lock(mu_);
    return all_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, ResolveOutcome> by_did_;
  std::vector<ResolveOutcome> all_;
};

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "atfill-resolver-test-XXXXXX").string();
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

simnet::SimnetOptions SmallNetwork() {
  simnet::SimnetOptions o;
  o.seed = 11;
  o.accounts = 60;
  o.pds_hosts = 3;
  o.did_web_share = 0.2;
  o.max_records = 2;
  Result<std::vector<simnet::FaultRule>> faults =
      simnet::ParseFaultSpec("pds:private_endpoint=1/7,bad_scheme=1/5");
  EXPECT_TRUE(faults.ok()) << faults.status().ToString();
  if (faults.ok()) o.faults = *faults;
  return o;
}

std::unique_ptr<simnet::Simnet> StartSimnet(simnet::SimnetOptions options) {
  Result<std::unique_ptr<simnet::Simnet>> sim = simnet::Simnet::Start(std::move(options));
  EXPECT_TRUE(sim.ok()) << sim.status().ToString();
  return sim.ok() ? std::move(*sim) : nullptr;
}

const simnet::Account* FirstAccount(const simnet::Network& network, bool web) {
  for (const simnet::Account& a : network.accounts()) {
    if ((a.web >= 0) == web && !a.private_endpoint && !a.bad_scheme) return &a;
  }
  return nullptr;
}

// --- ParseDidDocument and the endpoint rules ---

TEST(ParseDidDocumentTest, ReadsEndpointKeyAndHandleWithFragmentWithOrWithoutDidPrefix) {
  for (const std::string& service_id : {std::string("#atproto_pds"), kDid + "#atproto_pds"}) {
    for (const std::string& key_id : {std::string("#atproto"), kDid + "#atproto"}) {
      const ResolveOutcome o = ParseDidDocument(
          kDid, Document(kDid, service_id, "https://pds.example.com/", key_id), {}, kNow);
      ASSERT_TRUE(o.ok()) << service_id << " " << key_id << ": " << o.message;
      EXPECT_EQ(o.doc->pds_endpoint, "https://pds.example.com");  // trailing '/' dropped
      EXPECT_EQ(o.doc->signing_key, "zQ3shKey");
      EXPECT_EQ(o.doc->handle, "alice.example.com");
      EXPECT_EQ(o.doc->resolved_at_us, kNow);
      EXPECT_EQ(o.doc->expires_at_us, kNow + 24 * 3600 * kSecond);
      EXPECT_TRUE(o.error_kind.empty());
      EXPECT_FALSE(o.from_cache);
    }
  }
}

TEST(ParseDidDocumentTest, ServiceTypeIsNotCheckedAndOtherServicesAreSkipped) {
  const std::string json = R"({"id":")" + kDid +
                           R"(","service":[{"id":"#atproto_labeler","type":"AtprotoLabeler",)"
                           R"("serviceEndpoint":"https://labeler.example.com"},)"
                           R"({"id":"#atproto_pds","type":"SomethingElse",)"
                           R"("serviceEndpoint":"https://pds.example.com"}]})";
  const ResolveOutcome o = ParseDidDocument(kDid, json, {}, kNow);
  ASSERT_TRUE(o.ok()) << o.message;
  EXPECT_EQ(o.doc->pds_endpoint, "https://pds.example.com");
  EXPECT_EQ(o.doc->handle, "");
  EXPECT_EQ(o.doc->signing_key, "");
}

TEST(ParseDidDocumentTest, AnotherDidsFragmentDoesNotCount) {
  const ResolveOutcome o = ParseDidDocument(
      kDid, Document(kDid, "did:plc:zzzzzzzzzzzzzzzzzzzzzzzz#atproto_pds", "https://pds.example"),
      {}, kNow);
  EXPECT_EQ(o.error_kind, "no_pds_endpoint") << o.message;
}

TEST(ParseDidDocumentTest, HandleIsTheFirstValidAtAlias) {
  const std::string json =
      R"({"id":")" + kDid +
      R"(","alsoKnownAs":["https://x.example","at://not a handle",)"
      R"(7,"at://bob.example.org","at://carol.example.org"],)"
      R"("service":[{"id":"#atproto_pds","serviceEndpoint":"https://p.example"}]})";
  const ResolveOutcome o = ParseDidDocument(kDid, json, {}, kNow);
  ASSERT_TRUE(o.ok()) << o.message;
  EXPECT_EQ(o.doc->handle, "bob.example.org");
}

TEST(ParseDidDocumentTest, TtlSetsExpiry) {
  ResolverOptions options;
  options.cache_ttl_s = 90;
  const ResolveOutcome o =
      ParseDidDocument(kDid, Document(kDid, "#atproto_pds", "https://p.example"), options, kNow);
  ASSERT_TRUE(o.ok()) << o.message;
  EXPECT_EQ(o.doc->expires_at_us, kNow + 90 * kSecond);
}

struct BadDocumentCase {
  const char* name;
  std::string json;
  const char* kind;
};

TEST(ParseDidDocumentTest, BadDocumentsAreErrorsWithAKindAndASentence) {
  const std::vector<BadDocumentCase> cases = {
      {"missing service", R"({"id":")" + kDid + R"("})", "no_pds_endpoint"},
      {"empty services", R"({"id":")" + kDid + R"(","service":[]})", "no_pds_endpoint"},
      {"service not an array", R"({"id":")" + kDid + R"(","service":{"id":"#atproto_pds"}})",
       "no_pds_endpoint"},
      {"other fragment", Document(kDid, "#atproto_pdsx", "https://p.example"), "no_pds_endpoint"},
      {"endpoint not a string",
       R"({"id":")" + kDid + R"(","service":[{"id":"#atproto_pds","serviceEndpoint":{"a":1}}]})",
       "bad_endpoint"},
      {"id mismatch", Document("did:plc:zzzzzzzzzzzzzzzzzzzzzzzz", "#atproto_pds", "https://p.ex"),
       "bad_did_document"},
      {"id missing", R"({"service":[]})", "bad_did_document"},
      {"id not a string", R"({"id":5})", "bad_did_document"},
      {"not JSON", "<html>not found</html>", "bad_did_document"},
      {"truncated JSON", Document(kDid, "#atproto_pds", "https://p.example").substr(0, 40),
       "bad_did_document"},
      {"empty body", "", "bad_did_document"},
      {"array", "[1,2]", "bad_did_document"},
      {"non-http scheme", Document(kDid, "#atproto_pds", "ftp://pds.example.com"), "bad_endpoint"},
      {"no scheme", Document(kDid, "#atproto_pds", "pds.example.com"), "bad_endpoint"},
      {"no host", Document(kDid, "#atproto_pds", "https://"), "bad_endpoint"},
      {"empty endpoint", Document(kDid, "#atproto_pds", ""), "bad_endpoint"},
      {"IPv4 private 10/8", Document(kDid, "#atproto_pds", "http://10.0.0.1"), "bad_endpoint"},
      {"IPv4 private 192.168/16", Document(kDid, "#atproto_pds", "https://192.168.1.20:8443"),
       "bad_endpoint"},
      {"IPv4 link-local", Document(kDid, "#atproto_pds", "http://169.254.169.254/latest"),
       "bad_endpoint"},
      {"IPv4 loopback", Document(kDid, "#atproto_pds", "http://127.0.0.1:2583"), "bad_endpoint"},
      {"IPv6 loopback", Document(kDid, "#atproto_pds", "http://[::1]:2583"), "bad_endpoint"},
      {"IPv6 link-local", Document(kDid, "#atproto_pds", "http://[fe80::1]"), "bad_endpoint"},
      {"IPv6 unique-local", Document(kDid, "#atproto_pds", "http://[fd00::5]"), "bad_endpoint"},
      {"IPv4-mapped loopback", Document(kDid, "#atproto_pds", "http://[::ffff:127.0.0.1]"),
       "bad_endpoint"},
      {"localhost name", Document(kDid, "#atproto_pds", "http://localhost:2583"), "bad_endpoint"},
      {"*.localhost name", Document(kDid, "#atproto_pds", "http://pds.localhost"), "bad_endpoint"},
  };
  for (const BadDocumentCase& c : cases) {
    const ResolveOutcome o = ParseDidDocument(kDid, c.json, {}, kNow);
    EXPECT_FALSE(o.ok()) << c.name;
    EXPECT_EQ(o.error_kind, c.kind) << c.name << ": " << o.message;
    EXPECT_NE(o.message.find(kDid), std::string::npos) << c.name << ": " << o.message;
    EXPECT_FALSE(o.retryable) << c.name;
  }
}

TEST(ParseDidDocumentTest, OversizeDocumentIsRefused) {
  ResolverOptions options;
  options.max_document_bytes = 64;
  const ResolveOutcome o =
      ParseDidDocument(kDid, Document(kDid, "#atproto_pds", "https://p.example"), options, kNow);
  EXPECT_EQ(o.error_kind, "bad_did_document") << o.message;
}

TEST(ParseDidDocumentTest, PermissionsLiftTheirClassOnly) {
  const std::string loopback = Document(kDid, "#atproto_pds", "http://127.0.0.1:2583");
  const std::string loopback6 = Document(kDid, "#atproto_pds", "http://[::1]:2583");
  const std::string named = Document(kDid, "#atproto_pds", "http://pds-0001.localhost:2583");
  const std::string private4 = Document(kDid, "#atproto_pds", "http://10.0.0.1");
  const std::string link_local = Document(kDid, "#atproto_pds", "http://169.254.1.1");
  const std::string ftp = Document(kDid, "#atproto_pds", "ftp://127.0.0.1");

  const ResolverOptions loop = Loopback();
  EXPECT_TRUE(ParseDidDocument(kDid, loopback, loop, kNow).ok());
  EXPECT_TRUE(ParseDidDocument(kDid, loopback6, loop, kNow).ok());
  EXPECT_TRUE(ParseDidDocument(kDid, named, loop, kNow).ok());
  EXPECT_EQ(ParseDidDocument(kDid, private4, loop, kNow).error_kind, "bad_endpoint");
  EXPECT_EQ(ParseDidDocument(kDid, link_local, loop, kNow).error_kind, "bad_endpoint");
  EXPECT_EQ(ParseDidDocument(kDid, ftp, loop, kNow).error_kind, "bad_endpoint");

  ResolverOptions priv;
  priv.allow_private_endpoints = true;
  EXPECT_TRUE(ParseDidDocument(kDid, loopback, priv, kNow).ok());
  EXPECT_TRUE(ParseDidDocument(kDid, named, priv, kNow).ok());
  EXPECT_TRUE(ParseDidDocument(kDid, private4, priv, kNow).ok());
  EXPECT_TRUE(ParseDidDocument(kDid, link_local, priv, kNow).ok());
  EXPECT_EQ(ParseDidDocument(kDid, ftp, priv, kNow).error_kind, "bad_endpoint");
}

TEST(CheckResolvedEndpointTest, PublicLiteralsAndNamesPassWithoutDns) {
  const ResolverOptions strict;
  for (const char* url : {"https://8.8.8.8", "http://[2606:4700::1111]:8080",
                          "https://pds.example.com", "https://does-not-exist.invalid"}) {
    EXPECT_TRUE(CheckResolvedEndpoint(url, strict).ok()) << url;
  }
  // Numeric host spellings are normalised by the URL parser before the check.
  EXPECT_FALSE(CheckResolvedEndpoint("http://2130706433/", strict).ok());
  EXPECT_FALSE(CheckResolvedEndpoint("http://0x7f.0.0.1/", strict).ok());
}

TEST(ResolverOptionsTest, ValidateNamesTheFieldAndValue) {
  EXPECT_TRUE(ResolverOptions{}.Validate().ok());
  auto invalid = [](ResolverOptions o, const std::string& field, const std::string& value) {
    const Status st = o.Validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalid) << field;
    EXPECT_NE(st.message().find(field), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(value), std::string::npos) << st.message();
  };
  ResolverOptions o;
  o.plc_url = "ftp://plc.example";
  invalid(o, "plc_url", "ftp://plc.example");
  o = {};
  o.plc_url = "https://plc.example/?x=1";
  invalid(o, "plc_url", "x=1");
  o = {};
  o.cache_ttl_s = -1;
  invalid(o, "cache_ttl_s", "-1");
  o = {};
  o.timeout_ms = 0;
  invalid(o, "timeout_ms", "0");
  o = {};
  o.max_document_bytes = 0;
  invalid(o, "max_document_bytes", "0");
}

// --- resolution against simnet ---

TEST(DidResolverTest, EveryAccountResolvesToWhatSimnetServes) {
  auto sim = StartSimnet(SmallNetwork());
  ASSERT_NE(sim, nullptr);
  Collector collector;  // outlives the client, whose shutdown completes what is left
  auto http = StartClient();
  ASSERT_NE(http, nullptr);
  const simnet::Network& network = sim->network();
  ResolverOptions options = Loopback();
  options.plc_url = sim->plc_url();
  DidResolver resolver(http.get(), nullptr, options);

  for (const simnet::Account& a : network.accounts())
    resolver.Resolve(a.did, collector.Slot(a.did));
  ASSERT_TRUE(collector.WaitFor(network.accounts().size()));
  const std::map<std::string, ResolveOutcome> got = collector.by_did();
  ASSERT_EQ(got.size(), network.accounts().size());

  Result<simnet::GroundTruth> truth = sim->Truth();
  ASSERT_TRUE(truth.ok()) << truth.status().ToString();
  std::map<std::string, simnet::TruthAccount> truth_by_did;
  for (const simnet::TruthAccount& t : truth->accounts) truth_by_did[t.did] = t;

  int plc_ok = 0, web_ok = 0, private_endpoint = 0, bad_scheme = 0, failures = 0;
  for (const simnet::Account& a : network.accounts()) {
    const ResolveOutcome& o = got.at(a.did);
    const simnet::TruthAccount& t = truth_by_did.at(a.did);
    if (a.private_endpoint || a.bad_scheme) {
      EXPECT_TRUE(t.bad_endpoint) << a.did;
      EXPECT_FALSE(o.ok()) << a.did;
      EXPECT_EQ(o.error_kind, "bad_endpoint") << a.did << ": " << o.message;
      EXPECT_FALSE(o.retryable) << a.did;
      EXPECT_NE(o.message.find(a.did), std::string::npos) << o.message;
      ++(a.private_endpoint ? private_endpoint : bad_scheme);
      ++failures;
      continue;
    }
    ASSERT_TRUE(o.ok()) << a.did << ": " << o.error_kind << ": " << o.message;
    EXPECT_EQ(o.doc->pds_endpoint, network.pds_url(a.pds)) << a.did;
    EXPECT_EQ(o.doc->pds_endpoint, t.pds_url) << a.did;
    EXPECT_EQ(o.doc->signing_key, a.public_key_multibase) << a.did;
    EXPECT_EQ(o.doc->handle, a.handle) << a.did;
    EXPECT_FALSE(o.from_cache);
    ++(a.web >= 0 ? web_ok : plc_ok);
  }
  // The network exercises every path.
  EXPECT_GT(plc_ok, 10);
  EXPECT_GT(web_ok, 2);
  EXPECT_GT(private_endpoint, 0);
  EXPECT_GT(bad_scheme, 0);

  const ResolverStats stats = resolver.stats();
  EXPECT_EQ(stats.lookups, network.accounts().size());
  EXPECT_EQ(stats.fetched, network.accounts().size());
  EXPECT_EQ(stats.failures, static_cast<uint64_t>(failures));
  EXPECT_EQ(stats.cache_hits, 0u);
  // One request per account: PLC for did:plc, its own host for did:web.
  uint64_t web_hosts_requests = 0;
  for (size_t h = 2 + network.options().pds_hosts; h < network.host_count(); ++h) {
    EXPECT_EQ(sim->host_requests(h), 1u) << network.host_name(h);
    web_hosts_requests += sim->host_requests(h);
  }
  EXPECT_EQ(sim->host_requests(1) + web_hosts_requests, network.accounts().size());
}

TEST(DidResolverTest, UnknownDidsAreNotFound) {
  auto sim = StartSimnet(SmallNetwork());
  ASSERT_NE(sim, nullptr);
  auto http = StartClient();
  ASSERT_NE(http, nullptr);
  ResolverOptions options = Loopback();
  options.plc_url = sim->plc_url();
  DidResolver resolver(http.get(), nullptr, options);

  const std::string unknown_plc = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa";
  ASSERT_EQ(sim->network().FindDid(unknown_plc), nullptr);
  const std::string unknown_web =
      "did:web:web-9999.localhost%3A" + std::to_string(sim->port());  // simnet answers 404
  for (const std::string& did : {unknown_plc, unknown_web}) {
    auto r = ResolveAndWait(resolver, did);
    ASSERT_TRUE(r.has_value()) << did;
    EXPECT_EQ(r->outcome.error_kind, "did_not_found") << did << ": " << r->outcome.message;
    EXPECT_FALSE(r->outcome.retryable);
    EXPECT_FALSE(r->inline_call);
    EXPECT_NE(r->outcome.message.find(did), std::string::npos) << r->outcome.message;
  }
  EXPECT_EQ(resolver.stats().fetched, 2u);
  EXPECT_EQ(resolver.stats().failures, 2u);
}

TEST(DidResolverTest, InvalidDidsFailInlineWithoutARequest) {
  auto http = StartClient();
  ASSERT_NE(http, nullptr);
  ResolverOptions options = Loopback();
  options.plc_url = "http://127.0.0.1:9";  // never asked
  DidResolver resolver(http.get(), nullptr, options);

  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "invalid_did"},
      {"did:", "invalid_did"},
      {"plc:abcdefghijklmnopqrstuvwx", "invalid_did"},
      {"did:plc:", "invalid_did"},
      {"did:plc:abc", "invalid_did"},
      {"did:plc:ABCDEFGHIJKLMNOPQRSTUVWX", "invalid_did"},
      {"did:plc:abcdefghijklmnopqrstuvw1", "invalid_did"},  // '1' is not base32
      {"did:plc:abcdefghijklmnopqrstuvwxy", "invalid_did"},
      {"did:plc:abcdefghijklmnopqrstuvwx/../x", "invalid_did"},
      {std::string("did:plc:abcdefghijklmnopqrst\0vwx", 32), "invalid_did"},
      {"did:web:", "invalid_did"},
      {"did:web:example.com:user:alice", "invalid_did"},  // path-based
      {"did:web:exa%2Fmple.com", "invalid_did"},
      {"did:web:ex_ample.com", "invalid_did"},
      {"did:web:example.com%3A", "invalid_did"},
      {"did:web:example.com%3Ahttp", "invalid_did"},
      {"did:web:example.com%3A0", "invalid_did"},
      {"did:web:example.com%3A70000", "invalid_did"},
      {"did:web:example.com%3A80%3A81", "invalid_did"},
      {"did:plc:" + std::string(3000, 'a'), "invalid_did"},
      {"did:key:zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme", "unsupported_did_method"},
      {"did:ion:abc", "unsupported_did_method"},
      // Loopback did:web hosts are refused here only when loopback is not allowed; see below.
      {"did:web:10.1.2.3", "bad_endpoint"},
      {"did:web:169.254.169.254", "bad_endpoint"},
  };
  for (const auto& [did, kind] : cases) {
    auto r = ResolveAndWait(resolver, did);
    ASSERT_TRUE(r.has_value()) << did;
    EXPECT_TRUE(r->inline_call) << did;
    EXPECT_EQ(r->outcome.error_kind, kind) << did << ": " << r->outcome.message;
    EXPECT_FALSE(r->outcome.retryable) << did;
    EXPECT_FALSE(r->outcome.message.empty()) << did;
    EXPECT_LT(r->outcome.message.size(), 600u) << did;  // long input is cut short
  }
  EXPECT_EQ(http->stats().submitted, 0u);
  EXPECT_EQ(resolver.stats().fetched, 0u);
  EXPECT_EQ(resolver.stats().failures, cases.size());
}

TEST(DidResolverTest, LoopbackEndpointsAreRefusedUnlessAllowed) {
  auto sim = StartSimnet(SmallNetwork());
  ASSERT_NE(sim, nullptr);
  auto http = StartClient();
  ASSERT_NE(http, nullptr);
  const simnet::Account* plc = FirstAccount(sim->network(), /*web=*/false);
  const simnet::Account* web = FirstAccount(sim->network(), /*web=*/true);
  ASSERT_NE(plc, nullptr);
  ASSERT_NE(web, nullptr);

  ResolverOptions options;  // the defaults: public endpoints only
  options.plc_url = sim->plc_url();
  DidResolver strict(http.get(), nullptr, options);
  // The PLC (configured) answers; the document's endpoint, a *.localhost name, is refused.
  auto r = ResolveAndWait(strict, plc->did);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome.error_kind, "bad_endpoint") << r->outcome.message;
  EXPECT_EQ(sim->host_requests(1), 1u);
  // A did:web on a *.localhost host is refused before any request.
  r = ResolveAndWait(strict, web->did);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome.error_kind, "bad_endpoint") << r->outcome.message;
  EXPECT_TRUE(r->inline_call);
  EXPECT_EQ(sim->host_requests(static_cast<size_t>(
                sim->network().HostId(web->did.substr(8, web->did.find('%') - 8)))),
            0u);

  // A document pointing at a loopback literal, served by a test PLC.
  HttpTestServer pds_literal([](const TestRequest& req) {
    return JsonResponse(200, Document(req.target.substr(1), "#atproto_pds", "http://127.0.0.1:7"));
  });
  options.plc_url = pds_literal.Url("");
  DidResolver strict_literal(http.get(), nullptr, options);
  r = ResolveAndWait(strict_literal, kDid);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome.error_kind, "bad_endpoint") << r->outcome.message;
  EXPECT_NE(r->outcome.message.find("127.0.0.1"), std::string::npos) << r->outcome.message;

  options.allow_loopback_endpoints = true;
  DidResolver allowed(http.get(), nullptr, options);
  r = ResolveAndWait(allowed, kDid);
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(r->outcome.ok()) << r->outcome.message;
  EXPECT_EQ(r->outcome.doc->pds_endpoint, "http://127.0.0.1:7");
}

TEST(DidResolverTest, SecondResolutionHitsThePersistentCacheAndExpiryRefetches) {
  auto sim = StartSimnet(SmallNetwork());
  ASSERT_NE(sim, nullptr);
  auto http = StartClient();
  ASSERT_NE(http, nullptr);
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  state::RocksDbOptions db_options;
  db_options.path = dir.path() + "/state";
  Result<std::unique_ptr<state::KvStore>> kv = state::OpenRocksDb(db_options);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  state::ResolverCache cache(**kv);

  const simnet::Network& network = sim->network();
  const simnet::Account* plc = FirstAccount(network, false);
  const simnet::Account* web = FirstAccount(network, true);
  ASSERT_NE(plc, nullptr);
  ASSERT_NE(web, nullptr);
  const size_t web_host =
      static_cast<size_t>(network.HostId(web->did.substr(8, web->did.find('%') - 8)));
  ASSERT_GE(web_host, 2u + network.options().pds_hosts);

  std::atomic<int64_t> now{kNow};
  ResolverOptions options = Loopback();
  options.plc_url = sim->plc_url();
  options.cache_ttl_s = 3600;
  auto resolver =
      std::make_unique<DidResolver>(http.get(), &cache, options, [&] { return now.load(); });

  for (const simnet::Account* a : {plc, web}) {
    auto r = ResolveAndWait(*resolver, a->did);
    ASSERT_TRUE(r.has_value());
    ASSERT_TRUE(r->outcome.ok()) << r->outcome.message;
    EXPECT_FALSE(r->outcome.from_cache);
    EXPECT_FALSE(r->inline_call);
    // Stored with expires_at = now + ttl.
    Result<std::optional<state::ResolvedDid>> stored = cache.Get(a->did, kNow);
    ASSERT_TRUE(stored.ok());
    ASSERT_TRUE(stored->has_value()) << a->did;
    EXPECT_EQ(**stored, *r->outcome.doc);
    EXPECT_EQ((*stored)->expires_at_us, kNow + 3600 * kSecond);
    EXPECT_EQ((*stored)->pds_endpoint, network.pds_url(a->pds));
  }
  EXPECT_EQ(sim->host_requests(1), 1u);
  EXPECT_EQ(sim->host_requests(web_host), 1u);

  // Within the TTL, by this resolver and by a new one over the same state (a restart): inline,
  // from the cache, no request.
  auto restarted =
      std::make_unique<DidResolver>(http.get(), &cache, options, [&] { return now.load(); });
  now = kNow + 3599 * kSecond;
  for (DidResolver* r : {resolver.get(), restarted.get()}) {
    for (const simnet::Account* a : {plc, web}) {
      auto got = ResolveAndWait(*r, a->did);
      ASSERT_TRUE(got.has_value());
      ASSERT_TRUE(got->outcome.ok()) << got->outcome.message;
      EXPECT_TRUE(got->outcome.from_cache);
      EXPECT_TRUE(got->inline_call);
      EXPECT_EQ(got->outcome.doc->pds_endpoint, network.pds_url(a->pds));
      EXPECT_EQ(got->outcome.doc->signing_key, a->public_key_multibase);
      EXPECT_EQ(got->outcome.doc->resolved_at_us, kNow);
    }
  }
  EXPECT_EQ(sim->host_requests(1), 1u);
  EXPECT_EQ(sim->host_requests(web_host), 1u);
  EXPECT_EQ(resolver->stats().cache_hits, 2u);
  EXPECT_EQ(restarted->stats().cache_hits, 2u);
  EXPECT_EQ(restarted->stats().fetched, 0u);

  // At the expiry the entry is gone: refetched, and stored again with the new time.
  now = kNow + 3600 * kSecond;
  for (const simnet::Account* a : {plc, web}) {
    auto r = ResolveAndWait(*resolver, a->did);
    ASSERT_TRUE(r.has_value());
    ASSERT_TRUE(r->outcome.ok()) << r->outcome.message;
    EXPECT_FALSE(r->outcome.from_cache);
    EXPECT_EQ(r->outcome.doc->resolved_at_us, kNow + 3600 * kSecond);
  }
  EXPECT_EQ(sim->host_requests(1), 2u);
  EXPECT_EQ(sim->host_requests(web_host), 2u);
  Result<std::optional<state::ResolvedDid>> stored = cache.Get(plc->did, now.load());
  ASSERT_TRUE(stored.ok());
  ASSERT_TRUE(stored->has_value());
  EXPECT_EQ((*stored)->expires_at_us, kNow + 7200 * kSecond);
  EXPECT_EQ(resolver->stats().cache_errors, 0u);
}

TEST(DidResolverTest, CacheIsNeitherReadNorWrittenWithZeroTtlOrForFailures) {
  auto sim = StartSimnet(SmallNetwork());
  ASSERT_NE(sim, nullptr);
  auto http = StartClient();
  ASSERT_NE(http, nullptr);
  std::unique_ptr<state::KvStore> kv = state::NewMemoryKvStore();
  state::ResolverCache cache(*kv);
  const simnet::Account* plc = FirstAccount(sim->network(), false);
  ASSERT_NE(plc, nullptr);
  const simnet::Account* faulty = nullptr;
  for (const simnet::Account& a : sim->network().accounts()) {
    if (a.web < 0 && a.private_endpoint) faulty = &a;
  }
  ASSERT_NE(faulty, nullptr);

  ResolverOptions options = Loopback();
  options.plc_url = sim->plc_url();
  options.cache_ttl_s = 0;
  DidResolver uncached(http.get(), &cache, options, [] { return kNow; });
  for (int i = 0; i < 2; ++i) {
    auto r = ResolveAndWait(uncached, plc->did);
    ASSERT_TRUE(r.has_value());
    ASSERT_TRUE(r->outcome.ok()) << r->outcome.message;
    EXPECT_FALSE(r->outcome.from_cache);
  }
  EXPECT_EQ(sim->host_requests(1), 2u);
  Result<std::optional<state::ResolvedDid>> stored = cache.Get(plc->did, 0);
  ASSERT_TRUE(stored.ok());
  EXPECT_FALSE(stored->has_value());

  options.cache_ttl_s = 3600;
  DidResolver cached(http.get(), &cache, options, [] { return kNow; });
  for (int i = 0; i < 2; ++i) {
    auto r = ResolveAndWait(cached, faulty->did);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->outcome.error_kind, "bad_endpoint") << r->outcome.message;
  }
  EXPECT_EQ(sim->host_requests(1), 4u);
  stored = cache.Get(faulty->did, 0);
  ASSERT_TRUE(stored.ok());
  EXPECT_FALSE(stored->has_value());
}

TEST(DidResolverTest, CachedEntryRefusedByTheCurrentOptionsIsRefetched) {
  auto sim = StartSimnet(SmallNetwork());
  ASSERT_NE(sim, nullptr);
  auto http = StartClient();
  ASSERT_NE(http, nullptr);
  std::unique_ptr<state::KvStore> kv = state::NewMemoryKvStore();
  state::ResolverCache cache(*kv);
  const simnet::Account* plc = FirstAccount(sim->network(), false);
  ASSERT_NE(plc, nullptr);
  state::ResolvedDid planted;
  planted.pds_endpoint = "http://10.0.0.1";
  planted.resolved_at_us = kNow;
  planted.expires_at_us = kNow + 3600 * kSecond;
  ASSERT_TRUE(cache.Store(plc->did, planted).ok());

  ResolverOptions options = Loopback();
  options.plc_url = sim->plc_url();
  DidResolver resolver(http.get(), &cache, options, [] { return kNow; });
  auto r = ResolveAndWait(resolver, plc->did);
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(r->outcome.ok()) << r->outcome.message;
  EXPECT_FALSE(r->outcome.from_cache);
  EXPECT_EQ(r->outcome.doc->pds_endpoint, sim->network().pds_url(plc->pds));
  EXPECT_EQ(sim->host_requests(1), 1u);
}

// --- resolution against loopback test servers ---

TEST(DidResolverTest, ConcurrentResolutionsOfOneDidShareOneRequest) {
  HttpTestServer plc([](const TestRequest& req) {
    return JsonResponse(200,
                        Document(req.target.substr(1), "#atproto_pds", "https://pds.example.com"));
  });
  plc.SetHold(true);
  Collector collector;  // outlives the client, whose shutdown completes what is left
  auto http = StartClient();
  ASSERT_NE(http, nullptr);
  ResolverOptions options;
  options.plc_url = plc.Url("");
  DidResolver resolver(http.get(), nullptr, options);

  constexpr size_t kCallers = 16;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < kCallers; ++i) {
    threads.emplace_back([&] { resolver.Resolve(kDid, collector.Slot(kDid)); });
  }
  for (std::thread& t : threads) t.join();
  // Every caller has joined; the one request is parked at the server.
  ASSERT_TRUE(plc.WaitForHeld(1, kWait));
  EXPECT_EQ(plc.requests(), 1);
  EXPECT_TRUE(collector.all().empty());
  plc.SetHold(false);
  ASSERT_TRUE(collector.WaitFor(kCallers));
  for (const ResolveOutcome& o : collector.all()) {
    ASSERT_TRUE(o.ok()) << o.message;
    EXPECT_EQ(o.doc->pds_endpoint, "https://pds.example.com");
  }
  EXPECT_EQ(plc.requests(), 1);
  const ResolverStats stats = resolver.stats();
  EXPECT_EQ(stats.lookups, kCallers);
  EXPECT_EQ(stats.fetched, 1u);
  EXPECT_EQ(stats.coalesced, kCallers - 1);
  EXPECT_EQ(stats.failures, 0u);

  // Once answered, the next resolution is a request of its own.
  auto r = ResolveAndWait(resolver, kDid);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->outcome.ok());
  EXPECT_EQ(plc.requests(), 2);
  ASSERT_EQ(plc.received().size(), 2u);
  EXPECT_EQ(plc.received()[0].target, "/" + kDid);
}

TEST(DidResolverTest, ResolutionInFlightCompletesAfterTheResolverIsDestroyed) {
  HttpTestServer plc([](const TestRequest& req) {
    return JsonResponse(200,
                        Document(req.target.substr(1), "#atproto_pds", "https://pds.example.com"));
  });
  plc.SetHold(true);
  Collector collector;
  auto http = StartClient();
  ASSERT_NE(http, nullptr);
  ResolverOptions options;
  options.plc_url = plc.Url("");
  auto resolver = std::make_unique<DidResolver>(http.get(), nullptr, options);
  resolver->Resolve(kDid, collector.Slot(kDid));
  ASSERT_TRUE(plc.WaitForHeld(1, kWait));
  resolver.reset();
  plc.SetHold(false);
  ASSERT_TRUE(collector.WaitFor(1));
  const std::vector<ResolveOutcome> got = collector.all();
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0].ok()) << got[0].message;
  EXPECT_EQ(got[0].doc->pds_endpoint, "https://pds.example.com");
}

TEST(DidResolverTest, ServerErrorsAfterRetriesAreRetryableFailures) {
  HttpTestServer plc([](const TestRequest&) {
    return testing::XrpcErrorResponse(500, "InternalServerError", "down");
  });
  auto http = StartClient();
  ASSERT_NE(http, nullptr);
  ResolverOptions options;
  options.plc_url = plc.Url("/");  // the trailing '/' is not doubled
  DidResolver resolver(http.get(), nullptr, options);
  auto r = ResolveAndWait(resolver, kDid);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome.error_kind, "resolve_failed") << r->outcome.message;
  EXPECT_TRUE(r->outcome.retryable);
  EXPECT_FALSE(r->outcome.ok());
  EXPECT_NE(r->outcome.message.find(kDid), std::string::npos) << r->outcome.message;
  EXPECT_NE(r->outcome.message.find("500"), std::string::npos) << r->outcome.message;
  EXPECT_EQ(plc.requests(), 3);  // the HttpClient's three attempts
  for (const TestRequest& req : plc.received()) EXPECT_EQ(req.target, "/" + kDid);
}

TEST(DidResolverTest, TransportFailureAndShutdownAreRetryable) {
  testing::RefusingPort refusing;
  auto http = StartClient();
  ASSERT_NE(http, nullptr);
  ResolverOptions options;
  options.plc_url = refusing.Url("");
  DidResolver resolver(http.get(), nullptr, options);
  auto r = ResolveAndWait(resolver, kDid);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome.error_kind, "resolve_failed") << r->outcome.message;
  EXPECT_TRUE(r->outcome.retryable);

  http->Shutdown();
  r = ResolveAndWait(resolver, kDid);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome.error_kind, "resolve_failed") << r->outcome.message;
  EXPECT_TRUE(r->outcome.retryable);
}

TEST(DidResolverTest, OtherAnswersHaveTheirKinds) {
  const std::string gone = "did:plc:gggggggggggggggggggggggg";
  const std::string bad_request = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb";
  const std::string html = "did:plc:hhhhhhhhhhhhhhhhhhhhhhhh";
  const std::string huge = "did:plc:llllllllllllllllllllllll";
  const std::string wrong_id = "did:plc:wwwwwwwwwwwwwwwwwwwwwwww";
  HttpTestServer plc([&](const TestRequest& req) {
    const std::string did = req.target.substr(1);
    if (did == gone) return testing::XrpcErrorResponse(410, "NotAvailable", "tombstoned");
    if (did == bad_request) return testing::XrpcErrorResponse(400, "InvalidRequest", "no");
    if (did == html) {
      TestResponse r;
      r.body = "<html></html>";
      r.content_type = "text/html";
      return r;
    }
    if (did == huge) return testing::HugeResponse(300 * 1024, /*chunked=*/true);
    if (did == wrong_id) return JsonResponse(200, Document(kDid, "#atproto_pds", "https://p.ex"));
    return testing::XrpcErrorResponse(404, "NotFound", "no");
  });
  auto http = StartClient();
  ASSERT_NE(http, nullptr);
  ResolverOptions options;
  options.plc_url = plc.Url("");
  DidResolver resolver(http.get(), nullptr, options);
  const std::vector<std::tuple<std::string, std::string, bool>> cases = {
      {gone, "did_not_found", false},        {bad_request, "resolve_failed", false},
      {html, "bad_did_document", false},     {huge, "bad_did_document", false},
      {wrong_id, "bad_did_document", false},
  };
  for (const auto& [did, kind, retryable] : cases) {
    auto r = ResolveAndWait(resolver, did);
    ASSERT_TRUE(r.has_value()) << did;
    EXPECT_EQ(r->outcome.error_kind, kind) << did << ": " << r->outcome.message;
    EXPECT_EQ(r->outcome.retryable, retryable) << did;
    EXPECT_NE(r->outcome.message.find(did), std::string::npos) << r->outcome.message;
  }
}

TEST(DidResolverTest, InvalidOptionsFailEveryResolutionInline) {
  auto http = StartClient();
  ASSERT_NE(http, nullptr);
  ResolverOptions options;
  options.timeout_ms = -5;
  DidResolver resolver(http.get(), nullptr, options);
  auto r = ResolveAndWait(resolver, kDid);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->inline_call);
  EXPECT_EQ(r->outcome.error_kind, "invalid_options");
  EXPECT_NE(r->outcome.message.find("timeout_ms"), std::string::npos) << r->outcome.message;
  EXPECT_EQ(http->stats().submitted, 0u);
}

}  // namespace
}  // namespace atfill::sources
