// The relay firehose consumer (sources/firehose/firehose.hpp) against the reference PDS's own
// com.atproto.sync.subscribeRepos (../shared/peers), consumed while the seed script writes: every
// commit the PDS sent is verified (the counter equals the commits an independent reader counts),
// none is refused, and the table ends equal to the manifests of both seedings. And with accounts
// deactivated and taken down: their resyncs wait for them instead of being retried for ever, and
// the quiet run ends by itself.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "net/websocket.hpp"
#include "sinks/sqlite_reader.hpp"
#include "sources/firehose/firehose.hpp"
#include "sources/firehose/firehose_frames.hpp"
#include "tests/common/job_harness.hpp"
#include "tests/common/peers.hpp"
#include "tests/common/process.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::testing {
namespace {

std::string WsOf(const std::string& http) { return "ws://" + http.substr(http.find("://") + 3); }

uint64_t Counter(const state::JobRecord& job, const std::string& name) {
  auto it = job.counters.extra.find(name);
  return it == job.counters.extra.end() ? 0 : it->second;
}

// The #commit frames the PDS's firehose replays from the start, counted by a plain reader.
Result<uint64_t> CountCommits(const std::string& ws_base) {
  net::WebSocketOptions o;
  o.allow_private_addresses = true;
  o.max_message_bytes = 16 << 20;
  ATFILL_ASSIGN_OR_RETURN(auto client, net::WebSocketClient::Start(o));
  std::mutex mu;
  std::condition_variable cv;
  uint64_t commits = 0, frames = 0;
  auto last = std::chrono::steady_clock::now();
  net::WebSocketTarget target;
  target.hosts = {ws_base + "/xrpc/com.atproto.sync.subscribeRepos?cursor=0"};
  net::WebSocketHandlers h;
  h.on_message = [&](std::string_view data, bool) {
    sources::FirehoseFrame frame;
    std::string kind;
    const bool commit = sources::DecodeFirehoseFrame(AsBytes(data), &frame, &kind).ok() &&
                        frame.kind() == sources::FirehoseKind::kCommit;
    std::lock_guard<std::mutex> lock(mu);
    ++frames;
    if (commit) ++commits;
    last = std::chrono::steady_clock::now();
    cv.notify_one();
  };
  ATFILL_RETURN_IF_ERROR(client->Connect(std::move(target), std::move(h)));
  // The replay is over once nothing more came for a second (bounded: 60 s in all).
  std::unique_lock<std::mutex> lock(mu);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    cv.wait_for(lock, std::chrono::milliseconds(200));
    if (frames > 0 && std::chrono::steady_clock::now() - last > std::chrono::seconds(1)) break;
  }
  lock.unlock();
  client->Close();
  return commits;
}

// One live job of the firehose consumer into dir/db.sqlite, to its end; *stats: the source's.
SourceJobRun Consume(const std::filesystem::path& dir, const sources::FirehoseOptions& o,
                     sources::FirehoseStats* stats) {
  std::unique_ptr<sources::FirehoseSource> made;
  return RunSourceJob(
      dir / "state", (dir / "db.sqlite").string(), "live", "live",
      [&](state::KvStore& kv,
          const state::JobRecord&) -> Result<std::unique_ptr<pipeline::Source>> {
        ATFILL_ASSIGN_OR_RETURN(made, sources::FirehoseSource::Create(o, &kv));
        return Borrow(made.get());
      },
      nullptr,
      [&](state::KvStore&, const state::JobRecord&) {
        if (made != nullptr) *stats = made->stats();
        made.reset();
      });
}

TEST(PeersFirehoseTest, ThePdsFirehoseConsumedWhileTheSeedWritesEqualsTheManifests) {
  ATFILL_SHARED_PATH(harness, "peers/network.sh");
  // A first seeding before the consumer starts (replayed from the PDS's first event), then a
  // second one while it runs.
  auto up = PeerNetwork::Up(SharedDir().string(), ATFILL_PEERS_HOME,
                            {"--accounts", "1", "--records", "6", "--prefix", "early"});
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  PeerNetwork& peers = **up;
  TempDir dir;

  sources::FirehoseOptions o;
  o.hosts = {WsOf(peers.pds_url_ip())};
  o.start_seq = 1;  // from the PDS's first event
  o.idle_exit_ms = 4000;
  o.tick_ms = 20;
  o.resolver.plc_url = peers.plc_url();
  o.resolver.allow_loopback_endpoints = true;
  o.http.allow_private_addresses = true;
  o.resync_retry_ms = 200;
  testing::SourceJobRun run;
  sources::FirehoseStats stats;
  std::thread consumer([&] { run = Consume(dir.path(), o, &stats); });
  const std::string second = (dir.path() / "manifest2.json").string();
  ProcessResult seeded =
      RunProcess({"/usr/bin/env", "PEERS_HOME=" + peers.peers_home(), peers.node(),
                  peers.peers_home() + "/seed.mjs", "--accounts", "2", "--records", "20",
                  "--prefix", "live", "--batch", "5", "--quiet", "--out", second},
                 dir.path(), std::chrono::seconds(120));
  consumer.join();
  ASSERT_EQ(seeded.exit_code, 0) << seeded.err;
  auto later = ParsePeerManifest(ReadFileOrDie(second));
  ASSERT_TRUE(later.ok()) << later.status().ToString();

  std::map<std::string, std::string> want;
  for (const PeerManifest* m :
       std::initializer_list<const PeerManifest*>{&peers.manifest(), &*later}) {
    for (const PeerAccount& a : m->accounts) {
      for (const PeerRecord& r : a.records) want[r.uri] = r.cid;
    }
  }
  ASSERT_EQ(want.size(), peers.manifest().live_records + later->live_records);
  std::map<std::string, std::string> table;
  auto rows = sinks::ReadAllRecords((dir.path() / "db.sqlite").string());
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  for (const auto& r : *rows) table[r.uri] = r.cid;
  EXPECT_EQ(table, want);

  // Every commit the PDS sent was verified, none refused.
  const state::JobRecord& job = run.job;
  auto commits = CountCommits(WsOf(peers.pds_url_ip()));
  ASSERT_TRUE(commits.ok()) << commits.status().ToString();
  EXPECT_GT(*commits, 20u);
  EXPECT_EQ(Counter(job, "firehose_verified"), *commits);
  EXPECT_EQ(Counter(job, "firehose_refused"), 0u);
  EXPECT_EQ(Counter(job, "firehose_failed"), 0u);
  // Each was applied, or was stale: the PDS sends a #sync as it creates a repo, and the resync's
  // getRepo, taken while the seed goes on writing, is newer than the commits that follow.
  EXPECT_EQ(Counter(job, "firehose_applied") + Counter(job, "firehose_stale"), *commits);
  EXPECT_GT(Counter(job, "firehose_applied"), 0u);
  EXPECT_EQ(Counter(job, "firehose_resynced"), Counter(job, "firehose_desync"));
  std::string kinds;
  for (const auto& [k, n] : run.error_kinds) kinds += k + "=" + std::to_string(n) + " ";
  EXPECT_EQ(run.error_kinds.count("bad_signature") + run.error_kinds.count("bad_car"), 0u) << kinds;
  EXPECT_EQ(stats.refused, 0u);
  EXPECT_TRUE(peers.Down().ok());
}

// The PDS answers getRepo of a deactivated or taken-down account with RepoDeactivated or
// RepoTakendown. Their repos are not resynced until their accounts are active again: the resync is
// put off (counted, shown), never counted as failed nor retried, and idle_exit_ms ends the run.
// Desyncs are not failed records.
TEST(PeersFirehoseTest, InactiveAccountsAreNotResyncedUntilActiveAndTheQuietRunEnds) {
  ATFILL_SHARED_PATH(harness, "peers/network.sh");
  auto up = PeerNetwork::Up(SharedDir().string(), ATFILL_PEERS_HOME,
                            {"--accounts", "3", "--records", "5", "--prefix", "inact",
                             "--deactivate", "1", "--takedown", "1"});
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  PeerNetwork& peers = **up;
  size_t inactive = 0;
  std::map<std::string, std::string> active_records;
  for (const PeerAccount& a : peers.manifest().accounts) {
    if (!a.active) {
      ++inactive;
      continue;
    }
    for (const PeerRecord& r : a.records) active_records[r.uri] = r.cid;
  }
  ASSERT_EQ(inactive, 2u);
  ASSERT_FALSE(active_records.empty());
  TempDir dir;
  sources::FirehoseOptions o;
  o.hosts = {WsOf(peers.pds_url_ip())};
  o.start_seq = 1;
  o.idle_exit_ms = 3000;
  o.tick_ms = 20;
  o.resolver.plc_url = peers.plc_url();
  o.resolver.allow_loopback_endpoints = true;
  o.http.allow_private_addresses = true;
  o.resync_retry_ms = 100;
  sources::FirehoseStats stats;
  const auto started = std::chrono::steady_clock::now();
  SourceJobRun run = Consume(dir.path(), o, &stats);
  const state::JobRecord& job = run.job;
  EXPECT_EQ(job.stop_reason.code, "stream_idle") << job.stop_reason.sentence;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(60));
  std::string kinds;
  for (const auto& [k, n] : run.error_kinds) kinds += k + "=" + std::to_string(n) + " ";
  // Both inactive accounts are known as such, their resyncs waiting; none failed or was retried.
  EXPECT_EQ(stats.inactive, 2u) << kinds;
  EXPECT_EQ(Counter(job, "firehose_failed"), 0u) << kinds;
  EXPECT_LE(Counter(job, "firehose_resync_deferred"), 2u) << kinds;
  EXPECT_LE(stats.resyncs_started, Counter(job, "firehose_desync")) << kinds;
  EXPECT_EQ(Counter(job, "firehose_refused"), 0u) << kinds;
  // A desync is a repo's state, not a record that failed.
  EXPECT_GT(Counter(job, "firehose_desync"), 0u) << kinds;
  EXPECT_EQ(job.counters.failed_records, 0u) << kinds;
  // The active account's records all landed.
  std::map<std::string, std::string> table;
  auto rows = sinks::ReadAllRecords((dir.path() / "db.sqlite").string());
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  for (const auto& r : *rows) {
    if (active_records.contains(r.uri)) table[r.uri] = r.cid;
  }
  EXPECT_EQ(table, active_records);
  // A restart on the same state: the inactive accounts are remembered, so neither repo is asked
  // for again (its PDS would answer the same), and the quiet run still ends by itself.
  sources::FirehoseStats again;
  SourceJobRun second = Consume(dir.path(), o, &again);
  EXPECT_EQ(second.job.stop_reason.code, "stream_idle") << second.job.stop_reason.sentence;
  EXPECT_EQ(again.inactive, 2u);
  EXPECT_EQ(again.resyncs_started, 0u);
  EXPECT_EQ(Counter(second.job, "firehose_resync_deferred"),
            Counter(job, "firehose_resync_deferred"));  // the job's counters add up across runs
  EXPECT_EQ(Counter(second.job, "firehose_failed"), 0u);
  EXPECT_TRUE(peers.Down().ok());
}

}  // namespace
}  // namespace atfill::testing
