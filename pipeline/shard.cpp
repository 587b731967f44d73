#include "pipeline/shard.hpp"

#include <xxhash.h>

#include <algorithm>
#include <charconv>

#include "pipeline/chunk.hpp"

namespace atfill::pipeline {

namespace {

bool ParseUint(std::string_view text, uint32_t* out) {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

Result<Shard> Shard::Parse(std::string_view text) {
  const size_t slash = text.find('/');
  Shard s;
  if (slash == std::string_view::npos || !ParseUint(text.substr(0, slash), &s.index) ||
      !ParseUint(text.substr(slash + 1), &s.count)) {
    return Status::Invalid("shard '" + std::string(text) +
                           "' is not i/n (this process's shard i of n, counted from 0: 0/3, 1/3, "
                           "2/3)");
  }
  if (s.count == 0 || s.count > 65536) {
    return Status::Invalid("shard '" + std::string(text) + "': n must be 1 to 65536");
  }
  if (s.index >= s.count) {
    return Status::Invalid("shard '" + std::string(text) +
                           "': i counts from 0 and must be below n (" + std::to_string(s.count) +
                           " shards are 0/" + std::to_string(s.count) + " to " +
                           std::to_string(s.count - 1) + "/" + std::to_string(s.count) + ")");
  }
  return s;
}

std::string Shard::ToString() const { return std::to_string(index) + "/" + std::to_string(count); }

bool Shard::Owns(std::string_view did) const {
  if (count <= 1) return true;
  return XXH3_64bits(did.data(), did.size()) % count == index;
}

Status ShardFilter::Process(TransformState* /*state*/, EventChunk* chunk) const {
  if (shard_.all()) return Status::OK();
  auto& events = chunk->events;
  const auto kept = std::stable_partition(events.begin(), events.end(),
                                          [this](const Event& e) { return shard_.Owns(DidOf(e)); });
  const auto removed = static_cast<int64_t>(events.end() - kept);
  if (removed == 0) return Status::OK();
  events.erase(kept, events.end());
  chunk->counters.emplace_back("other_shard_events", removed);
  return Status::OK();
}

}  // namespace atfill::pipeline
