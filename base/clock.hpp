// The clocks atfill reads, as integers: one definition for every folder.
#pragma once

#include <chrono>
#include <cstdint>

namespace atfill {

// Monotonic milliseconds (std::chrono::steady_clock): for timeouts, idle checks and rates.
inline int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Wall-clock microseconds since the Unix epoch (std::chrono::system_clock): for times stored or
// shown (indexed_at, job records, the error log).
inline int64_t SystemNowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace atfill
