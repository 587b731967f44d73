// Byte buffers and the unsigned-varint (LEB128) used by multiformats and CAR.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"

namespace atfill {

using Bytes = std::vector<uint8_t>;
using ByteView = std::span<const uint8_t>;

inline ByteView AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
inline std::string_view AsChars(ByteView b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// Appends `value` as an unsigned LEB128 varint.
void AppendVarint(uint64_t value, Bytes* out);

// Reads a minimal unsigned varint of at most 9 bytes (the multiformats rule) from the front of
// `in`; on success advances `*consumed` past it.
Result<uint64_t> ReadVarint(ByteView in, size_t* consumed);

}  // namespace atfill
