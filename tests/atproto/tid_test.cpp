#include "atproto/tid.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <set>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

namespace atfill::atproto {
namespace {

TEST(Tid, ParseKnownValues) {
  auto zero = Tid::Parse("2222222222222");
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->value(), 0u);
  EXPECT_EQ(Tid().str(), "2222222222222");
  EXPECT_EQ(Tid(), *zero);

  // '7' is digit 5 in base32-sortable: every 5-bit group is 00101.
  auto sevens = Tid::Parse("7777777777777");
  ASSERT_TRUE(sevens.ok());
  uint64_t expected = 0;
  for (int i = 0; i < 13; ++i) expected = (expected << 5) | 5;
  EXPECT_EQ(sevens->value(), expected);

  // The largest value: first character 'j' (15) then 'z' (31) twelve times.
  auto max = Tid::Parse("jzzzzzzzzzzzz");
  ASSERT_TRUE(max.ok());
  EXPECT_EQ(max->value(), UINT64_MAX);
  EXPECT_EQ(Tid::FromValue(UINT64_MAX).str(), "jzzzzzzzzzzzz");
}

TEST(Tid, RoundTrip) {
  for (const char* text : {"3jzfcijpj2z2a", "7777777777777", "3zzzzzzzzzzzz", "2222222222222",
                           "3l25zusnsfctk", "bzzzzzzzzzzzz"}) {
    auto tid = Tid::Parse(text);
    ASSERT_TRUE(tid.ok()) << text << ": " << tid.status().ToString();
    EXPECT_EQ(tid->str(), text);
    EXPECT_EQ(Tid::FromValue(tid->value()).str(), text);
    auto parts = Tid::FromParts(tid->timestamp_us() & Tid::kMaxTimestampUs, tid->clock_id());
    if (tid->value() >> 63 == 0) {
      ASSERT_TRUE(parts.ok()) << text;
      EXPECT_EQ(*parts, *tid) << text;
    }
  }
}

TEST(Tid, Parts) {
  auto tid = Tid::FromParts(1724171495793000, 512);
  ASSERT_TRUE(tid.ok());
  EXPECT_EQ(tid->timestamp_us(), 1724171495793000u);
  EXPECT_EQ(tid->clock_id(), 512u);
  EXPECT_EQ(tid->value(), (uint64_t{1724171495793000} << 10) | 512);
  auto reparsed = Tid::Parse(tid->str());
  ASSERT_TRUE(reparsed.ok());
  EXPECT_EQ(reparsed->timestamp_us(), 1724171495793000u);
  EXPECT_EQ(reparsed->clock_id(), 512u);

  auto known = Tid::Parse("3jzfcijpj2z2a");
  ASSERT_TRUE(known.ok());
  EXPECT_EQ(known->value() >> 10, known->timestamp_us());
  EXPECT_EQ(known->value() & 1023, known->clock_id());

  auto max = Tid::FromParts(Tid::kMaxTimestampUs, Tid::kMaxClockId);
  ASSERT_TRUE(max.ok());
  EXPECT_EQ(max->value(), (uint64_t{1} << 63) - 1);
  EXPECT_EQ(max->str()[0], 'b');
  EXPECT_EQ(Tid::FromParts(Tid::kMaxTimestampUs + 1, 0).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(Tid::FromParts(0, 1024).status().code(), StatusCode::kOutOfRange);
}

TEST(Tid, OrderingMatchesText) {
  std::vector<uint64_t> values = {
      0, 1, 31, 32, 1023, 1024, uint64_t{1} << 40, UINT64_MAX, UINT64_MAX - 1, uint64_t{1} << 63};
  for (uint64_t a : values) {
    for (uint64_t b : values) {
      const Tid ta = Tid::FromValue(a);
      const Tid tb = Tid::FromValue(b);
      EXPECT_EQ(ta < tb, a < b) << a << " " << b;
      EXPECT_EQ(ta == tb, a == b) << a << " " << b;
      EXPECT_EQ(ta.str() < tb.str(), a < b) << ta.str() << " " << tb.str();
    }
  }
  std::unordered_set<Tid> set;
  for (uint64_t v : values) set.insert(Tid::FromValue(v));
  EXPECT_EQ(set.size(), values.size());
}

TEST(Tid, InvalidMessages) {
  EXPECT_EQ(ValidateTid("3jzfcijpj2z2").message(), "tid must be 13 characters long, not 12");
  EXPECT_EQ(ValidateTid("").message(), "tid must be 13 characters long, not 0");
  EXPECT_EQ(ValidateTid("3jzf-cij-pj2z-2a").message(), "tid must be 13 characters long, not 16");
  EXPECT_EQ(ValidateTid("3jzfcijpj2z21").message(),
            "tid has character '1' at offset 12, which is not in "
            "234567abcdefghijklmnopqrstuvwxyz");
  EXPECT_EQ(ValidateTid("3JZFCIJPJ2Z2A").message(),
            "tid has upper-case character 'J' at offset 1; tids are lower-case");
  EXPECT_EQ(ValidateTid("kjzfcijpj2z2a").message(),
            "tid first character 'k' is too high; it must be one of 234567abcdefghij");
  EXPECT_EQ(ValidateTid("3jzfcijpj2z2\xFF").message(),
            "tid has character byte 0xFF at offset 12, which is not in "
            "234567abcdefghijklmnopqrstuvwxyz");
  EXPECT_FALSE(Tid::Parse("zzzzzzzzzzzzz").ok());
  EXPECT_FALSE(Tid::Parse("0000000000000").ok());
}

TEST(TidClock, StrictlyIncreasingWhenTimeStalls) {
  TidClock clock(7, [] { return int64_t{1000}; });
  EXPECT_EQ(clock.clock_id(), 7u);
  Tid prev = clock.Next();
  EXPECT_EQ(prev.timestamp_us(), 1000u);
  EXPECT_EQ(prev.clock_id(), 7u);
  for (int i = 0; i < 100; ++i) {
    const Tid next = clock.Next();
    EXPECT_GT(next, prev);
    EXPECT_EQ(next.clock_id(), 7u);
    prev = next;
  }
  EXPECT_EQ(prev.timestamp_us(), 1100u);
}

TEST(TidClock, StrictlyIncreasingWhenTimeGoesBack) {
  std::atomic<int64_t> now{5'000'000};
  TidClock clock(1, [&now] { return now.load(); });
  const Tid first = clock.Next();
  now = 4'000'000;
  const Tid second = clock.Next();
  EXPECT_GT(second, first);
  EXPECT_EQ(second.timestamp_us(), 5'000'001u);
  now = 9'000'000;
  const Tid third = clock.Next();
  EXPECT_EQ(third.timestamp_us(), 9'000'000u);
  now = -5;
  EXPECT_GT(clock.Next(), third);
}

TEST(TidClock, ClockIdIsMaskedToTenBits) {
  TidClock clock(1024 + 3, [] { return int64_t{1}; });
  EXPECT_EQ(clock.clock_id(), 3u);
  EXPECT_EQ(clock.Next().clock_id(), 3u);
  TidClock random;
  EXPECT_LE(random.clock_id(), Tid::kMaxClockId);
  EXPECT_EQ(random.Next().clock_id(), random.clock_id());
}

TEST(TidClock, SystemClockIsNearNow) {
  TidClock clock(42);
  const Tid tid = clock.Next();
  // 2020-01-01 and 2200-01-01 bound any plausible test machine clock.
  EXPECT_GT(tid.timestamp_us(), uint64_t{1577836800} * 1000000);
  EXPECT_LT(tid.timestamp_us(), uint64_t{7258118400} * 1000000);
  EXPECT_EQ(tid.str().size(), kTidLength);
  EXPECT_TRUE(ValidateTid(tid.str()).ok());
}

TEST(TidClock, MonotonicAcrossTwoThreads) {
  // A time source that stalls most of the time forces the threads to contend on the same tick.
  std::atomic<int64_t> ticks{0};
  TidClock clock(9, [&ticks] { return 1'700'000'000'000'000 + ticks.fetch_add(1) / 64; });
  constexpr int kPerThread = 20000;
  std::vector<Tid> a;
  std::vector<Tid> b;
  a.reserve(kPerThread);
  b.reserve(kPerThread);
  auto run = [&clock](std::vector<Tid>* out) {
    for (int i = 0; i < kPerThread; ++i) out->push_back(clock.Next());
  };
  std::thread ta(run, &a);
  std::thread tb(run, &b);
  ta.join();
  tb.join();

  for (const auto* seq : {&a, &b}) {
    ASSERT_EQ(seq->size(), static_cast<size_t>(kPerThread));
    for (size_t i = 1; i < seq->size(); ++i) {
      ASSERT_LT((*seq)[i - 1], (*seq)[i]) << "at " << i;
    }
  }
  std::set<uint64_t> all;
  for (const Tid& t : a) all.insert(t.value());
  for (const Tid& t : b) all.insert(t.value());
  EXPECT_EQ(all.size(), static_cast<size_t>(2 * kPerThread)) << "two threads got the same TID";
  for (const Tid& t : a) ASSERT_EQ(t.clock_id(), 9u);
}

}  // namespace
}  // namespace atfill::atproto
