// RocksDB-only behaviour: persistence across reopen, the directory lock and its message (with a
// real second process), crash atomicity under SIGKILL, options and schema checks.
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "state/cursors.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"
#include "state/tombstones.hpp"
#include "state/work_queue.hpp"
#include "tests/state/state_test_util.hpp"

namespace atfill::state {
namespace {

namespace fs = std::filesystem;
using testing::Child;
using testing::TempDir;

std::unique_ptr<KvStore> MustOpen(const fs::path& dir, bool sync = true) {
  RocksDbOptions options;
  options.path = dir.string();
  options.sync = sync;
  auto opened = OpenRocksDb(options);
  EXPECT_TRUE(opened.ok()) << opened.status().ToString();
  return opened.ok() ? std::move(opened).value() : nullptr;
}

std::string Host() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

TEST(RocksDbState, EverythingSurvivesReopen) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "a" / "b";  // nested, created on open
  uint64_t job_id = 0;
  {
    auto kv = MustOpen(dir);
    ASSERT_NE(kv, nullptr);
    JobStore jobs(*kv);
    JobRecord r;
    r.kind = "backfill";
    r.params["config"] = "x.toml";
    job_id = jobs.Create(r)->id;
    WriteBatch b;
    Cursors(*kv).Set(&b, "relay/app.bsky.feed.post", "c1");
    Tombstones(*kv).PutRecord(&b, "at://did:plc:a/c/r", {"rev1", 5});
    WorkQueue queue(*kv);
    ASSERT_TRUE(queue.Push(&b, job_id, "u1", "p1").ok());
    ASSERT_TRUE(queue.Push(&b, job_id, "u2", "p2").ok());
    ASSERT_TRUE(kv->Write(b).ok());
    ASSERT_TRUE(ErrorLog(*kv).Append(job_id, {"bad_json", "line 1", "oops", 1}).ok());
  }
  auto kv = MustOpen(dir);
  ASSERT_NE(kv, nullptr);
  JobStore jobs(*kv);
  auto job = jobs.Get(job_id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->params.at("config"), "x.toml");
  EXPECT_EQ(jobs.Create(JobRecord())->id, job_id + 1);  // ids continue
  EXPECT_EQ(Cursors(*kv).Get("relay/app.bsky.feed.post")->value(), "c1");
  EXPECT_EQ(Tombstones(*kv).GetRecord("at://did:plc:a/c/r")->value(), (RecordTombstone{"rev1", 5}));
  WorkQueue queue(*kv);
  EXPECT_EQ(*queue.Count(job_id), 2u);
  WriteBatch b;
  EXPECT_EQ(**queue.Push(&b, job_id, "u3", ""), 3u);  // positions continue
  ErrorLog log(*kv);
  EXPECT_EQ(*log.Total(job_id), 1u);
  EXPECT_EQ(log.Append(job_id, {"bad_json", "line 1", "again", 2})->coalesced, 1u);
}

TEST(RocksDbState, OwnerFileNamesThisProcessWhileOpen) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "state";
  {
    auto kv = MustOpen(dir);
    ASSERT_NE(kv, nullptr);
    std::ifstream in(dir / "OWNER");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("pid=" + std::to_string(getpid()) + "\n"), std::string::npos) << text;
    EXPECT_NE(text.find("host=" + Host() + "\n"), std::string::npos) << text;
    EXPECT_NE(text.find("started=20"), std::string::npos) << text;
  }
  EXPECT_FALSE(fs::exists(dir / "OWNER"));
}

TEST(RocksDbState, SecondOpenInThisProcessIsUnavailable) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "state";
  auto first = MustOpen(dir);
  ASSERT_NE(first, nullptr);
  RocksDbOptions options;
  options.path = dir.string();
  auto second = OpenRocksDb(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  const std::string msg = second.status().message();
  EXPECT_NE(msg.find("state directory " + dir.string() + " is in use by pid " +
                     std::to_string(getpid()) + " on host " + Host() + " since 20"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("stop that process or use another directory"), std::string::npos) << msg;
  // The refused opener did not disturb the holder.
  WriteBatch b;
  b.Put(Family::kMeta, "still", "works");
  EXPECT_TRUE(first->Write(b).ok());
  EXPECT_TRUE(fs::exists(dir / "OWNER"));
}

TEST(RocksDbState, AnotherProcessIsRefusedWithOurPid) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "state";
  auto held = MustOpen(dir);
  ASSERT_NE(held, nullptr);
  auto child = Child::Spawn("open", dir.string());
  ASSERT_NE(child, nullptr);
  const std::string line = child->ReadLine();
  EXPECT_EQ(child->Wait(), 0);
  EXPECT_TRUE(line.starts_with("error Unavailable: state directory " + dir.string() +
                               " is in use by pid " + std::to_string(getpid()) + " on host " +
                               Host() + " since "))
      << line;
  EXPECT_EQ(line.find("this process"), std::string::npos) << line;
}

TEST(RocksDbState, HolderInAnotherProcessIsNamedAndReleasedOnExit) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "state";
  auto child = Child::Spawn("hold", dir.string());
  ASSERT_NE(child, nullptr);
  ASSERT_EQ(child->ReadLine(), "ready");
  RocksDbOptions options;
  options.path = dir.string();
  auto refused = OpenRocksDb(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  const std::string msg = refused.status().message();
  EXPECT_TRUE(msg.starts_with("state directory " + dir.string() + " is in use by pid " +
                              std::to_string(child->pid()) + " on host " + Host() + " since 20"))
      << msg;
  EXPECT_TRUE(msg.ends_with("Z; stop that process or use another directory")) << msg;
  child->CloseStdin();
  const int status = child->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_NE(MustOpen(dir), nullptr);
}

TEST(RocksDbState, KilledHolderReleasesTheLock) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "state";
  auto child = Child::Spawn("hold", dir.string());
  ASSERT_NE(child, nullptr);
  ASSERT_EQ(child->ReadLine(), "ready");
  child->Kill(SIGKILL);
  const int status = child->Wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  // The stale OWNER file of the dead holder does not stand in the way.
  EXPECT_TRUE(fs::exists(dir / "OWNER"));
  auto kv = MustOpen(dir);
  ASSERT_NE(kv, nullptr);
  std::ifstream in(dir / "OWNER");
  std::string first_line;
  std::getline(in, first_line);
  EXPECT_EQ(first_line, "pid=" + std::to_string(getpid()));
}

// A child commits numbered batches that each touch every column family (a put in each, a
// counter add, the cursor "crash-last"); SIGKILL lands at an arbitrary point. After reopening,
// batches 1..last are all complete and nothing of a later one is visible. Three rounds: each
// child continues from the last committed batch.
class RocksDbCrash : public ::testing::TestWithParam<bool> {};

TEST_P(RocksDbCrash, KilledWriterLeavesAPrefixOfWholeBatches) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "state";
  const bool sync = GetParam();
  uint64_t acknowledged = 0;
  for (int round = 0; round < 3; ++round) {
    auto child = Child::Spawn("crash_writer", dir.string(), sync ? "sync" : "nosync");
    ASSERT_NE(child, nullptr);
    const uint64_t lines = 40 + 37 * static_cast<uint64_t>(round);
    for (uint64_t i = 0; i < lines; ++i) {
      const std::string line = child->ReadLine();
      ASSERT_FALSE(line.empty() || line.starts_with("error")) << line;
      const uint64_t n = std::stoull(line);
      ASSERT_EQ(n, acknowledged + 1);
      acknowledged = n;
    }
    child->Kill(SIGKILL);
    const int status = child->Wait();
    ASSERT_TRUE(WIFSIGNALED(status)) << status;

    auto kv = MustOpen(dir, sync);
    ASSERT_NE(kv, nullptr);
    auto last_raw = kv->Get(Family::kCursors, "crash-last");
    ASSERT_TRUE(last_raw.ok() && last_raw->has_value());
    const uint64_t last = std::stoull(**last_raw);
    EXPECT_GE(last, acknowledged);
    for (int f = 0; f < kFamilyCount; ++f) {
      uint64_t n = 0;
      bool values_ok = true;
      ASSERT_TRUE(
          kv->Scan(static_cast<Family>(f), "crash/", [&](std::string_view k, std::string_view v) {
              ++n;
              const uint64_t i = std::stoull(std::string(k.substr(6))) - 1000000000;
              values_ok =
                  values_ok && i == n && v.starts_with(std::to_string(i) + "/") && v.size() > 500;
              return true;
            }).ok());
      EXPECT_EQ(n, last) << FamilyName(static_cast<Family>(f));
      EXPECT_TRUE(values_ok) << FamilyName(static_cast<Family>(f));
    }
    auto count = kv->Get(Family::kQueue, "crash-count");
    ASSERT_TRUE(count.ok() && count->has_value());
    EXPECT_EQ(*DecodeCounter(**count, "crash-count"), last);
    acknowledged = last;
  }
}

INSTANTIATE_TEST_SUITE_P(SyncModes, RocksDbCrash, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Sync" : "NoSync"; });

TEST(RocksDbState, NewerSchemaIsRefused) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "state";
  {
    auto kv = MustOpen(dir);
    ASSERT_NE(kv, nullptr);
    WriteBatch b;
    b.Put(Family::kMeta, "schema_version", "99");
    ASSERT_TRUE(kv->Write(b).ok());
  }
  RocksDbOptions options;
  options.path = dir.string();
  auto opened = OpenRocksDb(options);
  EXPECT_EQ(opened.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(opened.status().message().find("schema version '99'"), std::string::npos);
}

TEST(RocksDbState, OptionsAreValidated) {
  EXPECT_EQ(OpenRocksDb(RocksDbOptions{}).status().code(), StatusCode::kInvalid);
  RocksDbOptions tiny;
  tiny.path = "/tmp/x";
  tiny.write_buffer_bytes = 1;
  EXPECT_EQ(tiny.Validate().code(), StatusCode::kInvalid);
  TempDir tmp;
  const fs::path file = tmp.path() / "file";
  std::ofstream(file) << "not a directory";
  RocksDbOptions on_file;
  on_file.path = file.string();
  auto opened = OpenRocksDb(on_file);
  EXPECT_FALSE(opened.ok());
  EXPECT_NE(opened.status().message().find(file.string()), std::string::npos)
      << opened.status().ToString();
}

TEST(RocksDbState, UnknownColumnFamiliesAreKept) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "state";
  { ASSERT_NE(MustOpen(dir), nullptr); }
  // A directory written by a build with one more family.
  std::vector<std::string> names;
  ASSERT_TRUE(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir.string(), &names).ok());
  EXPECT_EQ(names.size(), static_cast<size_t>(kFamilyCount) + 1);  // ours and "default"
  auto raw_open = [&](std::vector<rocksdb::ColumnFamilyHandle*>* handles, rocksdb::DB** db) {
    rocksdb::DBOptions options;
    options.create_missing_column_families = true;
    std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
    rocksdb::ColumnFamilyOptions cf;
    // Counters need the merge operator only when merged; this test reads none.
    for (const auto& n : names) descriptors.emplace_back(n, cf);
    descriptors.emplace_back("future", cf);
    return rocksdb::DB::Open(options, dir.string(), descriptors, handles, db);
  };
  {
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(raw_open(&handles, &db).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handles.back(), "k", "v").ok());
    for (auto* h : handles) ASSERT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
    delete db;
  }
  {
    auto kv = MustOpen(dir);
    ASSERT_NE(kv, nullptr);
    WriteBatch b;
    b.Put(Family::kJobs, "x", "y");
    ASSERT_TRUE(kv->Write(b).ok());
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  ASSERT_TRUE(raw_open(&handles, &db).ok());
  std::string value;
  EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), handles.back(), "k", &value).ok());
  EXPECT_EQ(value, "v");
  for (auto* h : handles) ASSERT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
  delete db;
}

}  // namespace
}  // namespace atfill::state
