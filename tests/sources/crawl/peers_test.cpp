// The reference peers (../shared/peers: a PLC directory and the reference PDS) brought up by the
// test fixture: the manifest is parsed, the PDS serves exactly what the manifest says, and the
// crawl backfills it (listRepos discovery, both fetch modes) into a table equal to the manifest.
#include "tests/common/peers.hpp"
#include "tests/common/crawl_job.hpp"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "atproto/cid.hpp"
#include "atproto/json.hpp"
#include "net/http_client.hpp"
#include "pipeline/run.hpp"
#include "sinks/sqlite_reader.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/crawl/crawl_source.hpp"
#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
#include "state/crawl_log.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"
#include "state/resolver_cache.hpp"
#include "state/tombstones.hpp"
#include "tests/common/process.hpp"
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
  ATFILL_PEERS_UP(peers, kSeedArgs);
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

// ---- The crawl against the peers ----------------------------------------------------------------

// Five accounts, the last deactivated and the one before it taken down: listRepos lists both as
// inactive and the crawl must skip them.
const std::vector<std::string> kCrawlSeedArgs = {
    "--accounts", "5", "--records", "30", "--batch", "50", "--deactivate", "1", "--takedown", "1"};

using sources::CrawlOptions;
using sources::Discovery;
using sources::FetchMode;

// Where two JSON values first differ ("" when they are the same value). Objects are compared as
// sets of members (the PDS and our getRepo encoding may order keys differently); arrays, strings
// and numbers exactly, integers by value and kind (atproto has no floats).
std::string JsonDiff(simdjson::dom::element a, simdjson::dom::element b, const std::string& path) {
  using simdjson::dom::element_type;
  if (a.type() != b.type()) {
    return path + ": " + simdjson::minify(a) + " vs " + simdjson::minify(b);
  }
  switch (a.type()) {
    case element_type::ARRAY: {
      simdjson::dom::array x, y;
      if (a.get(x) != simdjson::SUCCESS || b.get(y) != simdjson::SUCCESS) return path + ": ?";
      if (x.size() != y.size()) {
        return path + ": " + std::to_string(x.size()) + " vs " + std::to_string(y.size()) +
               " elements";
      }
      size_t i = 0;
      for (auto xi = x.begin(), yi = y.begin(); xi != x.end(); ++xi, ++yi, ++i) {
        std::string d = JsonDiff(*xi, *yi, path + "[" + std::to_string(i) + "]");
        if (!d.empty()) return d;
      }
      return "";
    }
    case element_type::OBJECT: {
      simdjson::dom::object ox, oy;
      if (a.get(ox) != simdjson::SUCCESS || b.get(oy) != simdjson::SUCCESS) return path + ": ?";
      std::map<std::string_view, simdjson::dom::element> x, y;
      for (auto field : ox) {
        if (!x.emplace(field.key, field.value).second) return path + ": duplicate key (left)";
      }
      for (auto field : oy) {
        if (!y.emplace(field.key, field.value).second) return path + ": duplicate key (right)";
      }
      for (const auto& [key, value] : x) {
        auto it = y.find(key);
        if (it == y.end()) return path + "." + std::string(key) + ": missing on the right";
        std::string d = JsonDiff(value, it->second, path + "." + std::string(key));
        if (!d.empty()) return d;
      }
      for (const auto& [key, value] : y) {
        if (x.count(key) == 0) return path + "." + std::string(key) + ": missing on the left";
      }
      return "";
    }
    default:
      // Scalars of one type: their compact text is their value (strings re-escaped the same way).
      return simdjson::minify(a) == simdjson::minify(b)
                 ? ""
                 : path + ": " + simdjson::minify(a) + " vs " + simdjson::minify(b);
  }
}

std::string JsonDiff(const std::string& left, const std::string& right) {
  simdjson::dom::parser pa, pb;
  simdjson::dom::element a, b;
  if (pa.parse(left).get(a) != simdjson::SUCCESS) return "left is not JSON: " + left;
  if (pb.parse(right).get(b) != simdjson::SUCCESS) return "right is not JSON: " + right;
  return JsonDiff(a, b, "$");
}

TEST(PeerCrawlCompareTest, JsonDiffIgnoresMemberOrderOnly) {
  EXPECT_EQ(JsonDiff(R"({"a":1,"b":[{"x":"s","y":null}]})", R"({"b":[{"y":null,"x":"s"}],"a":1})"),
            "");
  EXPECT_EQ(JsonDiff(R"({"n":9007199254740991})", R"({"n":9007199254740990})"),
            "$.n: 9007199254740991 vs 9007199254740990");
  EXPECT_EQ(JsonDiff(R"({"a":{"b":1}})", R"({"a":{}})"), "$.a.b: missing on the right");
  EXPECT_EQ(JsonDiff(R"({"a":{}})", R"({"a":{"b":1}})"), "$.a.b: missing on the left");
  EXPECT_EQ(JsonDiff(R"([1,2])", R"([2,1])"), "$[0]: 1 vs 2");
  EXPECT_EQ(JsonDiff(R"([1])", R"([1,1])"), "$: 1 vs 2 elements");
  EXPECT_EQ(JsonDiff(R"({"s":"\u00e9"})", "{\"s\":\"\xC3\xA9\"}"), "");
  EXPECT_EQ(JsonDiff(R"({"s":"1"})", R"({"s":1})"), "$.s: \"1\" vs 1");
  EXPECT_EQ(JsonDiff(R"({"a":1,"a":1})", R"({"a":1})"), "$: duplicate key (left)");
  EXPECT_NE(JsonDiff("{", "{}").find("left is not JSON"), std::string::npos);
}

// Every collection the manifest names, in its live and its deleted records.
std::vector<std::string> ManifestCollections(const PeerManifest& m) {
  std::set<std::string> out;
  for (const PeerAccount& a : m.accounts) {
    for (const PeerRecord& r : a.records) out.insert(r.collection);
    for (const std::string& uri : a.deleted) {
      std::string did, collection, rkey;
      if (SplitUri(uri, &did, &collection, &rkey)) out.insert(collection);
    }
  }
  return {out.begin(), out.end()};
}

CrawlOptions PeerCrawl(const PeerNetwork& peers, const std::vector<std::string>& collections,
                       FetchMode mode) {
  CrawlOptions o;
  o.discovery = Discovery::kListRepos;
  o.mode = mode;
  // listRepos of the PDS itself: it serves no listReposByCollection.
  o.relay_url = peers.pds_url();
  o.resolver.plc_url = peers.plc_url();
  o.collections = collections;
  o.allow_loopback_endpoints = true;
  // Small pages, so that paging (and the PDS's cursor on the last page, then an empty page) is
  // exercised in both listings.
  o.list_repos_limit = 2;
  o.list_records_limit = 7;
  o.retry_delay_ms = 200;
  o.tick_ms = 20;
  o.http.timeout_ms = 20'000;
  o.http.retry.base_backoff_ms = 50;
  o.resolver_http.timeout_ms = 20'000;
  o.resolver_http.retry.base_backoff_ms = 50;
  return o;
}

using PeerCrawlRun = CrawlJobRun;

PeerCrawlRun RunPeerCrawl(const std::filesystem::path& state_dir, const std::string& db,
                          const CrawlOptions& options, const std::string& job_name,
                          const std::function<void(state::KvStore&)>& prepare = nullptr) {
  return RunCrawlJob(state_dir, db, options, job_name, prepare);
}

struct Expected {
  const PeerRecord* record = nullptr;
  const PeerAccount* account = nullptr;
};

// The live records of `accounts` by URI.
std::map<std::string, Expected> LiveRecords(const std::vector<const PeerAccount*>& accounts) {
  std::map<std::string, Expected> out;
  for (const PeerAccount* a : accounts) {
    for (const PeerRecord& r : a->records) out[r.uri] = {&r, a};
  }
  return out;
}

// The table holds exactly `want`: the same URIs, each with the manifest's CID, a body whose CID
// is that CID and which is the manifest's value as JSON; in getRepo mode the rev of the account's
// head commit on every row, in listRecords mode none.
void ExpectTableEquals(const std::vector<sinks::RecordRow>& rows,
                       const std::map<std::string, Expected>& want, FetchMode mode) {
  std::set<std::string> seen;
  for (const sinks::RecordRow& row : rows) {
    SCOPED_TRACE(row.uri);
    EXPECT_TRUE(seen.insert(row.uri).second) << "twice in the table";
    auto it = want.find(row.uri);
    if (it == want.end()) {
      ADD_FAILURE() << "in the table but not a live record of the manifest: " << row.record;
      continue;
    }
    const PeerRecord& r = *it->second.record;
    EXPECT_EQ(row.did, it->second.account->did);
    EXPECT_EQ(row.collection, r.collection);
    EXPECT_EQ(row.rkey, r.rkey);
    EXPECT_EQ(row.cid, r.cid);
    Result<atproto::Cid> body_cid = atproto::CidOfRecord(row.record);
    ASSERT_TRUE(body_cid.ok()) << body_cid.status().ToString() << ": " << row.record;
    EXPECT_EQ(body_cid->ToString(), r.cid) << row.record;
    EXPECT_EQ(JsonDiff(row.record, r.value_json), "")
        << "stored " << row.record << "\nmanifest " << r.value_json;
    if (mode == FetchMode::kGetRepo) {
      EXPECT_EQ(row.rev, it->second.account->head_rev);
    } else {
      EXPECT_EQ(row.rev, "");
    }
  }
  for (const auto& [uri, expected] : want) {
    EXPECT_EQ(seen.count(uri), 1u) << "live in the manifest, missing from the table: " << uri;
  }
}

TEST(PeersTest, CrawlBackfillsThePdsInBothModes) {
  ATFILL_PEERS_UP(peers, kCrawlSeedArgs);
  const PeerManifest& m = peers.manifest();

  std::vector<const PeerAccount*> active;
  std::set<std::string> inactive_dids;
  for (const PeerAccount& a : m.accounts) {
    if (a.active) {
      active.push_back(&a);
    } else {
      inactive_dids.insert(a.did);
    }
  }
  ASSERT_EQ(active.size(), 3u);
  ASSERT_EQ(inactive_dids.size(), 2u);
  const std::map<std::string, Expected> want = LiveRecords(active);
  ASSERT_GT(want.size(), 50u);
  // The inactive accounts hold live records too, which the crawl must not fetch.
  size_t inactive_records = 0;
  for (const PeerAccount& a : m.accounts) {
    if (!a.active) inactive_records += a.records.size();
  }
  ASSERT_GT(inactive_records, 0u);
  ASSERT_EQ(want.size() + inactive_records, m.live_records);
  ASSERT_FALSE(m.deleted.empty());
  const std::vector<std::string> collections = ManifestCollections(m);
  ASSERT_GE(collections.size(), 3u);

  TempDir dir;
  for (FetchMode mode : {FetchMode::kListRecords, FetchMode::kGetRepo}) {
    const std::string name(sources::FetchModeName(mode));
    SCOPED_TRACE(name);
    const auto t0 = std::chrono::steady_clock::now();
    PeerCrawlRun run = RunPeerCrawl(dir / ("state-" + name), (dir / (name + ".sqlite")).string(),
                                    PeerCrawl(peers, collections, mode), "crawl");
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    std::printf("crawl %s of the PDS: %zu records in %lld ms\n", name.c_str(), run.rows.size(),
                static_cast<long long>(ms));
    EXPECT_EQ(run.job.status, state::JobStatus::kCompleted) << Describe(run);
    EXPECT_TRUE(run.error_kinds.empty()) << Describe(run);
    ExpectTableEquals(run.rows, want, mode);
    for (const std::string& uri : m.deleted) {
      EXPECT_EQ(std::count_if(run.rows.begin(), run.rows.end(),
                              [&](const sinks::RecordRow& r) { return r.uri == uri; }),
                0)
          << "deleted in the manifest, present in the table: " << uri;
    }

    // listRepos: 5 repos in pages of 2 (3 pages, then the empty page after the last cursor); the
    // two inactive ones listed and skipped.
    const auto& extra = run.job.counters.extra;
    auto counter = [&extra](const char* key) {
      auto it = extra.find(key);
      return it == extra.end() ? uint64_t{0} : it->second;
    };
    EXPECT_EQ(counter("repos_listed"), m.accounts.size());
    EXPECT_EQ(counter("repos_inactive_skipped"), inactive_dids.size());
    EXPECT_EQ(run.stats.listing_pages, 4u);
    const uint64_t units =
        mode == FetchMode::kGetRepo ? active.size() : active.size() * collections.size();
    EXPECT_EQ(run.stats.units_queued, units);
    EXPECT_EQ(run.stats.units_finished, units);
    EXPECT_EQ(run.stats.units_failed, 0u);
    EXPECT_EQ(run.stats.units_deferred, 0u);

    // One recent entry per unit, none for an inactive account; in getRepo mode each is a repo
    // whose commit verified, at the head rev of the manifest.
    EXPECT_EQ(run.recent.size(), units);
    for (const state::RecentRepo& r : run.recent) {
      EXPECT_EQ(r.outcome, "ok") << r.did;
      EXPECT_EQ(inactive_dids.count(r.did), 0u) << r.did;
      EXPECT_EQ(r.host, peers.pds_url()) << r.did;
      if (mode == FetchMode::kGetRepo) {
        const auto a = std::find_if(active.begin(), active.end(),
                                    [&](const PeerAccount* p) { return p->did == r.did; });
        ASSERT_NE(a, active.end()) << r.did;
        EXPECT_EQ(r.rev, (*a)->head_rev) << r.did;
        EXPECT_EQ(r.records, LiveRecords({*a}).size()) << r.did;
      }
    }
    if (mode == FetchMode::kListRecords) {
      // Paging: pages of 7, and the empty page the PDS answers after its last cursor.
      EXPECT_GT(run.stats.fetch_requests, 2 * units);
    }
  }

  // Signatures are checked: the same DIDs fetched again by getRepo (an account backfill of two of
  // them), with the resolver cache of the getRepo run holding, for the first, the signing key of
  // the second. That repo fails with bad_signature and none of its records are written; the other
  // is complete.
  const PeerAccount& forged = *active[0];
  const PeerAccount& honest = *active[1];
  CrawlOptions options = PeerCrawl(peers, collections, FetchMode::kGetRepo);
  options.discovery = Discovery::kDidList;
  options.dids = {forged.did, honest.did};
  std::string forged_key, honest_key;
  PeerCrawlRun run = RunPeerCrawl(
      dir / "state-getRepo", (dir / "forged.sqlite").string(), options, "forged-key",
      [&](state::KvStore& kv) {
        state::ResolverCache cache(kv);
        const int64_t now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count();
        auto f = cache.Get(forged.did, now_us);
        auto h = cache.Get(honest.did, now_us);
        ASSERT_TRUE(f.ok() && h.ok());
        ASSERT_TRUE(f->has_value() && h->has_value()) << "the getRepo run cached no resolution";
        forged_key = (*f)->signing_key;
        honest_key = (*h)->signing_key;
        state::ResolvedDid entry = **f;
        entry.signing_key = honest_key;
        ASSERT_TRUE(cache.Store(forged.did, entry).ok());
      });
  ASSERT_FALSE(forged_key.empty());
  ASSERT_NE(forged_key, honest_key);
  EXPECT_EQ(run.job.status, state::JobStatus::kCompleted) << Describe(run);
  EXPECT_EQ(run.error_kinds, (std::map<std::string, uint64_t>{{"bad_signature", 1}}))
      << Describe(run);
  ASSERT_EQ(run.errors.size(), 1u) << Describe(run);
  EXPECT_EQ(run.errors[0].key, forged.did);
  ExpectTableEquals(run.rows, LiveRecords({&honest}), FetchMode::kGetRepo);

  const Status down = peers.Down();
  EXPECT_TRUE(down.ok()) << down.ToString();
}

}  // namespace
}  // namespace atfill::testing
