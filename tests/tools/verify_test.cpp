// `atfill verify` as a user runs it, against the reference PDS (../shared/peers): the seeded
// network backfilled into SQLite, rows then altered, deleted and inserted by hand in the SQLite
// file; verify finds exactly those, --repair makes the table equal to the manifest again, and a
// second verify is clean. A repo that cannot be checked is an error naming its DID while the
// others are checked. By default the collections compared are the config's ([crawl], [live]).
#include <gtest/gtest.h>
#include <simdjson.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "atproto/cid.hpp"
#include "atproto/json.hpp"
#include "net/http_client.hpp"
#include "sinks/sqlite_reader.hpp"
#include "tests/common/job_harness.hpp"
#include "tests/common/peers.hpp"
#include "tests/common/process.hpp"
#include "tests/common/raw_sqlite.hpp"
#include "tests/common/test_util.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill::testing {
namespace {

const std::vector<std::string> kSeedArgs = {"--accounts", "3", "--records", "20", "--batch", "50"};
// [crawl] lines of the simnet backfills.
constexpr const char* kPostsAndLikes =
    "mode = \"getRepo\"\ncollections = [\"app.bsky.feed.post\", \"app.bsky.feed.like\"]\n";

// uri -> cid of the manifest's live records.
std::map<std::string, std::string> ManifestTable(const PeerManifest& m) {
  std::map<std::string, std::string> out;
  for (const PeerAccount& a : m.accounts) {
    for (const PeerRecord& r : a.records) out[r.uri] = r.cid;
  }
  return out;
}

// The collections of the manifest's records.
std::set<std::string> ManifestCollections(const PeerManifest& m) {
  std::set<std::string> out;
  for (const PeerAccount& a : m.accounts) {
    for (const PeerRecord& r : a.records) out.insert(r.collection);
  }
  return out;
}

// `items` as the inside of a TOML array of strings: "a", "b".
std::string TomlStrings(const std::set<std::string>& items) {
  std::string out;
  for (const std::string& c : items) out += (out.empty() ? "\"" : ", \"") + c + "\"";
  return out;
}

// A config backfilling into db.sqlite with its state in state/: [crawl] from `relay` with
// `crawl` (lines) and loopback endpoints allowed, then `more` (sections), then [resolver] `plc`.
std::string CrawlConfig(const std::string& relay, const std::string& crawl, const std::string& plc,
                        const std::string& more = "") {
  return "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"db.sqlite\"\n"
         "[progress]\ninterval_s = 60\n[crawl]\nrelay = \"" +
         relay + "\"\n" + crawl + "allow_loopback_endpoints = true\n" + more +
         "[resolver]\nplc = \"" + plc + "\"\n";
}

// The differences of `atfill verify --json`'s output: kind -> URIs; and its errors' keys by kind.
struct VerifyReport {
  std::map<std::string, std::set<std::string>> differences;
  std::map<std::string, std::set<std::string>> errors;
  uint64_t repos_checked = 0;
  uint64_t repos_failed = 0;
  uint64_t records = 0;
};

VerifyReport ParseReport(const std::string& out) {
  VerifyReport report;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  EXPECT_EQ(parser.parse(out).get(doc), simdjson::SUCCESS) << out;
  if (!doc.is_object()) return report;
  EXPECT_EQ(doc["repos_checked"].get(report.repos_checked), simdjson::SUCCESS) << out;
  EXPECT_EQ(doc["repos_failed"].get(report.repos_failed), simdjson::SUCCESS) << out;
  EXPECT_EQ(doc["records"].get(report.records), simdjson::SUCCESS) << out;
  for (simdjson::dom::element d : doc["differences"].get_array()) {
    report.differences[std::string(d["kind"].get_string().value())].insert(
        std::string(d["uri"].get_string().value()));
  }
  for (simdjson::dom::element e : doc["errors"].get_array()) {
    report.errors[std::string(e["kind"].get_string().value())].insert(
        std::string(e["key"].get_string().value()));
  }
  return report;
}

TEST(VerifyTest, FindsExactlyTheRowsChangedByHandAndRepairsThem) {
  ATFILL_PEERS_UP(peers, kSeedArgs);
  const PeerManifest& m = peers.manifest();
  ASSERT_EQ(m.accounts.size(), 3u);
  const std::map<std::string, std::string> manifest = ManifestTable(m);
  ASSERT_GT(manifest.size(), 30u);

  TempDir dir;
  const std::string config = (dir.path() / "atfill.toml").string();
  const std::string db = (dir.path() / "db.sqlite").string();
  WriteFile(config, CrawlConfig(peers.pds_url(),
                                "discovery = \"listRepos\"\nmode = \"getRepo\"\ncollections = [" +
                                    TomlStrings(ManifestCollections(m)) + "]\n",
                                peers.plc_url()));
  ProcessResult backfill = RunProcess({ATFILL_BINARY, "backfill", config}, dir.path());
  ASSERT_EQ(backfill.exit_code, 0) << backfill.err;
  ASSERT_EQ(TableCids(db), manifest);

  // Nothing differs yet.
  ProcessResult clean = RunProcess({ATFILL_BINARY, "verify", config, "--json"}, dir.path());
  EXPECT_EQ(clean.exit_code, 0) << clean.err;
  VerifyReport before = ParseReport(clean.out);
  EXPECT_TRUE(before.differences.empty()) << clean.out;
  EXPECT_TRUE(before.errors.empty()) << clean.out;
  EXPECT_EQ(before.repos_checked, 3u);
  EXPECT_EQ(before.records, manifest.size());

  // By hand: one row of account 0 gets another record's CID, two rows (accounts 0 and 1) are
  // deleted, and one row is inserted into account 2 under an rkey its repo does not hold.
  const PeerRecord& altered = m.accounts[0].records[0];
  const PeerRecord& other = m.accounts[0].records[1];
  const PeerRecord& deleted0 = m.accounts[0].records[2];
  const PeerRecord& deleted1 = m.accounts[1].records[3];
  const PeerRecord& template2 = m.accounts[2].records[0];
  const std::string extra_uri =
      "at://" + m.accounts[2].did + "/" + template2.collection + "/zzzzverifyextra";
  {
    RawDb raw(db);
    auto row_of = [&](const PeerAccount& a, const PeerRecord& r) {
      return "did_id = (SELECT id FROM atfill_dids WHERE did = '" + a.did +
             "') AND collection_id = (SELECT id FROM atfill_collections WHERE nsid = '" +
             r.collection + "') AND rkey = '" + r.rkey + "'";
    };
    ASSERT_EQ(raw.Exec("UPDATE atfill_record_rows SET cid = '" + other.cid + "' WHERE " +
                       row_of(m.accounts[0], altered)),
              SQLITE_OK);
    ASSERT_EQ(raw.Exec("DELETE FROM atfill_record_rows WHERE " + row_of(m.accounts[0], deleted0)),
              SQLITE_OK);
    ASSERT_EQ(raw.Exec("DELETE FROM atfill_record_rows WHERE " + row_of(m.accounts[1], deleted1)),
              SQLITE_OK);
    ASSERT_EQ(raw.Exec("INSERT INTO atfill_record_rows(did_id, collection_id, rkey, cid, rev, "
                       "indexed_at, created_at, record) SELECT did_id, collection_id, "
                       "'zzzzverifyextra', cid, rev, indexed_at, created_at, record FROM "
                       "atfill_record_rows WHERE " +
                       row_of(m.accounts[2], template2)),
              SQLITE_OK);
  }
  std::map<std::string, std::string> changed = manifest;
  changed[altered.uri] = other.cid;
  changed.erase(deleted0.uri);
  changed.erase(deleted1.uri);
  changed[extra_uri] = template2.cid;
  ASSERT_EQ(TableCids(db), changed);

  ProcessResult found = RunProcess({ATFILL_BINARY, "verify", config, "--json"}, dir.path());
  EXPECT_EQ(found.exit_code, 1) << found.err;
  VerifyReport report = ParseReport(found.out);
  const std::map<std::string, std::set<std::string>> want = {
      {"different", {altered.uri}},
      {"missing", {deleted0.uri, deleted1.uri}},
      {"extra", {extra_uri}}};
  EXPECT_EQ(report.differences, want) << found.out;
  EXPECT_TRUE(report.errors.empty()) << found.out;
  EXPECT_EQ(report.repos_checked, 3u);
  EXPECT_EQ(TableCids(db), changed) << "a verify without --repair wrote";

  // --collection limits the comparison: the altered and deleted rows of account 0 only when its
  // collection is the one asked for.
  ProcessResult scoped = RunProcess({ATFILL_BINARY, "verify", config, "--json", "--did",
                                     m.accounts[0].did, "--collection", altered.collection},
                                    dir.path());
  EXPECT_EQ(scoped.exit_code, 1) << scoped.err;
  VerifyReport scoped_report = ParseReport(scoped.out);
  std::map<std::string, std::set<std::string>> scoped_want;
  scoped_want["different"].insert(altered.uri);
  if (deleted0.collection == altered.collection) scoped_want["missing"].insert(deleted0.uri);
  EXPECT_EQ(scoped_report.differences, scoped_want) << scoped.out;
  EXPECT_EQ(scoped_report.repos_checked, 1u);

  // The plain output names each difference on stdout.
  ProcessResult repaired = RunProcess({ATFILL_BINARY, "verify", config, "--repair"}, dir.path());
  EXPECT_EQ(repaired.exit_code, 1) << repaired.err;
  EXPECT_NE(repaired.out.find("different " + altered.uri), std::string::npos) << repaired.out;
  EXPECT_NE(repaired.out.find("missing " + deleted0.uri), std::string::npos) << repaired.out;
  EXPECT_NE(repaired.out.find("missing " + deleted1.uri), std::string::npos) << repaired.out;
  EXPECT_NE(repaired.out.find("extra " + extra_uri), std::string::npos) << repaired.out;
  EXPECT_EQ(TableCids(db), manifest) << repaired.err;
  // The repaired rows are the repo's records (bodies whose CID is the row's), not only CIDs.
  auto row = sinks::GetRecord(db, altered.uri);
  ASSERT_TRUE(row.ok() && row->has_value());
  Result<atproto::Cid> body_cid = atproto::CidOfRecord((*row)->record);
  ASSERT_TRUE(body_cid.ok()) << body_cid.status().ToString();
  EXPECT_EQ(body_cid->ToString(), altered.cid) << (*row)->record;

  ProcessResult after = RunProcess({ATFILL_BINARY, "verify", config, "--json"}, dir.path());
  EXPECT_EQ(after.exit_code, 0) << after.err;
  VerifyReport again = ParseReport(after.out);
  EXPECT_TRUE(again.differences.empty()) << after.out;
  EXPECT_EQ(again.records, manifest.size());

  // A repo that cannot be checked (its DID unknown to the PLC) is an error naming it; the other
  // repo asked for is still checked.
  const std::string unknown = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa";
  ProcessResult partial = RunProcess(
      {ATFILL_BINARY, "verify", config, "--json", "--did", unknown, "--did", m.accounts[1].did},
      dir.path());
  EXPECT_EQ(partial.exit_code, 1) << partial.err;
  VerifyReport partial_report = ParseReport(partial.out);
  EXPECT_EQ(partial_report.repos_checked, 1u);
  EXPECT_EQ(partial_report.repos_failed, 1u);
  EXPECT_TRUE(partial_report.differences.empty()) << partial.out;
  EXPECT_EQ(partial_report.errors,
            (std::map<std::string, std::set<std::string>>{{"did_not_found", {unknown}}}))
      << partial.out;

  const Status down = peers.Down();
  EXPECT_TRUE(down.ok()) << down.ToString();
}

// One XRPC call to the PDS: a POST of `body` (JSON), with `token` as the bearer when set; the
// answer's body, or the failure as text after "error: ".
std::string Post(net::HttpClient& client, const std::string& url, const std::string& body,
                 const std::string& token = "") {
  net::HttpRequest request;
  request.method = "POST";
  request.url = url;
  request.body = body;
  request.headers = {{"Content-Type", "application/json"}};
  if (!token.empty()) request.credentials = {{"Authorization", "Bearer " + token}};
  request.trusted_endpoint = true;
  auto got = client.Fetch(std::move(request));
  if (!got.ok()) return "error: " + got.status().ToString();
  if (got->status != 200) return "error: " + std::to_string(got->status) + " " + got->body;
  return got->body;
}

std::string Member(const std::string& json, const char* name) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  std::string_view v;
  if (parser.parse(json).get(doc) != simdjson::SUCCESS || doc[name].get(v) != simdjson::SUCCESS) {
    return "";
  }
  return std::string(v);
}

// [crawl] incremental: a second backfill of repos the table holds asks each PDS for
// getRepo?since=<the stored rev> and applies the answer: a record created, one updated and one
// deleted on the reference PDS after the first backfill are in the table as on the PDS, at a
// fraction of the first backfill's bytes; the unchanged repos cost a CAR header each.
TEST(VerifyTest, IncrementalBackfillAppliesWhatChangedSinceTheStoredRev) {
  ATFILL_PEERS_UP(peers, kSeedArgs);
  const PeerManifest& m = peers.manifest();
  ASSERT_EQ(m.accounts.size(), 3u);
  std::map<std::string, std::string> want = ManifestTable(m);
  const std::set<std::string> collections = ManifestCollections(m);
  TempDir dir;
  const std::string config = (dir.path() / "atfill.toml").string();
  const std::string db = (dir.path() / "db.sqlite").string();
  WriteFile(config, CrawlConfig(peers.pds_url(),
                                "discovery = \"listRepos\"\nmode = \"getRepo\"\n"
                                "incremental = true\ncollections = [" +
                                    TomlStrings(collections) + "]\n",
                                peers.plc_url()));
  ProcessResult first = RunProcess({ATFILL_BINARY, "backfill", config}, dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(TableCids(db), want);

  // Account 0 writes on its PDS: one record deleted, one updated, one created.
  net::HttpClientOptions options;
  options.allow_private_addresses = true;
  auto client = net::HttpClient::Start(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const PeerAccount& a = m.accounts[0];
  const std::string xrpc = peers.pds_url_ip() + "/xrpc/";
  const std::string session = Post(**client, xrpc + "com.atproto.server.createSession",
                                   "{\"identifier\":\"" + a.did + "\",\"password\":\"password\"}");
  const std::string token = Member(session, "accessJwt");
  ASSERT_FALSE(token.empty()) << session;
  const PeerRecord& gone = a.records[0];
  const PeerRecord& changed = a.records[1];
  ASSERT_EQ(Post(**client, xrpc + "com.atproto.repo.deleteRecord",
                 "{\"repo\":\"" + a.did + "\",\"collection\":\"" + gone.collection +
                     "\",\"rkey\":\"" + gone.rkey + "\"}",
                 token)
                .rfind("error", 0),
            std::string::npos);
  const std::string put =
      Post(**client, xrpc + "com.atproto.repo.putRecord",
           "{\"repo\":\"" + a.did + "\",\"collection\":\"" + changed.collection + "\",\"rkey\":\"" +
               changed.rkey + "\",\"validate\":false,\"record\":{\"$type\":\"" +
               changed.collection + "\",\"text\":\"changed after the backfill\"}}",
           token);
  ASSERT_FALSE(Member(put, "cid").empty()) << put;
  const std::string made =
      Post(**client, xrpc + "com.atproto.repo.createRecord",
           "{\"repo\":\"" + a.did + "\",\"collection\":\"" + changed.collection +
               "\",\"rkey\":\"zzzz-incremental\",\"validate\":false,\"record\":{\"$type\":\"" +
               changed.collection + "\",\"text\":\"made after the backfill\"}}",
           token);
  ASSERT_FALSE(Member(made, "cid").empty()) << made;
  want.erase(gone.uri);
  want[changed.uri] = Member(put, "cid");
  want[Member(made, "uri")] = Member(made, "cid");

  ProcessResult second = RunProcess({ATFILL_BINARY, "backfill", config}, dir.path());
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(TableCids(db), want) << second.err;

  // A backfill of more collections than the last one applied takes every repo whole: the stored
  // rows cannot stand for the collections it adds.
  std::vector<std::string> more = {ATFILL_BINARY, "backfill", config};
  for (const std::string& c : collections) {
    more.push_back("--collection");
    more.push_back(c);
  }
  more.push_back("--collection");
  more.push_back("com.example.backfill.other");
  ProcessResult third = RunProcess(more, dir.path());
  ASSERT_EQ(third.exit_code, 0) << third.err;
  EXPECT_EQ(TableCids(db), want) << third.err;

  ProcessResult jobs = RunProcess({ATFILL_BINARY, "jobs", config, "--json"}, dir.path());
  ASSERT_EQ(jobs.exit_code, 0) << jobs.err;
  simdjson::dom::parser parser;
  simdjson::dom::element list;
  ASSERT_EQ(parser.parse(jobs.out).get(list), simdjson::SUCCESS) << jobs.out;
  std::map<uint64_t, simdjson::dom::element> backfills;
  for (simdjson::dom::element j : list.get_array()) {
    if (j["kind"].get_string().value() == "backfill") backfills[j["id"].get_uint64().value()] = j;
  }
  ASSERT_EQ(backfills.size(), 3u) << jobs.out;
  auto counter = [](simdjson::dom::element j, const char* name) -> uint64_t {
    uint64_t v = 0;
    return j["counters"][name].get(v) == simdjson::SUCCESS ? v : 0;
  };
  simdjson::dom::element full = backfills.begin()->second;
  simdjson::dom::element again = std::next(backfills.begin())->second;
  EXPECT_EQ(counter(full, "repos_incremental"), 0u) << jobs.out;
  EXPECT_EQ(counter(again, "repos_incremental"), 3u) << jobs.out;
  EXPECT_EQ(counter(again, "repos_incremental_refetched"), 0u) << jobs.out;
  EXPECT_LT(counter(again, "bytes") * 5, counter(full, "bytes")) << jobs.out;
  simdjson::dom::element wider = std::next(backfills.begin(), 2)->second;
  EXPECT_EQ(counter(wider, "repos_incremental"), 0u) << jobs.out;
  EXPECT_GT(counter(wider, "bytes"), counter(again, "bytes")) << jobs.out;

  const Status down = peers.Down();
  EXPECT_TRUE(down.ok()) << down.ToString();
}

// [crawl] incremental, when the getRepo?since answer cannot settle a repo: a record created
// after the backfill with the bytes of one the repo held before (the same block, which the PDS does
// not send again) makes the crawl fetch the whole repo, and the whole repo replaces the stored
// rows: a record deleted beside it leaves the table as it left the PDS.
TEST(VerifyTest, AnIncrementalBackfillThatFetchesTheWholeRepoDropsTheRowsItNoLongerHolds) {
  ATFILL_PEERS_UP(peers, kSeedArgs);
  const PeerManifest& m = peers.manifest();
  std::map<std::string, std::string> want = ManifestTable(m);
  const std::set<std::string> collections = ManifestCollections(m);
  net::HttpClientOptions options;
  options.allow_private_addresses = true;
  auto client = net::HttpClient::Start(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const PeerAccount& a = m.accounts[0];
  const std::string xrpc = peers.pds_url_ip() + "/xrpc/";
  const std::string session = Post(**client, xrpc + "com.atproto.server.createSession",
                                   "{\"identifier\":\"" + a.did + "\",\"password\":\"password\"}");
  const std::string token = Member(session, "accessJwt");
  ASSERT_FALSE(token.empty()) << session;
  const std::string collection = a.records[1].collection;
  const auto create = [&](const std::string& rkey) {
    return Post(**client, xrpc + "com.atproto.repo.createRecord",
                "{\"repo\":\"" + a.did + "\",\"collection\":\"" + collection + "\",\"rkey\":\"" +
                    rkey + "\",\"validate\":false,\"record\":{\"$type\":\"" + collection +
                    "\",\"text\":\"the same bytes twice\"}}",
                token);
  };
  const std::string first_twin = create("twin-1");
  ASSERT_FALSE(Member(first_twin, "cid").empty()) << first_twin;
  want[Member(first_twin, "uri")] = Member(first_twin, "cid");

  TempDir dir;
  const std::string config = (dir.path() / "atfill.toml").string();
  const std::string db = (dir.path() / "db.sqlite").string();
  WriteFile(config, CrawlConfig(peers.pds_url(),
                                "discovery = \"listRepos\"\nmode = \"getRepo\"\n"
                                "incremental = true\ncollections = [" +
                                    TomlStrings(collections) + "]\n",
                                peers.plc_url()));
  ProcessResult first = RunProcess({ATFILL_BINARY, "backfill", config}, dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(TableCids(db), want);

  const PeerRecord& gone = a.records[0];
  ASSERT_EQ(Post(**client, xrpc + "com.atproto.repo.deleteRecord",
                 "{\"repo\":\"" + a.did + "\",\"collection\":\"" + gone.collection +
                     "\",\"rkey\":\"" + gone.rkey + "\"}",
                 token)
                .rfind("error", 0),
            std::string::npos);
  const std::string second_twin = create("twin-2");
  ASSERT_EQ(Member(second_twin, "cid"), Member(first_twin, "cid")) << second_twin;
  want.erase(gone.uri);
  want[Member(second_twin, "uri")] = Member(second_twin, "cid");

  ProcessResult second = RunProcess({ATFILL_BINARY, "backfill", config}, dir.path());
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(TableCids(db), want) << second.err;

  ProcessResult job = RunProcess({ATFILL_BINARY, "job", config, "2", "--json"}, dir.path());
  ASSERT_EQ(job.exit_code, 0) << job.err;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_EQ(parser.parse(job.out).get(doc), simdjson::SUCCESS) << job.out;
  auto counter = [&](const char* name) -> uint64_t {
    uint64_t v = 0;
    return doc["job"]["counters"][name].get(v) == simdjson::SUCCESS ? v : 0;
  };
  // The two accounts that wrote nothing are settled by their answers; account 0 is fetched whole.
  EXPECT_EQ(counter("repos_incremental_refetched"), 1u) << job.out;
  EXPECT_EQ(counter("repos_incremental"), 2u) << job.out;
  EXPECT_EQ(counter("resyncs"), 1u) << job.out;

  const Status down = peers.Down();
  EXPECT_TRUE(down.ok()) << down.ToString();
}

std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A simnet network of `accounts` active did:plc accounts spread over `pds_hosts` PDSs, each
// holding min_records..max_records records.
simnet::SimnetOptions ActivePlcNetwork(uint64_t seed, uint32_t accounts, uint32_t pds_hosts,
                                       uint32_t min_records, uint32_t max_records) {
  simnet::SimnetOptions so;
  so.seed = seed;
  so.accounts = accounts;
  so.pds_hosts = pds_hosts;
  so.min_records = min_records;
  so.max_records = max_records;
  so.did_web_share = 0;
  so.deactivated_share = 0;
  so.takendown_share = 0;
  return so;
}

// What the network reports of its accounts is an outcome, not an error: a getRepo backfill of a
// simnet network with deactivated and taken-down accounts completes without errors and exits 0,
// counting them (units_unavailable) and listing them (atfill job --errors) with the state each
// PDS answered. A repo whose commit is signed with another key than its DID document's is an
// error: the same backfill of a network that has one exits 1.
TEST(VerifyTest, UnavailableAccountsAreOutcomesAndABadRepoStillExits1) {
  for (const bool bad_signature : {false, true}) {
    SCOPED_TRACE(bad_signature ? "one PDS signs with another key" : "no bad repo");
    simnet::SimnetOptions so = ActivePlcNetwork(23, 40, 2, 1, 8);
    so.collections = {"app.bsky.feed.post", "app.bsky.feed.like"};
    so.deactivated_share = 0.1;
    so.takendown_share = 0.1;
    if (bad_signature) {
      auto rules = simnet::ParseFaultSpec("pds-0001:bad_signature=always");
      ASSERT_TRUE(rules.ok()) << rules.status().ToString();
      so.faults = *rules;
    }
    auto net = simnet::Simnet::Start(so);
    ASSERT_TRUE(net.ok()) << net.status().ToString();
    // The inactive accounts' states as their PDS answers them (getRepo lists a repo with records).
    std::map<std::string, std::string> inactive;
    for (const simnet::Account& a : (*net)->network().accounts()) {
      uint64_t records = 0;
      for (uint32_t n : a.collection_counts) records += n;
      if (a.status == simnet::AccountStatus::kDeactivated && records > 0) {
        inactive[a.did] = "RepoDeactivated";
      } else if (a.status == simnet::AccountStatus::kTakendown && records > 0) {
        inactive[a.did] = "RepoTakendown";
      }
    }
    ASSERT_GE(inactive.size(), 2u);
    auto truth = (*net)->Truth();
    ASSERT_TRUE(truth.ok()) << truth.status().ToString();
    std::map<std::string, std::string> want;
    for (const simnet::TruthRecord& r : truth->records) {
      if (r.faults.find("bad_signature") == std::string::npos) want[r.uri] = r.cid;
    }
    ASSERT_EQ(want.size() < truth->records.size(), bad_signature);

    TempDir dir;
    const std::string config = (dir.path() / "atfill.toml").string();
    const std::string db = (dir.path() / "db.sqlite").string();
    WriteFile(config, CrawlConfig((*net)->relay_url(), kPostsAndLikes, (*net)->plc_url()));
    ProcessResult backfill = RunProcess({ATFILL_BINARY, "backfill", config}, dir.path());
    EXPECT_EQ(backfill.exit_code, bad_signature ? 1 : 0) << backfill.err;
    EXPECT_EQ(TableCids(db), want);
    EXPECT_NE(backfill.err.find(", " + std::to_string(inactive.size()) + " unavailable"),
              std::string::npos)
        << backfill.err;

    ProcessResult job =
        RunProcess({ATFILL_BINARY, "job", config, "1", "--json", "--errors"}, dir.path());
    ASSERT_EQ(job.exit_code, 0) << job.err;
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    ASSERT_EQ(parser.parse(job.out).get(doc), simdjson::SUCCESS) << job.out;
    uint64_t unavailable = 0, failed = 0, outcomes = 0;
    EXPECT_EQ(doc["job"]["counters"]["units_unavailable"].get(unavailable), simdjson::SUCCESS);
    EXPECT_EQ(doc["job"]["counters"]["failed_records"].get(failed), simdjson::SUCCESS);
    EXPECT_EQ(doc["outcomes_by_kind"]["repo_unavailable"].get(outcomes), simdjson::SUCCESS)
        << job.out;
    EXPECT_EQ(unavailable, inactive.size()) << job.out;
    EXPECT_EQ(outcomes, inactive.size()) << job.out;
    std::map<std::string, std::string> listed;  // DID -> the XRPC error its PDS answered
    std::set<std::string> error_kinds;
    for (simdjson::dom::element e : doc["errors"].get_array()) {
      const std::string kind(e["kind"].get_string().value());
      const std::string key(e["key"].get_string().value());
      const std::string message(e["message"].get_string().value());
      if (kind != "repo_unavailable") {
        error_kinds.insert(kind);
        continue;
      }
      for (const char* state : {"RepoDeactivated", "RepoTakendown"}) {
        if (message.find(state) != std::string::npos) listed[key] = state;
      }
    }
    EXPECT_EQ(listed, inactive) << job.out;
    if (bad_signature) {
      EXPECT_EQ(error_kinds, std::set<std::string>{"bad_signature"}) << job.out;
      EXPECT_GT(failed, 0u) << job.out;
    } else {
      EXPECT_TRUE(error_kinds.empty()) << job.out;
      EXPECT_EQ(failed, 0u) << job.out;
    }

    ProcessResult shown = RunProcess({ATFILL_BINARY, "job", config, "1"}, dir.path());
    ASSERT_EQ(shown.exit_code, 0) << shown.err;
    EXPECT_NE(shown.out.find("unavailable accounts"), std::string::npos) << shown.out;
    EXPECT_NE(shown.out.find("repo_unavailable"), std::string::npos) << shown.out;
  }
}

// [verify] every_hours: `atfill run` (no live consumer) starts a verify job of the stored repos
// every ~1 s after the last ended, each a job in the store started by "schedule" with its
// counters; with [verify] repair the first one puts back a row deleted by hand and the next finds
// nothing. Against simnet (its PLC and PDS over loopback).
TEST(VerifyTest, RunStartsVerifyJobsOnItsScheduleAndTheyRepair) {
  const simnet::SimnetOptions so = ActivePlcNetwork(11, 12, 2, 3, 15);
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  auto truth = (*net)->Truth();
  ASSERT_TRUE(truth.ok()) << truth.status().ToString();
  const std::map<std::string, std::string> want = UriCids(truth->records);
  ASSERT_GT(want.size(), 20u);

  TempDir dir;
  const std::string config = (dir.path() / "atfill.toml").string();
  const std::string db = (dir.path() / "db.sqlite").string();
  const std::string base = CrawlConfig((*net)->relay_url(), kPostsAndLikes, (*net)->plc_url());
  WriteFile(config, base);
  ProcessResult backfill = RunProcess({ATFILL_BINARY, "backfill", config}, dir.path());
  ASSERT_EQ(backfill.exit_code, 0) << backfill.err;
  ASSERT_EQ(TableCids(db), want);

  const std::string gone = want.begin()->first;
  {
    RawDb raw(db);
    // at://DID/COLLECTION/RKEY
    const size_t a = gone.find('/', 5), b = gone.find('/', a + 1);
    ASSERT_EQ(
        raw.Exec("DELETE FROM atfill_record_rows WHERE did_id = (SELECT id FROM atfill_dids "
                 "WHERE did = '" +
                 gone.substr(5, a - 5) +
                 "') AND collection_id = (SELECT id FROM atfill_collections WHERE nsid = '" +
                 gone.substr(a + 1, b - a - 1) + "') AND rkey = '" + gone.substr(b + 1) + "'"),
        SQLITE_OK);
  }
  ASSERT_EQ(TableCids(db).count(gone), 0u);

  // 0.0003 h: about a second between one job's end and the next's start.
  WriteFile(config, base + "[verify]\nevery_hours = 0.0003\nrepair = true\n");
  Child run({ATFILL_BINARY, "run", config}, dir.path());
  std::string err;
  // Bounded: two jobs take about 2 s plus their work.
  for (int i = 0; i < 600 && Count(err, " completed: ") < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    err = ReadText(run.err_path());
  }
  ASSERT_GE(Count(err, " completed: "), 2u) << err;
  ASSERT_TRUE(run.Kill(SIGINT));
  ProcessResult ended = run.Wait(std::chrono::seconds(30));
  EXPECT_EQ(ended.exit_code, 4) << ended.err;
  EXPECT_EQ(TableCids(db), want) << ended.err;

  ProcessResult jobs = RunProcess({ATFILL_BINARY, "jobs", config, "--json"}, dir.path());
  ASSERT_EQ(jobs.exit_code, 0) << jobs.err;
  simdjson::dom::parser parser;
  simdjson::dom::element list;
  ASSERT_EQ(parser.parse(jobs.out).get(list), simdjson::SUCCESS) << jobs.out;
  // The verify jobs by id (the list is newest first): completed ones, started by the schedule.
  std::map<uint64_t, simdjson::dom::element> verifies;
  for (simdjson::dom::element j : list.get_array()) {
    if (j["kind"].get_string().value() != "verify") continue;
    verifies[j["id"].get_uint64().value()] = j;
  }
  ASSERT_GE(verifies.size(), 2u) << jobs.out;
  auto counter = [](simdjson::dom::element j, const char* name) -> uint64_t {
    uint64_t v = 0;
    return j["counters"][name].get(v) == simdjson::SUCCESS ? v : 0;
  };
  auto first = verifies.begin()->second;
  auto second = std::next(verifies.begin())->second;
  for (auto j : {first, second}) {
    EXPECT_EQ(j["status"].get_string().value(), "completed") << jobs.out;
    EXPECT_EQ(j["started_by"].get_string().value(), "schedule") << jobs.out;
    EXPECT_EQ(counter(j, "verify_repos_checked"), so.accounts) << jobs.out;
    EXPECT_EQ(counter(j, "processed_repos"), so.accounts) << jobs.out;
  }
  EXPECT_EQ(counter(first, "verify_missing"), 1u) << jobs.out;
  EXPECT_EQ(counter(first, "verify_repairs"), 1u) << jobs.out;
  EXPECT_EQ(counter(first, "failed_records"), 1u) << jobs.out;
  EXPECT_EQ(counter(second, "verify_missing"), 0u) << jobs.out;
  EXPECT_EQ(counter(second, "failed_records"), 0u) << jobs.out;
  EXPECT_EQ(counter(first, "verify_records"), want.size()) << jobs.out;
}

// Repos that cannot be checked are errors naming their DID and the reason, and the other repos
// are checked: the simnet network backfilled, then served again (same seed, same port) with the
// commits of pds-0001 signed with other keys and pds-0002 answering 502.
TEST(VerifyTest, AReposFailureNamesItsDidAndTheOthersAreChecked) {
  simnet::SimnetOptions so = ActivePlcNetwork(5, 15, 3, 1, 10);
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  auto truth = (*net)->Truth();
  ASSERT_TRUE(truth.ok()) << truth.status().ToString();
  const std::map<std::string, std::string> want = UriCids(truth->records);
  // The DIDs by the PDS that serves them (0-based: pds-0001 is 0).
  std::map<uint32_t, std::set<std::string>> by_pds;
  for (const simnet::Account& a : (*net)->network().accounts()) {
    if (a.collection_counts.empty()) continue;
    uint32_t records = 0;
    for (uint32_t n : a.collection_counts) records += n;
    if (records > 0) by_pds[a.pds].insert(a.did);
  }
  ASSERT_FALSE(by_pds[0].empty());
  ASSERT_FALSE(by_pds[1].empty());
  ASSERT_FALSE(by_pds[2].empty());

  TempDir dir;
  const std::string config = (dir.path() / "atfill.toml").string();
  const std::string db = (dir.path() / "db.sqlite").string();
  WriteFile(config, CrawlConfig((*net)->relay_url(), kPostsAndLikes, (*net)->plc_url(),
                                "[net]\nretries = 1\n"));
  ProcessResult backfill = RunProcess({ATFILL_BINARY, "backfill", config}, dir.path());
  ASSERT_EQ(backfill.exit_code, 0) << backfill.err;
  ASSERT_EQ(TableCids(db), want);

  // A table of one collection is compared in that collection by default ([crawl] collections):
  // the repos' other records are not missing.
  TempDir posts_dir;
  const std::string posts_config = (posts_dir.path() / "atfill.toml").string();
  WriteFile(posts_config,
            CrawlConfig((*net)->relay_url(),
                        "mode = \"getRepo\"\ncollections = [\"app.bsky.feed.post\"]\n",
                        (*net)->plc_url()));
  ProcessResult posts_backfill =
      RunProcess({ATFILL_BINARY, "backfill", posts_config}, posts_dir.path());
  ASSERT_EQ(posts_backfill.exit_code, 0) << posts_backfill.err;
  size_t posts = 0;
  for (const auto& [uri, cid] : want)
    posts += uri.find("/app.bsky.feed.post/") != std::string::npos;
  ASSERT_GT(posts, 0u);
  ASSERT_LT(posts, want.size());
  ProcessResult posts_verify =
      RunProcess({ATFILL_BINARY, "verify", posts_config, "--json"}, posts_dir.path());
  EXPECT_EQ(posts_verify.exit_code, 0) << posts_verify.err;
  VerifyReport posts_report = ParseReport(posts_verify.out);
  EXPECT_TRUE(posts_report.differences.empty()) << posts_verify.out;
  EXPECT_EQ(posts_report.records, posts);

  const uint16_t port = (*net)->port();
  (*net)->Stop();
  auto rules = simnet::ParseFaultSpec(
      "pds-0001:bad_signature=always;pds-0002:error=always,error_status=502");
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  so.faults = *rules;
  so.port = port;
  auto faulty = simnet::Simnet::Start(so);
  ASSERT_TRUE(faulty.ok()) << faulty.status().ToString();

  ProcessResult verify = RunProcess({ATFILL_BINARY, "verify", config, "--json"}, dir.path());
  EXPECT_EQ(verify.exit_code, 1) << verify.err;
  VerifyReport report = ParseReport(verify.out);
  EXPECT_EQ(report.errors, (std::map<std::string, std::set<std::string>>{
                               {"bad_signature", by_pds[0]}, {"fetch_failed", by_pds[1]}}))
      << verify.out;
  EXPECT_TRUE(report.differences.empty()) << verify.out;
  EXPECT_EQ(report.repos_checked, by_pds[2].size());
  EXPECT_EQ(report.repos_failed, by_pds[0].size() + by_pds[1].size());
  // The failures' sentences name the DID and the reason.
  EXPECT_NE(verify.out.find("502"), std::string::npos) << verify.out;
  EXPECT_EQ(TableCids(db), want) << "a failed check wrote";
}

}  // namespace
}  // namespace atfill::testing
