#include "base/bytes.hpp"

namespace atfill {

void AppendVarint(uint64_t value, Bytes* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<uint8_t>(value) | 0x80);
    value >>= 7;
  }
  out->push_back(static_cast<uint8_t>(value));
}

Result<uint64_t> ReadVarint(ByteView in, size_t* consumed) {
  uint64_t value = 0;
  for (size_t i = 0; i < in.size() && i < 9; ++i) {
    const uint8_t b = in[i];
    value |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
    if ((b & 0x80) == 0) {
      if (b == 0 && i > 0) return Status::Invalid("varint is not minimally encoded");
      *consumed = i + 1;
      return value;
    }
  }
  if (in.size() < 9) return Status::Corrupt("varint is truncated");
  return Status::Invalid("varint is longer than 9 bytes");
}

}  // namespace atfill
