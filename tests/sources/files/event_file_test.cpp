// The event-file source: Jetstream v1 lines, plain or zstd, chunking and resuming by cursor; and
// the real production corpus through the source and CID verification.
#include <gtest/gtest.h>
#include <zstd.h>

#include <fstream>

#include "sources/files/event_file.hpp"
#include "stages/cid_verify.hpp"
#include "tests/common/process.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::sources {
namespace {

using pipeline::EventChunk;

const char* kLine1 =
    R"({"did":"did:plc:ewvi7nxzyoun6zhxrhs64oiz","time_us":1,"kind":"commit","commit":{"rev":"3l2222222222a","operation":"delete","collection":"app.bsky.feed.post","rkey":"a"}})";
const char* kLine2 =
    R"({"did":"did:plc:ewvi7nxzyoun6zhxrhs64oiz","time_us":2,"kind":"account","account":{"active":false,"did":"did:plc:ewvi7nxzyoun6zhxrhs64oiz","seq":9,"status":"takendown","time":"2026-07-04T14:38:08.999Z"}})";
const char* kLine3 =
    R"({"did":"did:plc:ewvi7nxzyoun6zhxrhs64oiz","time_us":3,"kind":"identity","identity":{"did":"did:plc:ewvi7nxzyoun6zhxrhs64oiz","seq":10,"time":"2026-07-04T14:38:08.999Z"}})";

std::vector<EventChunk> ReadAll(EventFileSource* source) {
  std::vector<EventChunk> chunks;
  for (;;) {
    EventChunk chunk;
    auto more = source->Read(&chunk);
    EXPECT_TRUE(more.ok()) << more.status().ToString();
    if (!more.ok() || !*more) break;
    source->Decode(&chunk);
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

TEST(EventFileTest, ReadsChunksAndResumesFromACursor) {
  testing::TempDir dir;
  // The last line has no newline; a blank line in between is skipped.
  testing::WriteFile(dir / "e.jsonl", std::string(kLine1) + "\n\n" + kLine2 + "\n" + kLine3);
  EventFileOptions options;
  options.paths = {(dir / "e.jsonl").string()};
  options.chunk_lines = 2;
  auto source = EventFileSource::Open(options);
  ASSERT_TRUE(source.ok());
  ASSERT_TRUE((*source)->Seek("").ok());
  auto chunks = ReadAll(source->get());
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].units_read, 2u);
  ASSERT_EQ(chunks[0].events.size(), 1u);  // the delete; the blank line counts but yields nothing
  EXPECT_EQ(pipeline::PositionOf(chunks[0].events[0]), 1u);
  ASSERT_EQ(chunks[1].events.size(), 1u);  // the account event; identity events carry nothing
  const auto& account = std::get<pipeline::AccountEvent>(chunks[1].events[0]);
  EXPECT_EQ(account.status, pipeline::AccountStatus::kTakendown);
  EXPECT_FALSE(account.active);
  EXPECT_EQ(account.seq, 9);
  EXPECT_TRUE(chunks[1].errors.empty());

  // A new source resumes after the first chunk.
  auto again = EventFileSource::Open(options);
  ASSERT_TRUE((*again)->Seek(chunks[0].resume_cursor).ok());
  auto rest = ReadAll(again->get());
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].raw_first_position, 3u);
  EXPECT_EQ(rest[0].resume_cursor, chunks[1].resume_cursor);

  EXPECT_FALSE((*again)->Seek("nonsense").ok());
  EXPECT_FALSE((*again)->Seek("0:99999:1").ok());  // past the end
}

TEST(EventFileTest, ZstdFilesReadTheSameAndResumeByDecompressing) {
  testing::TempDir dir;
  const std::string text = std::string(kLine1) + "\n" + kLine2 + "\n" + kLine1 + "\n";
  std::string packed(ZSTD_compressBound(text.size()), '\0');
  packed.resize(ZSTD_compress(packed.data(), packed.size(), text.data(), text.size(), 3));
  testing::WriteFile(dir / "e.jsonl.zst", packed);
  EventFileOptions options;
  options.paths = {(dir / "e.jsonl.zst").string()};
  options.chunk_lines = 1;
  auto source = EventFileSource::Open(options);
  ASSERT_TRUE((*source)->Seek("").ok());
  auto chunks = ReadAll(source->get());
  ASSERT_EQ(chunks.size(), 3u);
  auto resumed = EventFileSource::Open(options);
  ASSERT_TRUE((*resumed)->Seek(chunks[1].resume_cursor).ok());
  auto rest = ReadAll(resumed->get());
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(pipeline::PositionOf(rest[0].events[0]), 3u);

  testing::WriteFile(dir / "cut.zst", packed.substr(0, packed.size() / 2));
  options.paths = {(dir / "cut.zst").string()};
  auto cut = EventFileSource::Open(options);
  ASSERT_TRUE((*cut)->Seek("").ok());
  Status failed;
  for (int i = 0; i < 10 && failed.ok(); ++i) {
    EventChunk chunk;
    auto more = (*cut)->Read(&chunk);
    if (!more.ok()) failed = more.status();
    if (more.ok() && !*more) break;
  }
  EXPECT_EQ(failed.code(), StatusCode::kCorrupt) << failed.ToString();
}

TEST(EventFileTest, AnOversizedLineIsAnErrorForThatLineOnly) {
  testing::TempDir dir;
  testing::WriteFile(dir / "e.jsonl",
                     std::string(kLine1) + "\n" + std::string(5000, 'x') + "\n" + kLine2 + "\n");
  EventFileOptions options;
  options.paths = {(dir / "e.jsonl").string()};
  options.max_line_bytes = 1000;
  auto source = EventFileSource::Open(options);
  ASSERT_TRUE((*source)->Seek("").ok());
  auto chunks = ReadAll(source->get());
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0].events.size(), 2u);
  ASSERT_EQ(chunks[0].errors.size(), 1u);
  EXPECT_EQ(chunks[0].errors[0].kind, "line_too_long");
  EXPECT_EQ(chunks[0].errors[0].key, "line 2");
  EXPECT_EQ(pipeline::PositionOf(chunks[0].events[1]), 3u);
}

TEST(EventFileTest, ParseRejectsWhatIsNotAnEventWithItsKind) {
  pipeline::Event e;
  std::string kind;
  struct Case {
    std::string line, kind;
  };
  const std::vector<Case> cases = {
      {"[1,2]", "bad_json"},
      {std::string(kLine1) + " trailing", "bad_json"},
      {R"({"did":"did:plc:x","kind":"commit","commit":{"rev":"3l2222222222a","operation":"create","collection":"app.bsky.feed.post","rkey":"a","record":{"$type":"a.b.c"}}})",
       "invalid_cid"},
      {R"({"did":"did:plc:x","kind":"commit","commit":{"rev":"3l2222222222a","operation":"create","collection":"app.bsky.feed.post","rkey":"a"}})",
       "bad_event"},
      {R"({"did":"did:plc:x","kind":"commit","commit":{"rev":"nope","operation":"delete","collection":"app.bsky.feed.post","rkey":"a"}})",
       "invalid_rev"},
      {R"({"did":"did:plc:x","kind":"commit","commit":{"operation":"delete","collection":"app","rkey":"a"}})",
       "invalid_collection"},
      {R"({"did":"did:plc:x","kind":"wobble"})", "unknown_kind"},
      {R"({"kind":"commit"})", "bad_event"},
  };
  for (const auto& c : cases) {
    auto r = ParseJetstreamLine(c.line, pipeline::Origin::kReplay, 1, &e, &kind);
    EXPECT_FALSE(r.ok()) << c.line;
    EXPECT_EQ(kind, c.kind) << c.line << ": " << r.status().ToString();
  }
}

TEST(EventFileTest, TheProductionCorpusParsesAndEveryRecordVerifies) {
  ATFILL_SHARED_PATH(corpus, "protocols/jetstream/data/internal/corpus/testdata/expected_v1.jsonl");
  EventFileOptions options;
  options.paths = {corpus.string()};
  auto source = EventFileSource::Open(options);
  ASSERT_TRUE((*source)->Seek("").ok());
  stages::CidVerify verify;
  uint64_t lines = 0, records = 0, accounts = 0;
  for (auto& chunk : ReadAll(source->get())) {
    lines += chunk.units_read;
    EXPECT_TRUE(chunk.errors.empty()) << chunk.errors[0].key << ": " << chunk.errors[0].message;
    const size_t before = chunk.events.size();
    ASSERT_TRUE(verify.Process(nullptr, &chunk).ok());
    EXPECT_EQ(chunk.events.size(), before) << "a production record failed CID verification";
    for (const auto& e : chunk.events) {
      if (std::holds_alternative<pipeline::RecordEvent>(e)) ++records;
      if (std::holds_alternative<pipeline::AccountEvent>(e)) ++accounts;
    }
  }
  EXPECT_EQ(lines, 152u);
  EXPECT_EQ(records, 150u);
  EXPECT_EQ(accounts, 1u);
}

}  // namespace
}  // namespace atfill::sources

namespace atfill::sources {
namespace {

TEST(EventFileTest, ALineLongerThanTheReadBlockIsSkippedToItsEnd) {
  testing::TempDir dir;
  testing::WriteFile(dir / "e.jsonl",
                     std::string(kLine1) + "\n" + std::string(3 << 20, 'x') + "\n" + kLine2 + "\n");
  EventFileOptions options;
  options.paths = {(dir / "e.jsonl").string()};
  options.max_line_bytes = 1000;
  auto source = EventFileSource::Open(options);
  ASSERT_TRUE((*source)->Seek("").ok());
  auto chunks = ReadAll(source->get());
  ASSERT_EQ(chunks.size(), 1u);
  ASSERT_EQ(chunks[0].events.size(), 2u);
  ASSERT_EQ(chunks[0].errors.size(), 1u);
  EXPECT_EQ(chunks[0].errors[0].key, "line 2");
  EXPECT_EQ(pipeline::PositionOf(chunks[0].events[1]), 3u);
}

}  // namespace
}  // namespace atfill::sources
