// The sinks' in-memory intern cache.
#include <gtest/gtest.h>

#include <string>

#include "sinks/intern_cache.hpp"

namespace atfill::sinks {
namespace {

TEST(InternCacheTest, FindsWhatWasAddedAndNothingElse) {
  InternCache cache(1 << 20);
  constexpr int kKeys = 50'000;  // forces several rehashes
  for (int i = 0; i < kKeys; ++i) cache.Add("did:plc:key" + std::to_string(i), i * 7 + 1);
  EXPECT_EQ(cache.size(), static_cast<size_t>(kKeys));
  for (int i = 0; i < kKeys; ++i) {
    std::optional<int64_t> id = cache.Find("did:plc:key" + std::to_string(i));
    ASSERT_TRUE(id.has_value()) << i;
    EXPECT_EQ(*id, i * 7 + 1);
  }
  // Prefixes, extensions and near misses of stored keys are absent.
  EXPECT_FALSE(cache.Find("did:plc:key").has_value());
  EXPECT_FALSE(cache.Find("did:plc:key1x").has_value());
  EXPECT_FALSE(cache.Find("did:plc:key" + std::to_string(kKeys)).has_value());
  EXPECT_FALSE(cache.Find("").has_value());
}

// Reserved room (as a warm-up from the table sizes it) changes nothing of what is found, keeps what
// was there, and never lifts the bound: at the bound the cache still starts again.
TEST(InternCacheTest, ReservedRoomKeepsEntriesAndTheBound) {
  InternCache cache(100);
  cache.Add("kept", 1);
  cache.Reserve(1'000'000);
  EXPECT_EQ(cache.Find("kept"), 1);
  for (int i = 0; i < 99; ++i) cache.Add("k" + std::to_string(i), i + 2);
  EXPECT_EQ(cache.size(), 100u);
  for (int i = 0; i < 99; ++i) EXPECT_EQ(cache.Find("k" + std::to_string(i)), i + 2);
  cache.Add("one more", 500);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.Find("one more"), 500);
  EXPECT_FALSE(cache.Find("kept").has_value());
}

TEST(InternCacheTest, EmptyAndBinaryKeys) {
  InternCache cache(16);
  cache.Add("", 5);
  cache.Add(std::string("a\0b", 3), 6);
  EXPECT_EQ(cache.Find(""), 5);
  EXPECT_EQ(cache.Find(std::string("a\0b", 3)), 6);
  EXPECT_FALSE(cache.Find("a").has_value());
}

TEST(InternCacheTest, StartsAgainWhenFull) {
  InternCache cache(3);
  cache.Add("a", 1);
  cache.Add("b", 2);
  cache.Add("c", 3);
  EXPECT_EQ(cache.size(), 3u);
  cache.Add("d", 4);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_FALSE(cache.Find("a").has_value());
  EXPECT_EQ(cache.Find("d"), 4);
  cache.Clear();
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_FALSE(cache.Find("d").has_value());
}

}  // namespace
}  // namespace atfill::sinks
