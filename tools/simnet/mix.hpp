// Internal to simnet: the seeded mixing every generated thing is drawn from (splitmix64's
// finaliser), so that one seed gives one network.
#pragma once

#include <cstdint>

namespace atfill::simnet {

inline uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) from 64 random bits.
inline double Unit(uint64_t random) { return static_cast<double>(random >> 11) * 0x1.0p-53; }

}  // namespace atfill::simnet
