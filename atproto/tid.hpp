// Timestamp identifiers (atproto.com/specs/tid): a 64-bit integer written as 13 characters of
// base32-sortable ("234567abcdefghijklmnopqrstuvwxyz"), so text order is numeric order. Layout of
// the integer: top bit 0, 53 bits of microseconds since the UNIX epoch, 10 bits of clock id.
#pragma once

#include <atomic>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/status.hpp"

namespace atfill::atproto {

inline constexpr size_t kTidLength = 13;

// Exactly 13 base32-sortable characters, the first one of "234567abcdefghij" (the 13 characters
// hold 65 bits; the first may only carry 4). Case-sensitive. Allocates nothing when valid.
Status ValidateTid(std::string_view text);

// Immutable value: the integer and its 13-character text. Ordered by value (= by text).
class Tid {
 public:
  static constexpr uint64_t kMaxTimestampUs = (uint64_t{1} << 53) - 1;
  static constexpr uint32_t kMaxClockId = 1023;

  // The zero TID, "2222222222222".
  Tid();
  static Result<Tid> Parse(std::string_view text);
  // Any 64-bit value has a TID text (one with the top bit set starts with c..j).
  static Tid FromValue(uint64_t value);
  // (timestamp_us << 10) | clock_id. OutOfRange when timestamp_us exceeds 53 bits or clock_id
  // exceeds 10 bits.
  static Result<Tid> FromParts(uint64_t timestamp_us, uint32_t clock_id);

  uint64_t value() const { return value_; }
  // value() >> 10: microseconds since the epoch for a TID made to the spec (top bit 0).
  uint64_t timestamp_us() const { return value_ >> 10; }
  uint32_t clock_id() const { return static_cast<uint32_t>(value_ & kMaxClockId); }
  const std::string& str() const { return str_; }

  friend bool operator==(const Tid& a, const Tid& b) { return a.value_ == b.value_; }
  friend std::strong_ordering operator<=>(const Tid& a, const Tid& b) {
    return a.value_ <=> b.value_;
  }

 private:
  explicit Tid(uint64_t value);

  uint64_t value_ = 0;
  std::string str_;
};

// Generates strictly increasing TIDs: each Next() is greater than every TID this clock returned
// before, even when the time source stalls or goes backwards (the timestamp then advances by one
// microsecond past the last TID). Every TID carries this clock's clock id.
// Thread-safe: Next() may be called from any number of threads at once (lock-free CAS loop).
class TidClock {
 public:
  // Returns microseconds since the UNIX epoch; called concurrently from Next(), so it must be
  // thread-safe.
  using NowFn = std::function<int64_t()>;

  // A random clock id and the system clock.
  TidClock();
  // The given clock id (only its low 10 bits are used) and the system clock.
  explicit TidClock(uint32_t clock_id);
  // The given clock id (low 10 bits) and time source (tests, simulations).
  TidClock(uint32_t clock_id, NowFn now);

  TidClock(const TidClock&) = delete;
  TidClock& operator=(const TidClock&) = delete;

  Tid Next();
  uint32_t clock_id() const { return clock_id_; }

 private:
  uint32_t clock_id_;
  NowFn now_;
  std::atomic<uint64_t> last_{0};  // value of the last TID returned; 0 before the first
};

}  // namespace atfill::atproto

template <>
struct std::hash<atfill::atproto::Tid> {
  size_t operator()(const atfill::atproto::Tid& tid) const noexcept {
    return std::hash<uint64_t>{}(tid.value());
  }
};
