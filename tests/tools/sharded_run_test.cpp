// Sharded runs (--shard i/n) against simnet over loopback: n real `atfill` processes, each with its
// own state directory, split one backfill and one live stream by DID. Together they write exactly
// what one unsharded process writes, and no record is written by two of them.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "pipeline/shard.hpp"
#include "sinks/sqlite_reader.hpp"
#include "tests/common/process.hpp"
#include "tools/simnet/jetstream.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill {
namespace {

using testing::TempDir;

constexpr int kShards = 3;

// uri -> (did, cid) of a table.
struct Row {
  std::string did;
  std::string cid;
  friend bool operator==(const Row&, const Row&) = default;
};
using Table = std::map<std::string, Row>;

Table ReadTable(const std::filesystem::path& db) {
  Table out;
  auto rows = sinks::ReadAllRecords(db.string());
  EXPECT_TRUE(rows.ok()) << db << ": " << rows.status().ToString();
  if (!rows.ok()) return out;
  for (const auto& r : *rows) out[r.uri] = {r.did, r.cid};
  return out;
}

std::string Diff(const Table& want, const Table& got) {
  std::string out;
  int shown = 0;
  for (const auto& [uri, row] : want) {
    auto it = got.find(uri);
    if ((it == got.end() || !(it->second == row)) && shown++ < 5) out += "missing: " + uri + "\n";
  }
  shown = 0;
  for (const auto& [uri, row] : got) {
    if (want.count(uri) == 0 && shown++ < 5) out += "unexpected: " + uri + "\n";
  }
  return out;
}

// Each shard's table holds only DIDs its shard owns, the tables share no record, and together
// they equal `whole`.
void ExpectShardsSplit(const std::vector<Table>& shards, const Table& whole) {
  Table together;
  for (int i = 0; i < kShards; ++i) {
    SCOPED_TRACE("shard " + std::to_string(i));
    const pipeline::Shard shard{static_cast<uint32_t>(i), kShards};
    // Each shard wrote a fair part (about a third, not nothing and not everything).
    EXPECT_GT(shards[i].size(), whole.size() / 6);
    EXPECT_LT(shards[i].size(), whole.size() / 2);
    size_t foreign = 0, twice = 0;
    for (const auto& [uri, row] : shards[i]) {
      if (!shard.Owns(row.did)) ++foreign;
      if (!together.emplace(uri, row).second) ++twice;
    }
    EXPECT_EQ(foreign, 0u) << "records of DIDs another shard owns";
    EXPECT_EQ(twice, 0u) << "records another shard wrote too";
  }
  EXPECT_EQ(together, whole) << Diff(whole, together);
}

std::string Config(const std::filesystem::path& dir, const std::string& body) {
  const std::string path = (dir / "atfill.toml").string();
  testing::WriteFile(path,
                     "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"db.sqlite\"\n"
                     "[progress]\ninterval_s = 60\n" +
                         body);
  return path;
}

simnet::SimnetOptions Network() {
  simnet::SimnetOptions o;
  o.seed = 23;
  o.accounts = 240;
  o.pds_hosts = 6;
  o.collections = {"app.bsky.feed.post", "app.bsky.feed.like"};
  o.max_records = 30;
  o.did_web_share = 0.1;
  o.deactivated_share = 0;
  o.takendown_share = 0;
  o.threads = 2;
  o.jetstream.events = 3000;
  return o;
}

std::string CrawlSections(const simnet::Simnet& net) {
  return "[crawl]\nrelay = \"" + net.relay_url() +
         "\"\ncollections = [\"app.bsky.feed.post\", \"app.bsky.feed.like\"]\n"
         "allow_loopback_endpoints = true\nlist_repos_limit = 40\n[resolver]\nplc = \"" +
         net.plc_url() + "\"\n";
}

TEST(ShardTest, ThreeShardedBackfillsTogetherEqualOneUnshardedRun) {
  auto net = simnet::Simnet::Start(Network());
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  TempDir whole_dir;
  const std::string whole_config = Config(whole_dir.path(), CrawlSections(**net));
  auto whole_run = testing::RunProcess({ATFILL_BINARY, "backfill", whole_config}, whole_dir.path());
  ASSERT_EQ(whole_run.exit_code, 0) << whole_run.err;
  const Table whole = ReadTable(whole_dir / "db.sqlite");
  ASSERT_GT(whole.size(), 1000u);

  // The three shards run at once, as they would on three machines.
  std::vector<std::unique_ptr<TempDir>> dirs;
  std::vector<std::unique_ptr<testing::Child>> children;
  for (int i = 0; i < kShards; ++i) {
    dirs.push_back(std::make_unique<TempDir>());
    const std::string config = Config(dirs.back()->path(), CrawlSections(**net));
    const std::string shard = std::to_string(i) + "/" + std::to_string(kShards);
    children.push_back(std::make_unique<testing::Child>(
        std::vector<std::string>{ATFILL_BINARY, "backfill", config, "--shard", shard},
        dirs.back()->path()));
  }
  std::vector<Table> shards;
  for (int i = 0; i < kShards; ++i) {
    auto done = children[i]->Wait();
    EXPECT_EQ(done.exit_code, 0) << "shard " << i << ": " << done.err;
    shards.push_back(ReadTable(dirs[i]->path() / "db.sqlite"));
  }
  ExpectShardsSplit(shards, whole);

  // The job records its shard, and a resumed run keeps the state directory's shard.
  const std::string config = (dirs[1]->path() / "atfill.toml").string();
  auto job = testing::RunProcess({ATFILL_BINARY, "job", config, "1", "--json"}, dirs[1]->path());
  EXPECT_EQ(job.exit_code, 0) << job.err;
  EXPECT_NE(job.out.find("\"shard\":\"1/3\""), std::string::npos) << job.out;
  auto other =
      testing::RunProcess({ATFILL_BINARY, "backfill", config, "--shard", "2/3"}, dirs[1]->path());
  EXPECT_EQ(other.exit_code, 3) << other.err;
  EXPECT_NE(other.err.find("belongs to shard 1/3, and this process is shard 2/3"),
            std::string::npos)
      << other.err;
  EXPECT_EQ(ReadTable(dirs[1]->path() / "db.sqlite"), shards[1]);
}

TEST(ShardTest, ThreeShardedLiveConsumersSplitOneStream) {
  auto net = simnet::Simnet::Start(Network());
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  auto truth = (*net)->JetstreamGroundTruth();
  ASSERT_TRUE(truth.ok()) << truth.status().ToString();
  Table whole;
  for (const auto& r : truth->records) {
    const std::string did = r.uri.substr(5, r.uri.find('/', 5) - 5);
    whole[r.uri] = {did, r.cid};
  }
  ASSERT_GT(whole.size(), 500u);
  const std::string live = "[live]\nhosts = [\"" + (*net)->jetstream_url() +
                           "\"]\nallow_private_endpoints = true\nidle_exit_ms = 1500\n"
                           "start_seq = 1\nreconnect_base_ms = 20\nreconnect_max_ms = 200\n"
                           "check_deleted_accounts = false\n";
  std::vector<std::unique_ptr<TempDir>> dirs;
  std::vector<std::unique_ptr<testing::Child>> children;
  for (int i = 0; i < kShards; ++i) {
    dirs.push_back(std::make_unique<TempDir>());
    // The shard from the config this time ([engine] shard) rather than the command line.
    const std::string config =
        Config(dirs.back()->path(), "[engine]\nshard = \"" + std::to_string(i) + "/3\"\n" + live);
    children.push_back(std::make_unique<testing::Child>(
        std::vector<std::string>{ATFILL_BINARY, "run", config}, dirs.back()->path()));
  }
  std::vector<Table> shards;
  for (int i = 0; i < kShards; ++i) {
    auto done = children[i]->Wait();
    // Paused: the stream went quiet (idle_exit_ms).
    EXPECT_EQ(done.exit_code, 4) << "shard " << i << ": " << done.err;
    EXPECT_NE(done.err.find("3,000 messages read"), std::string::npos) << done.err;
    shards.push_back(ReadTable(dirs[i]->path() / "db.sqlite"));
  }
  ExpectShardsSplit(shards, whole);
}

TEST(ShardTest, AShardThatIsNotINOfNIsRefusedWithTheReason) {
  TempDir dir;
  const std::string config = Config(dir.path(), "");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--shard", "3/3"}, "i counts from 0 and must be below n"},
      {{"--shard", "1"}, "is not i/n"},
      {{"--shard", "a/b"}, "is not i/n"},
      {{"--shard", "0/0"}, "n must be 1 to 65536"},
      {{"--shard"}, "--shard needs a value"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {ATFILL_BINARY, "backfill", config, "--collection",
                                     "app.bsky.feed.post"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = testing::RunProcess(argv, dir.path());
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  }
  const std::string bad = Config(dir.path(), "[engine]\nshard = \"2/2\"\n");
  auto r = testing::RunProcess({ATFILL_BINARY, "jobs", bad}, dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("atfill.toml:8: engine.shard"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace atfill
