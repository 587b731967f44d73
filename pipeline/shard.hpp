// Sharded runs: n atfill processes split one backfill or one live stream by DID, each owning the
// DIDs whose hash falls in its shard, so together they write every record once into one database.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.hpp"
#include "pipeline/transform.hpp"

namespace atfill::pipeline {

// Shard `index` of `count` (0 <= index < count). The default, 0/1, owns every DID.
struct Shard {
  uint32_t index = 0;
  uint32_t count = 1;

  // "i/n" with 0 <= i < n <= 65536, e.g. "0/3", "1/3", "2/3".
  static Result<Shard> Parse(std::string_view text);
  std::string ToString() const;  // "i/n"
  bool all() const { return count <= 1; }

  // Whether this shard owns `did`: XXH3-64 of the DID's bytes, modulo count, equals index. The
  // hash is a published, stable function, so every process on every machine and version agrees.
  bool Owns(std::string_view did) const;

  friend bool operator==(const Shard&, const Shard&) = default;
};

// The first transform of a sharded graph: removes the events (records and account events) of
// DIDs another shard owns, counted in the job counter "other_shard_events". Sources that can skip
// them earlier (the crawl's discovery, the archive reader) do, and this catches the rest.
class ShardFilter : public Transform {
 public:
  explicit ShardFilter(Shard shard) : shard_(shard) {}
  std::string_view name() const override { return "shard_filter"; }
  Status Process(TransformState* state, EventChunk* chunk) const override;

 private:
  Shard shard_;
};

}  // namespace atfill::pipeline
