// KvStore conformance: every test runs against the in-memory store and RocksDB.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "state/kv_store.hpp"
#include "tests/state/state_test_util.hpp"

namespace atfill::state {
namespace {

using testing::BackendNames;
using testing::Backends;

template <typename Backend>
class KvStoreConformance : public testing::StoreFixture<Backend> {
 protected:
  void Put(Family f, std::string_view k, std::string_view v) {
    WriteBatch b;
    b.Put(f, k, v);
    ASSERT_TRUE(this->kv().Write(b).ok());
  }
  std::optional<std::string> Get(Family f, std::string_view k) {
    auto r = this->kv().Get(f, k);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::nullopt;
  }
  std::vector<std::pair<std::string, std::string>> ScanAll(Family f, std::string_view prefix,
                                                           std::string_view start_after = {}) {
    std::vector<std::pair<std::string, std::string>> out;
    auto st = this->kv().Scan(
        f, prefix,
        [&](std::string_view k, std::string_view v) {
          out.emplace_back(k, v);
          return true;
        },
        start_after);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  }
  std::vector<std::string> Keys(Family f, std::string_view prefix,
                                std::string_view start_after = {}) {
    std::vector<std::string> keys;
    for (auto& [k, v] : ScanAll(f, prefix, start_after)) keys.push_back(k);
    return keys;
  }
  uint64_t Counter(Family f, std::string_view k) {
    auto raw = Get(f, k);
    if (!raw) return 0;
    auto v = DecodeCounter(*raw, "test");
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return v.ok() ? *v : 0;
  }
};

TYPED_TEST_SUITE(KvStoreConformance, Backends, BackendNames);

TYPED_TEST(KvStoreConformance, GetOfMissingKeyIsNullopt) {
  auto r = this->kv().Get(Family::kJobs, "nothing");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
}

TYPED_TEST(KvStoreConformance, PutGetDeleteRoundTripBinary) {
  const std::string key("k\0\xff\x01", 4);
  const std::string value("\0v\xfe", 3);
  this->Put(Family::kCursors, key, value);
  EXPECT_EQ(this->Get(Family::kCursors, key), value);
  this->Put(Family::kCursors, key, "second");
  EXPECT_EQ(this->Get(Family::kCursors, key), "second");
  WriteBatch del;
  del.Delete(Family::kCursors, key);
  ASSERT_TRUE(this->kv().Write(del).ok());
  EXPECT_EQ(this->Get(Family::kCursors, key), std::nullopt);
  // Deleting what is absent is fine.
  ASSERT_TRUE(this->kv().Write(del).ok());
}

TYPED_TEST(KvStoreConformance, EmptyKeyAndValue) {
  this->Put(Family::kMeta, "", "");
  EXPECT_EQ(this->Get(Family::kMeta, ""), "");
}

TYPED_TEST(KvStoreConformance, FamiliesAreSeparate) {
  WriteBatch b;
  for (int f = 0; f < kFamilyCount; ++f) {
    b.Put(static_cast<Family>(f), "same", std::string(FamilyName(static_cast<Family>(f))));
  }
  ASSERT_TRUE(this->kv().Write(b).ok());
  for (int f = 0; f < kFamilyCount; ++f) {
    EXPECT_EQ(this->Get(static_cast<Family>(f), "same"),
              std::string(FamilyName(static_cast<Family>(f))));
    EXPECT_EQ(this->Keys(static_cast<Family>(f), "same").size(), 1u);
  }
}

TYPED_TEST(KvStoreConformance, BatchOpsApplyInOrder) {
  WriteBatch b;
  b.Put(Family::kQueue, "a", "1");
  b.Delete(Family::kQueue, "a");
  b.Delete(Family::kQueue, "b");
  b.Put(Family::kQueue, "b", "2");
  b.Put(Family::kQueue, "c", "3");
  b.Put(Family::kQueue, "c", "4");
  ASSERT_TRUE(this->kv().Write(b).ok());
  EXPECT_EQ(this->Get(Family::kQueue, "a"), std::nullopt);
  EXPECT_EQ(this->Get(Family::kQueue, "b"), "2");
  EXPECT_EQ(this->Get(Family::kQueue, "c"), "4");
}

TYPED_TEST(KvStoreConformance, EmptyBatchIsOk) { EXPECT_TRUE(this->kv().Write(WriteBatch()).ok()); }

TYPED_TEST(KvStoreConformance, BatchAppendKeepsOrder) {
  WriteBatch first, second;
  first.Put(Family::kMeta, "x", "first");
  second.Put(Family::kMeta, "x", "second");
  first.Append(second);
  EXPECT_EQ(first.size(), 2u);
  ASSERT_TRUE(this->kv().Write(first).ok());
  EXPECT_EQ(this->Get(Family::kMeta, "x"), "second");
}

TYPED_TEST(KvStoreConformance, InvalidFamilyIsAnError) {
  const auto bad = static_cast<Family>(42);
  EXPECT_EQ(this->kv().Get(bad, "k").status().code(), StatusCode::kInvalid);
  WriteBatch b;
  b.Put(Family::kMeta, "ok", "1");
  b.Put(bad, "k", "v");
  EXPECT_EQ(this->kv().Write(b).code(), StatusCode::kInvalid);
  // All or nothing: the valid op was not applied either.
  EXPECT_EQ(this->Get(Family::kMeta, "ok"), std::nullopt);
  EXPECT_FALSE(this->kv().Scan(bad, "", [](auto, auto) { return true; }).ok());
  EXPECT_FALSE(this->kv().LastKey(bad, "").ok());
  EXPECT_EQ(FamilyName(bad), "?");
}

TYPED_TEST(KvStoreConformance, ScanIsOrderedAndBoundedByPrefix) {
  std::vector<std::string> keys = {"p/b", "p/a",       "p/c\xff", "p/c",
                                   "p",   "q/a",       "o/z",     std::string("p/\0x", 4),
                                   "p0",  "p/\xff\xff"};
  std::mt19937 rng(7);
  std::shuffle(keys.begin(), keys.end(), rng);
  WriteBatch b;
  for (const auto& k : keys) b.Put(Family::kErrors, k, "v" + k);
  ASSERT_TRUE(this->kv().Write(b).ok());
  EXPECT_EQ(this->Keys(Family::kErrors, "p/"),
            (std::vector<std::string>{std::string("p/\0x", 4), "p/a", "p/b", "p/c", "p/c\xff",
                                      "p/\xff\xff"}));
  for (const auto& [k, v] : this->ScanAll(Family::kErrors, "p/")) EXPECT_EQ(v, "v" + k);
  EXPECT_EQ(this->Keys(Family::kErrors, "p").size(), 8u);  // "p", "p0" and the six above
  EXPECT_EQ(this->Keys(Family::kErrors, "").size(), keys.size());
  EXPECT_TRUE(this->Keys(Family::kErrors, "r").empty());
  EXPECT_EQ(this->Keys(Family::kErrors, "p/\xff"), (std::vector<std::string>{"p/\xff\xff"}));
}

TYPED_TEST(KvStoreConformance, ScanStartAfterIsExclusive) {
  WriteBatch b;
  for (const char* k : {"j/1", "j/2", "j/3", "j/5", "k/1"}) b.Put(Family::kJobs, k, k);
  ASSERT_TRUE(this->kv().Write(b).ok());
  EXPECT_EQ(this->Keys(Family::kJobs, "j/", "j/2"), (std::vector<std::string>{"j/3", "j/5"}));
  // A start point that is not a key.
  EXPECT_EQ(this->Keys(Family::kJobs, "j/", "j/4"), (std::vector<std::string>{"j/5"}));
  // Before the prefix: the whole prefix.
  EXPECT_EQ(this->Keys(Family::kJobs, "j/", "a").size(), 4u);
  // Equal to the prefix: everything after it.
  EXPECT_EQ(this->Keys(Family::kJobs, "j/", "j/").size(), 4u);
  EXPECT_TRUE(this->Keys(Family::kJobs, "j/", "j/5").empty());
  EXPECT_TRUE(this->Keys(Family::kJobs, "j/", "z").empty());
}

TYPED_TEST(KvStoreConformance, ScanStopsWhenCallbackSaysSo) {
  WriteBatch b;
  for (int i = 0; i < 10; ++i) b.Put(Family::kQueue, "k" + std::to_string(i), "v");
  ASSERT_TRUE(this->kv().Write(b).ok());
  int calls = 0;
  ASSERT_TRUE(this->kv()
                  .Scan(Family::kQueue, "k",
                        [&](std::string_view, std::string_view) { return ++calls < 3; })
                  .ok());
  EXPECT_EQ(calls, 3);
}

TYPED_TEST(KvStoreConformance, ScanSeesTheSnapshotOfItsStart) {
  WriteBatch b;
  for (int i = 0; i < 5; ++i) b.Put(Family::kTombstones, "s" + std::to_string(i), "old");
  ASSERT_TRUE(this->kv().Write(b).ok());
  std::vector<std::string> seen;
  ASSERT_TRUE(this->kv()
                  .Scan(Family::kTombstones, "s",
                        [&](std::string_view k, std::string_view v) {
                          seen.push_back(std::string(k) + "=" + std::string(v));
                          if (seen.size() == 1) {
                            // Callbacks may write to the store; the running scan ignores it.
                            WriteBatch w;
                            w.Put(Family::kTombstones, "s3", "new");
                            w.Put(Family::kTombstones, "s9", "new");
                            w.Delete(Family::kTombstones, "s4");
                            EXPECT_TRUE(this->kv().Write(w).ok());
                            EXPECT_EQ(this->Get(Family::kTombstones, "s9"), "new");
                          }
                          return true;
                        })
                  .ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"s0=old", "s1=old", "s2=old", "s3=old", "s4=old"}));
  EXPECT_EQ(this->Keys(Family::kTombstones, "s").size(), 5u);  // s0-s3 and s9
}

TYPED_TEST(KvStoreConformance, LastKeyOfPrefix) {
  auto last = [&](std::string_view prefix) {
    auto r = this->kv().LastKey(Family::kQueue, prefix);
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : std::nullopt;
  };
  EXPECT_EQ(last("a"), std::nullopt);
  WriteBatch b;
  for (const char* k : {"a1", "a2", "a9", "b", "c\xff\xff", "c"}) {
    b.Put(Family::kQueue, k, "v");
  }
  ASSERT_TRUE(this->kv().Write(b).ok());
  EXPECT_EQ(last("a"), "a9");
  EXPECT_EQ(last("a2"), "a2");
  EXPECT_EQ(last("a3"), std::nullopt);
  EXPECT_EQ(last("b"), "b");
  EXPECT_EQ(last("c"), std::string("c\xff\xff", 3));
  EXPECT_EQ(last(std::string("c\xff", 2)), std::string("c\xff\xff", 3));
  EXPECT_EQ(last(""), std::string("c\xff\xff", 3));
  EXPECT_EQ(last("0"), std::nullopt);
  EXPECT_EQ(last("z"), std::nullopt);
}

TYPED_TEST(KvStoreConformance, AddMaintainsCounters) {
  WriteBatch b;
  b.Add(Family::kQueue, "n", 5);
  b.Add(Family::kQueue, "n", -2);
  ASSERT_TRUE(this->kv().Write(b).ok());
  EXPECT_EQ(this->Counter(Family::kQueue, "n"), 3u);
  WriteBatch put_then_add;
  put_then_add.Put(Family::kQueue, "n", EncodeCounter(100));
  put_then_add.Add(Family::kQueue, "n", 1);
  ASSERT_TRUE(this->kv().Write(put_then_add).ok());
  EXPECT_EQ(this->Counter(Family::kQueue, "n"), 101u);
  WriteBatch add_then_delete;
  add_then_delete.Add(Family::kQueue, "n", 1);
  add_then_delete.Delete(Family::kQueue, "n");
  add_then_delete.Add(Family::kQueue, "n", 7);
  ASSERT_TRUE(this->kv().Write(add_then_delete).ok());
  EXPECT_EQ(this->Counter(Family::kQueue, "n"), 7u);
  // Wraps modulo 2^64.
  WriteBatch wrap;
  wrap.Add(Family::kQueue, "w", -1);
  ASSERT_TRUE(this->kv().Write(wrap).ok());
  EXPECT_EQ(this->Counter(Family::kQueue, "w"), UINT64_MAX);
  // Counters are visible to scans as 8-byte values.
  auto all = this->ScanAll(Family::kQueue, "n");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].second, EncodeCounter(7));
}

TYPED_TEST(KvStoreConformance, AddOntoANonCounterIsAnErrorNotACrash) {
  this->Put(Family::kMeta, "text", "hello");
  WriteBatch b;
  b.Put(Family::kMeta, "other", "1");
  b.Add(Family::kMeta, "text", 1);
  const Status write = this->kv().Write(b);
  if (write.ok()) {
    // RocksDB merges lazily: the read reports it.
    EXPECT_EQ(this->kv().Get(Family::kMeta, "text").status().code(), StatusCode::kCorrupt);
  } else {
    EXPECT_EQ(write.code(), StatusCode::kCorrupt);
    EXPECT_EQ(this->Get(Family::kMeta, "other"), std::nullopt);
    EXPECT_EQ(this->Get(Family::kMeta, "text"), "hello");
  }
}

TYPED_TEST(KvStoreConformance, CounterCodecRejectsWrongSizes) {
  EXPECT_EQ(DecodeCounter("1234567", "c").status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(DecodeCounter("123456789", "c").status().code(), StatusCode::kCorrupt);
  auto v = DecodeCounter(EncodeCounter(0x0102030405060708), "c");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 0x0102030405060708u);
}

// A reader racing a writer never sees part of a batch: every scan of the ten keys finds one
// value, and a key read after another key of the same batch is never older.
TYPED_TEST(KvStoreConformance, ConcurrentReadersSeeWholeBatches) {
  constexpr int kBatches = 150;
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 1; i <= kBatches; ++i) {
      WriteBatch b;
      for (int k = 0; k < 10; ++k)
        b.Put(Family::kCursors, "c" + std::to_string(k), std::to_string(i));
      b.Put(Family::kJobs, "j", std::to_string(i));
      EXPECT_TRUE(this->kv().Write(b).ok());
    }
    done = true;
  });
  int scans = 0, torn = 0, older = 0;
  while (!done) {
    std::vector<std::string> values;
    ASSERT_TRUE(this->kv()
                    .Scan(Family::kCursors, "c",
                          [&](std::string_view, std::string_view v) {
                            values.emplace_back(v);
                            return true;
                          })
                    .ok());
    if (!values.empty()) {
      ++scans;
      if (values.size() != 10 || std::count(values.begin(), values.end(), values[0]) != 10) {
        ++torn;
      }
    }
    auto j = this->kv().Get(Family::kJobs, "j");
    auto c = this->kv().Get(Family::kCursors, "c7");
    ASSERT_TRUE(j.ok() && c.ok());
    if (j->has_value() && (!c->has_value() || std::stoi(**c) < std::stoi(**j))) ++older;
  }
  writer.join();
  EXPECT_EQ(torn, 0) << "of " << scans << " scans";
  EXPECT_EQ(older, 0);
  EXPECT_EQ(this->Get(Family::kCursors, "c0"), std::to_string(kBatches));
}

TYPED_TEST(KvStoreConformance, ConcurrentAddsAreExact) {
  constexpr int kThreads = 4, kPerThread = 100;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        WriteBatch b;
        b.Add(Family::kErrors, "total", 2);
        b.Add(Family::kErrors, "total", -1);
        EXPECT_TRUE(this->kv().Write(b).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(this->Counter(Family::kErrors, "total"), uint64_t{kThreads * kPerThread});
}

}  // namespace
}  // namespace atfill::state
