// Groups chunks into sink batches: N events or T milliseconds, whichever comes first.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.hpp"
#include "pipeline/chunk.hpp"

namespace atfill::pipeline {

struct BatcherOptions {
  // Flush once this many events are pending.
  uint64_t max_events = 5000;
  // Flush once the oldest pending chunk has waited this long (milliseconds).
  int64_t max_delay_ms = 200;
  // Flush once this many chunks are pending, whatever their events (bounds memory and keeps the
  // engine's in-flight limit from starving the batcher).
  uint64_t max_chunks = 16;
  Status Validate() const;
};

// The chunks of one batch, in order, and their events gathered for the sink. The chunks are the
// engine's; the batch only points at them.
struct PendingBatch {
  std::vector<EventChunk*> chunks;
  std::vector<Event> events;
  int64_t first_added_us = 0;
  bool empty() const { return chunks.empty(); }
};

// Not thread-safe: owned by the engine's serial commit node.
class Batcher {
 public:
  explicit Batcher(BatcherOptions options) : options_(options) {}

  // Takes the chunk's events (moves them out) and keeps the chunk for its cursor and counters. A
  // chunk with `seal` set makes ShouldFlush true.
  void Add(EventChunk* chunk, int64_t now_us);
  bool ShouldFlush(int64_t now_us) const;
  bool empty() const { return pending_.empty(); }
  // Hands over what is pending and starts a new batch.
  PendingBatch Take();

 private:
  BatcherOptions options_;
  PendingBatch pending_;
  bool seal_ = false;  // a pending chunk asked for the batch to be sealed
};

}  // namespace atfill::pipeline
