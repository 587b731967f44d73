// Internal to sinks/: a bounded in-memory map from interned strings (DIDs, collection NSIDs) to
// their database ids, built for the sink's hot path: one open-addressing probe over a flat slot
// array, the key bytes kept in one arena (no allocation per entry, no pointer chasing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace atfill::sinks {

class InternCache {
 public:
  // Holds at most `max_entries` keys; adding one more first empties the cache.
  explicit InternCache(size_t max_entries);

  std::optional<int64_t> Find(std::string_view key) const;
  // Adds `key`, which must not be present.
  void Add(std::string_view key, int64_t id);
  void Clear();
  // Sizes the table for `entries` keys (at most the cache's bound) at once, instead of doubling
  // it as they are added.
  void Reserve(size_t entries);
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t hash = 0;  // 0: empty (real hashes are forced odd)
    int64_t id = 0;
    uint32_t offset = 0;  // of the key in arena_
    uint32_t length = 0;
  };
  static uint64_t Hash(std::string_view key);
  bool Matches(const Slot& s, std::string_view key) const;
  void Grow();

  size_t max_entries_;
  size_t size_ = 0;
  std::vector<Slot> slots_;  // a power of two long, at most half full
  std::string arena_;
  mutable size_t last_ = SIZE_MAX;  // the slot the last Find hit
};

}  // namespace atfill::sinks
