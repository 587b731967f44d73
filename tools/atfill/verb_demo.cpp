// The main job: the inspection verbs on the files the repository ships, then a backfill of two
// collections from a simulated network (simnet, in-process on loopback) into SQLite.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sinks/sqlite_reader.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill::cli {
namespace {

// The did:key of the fixed sample signing key (see tools/make_sample_repo.cpp).
std::string ReadKey(const std::filesystem::path& dir) {
  std::ifstream in(dir / "sample.key");
  std::string key;
  std::getline(in, key);
  return key;
}

int Show(const std::string& title, std::vector<std::string> argv,
         int (*run)(std::span<char* const>)) {
  std::printf("\n$ atfill");
  for (const auto& a : argv) std::printf(" %s", a.c_str());
  std::printf("      # %s\n", title.c_str());
  std::fflush(stdout);
  std::vector<char*> args;
  for (size_t i = 1; i < argv.size(); ++i) args.push_back(argv[i].data());
  const int rc = run(args);
  std::fflush(stdout);
  std::fflush(stderr);
  std::printf("(exit %d)\n", rc);
  return rc;
}

// The demo's files: an installed atfill finds them at ../share/atfill/demo beside its own binary
// (wherever the package or `cmake --install` put it), a build tree's in the source tree.
std::filesystem::path DefaultDataDir() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto installed = self.parent_path().parent_path() / "share" / "atfill" / "demo";
    if (std::filesystem::is_directory(installed, ec)) return installed;
  }
  return std::filesystem::path(ATFILL_SOURCE_DIR) / "examples" / "data";
}

}  // namespace

int RunDemo(std::span<char* const> args) {
  std::filesystem::path dir = DefaultDataDir();
  std::string data;
  CLI::App app{"", "atfill demo"};
  PrepareVerbApp(app);
  app.add_option("--data", data, "folder holding records.jsonl and sample.car");
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  if (!data.empty()) dir = data;
  const std::string records = (dir / "records.jsonl").string();
  const std::string car = (dir / "sample.car").string();
  const std::string key = ReadKey(dir);
  if (!std::filesystem::exists(records) || !std::filesystem::exists(car) || key.empty()) {
    std::fprintf(stderr, "atfill demo: %s must hold records.jsonl, sample.car and sample.key\n",
                 dir.c_str());
    return kExitIo;
  }
  std::printf("atfill demo: the atproto data model at work on %s\n", dir.c_str());
  std::printf("(the inspection verbs, then a backfill from a simulated network)\n");

  // Each step's exit code is shown; some inputs are invalid on purpose, so the demo itself
  // succeeds when every step answered as expected.
  bool as_expected = true;
  as_expected &= Show("identifiers: a valid DID, then an invalid one",
                      {"syntax", "did", "did:plc:ewvi7nxzyoun6zhxrhs64oiz", "did:PLC:x"},
                      RunSyntax) == kExitInputInvalid;
  as_expected &= Show("record keys and collections",
                      {"syntax", "nsid", "app.bsky.feed.post", "app.bsky.feed.1post"},
                      RunSyntax) == kExitInputInvalid;
  as_expected &= Show("AT URIs",
                      {"syntax", "aturi",
                       "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/app.bsky.feed.post/3l2zpbbhuvw2h"},
                      RunSyntax) == kExitOk;
  as_expected &= Show(
                     "record CIDs (lines 1 and 2 are the same record in another key order; "
                     "the last two lines are not valid records)",
                     {"cid", records}, RunCid) == kExitInputInvalid;
  as_expected &= Show(
                     "a signed repository: every block hashed, the MST walked, the commit "
                     "signature checked",
                     {"car", car, "--key", key}, RunCar) == kExitOk;

  // The crawl: a simulated network on loopback (relay, PLC directory, 50 PDS hosts with
  // latency, a few faults), backfilled into SQLite as a job.
  const auto work =
      std::filesystem::temp_directory_path() / ("atfill-demo-" + std::to_string(::getpid()));
  std::filesystem::create_directories(work);
  simnet::SimnetOptions net_options;
  net_options.seed = 2026;
  net_options.accounts = 2000;
  net_options.pds_hosts = 50;
  net_options.latency_ms = 40;
  net_options.max_records = 80;
  net_options.collections = {"app.bsky.feed.post", "app.bsky.feed.like", "app.bsky.graph.follow"};
  // One record in 500 served with a wrong CID, one PDS that rate-limits a fifth of its answers.
  net_options.faults =
      *simnet::ParseFaultSpec("pds:cid_mismatch=0.002;pds-0007:rate_limit=0.2,reset_s=1");
  auto net = simnet::Simnet::Start(net_options);
  if (!net.ok()) {
    std::fprintf(stderr, "atfill demo: starting the simulated network: %s\n",
                 net.status().ToString().c_str());
    return kExitIo;
  }
  std::printf(
      "\nA simulated atproto network runs on loopback: %u accounts on %u PDS hosts (%lld ms per\n"
      "answer), a relay at %s and a PLC directory at %s.\n",
      net_options.accounts, net_options.pds_hosts, static_cast<long long>(net_options.latency_ms),
      (*net)->relay_url().c_str(), (*net)->plc_url().c_str());
  const std::string config_path = (work / "atfill.toml").string();
  {
    std::ofstream config(config_path);
    config << "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"atfill.db\"\n"
           << "[progress]\ninterval_s = 1\n"
           << "[crawl]\nrelay = \"" << (*net)->relay_url() << "\"\n"
           << "collections = [\"app.bsky.feed.post\", \"app.bsky.feed.like\"]\n"
           << "# simnet lives on 127.0.0.1; the real network is refused such addresses\n"
           << "allow_loopback_endpoints = true\n"
           << "[resolver]\nplc = \"" << (*net)->plc_url() << "\"\n";
  }
  // Exit 1: the job completes, and the records of simnet's injected faults (CID mismatches,
  // bad endpoints and signatures) are errors in its log.
  as_expected &= Show("backfill two collections: list repos, resolve DIDs, fetch, verify, write",
                      {"backfill", config_path}, RunBackfill) == kExitInputInvalid;
  as_expected &= Show("the job: counters, throughput, errors by kind", {"job", config_path, "1"},
                      RunJob) == kExitOk;

  // What a user does next: plain SQL on the atfill_records view.
  auto reader = sinks::SqliteReader::Open((work / "atfill.db").string());
  auto print_query = [&](const std::string& sql) {
    std::printf("\n$ sqlite3 atfill.db \"%s\"\n", sql.c_str());
    auto rows = reader.ok() ? (*reader)->Query(sql)
                            : Result<std::vector<std::vector<std::string>>>(reader.status());
    if (!rows.ok()) {
      std::printf("error: %s\n", rows.status().ToString().c_str());
      return false;
    }
    for (const auto& row : *rows) {
      std::string line;
      for (const auto& cell : row) line += (line.empty() ? "" : " | ") + cell;
      std::printf("%s\n", line.c_str());
    }
    return rows->size() > 1;
  };
  as_expected &= print_query(
      "SELECT collection, count(*) AS records, count(DISTINCT did) AS accounts "
      "FROM atfill_records GROUP BY collection");
  as_expected &= print_query(
      "SELECT uri, json_extract(record, '$.text') AS text FROM atfill_records "
      "WHERE collection = 'app.bsky.feed.post' ORDER BY created_at DESC LIMIT 3");

  // The table against what the network serves: every live record of the two collections,
  // except those served with a wrong CID (logged, never written).
  auto truth = (*net)->Truth();
  uint64_t expected = 0;
  if (truth.ok()) {
    for (const auto& r : truth->records) {
      const bool wanted = r.uri.find("/app.bsky.feed.post/") != std::string::npos ||
                          r.uri.find("/app.bsky.feed.like/") != std::string::npos;
      if (wanted && r.faults.find("cid_mismatch") == std::string::npos) ++expected;
    }
  }
  auto rows = reader.ok() ? (*reader)->Count() : Result<uint64_t>(reader.status());
  const bool complete = truth.ok() && rows.ok() && *rows == expected;
  std::printf("\nThe table holds %llu records; the network serves %llu valid ones: %s\n",
              static_cast<unsigned long long>(rows.ok() ? *rows : 0),
              static_cast<unsigned long long>(expected), complete ? "all there" : "MISMATCH");
  as_expected &= complete;
  reader = Status::Cancelled("closed");
  (*net)->Stop();
  std::error_code ec;
  std::filesystem::remove_all(work, ec);
  std::printf("\natfill demo: %s\n", as_expected ? "every step answered as expected"
                                                 : "SOME STEP DID NOT ANSWER AS EXPECTED");
  return as_expected ? kExitOk : kExitInputInvalid;
}

}  // namespace atfill::cli
