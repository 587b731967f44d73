#include "sinks/intern_cache.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>

namespace atfill::sinks {
namespace {
constexpr size_t kInitialSlots = 1024;
}  // namespace

InternCache::InternCache(size_t max_entries)
    : max_entries_(max_entries == 0 ? 1 : max_entries), slots_(kInitialSlots) {}

uint64_t InternCache::Hash(std::string_view key) {
  return static_cast<uint64_t>(XXH3_64bits(key.data(), key.size())) | 1;
}

bool InternCache::Matches(const Slot& s, std::string_view key) const {
  return s.length == key.size() &&
         std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0;
}

std::optional<int64_t> InternCache::Find(std::string_view key) const {
  // Runs of one key (a batch's single collection, an account's events grouped together) skip
  // the hash.
  if (last_ < slots_.size() && slots_[last_].hash != 0 && Matches(slots_[last_], key)) {
    return slots_[last_].id;
  }
  const uint64_t h = Hash(key);
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return std::nullopt;
    if (s.hash == h && Matches(s, key)) {
      last_ = i;
      return s.id;
    }
  }
}

void InternCache::Add(std::string_view key, int64_t id) {
  // Starting again empty keeps memory bounded; the ids stay in the database.
  if (size_ >= max_entries_ || arena_.size() + key.size() > std::numeric_limits<uint32_t>::max()) {
    Clear();
  }
  if ((size_ + 1) * 2 > slots_.size()) Grow();
  const uint64_t h = Hash(key);
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  while (slots_[i].hash != 0) i = (i + 1) & mask;
  slots_[i] = Slot{h, id, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size())};
  arena_.append(key);
  ++size_;
}

void InternCache::Clear() {
  last_ = SIZE_MAX;
  slots_.assign(kInitialSlots, Slot{});
  arena_.clear();
  size_ = 0;
}

void InternCache::Reserve(size_t entries) {
  entries = std::min(entries, max_entries_);
  size_t slots = slots_.size();
  while (slots < entries * 2) slots *= 2;
  while (slots_.size() < slots) Grow();
}

void InternCache::Grow() {
  last_ = SIZE_MAX;
  std::vector<Slot> old(slots_.size() * 2);
  old.swap(slots_);
  const size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.hash == 0) continue;
    size_t i = s.hash & mask;
    while (slots_[i].hash != 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

}  // namespace atfill::sinks
