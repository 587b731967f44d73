// simnet end to end: a crawl through libcurl over "*.localhost" names must find exactly the
// ground truth, and every injectable fault must be served as configured.
#include <curl/curl.h>
#include <gtest/gtest.h>
#include <simdjson.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "atproto/crypto.hpp"
#include "atproto/json.hpp"
#include "atproto/repo.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill::simnet {
namespace {

struct Got {
  CURLcode code = CURLE_OK;
  long status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // names lower-cased
  double seconds = 0;
};

size_t OnBody(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

size_t OnHeader(char* data, size_t size, size_t n, void* out) {
  std::string line(data, size * n);
  const size_t colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ')) value.erase(0, 1);
    while (!value.empty() && (value.back() == '\r' || value.back() == '\n')) value.pop_back();
    (*static_cast<std::map<std::string, std::string>*>(out))[name] = value;
  }
  return size * n;
}

// One reused easy handle (so keep-alive connections are reused, as a crawler does).
class Client {
 public:
  Client() : curl_(curl_easy_init()) { curl_easy_setopt(curl_, CURLOPT_MAXCONNECTS, 1000L); }
  ~Client() { curl_easy_cleanup(curl_); }

  Got Get(const std::string& url, long timeout_ms = 10'000) {
    Got got;
    curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &got.body);
    curl_easy_setopt(curl_, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(curl_, CURLOPT_HEADERDATA, &got.headers);
    curl_easy_setopt(curl_, CURLOPT_IPRESOLVE, CURL_IPRESOLVE_V4);
    const auto start = std::chrono::steady_clock::now();
    got.code = curl_easy_perform(curl_);
    got.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &got.status);
    return got;
  }

 private:
  CURL* curl_;
};

std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') {
      out.push_back(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", static_cast<unsigned char>(c));
      out += buf;
    }
  }
  return out;
}

SimnetOptions SmallNetwork() {
  SimnetOptions o;
  o.seed = 42;
  o.accounts = 50;
  o.pds_hosts = 5;
  o.did_web_share = 0.1;
  o.deactivated_share = 0.05;
  o.takendown_share = 0.05;
  o.max_records = 30;
  return o;
}

struct DidDoc {
  std::string endpoint;
  std::string key;
};

// Resolves a DID through the PLC directory or its did:web host.
DidDoc Resolve(Client& client, const Simnet& net, const std::string& did) {
  std::string url;
  if (did.starts_with("did:web:")) {
    std::string host = did.substr(8);
    const size_t pct = host.find("%3A");
    if (pct != std::string::npos) host.replace(pct, 3, ":");
    url = "http://" + host + "/.well-known/did.json";
  } else {
    url = net.plc_url() + "/" + did;
  }
  Got got = client.Get(url);
  EXPECT_EQ(got.code, CURLE_OK);
  EXPECT_EQ(got.status, 200) << url << " " << got.body;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  DidDoc out;
  if (parser.parse(got.body).get(doc) != simdjson::SUCCESS) {
    ADD_FAILURE() << "bad DID document " << got.body;
    return out;
  }
  std::string_view id, endpoint, key;
  EXPECT_EQ(doc["id"].get(id), simdjson::SUCCESS);
  EXPECT_EQ(id, did);
  EXPECT_EQ(doc["service"].at(0)["id"].get(endpoint), simdjson::SUCCESS);
  EXPECT_EQ(endpoint, "#atproto_pds");
  EXPECT_EQ(doc["service"].at(0)["serviceEndpoint"].get(endpoint), simdjson::SUCCESS);
  EXPECT_EQ(doc["verificationMethod"].at(0)["publicKeyMultibase"].get(key), simdjson::SUCCESS);
  out.endpoint = std::string(endpoint);
  out.key = std::string(key);
  return out;
}

// Pages through a relay listing; returns every repo object as raw JSON keyed by DID.
std::map<std::string, std::string> ListAll(Client& client, const std::string& base, int limit,
                                           int* pages) {
  std::map<std::string, std::string> out;
  std::string cursor;
  simdjson::dom::parser parser;
  for (int guard = 0; guard < 10'000; ++guard) {
    std::string url = base + "&limit=" + std::to_string(limit);
    if (!cursor.empty()) url += "&cursor=" + Escape(cursor);
    Got got = client.Get(url);
    EXPECT_EQ(got.status, 200) << got.body;
    ++*pages;
    simdjson::dom::element page;
    if (parser.parse(got.body).get(page) != simdjson::SUCCESS) break;
    simdjson::dom::array repos;
    EXPECT_EQ(page["repos"].get(repos), simdjson::SUCCESS);
    EXPECT_LE(repos.size(), static_cast<size_t>(limit));
    for (simdjson::dom::element repo : repos) {
      std::string_view did;
      EXPECT_EQ(repo["did"].get(did), simdjson::SUCCESS);
      EXPECT_TRUE(out.emplace(std::string(did), simdjson::minify(repo)).second)
          << "listed twice: " << did;
    }
    std::string_view next;
    if (page["cursor"].get(next) != simdjson::SUCCESS) break;
    cursor = std::string(next);
  }
  return out;
}

TEST(SimnetTest, CrawlThroughEveryEndpointMatchesTheGroundTruth) {
  Result<std::unique_ptr<Simnet>> started = Simnet::Start(SmallNetwork());
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  const Simnet& net = **started;
  Result<GroundTruth> truth = net.Truth();
  ASSERT_TRUE(truth.ok()) << truth.status().ToString();
  ASSERT_EQ(truth->accounts.size(), 50u);
  ASSERT_GT(truth->records.size(), 100u);
  std::map<std::string, const TruthAccount*> accounts;
  int web = 0, inactive = 0;
  for (const TruthAccount& a : truth->accounts) {
    accounts[a.did] = &a;
    web += a.did.starts_with("did:web:");
    inactive += a.status != AccountStatus::kActive;
  }
  ASSERT_GT(web, 0) << "the network should hold did:web accounts";
  ASSERT_GT(inactive, 0) << "the network should hold inactive accounts";
  std::set<std::pair<std::string, std::string>> expected;
  for (const TruthRecord& r : truth->records) {
    EXPECT_TRUE(r.faults.empty()) << r.uri;
    expected.emplace(r.uri, r.cid);
  }

  Client client;
  int pages = 0;
  const std::map<std::string, std::string> listed =
      ListAll(client, net.relay_url() + "/xrpc/com.atproto.sync.listRepos?x=1", 9, &pages);
  EXPECT_GE(pages, 6);
  ASSERT_EQ(listed.size(), accounts.size());
  std::map<std::string, std::string> heads;
  simdjson::dom::parser parser;
  for (const auto& [did, json] : listed) {
    ASSERT_TRUE(accounts.contains(did)) << did;
    simdjson::dom::element repo = parser.parse(json);
    bool active = false;
    std::string_view head, rev, status;
    EXPECT_EQ(repo["active"].get(active), simdjson::SUCCESS);
    EXPECT_EQ(active, accounts[did]->status == AccountStatus::kActive) << did;
    if (!active) {
      EXPECT_EQ(repo["status"].get(status), simdjson::SUCCESS);
      EXPECT_EQ(status, AccountStatusName(accounts[did]->status));
    }
    EXPECT_EQ(repo["head"].get(head), simdjson::SUCCESS);
    EXPECT_EQ(repo["rev"].get(rev), simdjson::SUCCESS);
    heads[did] = std::string(head);
  }

  // listReposByCollection names exactly the accounts with a record in the collection.
  std::map<std::string, std::set<std::string>> by_collection;
  for (const TruthAccount& a : truth->accounts) {
    const Account* account = net.network().FindDid(a.did);
    ASSERT_NE(account, nullptr);
    for (size_t c = 0; c < net.network().options().collections.size(); ++c) {
      if (account->collection_counts[c] > 0) {
        by_collection[net.network().options().collections[c]].insert(a.did);
      }
    }
  }
  for (const std::string& collection : net.network().options().collections) {
    pages = 0;
    const auto repos = ListAll(
        client,
        net.relay_url() + "/xrpc/com.atproto.sync.listReposByCollection?collection=" + collection,
        7, &pages);
    std::set<std::string> dids;
    for (const auto& [did, json] : repos) dids.insert(did);
    EXPECT_EQ(dids, by_collection[collection]) << collection;
    EXPECT_GE(pages, 2);
  }

  std::set<std::pair<std::string, std::string>> via_list_records, via_get_repo;
  int repos_read = 0;
  for (const auto& [did, account] : accounts) {
    const DidDoc doc = Resolve(client, net, did);
    EXPECT_EQ(doc.endpoint, account->pds_url) << did;
    Got status =
        client.Get(doc.endpoint + "/xrpc/com.atproto.sync.getRepoStatus?did=" + Escape(did));
    ASSERT_EQ(status.status, 200) << status.body;
    simdjson::dom::element st = parser.parse(status.body);
    bool active = false;
    EXPECT_EQ(st["active"].get(active), simdjson::SUCCESS);
    EXPECT_EQ(active, account->status == AccountStatus::kActive);
    if (!active) {
      Got refused = client.Get(doc.endpoint + "/xrpc/com.atproto.sync.getRepo?did=" + Escape(did));
      EXPECT_EQ(refused.status, 400);
      const std::string error =
          account->status == AccountStatus::kDeactivated ? "RepoDeactivated" : "RepoTakendown";
      EXPECT_NE(refused.body.find(error), std::string::npos) << refused.body;
      continue;
    }
    for (const std::string& collection : net.network().options().collections) {
      std::string cursor;
      for (int guard = 0; guard < 1000; ++guard) {
        std::string url = doc.endpoint + "/xrpc/com.atproto.repo.listRecords?repo=" + Escape(did) +
                          "&collection=" + collection + "&limit=4";
        if (!cursor.empty()) url += "&cursor=" + cursor;
        Got got = client.Get(url);
        ASSERT_EQ(got.status, 200) << got.body;
        simdjson::dom::element page = parser.parse(got.body);
        simdjson::dom::array records;
        ASSERT_EQ(page["records"].get(records), simdjson::SUCCESS);
        EXPECT_LE(records.size(), 4u);
        for (simdjson::dom::element r : records) {
          std::string_view uri, cid;
          ASSERT_EQ(r["uri"].get(uri), simdjson::SUCCESS);
          ASSERT_EQ(r["cid"].get(cid), simdjson::SUCCESS);
          Result<atproto::Cid> computed = atproto::CidOfRecord(simdjson::minify(r["value"]));
          ASSERT_TRUE(computed.ok()) << computed.status().ToString();
          EXPECT_EQ(computed->ToString(), cid) << uri;
          EXPECT_TRUE(via_list_records.emplace(uri, cid).second) << "served twice: " << uri;
        }
        std::string_view next;
        if (page["cursor"].get(next) != simdjson::SUCCESS) break;
        cursor = std::string(next);
      }
    }
    Got car = client.Get(doc.endpoint + "/xrpc/com.atproto.sync.getRepo?did=" + Escape(did));
    ASSERT_EQ(car.status, 200);
    EXPECT_EQ(car.headers["content-type"], "application/vnd.ipld.car");
    Result<atproto::RepoReader> reader = atproto::RepoReader::Open(AsBytes(car.body));
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    EXPECT_EQ(reader->commit().did, did);
    EXPECT_EQ(reader->commit_cid().ToString(), heads[did]) << "listRepos head differs";
    Result<atproto::PublicKey> key = atproto::PublicKey::FromMultibase(doc.key);
    ASSERT_TRUE(key.ok()) << key.status().ToString();
    EXPECT_TRUE(reader->VerifySignature(*key).ok()) << did;
    ASSERT_TRUE(reader
                    ->ForEachRecord(
                        [&](const atproto::RepoRecord& r) {
                          via_get_repo.emplace("at://" + did + "/" + std::string(r.collection) +
                                                   "/" + std::string(r.rkey),
                                               r.cid.ToString());
                          return Status::OK();
                        },
                        nullptr)
                    .ok());
    ++repos_read;
  }
  EXPECT_EQ(repos_read, 50 - inactive);
  EXPECT_EQ(via_list_records, expected);
  EXPECT_EQ(via_get_repo, expected);
  const SimnetStats stats = net.stats();
  EXPECT_EQ(stats.rate_limited + stats.server_errors + stats.timeouts + stats.truncated, 0u);
  // One keep-alive connection per simulated host: each looks like a distinct host to libcurl.
  EXPECT_EQ(stats.connections, net.network().host_count());
}

TEST(SimnetTest, SameSeedSameNetwork) {
  SimnetOptions o = SmallNetwork();
  Result<std::unique_ptr<Network>> a = Network::Generate(o, 8000);
  Result<std::unique_ptr<Network>> b = Network::Generate(o, 8000);
  o.seed = 43;
  Result<std::unique_ptr<Network>> c = Network::Generate(o, 8000);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const std::string ta = (*a)->Truth()->ToTsv(true);
  EXPECT_GT(ta.size(), 1000u);
  EXPECT_EQ(ta, (*b)->Truth()->ToTsv(true));
  EXPECT_NE(ta, (*c)->Truth()->ToTsv(true));
}

TEST(SimnetTest, SameSeedSameRepositoriesUpToSignatures) {
  SimnetOptions o = SmallNetwork();
  o.did_web_share = 0;  // did:web DIDs name the port, which differs between the two instances
  Result<std::unique_ptr<Simnet>> a = Simnet::Start(o);
  Result<std::unique_ptr<Simnet>> b = Simnet::Start(o);
  ASSERT_TRUE(a.ok() && b.ok());
  Client client;
  int compared = 0;
  for (const Account& account : (*a)->network().accounts()) {
    if (account.status != AccountStatus::kActive) continue;
    const std::string path = "/xrpc/com.atproto.sync.getRepo?did=" + Escape(account.did);
    Got ca = client.Get((*a)->pds_url(account.pds) + path);
    Got cb = client.Get((*b)->pds_url(account.pds) + path);
    ASSERT_EQ(ca.status, 200);
    ASSERT_EQ(cb.status, 200);
    Result<atproto::RepoReader> ra = atproto::RepoReader::Open(AsBytes(ca.body));
    Result<atproto::RepoReader> rb = atproto::RepoReader::Open(AsBytes(cb.body));
    ASSERT_TRUE(ra.ok() && rb.ok());
    EXPECT_EQ(ra->commit().data, rb->commit().data) << "MST roots differ for " << account.did;
    EXPECT_EQ(ra->commit().rev, rb->commit().rev);
    std::vector<std::string> la, lb;
    ASSERT_TRUE(ra->ForEachRecord(
                      [&](const atproto::RepoRecord& r) {
                        la.push_back(std::string(r.rkey) + r.cid.ToString());
                        return Status::OK();
                      },
                      nullptr)
                    .ok());
    ASSERT_TRUE(rb->ForEachRecord(
                      [&](const atproto::RepoRecord& r) {
                        lb.push_back(std::string(r.rkey) + r.cid.ToString());
                        return Status::OK();
                      },
                      nullptr)
                    .ok());
    EXPECT_EQ(la, lb);
    // Within one instance the head stays put even when asked again.
    EXPECT_EQ(client.Get((*a)->pds_url(account.pds) + path).body, ca.body);
    ++compared;
  }
  EXPECT_GT(compared, 30);
}

TEST(SimnetTest, EvictedReposAreRebuiltWithTheSameCommit) {
  SimnetOptions o = SmallNetwork();
  o.repo_cache_bytes = 1;  // keeps only the last repo
  Result<std::unique_ptr<Simnet>> net = Simnet::Start(o);
  ASSERT_TRUE(net.ok());
  Client client;
  std::map<std::string, std::string> first;
  for (int round = 0; round < 2; ++round) {
    for (const Account& account : (*net)->network().accounts()) {
      if (account.status != AccountStatus::kActive) continue;
      Got car = client.Get((*net)->pds_url(account.pds) +
                           "/xrpc/com.atproto.sync.getRepo?did=" + Escape(account.did));
      ASSERT_EQ(car.status, 200);
      if (round == 0) {
        first[account.did] = car.body;
      } else {
        EXPECT_EQ(first[account.did], car.body) << account.did;
      }
    }
  }
  EXPECT_GE((*net)->stats().repos_built, 2 * first.size());
}

// A network of 10 accounts on one PDS whose faults are `spec`.
std::unique_ptr<Simnet> Faulty(std::string_view spec, int64_t hold_ms = 5'000) {
  SimnetOptions o;
  o.seed = 9;
  o.accounts = 10;
  o.pds_hosts = 2;
  o.min_records = 5;
  o.max_records = 5;
  o.did_web_share = 0;
  o.deactivated_share = 0;
  o.takendown_share = 0;
  o.timeout_hold_ms = hold_ms;
  o.oversize_record_bytes = 100'000;
  Result<std::vector<FaultRule>> rules = ParseFaultSpec(spec);
  EXPECT_TRUE(rules.ok()) << rules.status().ToString();
  if (rules.ok()) o.faults = *rules;
  Result<std::unique_ptr<Simnet>> net = Simnet::Start(o);
  EXPECT_TRUE(net.ok()) << net.status().ToString();
  return net.ok() ? std::move(*net) : nullptr;
}

const Account& OnPds(const Simnet& net, uint32_t pds) {
  for (const Account& a : net.network().accounts()) {
    if (a.pds == pds) return a;
  }
  return net.network().accounts().front();
}

std::string StatusUrl(const Simnet& net, uint32_t pds) {
  return net.pds_url(pds) +
         "/xrpc/com.atproto.sync.getRepoStatus?did=" + Escape(OnPds(net, pds).did);
}

TEST(SimnetFaultTest, ExtraLatencyDelaysOnlyTheHostItIsSetOn) {
  auto net = Faulty("pds-0001:latency_ms=200");
  ASSERT_NE(net, nullptr);
  Client client;
  Got slow = client.Get(StatusUrl(*net, 0));
  Got fast = client.Get(StatusUrl(*net, 1));
  EXPECT_EQ(slow.status, 200);
  EXPECT_EQ(fast.status, 200);
  EXPECT_GE(slow.seconds, 0.2);
  EXPECT_LT(fast.seconds, slow.seconds);
}

TEST(SimnetFaultTest, RateLimitAnswers429WithResetHeaders) {
  auto net = Faulty("pds-0001:rate_limit=always,reset_s=7");
  ASSERT_NE(net, nullptr);
  Client client;
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  Got got = client.Get(StatusUrl(*net, 0));
  EXPECT_EQ(got.status, 429);
  EXPECT_NE(got.body.find("RateLimitExceeded"), std::string::npos);
  EXPECT_EQ(got.headers["retry-after"], "7");
  const int64_t reset = std::stoll(got.headers["ratelimit-reset"]);
  EXPECT_GE(reset, now + 6);
  EXPECT_LE(reset, now + 9);
  EXPECT_EQ(got.headers["ratelimit-remaining"], "0");
  EXPECT_EQ(client.Get(StatusUrl(*net, 1)).status, 200);
  EXPECT_EQ(net->stats().rate_limited, 1u);
}

TEST(SimnetFaultTest, ServerErrorsCycleThroughFiveHundreds) {
  auto net = Faulty("pds-0001:error=1/2");
  ASSERT_NE(net, nullptr);
  Client client;
  std::vector<long> statuses;
  for (int i = 0; i < 6; ++i) statuses.push_back(client.Get(StatusUrl(*net, 0)).status);
  // Request n of the host fails when n % 2 < 1; the status cycles 500, 502, 503 by n % 3.
  EXPECT_EQ(statuses, (std::vector<long>{500, 200, 503, 200, 502, 200}));
  auto fixed = Faulty("pds:error=always,error_status=503");
  ASSERT_NE(fixed, nullptr);
  EXPECT_EQ(client.Get(StatusUrl(*fixed, 1)).status, 503);
  auto cycling = Faulty("pds-0002:error=always");
  ASSERT_NE(cycling, nullptr);
  std::set<long> seen;
  for (int i = 0; i < 3; ++i) seen.insert(client.Get(StatusUrl(*cycling, 1)).status);
  EXPECT_EQ(seen, (std::set<long>{500, 502, 503}));
}

TEST(SimnetFaultTest, TimeoutHoldsTheRequestPastTheClientTimeout) {
  auto net = Faulty("relay:timeout=always", 3'000);
  ASSERT_NE(net, nullptr);
  Client client;
  Got got = client.Get(net->relay_url() + "/xrpc/com.atproto.sync.listRepos?limit=5", 300);
  EXPECT_EQ(got.code, CURLE_OPERATION_TIMEDOUT);
  EXPECT_EQ(net->stats().timeouts, 1u);
  EXPECT_EQ(client.Get(StatusUrl(*net, 0)).status, 200);
}

TEST(SimnetFaultTest, TruncatedBodiesEndBeforeTheirContentLength) {
  auto net = Faulty("pds-0001:truncate=always");
  ASSERT_NE(net, nullptr);
  Client client;
  const Account& a = OnPds(*net, 0);
  Got got = client.Get(net->pds_url(0) + "/xrpc/com.atproto.sync.getRepo?did=" + Escape(a.did));
  EXPECT_EQ(got.code, CURLE_PARTIAL_FILE);
  EXPECT_GT(std::stoul(got.headers["content-length"]), got.body.size());
  EXPECT_EQ(net->stats().truncated, 1u);
}

TEST(SimnetFaultTest, CidMismatchStatesAWrongCidInListRecordsOnly) {
  auto net = Faulty("pds-0001:cid_mismatch=1/2");
  ASSERT_NE(net, nullptr);
  const Account& a = OnPds(*net, 0);
  Result<GroundTruth> truth = net->Truth();
  ASSERT_TRUE(truth.ok());
  std::map<std::string, std::string> flagged;
  for (const TruthRecord& r : truth->records) {
    if (r.faults == "cid_mismatch") flagged[r.uri] = r.cid;
  }
  ASSERT_FALSE(flagged.empty());
  Client client;
  simdjson::dom::parser parser;
  int mismatched = 0, matched = 0;
  for (const std::string& collection : net->network().options().collections) {
    Got got =
        client.Get(net->pds_url(0) + "/xrpc/com.atproto.repo.listRecords?repo=" + Escape(a.did) +
                   "&collection=" + collection + "&limit=100");
    ASSERT_EQ(got.status, 200);
    simdjson::dom::element page = parser.parse(got.body);
    for (simdjson::dom::element r : page["records"].get_array()) {
      const std::string uri(r["uri"].get_string().value());
      const std::string stated(r["cid"].get_string().value());
      const std::string actual = atproto::CidOfRecord(simdjson::minify(r["value"]))->ToString();
      if (flagged.contains(uri)) {
        EXPECT_NE(stated, actual) << uri;
        EXPECT_EQ(flagged[uri], actual) << "the truth holds the real CID";
        ++mismatched;
      } else {
        EXPECT_EQ(stated, actual) << uri;
        ++matched;
      }
    }
  }
  EXPECT_GT(mismatched, 0);
  EXPECT_GT(matched, 0);
}

TEST(SimnetFaultTest, OversizeRecordsAreServedWhole) {
  auto net = Faulty("pds-0001:oversize=always");
  ASSERT_NE(net, nullptr);
  const Account& a = OnPds(*net, 0);
  Client client;
  size_t served = 0;
  for (const std::string& collection : net->network().options().collections) {
    Got got =
        client.Get(net->pds_url(0) + "/xrpc/com.atproto.repo.listRecords?repo=" + Escape(a.did) +
                   "&collection=" + collection);
    ASSERT_EQ(got.status, 200);
    served += got.body.size();
  }
  EXPECT_GT(served, 5u * 100'000);
  Got car = client.Get(net->pds_url(0) + "/xrpc/com.atproto.sync.getRepo?did=" + Escape(a.did));
  ASSERT_EQ(car.status, 200);
  Result<atproto::RepoReader> reader = atproto::RepoReader::Open(AsBytes(car.body));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  int big = 0;
  ASSERT_TRUE(reader
                  ->ForEachRecord(
                      [&](const atproto::RepoRecord& r) {
                        big += r.cbor.size() > 100'000;
                        return Status::OK();
                      },
                      nullptr)
                  .ok());
  EXPECT_EQ(big, 5);
  Result<GroundTruth> truth = net->Truth();
  ASSERT_TRUE(truth.ok());
  int flagged = 0;
  for (const TruthRecord& r : truth->records) flagged += r.faults == "oversize";
  EXPECT_GE(flagged, 5);
}

TEST(SimnetFaultTest, BadSignatureCommitsDoNotVerifyWithTheDocumentKey) {
  auto net = Faulty("pds-0001:bad_signature=always");
  ASSERT_NE(net, nullptr);
  Client client;
  int bad = 0, good = 0;
  for (const Account& a : net->network().accounts()) {
    const DidDoc doc = Resolve(client, *net, a.did);
    Got car = client.Get(doc.endpoint + "/xrpc/com.atproto.sync.getRepo?did=" + Escape(a.did));
    ASSERT_EQ(car.status, 200);
    Result<atproto::RepoReader> reader = atproto::RepoReader::Open(AsBytes(car.body));
    ASSERT_TRUE(reader.ok());
    const Status verified = reader->VerifySignature(*atproto::PublicKey::FromMultibase(doc.key));
    EXPECT_EQ(verified.ok(), a.pds != 0) << a.did;
    EXPECT_EQ(a.bad_signature, a.pds == 0);
    (verified.ok() ? good : bad)++;
  }
  EXPECT_GT(bad, 0);
  EXPECT_GT(good, 0);
}

TEST(SimnetFaultTest, DidDocumentsCanPointAtPrivateOrNonHttpEndpoints) {
  auto net = Faulty("pds-0001:private_endpoint=always;pds-0002:bad_scheme=always");
  ASSERT_NE(net, nullptr);
  Client client;
  int privates = 0, schemes = 0;
  for (const Account& a : net->network().accounts()) {
    const DidDoc doc = Resolve(client, *net, a.did);
    if (a.pds == 0) {
      EXPECT_EQ(doc.endpoint, "http://10.0.0.1");
      ++privates;
    } else {
      EXPECT_TRUE(doc.endpoint.starts_with("ftp://pds-0002.localhost:")) << doc.endpoint;
      ++schemes;
    }
  }
  EXPECT_GT(privates, 0);
  EXPECT_GT(schemes, 0);
  Result<GroundTruth> truth = net->Truth();
  ASSERT_TRUE(truth.ok());
  for (const TruthAccount& a : truth->accounts) EXPECT_TRUE(a.bad_endpoint) << a.did;
}

TEST(SimnetFaultTest, HostShareChoosesADeterministicSubset) {
  SimnetOptions o;
  o.pds_hosts = 40;
  o.accounts = 40;
  o.faults = *ParseFaultSpec("pds@0.25:rate_limit=always");
  Result<std::unique_ptr<Network>> a = Network::Generate(o, 1);
  Result<std::unique_ptr<Network>> b = Network::Generate(o, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  int chosen = 0;
  for (uint32_t p = 0; p < 40; ++p) {
    const bool hit = (*a)->faults((*a)->PdsHostId(p)).rate_limit.enabled();
    EXPECT_EQ(hit, (*b)->faults((*b)->PdsHostId(p)).rate_limit.enabled());
    chosen += hit;
  }
  EXPECT_GT(chosen, 3);
  EXPECT_LT(chosen, 20);
  EXPECT_FALSE((*a)->faults(0).rate_limit.enabled()) << "the relay is not a PDS";
}

TEST(SimnetFaultTest, MalformedSpecsAndOptionsAreRefusedWithTheirReason) {
  EXPECT_FALSE(ParseFaultSpec("pds").ok());
  EXPECT_FALSE(ParseFaultSpec("pds:rate_limit=2").ok());
  EXPECT_FALSE(ParseFaultSpec("pds:rate_limit=3/2").ok());
  EXPECT_NE(ParseFaultSpec("pds:bogus=1").status().message().find("bogus"), std::string::npos);
  EXPECT_FALSE(ParseFaultSpec("pds@2:timeout=always").ok());
  EXPECT_FALSE(ParseFaultSpec("pds:error_status=404,error=always").ok());
  Result<std::vector<FaultRule>> ok =
      ParseFaultSpec(" ; relay:latency_ms=5 ;pds-0001:truncate=0.5");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->size(), 2u);
  SimnetOptions o;
  o.collections = {"not a nsid"};
  EXPECT_FALSE(o.Validate().ok());
  o = SimnetOptions();
  o.accounts = 0;
  EXPECT_FALSE(o.Validate().ok());
  o = SimnetOptions();
  o.min_records = 5;
  o.max_records = 4;
  EXPECT_FALSE(o.Validate().ok());
}

TEST(SimnetTest, UnknownHostsMethodsAndReposAnswerXrpcErrors) {
  auto net = Faulty("");
  ASSERT_NE(net, nullptr);
  Client client;
  const std::string port = std::to_string(net->port());
  EXPECT_EQ(client.Get("http://nowhere.localhost:" + port + "/").status, 404);
  Got method = client.Get(net->pds_url(0) + "/xrpc/com.atproto.sync.getBlob");
  EXPECT_EQ(method.status, 501);
  EXPECT_NE(method.body.find("MethodNotImplemented"), std::string::npos);
  Got unknown = client.Get(net->pds_url(0) + "/xrpc/com.atproto.sync.getRepo?did=did:plc:nobody");
  EXPECT_EQ(unknown.status, 400);
  EXPECT_NE(unknown.body.find("RepoNotFound"), std::string::npos);
  // An account asked of another PDS than its own is not found there.
  const Account& a = OnPds(*net, 0);
  EXPECT_EQ(
      client.Get(net->pds_url(1) + "/xrpc/com.atproto.sync.getRepo?did=" + Escape(a.did)).status,
      400);
  EXPECT_EQ(client.Get(net->plc_url() + "/did:plc:nobody").status, 404);
  EXPECT_EQ(client.Get(net->relay_url() + "/xrpc/com.atproto.sync.listRepos?limit=0").status, 400);
}

struct MultiRun {
  int done = 0;
  double seconds = 0;
};

// Fetches every URL `rounds` times through one curl multi handle (one easy handle per URL, so
// each keeps its connection), at most `per_host` connections per host.
MultiRun FetchConcurrently(const std::vector<std::string>& urls, int rounds, long per_host) {
  CURLM* multi = curl_multi_init();
  curl_multi_setopt(multi, CURLMOPT_MAX_HOST_CONNECTIONS, per_host);
  std::vector<CURL*> handles;
  std::vector<std::string> bodies(urls.size());
  MultiRun run;
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < urls.size(); ++i) {
      CURL* h = round == 0 ? curl_easy_init() : handles[i];
      if (round == 0) handles.push_back(h);
      bodies[i].clear();
      curl_easy_setopt(h, CURLOPT_URL, urls[i].c_str());
      curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, OnBody);
      curl_easy_setopt(h, CURLOPT_WRITEDATA, &bodies[i]);
      curl_easy_setopt(h, CURLOPT_IPRESOLVE, CURL_IPRESOLVE_V4);
      curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20'000L);
      curl_multi_add_handle(multi, h);
    }
    int running = 1;
    while (running > 0) {
      curl_multi_perform(multi, &running);
      int queued = 0;
      while (CURLMsg* msg = curl_multi_info_read(multi, &queued)) {
        if (msg->msg != CURLMSG_DONE) continue;
        long status = 0;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
        EXPECT_EQ(msg->data.result, CURLE_OK);
        EXPECT_EQ(status, 200);
        curl_multi_remove_handle(multi, msg->easy_handle);
        ++run.done;
      }
      if (running > 0) curl_multi_poll(multi, nullptr, 0, 100, nullptr);
    }
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (CURL* h : handles) curl_easy_cleanup(h);
  curl_multi_cleanup(multi);
  return run;
}

// Many hosts, a few connections each, at 50 ms latency: the answers overlap (timers, not
// sleeping threads), so the wall time stays near rounds x latency rather than requests x latency.
TEST(SimnetTest, ServesManyConcurrentConnectionsWithLatency) {
  SimnetOptions o;
  o.accounts = 1000;
  o.pds_hosts = 500;
  o.latency_ms = 50;
  o.max_records = 3;
  Result<std::unique_ptr<Simnet>> net = Simnet::Start(o);
  ASSERT_TRUE(net.ok());
  constexpr int kPerHost = 3, kRounds = 2;
  std::vector<std::string> urls;
  for (uint32_t p = 0; p < 500; ++p) {
    for (int c = 0; c < kPerHost; ++c) urls.push_back((*net)->pds_url(p) + "/xrpc/_health");
  }
  const MultiRun run = FetchConcurrently(urls, kRounds, kPerHost);
  EXPECT_EQ(run.done, 500 * kPerHost * kRounds);
  const SimnetStats stats = (*net)->stats();
  EXPECT_EQ(stats.requests, static_cast<uint64_t>(run.done));
  EXPECT_GE(stats.connections, 500u * kPerHost);
  // Serialised, 3000 answers of 50 ms would take 150 s.
  EXPECT_LT(run.seconds, 15.0);
  std::printf("[ simnet ] %d requests on %llu connections at 50 ms latency in %.2f s\n", run.done,
              static_cast<unsigned long long>(stats.connections), run.seconds);
}

// Throughput with no latency: listRecords pages of cached repos over 32 keep-alive connections.
TEST(SimnetTest, ThroughputWithoutLatency) {
  SimnetOptions o;
  o.accounts = 64;
  o.pds_hosts = 8;
  o.min_records = 20;
  o.max_records = 20;
  o.deactivated_share = 0;
  o.takendown_share = 0;
  o.did_web_share = 0;
  Result<std::unique_ptr<Simnet>> net = Simnet::Start(o);
  ASSERT_TRUE(net.ok());
  std::vector<std::string> urls;
  for (const Account& a : (*net)->network().accounts()) {
    if (urls.size() == 32) break;
    urls.push_back((*net)->pds_url(a.pds) + "/xrpc/com.atproto.repo.listRecords?repo=" +
                   Escape(a.did) + "&collection=app.bsky.feed.post&limit=10");
  }
  constexpr int kRounds = 100;
  const MultiRun run = FetchConcurrently(urls, kRounds, 32);
  EXPECT_EQ(run.done, static_cast<int>(urls.size()) * kRounds);
  std::printf("[ simnet ] %d listRecords requests in %.2f s: %.0f requests/s\n", run.done,
              run.seconds, run.done / run.seconds);
}

}  // namespace
}  // namespace atfill::simnet
