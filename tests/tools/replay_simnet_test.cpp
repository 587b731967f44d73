// Archive replays over HTTP as a user runs them: the real `atfill` binary against simnet's archive
// host (archive.localhost on 127.0.0.1). A replay of an archive of the network's repos equals a
// getRepo crawl of that network; account markers apply as of their time (and only within the
// marker tail); corrupt blocks are recorded and recovered by retry-failed; 16 undelivered blocks
// in a row stop the job, which resumes once the archive answers; the advertised byte quota is
// kept; the key goes to the archive alone, and `--source auto` crawls when no key is set.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "atproto/tid.hpp"
#include "pipeline/event.hpp"
#include "sinks/sqlite_reader.hpp"
#include "sources/archive/archive_writer.hpp"
#include "sources/archive/jss.hpp"
#include "tests/common/process.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ProcessResult;
using testing::TempDir;

const std::vector<std::string> kCollections = {"app.bsky.feed.post", "app.bsky.feed.like"};

std::string Describe(const ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + " signal " + std::to_string(r.signal) +
         "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

ProcessResult Atfill(const fs::path& dir, std::vector<std::string> args) {
  args.insert(args.begin(), ATFILL_BINARY);
  return testing::RunProcess(args, dir);
}

// "uri cid rev" of every row, sorted (ReadAll orders by uri).
std::vector<std::string> Table(const fs::path& db) {
  auto rows = sinks::ReadAllRecords(db.string());
  EXPECT_TRUE(rows.ok()) << db << ": " << rows.status().ToString();
  std::vector<std::string> out;
  if (!rows.ok()) return out;
  for (const auto& r : *rows) out.push_back(r.uri + " " + r.cid + " " + r.rev);
  return out;
}

// The rkeys in the table, "did/collection/rkey" without the cid and rev.
std::vector<std::string> Keys(const fs::path& db) {
  std::vector<std::string> out;
  for (const std::string& row : Table(db)) out.push_back(row.substr(5, row.find(' ') - 5));
  return out;
}

// A few lines of what differs, for a readable failure.
std::string Diff(const std::vector<std::string>& want, const std::vector<std::string>& got) {
  std::vector<std::string> missing, extra;
  std::set_difference(want.begin(), want.end(), got.begin(), got.end(),
                      std::back_inserter(missing));
  std::set_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(extra));
  std::string out = std::to_string(missing.size()) + " missing, " + std::to_string(extra.size()) +
                    " unexpected\n";
  for (size_t i = 0; i < missing.size() && i < 5; ++i) out += "  missing " + missing[i] + "\n";
  for (size_t i = 0; i < extra.size() && i < 5; ++i) out += "  unexpected " + extra[i] + "\n";
  return out;
}

std::string TomlList(const std::vector<std::string>& v) {
  std::string out = "[";
  for (const std::string& s : v) out += (out.size() > 1 ? ", \"" : "\"") + s + "\"";
  return out + "]";
}

// A config in `dir`: state "<name>-state", table "<name>.db", the archive at `archive_url`, the
// network of `net` (when given) for crawls; `extra_archive` is appended to [archive] and
// `extra_crawl` to [crawl].
std::string WriteConfig(const fs::path& dir, const std::string& name,
                        const std::string& archive_url, const simnet::Simnet* net,
                        const std::string& extra_archive = "",
                        const std::vector<std::string>& collections = kCollections,
                        const std::string& extra_crawl = "") {
  std::string text = "[state]\ndir = \"" + name + "-state\"\n[sink.sqlite]\npath = \"" + name +
                     ".db\"\n[engine]\nbatch_ms = 50\n[progress]\ninterval_s = 60\n" +
                     "[crawl]\ncollections = " + TomlList(collections) +
                     "\nallow_loopback_endpoints = true\n" + extra_crawl;
  if (net != nullptr) {
    text += "relay = \"" + net->relay_url() + "\"\n[resolver]\nplc = \"" + net->plc_url() + "\"\n";
  }
  text += "[archive]\nurl = \"" + archive_url + "\"\n" + extra_archive;
  const fs::path path = dir / (name + ".toml");
  testing::WriteFile(path, text);
  return path.string();
}

// A replay of `net`'s whole archive with the config "<name>" (its [archive] plus
// `extra_archive`), which must succeed; its output. The table is "<name>.db".
ProcessResult Replay(const fs::path& dir, const simnet::Simnet& net, const std::string& name,
                     const std::string& extra_archive = "") {
  const std::string config = WriteConfig(dir, name, net.archive_url(), nullptr, extra_archive);
  auto r = Atfill(dir, {"backfill", config, "--source", "replay"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  return r;
}

// A network whose archive holds its repos (ArchiveOptions::from_repos) in `archive_dir`.
simnet::SimnetOptions RepoArchive(const fs::path& archive_dir, uint32_t accounts,
                                  uint32_t rows_per_block) {
  simnet::SimnetOptions o;
  o.seed = 11;
  o.accounts = accounts;
  o.pds_hosts = 6;
  o.collections = kCollections;
  o.max_records = 40;
  o.did_web_share = 0.05;
  o.deactivated_share = 0.03;
  o.takendown_share = 0.02;
  o.threads = 2;
  o.archive.dir = archive_dir.string();
  o.archive.from_repos = true;
  o.archive.rows_per_block = rows_per_block;
  o.archive.segment_bytes = 64 << 10;
  return o;
}

// The sealed segments of an archive directory.
uint64_t Segments(const fs::path& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".jss";
  return n;
}

// "<segment name>/<block index>" of every block of the archive in `dir`.
std::vector<std::string> Blocks(const fs::path& dir) {
  std::vector<fs::path> segments;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (jss::ParseSegmentName(e.path().filename().string()).ok()) segments.push_back(e.path());
  }
  std::sort(segments.begin(), segments.end());
  std::vector<std::string> out;
  for (const fs::path& s : segments) {
    auto reader = jss::SegmentReader::Open(s.string());
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    if (!reader.ok()) continue;
    for (size_t b = 0; b < reader->footer().blocks.size(); ++b) {
      out.push_back(s.filename().string() + "/" + std::to_string(b));
    }
  }
  return out;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(ReplaySimnetTest, ReplayEqualsCrawlOnTheSameNetwork) {
  TempDir dir;
  auto net = simnet::Simnet::Start(RepoArchive(dir / "archive", 300, 128));
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  ASSERT_GT(Blocks(dir / "archive").size(), 20u);
  const std::string crawl = WriteConfig(dir.path(), "crawl", (*net)->archive_url(), net->get());
  const std::string replay = WriteConfig(dir.path(), "replay", (*net)->archive_url(), nullptr);

  auto crawled = Atfill(dir.path(), {"backfill", crawl, "--source", "crawl", "--mode", "getRepo"});
  // 0: simnet's inactive accounts are outcomes of the crawl, not errors.
  ASSERT_EQ(crawled.exit_code, 0) << Describe(crawled);
  EXPECT_THAT(crawled.err, HasSubstr("crawls 2 collection(s)"));
  auto replayed = Atfill(dir.path(), {"backfill", replay, "--source", "replay"});
  ASSERT_EQ(replayed.exit_code, 0) << Describe(replayed);
  EXPECT_THAT(replayed.err, HasSubstr("replays 2 collection(s) from " + (*net)->archive_url()));

  const auto want = Table(dir / "crawl.db");
  const auto got = Table(dir / "replay.db");
  ASSERT_GT(want.size(), 1000u);
  EXPECT_EQ(got, want) << Diff(want, got);
  // The crawl skipped the inactive accounts' repos, which the archive never held.
  uint64_t inactive = 0;
  for (const auto& a : (*net)->network().accounts()) {
    inactive += a.status != simnet::AccountStatus::kActive;
  }
  EXPECT_GT(inactive, 5u);
  // The replay downloaded every segment whole (planned whole: a replay of every collection it
  // holds) into the spool, read no block alone, and left no spool file behind.
  const simnet::ArchiveStats stats = (*net)->archive_stats();
  EXPECT_EQ(stats.get_blocks, 0u);
  EXPECT_GE(stats.get_segments, 2 * Segments(dir / "archive"));  // index reads + downloads
  EXPECT_THAT(replayed.err, HasSubstr("segments spooled"));
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir / "replay-state", ec)) {
    EXPECT_NE(e.path().extension(), ".part") << e.path();
  }
}

// Segments planned whole are spooled in 16 KiB getSegment ranges; every getSegment answer is cut
// off halfway (Content-Length promised, half the body, connection closed) six times over: each
// broken range is read again and the download goes on from there. The table equals a replay
// read block by block, no segment fell back to getBlock, and no spool file is left.
TEST(ReplaySimnetTest, SpooledSegmentsResumeBrokenDownloads) {
  TempDir dir;
  simnet::SimnetOptions so = RepoArchive(dir / "archive", 200, 64);
  so.archive.segment_bytes = 256 << 10;
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  auto b = Replay(dir.path(), **net, "blockwise", "spool_segments = false\n");
  const auto want = Table(dir / "blockwise.db");
  ASSERT_GT(want.size(), 500u);
  EXPECT_THAT(b.err, HasSubstr(" 0 segments spooled"));

  simnet::ArchiveFaults faults;
  faults.faults["getSegment"] = {.kind = simnet::ArchiveFault::Kind::kTruncate, .times = 6};
  (*net)->SetArchiveFaults(faults);
  const simnet::ArchiveStats before = (*net)->archive_stats();
  auto r = Replay(dir.path(), **net, "spooled",
                  "spool_chunk_kb = 16\nretry_delays_ms = [10, 10, 10, 10, 10, 10, 10, 10]\n");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(Table(dir / "spooled.db"), want);
  const simnet::ArchiveStats after = (*net)->archive_stats();
  EXPECT_EQ(after.get_blocks, before.get_blocks);  // nothing block by block
  EXPECT_EQ(after.faults - before.faults, 6u);
  // Several ranges per segment: more getSegment requests than two per segment.
  EXPECT_GT(after.get_segments - before.get_segments, 3 * Segments(dir / "archive"));
  EXPECT_THAT(r.err, HasSubstr(" 0 spool failures"));
  EXPECT_THAT(r.err, Not(HasSubstr(" 0 segments spooled")));
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir / "spooled-state", ec)) {
    EXPECT_NE(e.path().extension(), ".part") << e.path();
  }
}

// Events appended to an archive by hand, 1 ms apart.
struct Events {
  std::unique_ptr<sources::ArchiveWriter> writer;
  int64_t time_us = 0;  // the next event's witnessed time
  uint64_t tid = 0;

  std::string NextTid() {
    auto t = atproto::Tid::FromParts(static_cast<uint64_t>(time_us) + ++tid, 7);
    EXPECT_TRUE(t.ok());
    return t.ok() ? t->str() : "";
  }
  // Appends a post create (`rkey` non-empty) or delete.
  uint64_t Post(const std::string& did, const std::string& rkey, bool del = false) {
    pipeline::RecordEvent r;
    r.did = did;
    r.collection = "app.bsky.feed.post";
    r.rkey = rkey;
    r.rev = NextTid();
    r.operation = del ? pipeline::Operation::kDelete : pipeline::Operation::kCreate;
    if (!del) {
      r.body = R"({"$type":"app.bsky.feed.post","text":")" + rkey +
               R"(","createdAt":"2025-01-01T00:00:00.000Z"})";
    }
    return Append(r);
  }
  uint64_t Mark(const std::string& did, pipeline::AccountStatus status) {
    pipeline::AccountEvent a;
    a.did = did;
    a.active = status == pipeline::AccountStatus::kActive;
    a.status = status;
    a.time_us = time_us;
    return Append(a);
  }
  uint64_t Append(const sources::JetstreamFrame::Payload& event) {
    auto seq = writer->Append(event, time_us);
    EXPECT_TRUE(seq.ok()) << seq.status().ToString();
    time_us += 1000;
    return seq.ok() ? *seq : 0;
  }
};

std::string Did(char c) { return "did:plc:" + std::string(24, c); }

TEST(ReplaySimnetTest, TakedownsApplyAsOfTheirTime) {
  TempDir dir;
  const fs::path archive = dir / "archive";
  const std::string a = Did('a'), b = Did('b'), c = Did('c'), d = Did('d'), e = Did('e'),
                    f = Did('f'), g = Did('g');
  // Four rows a block, so markers and the records they concern sit in different blocks.
  auto writer = sources::ArchiveWriter::Open(archive.string(), {.rows_per_block = 4});
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  Events ev{std::move(*writer), 1'735'689'600'000'000};
  using S = pipeline::AccountStatus;
  // The first segment, two days before the second.
  ev.Post(a, "r1");
  ev.Post(b, "b1");
  ev.Post(c, "c1");
  ev.Post(e, "e1");
  ev.Post(f, "f1");
  ev.Post(d, "d1");
  ev.Mark(a, S::kTakendown);  // a loses r1...
  ev.Mark(b, S::kDeleted);    // b and c lose everything
  ev.Mark(c, S::kTakendown);
  ev.Mark(e, S::kDeactivated);  // deactivation keeps records
  ev.Mark(a, S::kActive);       // ...and keeps r2, written after its reactivation
  ev.Post(a, "r2");
  ev.Post(d, "d2");
  ev.Post(d, "d1", /*del=*/true);
  ASSERT_TRUE(ev.writer->Finish().ok());
  ev.time_us += int64_t{48} * 3'600'000'000;
  const uint64_t second_segment = ev.Mark(f, S::kTakendown);  // within any tail
  ev.Post(g, "g1");
  ASSERT_TRUE(ev.writer->Finish().ok());
  ASSERT_EQ(ev.writer->segments_written(), 2u);

  simnet::SimnetOptions so;
  so.accounts = 5;
  so.pds_hosts = 1;
  so.archive.dir = archive.string();
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  const std::vector<std::string> posts = {"app.bsky.feed.post"};
  const auto key = [](const std::string& did, const std::string& rkey) {
    return did + "/app.bsky.feed.post/" + rkey;
  };

  // The whole archive's markers: each applies as of its seq.
  const std::string whole = WriteConfig(dir.path(), "whole", (*net)->archive_url(), nullptr,
                                        "replay_marker_tail_hours = 0\n", posts);
  auto r = Atfill(dir.path(), {"backfill", whole, "--source", "replay"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("the account sweep reads the whole archive"));
  std::vector<std::string> want = {key(a, "r2"), key(d, "d2"), key(e, "e1"), key(g, "g1")};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(Keys(dir / "whole.db"), want) << r.err;

  // The default tail (12 h) starts the account sweep at the second segment: the first one's
  // markers are not applied, f's takedown in the second is.
  const std::string tail =
      WriteConfig(dir.path(), "tail", (*net)->archive_url(), nullptr, "", posts);
  auto t = Atfill(dir.path(), {"backfill", tail, "--source", "replay"});
  ASSERT_EQ(t.exit_code, 0) << Describe(t);
  EXPECT_THAT(t.err, HasSubstr("the account sweep starts at seq " + std::to_string(second_segment) +
                               " (segment " + jss::SegmentName(1)));
  want = {key(a, "r1"), key(a, "r2"), key(b, "b1"), key(c, "c1"),
          key(d, "d2"), key(e, "e1"), key(g, "g1")};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(Keys(dir / "tail.db"), want) << t.err;
}

TEST(ReplaySimnetTest, FailedBlocksThenRetryFailed) {
  TempDir dir;
  auto net = simnet::Simnet::Start(RepoArchive(dir / "archive", 200, 32));
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  const auto blocks = Blocks(dir / "archive");
  ASSERT_GT(blocks.size(), 50u);

  Replay(dir.path(), **net, "clean");
  const auto want = Table(dir / "clean.db");
  ASSERT_GT(want.size(), 500u);

  // Every fifth block is served corrupt.
  simnet::ArchiveFaults faults;
  for (size_t i = 0; i < blocks.size(); i += 5) {
    faults.faults[blocks[i]] = {.kind = simnet::ArchiveFault::Kind::kCorrupt};
  }
  const size_t corrupt = faults.faults.size();
  (*net)->SetArchiveFaults(faults);
  // Block by block (getBlock), where the faults are: no whole-segment spool.
  const std::string config =
      WriteConfig(dir.path(), "replay", (*net)->archive_url(), nullptr, "spool_segments = false\n");
  auto r = Atfill(dir.path(), {"backfill", config, "--source", "replay"});
  // 1: the corrupt blocks are failed blocks in the error log; the rest lands.
  ASSERT_EQ(r.exit_code, 1) << Describe(r);
  const auto partial = Table(dir / "replay.db");
  EXPECT_LT(partial.size(), want.size());
  auto shown = Atfill(dir.path(), {"job", config, "1"});
  ASSERT_EQ(shown.exit_code, 0) << Describe(shown);
  EXPECT_THAT(shown.out, HasSubstr("failed blocks " + std::to_string(corrupt) +
                                   (corrupt > 20 ? " (first 20 shown)\n" : "\n")));
  EXPECT_THAT(shown.out, HasSubstr(blocks[0] + "  bad_block"));
  EXPECT_THAT(shown.out, HasSubstr(blocks[10] + "  bad_block"));
  EXPECT_THAT(shown.out, Not(HasSubstr(blocks[1] + "  ")));

  (*net)->SetArchiveFaults({});
  auto retry = Atfill(dir.path(), {"retry-failed", config, "1"});
  ASSERT_EQ(retry.exit_code, 0) << Describe(retry);
  EXPECT_THAT(retry.err, HasSubstr("fetching the " + std::to_string(corrupt) + " failed block(s)"));
  const auto got = Table(dir / "replay.db");
  EXPECT_EQ(got, want) << Diff(want, got);
  auto after = Atfill(dir.path(), {"job", config, "1"});
  EXPECT_THAT(after.out, HasSubstr("failed blocks none"));
}

TEST(ReplaySimnetTest, SixteenInARowStopsAndResumes) {
  TempDir dir;
  simnet::SimnetOptions so = RepoArchive(dir / "archive", 200, 16);
  so.archive.segment_bytes = 4 << 20;  // one segment of many blocks
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  const auto blocks = Blocks(dir / "archive");
  ASSERT_GT(blocks.size(), 40u);
  ASSERT_EQ(blocks[40], jss::SegmentName(0) + "/40");

  Replay(dir.path(), **net, "clean");
  const auto want = Table(dir / "clean.db");
  ASSERT_GT(want.size(), 500u);

  // Blocks 5..30 answer 500 to every request; each is tried three times.
  simnet::ArchiveFaults faults;
  for (int i = 5; i <= 30; ++i) faults.faults[blocks[i]] = {.status = 500};
  (*net)->SetArchiveFaults(faults);
  const std::string config = WriteConfig(dir.path(), "replay", (*net)->archive_url(), nullptr,
                                         "spool_segments = false\n"
                                         "retry_delays_ms = [10, 10]\n");
  const auto start = std::chrono::steady_clock::now();
  auto r = Atfill(dir.path(), {"backfill", config, "--source", "replay"});
  EXPECT_LT(SecondsSince(start), 10.0) << "the retry delays were not applied";
  EXPECT_NE(r.exit_code, 0) << Describe(r);
  const std::string sentence =
      "the archive failed 16 blocks in a row; stopping (resume to continue)";
  EXPECT_THAT(r.err, HasSubstr(sentence));
  EXPECT_EQ((*net)->archive_stats().faults, 16u * 3u);
  auto shown = Atfill(dir.path(), {"job", config, "1"});
  ASSERT_EQ(shown.exit_code, 0) << Describe(shown);
  EXPECT_THAT(shown.out, HasSubstr("status      failed"));
  EXPECT_THAT(shown.out, HasSubstr(sentence));
  EXPECT_LT(Table(dir / "replay.db").size(), want.size());

  // Resumed against an archive that answers again, the job reads the whole streak again (its
  // cursor did not pass the undelivered blocks) and they leave its failed list.
  (*net)->SetArchiveFaults({});
  auto resumed = Atfill(dir.path(), {"resume", config, "1"});
  ASSERT_EQ(resumed.exit_code, 0) << Describe(resumed);
  auto after = Atfill(dir.path(), {"job", config, "1"});
  EXPECT_THAT(after.out, HasSubstr("status      completed"));
  EXPECT_THAT(after.out, HasSubstr("failed blocks none"));
  const auto got = Table(dir / "replay.db");
  EXPECT_EQ(got, want) << Diff(want, got);
  auto retry = Atfill(dir.path(), {"retry-failed", config, "1"});
  ASSERT_EQ(retry.exit_code, 0) << Describe(retry);
  EXPECT_THAT(retry.err, HasSubstr("has no failed block"));
}

TEST(ReplaySimnetTest, QuotaPacingHoldsTheAdvertisedRate) {
  TempDir dir;
  simnet::SimnetOptions so = RepoArchive(dir / "archive", 1400, 256);
  constexpr uint64_t kRate = 300'000;
  so.archive.faults.quota_bytes_per_second = kRate;
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  uint64_t archive_bytes = 0;
  for (const auto& e : fs::directory_iterator(dir / "archive")) archive_bytes += e.file_size();
  ASSERT_GT(archive_bytes, uint64_t{800'000});
  ASSERT_LT(archive_bytes, uint64_t{2'000'000});

  // The config's source (an archive given by its url alone).
  const std::string config = WriteConfig(dir.path(), "replay", (*net)->archive_url(), nullptr, "",
                                         kCollections, "source = \"replay\"\n");
  const auto start = std::chrono::steady_clock::now();
  auto r = Atfill(dir.path(), {"backfill", config});
  const double took = SecondsSince(start);
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("replays 2 collection(s) from " + (*net)->archive_url()));
  const simnet::ArchiveStats stats = (*net)->archive_stats();
  EXPECT_GT(stats.bytes, archive_bytes * 9 / 10);
  const double floor = static_cast<double>(stats.bytes) / kRate * 0.85;
  EXPECT_GE(took, floor) << stats.bytes << " bytes in " << took << " s";
  EXPECT_LT(took, floor * 2 + 3) << stats.bytes << " bytes in " << took << " s";
  EXPECT_EQ(stats.quota_rejections, 0u);
  EXPECT_GT(Table(dir / "replay.db").size(), 1000u);
}

TEST(ReplaySimnetTest, AKeyIsSentOnlyToTheArchive) {
  ::unsetenv("ATFILL_ARCHIVE_KEY");  // it would replace the configs' keys
  TempDir dir;
  simnet::SimnetOptions so = RepoArchive(dir / "archive", 60, 64);
  so.archive.faults.required_key = "right-key";
  auto net = simnet::Simnet::Start(so);
  ASSERT_TRUE(net.ok()) << net.status().ToString();

  // No key: auto asks the archive, which wants one, and crawls.
  const std::string none = WriteConfig(dir.path(), "none", (*net)->archive_url(), net->get());
  auto crawled = Atfill(dir.path(), {"backfill", none, "--source", "auto", "--mode", "getRepo"});
  // 0: simnet's inactive accounts are outcomes of the crawl, not errors.
  ASSERT_EQ(crawled.exit_code, 0) << Describe(crawled);
  EXPECT_THAT(crawled.err, HasSubstr("no archive to replay from"));
  EXPECT_THAT(crawled.err, HasSubstr("crawls 2 collection(s)"));
  EXPECT_THAT(crawled.err, Not(HasSubstr("replays")));
  const auto want = Table(dir / "none.db");
  EXPECT_GT(want.size(), 100u);
  EXPECT_EQ((*net)->archive_stats().key_rejections, 1u);
  EXPECT_EQ((*net)->archive_stats().get_blocks, 0u);

  // The right key: auto replays, to the crawl's table.
  const std::string right =
      WriteConfig(dir.path(), "right", (*net)->archive_url(), net->get(), "key = \"right-key\"\n");
  auto replayed = Atfill(dir.path(), {"backfill", right, "--source", "auto", "--mode", "getRepo"});
  ASSERT_EQ(replayed.exit_code, 0) << Describe(replayed);
  EXPECT_THAT(replayed.err, HasSubstr("replays 2 collection(s) from " + (*net)->archive_url()));
  EXPECT_EQ(Table(dir / "right.db"), want);
  EXPECT_GT((*net)->archive_stats().get_segments, 0u);  // spooled, with the key
  EXPECT_EQ((*net)->archive_stats().key_rejections, 1u);

  // A wrong key: refused, and the backfill fails saying so rather than crawling.
  const std::string wrong =
      WriteConfig(dir.path(), "wrong", (*net)->archive_url(), net->get(), "key = \"wrong-key\"\n");
  auto refused = Atfill(dir.path(), {"backfill", wrong, "--source", "auto", "--mode", "getRepo"});
  EXPECT_NE(refused.exit_code, 0) << Describe(refused);
  EXPECT_THAT(refused.err, HasSubstr("refused the configured key"));
  EXPECT_THAT(refused.err, Not(HasSubstr("crawls")));
  EXPECT_FALSE(fs::exists(dir / "wrong.db"));
  EXPECT_EQ((*net)->archive_stats().key_rejections, 2u);

  // The crawl's requests (relay, PLC, PDSes) and listSegments never carried it.
  EXPECT_EQ((*net)->archive_stats().authorization_elsewhere, 0u);
}

}  // namespace
}  // namespace atfill
