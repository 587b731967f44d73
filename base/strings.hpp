// Small text helpers for error messages.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace atfill {

// `s` in double quotes for a message, cut to `max` bytes with "..." so hostile input cannot
// flood logs.
inline std::string QuoteForMessage(std::string_view s, size_t max = 64) {
  std::string out = "\"";
  out.append(s.substr(0, max));
  if (s.size() > max) out += "...";
  out += '"';
  return out;
}

}  // namespace atfill
