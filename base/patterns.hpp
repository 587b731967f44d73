// Name patterns of collection filters: an NSID, or a prefix ending in ".*".
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace atfill {

// Whether `name` matches one of `patterns`: equal to one, or starting with its stem when it ends
// in ".*" (a collection filter's "app.bsky.*" takes "app.bsky.feed.post"). An empty list matches
// every name.
inline bool MatchesAnyPattern(const std::vector<std::string>& patterns, std::string_view name) {
  if (patterns.empty()) return true;
  for (const std::string& p : patterns) {
    if (p == name) return true;
    if (p.size() > 2 && p.ends_with(".*") &&
        name.starts_with(std::string_view(p).substr(0, p.size() - 1))) {
      return true;
    }
  }
  return false;
}

}  // namespace atfill
