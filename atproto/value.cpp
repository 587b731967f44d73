#include "atproto/value.hpp"

#include <algorithm>

namespace atfill::atproto {

const Value* Value::Find(std::string_view key) const {
  if (kind() != Kind::kMap) return nullptr;
  for (const auto& [k, v] : as_map()) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::Canonicalize() {
  switch (kind()) {
    case Kind::kArray:
      for (Value& v : as_array()) v.Canonicalize();
      break;
    case Kind::kMap: {
      Map& map = as_map();
      for (auto& entry : map) entry.second.Canonicalize();
      // Stable, so duplicate keys (a builder's bug) keep their insertion order.
      std::stable_sort(map.begin(), map.end(),
                       [](const auto& a, const auto& b) { return CborKeyLess(a.first, b.first); });
      break;
    }
    default:
      break;
  }
}

}  // namespace atfill::atproto
