// The inspection verbs and the demo, run as a user runs them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <oneapi/tbb/version.h>
#include <rocksdb/version.h>
#include <sqlite3.h>

#include <fstream>

#include "atproto/json.hpp"
#include "tests/common/process.hpp"
#include "tests/common/test_util.hpp"

namespace atfill {
namespace {

using ::testing::HasSubstr;
using testing::ProcessResult;
using testing::RunProcess;
using testing::TempDir;
using testing::WriteFile;

const std::string kAtfill = ATFILL_BINARY;
const std::string kData = std::string(ATFILL_SOURCE_DIR) + "/examples/data";

ProcessResult Atfill(const TempDir& dir, std::vector<std::string> args) {
  args.insert(args.begin(), kAtfill);
  return RunProcess(args, dir.path());
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    out.push_back(text.substr(start, nl - start));
  }
  return out;
}

TEST(CliTest, CidPrintsOneLinePerInputLineAndFlagsBadOnes) {
  TempDir dir;
  auto r = Atfill(dir, {"cid", kData + "/records.jsonl"});
  EXPECT_EQ(r.exit_code, 1);
  const auto out = Lines(r.out);
  ASSERT_EQ(out.size(), 7u);
  EXPECT_EQ(out[0], out[1]) << "key order must not change a CID";
  EXPECT_THAT(out[0], ::testing::StartsWith("bafyrei"));
  EXPECT_EQ(out[5], "");
  EXPECT_EQ(out[6], "");
  EXPECT_THAT(r.err, HasSubstr("error: line 6: "));
  EXPECT_THAT(r.err, HasSubstr("error: line 7: a record must have a $type"));

  // stdin, and a known CID from the interop fixtures' trivial record shape.
  WriteFile(dir / "one.jsonl", "{\"$type\":\"app.bsky.feed.post\",\"text\":\"x\"}\n");
  auto ok = Atfill(dir, {"cid", (dir / "one.jsonl").string()});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(Lines(ok.out).size(), 1u);

  auto missing = Atfill(dir, {"cid", (dir / "nope.jsonl").string()});
  EXPECT_EQ(missing.exit_code, 3);
  EXPECT_THAT(missing.err, HasSubstr("cannot open"));
}

TEST(CliTest, ValidateSaysValidOrWhereAndWhyNotPerLine) {
  ATFILL_SHARED_PATH(lexicons, "lexicons");
  TempDir dir;
  WriteFile(
      dir / "records.jsonl",
      R"({"$type":"app.bsky.feed.like","subject":{"uri":"at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/app.bsky.feed.post/3lbqzb5ddb22a","cid":"bafyreiclp443lavogvhj3d2ob2cxbfuscni2k5jk7bebjzg7khl3esabwq"},"createdAt":"2026-11-30T09:00:00Z"})"
      "\n"
      R"({"$type":"app.bsky.feed.like","subject":{"uri":"nope","cid":"x"},"createdAt":"2026-11-30T09:00:00Z"})"
      "\n"
      R"({"$type":"com.example.thing"})"
      "\n"
      "not json\n");
  auto r =
      Atfill(dir, {"validate", "--lexicons", lexicons.string(), (dir / "records.jsonl").string()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const auto out = Lines(r.out);
  ASSERT_EQ(out.size(), 4u) << r.out;
  EXPECT_EQ(out[0], "valid");
  EXPECT_THAT(out[1], ::testing::StartsWith("invalid: subject.uri: not a valid aturi: "));
  EXPECT_EQ(out[2], "unknown: no lexicon for com.example.thing");
  EXPECT_THAT(out[3], ::testing::StartsWith("invalid: not an atproto record: "));

  // stdin, every line valid: exit 0.
  WriteFile(dir / "one.jsonl",
            "{\"$type\":\"app.bsky.graph.block\",\"subject\":"
            "\"did:plc:ewvi7nxzyoun6zhxrhs64oiz\",\"createdAt\":"
            "\"2026-11-30T09:00:00Z\"}\n");
  auto ok = RunProcess({"/bin/sh", "-c", "exec \"$0\" validate --lexicons \"$1\" < \"$2\"", kAtfill,
                        lexicons.string(), (dir / "one.jsonl").string()},
                       dir.path());
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.out, "valid\n");

  // Many lines, validated on every core: one verdict per line, in input order.
  std::string many;
  for (int i = 0; i < 5000; ++i) {
    many += i % 3 == 0
                ? R"({"$type":"com.example.thing"})"
                  "\n"
                : R"({"$type":"app.bsky.graph.block","subject":"did:plc:ewvi7nxzyoun6zhxrhs64oiz",)"
                  R"("createdAt":"2026-11-30T09:00:00Z"})"
                  "\n";
  }
  WriteFile(dir / "many.jsonl", many);
  auto ordered =
      Atfill(dir, {"validate", "--lexicons", lexicons.string(), (dir / "many.jsonl").string()});
  EXPECT_EQ(ordered.exit_code, 0) << ordered.err;
  const auto verdicts = Lines(ordered.out);
  ASSERT_EQ(verdicts.size(), 5000u);
  for (size_t i = 0; i < verdicts.size(); ++i) {
    ASSERT_EQ(verdicts[i], i % 3 == 0 ? "unknown: no lexicon for com.example.thing" : "valid")
        << "line " << i + 1;
  }

  // A lexicon that is not one: exit 1 naming the file; no --lexicons: a usage error.
  WriteFile(dir / "bad.json", R"({"lexicon":2,"id":"com.example.x","defs":{}})");
  auto bad = Atfill(dir, {"validate", "--lexicons", (dir / "bad.json").string()});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("bad.json: lexicon must be the integer 1"));
  EXPECT_EQ(Atfill(dir, {"validate", (dir / "records.jsonl").string()}).exit_code, 2);
}

// Blocks of lines are hashed on every core; what comes out is what one core would print: a line
// per input line in input order, across files, and each error with its own line number.
TEST(CliTest, CidOfManyLinesKeepsTheirOrderAndLineNumbers) {
  TempDir dir;
  std::string first;
  std::string second;
  std::vector<std::string> want;
  std::vector<size_t> bad;
  for (size_t i = 1; i <= 9000; ++i) {
    std::string line =
        "{\"$type\":\"app.bsky.feed.post\",\"text\":\"post " + std::to_string(i) + "\"}";
    // Bad lines on both sides of block boundaries and in both files.
    if (i == 1 || i == 2048 || i == 2049 || i == 5000 || i == 9000) {
      line = "{\"text\":\"no type " + std::to_string(i) + "\"}";
      bad.push_back(i);
      want.push_back("");
    } else {
      want.push_back(atproto::CidOfRecord(line)->ToString());
    }
    (i <= 4500 ? first : second) += line + "\n";
  }
  WriteFile(dir / "a.jsonl", first);
  WriteFile(dir / "b.jsonl", second);
  auto r = Atfill(dir, {"cid", (dir / "a.jsonl").string(), (dir / "b.jsonl").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(Lines(r.out), want);
  std::vector<std::string> want_errors;
  for (size_t n : bad)
    want_errors.push_back("error: line " + std::to_string(n) + ": a record must have a $type");
  EXPECT_EQ(Lines(r.err), want_errors);
}

TEST(CliTest, CarVerifiesAndPrintsRecordsAndTheSignature) {
  TempDir dir;
  std::ifstream key_file(kData + "/sample.key");
  std::string key;
  std::getline(key_file, key);
  auto r = Atfill(dir, {"car", kData + "/sample.car", "--key", key});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = Lines(r.out);
  EXPECT_EQ(out.size(), 6u);
  EXPECT_THAT(r.out,
              HasSubstr("{\"uri\":\"at://did:plc:atfillsampleaaaaaaaaaaaa/app.bsky.feed.post/"
                        "3lbqzb5ddb22a\",\"cid\":\"bafyrei"));
  EXPECT_THAT(r.out, HasSubstr("\"big\":9007199254740993"));
  EXPECT_THAT(r.err, HasSubstr("6 records"));
  EXPECT_THAT(r.err, HasSubstr("signature verified"));

  // Another key: the signature does not verify.
  auto wrong = Atfill(dir, {"car", kData + "/sample.car", "--key",
                            "did:key:zQ3shqwJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwc"});
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_THAT(wrong.err, HasSubstr("signature"));
}

TEST(CliTest, ATruncatedOrCorruptCarIsAnErrorNamingTheOffsetNeverACrash) {
  TempDir dir;
  std::ifstream in(kData + "/sample.car", std::ios::binary);
  const std::string car((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(car.size(), 200u);
  WriteFile(dir / "cut.car", car.substr(0, car.size() - 37));
  auto cut = Atfill(dir, {"car", (dir / "cut.car").string()});
  EXPECT_EQ(cut.exit_code, 1) << cut.err;
  EXPECT_EQ(cut.signal, 0);
  EXPECT_THAT(cut.err, HasSubstr("byte"));

  std::string flipped = car;
  flipped[car.size() / 2] = static_cast<char>(flipped[car.size() / 2] ^ 0x40);
  WriteFile(dir / "flip.car", flipped);
  auto bad = Atfill(dir, {"car", (dir / "flip.car").string()});
  EXPECT_EQ(bad.exit_code, 1) << bad.err;
  EXPECT_EQ(bad.signal, 0);
  EXPECT_THAT(bad.err, HasSubstr("error:"));
}

TEST(CliTest, SyntaxSaysValidOrWhyNot) {
  TempDir dir;
  auto r = Atfill(dir, {"syntax", "rkey", "self", "a/b", "3lbqzb5ddb22a"});
  EXPECT_EQ(r.exit_code, 1);
  const auto out = Lines(r.out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], "valid");
  EXPECT_THAT(out[1], ::testing::StartsWith("invalid: "));
  EXPECT_EQ(out[2], "valid");
  EXPECT_EQ(Atfill(dir, {"syntax", "tid", "3lbqzb5ddb22a"}).exit_code, 0);
  EXPECT_EQ(Atfill(dir, {"syntax", "colour", "x"}).exit_code, 2);
}

TEST(CliTest, EveryVerbHasHelpAndUnknownVerbsAreUsageErrors) {
  TempDir dir;
  for (const char* verb :
       {"demo", "ingest", "jobs", "job", "pause", "resume", "cancel", "cid", "car", "syntax"}) {
    auto r = Atfill(dir, {verb, "--help"});
    EXPECT_EQ(r.exit_code, 0) << verb;
    EXPECT_THAT(r.out, HasSubstr(std::string("usage: atfill ") + verb)) << verb;
  }
  auto r = Atfill(dir, {"frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown verb"));
}

// The version is the project's (CMake's project() version); the libraries' versions are those the
// process loads, the same this test process loads.
TEST(CliTest, VersionNamesTheBuildAndTheLibrariesItRunsWith) {
  TempDir dir;
  auto r = Atfill(dir, {"--version"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string build_type = ATFILL_EXPECTED_BUILD_TYPE;
  EXPECT_THAT(Lines(r.out),
              ::testing::ElementsAre(std::string("atfill ") + ATFILL_EXPECTED_VERSION,
                                     "build type: " + (build_type.empty() ? "none" : build_type),
                                     std::string("SQLite ") + sqlite3_libversion(),
                                     "RocksDB " + rocksdb::GetRocksVersionAsString(),
                                     std::string("oneTBB ") + TBB_runtime_version()));
}

TEST(CliTest, TheDemoRunsAndEveryStepAnswersAsExpected) {
  TempDir dir;
  auto r = Atfill(dir, {"demo"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("every step answered as expected"));
}

}  // namespace
}  // namespace atfill
