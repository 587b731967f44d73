// The reference peers (../shared/peers: a PLC directory and the reference PDS) brought up by the
// test fixture: the manifest is parsed, and the PDS serves exactly what the manifest says.
#include "tests/common/peers.hpp"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "net/http_client.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::testing {
namespace {

// Small enough to seed in a few seconds; --batch uses applyWrites (about 5x faster).
const std::vector<std::string> kSeedArgs = {"--accounts", "4", "--records", "30", "--batch", "50"};

std::unique_ptr<net::HttpClient> StartClient() {
  net::HttpClientOptions options;
  options.allow_private_addresses = true;
  options.connect_timeout_ms = 5'000;
  options.timeout_ms = 20'000;
  Result<std::unique_ptr<net::HttpClient>> client = net::HttpClient::Start(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(*client) : nullptr;
}

Result<net::HttpResponse> Get(net::HttpClient& client, std::string url, int attempts = 5) {
  net::HttpRequest request;
  request.url = std::move(url);
  request.retry = net::RetryPolicy{};
  request.retry->max_attempts = attempts;
  return client.Fetch(std::move(request));
}

std::string GetRecordUrl(const std::string& pds, const std::string& repo,
                         const std::string& collection, const std::string& rkey) {
  return pds + "/xrpc/com.atproto.repo.getRecord?repo=" + repo + "&collection=" + collection +
         "&rkey=" + rkey;
}

// Splits at://<did>/<collection>/<rkey>; false when `uri` is not of that form.
bool SplitUri(const std::string& uri, std::string* did, std::string* collection,
              std::string* rkey) {
  constexpr std::string_view kScheme = "at://";
  if (uri.rfind(kScheme, 0) != 0) return false;
  const size_t a = uri.find('/', kScheme.size());
  const size_t b = a == std::string::npos ? a : uri.find('/', a + 1);
  if (b == std::string::npos || uri.find('/', b + 1) != std::string::npos) return false;
  *did = uri.substr(kScheme.size(), a - kScheme.size());
  *collection = uri.substr(a + 1, b - a - 1);
  *rkey = uri.substr(b + 1);
  return !did->empty() && !collection->empty() && !rkey->empty();
}

constexpr std::string_view kManifest = R"({
  "version": 1,
  "pds": {"url": "http://localhost:1", "did": "did:web:localhost", "version": "0.5.35"},
  "plc": {"url": "http://localhost:2"},
  "totals": {"accounts": 2, "liveRecords": 1, "deleted": 1, "updated": 0},
  "accounts": [
    {"did": "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "handle": "a.test", "pdsUrl": "http://localhost:1",
     "head": {"cid": "bafyhead", "rev": "3rev"}, "status": {"active": true},
     "records": [{"uri": "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/x.y.z/k1", "collection": "x.y.z",
                  "rkey": "k1", "cid": "bafyrec",
                  "value": {"$type": "x.y.z", "n": 9007199254740991, "s": "h\u00e9 \"q\""}}],
     "deleted": ["at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/x.y.z/k0"]},
    {"did": "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb", "handle": "b.test", "pdsUrl": "http://localhost:1",
     "head": {"cid": "bafyhead2", "rev": "3rev2"},
     "status": {"active": false, "status": "deactivated"}, "records": [], "deleted": []}
  ],
  "deleted": ["at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/x.y.z/k0"]
})";

TEST(PeerManifestTest, ParsesEveryField) {
  Result<PeerManifest> m = ParsePeerManifest(kManifest);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->pds_url, "http://localhost:1");
  EXPECT_EQ(m->pds_did, "did:web:localhost");
  EXPECT_EQ(m->plc_url, "http://localhost:2");
  EXPECT_EQ(m->live_records, 1u);
  ASSERT_EQ(m->accounts.size(), 2u);
  const PeerAccount& a = m->accounts[0];
  EXPECT_EQ(a.did, "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa");
  EXPECT_EQ(a.handle, "a.test");
  EXPECT_EQ(a.pds_url, "http://localhost:1");
  EXPECT_TRUE(a.active);
  EXPECT_EQ(a.status, "");
  EXPECT_EQ(a.head_cid, "bafyhead");
  EXPECT_EQ(a.head_rev, "3rev");
  ASSERT_EQ(a.records.size(), 1u);
  EXPECT_EQ(a.records[0].uri, "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/x.y.z/k1");
  EXPECT_EQ(a.records[0].collection, "x.y.z");
  EXPECT_EQ(a.records[0].rkey, "k1");
  EXPECT_EQ(a.records[0].cid, "bafyrec");
  EXPECT_EQ(a.records[0].value_json,
            "{\"$type\":\"x.y.z\",\"n\":9007199254740991,\"s\":\"h\xC3\xA9 \\\"q\\\"\"}");
  EXPECT_EQ(a.deleted, std::vector<std::string>{"at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/x.y.z/k0"});
  EXPECT_FALSE(m->accounts[1].active);
  EXPECT_EQ(m->accounts[1].status, "deactivated");
  EXPECT_TRUE(m->accounts[1].records.empty());
  EXPECT_EQ(m->deleted, a.deleted);
}

TEST(PeerManifestTest, NamesTheBadMember) {
  Result<PeerManifest> not_json = ParsePeerManifest("{\"pds\":");
  ASSERT_FALSE(not_json.ok());
  EXPECT_EQ(not_json.status().code(), StatusCode::kInvalid);
  EXPECT_NE(not_json.status().message().find("not JSON"), std::string::npos)
      << not_json.status().ToString();

  std::string no_cid(kManifest);
  no_cid.replace(no_cid.find("\"cid\": \"bafyrec\""), 16, "\"cid\": 7");
  Result<PeerManifest> bad = ParsePeerManifest(no_cid);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalid);
  EXPECT_NE(bad.status().message().find("accounts[0].records[0].cid: missing or not a string"),
            std::string::npos)
      << bad.status().ToString();

  std::string bad_active(kManifest);
  bad_active.replace(bad_active.find("\"active\": false"), 15, "\"active\": \"no\"");
  Result<PeerManifest> bad2 = ParsePeerManifest(bad_active);
  ASSERT_FALSE(bad2.ok());
  EXPECT_NE(bad2.status().message().find("accounts[1].status.active"), std::string::npos)
      << bad2.status().ToString();

  std::string negative(kManifest);
  negative.replace(negative.find("\"liveRecords\": 1"), 16, "\"liveRecords\": -1");
  Result<PeerManifest> bad3 = ParsePeerManifest(negative);
  ASSERT_FALSE(bad3.ok());
  EXPECT_NE(bad3.status().message().find("totals.liveRecords"), std::string::npos)
      << bad3.status().ToString();
}

TEST(PeersTest, PdsServesTheSeededManifest) {
  ATFILL_SHARED_PATH(harness, "peers/network.sh");
  Result<std::unique_ptr<PeerNetwork>> up =
      PeerNetwork::Up(SharedDir().string(), ATFILL_PEERS_HOME, kSeedArgs);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  PeerNetwork& peers = **up;
  const PeerManifest& m = peers.manifest();

  EXPECT_EQ(m.pds_url, peers.pds_url());
  EXPECT_EQ(m.plc_url, peers.plc_url());
  EXPECT_EQ(m.pds_did, "did:web:localhost");
  EXPECT_TRUE(std::filesystem::exists(peers.manifest_path()));
  ASSERT_EQ(m.accounts.size(), 4u);
  size_t live = 0;
  for (const PeerAccount& account : m.accounts) {
    EXPECT_TRUE(account.active) << account.did;
    EXPECT_EQ(account.pds_url, peers.pds_url());
    EXPECT_FALSE(account.head_cid.empty());
    EXPECT_FALSE(account.deleted.empty()) << account.did;
    live += account.records.size();
  }
  EXPECT_GT(live, 0u);
  EXPECT_EQ(live, m.live_records);
  EXPECT_FALSE(m.deleted.empty());

  std::unique_ptr<net::HttpClient> client = StartClient();
  ASSERT_NE(client, nullptr);

  // Every live record of the first account, as the PDS serves it, is the manifest's.
  const PeerAccount& account = m.accounts[0];
  ASSERT_FALSE(account.records.empty());
  simdjson::dom::parser parser;
  for (const PeerRecord& record : account.records) {
    EXPECT_EQ(record.uri, "at://" + account.did + "/" + record.collection + "/" + record.rkey);
    Result<net::HttpResponse> got =
        Get(*client, GetRecordUrl(peers.pds_url(), account.did, record.collection, record.rkey));
    ASSERT_TRUE(got.ok()) << record.uri << ": " << got.status().ToString();
    ASSERT_EQ(got->status, 200) << record.uri << ": " << got->body;
    simdjson::dom::element doc;
    ASSERT_EQ(parser.parse(got->body).get(doc), simdjson::SUCCESS) << got->body;
    std::string_view cid, uri;
    simdjson::dom::element value;
    ASSERT_EQ(doc["cid"].get(cid), simdjson::SUCCESS) << got->body;
    ASSERT_EQ(doc["uri"].get(uri), simdjson::SUCCESS) << got->body;
    ASSERT_EQ(doc["value"].get(value), simdjson::SUCCESS) << got->body;
    EXPECT_EQ(cid, record.cid) << record.uri;
    EXPECT_EQ(uri, record.uri);
    EXPECT_EQ(simdjson::minify(value), record.value_json) << record.uri;
  }

  // Deleted records are gone.
  for (const std::string& deleted : account.deleted) {
    std::string did, collection, rkey;
    ASSERT_TRUE(SplitUri(deleted, &did, &collection, &rkey)) << deleted;
    EXPECT_EQ(did, account.did);
    Result<net::HttpResponse> got =
        Get(*client, GetRecordUrl(peers.pds_url(), did, collection, rkey));
    ASSERT_TRUE(got.ok()) << deleted << ": " << got.status().ToString();
    EXPECT_TRUE(got->status == 400 || got->status == 404)
        << deleted << ": " << got->status << " " << got->body;
  }

  // Down stops the servers and removes this network's folder.
  const std::string home = peers.peers_home();
  const Status down = peers.Down();
  ASSERT_TRUE(down.ok()) << down.ToString();
  EXPECT_FALSE(std::filesystem::exists(home)) << home;
  Result<net::HttpResponse> after = Get(*client, peers.pds_url_ip() + "/xrpc/_health", 1);
  EXPECT_FALSE(after.ok()) << "the PDS still answers after Down(): " << after->status;
}

TEST(PeersTest, UpFailsNamingTheCommandAndItsStderr) {
  ATFILL_SHARED_PATH(harness, "peers/network.sh");
  Result<std::unique_ptr<PeerNetwork>> up =
      PeerNetwork::Up(SharedDir().string(), ATFILL_PEERS_HOME, {"--accounts", "1", "--bogus"});
  ASSERT_FALSE(up.ok());
  const std::string message = up.status().ToString();
  EXPECT_EQ(up.status().code(), StatusCode::kUnavailable) << message;
  EXPECT_NE(message.find("network.sh up"), std::string::npos) << message;
  EXPECT_NE(message.find("exited with code 1"), std::string::npos) << message;
  EXPECT_NE(message.find("Unknown option '--bogus'"), std::string::npos) << message;
}

}  // namespace
}  // namespace atfill::testing
