// `atfill run` with [live] protocol = "firehose" as a user runs it, against a relay serving
// simnet's repos as signed commits with dropped commits, #sync frames and forged commits, killed
// with SIGKILL mid-stream and run again until the stream goes quiet: the table equals the served
// repos, the forgeries are refused and logged, and `atfill status` and `atfill job` show the
// firehose's counters.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "tests/common/job_harness.hpp"
#include "tests/common/process.hpp"
#include "tests/common/test_util.hpp"
#include "tools/simnet/firehose_relay.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill {
namespace {

using testing::TempDir;

TEST(FirehoseRunTest, SigkilledMidStreamThenResumedEqualsTheServedRepos) {
  simnet::SimnetOptions so;
  so.seed = 31;
  so.accounts = 60;
  so.pds_hosts = 2;
  so.min_records = 2;
  so.max_records = 12;
  so.deactivated_share = 0;
  so.takendown_share = 0;
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  simnet::FirehoseLogOptions lo;
  lo.seed = 9;
  lo.drop_share = 0.05;
  lo.sync_share = 0.05;
  lo.bad_signature_share = 0.03;
  lo.tampered_share = 0.03;
  auto log = simnet::BuildFirehoseLog((*net)->network(), lo);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  const uint64_t forged = log->bad_signatures + log->tampered;
  ASSERT_GT(forged, 0u);
  ASSERT_GT(log->dropped + log->syncs, 0u);
  const int64_t last_seq = log->frames.back().seq;
  // Slow enough that the kills land mid-stream.
  simnet::FirehoseRelayOptions ro;
  ro.frames_per_second = 300;
  auto relay = simnet::FirehoseRelay::Start(std::move(log->frames), ro);
  ASSERT_TRUE(relay.ok()) << relay.status().ToString();
  auto truth = (*net)->Truth();
  ASSERT_TRUE(truth.ok()) << truth.status().ToString();
  const std::map<std::string, std::string> want = testing::UriCids(truth->records);

  TempDir dir;
  const std::string config = (dir.path() / "atfill.toml").string();
  testing::WriteFile(config,
                     "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"db.sqlite\"\n"
                     "[resolver]\nplc = \"" +
                         (*net)->plc_url() +
                         "\"\n[crawl]\nallow_loopback_endpoints = true\n"
                         "[engine]\nbatch_ms = 50\nbatch_records = 100\n"
                         "[progress]\ninterval_s = 60\n"
                         "[live]\nprotocol = \"firehose\"\nhosts = [\"" +
                         (*relay)->url() +
                         "\"]\nstart_seq = 1\nidle_exit_ms = 1500\n"
                         "allow_private_endpoints = true\nreconnect_base_ms = 20\n"
                         "reconnect_max_ms = 200\nresync_retry_ms = 200\n"
                         "batch_records = 100\nbatch_ms = 50\n");
  const std::string db = (dir.path() / "db.sqlite").string();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("ATFILL_TEST_SEED=" + std::to_string(seed));
  testing::ProcessResult last;
  ASSERT_NO_FATAL_FAILURE(testing::KillThenRunUntilIdle({ATFILL_BINARY, "run", config}, dir.path(),
                                                        db, seed, 2, want.size() / 10,
                                                        want.size() * 6 / 10, &last));
  EXPECT_NE(last.err.find("(firehose)"), std::string::npos) << last.err;
  const auto got = testing::TableCids(db);
  EXPECT_EQ(got, want);
  for (const auto& [uri, cid] : got) {
    EXPECT_EQ(uri.find("/ephemeral-"), std::string::npos) << "a deleted record stayed: " << uri;
  }

  auto status = testing::RunProcess({ATFILL_BINARY, "status", config}, dir.path());
  ASSERT_EQ(status.exit_code, 0) << status.err;
  EXPECT_NE(status.out.find("protocol    firehose"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("cursor      seq " + std::to_string(last_seq)), std::string::npos)
      << status.out;
  EXPECT_NE(status.out.find("resyncs failed"), std::string::npos) << status.out;
  // The cursor keeps the relay's time of its frame (BuildFirehoseCommit's, 2024-01-01).
  EXPECT_NE(status.out.find("witnessed 2024-01-01"), std::string::npos) << status.out;
  // A run killed before its batch committed sees the same forgeries again, so each is refused
  // at least once, and logged under its own seq and DID.
  auto job = testing::RunProcess({ATFILL_BINARY, "job", config, "1", "--errors"}, dir.path());
  ASSERT_EQ(job.exit_code, 0) << job.err;
  EXPECT_NE(job.out.find("firehose_verified"), std::string::npos) << job.out;
  EXPECT_NE(job.out.find("firehose_resynced"), std::string::npos) << job.out;
  size_t logged = 0;
  for (size_t at = job.out.find("commit refused: "); at != std::string::npos;
       at = job.out.find("commit refused: ", at + 1)) {
    ++logged;
  }
  EXPECT_GE(logged, forged) << job.out;
}

}  // namespace
}  // namespace atfill
