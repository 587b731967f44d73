// Record scripts through the launcher: `atfill ingest` with [scripts.collections] configured, real
// Lua files, real SQLite files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "atproto/json.hpp"
#include "sinks/sqlite_reader.hpp"
#include "tests/common/process.hpp"
#include "tests/common/test_util.hpp"

namespace atfill {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::ProcessResult;
using testing::RunProcess;
using testing::TempDir;
using testing::WriteFile;

constexpr const char* kDid = "did:plc:ewvi7nxzyoun6zhxrhs64oiz";

// The post script of these tests: "drop" is dropped, "boom" raises an error, everything else is
// shouted; an update notes the text it replaces (read back through atfill.get_record).
constexpr const char* kPostScript = R"(
function record(event)
  if event.operation == "delete" then return event end
  local text = event.record.text
  if text == "drop" then return nil end
  if text == "boom" then error("boom in " .. event.rkey) end
  event.record.text = string.upper(text)
  if event.operation == "update" then
    local before = atfill.get_record(event.uri)
    event.record.replaced = before and before.text or "nothing"
  end
  return event
end
)";

struct Workspace {
  TempDir dir;
  std::string config;
  explicit Workspace(const std::string& extra) {
    config = (dir / "atfill.toml").string();
    WriteFile(dir / "post.lua", kPostScript);
    WriteFile(config,
              "[state]\ndir = \"state\"\n[sink.sqlite]\npath = \"out.db\"\n"
              "[progress]\ninterval_s = 60\n[scripts.collections]\n"
              "\"app.bsky.feed.post\" = \"post.lua\"\n" +
                  extra);
  }
  ProcessResult Atfill(std::vector<std::string> args) const {
    args.insert(args.begin(), ATFILL_BINARY);
    return RunProcess(args, dir.path());
  }
  ProcessResult Ingest(const std::string& name, const std::string& lines) const {
    WriteFile(dir / name, lines);
    return Atfill({"ingest", config, (dir / name).string()});
  }
  // uri -> record text.
  std::map<std::string, std::string> Table() const {
    std::map<std::string, std::string> out;
    auto rows = sinks::ReadAllRecords((dir / "out.db").string());
    EXPECT_TRUE(rows.ok()) << rows.status().ToString();
    if (rows.ok())
      for (const auto& r : *rows) out[r.uri] = r.record;
    return out;
  }
};

std::string Line(const std::string& collection, const std::string& op, const std::string& rkey,
                 const std::string& rev, const std::string& record = "") {
  std::string line = "{\"did\":\"" + std::string(kDid) +
                     "\",\"time_us\":1780000000000000,\"kind\":\"commit\",\"commit\":{\"rev\":\"" +
                     rev + "\",\"operation\":\"" + op + "\",\"collection\":\"" + collection +
                     "\",\"rkey\":\"" + rkey + "\"";
  if (!record.empty()) {
    line +=
        ",\"record\":" + record + ",\"cid\":\"" + atproto::CidOfRecord(record)->ToString() + "\"";
  }
  return line + "}}\n";
}

std::string Post(const std::string& text) {
  return R"({"$type":"app.bsky.feed.post","text":")" + text +
         R"(","createdAt":"2026-11-30T09:00:00.000Z"})";
}

std::string Uri(const std::string& collection, const std::string& rkey) {
  return "at://" + std::string(kDid) + "/" + collection + "/" + rkey;
}

const std::string kPost = "app.bsky.feed.post";
const std::string kLike = "app.bsky.feed.like";
// A like whose text the script would change if it ran on likes; spacing kept as sent.
const std::string kLikeBody =
    R"({"$type":"app.bsky.feed.like",  "subject":{"uri":"at://did:plc:x/app.bsky.feed.post/1","cid":"bafyreie5cvv4h45feadgeuwhbcutmh6t2ceseocckahdoe6uat64zmz454"},"createdAt":"2026-11-30T09:00:00.000Z"})";

std::string Events() {
  return Line(kPost, "create", "3lbqzb5ddb22a", "3lbqzbaaaaa2a", Post("hello")) +
         Line(kPost, "create", "3lbqzb5ddb22b", "3lbqzbaaaaa2a", Post("drop")) +
         Line(kPost, "create", "3lbqzb5ddb22c", "3lbqzbaaaaa2a", Post("boom")) +
         Line(kLike, "create", "3lbqzb5ddb22d", "3lbqzbaaaaa2a", kLikeBody);
}

TEST(ScriptRunTest, AScriptRewritesDropsAndDeadLettersTheRecordsOfItsCollectionOnly) {
  Workspace ws("");
  auto r = ws.Ingest("events.jsonl", Events());
  // 1: the dead-lettered record is an error; the rest lands.
  ASSERT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("4 events read, 2 records written"));
  const auto table = ws.Table();
  ASSERT_EQ(table.size(), 2u);
  // A changed record is encoded anew (keys in byte order, as Lua tables have none).
  EXPECT_EQ(
      table.at(Uri(kPost, "3lbqzb5ddb22a")),
      R"({"$type":"app.bsky.feed.post","createdAt":"2026-11-30T09:00:00.000Z","text":"HELLO"})");
  EXPECT_EQ(table.at(Uri(kLike, "3lbqzb5ddb22d")), kLikeBody);  // no script: exactly as sent
  // Fail closed (the default): the record the script failed on is not written, and the job's
  // error log holds it with the script's message after its retries.
  auto errors = ws.Atfill({"job", ws.config, "1", "--errors"});
  ASSERT_EQ(errors.exit_code, 0) << errors.err;
  EXPECT_THAT(errors.out, HasSubstr("script_error"));
  EXPECT_THAT(errors.out, HasSubstr(Uri(kPost, "3lbqzb5ddb22c")));
  EXPECT_THAT(errors.out, HasSubstr("boom in 3lbqzb5ddb22c"));
  EXPECT_THAT(errors.out, Not(HasSubstr("3lbqzb5ddb22b")));  // a drop is not an error
  auto job = ws.Atfill({"job", ws.config, "1", "--json"});
  ASSERT_EQ(job.exit_code, 0) << job.err;
  EXPECT_THAT(job.out, HasSubstr("\"script_dropped\":1"));
  EXPECT_THAT(job.out, HasSubstr("\"script_errors\":1"));
  EXPECT_THAT(job.out, HasSubstr("\"script_retries\":3"));

  // An update reads the record it replaces through atfill.get_record.
  auto update = ws.Ingest("update.jsonl",
                          Line(kPost, "update", "3lbqzb5ddb22a", "3lbqzbbbbbb2a", Post("again")));
  ASSERT_EQ(update.exit_code, 0) << update.err;
  EXPECT_EQ(
      ws.Table().at(Uri(kPost, "3lbqzb5ddb22a")),
      R"({"$type":"app.bsky.feed.post","createdAt":"2026-11-30T09:00:00.000Z","replaced":"HELLO","text":"AGAIN"})");
}

TEST(ScriptRunTest, FailOpenWritesTheRecordTheScriptFailedOnUnchanged) {
  Workspace ws("[scripts]\nfail_open = true\nattempts = 2\n");
  auto r = ws.Ingest("events.jsonl", Events());
  // 1: the failed calls are in the error log, though the records land unchanged.
  ASSERT_EQ(r.exit_code, 1) << r.err;
  const auto table = ws.Table();
  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(table.at(Uri(kPost, "3lbqzb5ddb22c")), Post("boom"));
  auto job = ws.Atfill({"job", ws.config, "1", "--json"});
  EXPECT_THAT(job.out, HasSubstr("\"script_errors\":1"));
  EXPECT_THAT(job.out, HasSubstr("\"script_retries\":1"));
}

TEST(ScriptRunTest, AScriptThatCannotLoadIsAConfigErrorNamingTheFile) {
  {
    Workspace ws("");
    WriteFile(ws.dir / "post.lua", "function record(e) return e");  // no end
    auto r = ws.Ingest("events.jsonl", Events());
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("post.lua"));
    EXPECT_THAT(r.err, HasSubstr("'end' expected"));
  }
  {
    Workspace ws("");
    WriteFile(ws.dir / "post.lua",
              "local x = io.open('/etc/passwd')\nfunction record(e) return e end");
    auto r = ws.Ingest("events.jsonl", Events());
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("post.lua"));
    EXPECT_THAT(r.err, HasSubstr("io"));
  }
  {
    Workspace ws("[scripts]\nmemory_mb = 0\n");
    auto r = ws.Atfill({"jobs", ws.config});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("scripts.memory_mb"));
  }
}

// A TID-shaped record key for the i-th record.
std::string Rkey(int i) {
  static const char kBase32[] = "234567abcdefghijklmnopqrstuvwxyz";
  std::string rkey = "3lbqzb5dd";
  for (int k = 0; k < 3; ++k, i /= 32) rkey += kBase32[i % 32];
  return rkey + "a";
}

// CPU time (user + system) a running process has used, from /proc/PID/stat.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  double ticks = 0;
  // After the name: state is field 3, utime 14 and stime 15.
  for (int n = 3; n <= 15 && fields >> field; ++n) {
    if (n >= 14) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Issue 19: whatever a script does, SIGTERM ends `atfill ingest` within 5 s. The two scripts keep
// a worker inside one call: a pattern that backtracks inside string.find (no VM instruction, no
// allocation), and a loop of 1 MB strings up to the memory cap, record after record.
TEST(ScriptRunTest, SigtermStopsAnIngestWithinFiveSecondsWhateverItsScriptDoes) {
  const std::pair<const char*, const char*> scripts[] = {
      {"backtracking",
       "function record(e) local s = string.rep(\"a\", 50); return s:find(string.rep(\"a?\", "
       "50) .. s) end"},
      {"memory bomb",
       "function record(e) local t = {} for i = 1, 1e9 do t[i] = string.rep(\"x\", 1e6) end "
       "end"},
  };
  for (const auto& [name, script] : scripts) {
    Workspace ws("");
    WriteFile(ws.dir / "post.lua", script);
    std::string lines;
    for (int i = 0; i < 2000; ++i) {
      lines += Line(kPost, "create", Rkey(i), "3lbqzbaaaaa2a", Post("hello"));
    }
    WriteFile(ws.dir / "events.jsonl", lines);
    testing::Child child({ATFILL_BINARY, "ingest", ws.config, (ws.dir / "events.jsonl").string()},
                         ws.dir.path());
    // The gate: the process is inside the script once it has used half a second of CPU (without
    // the script, these 2000 lines take a few milliseconds).
    testing::WaitUntil([&] { return !child.Running() || CpuSeconds(child.pid()) >= 0.5; },
                       std::chrono::seconds(60));
    ASSERT_TRUE(child.Running()) << name << ": ended before the signal";
    const auto signalled = std::chrono::steady_clock::now();
    ASSERT_TRUE(child.Kill(SIGTERM)) << name;
    const ProcessResult r = child.Wait(std::chrono::seconds(20));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
    EXPECT_LT(seconds, 5.0) << name << ": " << r.err;
    EXPECT_EQ(r.signal, 0) << name << ": " << r.err;  // Wait's SIGKILL would show here
    // Paused (4), or left when the pause took too long (130).
    EXPECT_TRUE(r.exit_code == 4 || r.exit_code == 130) << name << ": exit " << r.exit_code << "\n"
                                                        << r.err;
    // Either way the job resumes where its last commit left it: with a script that keeps
    // everything, every record is written.
    WriteFile(ws.dir / "post.lua", "function record(e) return e end");
    const ProcessResult resumed =
        ws.Atfill({"ingest", ws.config, (ws.dir / "events.jsonl").string()});
    EXPECT_EQ(resumed.exit_code, 0) << name << ": " << resumed.err;
    EXPECT_THAT(resumed.err, HasSubstr("resuming job 1")) << name;
    EXPECT_EQ(ws.Table().size(), 2000u) << name;
  }
}

}  // namespace
}  // namespace atfill
