// Text encodings of bytes used by atproto: base32 (multibase 'b'), base58btc (multibase 'z'),
// base64 (standard and URL alphabets), hex.
#pragma once

#include <string>
#include <string_view>

#include "base/bytes.hpp"
#include "base/status.hpp"

namespace atfill {

// RFC 4648 base32, lower-case alphabet, no padding (multibase 'b' without the prefix).
std::string Base32LowerEncode(ByteView data);
// Accepts only the lower-case alphabet and no padding; trailing bits must be zero.
Result<Bytes> Base32LowerDecode(std::string_view text);

// Bitcoin base58 alphabet (multibase 'z' without the prefix).
std::string Base58BtcEncode(ByteView data);
Result<Bytes> Base58BtcDecode(std::string_view text);

enum class Base64Alphabet { kStandard, kUrl };
// Encodes without padding when `pad` is false.
std::string Base64Encode(ByteView data, Base64Alphabet alphabet = Base64Alphabet::kStandard,
                         bool pad = true);
// Padding is optional; when present it must be correct. Rejects characters outside the alphabet
// and non-zero trailing bits.
Result<Bytes> Base64Decode(std::string_view text,
                           Base64Alphabet alphabet = Base64Alphabet::kStandard);

std::string HexEncode(ByteView data);
Result<Bytes> HexDecode(std::string_view text);

}  // namespace atfill
