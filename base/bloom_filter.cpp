#include "base/bloom_filter.hpp"

#include <algorithm>
#include <bit>
#include <functional>

namespace atfill {
namespace {

// Two independent 64-bit hashes (double hashing gives the k probes).
uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

}  // namespace

// The bit count is a power of two, so a probe is a mask, not a division.
BloomFilter::BloomFilter(uint64_t expected_keys)
    : bits_(std::bit_ceil(std::max<uint64_t>(expected_keys, 1024) * 10) / 64, 0) {}

void BloomFilter::Add(std::string_view key) {
  const uint64_t h1 = std::hash<std::string_view>{}(key);
  const uint64_t h2 = Mix(h1) | 1;
  const uint64_t n = bits();
  for (int i = 0; i < kProbes; ++i) {
    const uint64_t bit = (h1 + static_cast<uint64_t>(i) * h2) & (n - 1);
    bits_[bit / 64] |= uint64_t{1} << (bit % 64);
  }
}

bool BloomFilter::MayContain(std::string_view key) const {
  const uint64_t h1 = std::hash<std::string_view>{}(key);
  const uint64_t h2 = Mix(h1) | 1;
  const uint64_t n = bits();
  for (int i = 0; i < kProbes; ++i) {
    const uint64_t bit = (h1 + static_cast<uint64_t>(i) * h2) & (n - 1);
    if ((bits_[bit / 64] & (uint64_t{1} << (bit % 64))) == 0) return false;
  }
  return true;
}

}  // namespace atfill
