#include "state/kv_store.hpp"

#include <array>

namespace atfill::state {

std::string_view FamilyName(Family f) {
  static constexpr std::array<std::string_view, kFamilyCount> kNames = {
      "meta", "jobs", "queue", "cursors", "tombstones", "errors", "failed_blocks", "resolver"};
  const auto i = static_cast<size_t>(f);
  return i < kNames.size() ? kNames[i] : std::string_view("?");
}

std::string EncodeCounter(uint64_t value) {
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>(value >> (8 * i));
  return out;
}

Result<uint64_t> DecodeCounter(std::string_view bytes, std::string_view what) {
  if (bytes.size() != 8) {
    return Status::Corrupt(std::string(what) + ": a counter is 8 bytes, found " +
                           std::to_string(bytes.size()));
  }
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  return v;
}

Status RocksDbOptions::Validate() const {
  if (path.empty()) return Status::Invalid("state: RocksDB path is empty");
  if (write_buffer_bytes < (64 << 10)) {
    return Status::Invalid("state: write_buffer_bytes must be at least 65536, got " +
                           std::to_string(write_buffer_bytes));
  }
  return Status::OK();
}

}  // namespace atfill::state
