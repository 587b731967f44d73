#include "atproto/tid.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <random>
#include <utility>

#include "atproto/syntax.hpp"

namespace atfill::atproto {
namespace {

constexpr std::string_view kAlphabet = "234567abcdefghijklmnopqrstuvwxyz";
// 65 bits of text for 64 bits of value: the first character carries only 4 bits.
constexpr int kMaxFirstDigit = 15;

constexpr std::array<int8_t, 256> MakeDigitTable() {
  std::array<int8_t, 256> table{};
  for (auto& entry : table) entry = -1;
  for (size_t i = 0; i < kAlphabet.size(); ++i) {
    table[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int8_t>(i);
  }
  return table;
}
constexpr std::array<int8_t, 256> kDigit = MakeDigitTable();

int DigitOf(char c) { return kDigit[static_cast<unsigned char>(c)]; }

int64_t SystemNowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint32_t RandomClockId() {
  std::random_device device;
  return std::uniform_int_distribution<uint32_t>(0, Tid::kMaxClockId)(device);
}

}  // namespace

Status ValidateTid(std::string_view text) {
  if (text.size() != kTidLength) {
    return Status::Invalid("tid must be 13 characters long, not " + std::to_string(text.size()));
  }
  for (size_t i = 0; i < text.size(); ++i) {
    if (DigitOf(text[i]) >= 0) continue;
    const char c = text[i];
    if (c >= 'A' && c <= 'Z') {
      return Status::Invalid("tid has upper-case character " + DescribeByte(c) + " at offset " +
                             std::to_string(i) + "; tids are lower-case");
    }
    return Status::Invalid("tid has character " + DescribeByte(c) + " at offset " +
                           std::to_string(i) +
                           ", which is not in 234567abcdefghijklmnopqrstuvwxyz");
  }
  if (DigitOf(text[0]) > kMaxFirstDigit) {
    return Status::Invalid("tid first character " + DescribeByte(text[0]) +
                           " is too high; it must be one of 234567abcdefghij");
  }
  return Status::OK();
}

Tid::Tid() : Tid(uint64_t{0}) {}

Tid::Tid(uint64_t value) : value_(value), str_(kTidLength, '2') {
  for (size_t i = kTidLength; i-- > 0;) {
    str_[i] = kAlphabet[value & 31];
    value >>= 5;
  }
}

Result<Tid> Tid::Parse(std::string_view text) {
  ATFILL_RETURN_IF_ERROR(ValidateTid(text));
  uint64_t value = 0;
  for (char c : text) value = (value << 5) | static_cast<uint64_t>(DigitOf(c));
  return Tid(value);
}

Tid Tid::FromValue(uint64_t value) { return Tid(value); }

Result<Tid> Tid::FromParts(uint64_t timestamp_us, uint32_t clock_id) {
  if (timestamp_us > kMaxTimestampUs) {
    return Status::OutOfRange("tid timestamp " + std::to_string(timestamp_us) +
                              " does not fit in 53 bits");
  }
  if (clock_id > kMaxClockId) {
    return Status::OutOfRange("tid clock id " + std::to_string(clock_id) +
                              " does not fit in 10 bits");
  }
  return Tid((timestamp_us << 10) | clock_id);
}

TidClock::TidClock() : TidClock(RandomClockId()) {}

TidClock::TidClock(uint32_t clock_id) : TidClock(clock_id, SystemNowMicros) {}

TidClock::TidClock(uint32_t clock_id, NowFn now)
    : clock_id_(clock_id & Tid::kMaxClockId), now_(std::move(now)) {}

Tid TidClock::Next() {
  int64_t now = now_();
  if (now < 0) now = 0;
  const uint64_t micros = std::min<uint64_t>(static_cast<uint64_t>(now), Tid::kMaxTimestampUs);
  const uint64_t candidate = (micros << 10) | clock_id_;
  uint64_t last = last_.load(std::memory_order_relaxed);
  uint64_t next;
  do {
    // Stepping by 1 << 10 keeps the clock id in the low bits while moving one microsecond on.
    next = candidate > last ? candidate : last + (uint64_t{1} << 10);
  } while (!last_.compare_exchange_weak(last, next, std::memory_order_relaxed));
  return Tid::FromValue(next);
}

}  // namespace atfill::atproto
