// A Bloom filter over strings: "maybe present" or "certainly absent", in a fixed number of bits.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace atfill {

// Not thread-safe. Sized once for an expected number of keys at about 1% false positives (at
// least 10 bits per key, rounded up to a power of two; 7 probes); past that the false-positive
// rate grows, nothing breaks.
class BloomFilter {
 public:
  explicit BloomFilter(uint64_t expected_keys);
  void Add(std::string_view key);
  bool MayContain(std::string_view key) const;
  uint64_t bits() const { return bits_.size() * 64; }

 private:
  static constexpr int kProbes = 7;
  std::vector<uint64_t> bits_;
};

}  // namespace atfill
