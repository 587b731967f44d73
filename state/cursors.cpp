#include "state/cursors.hpp"

#include <charconv>

namespace atfill::state {

Result<std::optional<std::string>> Cursors::Get(std::string_view name) {
  return kv_.Get(Family::kCursors, name);
}

void Cursors::Set(WriteBatch* batch, std::string_view name, std::string_view value) {
  batch->Put(Family::kCursors, name, value);
}

void Cursors::Remove(WriteBatch* batch, std::string_view name) {
  batch->Delete(Family::kCursors, name);
}

Result<std::optional<uint64_t>> Cursors::GetUint64(std::string_view name) {
  ATFILL_ASSIGN_OR_RETURN(auto raw, Get(name));
  if (!raw) return std::optional<uint64_t>();
  uint64_t value = 0;
  const char* end = raw->data() + raw->size();
  auto [ptr, ec] = std::from_chars(raw->data(), end, value);
  if (raw->empty() || ec != std::errc() || ptr != end) {
    return Status::Corrupt("cursor '" + std::string(name) + "' holds '" + *raw +
                           "', not an unsigned decimal integer");
  }
  return std::optional<uint64_t>(value);
}

void Cursors::SetUint64(WriteBatch* batch, std::string_view name, uint64_t value) {
  Set(batch, name, std::to_string(value));
}

Status Cursors::List(std::string_view prefix,
                     const std::function<bool(std::string_view, std::string_view)>& fn) {
  return kv_.Scan(Family::kCursors, prefix, fn);
}

}  // namespace atfill::state
