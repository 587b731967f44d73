// The state layer alone: commit batches (the per-sink-batch state write), tombstone lookups (the
// ingest guard's read), error-log appends and work-queue churn, on RocksDB (synced and not) and
// the in-memory store.
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "state/cursors.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"
#include "state/tombstones.hpp"
#include "state/work_queue.hpp"

namespace atfill::state {
namespace {

// A RocksDB store in a fresh /tmp directory, removed afterwards.
class BenchStore {
 public:
  explicit BenchStore(bool sync) {
    std::string pattern = "/tmp/atfill-state-bench-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    dir_ = pattern;
    RocksDbOptions options;
    options.path = dir_;
    options.sync = sync;
    auto opened = OpenRocksDb(options);
    if (!opened.ok()) std::abort();
    kv_ = std::move(opened).value();
  }
  ~BenchStore() {
    kv_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  KvStore& kv() { return *kv_; }

 private:
  std::string dir_;
  std::unique_ptr<KvStore> kv_;
};

std::string Uri(uint64_t i) {
  return "at://did:plc:" + std::to_string(1000000 + i % 50000) + "/app.bsky.feed.post/3k" +
         std::to_string(i);
}

// One engine-like commit: the job record, a cursor and range(0) record tombstones; range(1)
// syncs the WAL.
void BM_CommitBatch(benchmark::State& state) {
  const bool sync = state.range(1) != 0;
  BenchStore store(sync);
  JobStore jobs(store.kv());
  Cursors cursors(store.kv());
  Tombstones tombstones(store.kv());
  JobRecord job = *jobs.Create(JobRecord{});
  uint64_t n = 0;
  for (auto _ : state) {
    WriteBatch batch;
    for (int64_t i = 0; i < state.range(0); ++i, ++n) {
      tombstones.PutRecord(&batch, Uri(n), {"3k" + std::to_string(n), static_cast<int64_t>(n)});
    }
    job.counters.records_written = n;
    (void)jobs.Put(&batch, job);
    cursors.SetUint64(&batch, "jetstream/watermark", n);
    if (!store.kv().Write(batch).ok()) state.SkipWithError("write failed");
  }
  // Items are commits; tombstones/s shows the per-record cost.
  state.SetItemsProcessed(state.iterations());
  state.counters["tombstones"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CommitBatch)
    ->ArgNames({"tombstones", "sync"})
    ->ArgsProduct({{0, 100, 5000}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

void BM_TombstoneLookup(benchmark::State& state) {
  BenchStore store(false);
  Tombstones tombstones(store.kv());
  constexpr uint64_t kStored = 100000;
  WriteBatch batch;
  for (uint64_t i = 0; i < kStored; ++i) {
    tombstones.PutRecord(&batch, Uri(i * 2), {"rev", static_cast<int64_t>(i)});
    if (batch.size() >= 20000) {
      (void)store.kv().Write(batch);
      batch.Clear();
    }
  }
  (void)store.kv().Write(batch);
  std::mt19937_64 rng(42);
  uint64_t hits = 0;
  for (auto _ : state) {
    // Half the probes hit (even numbers), half miss.
    auto t = tombstones.GetRecord(Uri(rng() % (2 * kStored)));
    hits += t.ok() && t->has_value();
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["hit_ratio"] =
      static_cast<double>(hits) / static_cast<double>(std::max<int64_t>(state.iterations(), 1));
}
BENCHMARK(BM_TombstoneLookup);

void BM_ErrorLogAppendAll(benchmark::State& state) {
  BenchStore store(false);
  ErrorLog log(store.kv(), ErrorLogOptions{1000000, 1024, 4096});
  uint64_t n = 0;
  for (auto _ : state) {
    std::vector<NewError> errors;
    for (int64_t i = 0; i < state.range(0); ++i, ++n) {
      errors.push_back({"cid_mismatch", Uri(n), "computed CID differs", static_cast<int64_t>(n)});
    }
    if (!log.AppendAll(1, errors).ok()) state.SkipWithError("append failed");
  }
  state.SetItemsProcessed(static_cast<int64_t>(n));
}
BENCHMARK(BM_ErrorLogAppendAll)->Arg(1)->Arg(100)->Unit(benchmark::kMicrosecond);

// Push range(0) units, then remove them, one batch each way.
void BM_WorkQueueChurn(benchmark::State& state) {
  BenchStore store(false);
  WorkQueue queue(store.kv());
  uint64_t n = 0;
  for (auto _ : state) {
    WriteBatch push;
    for (int64_t i = 0; i < state.range(0); ++i, ++n) {
      (void)queue.Push(&push, 1, "did:plc:" + std::to_string(n) + "|app.bsky.feed.post", "{}");
    }
    (void)store.kv().Write(push);
    WriteBatch remove;
    (void)queue.Scan(1, 0, [&](const WorkUnit& u) {
      queue.Remove(&remove, 1, u);
      return true;
    });
    (void)store.kv().Write(remove);
  }
  state.SetItemsProcessed(static_cast<int64_t>(n));
}
BENCHMARK(BM_WorkQueueChurn)->Arg(1000)->Unit(benchmark::kMicrosecond);

void BM_MemoryCommitBatch(benchmark::State& state) {
  auto kv = NewMemoryKvStore();
  Tombstones tombstones(*kv);
  uint64_t n = 0;
  for (auto _ : state) {
    WriteBatch batch;
    for (int64_t i = 0; i < state.range(0); ++i, ++n) {
      tombstones.PutRecord(&batch, Uri(n), {"rev", static_cast<int64_t>(n)});
    }
    if (!kv->Write(batch).ok()) state.SkipWithError("write failed");
  }
  state.SetItemsProcessed(static_cast<int64_t>(n));
}
BENCHMARK(BM_MemoryCommitBatch)->Arg(100)->Arg(5000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace atfill::state
