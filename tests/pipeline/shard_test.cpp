// pipeline::Shard and ShardFilter: how n processes split the DID space.
#include "pipeline/shard.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pipeline/chunk.hpp"

namespace atfill::pipeline {
namespace {

TEST(ShardTest, ParsesIOfNCountedFromZero) {
  auto s = Shard::Parse("2/3");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->index, 2u);
  EXPECT_EQ(s->count, 3u);
  EXPECT_EQ(s->ToString(), "2/3");
  EXPECT_FALSE(s->all());
  auto one = Shard::Parse("0/1");
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->all());
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c :
       {Case{"3/3", "must be below n"}, Case{"0/0", "n must be 1 to 65536"},
        Case{"0/70000", "n must be 1 to 65536"}, Case{"1", "is not i/n"}, Case{"/3", "is not i/n"},
        Case{"1/", "is not i/n"}, Case{"-1/3", "is not i/n"}, Case{"1/3x", "is not i/n"},
        Case{" 1/3", "is not i/n"}, Case{"", "is not i/n"}}) {
    auto bad = Shard::Parse(c.text);
    ASSERT_FALSE(bad.ok()) << c.text;
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalid);
    EXPECT_NE(bad.status().message().find(c.message), std::string::npos)
        << c.text << ": " << bad.status().ToString();
  }
}

TEST(ShardTest, EveryDidBelongsToExactlyOneShardAndTheShardsAreBalanced) {
  constexpr uint32_t kCount = 3;
  std::vector<size_t> owned(kCount);
  for (int i = 0; i < 6000; ++i) {
    const std::string did = "did:plc:" + std::to_string(i * 7919) + "abcdefghijklmnop";
    int owners = 0;
    for (uint32_t s = 0; s < kCount; ++s) {
      if (Shard{s, kCount}.Owns(did)) {
        ++owners;
        ++owned[s];
      }
    }
    EXPECT_EQ(owners, 1) << did;
    EXPECT_TRUE(Shard{}.Owns(did));
  }
  for (uint32_t s = 0; s < kCount; ++s) {
    EXPECT_GT(owned[s], 1800u) << "shard " << s;
    EXPECT_LT(owned[s], 2200u) << "shard " << s;
  }
}

// The hash is part of the on-disk contract: processes of different versions on different
// machines must agree on who owns a DID. These are XXH3-64 of the DIDs, modulo 3 and 1000.
TEST(ShardTest, OwnershipIsAFixedFunctionOfTheDid) {
  const std::string did = "did:plc:z72i7hdynmk6r22z27h6tvur";
  std::vector<uint32_t> of3, of1000;
  for (uint32_t s = 0; s < 3; ++s)
    if (Shard{s, 3}.Owns(did)) of3.push_back(s);
  for (uint32_t s = 0; s < 1000; ++s)
    if (Shard{s, 1000}.Owns(did)) of1000.push_back(s);
  ASSERT_EQ(of3.size(), 1u);
  ASSERT_EQ(of1000.size(), 1u);
  EXPECT_EQ(of3[0], 1u);
  EXPECT_EQ(of1000[0], 562u);
}

TEST(ShardTest, TheFilterKeepsOnlyTheShardsEventsInOrderAndCountsTheRest) {
  const Shard shard{1, 2};
  EventChunk chunk;
  std::vector<std::string> kept;
  for (int i = 0; i < 40; ++i) {
    const std::string did = "did:plc:user" + std::to_string(i);
    if (i % 4 == 3) {
      AccountEvent a;
      a.did = did;
      chunk.events.emplace_back(a);
    } else {
      RecordEvent r;
      r.did = did;
      r.collection = "app.bsky.feed.post";
      r.rkey = std::to_string(i);
      chunk.events.emplace_back(r);
    }
    if (shard.Owns(did)) kept.push_back(did);
  }
  ASSERT_GT(kept.size(), 5u);
  ASSERT_LT(kept.size(), 35u);
  ShardFilter filter(shard);
  ASSERT_TRUE(filter.Process(nullptr, &chunk).ok());
  std::vector<std::string> got;
  for (const Event& e : chunk.events) got.push_back(DidOf(e));
  EXPECT_EQ(got, kept);
  ASSERT_EQ(chunk.counters.size(), 1u);
  EXPECT_EQ(chunk.counters[0].first, "other_shard_events");
  EXPECT_EQ(chunk.counters[0].second, static_cast<int64_t>(40 - kept.size()));
  EXPECT_EQ(chunk.dropped, 0u);  // not bad input
  EXPECT_TRUE(chunk.errors.empty());
  // An unsharded filter changes nothing and counts nothing.
  EventChunk all = chunk;
  all.counters.clear();
  ASSERT_TRUE(ShardFilter(Shard{}).Process(nullptr, &all).ok());
  EXPECT_EQ(all.events.size(), kept.size());
  EXPECT_TRUE(all.counters.empty());
}

}  // namespace
}  // namespace atfill::pipeline
