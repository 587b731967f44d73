// The live consumer against simnet's Jetstream over loopback: v2 and v1, compressed or not, with
// disconnects, and `atfill run` killed with SIGKILL mid-stream: the table always ends equal to the
// ground truth of applying the whole log.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "atproto/lexicon.hpp"
#include "pipeline/run.hpp"
#include "sinks/sqlite_reader.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/archive/archive_writer.hpp"
#include "sources/archive/jss.hpp"
#include "sources/crawl/pds_account_status.hpp"
#include "sources/crawl/resolver.hpp"
#include "sources/jetstream/jetstream.hpp"
#include "sources/jetstream/jetstream_frames.hpp"
#include "stages/account_check.hpp"
#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
#include "state/cursors.hpp"
#include "state/error_log.hpp"
#include "state/live_holds.hpp"
#include "state/tombstones.hpp"
#include "tests/common/http_test_server.hpp"
#include "tests/common/job_harness.hpp"
#include "tests/common/process.hpp"
#include "tests/common/test_util.hpp"
#include "tools/simnet/jetstream.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill {
namespace {

using sources::JetstreamOptions;
using sources::JetstreamProtocol;
using sources::JetstreamSource;
using testing::TempDir;

simnet::SimnetOptions Network(uint64_t events) {
  simnet::SimnetOptions o;
  o.seed = 11;
  o.accounts = 200;
  o.pds_hosts = 2;
  o.max_records = 2;
  o.threads = 2;
  o.jetstream.events = events;
  return o;
}

// Network(events) with repos a crawl beside the stream backfills: 120 active accounts on 3 hosts.
simnet::SimnetOptions CrawledNetwork(uint64_t events) {
  simnet::SimnetOptions o = Network(events);
  o.accounts = 120;
  o.pds_hosts = 3;
  o.max_records = 6;
  o.deactivated_share = 0;
  o.takendown_share = 0;
  return o;
}

JetstreamOptions Live(const simnet::Simnet& net, JetstreamProtocol protocol) {
  JetstreamOptions o;
  o.hosts = {net.jetstream_url()};
  o.protocol = protocol;
  o.idle_exit_ms = 1500;
  o.start_seq = 1;  // a fresh consumer replays the log from its first event
  o.tick_ms = 20;
  o.websocket.reconnect.base_backoff_ms = 20;
  o.websocket.reconnect.max_backoff_ms = 200;
  return o;
}

std::map<std::string, std::string> Truth(const simnet::Simnet& net) {
  auto truth = net.JetstreamGroundTruth();
  EXPECT_TRUE(truth.ok()) << truth.status().ToString();
  return truth.ok() ? testing::UriCids(truth->records) : std::map<std::string, std::string>{};
}

struct LiveRun {
  state::JobRecord job;
  sources::JetstreamStats stats;
  std::map<std::string, uint64_t> error_kinds;
  std::vector<state::ErrorEntry> errors;
};

// `saved_cursor` (when set) is written as job 1's cursor first, as if an earlier run had saved it.
LiveRun RunLive(const std::filesystem::path& dir, const JetstreamOptions& options,
                const std::vector<const pipeline::Transform*>& extra = {},
                const std::string& saved_cursor = "") {
  LiveRun out;
  std::unique_ptr<JetstreamSource> made;
  testing::SourceJobRun run = testing::RunSourceJob(
      dir / "state", (dir / "db.sqlite").string(), "live", "live",
      [&](state::KvStore& kv,
          const state::JobRecord&) -> Result<std::unique_ptr<pipeline::Source>> {
        ATFILL_ASSIGN_OR_RETURN(made, JetstreamSource::Create(options, &kv));
        return testing::Borrow(made.get());
      },
      [&](state::KvStore& kv) {
        if (saved_cursor.empty()) return;
        state::WriteBatch batch;
        state::Cursors(kv).Set(&batch, "job/1/cursor", saved_cursor);
        ASSERT_TRUE(kv.Write(batch).ok());
      },
      [&](state::KvStore&, const state::JobRecord&) {
        if (made != nullptr) out.stats = made->stats();
        made.reset();  // while the state store is still open
      },
      extra);
  out.job = std::move(run.job);
  out.error_kinds = std::move(run.error_kinds);
  out.errors = std::move(run.errors);
  return out;
}

std::string Kinds(const std::map<std::string, uint64_t>& kinds) {
  std::string s;
  for (const auto& [k, n] : kinds) s += k + "=" + std::to_string(n) + " ";
  return s;
}

struct Mode {
  JetstreamProtocol protocol;
  bool compress;
  const char* name;
};

// An `atfill run` config in `dir` against `net`'s Jetstream: state "state", table "db.sqlite",
// `sections` (whole TOML sections), then [live] from seq 1 with quick reconnects, exiting after
// `idle_ms` of quiet, plus `live_keys`. Returns its path.
std::string RunConfig(const std::filesystem::path& dir, const simnet::Simnet& net,
                      const std::string& sections, const std::string& live_keys = "",
                      int idle_ms = 1500) {
  const std::string path = (dir / "atfill.toml").string();
  testing::WriteFile(
      path, "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"db.sqlite\"\n" + sections +
                "[live]\nhosts = [\"" + net.jetstream_url() +
                "\"]\nallow_private_endpoints = true\nidle_exit_ms = " + std::to_string(idle_ms) +
                "\nstart_seq = 1\nreconnect_base_ms = 20\nreconnect_max_ms = 200\n" + live_keys);
  return path;
}

class LiveModes : public ::testing::TestWithParam<Mode> {};

TEST_P(LiveModes, TheWholeStreamAppliedEqualsTheGroundTruth) {
  auto net = simnet::Simnet::Start(Network(4000));
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  TempDir dir;
  JetstreamOptions o = Live(**net, GetParam().protocol);
  o.compress = GetParam().compress;
  if (GetParam().protocol == JetstreamProtocol::kV1 && GetParam().compress) {
    const auto dict = (*net)->jetstream_dictionary(1);
    ASSERT_FALSE(dict.empty());
    o.v1_dictionary_path = (dir.path() / "v1.zdict").string();
    std::ofstream(o.v1_dictionary_path, std::ios::binary)
        .write(reinterpret_cast<const char*>(dict.data()),
               static_cast<std::streamsize>(dict.size()));
  }
  LiveRun run = RunLive(dir.path(), o);
  EXPECT_EQ(run.job.stop_reason.code, "stream_idle") << run.job.stop_reason.sentence;
  EXPECT_EQ(run.stats.protocol, GetParam().protocol == JetstreamProtocol::kV1 ? "v1" : "v2");
  EXPECT_EQ(run.stats.last_seq, 4000u);
  EXPECT_EQ(Kinds(run.error_kinds), "");
  const auto want = Truth(**net);
  ASSERT_GT(want.size(), 500u);
  const auto got = testing::TableCids((dir.path() / "db.sqlite").string());
  EXPECT_EQ(got, want) << testing::DiffCids(want, got);
  // Compressed streams really were compressed: fewer bytes than the frames' text.
  if (GetParam().compress) {
    uint64_t text = 0;
    for (uint64_t seq = 1; seq <= 4000; ++seq) {
      auto f = GetParam().protocol == JetstreamProtocol::kV1 ? (*net)->jetstream()->FrameV1(seq)
                                                             : (*net)->jetstream()->FrameV2(seq);
      ASSERT_TRUE(f.ok());
      text += f->size();
    }
    EXPECT_LT(run.stats.bytes, text / 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Protocols, LiveModes,
                         ::testing::Values(Mode{JetstreamProtocol::kV2, true, "v2_zstd"},
                                           Mode{JetstreamProtocol::kV2, false, "v2_plain"},
                                           Mode{JetstreamProtocol::kV1, true, "v1_zstd"},
                                           Mode{JetstreamProtocol::kV1, false, "v1_plain"}),
                         [](const auto& info) { return std::string(info.param.name); });

// simnet's prerendered frames (JetstreamOptions::prerender, for benchmarks) are the frames it
// renders on the fly: compressed or not, the table equals the truth and the bytes on the wire
// match.
TEST(LiveTest, PrerenderedFramesAreTheSameStream) {
  simnet::SimnetOptions so = Network(3000);
  auto plain = simnet::Simnet::Start(so);
  so.jetstream.prerender = true;
  auto ready = simnet::Simnet::Start(so);
  ASSERT_TRUE(plain.ok() && ready.ok());
  for (bool compress : {false, true}) {
    SCOPED_TRACE(compress ? "zstd" : "uncompressed");
    TempDir a, b;
    JetstreamOptions oa = Live(**plain, JetstreamProtocol::kV2);
    JetstreamOptions ob = Live(**ready, JetstreamProtocol::kV2);
    oa.compress = ob.compress = compress;
    LiveRun ra = RunLive(a.path(), oa);
    LiveRun rb = RunLive(b.path(), ob);
    EXPECT_EQ(rb.stats.last_seq, 3000u);
    EXPECT_EQ(rb.stats.messages, ra.stats.messages);
    if (compress) {
      // zstd may attach or copy the dictionary depending on the context's history, so the bytes
      // differ a little; the decompressed frames are the same (the tables agree).
      EXPECT_NEAR(static_cast<double>(rb.stats.bytes), static_cast<double>(ra.stats.bytes),
                  0.02 * static_cast<double>(ra.stats.bytes));
    } else {
      EXPECT_EQ(rb.stats.bytes, ra.stats.bytes);
    }
    const auto want = Truth(**ready);
    const auto got = testing::TableCids((b.path() / "db.sqlite").string());
    EXPECT_EQ(got, want) << testing::DiffCids(want, got);
  }
}

// Failover to another Jetstream instance, which numbers the same events differently (seqs are per
// instance): the first host goes away mid-stream and the consumer resumes on the second by
// witnessed time. Resuming with the first host's seq would land past the second host's tip here
// (the first numbers from 1,000,001) and lose the rest of the stream.
TEST(LiveTest, FailoverToAnotherHostResumesByTime) {
  simnet::SimnetOptions so = Network(3000);
  so.did_web_share = 0;  // did:web DIDs name simnet's port: the two logs would differ
  so.jetstream.events_per_second = 6000;  // published over 0.5 s, so the first host dies mid-way
  so.jetstream.published_at_start = 0;
  simnet::SimnetOptions first_options = so;
  first_options.jetstream.seq_offset = 1'000'000;
  auto second = simnet::Simnet::Start(so);
  auto first = simnet::Simnet::Start(first_options);
  ASSERT_TRUE(first.ok() && second.ok());
  const auto want = Truth(**second);
  JetstreamOptions o = Live(**first, JetstreamProtocol::kV2);
  o.hosts = {(*first)->jetstream_url(), (*second)->jetstream_url()};
  o.websocket.reconnect.failures_before_failover = 1;
  // Each simnet trains its own dictionary under the same ID; real instances share theirs.
  o.compress = false;
  TempDir dir;
  std::unique_ptr<simnet::Simnet> dying = std::move(*first);
  std::thread killer([&] {
    testing::WaitUntil([&] { return dying->stats().jetstream_frames >= 1000; },
                       std::chrono::seconds(4), std::chrono::milliseconds(2));
    dying.reset();  // the first host goes away
  });
  LiveRun run = RunLive(dir.path(), o);
  killer.join();
  EXPECT_EQ(run.job.stop_reason.code, "stream_idle") << run.job.stop_reason.sentence;
  EXPECT_GE(run.stats.connections, 2u);
  EXPECT_EQ(run.stats.host, (*second)->jetstream_url());
  EXPECT_EQ(run.stats.last_seq, 3000u);  // the second host's numbering
  // The first host's end is logged: the dropped connection (it had delivered events, so it is
  // tried once more), then the attempt it refused, after which the consumer fails over.
  EXPECT_EQ(Kinds(run.error_kinds), "connection_failed=1 connection_lost=1 ");
  const auto got = testing::TableCids((dir.path() / "db.sqlite").string());
  EXPECT_EQ(got, want) << testing::DiffCids(want, got);
}

TEST(LiveTest, DisconnectsLoseNothingAndDuplicateNothing) {
  simnet::SimnetOptions so = Network(5000);
  so.jetstream.disconnect_after_frames = 700;
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  TempDir dir;
  LiveRun run = RunLive(dir.path(), Live(**net, JetstreamProtocol::kV2));
  EXPECT_EQ(run.job.stop_reason.code, "stream_idle") << run.job.stop_reason.sentence;
  EXPECT_GE(run.stats.connections, 7u);
  EXPECT_EQ(run.stats.last_seq, 5000u);
  EXPECT_GE((*net)->stats().jetstream_disconnects, 6u);
  const auto want = Truth(**net);
  const auto got = testing::TableCids((dir.path() / "db.sqlite").string());
  EXPECT_EQ(got, want) << testing::DiffCids(want, got);
  // Every cut is logged as a dropped connection, and nothing else.
  EXPECT_EQ(Kinds(run.error_kinds),
            "connection_lost=" + std::to_string((*net)->stats().jetstream_disconnects) + " ");
}

// A consumer whose buffer of received-but-unapplied messages fills drops the connection and opens
// a new one from the last seq it decoded once the buffer has drained: nothing lost or doubled.
TEST(LiveTest, AFullBufferDropsTheConnectionAndLosesNothing) {
  simnet::SimnetOptions so = Network(5000);
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  JetstreamOptions o = Live(**net, JetstreamProtocol::kV2);
  o.compress = false;
  o.max_message_bytes = 16 << 10;
  o.max_buffered_bytes = 32 << 10;  // a few dozen frames: the whole log arrives far faster
  TempDir dir;
  LiveRun run = RunLive(dir.path(), o);
  EXPECT_EQ(run.job.stop_reason.code, "stream_idle") << run.job.stop_reason.sentence;
  EXPECT_GE(run.stats.overflow_drops, 1u);
  EXPECT_EQ(run.stats.connections, run.stats.overflow_drops + 1);
  EXPECT_EQ(run.stats.last_seq, 5000u);
  const auto want = Truth(**net);
  const auto got = testing::TableCids((dir.path() / "db.sqlite").string());
  EXPECT_EQ(got, want) << testing::DiffCids(want, got);
  EXPECT_EQ(Kinds(run.error_kinds), "");
}

TEST(LiveTest, AResumedConsumerStartsAtItsSavedCursor) {
  simnet::SimnetOptions so = Network(3000);
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  TempDir dir;
  LiveRun first = RunLive(dir.path(), Live(**net, JetstreamProtocol::kV2));
  ASSERT_EQ(first.stats.last_seq, 3000u);
  const uint64_t frames = (*net)->stats().jetstream_frames;
  // A second run of the same job resumes at the saved seq: only the last event comes again.
  LiveRun second = RunLive(dir.path(), Live(**net, JetstreamProtocol::kV2));
  EXPECT_EQ(second.stats.messages, 1u);
  EXPECT_EQ((*net)->stats().jetstream_frames, frames + 1);
  EXPECT_EQ(second.stats.last_seq, 3000u);
}

// The Jetstream instance is replaced by one that numbers the same stream from 1 (FutureCursor):
// the saved seq is past its tip, so it answers from its live tip and what it published before
// that would be lost. The consumer notices the first event's seq is below its cursor, drops that
// connection and resumes by witnessed time: the table equals the whole stream's truth.
TEST(LiveTest, AHostThatNumbersItsEventsAnewIsResumedByWitnessedTime) {
  simnet::SimnetOptions so = Network(3000);
  so.did_web_share = 0;  // did:web DIDs name simnet's port: keep the two logs equal
  so.jetstream.seq_offset = 1'000'000;
  so.jetstream.events_per_second = 0.001;  // 2,000 at start, then (effectively) nothing
  so.jetstream.published_at_start = 2000;
  auto old_host = simnet::Simnet::Start(so);
  ASSERT_TRUE(old_host.ok()) << old_host.status().ToString();
  const uint16_t port = (*old_host)->port();
  TempDir dir;
  LiveRun first = RunLive(dir.path(), Live(**old_host, JetstreamProtocol::kV2));
  ASSERT_GE(first.stats.last_seq, 1'002'000u);  // (the slow rate may publish one more)
  (*old_host)->Stop();
  old_host->reset();

  // The new instance at the same address numbers from 1 and has published 2,500 events.
  so.port = port;
  so.jetstream.seq_offset = 0;
  so.jetstream.published_at_start = 2500;
  so.jetstream.events_per_second = 250;  // the other 500 over 2 s: the consumer joins before
  auto new_host = simnet::Simnet::Start(so);
  ASSERT_TRUE(new_host.ok()) << new_host.status().ToString();
  const auto want = Truth(**new_host);
  LiveRun second = RunLive(dir.path(), Live(**new_host, JetstreamProtocol::kV2));
  EXPECT_EQ(second.stats.future_cursors, 1u);
  EXPECT_EQ(second.stats.last_seq, 3000u);
  EXPECT_EQ(Kinds(second.error_kinds), "future_cursor=1 ");
  EXPECT_EQ(second.job.counters.extra["future_cursors"], 1u);
  const auto got = testing::TableCids((dir.path() / "db.sqlite").string());
  EXPECT_EQ(got, want) << testing::DiffCids(want, got);
}

// The stream's account deletions checked with the PDS (getRepoStatus). Simnet reports half of its
// deletions falsely (the PDS still says active): with the check the table equals the ground
// truth, which keeps those accounts' records; without it they are purged.
struct Checker {
  std::unique_ptr<net::HttpClient> http;
  std::unique_ptr<sources::DidResolver> resolver;
  std::unique_ptr<sources::PdsAccountStatus> lookup;
  std::unique_ptr<stages::AccountCheck> check;
  explicit Checker(const std::string& plc_url, int64_t timeout_ms = 5000) {
    net::HttpClientOptions ho;
    ho.allow_private_addresses = true;
    auto started = net::HttpClient::Start(ho);
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    if (!started.ok()) return;
    http = std::move(*started);
    sources::ResolverOptions ro;
    ro.plc_url = plc_url;
    ro.allow_loopback_endpoints = true;
    ro.timeout_ms = timeout_ms;
    resolver = std::make_unique<sources::DidResolver>(http.get(), nullptr, ro);
    lookup = std::make_unique<sources::PdsAccountStatus>(resolver.get(), http.get());
    check = std::make_unique<stages::AccountCheck>(lookup.get(),
                                                   stages::AccountCheckOptions{timeout_ms});
  }
};

simnet::SimnetOptions FalseDeletes(uint64_t events) {
  simnet::SimnetOptions so = Network(events);
  so.jetstream.account_share = 0.08;
  so.jetstream.false_delete_share = 0.5;
  return so;
}

uint64_t FalseDeletesIn(const simnet::JetstreamLog& log) {
  uint64_t n = 0;
  for (uint64_t seq = 1; seq <= log.size(); ++seq) n += log.event(seq).false_report ? 1 : 0;
  return n;
}

TEST(LiveTest, DeletedAccountsAreCheckedWithTheirPds) {
  auto net = simnet::Simnet::Start(FalseDeletes(6000));
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  const uint64_t false_deletes = FalseDeletesIn(*(*net)->jetstream());
  ASSERT_GE(false_deletes, 3u);
  const auto want = Truth(**net);
  {
    TempDir dir;
    Checker checker((*net)->plc_url());
    ASSERT_NE(checker.check, nullptr);
    LiveRun run = RunLive(dir.path(), Live(**net, JetstreamProtocol::kV2), {checker.check.get()});
    EXPECT_EQ(run.job.stop_reason.code, "stream_idle") << run.job.stop_reason.sentence;
    const auto got = testing::TableCids((dir.path() / "db.sqlite").string());
    EXPECT_EQ(got, want) << testing::DiffCids(want, got);
    const stages::AccountCheckStats s = checker.check->stats();
    EXPECT_EQ(s.refused, false_deletes);
    EXPECT_EQ(s.unconfirmed, 0u);
    EXPECT_GT(s.checks, s.refused);  // the genuine deletions were asked about too
    EXPECT_EQ(Kinds(run.error_kinds),
              "account_status_mismatch=" + std::to_string(false_deletes) + " ");
    EXPECT_EQ(run.job.counters.extra["account_purges_refused"], false_deletes);
    EXPECT_EQ(run.job.counters.extra["account_checks"], s.checks);
  }
  {
    // Without the check the false deletions purge records the network still has.
    TempDir dir;
    LiveRun run = RunLive(dir.path(), Live(**net, JetstreamProtocol::kV2));
    const auto got = testing::TableCids((dir.path() / "db.sqlite").string());
    EXPECT_LT(got.size(), want.size());
  }
}

TEST(LiveTest, DeletionsWhosePdsCannotBeAskedStillPurge) {
  auto net = simnet::Simnet::Start(Network(4000));
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  TempDir dir;
  // A PLC directory nobody listens at: no DID resolves.
  Checker checker("http://127.0.0.1:9", 300);
  ASSERT_NE(checker.check, nullptr);
  LiveRun run = RunLive(dir.path(), Live(**net, JetstreamProtocol::kV2), {checker.check.get()});
  const auto want = Truth(**net);
  const auto got = testing::TableCids((dir.path() / "db.sqlite").string());
  EXPECT_EQ(got, want) << testing::DiffCids(want, got);
  const stages::AccountCheckStats s = checker.check->stats();
  EXPECT_GT(s.checks, 0u);
  EXPECT_EQ(s.unconfirmed, s.checks);
  EXPECT_EQ(s.refused, 0u);
  EXPECT_EQ(run.job.counters.extra["account_purges_unconfirmed"], s.checks);
}

// v2 #sync: simnet's resynced repos each lost a record without a delete event; the consumer
// removes the repo's records at the #sync and the CreateResync rows that follow bring back the
// current ones, so the table equals the truth (which lacks the lost records). With a collection
// filter only that collection's rows are removed and replaced.
TEST(LiveTest, SyncReplacesTheReposRecords) {
  simnet::SimnetOptions so = Network(5000);
  so.jetstream.sync_share = 0.01;
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  const simnet::JetstreamLog& log = *(*net)->jetstream();
  uint64_t syncs = 0, resync_rows = 0;
  for (uint64_t seq = 1; seq <= log.size(); ++seq) {
    syncs += log.event(seq).kind == simnet::JetstreamKind::kSync ? 1 : 0;
    resync_rows += log.event(seq).kind == simnet::JetstreamKind::kCreateResync ? 1 : 0;
  }
  ASSERT_GE(syncs, 10u);
  ASSERT_GT(resync_rows, 0u);
  const auto want = Truth(**net);
  TempDir dir;
  LiveRun run = RunLive(dir.path(), Live(**net, JetstreamProtocol::kV2));
  EXPECT_EQ(run.job.stop_reason.code, "stream_idle") << run.job.stop_reason.sentence;
  EXPECT_EQ(Kinds(run.error_kinds), "");
  const auto got = testing::TableCids((dir.path() / "db.sqlite").string());
  EXPECT_EQ(got, want) << testing::DiffCids(want, got);
  EXPECT_EQ(run.job.counters.extra["resyncs"], syncs);
  // Each sync removed at least the record it lost.
  EXPECT_GE(run.job.counters.extra["resynced_records"], syncs);

  // One collection: the other's rows stay as they were when the filter came in (none here).
  TempDir filtered;
  JetstreamOptions o = Live(**net, JetstreamProtocol::kV2);
  o.collections = {"app.bsky.feed.post"};
  LiveRun posts = RunLive(filtered.path(), o);
  std::map<std::string, std::string> want_posts;
  for (const auto& [uri, cid] : want) {
    if (uri.find("/app.bsky.feed.post/") != std::string::npos) want_posts[uri] = cid;
  }
  const auto got_posts = testing::TableCids((filtered.path() / "db.sqlite").string());
  EXPECT_EQ(got_posts, want_posts) << testing::DiffCids(want_posts, got_posts);
  EXPECT_EQ(posts.job.counters.extra["resyncs"], syncs);
}

// A consumer whose saved position the host no longer keeps (simnet keeps the newest 1,000 of
// 3,000 events: the floor is seq 2,001). v2 refuses the seq (CursorTooOld) and the consumer
// resumes by time, clamped to the floor; v1 clamps the time cursor silently. Either way the first
// event is past the saved one: one gap is logged with its size. Resuming above the floor logs none.
class LiveGaps : public ::testing::TestWithParam<JetstreamProtocol> {};

TEST_P(LiveGaps, ResumingBelowTheHostsFloorLogsTheGapWithItsSize) {
  simnet::SimnetOptions so = Network(3000);
  so.jetstream.retention_events = 1000;
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  const simnet::JetstreamLog& log = *(*net)->jetstream();
  const bool v1 = GetParam() == JetstreamProtocol::kV1;
  {
    TempDir dir;
    LiveRun run =
        RunLive(dir.path(), Live(**net, GetParam()), {}, "500:" + std::to_string(log.TimeUs(500)));
    EXPECT_EQ(run.job.stop_reason.code, "stream_idle") << run.job.stop_reason.sentence;
    EXPECT_EQ(run.stats.last_seq, 3000u);
    EXPECT_EQ(Kinds(run.error_kinds), "stream_gap=1 ");
    EXPECT_EQ(run.stats.gaps, 1u);
    EXPECT_EQ(run.job.counters.extra["stream_gaps"], 1u);
    ASSERT_EQ(run.errors.size(), 1u);
    const double span_s = static_cast<double>(log.TimeUs(2001) - log.TimeUs(500)) / 1e6;
    char span[32];
    std::snprintf(span, sizeof span, "%.3f s", span_s);
    EXPECT_NE(run.errors[0].message.find(span), std::string::npos) << run.errors[0].message;
    if (v1) {
      EXPECT_EQ(run.errors[0].key, "time_us " + std::to_string(log.TimeUs(500)));
    } else {
      EXPECT_GE(run.stats.cursor_too_old, 1u);
      EXPECT_EQ(run.stats.gap_events, 1500u);  // seqs 501..2000
      EXPECT_EQ(run.job.counters.extra["stream_gap_events"], 1500u);
      EXPECT_EQ(run.errors[0].key, "seq 500");
      EXPECT_NE(run.errors[0].message.find("1500 event(s)"), std::string::npos)
          << run.errors[0].message;
    }
  }
  {
    TempDir dir;
    LiveRun run = RunLive(dir.path(), Live(**net, GetParam()), {},
                          "2500:" + std::to_string(log.TimeUs(2500)));
    EXPECT_EQ(run.stats.last_seq, 3000u);
    EXPECT_EQ(Kinds(run.error_kinds), "");
    EXPECT_EQ(run.stats.gaps, 0u);
  }
}

// A fresh consumer told to start at seq 1 ([live] start_seq) on a host whose floor is above it:
// v2 refuses the seq (CursorTooOld) and, with no archive to replay the gap from, the consumer
// starts at the oldest event the host keeps (it once asked for seq 1 again and again).
TEST_P(LiveGaps, AStartBelowTheFloorBeginsAtTheOldestEventKept) {
  simnet::SimnetOptions so = Network(3000);
  so.jetstream.retention_events = 1000;
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  TempDir dir;
  LiveRun run = RunLive(dir.path(), Live(**net, GetParam()));
  EXPECT_EQ(run.job.stop_reason.code, "stream_idle") << run.job.stop_reason.sentence;
  EXPECT_EQ(run.stats.last_seq, 3000u);
  EXPECT_GE(run.job.counters.events_read, 1000u);
  if (GetParam() == JetstreamProtocol::kV2) {
    EXPECT_GE(run.stats.cursor_too_old, 1u);
  }
}

INSTANTIATE_TEST_SUITE_P(Protocols, LiveGaps,
                         ::testing::Values(JetstreamProtocol::kV2, JetstreamProtocol::kV1),
                         [](const auto& info) {
                           return std::string(info.param == JetstreamProtocol::kV1 ? "v1" : "v2");
                         });

// `atfill run` with [crawl] source = "auto" whose start is below the host's floor (simnet keeps
// the newest 1,000 of 6,000 events) and whose host serves an archive sealed through seq 5,500: the
// gap (seqs 1..5,500) becomes a replay job from the host's own archive, run beside the live
// consumer, which resumes reading at once after seq 5,500 and holds what it reads until the gap
// is replayed. The table ends equal to the whole log applied: no hole between the replay and the
// stream, and nothing the replay wrote late undoes what the stream said later.
TEST(LiveTest, AGapBelowTheFloorIsReplayedFromTheArchiveBesideTheStream) {
  TempDir dir;
  simnet::SimnetOptions so = Network(6000);
  so.jetstream.retention_events = 1000;
  // Deletes and account events on both sides of the tip: the stream's events after it wait in
  // state until the gap is replayed, so nothing the replay writes late undoes them.
  so.jetstream.account_share = 0.05;
  so.archive.dir = (dir.path() / "archive").string();
  so.archive.from_jetstream = true;
  so.archive.jetstream_through_seq = 5500;
  so.archive.rows_per_block = 128;
  so.archive.segment_bytes = 64 << 10;
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  const auto want = Truth(**net);
  ASSERT_GT(want.size(), 1000u);
  const std::string config =
      RunConfig(dir.path(), **net,
                "[resolver]\nplc = \"" + (*net)->plc_url() +
                    "\"\n[crawl]\nsource = \"auto\"\n"
                    "[engine]\nbatch_ms = 50\nbatch_records = 500\n"
                    "[archive]\nbatch_records = 500\nbatch_ms = 50\n[progress]\ninterval_s = 60\n",
                "batch_records = 500\nbatch_ms = 50\n");
  auto run = testing::RunProcess({ATFILL_BINARY, "run", config}, dir.path());
  ASSERT_EQ(run.exit_code, 4) << run.err;  // paused: the stream went quiet
  const auto errors =
      testing::RunProcess({ATFILL_BINARY, "job", config, "1", "--errors"}, dir.path());
  EXPECT_EQ(errors.out.find("gap_replay_failed"), std::string::npos) << errors.out;
  EXPECT_NE(run.err.find("the stream's gap after seq 0 is replayed by job 2"), std::string::npos)
      << run.err;
  EXPECT_NE(run.err.find("(through seq 5500)"), std::string::npos) << run.err;
  const auto got = testing::TableCids((dir.path() / "db.sqlite").string());
  EXPECT_EQ(got, want) << testing::DiffCids(want, got);
  EXPECT_GT((*net)->archive_stats().requests, 0u);
  // The gap job completed; the live job's gap entry names it.
  auto jobs = testing::RunProcess({ATFILL_BINARY, "jobs", config}, dir.path());
  ASSERT_EQ(jobs.exit_code, 0) << jobs.err;
  EXPECT_NE(jobs.out.find("completed"), std::string::npos) << jobs.out;
  auto live = testing::RunProcess({ATFILL_BINARY, "job", config, "1", "--errors"}, dir.path());
  EXPECT_NE(live.out.find("replay job 2 replays seqs 1..5500"), std::string::npos) << live.out;
  // The stream's events after the tip were held, then all applied.
  auto counter = [&live](const std::string& name) -> uint64_t {
    const size_t at = live.out.find("  " + name + " ");
    return at == std::string::npos
               ? 0
               : std::strtoull(live.out.c_str() + at + name.size() + 3, nullptr, 10);
  };
  EXPECT_GT(counter("live_held"), 400u) << live.out;
  EXPECT_EQ(counter("live_released"), counter("live_held")) << live.out;
}

// `atfill archive write --live`: the stream of simnet's Jetstream (published over ~2 s) written as
// an archive under the host's own seqs, killed with SIGKILL once a segment is sealed and run again
// (it continues after the newest sealed seq; the killed run's open segment is written again). The
// archive holds every event once, and a replay of it equals the whole log applied.
TEST(LiveTest, AnArchiveWrittenFromTheStreamHoldsEveryEventOnceAndReplaysToTheLog) {
  simnet::SimnetOptions so = Network(3000);
  so.jetstream.published_at_start = 500;
  so.jetstream.events_per_second = 1500;
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  const auto want = Truth(**net);
  TempDir dir;
  const std::string config =
      RunConfig(dir.path(), **net,
                "[crawl]\nsource = \"replay\"\n"
                "collections = [\"app.bsky.feed.post\", \"app.bsky.feed.like\"]\n"
                "[archive]\ndir = \"archive\"\nreplay_marker_tail_hours = 0\n",
                "", 1000);
  const std::vector<std::string> write = {ATFILL_BINARY,
                                          "archive",
                                          "write",
                                          config,
                                          (dir.path() / "archive").string(),
                                          "--live",
                                          "--segment-kb",
                                          "16",
                                          "--rows-per-block",
                                          "64"};
  {
    testing::Child child(write, dir.path());
    bool sealed = false;
    testing::WaitUntil(
        [&] {
          std::error_code ec;
          sealed = std::filesystem::exists(dir.path() / "archive" / "seg_0000000001.jss", ec);
          return sealed || !child.Running();
        },
        std::chrono::seconds(5));
    ASSERT_TRUE(sealed) << "no segment was sealed";
    ASSERT_TRUE(child.Kill(SIGKILL)) << "the writer finished before it could be killed";
    EXPECT_EQ(child.Wait().signal, SIGKILL);
  }
  auto again = testing::RunProcess(write, dir.path());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("after seq "), std::string::npos) << again.err;
  // Every seq of the log once, in order.
  std::vector<uint64_t> seqs;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path() / "archive")) {
    if (entry.path().extension() != ".jss") continue;
    auto reader = jss::SegmentReader::Open(entry.path().string());
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    for (size_t b = 0; b < reader->footer().blocks.size(); ++b) {
      auto block = reader->ReadBlock(b);
      ASSERT_TRUE(block.ok()) << block.status().ToString();
      for (size_t i = 0; i < block->size(); ++i) seqs.push_back(block->row(i).seq);
    }
  }
  std::sort(seqs.begin(), seqs.end());
  ASSERT_EQ(seqs.size(), 3000u);
  EXPECT_EQ(seqs.front(), 1u);
  EXPECT_EQ(seqs.back(), 3000u);
  EXPECT_EQ(std::adjacent_find(seqs.begin(), seqs.end()), seqs.end());
  // The archive replayed equals the log applied.
  auto replay = testing::RunProcess({ATFILL_BINARY, "backfill", config}, dir.path());
  ASSERT_EQ(replay.exit_code, 0) << replay.err;
  const auto got = testing::TableCids((dir.path() / "db.sqlite").string());
  EXPECT_EQ(got, want) << testing::DiffCids(want, got);
}

// `atfill archive write --live` on an archive whose newest seq (500) the host no longer keeps (it
// keeps the newest 1,000 of 3,000): the host refuses the seq, the writer goes on from the oldest
// event kept and says how much the stream skipped; nothing is written twice.
TEST(LiveTest, AnArchiveBehindTheHostsFloorContinuesFromItAndNamesTheGap) {
  simnet::SimnetOptions so = Network(3000);
  so.jetstream.retention_events = 1000;
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  TempDir dir;
  const std::filesystem::path archive = dir.path() / "archive";
  {
    auto writer = sources::ArchiveWriter::Open(archive.string());
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    for (uint64_t seq = 1; seq <= 500; ++seq) {
      auto text = (*net)->jetstream()->FrameV2(seq);
      ASSERT_TRUE(text.ok());
      sources::JetstreamFrame frame;
      std::string kind;
      ASSERT_TRUE(sources::DecodeJetstreamV2(*text, &frame, &kind).ok());
      ASSERT_TRUE((*writer)->Append(frame.payload, frame.time_us, frame.seq).ok());
    }
    ASSERT_TRUE((*writer)->Finish().ok());
  }
  const std::string config = RunConfig(dir.path(), **net, "", "", 1000);
  auto r = testing::RunProcess(
      {ATFILL_BINARY, "archive", "write", config, archive.string(), "--live"}, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("after seq 500"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gap: the host no longer keeps seqs 501..2000"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("wrote 1000 rows (seq 2001..3000)"), std::string::npos) << r.err;
}

// `atfill run` as a user runs it, killed with SIGKILL three times mid-stream, then run until the
// stream goes quiet: the table equals the ground truth, false deletions included.
TEST(LiveTest, SigkilledMidStreamThenResumedEqualsTheGroundTruth) {
  // With false deletions, which `atfill run` checks with the PDS (it must, to match the truth).
  simnet::SimnetOptions so = FalseDeletes(20000);
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  const auto want = Truth(**net);
  TempDir dir;
  const std::string config = RunConfig(dir.path(), **net,
                                       "[resolver]\nplc = \"" + (*net)->plc_url() +
                                           "\"\n[engine]\nbatch_ms = 50\nbatch_records = 500\n"
                                           "[progress]\ninterval_s = 60\n",
                                       "batch_records = 500\nbatch_ms = 50\n");
  const std::string db = (dir.path() / "db.sqlite").string();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("ATFILL_TEST_SEED=" + std::to_string(seed));
  ASSERT_NO_FATAL_FAILURE(testing::KillThenRunUntilIdle({ATFILL_BINARY, "run", config}, dir.path(),
                                                        db, seed, 3, want.size() / 10,
                                                        want.size() * 8 / 10));
  const auto got = testing::TableCids(db);
  EXPECT_EQ(got, want) << testing::DiffCids(want, got);
  auto status = testing::RunProcess({ATFILL_BINARY, "status", config}, dir.path());
  ASSERT_EQ(status.exit_code, 0) << status.err;
  EXPECT_NE(status.out.find("seq 20000"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("gaps        0 seen"), std::string::npos) << status.out;
  // Every false deletion was kept (counted once, though a killed run may have asked twice).
  const uint64_t false_deletes = FalseDeletesIn(*(*net)->jetstream());
  EXPECT_NE(status.out.find(std::to_string(false_deletes) + " not purged"), std::string::npos)
      << status.out;
}

// `atfill run --backfill`: the crawl of [crawl]'s targets runs beside the live consumer, which
// holds the live events of every repo the crawl has queued until the crawl has written it, then
// applies them. The table ends as the crawled repos with the whole live log applied on top.
TEST(LiveTest, ABackfillBesideTheStreamHoldsEachReposEventsUntilItIsWritten) {
  simnet::SimnetOptions so = CrawledNetwork(4000);
  so.latency_ms = 40;  // a slow crawl: repos wait in its queue while their events stream by
  so.jetstream.events_per_second = 2000;
  so.jetstream.account_share = 0;  // purges would take crawled records with them
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  auto crawled = (*net)->Truth();
  ASSERT_TRUE(crawled.ok());
  std::map<std::string, std::string> want = Truth(**net);
  const size_t live_rows = want.size();
  for (const auto& r : crawled->records) {
    ASSERT_EQ(want.count(r.uri), 0u) << "simnet's live records and repos overlap: " << r.uri;
    want[r.uri] = r.cid;
  }
  ASSERT_GT(crawled->records.size(), 100u);
  ASSERT_GT(live_rows, 100u);
  TempDir dir;
  const std::string config = (dir.path() / "atfill.toml").string();
  testing::WriteFile(
      config,
      "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"db.sqlite\"\n"
      "[engine]\nbatch_ms = 50\nbatch_records = 500\n[progress]\ninterval_s = 60\n"
      "[crawl]\nrelay = \"" +
          (*net)->relay_url() +
          "\"\ncollections = [\"app.bsky.feed.post\", \"app.bsky.feed.like\"]\n"
          "mode = \"getRepo\"\nmax_active_units = 4\nallow_loopback_endpoints = true\n"
          "batch_records = 500\nbatch_ms = 50\n"
          "[net]\nper_host = 1\n[resolver]\nplc = \"" +
          (*net)->plc_url() + "\"\n[live]\nhosts = [\"" + (*net)->jetstream_url() +
          "\"]\nallow_private_endpoints = true\nidle_exit_ms = 1500\nstart_seq = 1\n"
          "batch_records = 500\nbatch_ms = 50\n");
  auto run = testing::RunProcess({ATFILL_BINARY, "run", config, "--backfill"}, dir.path());
  ASSERT_EQ(run.exit_code, 4) << run.err;  // the live consumer pauses when the stream is quiet
  EXPECT_NE(run.err.find("runs beside the live consumer"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("job 1 completed"), std::string::npos) << run.err;
  const auto got = testing::TableCids((dir.path() / "db.sqlite").string());
  EXPECT_EQ(got, want) << testing::DiffCids(want, got);

  auto status = testing::RunProcess({ATFILL_BINARY, "status", config}, dir.path());
  ASSERT_EQ(status.exit_code, 0) << status.err;
  uint64_t held = 0, applied = 0, dropped = 0;
  const size_t at = status.out.find("  held ");
  ASSERT_NE(at, std::string::npos) << status.out;
  std::string line = status.out.substr(at, status.out.find('\n', at) - at);
  std::erase(line, ',');  // "1,357" (and the sentence's commas)
  ASSERT_EQ(std::sscanf(line.c_str(),
                        "  held %" SCNu64 " events of repos being backfilled held %" SCNu64
                        " applied after the repo's checkpoint %" SCNu64,
                        &held, &applied, &dropped),
            3)
      << status.out;
  EXPECT_GT(held, 100u) << status.out;  // most repos waited in the crawl's queue
  EXPECT_EQ(applied + dropped, held) << status.out;
  EXPECT_EQ(dropped, 0u) << status.out;  // simnet's repos predate its live log
  // Nothing is left held.
  auto kv = state::OpenRocksDb({.path = (dir.path() / "state").string()});
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  state::LiveHolds holds(**kv);
  size_t left = 0;
  ASSERT_TRUE(holds.ScanHeldRepos([&](std::string_view) { return ++left, true; }).ok());
  EXPECT_EQ(left, 0u);
}

// The operator's endpoints are reached wherever they point: `atfill run` with a Jetstream, relay
// and PLC on loopback and no allow_* key follows the stream to the ground truth. With the same
// config, a PDS that a DID document places on loopback is still refused (bad_endpoint).
TEST(LiveTest, ConfiguredEndpointsOnLoopbackAreReachedAndDidDocumentEndpointsAreChecked) {
  simnet::SimnetOptions so = Network(1500);
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  TempDir dir;
  const std::string config = (dir.path() / "atfill.toml").string();
  testing::WriteFile(config,
                     "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"db.sqlite\"\n"
                     "[crawl]\nrelay = \"" +
                         (*net)->relay_url() +
                         "\"\ncollections = [\"app.bsky.feed.post\"]\n"
                         "unit_attempts = 1\n[resolver]\nplc = \"" +
                         (*net)->plc_url() + "\"\n[live]\nhosts = [\"" + (*net)->jetstream_url() +
                         "\"]\nidle_exit_ms = 1500\nstart_seq = 1\n");
  auto run = testing::RunProcess({ATFILL_BINARY, "run", config}, dir.path());
  ASSERT_EQ(run.exit_code, 4) << run.err;  // paused: stream_idle
  EXPECT_EQ(run.err.find("0 connection(s)"), std::string::npos) << run.err;
  const auto want = Truth(**net);
  const auto got = testing::TableCids((dir.path() / "db.sqlite").string());
  ASSERT_GT(want.size(), 100u);
  EXPECT_EQ(got, want) << testing::DiffCids(want, got);

  auto truth = (*net)->Truth();
  ASSERT_TRUE(truth.ok());
  std::string did;
  for (const auto& a : truth->accounts) {
    if (a.records > 0 && !a.bad_endpoint && !a.bad_signature &&
        a.status == simnet::AccountStatus::kActive && a.did.starts_with("did:plc:")) {
      did = a.did;
      break;
    }
  }
  ASSERT_FALSE(did.empty());
  auto backfill =
      testing::RunProcess({ATFILL_BINARY, "backfill", config, "--did", did}, dir.path());
  EXPECT_EQ(backfill.exit_code, 1) << backfill.err;  // completed, with the refused unit's error
  auto kv = state::OpenRocksDb({.path = (dir.path() / "state").string()});
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  state::ErrorLog errors(**kv);
  auto kinds = errors.CountsByKind(2);  // job 1 is the live job, 2 the backfill
  ASSERT_TRUE(kinds.ok()) << kinds.status().ToString();
  EXPECT_GE((*kinds)["bad_endpoint"], 1u) << Kinds(*kinds) << backfill.err;
  auto entries = errors.List(2, 0, 100);
  ASSERT_TRUE(entries.ok());
  bool named = false;
  for (const auto& e : *entries) {
    named = named || (e.kind == "bad_endpoint" && e.message.find("loopback") != std::string::npos);
  }
  EXPECT_TRUE(named) << Kinds(*kinds);
}

// A Jetstream host that cannot be reached is an error with its reason, in the job's error log
// and in `atfill status` (last error, attempts), never silence.
TEST(LiveTest, AConnectionThatFailsOrIsRefusedIsLoggedWithItsReason) {
  testing::RefusingPort closed;
  testing::HttpTestServer unavailable([](const testing::TestRequest&) {
    return testing::XrpcErrorResponse(503, "Unavailable", "the stream is restarting");
  });
  struct Case {
    std::string host;
    const char* kind;
    const char* reason;
  };
  const Case cases[] = {
      {"ws://127.0.0.1:" + std::to_string(closed.port()), "connection_failed", "refused"},
      {"ws://127.0.0.1:" + std::to_string(unavailable.port()), "connection_refused",
       "HTTP 503 Unavailable: the stream is restarting"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.host);
    TempDir dir;
    const std::string config = (dir.path() / "atfill.toml").string();
    testing::WriteFile(config,
                       "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"db.sqlite\"\n"
                       "[live]\nhosts = [\"" +
                           c.host +
                           "\"]\nidle_exit_ms = 1500\nreconnect_base_ms = 20\n"
                           "reconnect_max_ms = 100\n[engine]\nbatch_ms = 50\n");
    auto run = testing::RunProcess({ATFILL_BINARY, "run", config}, dir.path());
    ASSERT_EQ(run.exit_code, 4) << run.err;
    EXPECT_NE(run.err.find("last connection error: " + std::string(c.kind)), std::string::npos)
        << run.err;
    {
      auto kv = state::OpenRocksDb({.path = (dir.path() / "state").string()});
      ASSERT_TRUE(kv.ok()) << kv.status().ToString();
      state::ErrorLog errors(**kv);
      auto entries = errors.List(1, 0, 100);
      ASSERT_TRUE(entries.ok()) << entries.status().ToString();
      const state::ErrorEntry* found = nullptr;
      for (const auto& e : *entries) {
        if (e.kind == c.kind) found = &e;
      }
      ASSERT_NE(found, nullptr) << run.err;
      EXPECT_EQ(found->key, c.host);
      EXPECT_NE(found->message.find(c.reason), std::string::npos) << found->message;
      EXPECT_GE(found->attempts, 2u);  // retried, and each attempt counted
    }
    auto status = testing::RunProcess({ATFILL_BINARY, "status", config}, dir.path());
    ASSERT_EQ(status.exit_code, 0) << status.err;
    EXPECT_NE(status.out.find("  last error  "), std::string::npos) << status.out;
    EXPECT_NE(status.out.find(c.kind), std::string::npos) << status.out;
    EXPECT_NE(status.out.find(c.reason), std::string::npos) << status.out;
    EXPECT_EQ(status.out.find("  connection  0 "), std::string::npos) << status.out;
    auto job = testing::RunProcess({ATFILL_BINARY, "job", config, "1", "--errors"}, dir.path());
    EXPECT_NE(job.out.find(c.kind), std::string::npos) << job.out;
  }
}

// --- Collections changed while `atfill run` follows the stream ---

constexpr const char* kPostNsid = "app.bsky.feed.post";
constexpr const char* kLikeNsid = "app.bsky.feed.like";

std::map<std::string, std::string> OfCollection(const std::map<std::string, std::string>& rows,
                                                const std::string& collection) {
  std::map<std::string, std::string> out;
  for (const auto& [uri, cid] : rows) {
    if (uri.find("/" + collection + "/") != std::string::npos) out.emplace(uri, cid);
  }
  return out;
}

// Applies the log's events of `collection` with seqs [from, to] onto `rows`.
void ApplyLog(const simnet::JetstreamLog& log, const std::string& collection, uint64_t from,
              uint64_t to, std::map<std::string, std::string>* rows) {
  for (uint64_t seq = from; seq <= std::min(to, log.size()); ++seq) {
    if (!log.IsCommit(seq) || log.Collection(seq) != collection) continue;
    if (log.event(seq).kind == simnet::JetstreamKind::kDelete) {
      rows->erase(log.Uri(seq));
    } else {
      auto cid = log.RecordCid(seq);
      ASSERT_TRUE(cid.ok()) << cid.status().ToString();
      (*rows)[log.Uri(seq)] = cid->ToString();
    }
  }
}

// The seq from which the stream's filter first held `collection` (SIZE_MAX: never), and the
// first from which it no longer did after that.
std::pair<uint64_t, uint64_t> FilterSpan(const simnet::Simnet& net, const std::string& collection) {
  uint64_t from = UINT64_MAX, until = UINT64_MAX;
  for (const auto& f : net.jetstream_filter_starts()) {
    const bool has = f.collections.empty() || std::find(f.collections.begin(), f.collections.end(),
                                                        collection) != f.collections.end();
    if (has && from == UINT64_MAX) from = f.from_seq;
    if (!has && from != UINT64_MAX && until == UINT64_MAX) until = f.from_seq;
  }
  return {from, until};
}

struct CollectionsCase {
  bool api;  // POST /admin/collections; else the config edited and SIGHUP
  JetstreamProtocol protocol;
  const char* name;
};

class LiveCollections : public ::testing::TestWithParam<CollectionsCase> {};

// A collection added mid-stream is backfilled from the repos and followed from the moment the
// filter took it, the old one keeps every event (no gap), and a removed one stops gaining rows.
TEST_P(LiveCollections, AnAddedCollectionIsBackfilledAndFollowedAndARemovedOneStops) {
  const CollectionsCase& c = GetParam();
  simnet::SimnetOptions so = CrawledNetwork(16000);
  so.collections = {kPostNsid, kLikeNsid};
  so.jetstream.events_per_second = 1500;
  so.jetstream.account_share = 0;  // purges would take backfilled records with them
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  TempDir dir;
  const std::string protocol(sources::JetstreamProtocolName(c.protocol));
  const auto write_config = [&](const std::string& collections) {
    return RunConfig(dir.path(), **net,
                     "[engine]\nbatch_ms = 50\nbatch_records = 500\n[progress]\ninterval_s = 60\n"
                     "[crawl]\nrelay = \"" +
                         (*net)->relay_url() +
                         "\"\ncollections = [\"app.bsky.feed.post\"]\nmode = \"getRepo\"\n"
                         "allow_loopback_endpoints = true\nbatch_records = 500\nbatch_ms = 50\n"
                         "[resolver]\nplc = \"" +
                         (*net)->plc_url() + "\"\n" +
                         (c.api ? "[admin]\nport = 0\ntoken = \"t0ken\"\n" : ""),
                     "collections = [" + collections + "]\nprotocol = \"" + protocol +
                         "\"\nbatch_records = 500\nbatch_ms = 50\n",
                     2500);
  };
  const std::string config = write_config("\"app.bsky.feed.post\"");
  testing::Child child({ATFILL_BINARY, "run", config}, dir.path());
  const std::string db = (dir.path() / "db.sqlite").string();
  const auto err = [&] {
    std::ifstream in(child.err_path());
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  int port = 0;
  if (c.api) {
    ASSERT_TRUE(testing::WaitUntil(
        [&] {
          const std::string e = err();
          const auto at = e.find("dashboard on http://127.0.0.1:");
          if (at != std::string::npos) port = std::atoi(e.c_str() + at + 30);
          return port != 0 || !child.Running();
        },
        std::chrono::seconds(30)));
    ASSERT_NE(port, 0) << err();
  }
  const auto post = [&](const std::string& body) {
    httplib::Client client("127.0.0.1", port);
    client.set_bearer_token_auth("t0ken");
    client.set_read_timeout(30, 0);
    auto r = client.Post("/admin/collections", body, "application/json");
    EXPECT_TRUE(r) << "POST /admin/collections failed";
    return r ? std::make_pair(r->status, r->body) : std::make_pair(0, std::string());
  };
  // While the run starts the database may not exist yet: no rows.
  const auto rows_of = [&](const std::string& collection) -> size_t {
    auto rows = sinks::ReadAllRecords(db);
    if (!rows.ok()) return 0;
    return static_cast<size_t>(std::count_if(
        rows->begin(), rows->end(), [&](const auto& r) { return r.collection == collection; }));
  };
  // Gates: the stream's posts are landing before the change; likes land after it.
  ASSERT_TRUE(testing::WaitUntil([&] { return rows_of(kPostNsid) >= 200 || !child.Running(); },
                                 std::chrono::seconds(60)))
      << err();
  ASSERT_TRUE(child.Running()) << err();
  EXPECT_EQ(rows_of(kLikeNsid), 0u);
  if (c.api) {
    auto [status, body] = post(R"({"add": ["app.bsky.feed.like"]})");
    ASSERT_EQ(status, 200) << body;
    EXPECT_NE(body.find(R"("collections":["app.bsky.feed.like","app.bsky.feed.post"])"),
              std::string::npos)
        << body;
    EXPECT_NE(body.find(R"("added":["app.bsky.feed.like"])"), std::string::npos) << body;
    EXPECT_EQ(body.find(R"("backfill_job":null)"), std::string::npos) << body;
    // A change that would leave no collection is refused and changes nothing.
    auto [refused, why] = post(R"({"remove": ["app.bsky.feed.like", "app.bsky.feed.post"]})");
    EXPECT_EQ(refused, 400) << why;
  } else {
    write_config("\"app.bsky.feed.post\", \"app.bsky.feed.like\"");
    ASSERT_TRUE(child.Kill(SIGHUP));
  }
  // The likes' backfill lands (simnet's repos hold some) and the stream's likes follow.
  const size_t repo_likes = [&] {
    auto truth = (*net)->Truth();
    EXPECT_TRUE(truth.ok());
    size_t n = 0;
    for (const auto& r : truth->records) n += r.uri.find(kLikeNsid) != std::string::npos;
    return n;
  }();
  ASSERT_GT(repo_likes, 20u);
  ASSERT_TRUE(
      testing::WaitUntil([&] { return rows_of(kLikeNsid) >= repo_likes + 100 || !child.Running(); },
                         std::chrono::seconds(90)))
      << err();
  ASSERT_TRUE(child.Running()) << "the stream ended before the change could be checked\n" << err();
  // Now the posts are removed: they stop gaining rows (over the API, their rows are purged too).
  if (c.api) {
    const size_t posts_before = rows_of(kPostNsid);
    auto [status, body] = post(R"({"remove": ["app.bsky.feed.post"], "purge": true})");
    ASSERT_EQ(status, 200) << body;
    EXPECT_NE(body.find(R"("collections":["app.bsky.feed.like"])"), std::string::npos) << body;
    const std::string purged = R"("purged":{"app.bsky.feed.post":)";
    const auto at = body.find(purged);
    ASSERT_NE(at, std::string::npos) << body;
    EXPECT_GE(std::strtoull(body.c_str() + at + purged.size(), nullptr, 10), posts_before) << body;
    EXPECT_EQ(rows_of(kPostNsid), 0u);
  } else {
    write_config("\"app.bsky.feed.like\"");
    ASSERT_TRUE(child.Kill(SIGHUP));
  }
  // The removal took effect on the stream, then the events received before it landed.
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return FilterSpan(**net, kPostNsid).second != UINT64_MAX || !child.Running(); },
      std::chrono::seconds(30)));
  const size_t likes_then = rows_of(kLikeNsid);
  ASSERT_TRUE(
      testing::WaitUntil([&] { return rows_of(kLikeNsid) >= likes_then + 100 || !child.Running(); },
                         std::chrono::seconds(60)))
      << err();
  const auto posts_then = OfCollection(testing::TableCids(db), kPostNsid);

  if (c.api) {
    // The stream ends (idle); the server keeps serving until SIGTERM.
    ASSERT_TRUE(testing::WaitUntil(
        [&] {
          const std::string e = err();
          return e.find("stream_idle") != std::string::npos || !child.Running();
        },
        std::chrono::seconds(120)));
    child.Kill(SIGTERM);
  }
  auto done = child.Wait(std::chrono::seconds(120));
  EXPECT_EQ(done.exit_code, c.api ? 0 : 4) << err();
  const std::string log = err();
  EXPECT_NE(log.find("live collections changed"), std::string::npos) << log;
  EXPECT_NE(log.find("completed"), std::string::npos) << "the likes' backfill: " << log;

  const simnet::JetstreamLog& stream = *(*net)->jetstream();
  const auto got = testing::TableCids(db);
  // Likes: the repos' (the backfill), then every event from where the filter took them.
  const auto [like_from, like_until] = FilterSpan(**net, kLikeNsid);
  ASSERT_NE(like_from, UINT64_MAX);
  EXPECT_EQ(like_until, UINT64_MAX);
  std::map<std::string, std::string> likes;
  {
    auto truth = (*net)->Truth();
    ASSERT_TRUE(truth.ok());
    for (const auto& r : truth->records) {
      if (r.uri.find("/" + std::string(kLikeNsid) + "/") != std::string::npos) likes[r.uri] = r.cid;
    }
  }
  ApplyLog(stream, kLikeNsid, like_from, UINT64_MAX, &likes);
  EXPECT_TRUE(OfCollection(got, kLikeNsid) == likes)
      << testing::DiffCids(likes, OfCollection(got, kLikeNsid));
  // Posts: every event before the removal (no gap), and none gained since it was checked.
  const auto [post_from, post_until] = FilterSpan(**net, kPostNsid);
  EXPECT_EQ(post_from, 1u);
  ASSERT_NE(post_until, UINT64_MAX);
  const auto posts = OfCollection(got, kPostNsid);
  EXPECT_TRUE(posts == posts_then) << testing::DiffCids(posts_then, posts);
  if (c.api) {
    EXPECT_TRUE(posts.empty()) << "purged, and nothing landed after the purge";
    return;
  }
  // What landed is the stream's posts through one seq, with no hole before it. The events read
  // before the change still apply; those the server sent between the change and the seq at which
  // it applied the new filter (post_until) are dropped by the consumer's own filter, so that seq
  // may come before post_until: which one depends on when the change met the reader.
  std::map<std::string, std::string> want_posts;
  uint64_t through = 0;
  while (want_posts != posts && through < stream.size()) {
    ++through;
    ApplyLog(stream, kPostNsid, through, through, &want_posts);
  }
  EXPECT_TRUE(posts == want_posts) << testing::DiffCids(want_posts, posts);
  EXPECT_LT(through, stream.size()) << "the posts kept landing to the end of the stream";
}

INSTANTIATE_TEST_SUITE_P(Ways, LiveCollections,
                         ::testing::Values(CollectionsCase{true, JetstreamProtocol::kV2, "api_v2"},
                                           CollectionsCase{false, JetstreamProtocol::kV2,
                                                           "sighup_v2"},
                                           CollectionsCase{true, JetstreamProtocol::kV1, "api_v1"}),
                         [](const auto& info) { return std::string(info.param.name); });

// HappyView's way, over the admin API: a record lexicon posted while the live consumer runs makes
// its collection indexed: backfilled from the repos and followed on the stream, every record of it
// validated from then on (a post longer than the posted lexicon allows is logged and not
// written); the catalog is kept in state across a restart; DELETE stops it.
TEST(LiveLexicons, ALexiconPostedMidStreamIsBackfilledFollowedAndItsRecordsValidated) {
  simnet::SimnetOptions so = CrawledNetwork(16000);
  so.collections = {kPostNsid, kLikeNsid};
  so.jetstream.events_per_second = 1500;
  so.jetstream.account_share = 0;
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  TempDir dir;
  const std::string config = RunConfig(
      dir.path(), **net,
      "[engine]\nbatch_ms = 50\nbatch_records = 500\n[progress]\ninterval_s = 60\n"
      "[crawl]\nrelay = \"" +
          (*net)->relay_url() +
          "\"\ncollections = [\"app.bsky.feed.like\"]\nmode = \"getRepo\"\n"
          "allow_loopback_endpoints = true\nbatch_records = 500\nbatch_ms = 50\n"
          "[resolver]\nplc = \"" +
          (*net)->plc_url() + "\"\n[admin]\nport = 0\ntoken = \"t0ken\"\n",
      "collections = [\"app.bsky.feed.like\"]\nbatch_records = 500\nbatch_ms = 50\n", 2500);
  const std::string db = (dir.path() / "db.sqlite").string();
  auto start = [&](std::unique_ptr<testing::Child>* child, int* port) {
    *child = std::make_unique<testing::Child>(
        std::vector<std::string>{ATFILL_BINARY, "run", config}, dir.path());
    *port = 0;
    testing::WaitUntil(
        [&] {
          std::ifstream in((*child)->err_path());
          const std::string e((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
          const auto at = e.find("dashboard on http://127.0.0.1:");
          if (at != std::string::npos) *port = std::atoi(e.c_str() + at + 30);
          return *port != 0 || !(*child)->Running();
        },
        std::chrono::seconds(30));
  };
  std::unique_ptr<testing::Child> child;
  int port = 0;
  start(&child, &port);
  ASSERT_NE(port, 0);
  const auto err = [&] {
    std::ifstream in(child->err_path());
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  const auto client = [&] {
    httplib::Client c("127.0.0.1", port);
    c.set_bearer_token_auth("t0ken");
    c.set_read_timeout(30, 0);
    return c;
  };
  // Posts of every length (simnet's are 1-30 words); this lexicon lets through 60 graphemes.
  const std::string lexicon = R"({"lexicon":1,"id":"app.bsky.feed.post","defs":{"main":{
      "type":"record","key":"tid","record":{"type":"object","required":["text","createdAt"],
      "properties":{"text":{"type":"string","maxGraphemes":60},
      "createdAt":{"type":"string","format":"datetime"},
      "langs":{"type":"array","items":{"type":"string","format":"language"}}}}}}})";
  const auto posts = [&] {
    std::vector<std::string> texts;
    auto rows = sinks::ReadAllRecords(db);
    if (!rows.ok()) return texts;
    for (const auto& r : *rows) {
      if (r.collection != kPostNsid) continue;
      simdjson::dom::parser parser;
      std::string_view text;
      if (parser.parse(r.record)["text"].get_string().get(text) == simdjson::SUCCESS) {
        texts.emplace_back(text);
      } else {
        texts.emplace_back("(no text)");
      }
    }
    return texts;
  };
  const auto rows_of = [&](const std::string& collection) -> size_t {
    auto rows = sinks::ReadAllRecords(db);
    if (!rows.ok()) return 0;
    return static_cast<size_t>(std::count_if(
        rows->begin(), rows->end(), [&](const auto& r) { return r.collection == collection; }));
  };
  // Gate: the likes land before the lexicon is posted; no post does.
  ASSERT_TRUE(testing::WaitUntil([&] { return rows_of(kLikeNsid) >= 200 || !child->Running(); },
                                 std::chrono::seconds(60)))
      << err();
  ASSERT_TRUE(child->Running()) << err();
  EXPECT_EQ(rows_of(kPostNsid), 0u);

  auto bad = client().Post("/admin/lexicons", R"({"lexicon":1,"id":"x"})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  EXPECT_THAT(bad->body, ::testing::HasSubstr("not a valid lexicon: id 'x' is not an NSID"));
  auto added = client().Post("/admin/lexicons", lexicon, "application/json");
  ASSERT_TRUE(added);
  ASSERT_EQ(added->status, 201) << added->body;
  EXPECT_THAT(added->body, ::testing::HasSubstr(R"("nsid":"app.bsky.feed.post","record":true)"));
  EXPECT_THAT(added->body,
              ::testing::HasSubstr(R"("collections":["app.bsky.feed.like","app.bsky.feed.post"])"));
  EXPECT_THAT(added->body, ::testing::HasSubstr(R"("collection_added":true)"));
  EXPECT_EQ(added->body.find(R"("backfill_job":null)"), std::string::npos) << added->body;

  // The posts arrive, backfilled and followed, and none is longer than the lexicon allows.
  ASSERT_TRUE(testing::WaitUntil([&] { return posts().size() >= 100 || !child->Running(); },
                                 std::chrono::seconds(90)))
      << err();
  for (const std::string& text : posts()) {
    EXPECT_LE(atproto::CountGraphemes(text), 60u) << text;
  }
  auto listed = client().Get("/admin/lexicons");
  ASSERT_TRUE(listed);
  EXPECT_EQ(listed->body,
            R"({"lexicons":[{"nsid":"app.bsky.feed.post","record":true,"source":"api"}]})");

  // A restart keeps the catalog (and the collection): posts are still validated.
  child->Kill(SIGTERM);
  EXPECT_EQ(child->Wait(std::chrono::seconds(120)).exit_code, 0) << err();
  const std::string first_log = err();
  start(&child, &port);
  ASSERT_NE(port, 0) << err();
  auto relisted = client().Get("/admin/lexicons");
  ASSERT_TRUE(relisted);
  EXPECT_EQ(relisted->body, listed->body);
  const size_t posts_before = posts().size();
  ASSERT_TRUE(
      testing::WaitUntil([&] { return posts().size() >= posts_before + 50 || !child->Running(); },
                         std::chrono::seconds(90)))
      << err();
  for (const std::string& text : posts()) {
    EXPECT_LE(atproto::CountGraphemes(text), 60u) << text;
  }
  // DELETE: the catalog forgets it and the live consumer stops taking posts.
  auto removed = client().Delete("/admin/lexicons/app.bsky.feed.post");
  ASSERT_TRUE(removed);
  EXPECT_EQ(removed->status, 200) << removed->body;
  EXPECT_THAT(removed->body, ::testing::HasSubstr(R"("collections":["app.bsky.feed.like"])"));
  EXPECT_THAT(removed->body, ::testing::HasSubstr(R"("collection_removed":true)"));
  auto again = client().Delete("/admin/lexicons/app.bsky.feed.post");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 404) << again->body;
  child->Kill(SIGTERM);
  EXPECT_EQ(child->Wait(std::chrono::seconds(120)).exit_code, 0) << err();

  // Invalid posts were logged with their reason, by the backfill and by the live consumer.
  auto jobs = testing::RunProcess({ATFILL_BINARY, "jobs", config, "--json"}, dir.path());
  ASSERT_EQ(jobs.exit_code, 0) << jobs.err;
  size_t logged = 0;
  for (uint64_t id = 1; id <= 4; ++id) {
    auto errors = testing::RunProcess(
        {ATFILL_BINARY, "job", config, std::to_string(id), "--errors"}, dir.path());
    if (errors.out.find("text: string is longer than 60 graphemes") != std::string::npos) ++logged;
  }
  EXPECT_GE(logged, 2u) << "both the backfill and the live consumer refuse long posts\n"
                        << jobs.out;
  EXPECT_THAT(first_log, ::testing::HasSubstr("lexicon app.bsky.feed.post added"));
}
}  // namespace
}  // namespace atfill
