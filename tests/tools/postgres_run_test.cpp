// The PostgreSQL sink through the launcher, as a user runs it: `atfill ingest` and `atfill
// backfill` with [sink] kind = "postgres" against a real server (tools/test starts one; outage
// tests start their own), compared row for row with the SQLite sink on the same input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "sinks/postgres_reader.hpp"
#include "sinks/sqlite_reader.hpp"
#include "tests/common/pg_server.hpp"
#include "tests/common/process.hpp"
#include "tests/common/test_util.hpp"
#include "tools/gen/event_gen.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::ProcessResult;
using testing::RunProcess;
using testing::TempDir;
using testing::WriteFile;

// Every column but indexed_at (the time of writing, not of the data), one line per row.
std::vector<std::string> Content(const std::vector<sinks::RecordRow>& rows) {
  std::vector<std::string> out;
  for (const auto& r : rows) {
    out.push_back(r.uri + " " + r.did + " " + r.collection + " " + r.rkey + " " + r.cid + " " +
                  r.rev + " " + r.created_at + " " + r.record);
  }
  return out;
}

std::vector<std::string> SqliteContent(const std::filesystem::path& db) {
  auto rows = sinks::ReadAllRecords(db.string());
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  return rows.ok() ? Content(*rows) : std::vector<std::string>{};
}

std::vector<std::string> PostgresContent(const std::string& conninfo) {
  auto reader = sinks::PostgresReader::Open(conninfo);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  if (!reader.ok()) return {};
  auto rows = (*reader)->ReadAll();
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  return rows.ok() ? Content(*rows) : std::vector<std::string>{};
}

// A TOML basic string holding `text`.
std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// A config in `dir` writing state/ there and records to PostgreSQL at `conninfo` (or, when it is
// empty, to db.sqlite), plus `extra` sections.
std::string Config(const std::filesystem::path& dir, const std::string& conninfo,
                   const std::string& extra = "") {
  const std::string path = (dir / "atfill.toml").string();
  std::string sink = "[sink.sqlite]\npath = \"db.sqlite\"\n";
  if (!conninfo.empty()) {
    sink = "[sink]\nkind = \"postgres\"\n[sink.postgres]\nconninfo = " + Quoted(conninfo) +
           "\nconnect_timeout_ms = 1000\n";
  }
  WriteFile(path, "[state]\ndir = \"state\"\n" + sink + "[progress]\ninterval_s = 60\n" + extra);
  return path;
}

std::string Events(const std::filesystem::path& dir, uint64_t n) {
  gen::EventGenOptions o;
  o.dids = 300;
  o.update_ratio = 0.15;
  o.delete_ratio = 0.08;
  o.account_ratio = 0.01;
  o.bad_ratio = 0.002;
  const std::string path = (dir / "events.jsonl").string();
  EXPECT_TRUE(gen::EventGenerator::WriteFile(o, n, path).ok());
  return path;
}

TEST(PostgresRunTest, IngestIntoPostgresGivesTheTableIngestIntoSqliteGives) {
  auto db = testing::PgDatabase::CreateOnTestServer();
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  TempDir dir;
  const std::string events = Events(dir.path(), 30'000);
  TempDir lite, pg;
  auto a = RunProcess({ATFILL_BINARY, "ingest", Config(lite.path(), ""), events}, lite.path());
  // 1: the generated bad lines are errors; the rest lands.
  ASSERT_EQ(a.exit_code, 1) << a.err;
  // A password in the connection string (the test server trusts loopback and ignores it) must
  // not reach the job's parameters.
  auto b = RunProcess(
      {ATFILL_BINARY, "ingest", Config(pg.path(), (*db)->conninfo() + " password=hunter2"), events},
      pg.path());
  ASSERT_EQ(b.exit_code, 1) << b.err;
  const auto want = SqliteContent(lite / "db.sqlite");
  ASSERT_GT(want.size(), 10'000u);
  EXPECT_EQ(PostgresContent((*db)->conninfo()), want);
  // The job names its sink without a password.
  auto job =
      RunProcess({ATFILL_BINARY, "job", (pg / "atfill.toml").string(), "1", "--json"}, pg.path());
  EXPECT_THAT(job.out, HasSubstr("\"sink\":\"postgres:"));
  EXPECT_THAT(job.out, HasSubstr("password=***"));
  EXPECT_THAT(job.out, Not(HasSubstr("hunter2")));
}

// The port of a key=value connection string, 0 when it names none.
int PortOf(const std::string& conninfo) {
  std::smatch m;
  static const std::regex port(R"((?:^|\s)port=(\d+))");
  return std::regex_search(conninfo, m, port) ? std::stoi(m[1]) : 0;
}

// Stands in for a stopped server on 127.0.0.1:`port`: accepts each connection and closes it at
// once, as a host whose server is gone would refuse it, and counts them. Returns once `count`
// came, `give_up` says so (checked every 100 ms) or `timeout` passed; the connections taken.
int TakeConnectionAttempts(int port, int count, std::chrono::milliseconds timeout,
                           const std::function<bool()>& give_up) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0) << std::strerror(errno);
  if (fd < 0) return 0;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int taken = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 8) != 0) {
    ADD_FAILURE() << "listening on the stopped server's port " << port << ": "
                  << std::strerror(errno);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (taken < count && !give_up() && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) == 1) {
        const int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) {
          ::close(c);
          ++taken;
        }
      }
    }
  }
  ::close(fd);
  return taken;
}

TEST(PostgresRunTest, AServerStoppedAndRestartedMidRunLosesNothing) {
  auto server = testing::PgServer::StartPrivate();
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto db = testing::PgDatabase::Create((*server)->admin_conninfo());
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  TempDir dir;
  const std::string events = Events(dir.path(), 200'000);
  TempDir lite, pg;
  auto a = RunProcess({ATFILL_BINARY, "ingest", Config(lite.path(), ""), events}, lite.path());
  // 1: the generated bad lines are errors; the rest lands.
  ASSERT_EQ(a.exit_code, 1) << a.err;

  // Small batches and quick sink retries, so the outage lands mid-run and the run waits it out.
  const std::string config = Config(
      pg.path(), (*db)->conninfo(),
      "[engine]\nsink_retry_initial_ms = 50\nsink_retry_max_ms = 400\n[files]\nbatch_records = "
      "1000\n");
  testing::Child run({ATFILL_BINARY, "ingest", config, events}, pg.path());
  // Once some batches are in, the server goes away until the run has tried to reconnect three
  // times (each attempt refused), then comes back.
  size_t before = 0;
  testing::WaitUntil(
      [&] {
        if (auto reader = sinks::PostgresReader::Open((*db)->conninfo()); reader.ok()) {
          if (auto n = (*reader)->Count(); n.ok()) before = *n;
        }
        return before >= 5'000 || !run.Running();
      },
      std::chrono::seconds(60));
  ASSERT_GE(before, 5'000u) << "the run ended (or never wrote) before the outage";
  ASSERT_TRUE((*server)->Stop().ok());
  const int port = PortOf((*server)->admin_conninfo());
  ASSERT_NE(port, 0) << (*server)->admin_conninfo();
  const int attempts =
      TakeConnectionAttempts(port, 3, std::chrono::seconds(60), [&] { return !run.Running(); });
  EXPECT_EQ(attempts, 3) << "the run did not keep trying to reach the server";
  EXPECT_TRUE(run.Running()) << "the run must wait for the server, not fail";
  ASSERT_TRUE((*server)->Start().ok());
  auto done = run.Wait(std::chrono::seconds(180));
  ASSERT_EQ(done.exit_code, 1) << done.err;
  const auto want = SqliteContent(lite / "db.sqlite");
  const auto got = PostgresContent((*db)->conninfo());
  EXPECT_GT(got.size(), before);
  EXPECT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "the table differs from the uninterrupted SQLite run";
}

// Three shards of one backfill, run at once as on three machines, write one PostgreSQL database:
// it ends equal to an unsharded run, and no shard wrote a record another one wrote.
TEST(PostgresRunTest, ThreeShardsOfABackfillWriteOneDatabaseWithoutOverlap) {
  simnet::SimnetOptions so;
  so.seed = 29;
  so.accounts = 240;
  so.pds_hosts = 6;
  so.collections = {"app.bsky.feed.post", "app.bsky.feed.like"};
  so.max_records = 30;
  so.deactivated_share = 0;
  so.takendown_share = 0;
  so.threads = 2;
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  const std::string crawl =
      "[crawl]\nrelay = \"" + (*net)->relay_url() +
      "\"\ncollections = [\"app.bsky.feed.post\", \"app.bsky.feed.like\"]\n"
      "allow_loopback_endpoints = true\nlist_repos_limit = 40\n[resolver]\nplc = \"" +
      (*net)->plc_url() + "\"\n";
  TempDir whole;
  auto w = RunProcess({ATFILL_BINARY, "backfill", Config(whole.path(), "", crawl)}, whole.path());
  ASSERT_EQ(w.exit_code, 0) << w.err;
  const auto want = SqliteContent(whole / "db.sqlite");
  ASSERT_GT(want.size(), 1000u);

  auto db = testing::PgDatabase::CreateOnTestServer();
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  std::vector<std::unique_ptr<TempDir>> dirs;
  std::vector<std::unique_ptr<testing::Child>> shards;
  for (int i = 0; i < 3; ++i) {
    dirs.push_back(std::make_unique<TempDir>());
    const std::string config = Config(dirs.back()->path(), (*db)->conninfo(), crawl);
    shards.push_back(std::make_unique<testing::Child>(
        std::vector<std::string>{ATFILL_BINARY, "backfill", config, "--shard",
                                 std::to_string(i) + "/3"},
        dirs.back()->path()));
  }
  uint64_t inserted = 0;
  for (int i = 0; i < 3; ++i) {
    auto done = shards[i]->Wait();
    ASSERT_EQ(done.exit_code, 0) << "shard " << i << ": " << done.err;
    auto job = RunProcess(
        {ATFILL_BINARY, "job", (dirs[i]->path() / "atfill.toml").string(), "1", "--json"},
        dirs[i]->path());
    ASSERT_EQ(job.exit_code, 0) << job.err;
    // Every record a shard wrote was new to the table: none was written by another shard first.
    EXPECT_THAT(job.out, Not(HasSubstr("\"unchanged\":"))) << "shard " << i;
    EXPECT_THAT(job.out, HasSubstr("\"shard\":\"" + std::to_string(i) + "/3\""));
    const auto at = job.out.find("\"records_written\":");
    ASSERT_NE(at, std::string::npos) << job.out;
    const uint64_t written = std::stoull(job.out.substr(at + 18));
    EXPECT_GT(written, want.size() / 6) << "shard " << i;
    inserted += written;
  }
  const auto got = PostgresContent((*db)->conninfo());
  EXPECT_EQ(inserted, got.size());
  EXPECT_TRUE(got == want) << "the shards' table differs from the unsharded run (" << got.size()
                           << " rows, want " << want.size() << ")";
}

}  // namespace
}  // namespace atfill
