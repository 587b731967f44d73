// Request-target parsing shared by simnet's hosts.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace atfill::simnet {

inline int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decoding ('+' is a space); a malformed escape is kept as it is.
inline std::string UrlDecode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2])));
      i += 2;
    } else if (s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// The path and the decoded query parameters of a request target, in order (a parameter may
// repeat).
struct Target {
  std::string path;
  std::vector<std::pair<std::string, std::string>> params;

  // The first value of `name`.
  std::optional<std::string> Param(std::string_view name) const {
    for (const auto& [k, v] : params) {
      if (k == name) return v;
    }
    return std::nullopt;
  }
  // Every value of `name`, in order.
  std::vector<std::string> Params(std::string_view name) const {
    std::vector<std::string> out;
    for (const auto& [k, v] : params) {
      if (k == name) out.push_back(v);
    }
    return out;
  }
};

inline Target ParseTarget(std::string_view target) {
  Target t;
  const size_t q = target.find('?');
  t.path = UrlDecode(target.substr(0, q));
  if (q == std::string_view::npos) return t;
  std::string_view query = target.substr(q + 1);
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    const size_t eq = pair.find('=');
    if (!pair.empty()) {
      t.params.emplace_back(UrlDecode(pair.substr(0, eq)),
                            eq == std::string_view::npos ? "" : UrlDecode(pair.substr(eq + 1)));
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return t;
}

}  // namespace atfill::simnet
