// The DID bloom filters of Jetstream v2 `.jss` segments: the gloom v0.1.0 blocked, partitioned
// filter (SPEC.md in ../shared/protocols/jetstream, §4.6). One filter covers a whole segment and
// one covers each block; readers test a DID against both before reading a block.
//
// Serialized form: u8 version 1, u32 k, u64 num_blocks, u64 count, num_blocks x 8 u64 words
// (512-bit blocks), u32 CRC-32C of everything before it; all little-endian.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/bytes.hpp"
#include "base/status.hpp"

namespace atfill::jss {

// XXH3-128 (seed 0) of a DID's bytes: everything a filter needs to add or test the DID. Hash a
// DID once and test it against many filters.
struct DidHash {
  uint64_t low = 0;
  uint64_t high = 0;
  friend bool operator==(const DidHash&, const DidHash&) = default;
};
DidHash HashDid(std::string_view did);

// Immutable once built by the writer; const methods are safe from many threads.
class Bloom {
 public:
  static constexpr uint32_t kMinK = 3;
  static constexpr uint32_t kMaxK = 17;
  static constexpr uint8_t kVersion = 1;
  // What Jetstream's writer targets for both the segment and the per-block filters.
  static constexpr double kTargetFalsePositiveRate = 0.001;
  // The fixed part of the serialized form: 21 bytes before the words and the 4-byte CRC.
  static constexpr uint64_t kOverheadBytes = 25;

  struct Params {
    uint64_t num_blocks = 0;
    uint32_t k = 0;
    friend bool operator==(const Params&, const Params&) = default;
  };

  // A filter with no blocks: it filters nothing (MayContain is always true) and Add ignores
  // its argument. Parse and ForCount never return one.
  Bloom() = default;

  // An empty filter of `num_blocks` 512-bit blocks probing `k` bits per item.
  // Invalid unless kMinK <= k <= kMaxK and num_blocks >= 1.
  static Result<Bloom> Make(uint64_t num_blocks, uint32_t k);
  // An empty filter sized by gloom's rule for `n` items at kTargetFalsePositiveRate
  // (n = 0 is treated as 1).
  static Bloom ForCount(uint64_t n);
  // gloom's sizing rule: nb = ceil(n * -ln(fp) / ln(2)^2 / 512), then k = the FP-minimizing
  // k in [3, 17], growing nb by nb/8 + 1 (capped at 4x the start) while the estimate is above
  // `fp`.
  static Params SizeFor(uint64_t n, double fp = kTargetFalsePositiveRate);
  // The expected false-positive rate of a filter of `num_blocks` blocks and `k` probes holding
  // `n` items (Poisson-weighted over per-block loads).
  static double EstimateFalsePositiveRate(uint64_t num_blocks, uint32_t k, uint64_t n);

  // Parses exactly one serialized filter; `bytes` must be exactly its size. Corrupt on a CRC
  // mismatch or a size that disagrees with num_blocks; Unsupported on another version or k.
  static Result<Bloom> Parse(ByteView bytes);
  std::string Serialize() const;
  void AppendTo(std::string* out) const;
  static uint64_t SerializedSize(uint64_t num_blocks) { return kOverheadBytes + 64 * num_blocks; }
  uint64_t serialized_size() const { return SerializedSize(num_blocks()); }

  void Add(std::string_view did) { Add(HashDid(did)); }
  void Add(const DidHash& hash);
  // False only when the DID was certainly never added.
  bool MayContain(std::string_view did) const { return MayContain(HashDid(did)); }
  bool MayContain(const DidHash& hash) const;

  uint32_t k() const { return k_; }
  uint64_t num_blocks() const { return words_.size() / 8; }
  // Items added (each Add counts, duplicates too).
  uint64_t count() const { return count_; }
  // Word w of block b is words()[8 * b + w].
  const std::vector<uint64_t>& words() const { return words_; }

  // The block a hash selects among `num_blocks` (num_blocks >= 1).
  static uint64_t BlockOf(const DidHash& hash, uint64_t num_blocks);
  // The k bit positions (0..511, one per partition) a hash sets inside its block.
  static std::vector<uint16_t> BitPositions(const DidHash& hash, uint32_t k);

  friend bool operator==(const Bloom&, const Bloom&) = default;

 private:
  uint32_t k_ = 0;
  uint64_t count_ = 0;
  std::vector<uint64_t> words_;
};

}  // namespace atfill::jss
