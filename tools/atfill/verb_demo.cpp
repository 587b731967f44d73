// The main job, for now: the inspection verbs on the files the repository ships. The crawl issue
// replaces it with a backfill from a simulated network.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sinks/sqlite_reader.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/gen/event_gen.hpp"

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

}  // namespace

int RunDemo(std::span<char* const> args) {
  std::filesystem::path dir = std::filesystem::path(ATFILL_SOURCE_DIR) / "examples" / "data";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (a == "--data" && i + 1 < args.size()) {
      dir = args[++i];
    } else {
      std::fprintf(stderr, "atfill demo: unknown argument %s\n", args[i]);
      return kExitUsage;
    }
  }
  const std::string records = (dir / "records.jsonl").string();
  const std::string car = (dir / "sample.car").string();
  const std::string key = ReadKey(dir);
  if (!std::filesystem::exists(records) || !std::filesystem::exists(car) || key.empty()) {
    std::fprintf(stderr, "atfill demo: %s must hold records.jsonl, sample.car and sample.key\n",
                 dir.c_str());
    return kExitIo;
  }
  std::printf("atfill demo: the atproto data model at work on %s\n", dir.c_str());
  std::printf(
      "(the inspection verbs, then the engine on generated events; the backfill from a\n"
      "simulated network arrives with the crawl)\n");

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

  // The engine: 50,000 generated Jetstream events (with updates, deletes, takedowns and a few bad
  // lines) through CID verification and the ingest guard into SQLite, as a job.
  const auto work =
      std::filesystem::temp_directory_path() / ("atfill-demo-" + std::to_string(::getpid()));
  std::filesystem::create_directories(work);
  gen::EventGenOptions events;
  events.dids = 500;
  events.account_ratio = 0.002;
  events.bad_ratio = 0.001;
  const std::string events_path = (work / "events.jsonl").string();
  const std::string config_path = (work / "atfill.toml").string();
  if (!gen::EventGenerator::WriteFile(events, 50'000, events_path).ok()) return kExitIo;
  {
    std::ofstream config(config_path);
    config << "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"atfill.db\"\n";
  }
  as_expected &= Show("index 50,000 Jetstream events into SQLite (bad lines are logged, not fatal)",
                      {"ingest", config_path, events_path}, RunIngest) == kExitOk;
  as_expected &=
      Show("the job: counters and errors by kind", {"job", config_path, "1"}, RunJob) == kExitOk;
  auto reader = sinks::SqliteReader::Open((work / "atfill.db").string());
  auto rows = reader.ok() ? (*reader)->Count() : Result<uint64_t>(reader.status());
  if (rows.ok()) {
    std::printf("\n$ sqlite3 atfill.db 'SELECT count(*) FROM atfill_records'\n%llu\n",
                static_cast<unsigned long long>(*rows));
  }
  as_expected &= rows.ok() && *rows > 0;
  std::error_code ec;
  std::filesystem::remove_all(work, ec);
  std::printf("\natfill demo: %s\n", as_expected ? "every step answered as expected"
                                                 : "SOME STEP DID NOT ANSWER AS EXPECTED");
  return as_expected ? kExitOk : kExitInputInvalid;
}

}  // namespace atfill::cli
