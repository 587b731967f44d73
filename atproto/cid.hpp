// CIDv1 over sha2-256 with the dag-cbor (0x71) or raw (0x55) codec: the only CIDs atproto
// repositories and records use.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/bytes.hpp"
#include "base/status.hpp"

namespace atfill::atproto {

class Cid {
 public:
  enum class Codec : uint8_t { kDagCbor = 0x71, kRaw = 0x55 };
  // Binary form: version 0x01, codec, multihash code 0x12, digest length 0x20, 32 digest bytes.
  static constexpr size_t kBinarySize = 36;

  // The all-zero placeholder; valid() is false.
  Cid() = default;

  // Hashes `data` with sha2-256.
  static Cid Compute(Codec codec, ByteView data);
  // Exactly kBinarySize bytes of binary CID.
  static Result<Cid> FromBinary(ByteView data);
  // A binary CID at the front of `data` (as in CAR sections); sets *consumed to kBinarySize.
  // Other versions, codecs and hash functions, and CIDv0, are Unsupported; a short input is
  // Corrupt.
  static Result<Cid> ReadBinaryPrefix(ByteView data, size_t* consumed);
  // The multibase base32 string form ("bafy..."). Other multibase prefixes ('z', 'f', ...) and
  // CIDv0 ("Qm...") are Unsupported; anything else that is not a CID is Invalid.
  static Result<Cid> Parse(std::string_view text);

  bool valid() const { return bytes_[0] == 0x01; }
  Codec codec() const { return static_cast<Codec>(bytes_[1]); }
  ByteView binary() const { return {bytes_.data(), bytes_.size()}; }
  ByteView digest() const { return {bytes_.data() + 4, 32}; }
  // "b" + base32 of binary(); empty for the invalid placeholder.
  std::string ToString() const;

  friend bool operator==(const Cid&, const Cid&) = default;
  friend auto operator<=>(const Cid&, const Cid&) = default;

 private:
  std::array<uint8_t, kBinarySize> bytes_{};
};

}  // namespace atfill::atproto

template <>
struct std::hash<atfill::atproto::Cid> {
  size_t operator()(const atfill::atproto::Cid& cid) const noexcept {
    size_t h;
    static_assert(sizeof(h) <= 32);
    __builtin_memcpy(&h, cid.digest().data(), sizeof(h));
    return h;
  }
};
