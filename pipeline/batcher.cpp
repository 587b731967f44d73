#include "pipeline/batcher.hpp"

#include <iterator>
#include <utility>

namespace atfill::pipeline {

Status BatcherOptions::Validate() const {
  if (max_events == 0) return Status::Invalid("batch size must be at least 1 event");
  if (max_delay_ms < 0) return Status::Invalid("batch delay must not be negative");
  if (max_chunks == 0) return Status::Invalid("batch chunk limit must be at least 1");
  return Status::OK();
}

void Batcher::Add(EventChunk* chunk, int64_t now_us) {
  if (pending_.chunks.empty()) pending_.first_added_us = now_us;
  if (pending_.events.empty()) {
    pending_.events = std::move(chunk->events);
  } else {
    pending_.events.insert(pending_.events.end(), std::make_move_iterator(chunk->events.begin()),
                           std::make_move_iterator(chunk->events.end()));
  }
  chunk->events.clear();
  pending_.chunks.push_back(chunk);
  if (chunk->seal) seal_ = true;
}

bool Batcher::ShouldFlush(int64_t now_us) const {
  if (pending_.chunks.empty()) return false;
  return seal_ || pending_.events.size() >= options_.max_events ||
         pending_.chunks.size() >= options_.max_chunks ||
         now_us - pending_.first_added_us >= options_.max_delay_ms * 1000;
}

PendingBatch Batcher::Take() {
  PendingBatch out = std::move(pending_);
  pending_ = PendingBatch();
  seal_ = false;
  return out;
}

}  // namespace atfill::pipeline
