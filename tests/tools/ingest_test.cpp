// `atfill ingest` end to end, as a user runs it: real processes, real SQLite files, real SIGKILL.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <regex>

#include "atproto/json.hpp"
#include "sinks/sqlite_reader.hpp"
#include "tests/common/process.hpp"
#include "tests/common/raw_sqlite.hpp"
#include "tests/common/sqlite_fixtures.hpp"
#include "tests/common/test_util.hpp"
#include "tools/gen/event_gen.hpp"

namespace atfill {
namespace {

using testing::Child;
using ::testing::HasSubstr;
using testing::ProcessResult;
using testing::ReadFileOrDie;
using testing::RunProcess;
using testing::TempDir;
using testing::WaitUntil;
using testing::WriteFile;

const std::string kAtfill = ATFILL_BINARY;

// A working folder with a config writing state/ and out.db inside it.
struct Workspace {
  TempDir dir;
  std::string config;
  explicit Workspace(const std::string& extra = "") {
    config = (dir / "atfill.toml").string();
    WriteFile(config, "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"out.db\"\n" + extra);
  }
  std::string db() const { return (dir / "out.db").string(); }
  ProcessResult Atfill(std::vector<std::string> args) const {
    args.insert(args.begin(), kAtfill);
    return RunProcess(args, dir.path());
  }
};

std::string Describe(const ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + " signal " + std::to_string(r.signal) +
         "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

std::vector<sinks::RecordRow> Rows(const std::string& db) {
  auto rows = sinks::ReadAllRecords(db);
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  return rows.ok() ? *rows : std::vector<sinks::RecordRow>{};
}

// The table's content, without indexed_at (a time of writing, not of the data).
std::vector<std::string> Content(const std::string& db) {
  std::vector<std::string> out;
  for (const auto& r : Rows(db)) {
    out.push_back(r.uri + " " + r.cid + " " + r.rev + " " + r.created_at + " " + r.record);
  }
  return out;
}

std::string CommitLine(const std::string& did, const std::string& op, const std::string& rkey,
                       const std::string& record, const std::string& cid_override = "") {
  std::string line = "{\"did\":\"" + did +
                     "\",\"time_us\":1780000000000000,\"kind\":\"commit\","
                     "\"commit\":{\"rev\":\"3lbqzbaaaaa2a\",\"operation\":\"" +
                     op + "\",\"collection\":\"app.bsky.feed.post\",\"rkey\":\"" + rkey + "\"";
  if (!record.empty()) {
    const std::string cid =
        cid_override.empty() ? atproto::CidOfRecord(record)->ToString() : cid_override;
    line += ",\"record\":" + record + ",\"cid\":\"" + cid + "\"";
  }
  return line + "}}\n";
}

TEST(IngestTest, BadInputIsSkippedCountedAndLoggedWithItsLine) {
  Workspace ws;
  const std::string did = "did:plc:ewvi7nxzyoun6zhxrhs64oiz";
  const std::string post1 =
      R"({"$type":"app.bsky.feed.post","text":"one","createdAt":"2026-11-30T09:00:00.000Z"})";
  const std::string post2 = R"({"$type":"app.bsky.feed.post","text":"two"})";
  const std::string other = R"({"$type":"app.bsky.feed.post","text":"other"})";
  std::string text;
  text += CommitLine(did, "create", "3lbqzb5ddb22a", post1);  // 1 ok
  text += "this is not json\n";                               // 2
  text += CommitLine(did, "create", "3lbqzb5ddb22b", post2,   // 3 wrong CID
                     atproto::CidOfRecord(other)->ToString());
  text += CommitLine(did, "move", "3lbqzb5ddb22c", post2);                                    // 4
  text += CommitLine("did:PLC:nope", "create", "3lbqzb5ddb22d", post2);                       // 5
  text += CommitLine(did, "create", "a/b", post2);                                            // 6
  text += "{\"did\":\"" + did + "\",\"time_us\":1,\"kind\":\"identity\",\"identity\":{}}\n";  // 7
  text += CommitLine(did, "create", "3lbqzb5ddb22e", post2);  // 8 ok
  text +=
      R"({"did":")" + did +
      R"(","kind":"commit","commit":{"rev":"3lbqzbaaaaa2a","operation":"create","collection":"app.bsky.feed.post","rkey":"x1","record":{"$type":"a.b.c","n":0.5},"cid":"bafyreie5cvv4h45feadgeuwhbcutmh6t2ceseocckahdoe6uat64zmz454"}})"
      "\n";  // 9
  WriteFile(ws.dir / "events.jsonl", text);

  auto r = ws.Atfill({"ingest", ws.config, (ws.dir / "events.jsonl").string()});
  // 1: some input was invalid, the rest was processed (README, "Exit codes").
  ASSERT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("9 events read, 2 records written"));
  EXPECT_THAT(r.err, HasSubstr("6 errors"));
  const auto rows = Rows(ws.db());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].uri, "at://" + did + "/app.bsky.feed.post/3lbqzb5ddb22a");
  EXPECT_EQ(rows[0].record, post1);
  EXPECT_EQ(rows[0].created_at, "2026-11-30T09:00:00.000Z");
  EXPECT_EQ(rows[1].uri, "at://" + did + "/app.bsky.feed.post/3lbqzb5ddb22e");

  auto errors = ws.Atfill({"job", ws.config, "1", "--errors"});
  ASSERT_EQ(errors.exit_code, 0) << Describe(errors);
  EXPECT_THAT(errors.out, HasSubstr("bad_json"));
  EXPECT_THAT(errors.out, HasSubstr("line 2"));
  EXPECT_THAT(errors.out, HasSubstr("cid_mismatch"));
  EXPECT_THAT(errors.out, HasSubstr("at://" + did + "/app.bsky.feed.post/3lbqzb5ddb22b"));
  EXPECT_THAT(errors.out, HasSubstr("unknown_operation"));
  EXPECT_THAT(errors.out, HasSubstr("line 4"));
  EXPECT_THAT(errors.out, HasSubstr("invalid_did"));
  EXPECT_THAT(errors.out, HasSubstr("line 5"));
  EXPECT_THAT(errors.out, HasSubstr("invalid_rkey"));
  EXPECT_THAT(errors.out, HasSubstr("line 6"));
  EXPECT_THAT(errors.out, HasSubstr("bad_record"));
  EXPECT_THAT(errors.out, HasSubstr("not an integer"));

  auto json = ws.Atfill({"jobs", ws.config, "--json"});
  ASSERT_EQ(json.exit_code, 0) << Describe(json);
  EXPECT_THAT(json.out, HasSubstr("\"status\":\"completed\""));
  EXPECT_THAT(json.out, HasSubstr("\"failed_records\":6"));
  EXPECT_THAT(json.out, HasSubstr("\"started_by\":\"cli\""));
}

// [lexicons]: records are checked against the atproto lexicons on their way in; one that does not
// match is logged with its path and reason and not written, one of a collection no lexicon
// describes is written and counted.
TEST(IngestTest, RecordsThatDoNotMatchTheirLexiconAreLoggedAndNotWritten) {
  ATFILL_SHARED_PATH(lexicons, "lexicons");
  const std::string did = "did:plc:ewvi7nxzyoun6zhxrhs64oiz";
  auto line = [&](const std::string& collection, const std::string& rkey,
                  const std::string& record) {
    return "{\"did\":\"" + did +
           "\",\"time_us\":1780000000000000,\"kind\":\"commit\",\"commit\":{\"rev\":"
           "\"3lbqzbaaaaa2a\",\"operation\":\"create\",\"collection\":\"" +
           collection + "\",\"rkey\":\"" + rkey + "\",\"record\":" + record + ",\"cid\":\"" +
           atproto::CidOfRecord(record)->ToString() + "\"}}\n";
  };
  const std::string at = R"(,"createdAt":"2026-11-30T09:00:00.000Z")";
  std::string text;
  text += line("app.bsky.feed.post", "3lbqzb5ddb22a",
               R"({"$type":"app.bsky.feed.post","text":"fine")" + at + "}");
  text +=
      line("app.bsky.feed.post", "3lbqzb5ddb22b", R"({"$type":"app.bsky.feed.post","text":"x"})");
  text +=
      line("app.bsky.feed.post", "3lbqzb5ddb22c",
           R"({"$type":"app.bsky.feed.post","text":")" + std::string(301, 'a') + "\"" + at + "}");
  text += line(
      "app.bsky.feed.post", "3lbqzb5ddb22d",
      R"({"$type":"app.bsky.feed.post","text":"pic")" + at +
          R"(,"embed":{"$type":"app.bsky.embed.images","images":[{"alt":7,"image":)"
          R"({"$type":"blob","ref":{"$link":"bafkreiclp443lavogvhj3d2ob2cxbfuscni2k5jk7bebjzg7khl3esabwq"},)"
          R"("mimeType":"image/png","size":10}}]}})");
  text += line("app.bsky.actor.profile", "3lbqzb5ddb22e",
               R"({"$type":"app.bsky.actor.profile","displayName":"not self"})");
  text += line("com.example.thing", "3lbqzb5ddb22f", R"({"$type":"com.example.thing","n":1})");
  // A lexicon an account publishes: a record like any other, named in the atfill_lexicons view.
  const std::string published =
      R"({"$type":"com.atproto.lexicon.schema","lexicon":1,"id":"com.example.thing",)"
      R"("defs":{"main":{"type":"record","key":"tid","record":{"type":"object"}}}})";
  text += line("com.atproto.lexicon.schema", "com.example.thing", published);
  Workspace ws("[lexicons]\ndirs = [\"" + lexicons.string() + "\"]\n");
  WriteFile(ws.dir / "events.jsonl", text);
  auto r = ws.Atfill({"ingest", ws.config, (ws.dir / "events.jsonl").string()});
  ASSERT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("7 events read, 3 records written"));
  EXPECT_THAT(r.err, HasSubstr("lexicons: 2 valid, 4 invalid, 1 unknown"));
  const auto rows = Rows(ws.db());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].uri, "at://" + did + "/app.bsky.feed.post/3lbqzb5ddb22a");
  EXPECT_EQ(rows[1].uri, "at://" + did + "/com.atproto.lexicon.schema/com.example.thing");
  EXPECT_EQ(rows[2].uri, "at://" + did + "/com.example.thing/3lbqzb5ddb22f");
  testing::RawDb raw(ws.db());
  EXPECT_EQ(raw.Column("SELECT nsid || ' ' || did || ' ' || cid FROM atfill_lexicons"),
            std::vector<std::string>{"com.example.thing " + did + " " +
                                     atproto::CidOfRecord(published)->ToString()});
  EXPECT_EQ(raw.Column("SELECT document FROM atfill_lexicons"),
            std::vector<std::string>{published});

  auto errors = ws.Atfill({"job", ws.config, "1", "--errors"});
  ASSERT_EQ(errors.exit_code, 0) << Describe(errors);
  EXPECT_THAT(errors.out, HasSubstr("lexicon_invalid"));
  EXPECT_THAT(errors.out, HasSubstr("app.bsky.feed.post/3lbqzb5ddb22b"));
  EXPECT_THAT(errors.out, HasSubstr("createdAt: required field is missing"));
  EXPECT_THAT(errors.out, HasSubstr("text: string is longer than 300 graphemes (301)"));
  EXPECT_THAT(errors.out, HasSubstr("embed.images[0].alt: expected a string, got an integer"));
  EXPECT_THAT(errors.out, HasSubstr("record key \"3lbqzb5ddb22e\": must be \"self\""));

  // In log mode the same records are written, and still logged.
  Workspace logged("[lexicons]\ndirs = [\"" + lexicons.string() + "\"]\nmode = \"log\"\n");
  WriteFile(logged.dir / "events.jsonl", text);
  auto l = logged.Atfill({"ingest", logged.config, (logged.dir / "events.jsonl").string()});
  EXPECT_THAT(l.err, HasSubstr("7 records written")) << Describe(l);
  EXPECT_EQ(Rows(logged.db()).size(), 7u);

  // A lexicon that is not one stops the config, naming the file and the reason.
  std::filesystem::create_directories(ws.dir / "lex");
  WriteFile(ws.dir / "lex" / "bad.json",
            R"({"lexicon":1,"id":"com.example.bad","defs":{"main":{"type":"ref","ref":"#x"}}})");
  Workspace bad("[lexicons]\ndirs = [\"" + (ws.dir / "lex").string() + "\"]\n");
  auto b = bad.Atfill({"ingest", bad.config, (ws.dir / "events.jsonl").string()});
  EXPECT_EQ(b.exit_code, 2) << Describe(b);
  EXPECT_THAT(b.err, HasSubstr("bad.json: com.example.bad: defs.main: type ref is not allowed"));
  // use_network: a lexicon an account publishes validates the records of its NSID from then on
  // (here the next run: it is kept in the state), until its publisher deletes it.
  Workspace trusting("[lexicons]\nuse_network = true\n");
  const std::string needs_n =
      R"({"$type":"com.atproto.lexicon.schema","lexicon":1,"id":"com.example.thing","defs":)"
      R"({"main":{"type":"record","key":"tid","record":{"type":"object","required":["n"],)"
      R"("properties":{"n":{"type":"integer"}}}}}})";
  WriteFile(trusting.dir / "publish.jsonl",
            line("com.atproto.lexicon.schema", "com.example.thing", needs_n));
  auto publish =
      trusting.Atfill({"ingest", trusting.config, (trusting.dir / "publish.jsonl").string()});
  EXPECT_EQ(publish.exit_code, 0) << Describe(publish);
  WriteFile(
      trusting.dir / "things.jsonl",
      line("com.example.thing", "3lbqzb5ddb22g", R"({"$type":"com.example.thing","n":1})") +
          line("com.example.thing", "3lbqzb5ddb22h", R"({"$type":"com.example.thing","n":"one"})"));
  auto things =
      trusting.Atfill({"ingest", trusting.config, (trusting.dir / "things.jsonl").string()});
  EXPECT_EQ(things.exit_code, 1) << Describe(things);
  EXPECT_THAT(things.err, HasSubstr("lexicons: 1 valid, 1 invalid, 0 unknown")) << Describe(things);
  auto refused = trusting.Atfill({"job", trusting.config, "2", "--errors"});
  EXPECT_THAT(refused.out, HasSubstr("n: expected an integer, got a string"));
  // Another account's delete does not take it out; its publisher's does.
  const std::string other = "did:plc:vwzwgnygau7ed7b7wt5ux7y2";
  auto delete_line = [&](const std::string& who) {
    return "{\"did\":\"" + who +
           "\",\"time_us\":1780000000000001,\"kind\":\"commit\",\"commit\":{\"rev\":"
           "\"3lbqzbaaaaa3a\",\"operation\":\"delete\",\"collection\":"
           "\"com.atproto.lexicon.schema\",\"rkey\":\"com.example.thing\"}}\n";
  };
  WriteFile(trusting.dir / "other.jsonl", delete_line(other));
  EXPECT_EQ(trusting.Atfill({"ingest", trusting.config, (trusting.dir / "other.jsonl").string()})
                .exit_code,
            0);
  WriteFile(trusting.dir / "more.jsonl",
            line("com.example.thing", "3lbqzb5ddb22i", R"({"$type":"com.example.thing"})"));
  auto more = trusting.Atfill({"ingest", trusting.config, (trusting.dir / "more.jsonl").string()});
  EXPECT_THAT(more.err, HasSubstr("lexicons: 0 valid, 1 invalid, 0 unknown")) << Describe(more);
  WriteFile(trusting.dir / "withdraw.jsonl", delete_line(did));
  EXPECT_EQ(trusting.Atfill({"ingest", trusting.config, (trusting.dir / "withdraw.jsonl").string()})
                .exit_code,
            0);
  WriteFile(trusting.dir / "last.jsonl",
            line("com.example.thing", "3lbqzb5ddb22j", R"({"$type":"com.example.thing"})"));
  auto last = trusting.Atfill({"ingest", trusting.config, (trusting.dir / "last.jsonl").string()});
  EXPECT_EQ(last.exit_code, 0) << Describe(last);
  EXPECT_THAT(last.err, HasSubstr("1 records written")) << Describe(last);
  // Without use_network the published lexicon is only kept, never used.
  WriteFile(ws.dir / "things.jsonl", ReadFileOrDie(trusting.dir / "things.jsonl"));
  auto untrusted = ws.Atfill({"ingest", ws.config, (ws.dir / "things.jsonl").string()});
  EXPECT_EQ(untrusted.exit_code, 0) << Describe(untrusted);
}

// The README's exit codes, verb by verb, for the verbs that run or steer jobs (the inspection
// verbs' are in cli_test): 0 success, 1 some input invalid (the rest processed) or the request
// cannot be carried out, 2 bad command line or config, 3 a file or the state unreadable, 4 the
// job stopped before the end.
TEST(IngestTest, EveryJobVerbExitsWithTheCodeTheReadmeGives) {
  Workspace ws(
      "[live]\nhosts = [\"ws://127.0.0.1:1\"]\nidle_exit_ms = 300\n"
      "reconnect_base_ms = 20\nreconnect_max_ms = 50\n");
  const std::string did = "did:plc:ewvi7nxzyoun6zhxrhs64oiz";
  const std::string post = R"({"$type":"app.bsky.feed.post","text":"one"})";
  const std::string good = (ws.dir / "good.jsonl").string();
  const std::string bad = (ws.dir / "bad.jsonl").string();
  WriteFile(good, CommitLine(did, "create", "3lbqzb5ddb22a", post));
  WriteFile(bad, CommitLine(did, "create", "3lbqzb5ddb22b", post) + "not json\n");
  const std::string missing = (ws.dir / "missing.jsonl").string();
  Workspace typo("[engine]\nbatch_recs = 5\n");
  struct Case {
    std::vector<std::string> args;
    int exit_code;
  };
  const std::vector<Case> cases = {
      // ingest: job 1 (clean), job 2 (a bad line), then the usage and I/O failures.
      {{"ingest", ws.config, good}, 0},
      {{"ingest", ws.config, bad}, 1},
      {{"ingest", ws.config, bad}, 1},  // the same job again: completed, with its error
      {{"ingest", ws.config}, 2},
      {{"ingest", ws.config, good, "--fast"}, 2},
      {{"ingest", typo.config, good}, 2},
      {{"ingest", ws.config, missing}, 3},
      // jobs, job
      {{"jobs", ws.config}, 0},
      {{"jobs", ws.config, "--colour"}, 2},
      {{"job", ws.config, "1"}, 0},
      {{"job", ws.config, "2", "--errors"}, 0},
      {{"job", ws.config, "99"}, 2},
      {{"job", ws.config, "one"}, 2},
      // pause, resume, cancel: a finished job cannot be steered
      {{"pause", ws.config, "1"}, 1},
      {{"resume", ws.config, "1"}, 1},
      {{"cancel", ws.config, "2"}, 1},
      {{"pause", ws.config, "99"}, 2},
      // status, retry-failed, backfill, archive write
      {{"status", ws.config}, 0},
      {{"status"}, 2},
      {{"retry-failed", ws.config, "x"}, 2},
      {{"backfill", ws.config, "--mode", "sideways"}, 2},
      {{"archive", "write", ws.config, (ws.dir / "archive").string(), good}, 0},
      {{"archive", "write", ws.config, (ws.dir / "archive2").string(), bad}, 1},
      {{"archive", "write", ws.config, (ws.dir / "archive3").string(), missing}, 3},
      // run: the live job stops unfinished when its stream stays quiet (the host is refused)
      {{"run", ws.config}, 4},
      {{"run", ws.config, "--later"}, 2},
  };
  for (const Case& c : cases) {
    auto r = ws.Atfill(c.args);
    std::string shown;
    for (const auto& a : c.args) shown += a + " ";
    EXPECT_EQ(r.exit_code, c.exit_code) << shown << "\n" << Describe(r);
  }
}

TEST(IngestTest, ZstdAndPlainFilesGiveTheSameTable) {
  gen::EventGenOptions o;
  o.dids = 50;
  o.update_ratio = 0.2;
  o.delete_ratio = 0.1;
  Workspace plain, packed;
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, 5000, (plain.dir / "e.jsonl").string()).ok());
  ASSERT_TRUE(
      gen::EventGenerator::WriteFile(o, 5000, (packed.dir / "e.jsonl.zst").string(), true).ok());
  auto a = plain.Atfill({"ingest", plain.config, (plain.dir / "e.jsonl").string()});
  auto b = packed.Atfill({"ingest", packed.config, (packed.dir / "e.jsonl.zst").string()});
  ASSERT_EQ(a.exit_code, 0) << Describe(a);
  ASSERT_EQ(b.exit_code, 0) << Describe(b);
  const auto content = Content(plain.db());
  EXPECT_GT(content.size(), 1000u);
  EXPECT_EQ(content, Content(packed.db()));
}

TEST(IngestTest, DryRunWritesNothingAndSaysWhatItWouldHave) {
  gen::EventGenOptions o;
  o.dids = 20;
  o.update_ratio = 0;
  o.delete_ratio = 0;
  Workspace ws;
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, 2000, (ws.dir / "e.jsonl").string()).ok());
  auto r = ws.Atfill({"ingest", ws.config, (ws.dir / "e.jsonl").string(), "--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("2,000 records written (dry run: nothing was written"));
  EXPECT_FALSE(std::filesystem::exists(ws.db()));
  auto job = ws.Atfill({"job", ws.config, "1", "--json"});
  EXPECT_THAT(job.out, HasSubstr("\"dry_run\":\"true\""));
}

// A database written by an older atfill is upgraded before the job's first batch; the job waits
// for it (a large table's upgrade takes minutes), and says so rather than showing a job at 0.
TEST(IngestTest, AnUpgradeOfTheDatabaseIsSaidBeforeTheJobWaitsForIt) {
  Workspace ws;
  {
    testing::RawDb db(ws.db());
    ASSERT_EQ(db.Exec(testing::FrozenSchemaV1()), SQLITE_OK) << sqlite3_errmsg(db.get());
  }
  WriteFile((ws.dir / "e.jsonl").string(),
            CommitLine("did:plc:ewvi7nxzyoun6zhxrhs64oiz", "create", "3lbqzb5ddb22a",
                       R"({"$type":"app.bsky.feed.post","text":"one"})"));
  auto r = ws.Atfill({"ingest", ws.config, (ws.dir / "e.jsonl").string()});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const size_t upgrading = r.err.find("atfill: sqlite: upgrading ");
  const size_t upgraded = r.err.find("atfill: sqlite: upgraded ");
  ASSERT_NE(upgrading, std::string::npos) << r.err;
  ASSERT_NE(upgraded, std::string::npos) << r.err;
  EXPECT_LT(upgrading, upgraded);
  EXPECT_THAT(r.err, HasSubstr("out.db from schema version 1 to " +
                               std::to_string(sinks::kSqliteSchemaVersion) +
                               " (no record rows), in one transaction\n"));
  EXPECT_EQ(Rows(ws.db()).size(), 1u);
  // The next run finds the tables current and says nothing of them.
  auto again = ws.Atfill({"ingest", ws.config, (ws.dir / "e.jsonl").string()});
  ASSERT_EQ(again.exit_code, 0) << Describe(again);
  EXPECT_THAT(again.err, ::testing::Not(HasSubstr("atfill: sqlite: upgrad")));
}

TEST(IngestTest, ConfigErrorsNameTheKeyAndLine) {
  Workspace ws("[engine]\nbatch_recs = 10\n");
  WriteFile(ws.dir / "e.jsonl", "");
  auto r = ws.Atfill({"ingest", ws.config, (ws.dir / "e.jsonl").string()});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("atfill.toml:6: unknown key 'engine.batch_recs'"));

  Workspace typed("[engine]\nbatch_records = \"many\"\n");
  r = typed.Atfill({"ingest", typed.config, (ws.dir / "e.jsonl").string()});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("atfill.toml:6: engine.batch_records must be an integer"));

  Workspace range("[engine]\nbatch_records = 0\n");
  r = range.Atfill({"ingest", range.config, (ws.dir / "e.jsonl").string()});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("atfill.toml:6: engine.batch_records = 0 is out of range"));

  Workspace wal("[files]\nsqlite_wal_mb = 0\n");
  r = wal.Atfill({"ingest", wal.config, (ws.dir / "e.jsonl").string()});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("atfill.toml:6: files.sqlite_wal_mb = 0 is out of range"));
}

TEST(IngestTest, BatchAuditTrailListsEveryBatch) {
  gen::EventGenOptions o;
  o.dids = 20;
  Workspace ws("[jobs]\nrecord_batches = true\n[files]\nbatch_records = 500\n");
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, 3000, (ws.dir / "e.jsonl").string()).ok());
  auto r = ws.Atfill({"ingest", ws.config, (ws.dir / "e.jsonl").string()});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  auto b = ws.Atfill({"job", ws.config, "1", "--json", "--batches"});
  ASSERT_EQ(b.exit_code, 0) << Describe(b);
  // 3,000 events in batches of at least 500: between 2 and 6 entries, the last ending at line 3000.
  size_t batches = 0;
  for (size_t at = b.out.find("\"batch\":"); at != std::string::npos;
       at = b.out.find("\"batch\":", at + 1)) {
    ++batches;
  }
  EXPECT_GE(batches, 2u);
  EXPECT_LE(batches, 6u);
  EXPECT_THAT(b.out, HasSubstr(":3000\""));
}

// The events of each batch of job 1, from `atfill job --batches` in `ws`.
std::vector<uint64_t> BatchCounts(const Workspace& ws) {
  auto b = ws.Atfill({"job", ws.config, "1", "--json", "--batches"});
  EXPECT_EQ(b.exit_code, 0) << Describe(b);
  std::vector<uint64_t> counts;
  static const std::regex kEntry(R"re("batch":\d+,"from":"[^"]*","to":"[^"]*","count":(\d+))re");
  for (std::sregex_iterator it(b.out.begin(), b.out.end(), kEntry), end; it != end; ++it) {
    counts.push_back(std::stoull((*it)[1].str()));
  }
  return counts;
}

// An event file is a backlog: `atfill ingest` writes it in [files]' batches (up to 50,000
// events by default, fewer and larger commits), not in [engine]'s, and [files] batch_records
// sets them.
TEST(IngestTest, AnEventFileIsWrittenInBacklogBatches) {
  gen::EventGenOptions o;
  o.dids = 2000;
  constexpr uint64_t kEvents = 60'000;
  TempDir data;
  const std::string events = (data / "e.jsonl").string();
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, kEvents, events).ok());
  auto sum = [](const std::vector<uint64_t>& v) {
    return std::accumulate(v.begin(), v.end(), 0ull);
  };

  // [engine]'s limit does not apply to an ingest.
  Workspace defaults("[jobs]\nrecord_batches = true\n[engine]\nbatch_records = 500\n");
  auto r = defaults.Atfill({"ingest", defaults.config, events});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const std::vector<uint64_t> large = BatchCounts(defaults);
  ASSERT_FALSE(large.empty());
  EXPECT_EQ(sum(large), kEvents);
  // More than [engine]'s default of 5,000 in the largest (its batch_ms of 1 s would have to pass
  // before 5,000 events were read for it not to be). A batch closes at the chunk that reaches
  // the limit, so it holds at most one chunk ([files] chunk_lines, 1,024) more.
  constexpr uint64_t kChunk = 1024;
  EXPECT_GT(*std::max_element(large.begin(), large.end()), 5'000u);
  EXPECT_LE(*std::max_element(large.begin(), large.end()), 50'000u + kChunk);

  Workspace set("[jobs]\nrecord_batches = true\n[files]\nbatch_records = 7000\n");
  r = set.Atfill({"ingest", set.config, events});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const std::vector<uint64_t> small = BatchCounts(set);
  EXPECT_EQ(sum(small), kEvents);
  EXPECT_GE(small.size(), kEvents / (7'000u + kChunk));
  EXPECT_LE(*std::max_element(small.begin(), small.end()), 7'000u + kChunk);
  const auto content = Content(set.db());
  EXPECT_FALSE(content.empty());
  EXPECT_EQ(content, Content(defaults.db()));
}

// The row count of the table at `db` (0 while it does not exist yet). WAL readers never block
// the writer.
uint64_t RowCount(const std::string& db) {
  if (auto reader = sinks::SqliteReader::Open(db); reader.ok()) {
    if (auto n = (*reader)->Count(); n.ok()) return *n;
  }
  return 0;
}

// Waits until the child has opened the state (its OWNER file exists); false when it exited first
// or took over 10 s.
bool WaitForState(Child& child, const std::filesystem::path& state_dir) {
  const auto owner = state_dir / "OWNER";
  return testing::WaitUntil([&] { return std::filesystem::exists(owner) || !child.Running(); },
                            std::chrono::seconds(10)) &&
         std::filesystem::exists(owner);
}

// Waits until the child's table holds at least `rows` rows; false when it exited first or took
// over 60 s.
bool WaitForRows(Child& child, const std::string& db, uint64_t rows) {
  bool reached = false;
  testing::WaitUntil(
      [&] {
        reached = RowCount(db) >= rows;
        return reached || !child.Running();
      },
      std::chrono::seconds(60));
  return reached;
}

TEST(IngestTest, ASecondProcessOnTheSameStateFailsAtOnceNamingTheHolder) {
  gen::EventGenOptions o;
  o.dids = 200;
  Workspace ws;
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, 400'000, (ws.dir / "e.jsonl").string()).ok());
  Child first({kAtfill, "ingest", ws.config, (ws.dir / "e.jsonl").string()}, ws.dir.path());
  ASSERT_TRUE(WaitForState(first, ws.dir / "state"));
  auto second = ws.Atfill({"ingest", ws.config, (ws.dir / "e.jsonl").string()});
  const bool still_running = first.Running();
  EXPECT_EQ(second.exit_code, 3) << Describe(second);
  if (still_running) {
    EXPECT_THAT(second.err, HasSubstr("pid " + std::to_string(first.pid())));
  }
  auto listed = ws.Atfill({"jobs", ws.config});
  EXPECT_EQ(listed.exit_code, 0) << Describe(listed);
  EXPECT_THAT(listed.out, HasSubstr("ingest"));
  EXPECT_EQ(first.Wait().exit_code, 0);
}

// A request left from an earlier process (written before this one started) is not obeyed; one
// written once the process holds the state is, even before its job starts (the test above).
TEST(IngestTest, ARequestLeftByAnEarlierProcessIsIgnored) {
  gen::EventGenOptions o;
  o.dids = 20;
  Workspace ws;
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, 2'000, (ws.dir / "e.jsonl").string()).ok());
  const auto stale = ws.dir / "state" / "requests" / "1.pause";
  std::filesystem::create_directories(stale.parent_path());
  WriteFile(stale.string(), "pause\n");
  std::filesystem::last_write_time(
      stale, std::filesystem::file_time_type::clock::now() - std::chrono::hours(1));
  auto run = ws.Atfill({"ingest", ws.config, (ws.dir / "e.jsonl").string()});
  EXPECT_EQ(run.exit_code, 0) << Describe(run);
  EXPECT_FALSE(std::filesystem::exists(stale));
  auto shown = ws.Atfill({"job", ws.config, "1", "--json"});
  EXPECT_THAT(shown.out, HasSubstr("\"status\":\"completed\""));
}

TEST(IngestTest, PauseFromAnotherProcessThenResumeReadsEveryEventOnce) {
  gen::EventGenOptions o;
  o.dids = 500;
  Workspace ws;
  const uint64_t kEvents = 300'000;
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, kEvents, (ws.dir / "e.jsonl").string()).ok());
  Child child({kAtfill, "ingest", ws.config, (ws.dir / "e.jsonl").string()}, ws.dir.path());
  ASSERT_TRUE(WaitForState(child, ws.dir / "state"));
  auto pause = ws.Atfill({"pause", ws.config, "1"});
  ASSERT_EQ(pause.exit_code, 0) << Describe(pause);
  auto first = child.Wait();
  if (first.exit_code == 0) {
    GTEST_FAIL() << "the ingest finished before the pause request reached it; "
                    "raise kEvents\n"
                 << Describe(first);
  }
  ASSERT_EQ(first.exit_code, 4) << Describe(first);
  auto shown = ws.Atfill({"job", ws.config, "1", "--json"});
  EXPECT_THAT(shown.out, HasSubstr("\"status\":\"paused\""));
  auto resumed = ws.Atfill({"resume", ws.config, "1"});
  ASSERT_EQ(resumed.exit_code, 0) << Describe(resumed);
  shown = ws.Atfill({"job", ws.config, "1", "--json"});
  EXPECT_THAT(shown.out, HasSubstr("\"status\":\"completed\""));
  // Each line was read by exactly one of the two runs.
  EXPECT_THAT(shown.out, HasSubstr("\"events_read\":" + std::to_string(kEvents) + ","));
}

TEST(IngestCrashTest, FiveKillsAtRandomPointsConvergeToTheUninterruptedTable) {
  gen::EventGenOptions o;
  o.dids = 2000;
  o.update_ratio = 0.15;
  o.delete_ratio = 0.08;
  o.account_ratio = 0.001;
  o.seed = 42;
  TempDir data;
  const std::string events = (data / "events.jsonl").string();
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, 200'000, events).ok());

  Workspace reference("[files]\nbatch_records = 2000\n");
  auto ref = reference.Atfill({"ingest", reference.config, events});
  ASSERT_EQ(ref.exit_code, 0) << Describe(ref);
  const auto want = Content(reference.db());
  ASSERT_GT(want.size(), 100'000u);

  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("ATFILL_TEST_SEED")) seed = std::strtoull(s, nullptr, 10);
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("ATFILL_TEST_SEED=" + std::to_string(seed));
  // Five kill points, as row counts the crashed table reaches, spread over the whole run.
  std::vector<uint64_t> targets;
  for (int i = 0; i < 5; ++i) {
    targets.push_back(
        std::uniform_int_distribution<uint64_t>(want.size() / 20, want.size() * 9 / 10)(rng));
  }
  std::sort(targets.begin(), targets.end());

  Workspace crashed("[files]\nbatch_records = 2000\n");
  int kills = 0;
  for (uint64_t target : targets) {
    Child child({kAtfill, "ingest", crashed.config, events}, crashed.dir.path());
    WaitForRows(child, crashed.db(), target);
    if (child.Kill(SIGKILL)) {
      auto r = child.Wait();
      EXPECT_EQ(r.signal, SIGKILL) << Describe(r);
      ++kills;
    } else {
      auto r = child.Wait();
      ASSERT_EQ(r.exit_code, 0) << Describe(r);
    }
  }
  EXPECT_EQ(kills, 5) << "a run finished before its kill point";
  auto last = crashed.Atfill({"ingest", crashed.config, events});
  ASSERT_EQ(last.exit_code, 0) << Describe(last);

  const auto got = Content(crashed.db());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "row " << i;
}

}  // namespace
}  // namespace atfill

namespace atfill {
namespace {

TEST(EmbedExampleTest, BuildsAGraphInAFewLinesAndRunsIt) {
  gen::EventGenOptions o;
  o.dids = 30;
  o.bad_ratio = 0.01;
  TempDir dir;
  const std::string events = (dir / "e.jsonl").string();
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, 3000, events).ok());
  auto r =
      RunProcess({EMBED_BATCH_BINARY, events, (dir / "out.db").string(), (dir / "state").string()},
                 dir.path());
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("job 1 completed: 3000 events"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr(" 0 failed")));  // the bad lines were counted
  auto rows = sinks::ReadAllRecords((dir / "out.db").string());
  ASSERT_TRUE(rows.ok());
  EXPECT_GT(rows->size(), 2000u);
}

// The example and the launcher on one event file write equal tables: the embedded graph takes
// the launcher's stages in the launcher's order, so its write rules are the same. The file holds
// updates, deletes, account events and bad lines, and by hand a stale update (an older rev after a
// newer one) and a create replayed after its record's delete, which only the ingest guard refuses.
TEST(EmbedExampleTest, WritesTheSameTableAsAtfillIngestOnOneEventFile) {
  gen::EventGenOptions o;
  o.dids = 40;
  o.update_ratio = 0.2;
  o.delete_ratio = 0.1;
  o.account_ratio = 0.01;
  o.bad_ratio = 0.01;
  o.seed = 23;
  TempDir dir;
  const std::string events = (dir / "e.jsonl").string();
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, 5000, events).ok());
  const std::string did = "did:plc:embedcompare000000000";
  auto line = [&](const std::string& rev, const std::string& op, const std::string& text) {
    std::string l = "{\"did\":\"" + did +
                    "\",\"time_us\":1790000000000000,\"kind\":\"commit\",\"commit\":{\"rev\":\"" +
                    rev + "\",\"operation\":\"" + op +
                    "\",\"collection\":\"app.bsky.feed.post\",\"rkey\":\"3lbqzbaaaaa2a\"";
    if (!text.empty()) {
      const std::string record = "{\"$type\":\"app.bsky.feed.post\",\"text\":\"" + text +
                                 "\",\"createdAt\":\"2026-01-01T00:00:00.000Z\"}";
      l +=
          ",\"record\":" + record + ",\"cid\":\"" + atproto::CidOfRecord(record)->ToString() + "\"";
    }
    return l + "}}\n";
  };
  std::string extra = line("3lbqzbaaaab2a", "create", "kept") +
                      line("3lbqzbaaaaa2a", "update", "stale") +  // older rev: refused
                      line("3lbqzbaaaac2a", "create", "second") +
                      line("3lbqzbaaaad2a", "delete", "") +
                      line("3lbqzbaaaac2a", "create", "second");  // before the delete: refused
  {
    std::string text = testing::ReadFileOrDie(events);
    WriteFile(events, text + extra);
  }

  TempDir embedded;
  auto r = RunProcess(
      {EMBED_BATCH_BINARY, events, (embedded / "out.db").string(), (embedded / "state").string()},
      embedded.path());
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  Workspace launcher;
  auto cli = launcher.Atfill({"ingest", launcher.config, events});
  ASSERT_EQ(cli.exit_code, 1) << Describe(cli);  // 1: the bad lines were skipped and logged

  const auto want = Content(launcher.db());
  const auto got = Content((embedded / "out.db").string());
  ASSERT_GT(want.size(), 1000u);
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    ASSERT_EQ(got[i], want[i]) << "row " << i;
  }
  // The hand-written record ended deleted in both (the refused create did not bring it back).
  for (const auto& row : want) EXPECT_THAT(row, ::testing::Not(HasSubstr(did)));
}

// A program that embeds the library's components (examples/embed_config.cpp) runs the launcher's
// job kinds from the launcher's config: the same config file (here with a record script that drops
// the likes of even-numbered accounts, which only the config brings in) gives the same table as
// `atfill ingest`, and a second run resumes nothing new.
TEST(EmbedExampleTest, TheLaunchersJobKindsFromTheLibraryWriteTheSameTable) {
  gen::EventGenOptions o;
  o.dids = 30;
  o.update_ratio = 0.1;
  o.delete_ratio = 0.05;
  o.bad_ratio = 0.01;
  o.seed = 29;
  TempDir input;
  const std::string events = (input / "e.jsonl").string();
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, 3000, events).ok());
  const std::string script =
      "function record(e)\n"
      "  if tonumber(e.did:sub(-1)) ~= nil and tonumber(e.did:sub(-1)) % 2 == 0 then\n"
      "    return nil\n"
      "  end\n"
      "  return e\n"
      "end\n";
  const std::string extra = "[scripts.collections]\n\"app.bsky.feed.like\" = \"like.lua\"\n";
  Workspace launcher(extra), embedded(extra);
  WriteFile(launcher.dir / "like.lua", script);
  WriteFile(embedded.dir / "like.lua", script);

  auto cli = launcher.Atfill({"ingest", launcher.config, events});
  ASSERT_EQ(cli.exit_code, 1) << Describe(cli);  // 1: the bad lines were skipped and logged
  auto r = RunProcess({EMBED_CONFIG_BINARY, embedded.config, events}, embedded.dir.path());
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("job 1 completed: 3000 events"));

  const auto want = Content(launcher.db());
  const auto got = Content(embedded.db());
  ASSERT_GT(want.size(), 500u);
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    ASSERT_EQ(got[i], want[i]) << "row " << i;
  }
  // The script ran in both: no like of an even-numbered account was written.
  size_t likes = 0;
  for (const auto& row : Rows(embedded.db())) {
    if (row.collection != "app.bsky.feed.like") continue;
    ++likes;
    const char last = row.did.back();
    EXPECT_FALSE(last >= '0' && last <= '9' && (last - '0') % 2 == 0) << row.uri;
  }
  EXPECT_GT(likes, 0u);
  // The same files again: the finished job is found, nothing new is read.
  auto again = RunProcess({EMBED_CONFIG_BINARY, embedded.config, events}, embedded.dir.path());
  EXPECT_EQ(again.exit_code, 0) << Describe(again);
  EXPECT_EQ(Content(embedded.db()), got);
}

}  // namespace
}  // namespace atfill

namespace atfill {
namespace {

TEST(IngestTest, AFullErrorLogStopsTheJobWithThatReason) {
  Workspace ws("[jobs]\nerror_log_cap = 5\n[files]\nbatch_records = 10\n");
  std::string text;
  for (int i = 0; i < 50; ++i) text += "not json " + std::to_string(i) + "\n";
  WriteFile(ws.dir / "bad.jsonl", text);
  auto r = ws.Atfill({"ingest", ws.config, (ws.dir / "bad.jsonl").string()});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("error_cap"));
  auto job = ws.Atfill({"job", ws.config, "1", "--json"});
  EXPECT_THAT(job.out, HasSubstr("\"status\":\"failed\""));
  EXPECT_THAT(job.out, HasSubstr("\"code\":\"error_cap\""));
  EXPECT_THAT(job.out, HasSubstr("\"bad_json\":"));
}

TEST(IngestTest, CancelWithNoProcessRunningEndsTheJobForGood) {
  gen::EventGenOptions o;
  o.dids = 200;
  Workspace ws;
  const std::string events = (ws.dir / "e.jsonl").string();
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, 300'000, events).ok());
  // A job left unfinished by a killed process.
  Child child({kAtfill, "ingest", ws.config, events}, ws.dir.path());
  // Killed once its job has committed a batch.
  ASSERT_TRUE(WaitForRows(child, ws.db(), 1)) << "the ingest ended before it wrote a row";
  ASSERT_TRUE(child.Kill(SIGKILL)) << "the ingest finished before it could be killed";
  child.Wait();

  auto cancel = ws.Atfill({"cancel", ws.config, "1"});
  ASSERT_EQ(cancel.exit_code, 0) << Describe(cancel);
  EXPECT_THAT(cancel.out, HasSubstr("job 1 cancelled"));
  auto shown = ws.Atfill({"job", ws.config, "1", "--json"});
  EXPECT_THAT(shown.out, HasSubstr("\"status\":\"cancelled\""));
  auto resume = ws.Atfill({"resume", ws.config, "1"});
  EXPECT_EQ(resume.exit_code, 1) << Describe(resume);
  EXPECT_THAT(resume.err, HasSubstr("nothing to resume"));
  auto again = ws.Atfill({"cancel", ws.config, "1"});
  EXPECT_EQ(again.exit_code, 1) << Describe(again);
  EXPECT_THAT(again.err, HasSubstr("already cancelled"));
  // The same command now starts a new job instead of resuming the cancelled one.
  auto rerun = ws.Atfill({"ingest", ws.config, events});
  EXPECT_EQ(rerun.exit_code, 0) << Describe(rerun);
  EXPECT_THAT(rerun.err, HasSubstr("job 2 reads 1 file(s)"));
  auto unknown = ws.Atfill({"pause", ws.config, "7"});
  EXPECT_EQ(unknown.exit_code, 2) << Describe(unknown);
  EXPECT_THAT(unknown.err, HasSubstr("7"));
}

}  // namespace
}  // namespace atfill

namespace atfill {
namespace {

TEST(IngestTest, CtrlCPausesAtTheNextCheckpointAndTheSameCommandResumes) {
  gen::EventGenOptions o;
  o.dids = 300;
  Workspace ws;
  const uint64_t kEvents = 300'000;
  const std::string events = (ws.dir / "e.jsonl").string();
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, kEvents, events).ok());
  Child child({kAtfill, "ingest", ws.config, events}, ws.dir.path());
  ASSERT_TRUE(WaitForState(child, ws.dir / "state"));
  ASSERT_TRUE(child.Kill(SIGINT)) << "the ingest finished before the interrupt";
  auto first = child.Wait();
  ASSERT_EQ(first.exit_code, 4) << Describe(first);
  EXPECT_THAT(first.err, HasSubstr("paused"));
  auto again = ws.Atfill({"ingest", ws.config, events});
  ASSERT_EQ(again.exit_code, 0) << Describe(again);
  EXPECT_THAT(again.err, HasSubstr("resuming job 1 (paused)"));
  auto shown = ws.Atfill({"job", ws.config, "1", "--json"});
  EXPECT_THAT(shown.out, HasSubstr("\"events_read\":" + std::to_string(kEvents) + ","));
}

}  // namespace
}  // namespace atfill

namespace atfill {
namespace {

// A tmpfs of a few MiB mounted for one test, so that a run really meets a full disk: the state
// and the database sit in it, the config, the input and the process's output outside. Mounting
// needs root, as tools/test and CI run; without it the test fails, saying so.
class SmallFileSystem {
 public:
  SmallFileSystem(const std::filesystem::path& at, int mib) : at_(at) {
    std::filesystem::create_directories(at);
    const std::string size = "size=" + std::to_string(mib) + "m";
    if (::mount("tmpfs", at.c_str(), "tmpfs", 0, size.c_str()) == 0) {
      mounted_ = true;
    } else {
      error_ = std::string("mount -t tmpfs ") + at.string() + ": " + std::strerror(errno);
    }
  }
  ~SmallFileSystem() {
    if (mounted_) ::umount2(at_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  bool Grow(int mib) {
    const std::string size = "size=" + std::to_string(mib) + "m";
    return ::mount("tmpfs", at_.c_str(), "tmpfs", MS_REMOUNT, size.c_str()) == 0;
  }
  // Less than 64 KiB left: every page SQLite or RocksDB asks for next is refused.
  bool Full() const {
    struct statvfs s {};
    return ::statvfs(at_.c_str(), &s) == 0 && s.f_bavail * s.f_frsize < (64u << 10);
  }

 private:
  std::filesystem::path at_;
  bool mounted_ = false;
  std::string error_;
};

// 150,000 events of 2,000 accounts interleaved, and the table an uninterrupted ingest makes of
// them: enough to fill a 24 MiB disk.
struct DiskFillingInput {
  TempDir dir;
  std::string events = (dir / "e.jsonl").string();
  std::vector<std::string> expected;
};
void MakeDiskFillingInput(DiskFillingInput* in) {
  gen::EventGenOptions o;
  o.dids = 2000;
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, 150'000, in->events).ok());
  Workspace reference;
  auto uninterrupted = reference.Atfill({"ingest", reference.config, in->events});
  ASSERT_EQ(uninterrupted.exit_code, 0) << Describe(uninterrupted);
  in->expected = Content(reference.db());
  ASSERT_GT(in->expected.size(), 100'000u);
}

// `ws`'s config with the state and the database on `disk` (and `extra` sections).
void ConfigOnDisk(const Workspace& ws, const std::filesystem::path& disk,
                  const std::string& extra = "") {
  WriteFile(ws.config, "[state]\ndir = \"" + (disk / "state").string() +
                           "\"\n[sink.sqlite]\npath = \"" + (disk / "out.db").string() + "\"\n" +
                           extra);
}

TEST(IngestTest, AFullDiskIsSaidAtOnceWaitedOutAndLosesNothing) {
  DiskFillingInput in;
  ASSERT_NO_FATAL_FAILURE(MakeDiskFillingInput(&in));
  const std::string& events = in.events;
  const auto& expected = in.expected;

  Workspace ws;
  const std::filesystem::path disk = ws.dir / "disk";
  SmallFileSystem fs(disk, 24);
  ASSERT_TRUE(fs.mounted()) << fs.error();
  ConfigOnDisk(ws, disk, "[progress]\ninterval_s = 0.2\n");
  Child child({kAtfill, "ingest", ws.config, events}, ws.dir.path());
  ASSERT_TRUE(WaitUntil([&] { return fs.Full() || !child.Running(); }, std::chrono::seconds(120)));
  ASSERT_TRUE(child.Running()) << "the ingest ended before the disk was full:\n"
                               << ReadFileOrDie(child.err_path());
  // Said within seconds of the disk filling: the job, the sink's path and SQLite's reason, the
  // attempts and the next try.
  const auto said = [&] {
    return ReadFileOrDie(child.err_path()).find("the sink refuses batch") != std::string::npos;
  };
  ASSERT_TRUE(WaitUntil(said, std::chrono::seconds(10))) << ReadFileOrDie(child.err_path());
  std::string err = ReadFileOrDie(child.err_path());
  EXPECT_THAT(err, HasSubstr("atfill: job 1: the sink refuses batch "));
  EXPECT_THAT(err, HasSubstr((disk / "out.db").string()));
  EXPECT_THAT(err, HasSubstr("database or disk is full"));
  EXPECT_THAT(err, ::testing::ContainsRegex("[0-9]+ attempt\\(s\\), the next in [0-9.]+ s"));
  // The progress line shows the wait.
  ASSERT_TRUE(WaitUntil(
      [&] { return ReadFileOrDie(child.err_path()).find("| waiting ") != std::string::npos; },
      std::chrono::seconds(10)));
  // A verb that only reads works on the full disk and writes nothing there.
  auto shown = ws.Atfill({"job", ws.config, "1"});
  EXPECT_EQ(shown.exit_code, 0) << Describe(shown);
  EXPECT_EQ(shown.signal, 0) << Describe(shown);
  EXPECT_THAT(shown.out, HasSubstr("job 1 (ingest)"));
  auto listed = ws.Atfill({"jobs", ws.config});
  EXPECT_EQ(listed.exit_code, 0) << Describe(listed);
  EXPECT_THAT(listed.out, HasSubstr("read-only view"));
  ASSERT_TRUE(child.Running()) << ReadFileOrDie(child.err_path());

  // Space comes back: the same run goes on and ends with the uninterrupted table.
  ASSERT_TRUE(fs.Grow(1024));
  auto done = child.Wait();
  ASSERT_EQ(done.exit_code, 0) << Describe(done);
  EXPECT_THAT(done.err, HasSubstr("atfill: job 1: the sink took batch "));
  EXPECT_THAT(done.err, HasSubstr("150,000 events read"));
  EXPECT_EQ(Content((disk / "out.db").string()), expected);
}

// Ctrl-C while the sink refuses a batch (the disk is full) pauses the job rather than failing
// it: the refused batch is not committed, and the same command resumes once space is back and
// ends with the uninterrupted table.
TEST(IngestTest, CtrlCWhileTheSinkRefusesABatchPausesTheJobAndTheResumeLosesNothing) {
  DiskFillingInput in;
  ASSERT_NO_FATAL_FAILURE(MakeDiskFillingInput(&in));
  const std::string& events = in.events;

  Workspace ws;
  const std::filesystem::path disk = ws.dir / "disk";
  SmallFileSystem fs(disk, 24);
  ASSERT_TRUE(fs.mounted()) << fs.error();
  ConfigOnDisk(ws, disk);
  Child child({kAtfill, "ingest", ws.config, events}, ws.dir.path());
  const auto said = [&] {
    return ReadFileOrDie(child.err_path()).find("the sink refuses batch") != std::string::npos;
  };
  ASSERT_TRUE(WaitUntil([&] { return fs.Full() || !child.Running(); }, std::chrono::seconds(120)));
  ASSERT_TRUE(child.Running()) << "the ingest ended before the disk was full:\n"
                               << ReadFileOrDie(child.err_path());
  ASSERT_TRUE(WaitUntil(said, std::chrono::seconds(10))) << ReadFileOrDie(child.err_path());
  ASSERT_TRUE(child.Kill(SIGINT));
  auto first = child.Wait();
  EXPECT_EQ(first.exit_code, 4) << Describe(first);
  EXPECT_THAT(first.err, HasSubstr("paused"));
  EXPECT_THAT(first.err, ::testing::Not(HasSubstr("failed batch")));
  ASSERT_TRUE(fs.Grow(1024));
  auto shown = ws.Atfill({"job", ws.config, "1", "--json"});
  EXPECT_THAT(shown.out, HasSubstr("\"status\":\"paused\"")) << Describe(shown);
  auto again = ws.Atfill({"ingest", ws.config, events});
  ASSERT_EQ(again.exit_code, 0) << Describe(again);
  EXPECT_THAT(again.err, HasSubstr("resuming job 1 (paused)"));
  EXPECT_EQ(Content((disk / "out.db").string()), in.expected);
}

// A verb that writes the state, started on a full disk, says so and waits for space rather than
// opening RocksDB there (which aborts the process), then goes on once there is room.
TEST(IngestTest, AVerbStartedOnAFullDiskSaysSoAndWaitsForSpaceInsteadOfAborting) {
  gen::EventGenOptions o;
  o.dids = 100;
  TempDir inputs;
  const std::string first = (inputs / "a.jsonl").string();
  const std::string second = (inputs / "b.jsonl").string();
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, 2000, first).ok());
  o.seed = 99;
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, 2000, second).ok());
  Workspace ws;
  const std::filesystem::path disk = ws.dir / "disk";
  SmallFileSystem fs(disk, 24);
  ASSERT_TRUE(fs.mounted()) << fs.error();
  ConfigOnDisk(ws, disk);
  auto made = ws.Atfill({"ingest", ws.config, first});
  ASSERT_EQ(made.exit_code, 0) << Describe(made);
  {
    // Whatever room is left, taken.
    std::ofstream fill(disk / "fill", std::ios::binary);
    const std::string block(1 << 16, 'x');
    while (fill.write(block.data(), static_cast<std::streamsize>(block.size())) && !fs.Full()) {
    }
  }
  ASSERT_TRUE(fs.Full());
  Child child({kAtfill, "ingest", ws.config, second}, ws.dir.path());
  const auto said = [&] {
    return std::filesystem::exists(child.err_path()) &&
           ReadFileOrDie(child.err_path()).find("is full (") != std::string::npos;
  };
  ASSERT_TRUE(WaitUntil([&] { return said() || !child.Running(); }, std::chrono::seconds(30)));
  ASSERT_TRUE(child.Running()) << ReadFileOrDie(child.err_path());
  EXPECT_THAT(ReadFileOrDie(child.err_path()),
              HasSubstr("the disk of the state folder " + (disk / "state").string() + " is full"));
  ASSERT_TRUE(fs.Grow(1024));
  auto done = child.Wait();
  EXPECT_EQ(done.signal, 0) << Describe(done);
  ASSERT_EQ(done.exit_code, 0) << Describe(done);
  EXPECT_THAT(done.err, HasSubstr("has space again"));
  EXPECT_THAT(done.err, HasSubstr("2,000 events read"));
}

TEST(IngestTest, TheLastProgressLineShowsTheFinishedJob) {
  gen::EventGenOptions o;
  o.dids = 50;
  Workspace ws("[progress]\ninterval_s = 3600\n");
  ASSERT_TRUE(gen::EventGenerator::WriteFile(o, 2000, (ws.dir / "e.jsonl").string()).ok());
  auto r = ws.Atfill({"ingest", ws.config, (ws.dir / "e.jsonl").string()});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  // With an hour between lines, the only progress line is the one printed at the end.
  const size_t line = r.err.find("job 1 ingest ");
  ASSERT_NE(line, std::string::npos) << r.err;
  const std::string progress = r.err.substr(line, r.err.find('\n', line) - line);
  EXPECT_THAT(progress, HasSubstr("job 1 ingest completed/completed"));
  EXPECT_THAT(progress, HasSubstr("| 2,000 events |"));
}

}  // namespace
}  // namespace atfill
