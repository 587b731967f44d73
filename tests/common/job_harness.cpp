#include "tests/common/job_harness.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "sinks/sqlite_reader.hpp"
#include "sinks/sqlite_sink.hpp"
#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
#include "state/tombstones.hpp"
#include "tests/common/process.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::testing {

SourceJobRun RunSourceJob(
    const std::filesystem::path& state_dir, const std::string& db, const std::string& kind,
    const std::string& job_name, const JobSourceFactory& make_source,
    const std::function<void(state::KvStore&)>& prepare,
    const std::function<void(state::KvStore&, const state::JobRecord&)>& after,
    const std::vector<const pipeline::Transform*>& extra) {
  SourceJobRun out;
  auto kv = state::OpenRocksDb({.path = state_dir.string()});
  EXPECT_TRUE(kv.ok()) << kv.status().ToString();
  if (!kv.ok()) return out;
  if (prepare) prepare(**kv);
  sinks::SqliteSinkOptions sink_options;
  sink_options.path = db;
  auto sink = sinks::OpenSqliteSink(sink_options);
  EXPECT_TRUE(sink.ok()) << sink.status().ToString();
  if (!sink.ok()) return out;
  state::Tombstones tombstones(**kv);
  stages::CidVerify verify;
  stages::IngestGuard guard(&tombstones);
  pipeline::RunOptions run;
  run.job_name = job_name;
  run.engine.batch.max_delay_ms = 50;
  state::KvStore& store = **kv;
  std::vector<const pipeline::Transform*> transforms = {&verify};
  transforms.insert(transforms.end(), extra.begin(), extra.end());
  transforms.push_back(&guard);
  auto job = pipeline::RunAsJob([&](const state::JobRecord& j) { return make_source(store, j); },
                                kind, transforms, sink->get(), kv->get(), run);
  EXPECT_TRUE(job.ok()) << job.status().ToString();
  if (!job.ok()) return out;
  out.job = *job;
  state::ErrorLog errors(**kv);
  auto kinds = errors.CountsByKind(job->id);
  auto listed = errors.List(job->id, 0, 100);
  EXPECT_TRUE(kinds.ok() && listed.ok());
  if (kinds.ok()) out.error_kinds = std::move(*kinds);
  if (listed.ok()) out.errors = std::move(*listed);
  if (after) after(**kv, *job);
  return out;
}

namespace {

class BorrowedSource : public pipeline::Source {
 public:
  explicit BorrowedSource(pipeline::Source* s) : s_(s) {}
  Result<bool> Read(pipeline::EventChunk* chunk) override { return s_->Read(chunk); }
  void Decode(pipeline::EventChunk* chunk) const override { s_->Decode(chunk); }
  const pipeline::Transform* OrderedStage() const override { return s_->OrderedStage(); }
  Status Seek(const std::string& cursor) override { return s_->Seek(cursor); }
  std::string Describe() const override { return s_->Describe(); }
  state::StopReason Unfinished() const override { return s_->Unfinished(); }
  void Committed(uint64_t through_seq) override { s_->Committed(through_seq); }

 private:
  pipeline::Source* s_;
};

}  // namespace

std::unique_ptr<pipeline::Source> Borrow(pipeline::Source* source) {
  return std::make_unique<BorrowedSource>(source);
}

std::vector<uint64_t> KillPoints(std::mt19937_64& rng, int count, uint64_t lo, uint64_t hi) {
  std::vector<uint64_t> targets;
  for (int i = 0; i < count; ++i) {
    targets.push_back(std::uniform_int_distribution<uint64_t>(lo, hi)(rng));
  }
  std::sort(targets.begin(), targets.end());
  return targets;
}

int KillAtRowCounts(const std::vector<std::string>& argv, const std::filesystem::path& dir,
                    const std::string& db, const std::vector<uint64_t>& targets) {
  int kills = 0;
  for (uint64_t target : targets) {
    Child child(argv, dir);
    // Until the table (WAL readers never block the writer) holds `target` rows, or the run ends.
    WaitUntil(
        [&] {
          uint64_t rows = 0;
          if (auto reader = sinks::SqliteReader::Open(db); reader.ok()) {
            if (auto n = (*reader)->Count(); n.ok()) rows = *n;
          }
          return rows >= target || !child.Running();
        },
        std::chrono::seconds(120), std::chrono::milliseconds(2));
    if (child.Kill(SIGKILL)) {
      auto r = child.Wait();
      EXPECT_EQ(r.signal, SIGKILL) << r.err;
      ++kills;
    } else {
      auto r = child.Wait();
      ADD_FAILURE() << "a run ended before its kill point (" << target << " rows): exit "
                    << r.exit_code << "\n"
                    << r.err;
    }
  }
  return kills;
}

uint64_t TestSeed() {
  if (const char* s = std::getenv("ATFILL_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

void KillThenRunUntilIdle(const std::vector<std::string>& argv, const std::filesystem::path& dir,
                          const std::string& db, uint64_t seed, int kills, uint64_t lo, uint64_t hi,
                          ProcessResult* last) {
  std::mt19937_64 rng(seed);
  EXPECT_EQ(KillAtRowCounts(argv, dir, db, KillPoints(rng, kills, lo, hi)), kills);
  ProcessResult r = RunProcess(argv, dir);
  if (last != nullptr) *last = r;
  ASSERT_EQ(r.exit_code, 4) << r.err;  // paused: the stream went quiet
  EXPECT_NE(r.err.find("stream_idle"), std::string::npos) << r.err;
}

std::map<std::string, std::string> TableCids(const std::string& db) {
  auto rows = sinks::ReadAllRecords(db);
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  if (!rows.ok()) return {};
  return UriCids(*rows);
}

std::string DiffCids(const std::map<std::string, std::string>& want,
                     const std::map<std::string, std::string>& got) {
  std::string out;
  int shown = 0;
  for (const auto& [uri, cid] : want) {
    auto it = got.find(uri);
    if (it == got.end() && shown++ < 5) out += "missing: " + uri + "\n";
    if (it != got.end() && it->second != cid && shown++ < 5) out += "different: " + uri + "\n";
  }
  shown = 0;
  for (const auto& [uri, cid] : got) {
    if (want.count(uri) == 0 && shown++ < 5) out += "unexpected: " + uri + "\n";
  }
  return out;
}

}  // namespace atfill::testing
