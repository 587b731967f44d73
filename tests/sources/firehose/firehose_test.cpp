// The relay firehose consumer (sources/firehose/firehose.hpp) against a relay serving simnet's
// repos as chains of signed commits (tools/simnet/firehose_relay.hpp), over loopback, into SQLite
// with RocksDB state: commits dropped from the stream, #sync frames, commits signed with another
// key and commits with a tampered block. The tampered and mis-signed commits are refused and logged
// naming their seq and DID, the repos whose chain broke are resynced from their PDS's getRepo,
// and the table ends equal to the served repos, with no deleted record left behind.
#include "sources/firehose/firehose.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "state/repo_chains.hpp"
#include "tests/common/job_harness.hpp"
#include "tests/common/process.hpp"
#include "tests/common/test_util.hpp"
#include "tools/simnet/firehose_relay.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill {
namespace {

using sources::FirehoseOptions;
using sources::FirehoseSource;
using testing::TempDir;

simnet::SimnetOptions Network() {
  simnet::SimnetOptions o;
  o.seed = 21;
  o.accounts = 40;
  o.pds_hosts = 2;
  o.min_records = 1;
  o.max_records = 12;
  o.deactivated_share = 0;
  o.takendown_share = 0;
  o.threads = 2;
  return o;
}

FirehoseOptions Options(const simnet::Simnet& net, const simnet::FirehoseRelay& relay) {
  FirehoseOptions o;
  o.hosts = {relay.url()};
  o.start_seq = 1;
  o.idle_exit_ms = 1000;
  o.tick_ms = 20;
  o.resolver.plc_url = net.plc_url();
  o.resolver.allow_loopback_endpoints = true;
  o.http.allow_private_addresses = true;
  o.resync_retry_ms = 100;
  o.websocket.reconnect.base_backoff_ms = 20;
  o.websocket.reconnect.max_backoff_ms = 200;
  return o;
}

std::map<std::string, std::string> Truth(const simnet::Simnet& net) {
  auto truth = net.Truth();
  EXPECT_TRUE(truth.ok()) << truth.status().ToString();
  return truth.ok() ? testing::UriCids(truth->records) : std::map<std::string, std::string>{};
}

uint64_t Counter(const state::JobRecord& job, const std::string& name) {
  auto it = job.counters.extra.find(name);
  return it == job.counters.extra.end() ? 0 : it->second;
}

struct Consumed {
  testing::SourceJobRun job;
  sources::FirehoseStats stats;
  size_t desynchronized_left = 0;
};

Consumed Consume(const std::filesystem::path& dir, const FirehoseOptions& options) {
  Consumed out;
  std::unique_ptr<FirehoseSource> made;
  out.job = testing::RunSourceJob(
      dir / "state", (dir / "db.sqlite").string(), "live", "live",
      [&](state::KvStore& kv,
          const state::JobRecord&) -> Result<std::unique_ptr<pipeline::Source>> {
        ATFILL_ASSIGN_OR_RETURN(made, FirehoseSource::Create(options, &kv));
        return testing::Borrow(made.get());
      },
      nullptr,
      [&](state::KvStore& kv, const state::JobRecord&) {
        if (made != nullptr) out.stats = made->stats();
        made.reset();
        EXPECT_TRUE(state::RepoChains(kv)
                        .ScanDesynchronized([&](std::string_view, const state::RepoChain&) {
                          ++out.desynchronized_left;
                          return true;
                        })
                        .ok());
      });
  return out;
}

TEST(FirehoseSource, VerifiedStreamWithGapsAndForgeriesEndsEqualToTheServedRepos) {
  auto net = simnet::Simnet::Start(Network());
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  simnet::FirehoseLogOptions lo;
  lo.seed = 5;
  lo.drop_share = 0.08;
  lo.sync_share = 0.1;
  lo.bad_signature_share = 0.05;
  lo.tampered_share = 0.05;
  auto log = simnet::BuildFirehoseLog((*net)->network(), lo);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  // The faults this test is about happened.
  ASSERT_GT(log->dropped, 0u);
  ASSERT_GT(log->syncs, 0u);
  ASSERT_GT(log->bad_signatures, 0u);
  ASSERT_GT(log->tampered, 0u);
  const std::vector<simnet::FirehoseLogFrame> frames = log->frames;
  auto relay = simnet::FirehoseRelay::Start(std::move(log->frames));
  ASSERT_TRUE(relay.ok()) << relay.status().ToString();

  TempDir dir;
  Consumed run = Consume(dir.path(), Options(**net, **relay));
  const state::JobRecord& job = run.job.job;
  EXPECT_EQ(job.stop_reason.code, "stream_idle") << job.stop_reason.sentence;

  // Every commit was verified: those that verified, plus those refused, are all of them.
  const uint64_t forged = log->bad_signatures + log->tampered;
  EXPECT_EQ(Counter(job, "firehose_verified"), log->commits - forged);
  EXPECT_EQ(Counter(job, "firehose_refused"), forged);
  EXPECT_EQ(Counter(job, "firehose_refused_bad_signature"), log->bad_signatures);
  EXPECT_EQ(Counter(job, "firehose_refused_bad_car"), log->tampered);
  EXPECT_EQ(run.job.error_kinds["bad_signature"], log->bad_signatures);
  EXPECT_EQ(run.job.error_kinds["bad_car"], log->tampered);
  // Each refusal is logged naming the frame's seq and its DID.
  uint64_t named = 0;
  for (const state::ErrorEntry& e : run.job.errors) {
    if (e.kind != "bad_signature" && e.kind != "bad_car") continue;
    const int64_t seq = std::strtoll(e.key.c_str() + 4, nullptr, 10);
    for (const auto& f : frames) {
      if (f.seq == seq && e.key == "seq " + std::to_string(seq) + " " + f.did) ++named;
    }
  }
  EXPECT_EQ(named, forged);

  // The broken chains were found and their repos fetched again, all of them successfully.
  EXPECT_GE(Counter(job, "firehose_desync"), log->broken_dids.size());
  EXPECT_EQ(Counter(job, "firehose_resynced"), Counter(job, "firehose_desync"));
  EXPECT_EQ(Counter(job, "firehose_failed"), 0u);
  EXPECT_EQ(run.job.error_kinds["repo_desync"], Counter(job, "firehose_desync"));
  EXPECT_EQ(run.desynchronized_left, 0u);
  // Every verified commit was judged in the end: applied, or stale (held until its repo's
  // resync, which is newer).
  EXPECT_EQ(Counter(job, "firehose_applied") + Counter(job, "firehose_stale"),
            Counter(job, "firehose_verified"));
  EXPECT_GT(Counter(job, "firehose_applied"), 0u);
  EXPECT_GT(Counter(job, "firehose_stale"), 0u);

  const auto truth = Truth(**net);
  const auto table = testing::TableCids((dir.path() / "db.sqlite").string());
  EXPECT_EQ(table.size(), truth.size());
  EXPECT_TRUE(table == truth) << testing::DiffCids(truth, table);
  for (const auto& [uri, cid] : table) {
    EXPECT_EQ(uri.find("/ephemeral-"), std::string::npos) << "a deleted record stayed: " << uri;
  }
}

TEST(FirehoseSource, ResumesFromItsCursorAcrossDisconnectsAndRuns) {
  auto net = simnet::Simnet::Start(Network());
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  auto log = simnet::BuildFirehoseLog((*net)->network(), simnet::FirehoseLogOptions{});
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  ASSERT_TRUE(log->broken_dids.empty());
  const uint64_t commits = log->commits;
  const int64_t last_seq = log->frames.back().seq;
  // The first run sees the first half of the log only (a relay that has not sent more yet), over
  // connections that drop every 25 frames.
  std::vector<simnet::FirehoseLogFrame> half(log->frames.begin(),
                                             log->frames.begin() + log->frames.size() / 2);
  const int64_t half_seq = half.back().seq;
  TempDir dir;
  {
    simnet::FirehoseRelayOptions ro;
    ro.disconnect_after_frames = 25;
    auto relay = simnet::FirehoseRelay::Start(std::move(half), ro);
    ASSERT_TRUE(relay.ok()) << relay.status().ToString();
    Consumed first = Consume(dir.path(), Options(**net, **relay));
    EXPECT_EQ(first.stats.last_seq, static_cast<uint64_t>(half_seq));
    EXPECT_GT((*relay)->connections(), 2u);
    EXPECT_EQ(Counter(first.job.job, "firehose_desync"), 0u);
  }
  // The second run resumes after the saved cursor: no commit comes twice, none is missing.
  auto relay = simnet::FirehoseRelay::Start(std::move(log->frames));
  ASSERT_TRUE(relay.ok()) << relay.status().ToString();
  Consumed second = Consume(dir.path(), Options(**net, **relay));
  EXPECT_EQ(second.stats.last_seq, static_cast<uint64_t>(last_seq));
  const state::JobRecord& job = second.job.job;
  EXPECT_EQ(Counter(job, "firehose_verified"), commits);
  EXPECT_EQ(Counter(job, "firehose_applied"), commits);
  EXPECT_EQ(Counter(job, "firehose_stale"), 0u);
  EXPECT_EQ(Counter(job, "firehose_desync"), 0u);
  const auto truth = Truth(**net);
  const auto table = testing::TableCids((dir.path() / "db.sqlite").string());
  EXPECT_TRUE(table == truth) << testing::DiffCids(truth, table);
}

// Frames of accounts whose key is still being resolved wait in memory. With max_waiting_bytes
// reached, the source reads no new message until keys arrive, so what waits stays within one
// read's frames of the bound; the stream meanwhile waits in the connection, and nothing is lost.
TEST(FirehoseSource, FramesWaitingForKeysStayBoundedAndAllLand) {
  simnet::SimnetOptions no = Network();
  auto slow_plc = simnet::ParseFaultSpec("plc:latency_ms=100");
  ASSERT_TRUE(slow_plc.ok()) << slow_plc.status().ToString();
  no.faults = *slow_plc;
  auto net = simnet::Simnet::Start(no);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  auto log = simnet::BuildFirehoseLog((*net)->network(), simnet::FirehoseLogOptions{});
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  const uint64_t commits = log->commits;
  const auto truth = Truth(**net);

  struct Run {
    Consumed consumed;
    std::map<std::string, std::string> table;
  };
  auto run = [&](uint64_t max_waiting_bytes) {
    auto relay = simnet::FirehoseRelay::Start(log->frames);
    EXPECT_TRUE(relay.ok()) << relay.status().ToString();
    TempDir dir;
    FirehoseOptions o = Options(**net, **relay);
    o.chunk_messages = 8;
    o.max_waiting_bytes = max_waiting_bytes;
    Run r{Consume(dir.path(), o), {}};
    r.table = testing::TableCids((dir.path() / "db.sqlite").string());
    return r;
  };
  const Run unbounded = run(FirehoseOptions{}.max_waiting_bytes);
  const Run bounded = run(1);

  for (const Run* r : {&unbounded, &bounded}) {
    const state::JobRecord& job = r->consumed.job.job;
    EXPECT_EQ(job.stop_reason.code, "stream_idle") << job.stop_reason.sentence;
    EXPECT_EQ(Counter(job, "firehose_verified"), commits);
    EXPECT_EQ(Counter(job, "firehose_applied"), commits);
    EXPECT_EQ(Counter(job, "firehose_refused"), 0u);
    EXPECT_TRUE(r->table == truth) << testing::DiffCids(truth, r->table);
  }
  // Without the bound, the frames of many accounts waited at once (the relay sends the log
  // faster than the PLC answers); with it, the source paused and held a read's worth at most.
  EXPECT_EQ(Counter(unbounded.consumed.job.job, "firehose_paused_for_keys"), 0u);
  EXPECT_GT(Counter(bounded.consumed.job.job, "firehose_paused_for_keys"), 0u);
  EXPECT_GT(bounded.consumed.stats.peak_waiting_bytes, 0u);
  EXPECT_LT(bounded.consumed.stats.peak_waiting_bytes * 4,
            unbounded.consumed.stats.peak_waiting_bytes)
      << "bounded " << bounded.consumed.stats.peak_waiting_bytes << " unbounded "
      << unbounded.consumed.stats.peak_waiting_bytes;
}

// The collections change while the consumer runs (what POST /admin/collections and SIGHUP do
// through LiveCollections): from the next chunk read on, the removed collections stop landing,
// the kept one goes on whole.
TEST(FirehoseSource, ACollectionRemovedWhileItRunsStopsLandingAndTheOthersGoOn) {
  auto net = simnet::Simnet::Start(Network());
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  auto log = simnet::BuildFirehoseLog((*net)->network(), simnet::FirehoseLogOptions{});
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  const size_t frames = log->frames.size();
  const int64_t third_seq = log->frames[frames / 3].seq;
  // The collection with the most records is kept; the others are removed.
  const auto truth = Truth(**net);
  std::map<std::string, size_t> per_collection;
  auto collection_of = [](const std::string& uri) {
    const size_t a = uri.find('/', 5);
    return uri.substr(a + 1, uri.find('/', a + 1) - a - 1);
  };
  for (const auto& [uri, cid] : truth) ++per_collection[collection_of(uri)];
  ASSERT_GE(per_collection.size(), 2u);
  std::string kept;
  for (const auto& [c, n] : per_collection) {
    if (kept.empty() || n > per_collection[kept]) kept = c;
  }
  // Slow enough that two thirds of the stream come after the change.
  simnet::FirehoseRelayOptions ro;
  ro.frames_per_second = static_cast<double>(frames) / 3.0;
  auto relay = simnet::FirehoseRelay::Start(std::move(log->frames), ro);
  ASSERT_TRUE(relay.ok()) << relay.status().ToString();

  TempDir dir;
  std::atomic<FirehoseSource*> running{nullptr};
  std::unique_ptr<FirehoseSource> made;
  testing::SourceJobRun run;
  std::thread consumer([&] {
    run = testing::RunSourceJob(
        dir.path() / "state", (dir.path() / "db.sqlite").string(), "live", "live",
        [&](state::KvStore& kv,
            const state::JobRecord&) -> Result<std::unique_ptr<pipeline::Source>> {
          ATFILL_ASSIGN_OR_RETURN(made, FirehoseSource::Create(Options(**net, **relay), &kv));
          running = made.get();
          return testing::Borrow(made.get());
        },
        nullptr,
        [&](state::KvStore&, const state::JobRecord&) {
          running = nullptr;
          made.reset();
        });
  });
  // Gate: the consumer has read a third of the stream (bounded: 30 s).
  bool changed = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!changed && std::chrono::steady_clock::now() < deadline) {
    FirehoseSource* s = running.load();
    if (s != nullptr && s->stats().last_seq >= static_cast<uint64_t>(third_seq)) {
      EXPECT_TRUE(s->SetCollections({kept}).ok());
      EXPECT_TRUE(s->WaitFilterApplied(std::chrono::seconds(10)).ok());
      EXPECT_TRUE(s->Consumes(kept));
      EXPECT_FALSE(s->Consumes("app.example.removed"));
      changed = true;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  consumer.join();
  ASSERT_TRUE(changed) << "the consumer never read a third of the stream";
  EXPECT_EQ(run.job.stop_reason.code, "stream_idle") << run.job.stop_reason.sentence;

  std::map<std::string, std::string> kept_truth, kept_table;
  size_t removed_truth = 0, removed_table = 0;
  for (const auto& [uri, cid] : truth) {
    if (collection_of(uri) == kept) {
      kept_truth[uri] = cid;
    } else {
      ++removed_truth;
    }
  }
  for (const auto& [uri, cid] : testing::TableCids((dir.path() / "db.sqlite").string())) {
    if (collection_of(uri) == kept) {
      kept_table[uri] = cid;
    } else {
      ++removed_table;
    }
  }
  EXPECT_TRUE(kept_table == kept_truth) << testing::DiffCids(kept_truth, kept_table);
  // What the first third wrote of the removed collections landed; what came later did not.
  EXPECT_GT(removed_table, 0u);
  EXPECT_LT(removed_table, removed_truth);
}

// A repo whose PDS never answers getRepo stays desynchronized, its resync tried again and again:
// a quiet run still ends after idle_exit_ms (the mark stays in state for the next run), and
// neither the desyncs nor the failed resyncs count as failed records.
TEST(FirehoseSource, AQuietRunEndsWhileResyncsStillFailAndDesyncsAreNotFailedRecords) {
  simnet::SimnetOptions no = Network();
  auto down = simnet::ParseFaultSpec("pds:error=always");
  ASSERT_TRUE(down.ok()) << down.status().ToString();
  no.faults = *down;
  auto net = simnet::Simnet::Start(no);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  simnet::FirehoseLogOptions lo;
  lo.seed = 7;
  lo.sync_share = 0.3;
  auto log = simnet::BuildFirehoseLog((*net)->network(), lo);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  ASSERT_GT(log->syncs, 0u);
  auto relay = simnet::FirehoseRelay::Start(std::move(log->frames));
  ASSERT_TRUE(relay.ok()) << relay.status().ToString();

  TempDir dir;
  FirehoseOptions o = Options(**net, **relay);
  o.http.retry.max_attempts = 1;
  Consumed run = Consume(dir.path(), o);
  const state::JobRecord& job = run.job.job;
  EXPECT_EQ(job.stop_reason.code, "stream_idle") << job.stop_reason.sentence;
  EXPECT_EQ(Counter(job, "firehose_desync"), log->syncs);
  EXPECT_GT(Counter(job, "firehose_failed"), 0u);
  EXPECT_EQ(Counter(job, "firehose_resynced"), 0u);
  EXPECT_EQ(run.desynchronized_left, log->syncs);
  EXPECT_EQ(Counter(job, "firehose_refused"), 0u);
  EXPECT_EQ(job.counters.failed_records, 0u);
}

}  // namespace
}  // namespace atfill
