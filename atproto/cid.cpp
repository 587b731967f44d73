#include "atproto/cid.hpp"

#include <cstdio>
#include <cstring>

#include "base/encoding.hpp"
#include "base/sha256.hpp"

namespace atfill::atproto {
namespace {

constexpr uint8_t kVersion1 = 0x01;
constexpr uint8_t kSha256Code = 0x12;
constexpr uint8_t kSha256Length = 0x20;

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Names of multicodec entries a caller is likely to meet, so errors say what was found.
std::string CodecName(uint64_t code) {
  switch (code) {
    case 0x55:
      return "raw (0x55)";
    case 0x70:
      return "dag-pb (0x70)";
    case 0x71:
      return "dag-cbor (0x71)";
    case 0x0129:
      return "dag-json (0x129)";
    case 0x0200:
      return "json (0x200)";
    case 0x51:
      return "cbor (0x51)";
    default:
      return Hex(code);
  }
}

std::string HashName(uint64_t code) {
  switch (code) {
    case 0x00:
      return "identity (0x0)";
    case 0x11:
      return "sha1 (0x11)";
    case 0x12:
      return "sha2-256 (0x12)";
    case 0x13:
      return "sha2-512 (0x13)";
    case 0x16:
      return "sha3-256 (0x16)";
    case 0x1e:
      return "blake3 (0x1e)";
    case 0xb220:
      return "blake2b-256 (0xb220)";
    default:
      return Hex(code);
  }
}

// Multibase prefixes of other encodings, named so the error says which one was seen.
const char* MultibaseName(char prefix) {
  switch (prefix) {
    case 'z':
      return "base58btc";
    case 'f':
    case 'F':
      return "base16";
    case 'B':
      return "base32upper";
    case 'c':
    case 'C':
      return "base32pad";
    case 'v':
    case 'V':
      return "base32hex";
    case 't':
    case 'T':
      return "base32hexpad";
    case 'h':
      return "base32z";
    case 'k':
    case 'K':
      return "base36";
    case 'm':
      return "base64";
    case 'M':
      return "base64pad";
    case 'u':
      return "base64url";
    case 'U':
      return "base64urlpad";
    case '0':
      return "base2";
    case '7':
      return "base8";
    case '9':
      return "base10";
    default:
      return nullptr;
  }
}

// Base32 (RFC 4648 lower case) value of each character, 0xff outside the alphabet.
constexpr std::array<uint8_t, 256> kBase32Values = [] {
  std::array<uint8_t, 256> table{};
  for (auto& v : table) v = 0xff;
  constexpr std::string_view kAlphabet = "abcdefghijklmnopqrstuvwxyz234567";
  for (size_t i = 0; i < kAlphabet.size(); ++i) {
    table[static_cast<uint8_t>(kAlphabet[i])] = static_cast<uint8_t>(i);
  }
  return table;
}();

// "b" + 58 base32 characters: the only text form of a CID atproto writes.
constexpr size_t kTextSize = 59;

// Decodes the common case without allocating: exactly kTextSize characters of a CIDv1 sha2-256
// dag-cbor/raw CID. Returns false for anything else, which the general path then explains.
bool ParseFast(std::string_view text, std::array<uint8_t, Cid::kBinarySize>* out) {
  if (text.size() != kTextSize || text[0] != 'b') return false;
  const char* p = text.data() + 1;
  uint8_t* o = out->data();
  // 7 groups of 8 characters (40 bits, 5 bytes), then 2 characters for the last byte.
  for (int group = 0; group < 7; ++group) {
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) {
      const uint8_t v = kBase32Values[static_cast<uint8_t>(*p++)];
      if (v == 0xff) return false;
      bits = (bits << 5) | v;
    }
    for (int i = 0; i < 5; ++i) *o++ = static_cast<uint8_t>(bits >> (32 - 8 * i));
  }
  const uint8_t hi = kBase32Values[static_cast<uint8_t>(p[0])];
  const uint8_t lo = kBase32Values[static_cast<uint8_t>(p[1])];
  if (hi == 0xff || lo == 0xff || (lo & 0x3) != 0) return false;
  *o = static_cast<uint8_t>((hi << 3) | (lo >> 2));
  const uint8_t* b = out->data();
  return b[0] == kVersion1 &&
         (b[1] == static_cast<uint8_t>(Cid::Codec::kDagCbor) ||
          b[1] == static_cast<uint8_t>(Cid::Codec::kRaw)) &&
         b[2] == kSha256Code && b[3] == kSha256Length;
}

}  // namespace

Cid Cid::Compute(Codec codec, ByteView data) {
  Cid cid;
  cid.bytes_[0] = kVersion1;
  cid.bytes_[1] = static_cast<uint8_t>(codec);
  cid.bytes_[2] = kSha256Code;
  cid.bytes_[3] = kSha256Length;
  const Sha256Digest digest = Sha256(data);
  std::memcpy(cid.bytes_.data() + 4, digest.data(), digest.size());
  return cid;
}

Result<Cid> Cid::ReadBinaryPrefix(ByteView data, size_t* consumed) {
  if (data.empty()) return Status::Corrupt("CID is empty");
  // A CIDv0 is a bare sha2-256 multihash: it starts with the hash code, not a version.
  if (data.size() >= 2 && data[0] == kSha256Code && data[1] == kSha256Length) {
    return Status::Unsupported(
        "CIDv0 (a bare sha2-256 multihash) is not supported; atproto uses "
        "CIDv1");
  }
  size_t pos = 0;
  size_t n = 0;
  auto version = ReadVarint(data, &n);
  if (!version.ok()) return version.status().WithContext("CID version");
  if (*version != kVersion1) {
    return Status::Unsupported("CID version " + std::to_string(*version) +
                               " is not supported; atproto uses CIDv1");
  }
  pos += n;
  auto codec = ReadVarint(data.subspan(pos), &n);
  if (!codec.ok()) return codec.status().WithContext("CID codec");
  if (*codec != static_cast<uint8_t>(Codec::kDagCbor) &&
      *codec != static_cast<uint8_t>(Codec::kRaw)) {
    return Status::Unsupported("CID codec " + CodecName(*codec) +
                               " is not supported; atproto uses dag-cbor (0x71) or raw (0x55)");
  }
  pos += n;
  auto hash = ReadVarint(data.subspan(pos), &n);
  if (!hash.ok()) return hash.status().WithContext("CID multihash code");
  if (*hash != kSha256Code) {
    return Status::Unsupported("CID hash function " + HashName(*hash) +
                               " is not supported; atproto uses sha2-256 (0x12)");
  }
  pos += n;
  auto length = ReadVarint(data.subspan(pos), &n);
  if (!length.ok()) return length.status().WithContext("CID digest length");
  if (*length != kSha256Length) {
    return Status::Invalid("CID sha2-256 digest length is " + std::to_string(*length) +
                           ", expected 32");
  }
  pos += n;
  if (data.size() - pos < kSha256Length) {
    return Status::Corrupt("CID is truncated: the digest needs 32 bytes, " +
                           std::to_string(data.size() - pos) + " present");
  }
  Cid cid;
  std::memcpy(cid.bytes_.data(), data.data(), kBinarySize);
  *consumed = kBinarySize;
  return cid;
}

Result<Cid> Cid::FromBinary(ByteView data) {
  size_t consumed = 0;
  ATFILL_ASSIGN_OR_RETURN(Cid cid, ReadBinaryPrefix(data, &consumed));
  if (consumed != data.size()) {
    return Status::Invalid("CID has " + std::to_string(data.size() - consumed) +
                           " trailing bytes after the digest");
  }
  return cid;
}

Result<Cid> Cid::Parse(std::string_view text) {
  Cid fast;
  if (ParseFast(text, &fast.bytes_)) return fast;
  if (text.empty()) return Status::Invalid("CID string is empty");
  const char prefix = text[0];
  if (prefix != 'b') {
    if (text.size() == 46 && text.starts_with("Qm")) {
      return Status::Unsupported(
          "CIDv0 (\"Qm...\") is not supported; atproto uses CIDv1 in "
          "base32 (\"bafy...\")");
    }
    if (const char* name = MultibaseName(prefix)) {
      return Status::Unsupported(std::string("CID multibase prefix '") + prefix + "' (" + name +
                                 ") is not supported; atproto uses base32 ('b')");
    }
    return Status::Invalid("not a CID: it must start with the multibase prefix 'b' (base32)");
  }
  auto binary = Base32LowerDecode(text.substr(1));
  if (!binary.ok()) return binary.status().WithContext("CID base32 text");
  return FromBinary(*binary);
}

std::string Cid::ToString() const {
  if (!valid()) return {};
  std::string out = "b";
  out += Base32LowerEncode(binary());
  return out;
}

}  // namespace atfill::atproto
