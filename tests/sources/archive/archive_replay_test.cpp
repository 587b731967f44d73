// Archive replay as a user runs it: `atfill archive write` makes a directory archive of generated
// Jetstream events, `atfill backfill --source replay` replays it into SQLite; the table equals
// `atfill ingest` of the same events. Corrupt blocks are recorded and recovered by
// `atfill retry-failed`; a SIGKILLed replay resumes to the same table. Real processes and files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "sinks/sqlite_reader.hpp"
#include "sources/archive/jss.hpp"
#include "state/failed_blocks.hpp"
#include "tests/common/process.hpp"
#include "tests/common/test_util.hpp"
#include "tools/gen/event_gen.hpp"

namespace atfill {
namespace {

namespace fs = std::filesystem;
using testing::Child;
using ::testing::HasSubstr;
using testing::ProcessResult;
using testing::RunProcess;
using testing::TempDir;
using testing::WriteFile;

const std::string kAtfill = ATFILL_BINARY;

std::string Describe(const ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + " signal " + std::to_string(r.signal) +
         "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

// The table's content (uri, cid, rev, createdAt) without indexed_at. The record JSON is left out:
// a replayed record's JSON is made from its stored DAG-CBOR (key order differs from the JSON a
// stream sent) and its CID proves the content.
std::vector<std::string> Content(const fs::path& db, const std::vector<std::string>& collections) {
  auto rows = sinks::ReadAllRecords(db.string());
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  std::vector<std::string> out;
  if (!rows.ok()) return out;
  for (const auto& r : *rows) {
    bool wanted = collections.empty();
    for (const auto& c : collections) wanted |= r.uri.find("/" + c + "/") != std::string::npos;
    if (wanted) out.push_back(r.uri + " " + r.cid + " " + r.rev + " " + r.created_at);
  }
  std::sort(out.begin(), out.end());
  return out;
}

const std::vector<std::string> kCollections = {"app.bsky.feed.post", "app.bsky.feed.like"};

// A folder with the events, the archive made of them, and two configs: "replay.toml" (replays the
// archive into replay.db) and "ingest.toml" (ingests the events into ingest.db).
struct Workspace {
  TempDir dir;
  std::string events;
  explicit Workspace(uint64_t count, uint32_t rows_per_block) {
    events = (dir / "events.jsonl").string();
    gen::EventGenOptions o;
    o.dids = 300;
    o.account_ratio = 0.02;
    o.update_ratio = 0.1;
    o.delete_ratio = 0.05;
    EXPECT_TRUE(gen::EventGenerator::WriteFile(o, count, events).ok());
    WriteFile(dir / "replay.toml",
              "[state]\ndir = \"replay-state\"\n[sink.sqlite]\npath = \"replay.db\"\n"
              "[crawl]\nsource = \"replay\"\n"
              "collections = [\"app.bsky.feed.post\", \"app.bsky.feed.like\"]\n"
              "[archive]\ndir = \"archive\"\nreplay_marker_tail_hours = 0\n"
              // Small batches: a SIGKILL lands between commits (the default is 100,000).
              "batch_records = 4000\nbatch_ms = 100\n");
    WriteFile(dir / "ingest.toml",
              "[state]\ndir = \"ingest-state\"\n[sink.sqlite]\npath = \"ingest.db\"\n");
    auto w = Atfill({"archive", "write", Config("replay"), (dir / "archive").string(), events,
                     "--rows-per-block", std::to_string(rows_per_block), "--segment-kb", "256"});
    EXPECT_EQ(w.exit_code, 0) << Describe(w);
    EXPECT_THAT(w.err, HasSubstr("wrote " + std::to_string(count) + " rows"));
  }
  std::string Config(const std::string& name) const { return (dir / (name + ".toml")).string(); }
  ProcessResult Atfill(std::vector<std::string> args) const {
    args.insert(args.begin(), kAtfill);
    return RunProcess(args, dir.path());
  }
  std::vector<std::string> Ingested() {
    auto r = Atfill({"ingest", Config("ingest"), events});
    EXPECT_EQ(r.exit_code, 0) << Describe(r);
    return Content(dir / "ingest.db", kCollections);
  }
  std::vector<fs::path> Segments() const {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir / "archive")) out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
  }
};

// XORs four bytes in the middle of block `block`'s frame (twice restores it).
void FlipBlock(const fs::path& segment, size_t block) {
  auto reader = jss::SegmentReader::Open(segment.string());
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  const jss::BlockInfo info = reader->footer().blocks.at(block);
  std::fstream f(segment, std::ios::in | std::ios::out | std::ios::binary);
  const uint64_t at = info.offset + 8 + info.compressed_size / 2;
  char bytes[4];
  f.seekg(static_cast<std::streamoff>(at));
  f.read(bytes, 4);
  for (char& b : bytes) b = static_cast<char>(b ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(bytes, 4);
}

TEST(ArchiveReplayTest, AReplayEqualsTheIngestOfTheSameEvents) {
  Workspace ws(20'000, 512);
  ASSERT_GT(ws.Segments().size(), 3u);
  auto r = ws.Atfill({"backfill", ws.Config("replay")});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("replays 2 collection(s) from"));
  EXPECT_THAT(r.err, HasSubstr("the account sweep reads the whole archive"));
  const auto replayed = Content(ws.dir / "replay.db", {});
  const auto ingested = ws.Ingested();
  ASSERT_GT(ingested.size(), 5'000u);
  EXPECT_EQ(replayed, ingested);
  // The job shows where it is in the archive.
  auto job = ws.Atfill({"jobs", ws.Config("replay")});
  EXPECT_THAT(job.out, HasSubstr("completed"));
  auto shown = ws.Atfill({"job", ws.Config("replay"), "1"});
  EXPECT_THAT(shown.out, HasSubstr("input_total 20,000"));
  EXPECT_THAT(shown.out, HasSubstr("failed blocks none"));
}

TEST(ArchiveReplayTest, FailedBlocksAreRecordedAndRecoveredByRetryFailed) {
  Workspace ws(20'000, 256);
  const auto segments = ws.Segments();
  // A fifth of the blocks of every segment do not decode.
  size_t flipped = 0;
  for (const auto& s : segments) {
    auto reader = jss::SegmentReader::Open(s.string());
    ASSERT_TRUE(reader.ok());
    for (size_t b = 0; b < reader->footer().blocks.size(); b += 5) {
      FlipBlock(s, b);
      ++flipped;
    }
  }
  ASSERT_GT(flipped, 10u);
  auto r = ws.Atfill({"backfill", ws.Config("replay")});
  // 1: the flipped blocks are failed blocks in the error log; the rest lands.
  ASSERT_EQ(r.exit_code, 1) << Describe(r);
  const auto ingested = ws.Ingested();
  const auto partial = Content(ws.dir / "replay.db", {});
  EXPECT_NE(partial, ingested);
  auto shown = ws.Atfill({"job", ws.Config("replay"), "1", "--errors"});
  EXPECT_THAT(shown.out, HasSubstr("failed_blocks " + std::to_string(flipped)));
  EXPECT_THAT(shown.out, HasSubstr("bad_block"));
  EXPECT_THAT(shown.out, HasSubstr("failed blocks " + std::to_string(flipped)));
  // The archive delivers them again (the blocks restored); the retry reads only those.
  for (const auto& s : segments) {
    auto reader = jss::SegmentReader::Open(s.string());
    ASSERT_TRUE(reader.ok());
    for (size_t b = 0; b < reader->footer().blocks.size(); b += 5) FlipBlock(s, b);
  }
  auto retry = ws.Atfill({"retry-failed", ws.Config("replay"), "1"});
  ASSERT_EQ(retry.exit_code, 0) << Describe(retry);
  EXPECT_THAT(retry.err, HasSubstr("fetching the " + std::to_string(flipped) + " failed block(s)"));
  EXPECT_EQ(Content(ws.dir / "replay.db", {}), ingested);
  auto after = ws.Atfill({"job", ws.Config("replay"), "1"});
  EXPECT_THAT(after.out, HasSubstr("failed blocks none"));
  auto nothing = ws.Atfill({"retry-failed", ws.Config("replay"), "1"});
  EXPECT_EQ(nothing.exit_code, 0) << Describe(nothing);
  EXPECT_THAT(nothing.err, HasSubstr("has no failed block"));
}

TEST(ArchiveReplayTest, ASigkilledReplayResumesToTheSameTable) {
  Workspace ws(80'000, 512);
  const auto ingested = ws.Ingested();
  Child child({kAtfill, "backfill", ws.Config("replay")}, ws.dir.path());
  // Killed once records are landing.
  bool landed = false;
  testing::WaitUntil(
      [&] {
        auto rows = sinks::ReadAllRecords((ws.dir / "replay.db").string());
        landed = rows.ok() && rows->size() > 1000;
        return landed || !child.Running();
      },
      std::chrono::seconds(10));
  ASSERT_TRUE(landed) << "no record landed";
  ASSERT_TRUE(child.Kill(SIGKILL)) << "the replay finished before it could be killed";
  auto killed = child.Wait();
  EXPECT_EQ(killed.signal, SIGKILL);
  auto again = ws.Atfill({"backfill", ws.Config("replay")});
  ASSERT_EQ(again.exit_code, 0) << Describe(again);
  EXPECT_THAT(again.err, HasSubstr("resuming backfill job 1"));
  EXPECT_EQ(Content(ws.dir / "replay.db", {}), ingested);
}

TEST(ArchiveReplayTest, AccountBackfillsAreRefusedAsReplaysAndAutoCrawlsWithoutAnArchive) {
  TempDir dir;
  WriteFile(
      dir / "a.toml",
      "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"out.db\"\n[archive]\ndir = \"none\"\n");
  auto dids = RunProcess({kAtfill, "backfill", (dir / "a.toml").string(), "--source", "replay",
                          "--did", "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"},
                         dir.path());
  EXPECT_EQ(dids.exit_code, 2) << Describe(dids);
  EXPECT_THAT(dids.err, HasSubstr("account backfills always crawl"));
  auto bad = RunProcess({kAtfill, "backfill", (dir / "a.toml").string(), "--source", "sideways"},
                        dir.path());
  EXPECT_EQ(bad.exit_code, 2) << Describe(bad);
  EXPECT_THAT(bad.err, HasSubstr("'sideways' is not crawl, auto or replay"));
  // auto with an archive that cannot be read: the backfill crawls (here: no relay configured).
  auto automatic = RunProcess({kAtfill, "backfill", (dir / "a.toml").string(), "--source", "auto",
                               "--collection", "app.bsky.feed.post"},
                              dir.path());
  EXPECT_THAT(automatic.err, HasSubstr("no archive to replay from"));
  EXPECT_THAT(automatic.err, HasSubstr("the backfill crawls"));
  // replay with that archive fails the job's start, naming the folder.
  auto replay = RunProcess({kAtfill, "backfill", (dir / "a.toml").string(), "--source", "replay",
                            "--collection", "app.bsky.feed.post"},
                           dir.path());
  EXPECT_NE(replay.exit_code, 0) << Describe(replay);
  EXPECT_THAT(replay.err, HasSubstr("none"));
  // A replay's batch limits are checked like [engine]'s, and its SQLite WAL size.
  for (const std::string key : {"batch_records", "sqlite_wal_mb"}) {
    WriteFile(dir / "b.toml", "[archive]\ndir = \"none\"\n" + key + " = 0\n");
    auto zero = RunProcess({kAtfill, "backfill", (dir / "b.toml").string(), "--source", "replay",
                            "--collection", "app.bsky.feed.post"},
                           dir.path());
    EXPECT_EQ(zero.exit_code, 2) << Describe(zero);
    EXPECT_THAT(zero.err, HasSubstr("b.toml:3: archive." + key + " = 0 is out of range"));
  }
}

}  // namespace
}  // namespace atfill
