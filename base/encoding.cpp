#include "base/encoding.hpp"

#include <array>

namespace atfill {
namespace {

constexpr std::string_view kBase32 = "abcdefghijklmnopqrstuvwxyz234567";
constexpr std::string_view kBase58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";
constexpr std::string_view kBase64Std =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
constexpr std::string_view kBase64Url =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

// Reverse lookup table: 0xff for characters outside the alphabet.
constexpr std::array<uint8_t, 256> MakeReverse(std::string_view alphabet) {
  std::array<uint8_t, 256> table{};
  for (auto& v : table) v = 0xff;
  for (size_t i = 0; i < alphabet.size(); ++i) {
    table[static_cast<uint8_t>(alphabet[i])] = static_cast<uint8_t>(i);
  }
  return table;
}

constexpr auto kBase32Rev = MakeReverse(kBase32);
constexpr auto kBase58Rev = MakeReverse(kBase58);
constexpr auto kBase64StdRev = MakeReverse(kBase64Std);
constexpr auto kBase64UrlRev = MakeReverse(kBase64Url);

}  // namespace

std::string Base32LowerEncode(ByteView data) {
  std::string out((data.size() * 8 + 4) / 5, '\0');
  char* o = out.data();
  size_t i = 0;
  // Five bytes make eight characters; CIDs (36 bytes) take seven rounds and a tail.
  for (; i + 5 <= data.size(); i += 5) {
    const uint64_t v = (uint64_t{data[i]} << 32) | (uint64_t{data[i + 1]} << 24) |
                       (uint64_t{data[i + 2]} << 16) | (uint64_t{data[i + 3]} << 8) | data[i + 4];
    for (int k = 7; k >= 0; --k) *o++ = kBase32[(v >> (5 * k)) & 31];
  }
  uint32_t buffer = 0;
  int bits = 0;
  for (; i < data.size(); ++i) {
    buffer = (buffer << 8) | data[i];
    bits += 8;
    while (bits >= 5) {
      *o++ = kBase32[(buffer >> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) *o++ = kBase32[(buffer << (5 - bits)) & 31];
  return out;
}

Result<Bytes> Base32LowerDecode(std::string_view text) {
  Bytes out;
  out.reserve(text.size() * 5 / 8);
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : text) {
    const uint8_t v = kBase32Rev[static_cast<uint8_t>(c)];
    if (v == 0xff) return Status::Invalid("invalid base32 character");
    buffer = (buffer << 5) | v;
    bits += 5;
    if (bits >= 8) {
      out.push_back(static_cast<uint8_t>(buffer >> (bits - 8)));
      bits -= 8;
    }
  }
  if (bits >= 5 || (buffer & ((1u << bits) - 1)) != 0) {
    return Status::Invalid("base32 has trailing bits");
  }
  return out;
}

std::string Base58BtcEncode(ByteView data) {
  size_t zeros = 0;
  while (zeros < data.size() && data[zeros] == 0) ++zeros;
  // log(256)/log(58) ~ 1.366
  std::vector<uint8_t> digits((data.size() - zeros) * 138 / 100 + 1, 0);
  size_t length = 0;
  for (size_t i = zeros; i < data.size(); ++i) {
    uint32_t carry = data[i];
    size_t j = 0;
    for (auto it = digits.rbegin(); (carry != 0 || j < length) && it != digits.rend(); ++it, ++j) {
      carry += 256u * *it;
      *it = static_cast<uint8_t>(carry % 58);
      carry /= 58;
    }
    length = j;
  }
  auto it = digits.begin() + static_cast<std::ptrdiff_t>(digits.size() - length);
  std::string out(zeros, '1');
  for (; it != digits.end(); ++it) out.push_back(kBase58[*it]);
  return out;
}

Result<Bytes> Base58BtcDecode(std::string_view text) {
  size_t zeros = 0;
  while (zeros < text.size() && text[zeros] == '1') ++zeros;
  // log(58)/log(256) ~ 0.733
  std::vector<uint8_t> bytes((text.size() - zeros) * 733 / 1000 + 1, 0);
  size_t length = 0;
  for (size_t i = zeros; i < text.size(); ++i) {
    const uint8_t v = kBase58Rev[static_cast<uint8_t>(text[i])];
    if (v == 0xff) return Status::Invalid("invalid base58 character");
    uint32_t carry = v;
    size_t j = 0;
    for (auto it = bytes.rbegin(); (carry != 0 || j < length) && it != bytes.rend(); ++it, ++j) {
      carry += 58u * *it;
      *it = static_cast<uint8_t>(carry & 0xff);
      carry >>= 8;
    }
    length = j;
  }
  Bytes out(zeros, 0);
  out.insert(out.end(), bytes.end() - static_cast<std::ptrdiff_t>(length), bytes.end());
  return out;
}

std::string Base64Encode(ByteView data, Base64Alphabet alphabet, bool pad) {
  const std::string_view table = alphabet == Base64Alphabet::kStandard ? kBase64Std : kBase64Url;
  std::string out;
  out.reserve((data.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= data.size(); i += 3) {
    const uint32_t n = (uint32_t{data[i]} << 16) | (uint32_t{data[i + 1]} << 8) | data[i + 2];
    out.push_back(table[(n >> 18) & 63]);
    out.push_back(table[(n >> 12) & 63]);
    out.push_back(table[(n >> 6) & 63]);
    out.push_back(table[n & 63]);
  }
  const size_t rest = data.size() - i;
  if (rest == 1) {
    const uint32_t n = uint32_t{data[i]} << 16;
    out.push_back(table[(n >> 18) & 63]);
    out.push_back(table[(n >> 12) & 63]);
    if (pad) out += "==";
  } else if (rest == 2) {
    const uint32_t n = (uint32_t{data[i]} << 16) | (uint32_t{data[i + 1]} << 8);
    out.push_back(table[(n >> 18) & 63]);
    out.push_back(table[(n >> 12) & 63]);
    out.push_back(table[(n >> 6) & 63]);
    if (pad) out.push_back('=');
  }
  return out;
}

Result<Bytes> Base64Decode(std::string_view text, Base64Alphabet alphabet) {
  const auto& rev = alphabet == Base64Alphabet::kStandard ? kBase64StdRev : kBase64UrlRev;
  if (text.size() % 4 == 0 && !text.empty()) {
    size_t pads = 0;
    while (pads < 2 && text[text.size() - 1 - pads] == '=') ++pads;
    text.remove_suffix(pads);
  }
  if (text.size() % 4 == 1) return Status::Invalid("base64 has an impossible length");
  Bytes out;
  out.reserve(text.size() * 3 / 4);
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : text) {
    const uint8_t v = rev[static_cast<uint8_t>(c)];
    if (v == 0xff) return Status::Invalid("invalid base64 character");
    buffer = (buffer << 6) | v;
    bits += 6;
    if (bits >= 8) {
      out.push_back(static_cast<uint8_t>(buffer >> (bits - 8)));
      bits -= 8;
    }
  }
  if ((buffer & ((1u << bits) - 1)) != 0) return Status::Invalid("base64 has trailing bits");
  return out;
}

std::string HexEncode(ByteView data) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(data.size() * 2);
  for (uint8_t b : data) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

Result<Bytes> HexDecode(std::string_view text) {
  if (text.size() % 2 != 0) return Status::Invalid("hex has an odd length");
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  Bytes out(text.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(text[2 * i]);
    const int lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return Status::Invalid("invalid hex character");
    out[i] = static_cast<uint8_t>((hi << 4) | lo);
  }
  return out;
}

}  // namespace atfill
