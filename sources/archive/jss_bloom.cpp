#include "sources/archive/jss_bloom.hpp"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <boost/crc.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "sources/archive/jss_internal.hpp"

namespace atfill::jss {
namespace {

static_assert(std::endian::native == std::endian::little, "the .jss codec assumes little-endian");

// gloom's partition sizes per k: pairwise coprime, summing to the 512 bits of a block.
constexpr std::array<std::array<uint16_t, 17>, 18> kPartitions = {{
    {},
    {},
    {},
    {167, 173, 172},
    {109, 127, 137, 139},
    {97, 101, 103, 109, 102},
    {61, 79, 83, 89, 97, 103},
    {61, 67, 71, 79, 83, 89, 62},
    {37, 47, 53, 61, 67, 71, 79, 97},
    {41, 43, 47, 53, 59, 67, 71, 73, 58},
    {31, 37, 41, 43, 47, 53, 59, 61, 67, 73},
    {29, 31, 37, 41, 43, 44, 47, 53, 59, 61, 67},
    {17, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 71},
    {17, 19, 23, 29, 31, 37, 41, 43, 47, 52, 53, 59, 61},
    {11, 13, 17, 19, 23, 29, 31, 37, 41, 47, 53, 59, 61, 71},
    {11, 13, 17, 19, 23, 28, 29, 31, 37, 41, 43, 47, 53, 59, 61},
    {5, 7, 11, 13, 17, 19, 23, 27, 29, 31, 37, 41, 43, 47, 53, 109},
    {3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 32, 37, 41, 43, 47, 53, 101},
}};

// offset[k][i] = sum of the first i partitions of k.
constexpr std::array<std::array<uint16_t, 17>, 18> kOffsets = [] {
  std::array<std::array<uint16_t, 17>, 18> out{};
  for (size_t k = Bloom::kMinK; k <= Bloom::kMaxK; ++k) {
    uint16_t sum = 0;
    for (size_t i = 0; i < k; ++i) {
      out[k][i] = sum;
      sum = static_cast<uint16_t>(sum + kPartitions[k][i]);
    }
  }
  return out;
}();

constexpr bool PartitionsSumTo512() {
  for (size_t k = Bloom::kMinK; k <= Bloom::kMaxK; ++k) {
    if (kOffsets[k][k - 1] + kPartitions[k][k - 1] != 512) return false;
  }
  return true;
}
static_assert(PartitionsSumTo512());

// gloom's constant, kept bit-identical so the sizing arithmetic matches.
constexpr double kLn2Squared = 0.4804530139182014;
constexpr size_t kPrefixBytes = 21;  // version, k, num_blocks, count

using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

uint32_t Crc(const uint8_t* data, size_t size) {
  Crc32c crc;
  crc.process_bytes(data, size);
  return crc.checksum();
}

uint32_t Intra(const DidHash& h) {
  return static_cast<uint32_t>(h.low) ^ static_cast<uint32_t>(h.low >> 32);
}

double BlockFalsePositiveRate(uint32_t k, double items) {
  double fp = 1.0;
  for (uint32_t i = 0; i < k; ++i) {
    fp *= 1.0 - std::pow(1.0 - 1.0 / static_cast<double>(kPartitions[k][i]), items);
  }
  return fp;
}

uint32_t BestK(uint64_t num_blocks, uint64_t n) {
  uint32_t best = Bloom::kMinK;
  double best_fp = std::numeric_limits<double>::infinity();
  for (uint32_t k = Bloom::kMinK; k <= Bloom::kMaxK; ++k) {
    const double fp = Bloom::EstimateFalsePositiveRate(num_blocks, k, n);
    if (fp < best_fp) {
      best_fp = fp;
      best = k;
    }
  }
  return best;
}

}  // namespace

DidHash HashDid(std::string_view did) {
  const XXH128_hash_t h = XXH3_128bits(did.data(), did.size());
  return {h.low64, h.high64};
}

Result<Bloom> Bloom::Make(uint64_t num_blocks, uint32_t k) {
  if (k < kMinK || k > kMaxK) {
    return Status::Invalid("bloom filter k " + std::to_string(k) + " is outside 3..17");
  }
  // 2^40 blocks is 64 TiB of filter: any more is a corrupt or hostile size.
  if (num_blocks == 0 || num_blocks > (uint64_t{1} << 40)) {
    return Status::Invalid("bloom filter num_blocks " + std::to_string(num_blocks) +
                           " is outside 1..2^40");
  }
  Bloom b;
  b.k_ = k;
  b.words_.assign(num_blocks * 8, 0);
  return b;
}

Bloom Bloom::ForCount(uint64_t n) {
  const Params p = SizeFor(n);
  return std::move(Make(p.num_blocks, p.k)).value();
}

double Bloom::EstimateFalsePositiveRate(uint64_t num_blocks, uint32_t k, uint64_t n) {
  if (num_blocks == 0 || n == 0) return 0;
  if (k < kMinK || k > kMaxK) return 1;
  const double lambda = static_cast<double>(n) / static_cast<double>(num_blocks);
  // At very high loads the Poisson spread is negligible next to the mean.
  if (lambda > 10000) return BlockFalsePositiveRate(k, lambda);
  const int max_j = static_cast<int>(lambda + 10 * std::sqrt(lambda) + 20);
  const double log_lambda = std::log(lambda);
  double log_factorial = 0;
  double fp = 0;
  for (int j = 0; j <= max_j; ++j) {
    if (j > 0) log_factorial += std::log(static_cast<double>(j));
    const double prob = std::exp(-lambda + j * log_lambda - log_factorial);
    if (prob < 1e-15 && j > static_cast<int>(lambda)) break;
    if (j > 0) fp += prob * BlockFalsePositiveRate(k, j);
  }
  return fp;
}

Bloom::Params Bloom::SizeFor(uint64_t n, double fp) {
  if (n == 0) n = 1;
  if (fp <= 0) fp = 0.0001;
  if (fp >= 1) fp = 0.99;
  const double bits_per_item = -std::log(fp) / kLn2Squared;
  const auto base = static_cast<uint64_t>(std::ceil(static_cast<double>(n) * bits_per_item / 512));
  const auto cap = static_cast<uint64_t>(std::ceil(static_cast<double>(base) * 4.0));
  Params p{base, BestK(base, n)};
  while (EstimateFalsePositiveRate(p.num_blocks, p.k, n) > fp && p.num_blocks < cap) {
    p.num_blocks = std::min(p.num_blocks + p.num_blocks / 8 + 1, cap);
    p.k = BestK(p.num_blocks, n);
  }
  return p;
}

Result<Bloom> Bloom::Parse(ByteView bytes) {
  if (bytes.size() < kOverheadBytes) {
    return Status::Corrupt("bloom filter is " + std::to_string(bytes.size()) +
                           " bytes, shorter than its 25-byte frame");
  }
  const uint8_t* p = bytes.data();
  const uint32_t stored_crc = Load<uint32_t>(p + bytes.size() - 4);
  const uint32_t crc = Crc(p, bytes.size() - 4);
  if (stored_crc != crc) {
    return Status::Corrupt("bloom filter CRC-32C mismatch (stored " + std::to_string(stored_crc) +
                           ", computed " + std::to_string(crc) + ")");
  }
  if (p[0] != kVersion) {
    return Status::Unsupported("bloom filter version " + std::to_string(p[0]) + " (want 1)");
  }
  const uint32_t k = Load<uint32_t>(p + 1);
  const uint64_t num_blocks = Load<uint64_t>(p + 5);
  const uint64_t count = Load<uint64_t>(p + 13);
  if (k < kMinK || k > kMaxK) {
    return Status::Unsupported("bloom filter k " + std::to_string(k) + " is outside 3..17");
  }
  if (num_blocks == 0 || num_blocks > (bytes.size() - kOverheadBytes) / 64 ||
      SerializedSize(num_blocks) != bytes.size()) {
    return Status::Corrupt("bloom filter of " + std::to_string(num_blocks) + " blocks in " +
                           std::to_string(bytes.size()) + " bytes (want 25 + 64 per block)");
  }
  Bloom b;
  b.k_ = k;
  b.count_ = count;
  b.words_.resize(num_blocks * 8);
  std::memcpy(b.words_.data(), p + kPrefixBytes, num_blocks * 64);
  return b;
}

void Bloom::AppendTo(std::string* out) const {
  const size_t start = out->size();
  out->reserve(start + serialized_size());
  out->push_back(static_cast<char>(kVersion));
  Put<uint32_t>(out, k_);
  Put<uint64_t>(out, num_blocks());
  Put<uint64_t>(out, count_);
  out->append(reinterpret_cast<const char*>(words_.data()), words_.size() * 8);
  Put<uint32_t>(out,
                Crc(reinterpret_cast<const uint8_t*>(out->data()) + start, out->size() - start));
}

std::string Bloom::Serialize() const {
  std::string out;
  AppendTo(&out);
  return out;
}

uint64_t Bloom::BlockOf(const DidHash& hash, uint64_t num_blocks) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(hash.high) * num_blocks) >> 64);
}

std::vector<uint16_t> Bloom::BitPositions(const DidHash& hash, uint32_t k) {
  std::vector<uint16_t> out;
  if (k < kMinK || k > kMaxK) return out;
  const uint32_t intra = Intra(hash);
  for (uint32_t i = 0; i < k; ++i) {
    out.push_back(static_cast<uint16_t>(kOffsets[k][i] + intra % kPartitions[k][i]));
  }
  return out;
}

void Bloom::Add(const DidHash& hash) {
  if (words_.empty()) return;
  uint64_t* block = words_.data() + 8 * BlockOf(hash, num_blocks());
  const uint32_t intra = Intra(hash);
  const auto& parts = kPartitions[k_];
  const auto& offs = kOffsets[k_];
  for (uint32_t i = 0; i < k_; ++i) {
    const uint32_t pos = offs[i] + intra % parts[i];
    block[pos / 64] |= uint64_t{1} << (pos % 64);
  }
  ++count_;
}

bool Bloom::MayContain(const DidHash& hash) const {
  if (words_.empty()) return true;
  const uint64_t* block = words_.data() + 8 * BlockOf(hash, num_blocks());
  const uint32_t intra = Intra(hash);
  const auto& parts = kPartitions[k_];
  const auto& offs = kOffsets[k_];
  for (uint32_t i = 0; i < k_; ++i) {
    const uint32_t pos = offs[i] + intra % parts[i];
    if ((block[pos / 64] >> (pos % 64) & 1) == 0) return false;
  }
  return true;
}

}  // namespace atfill::jss
