// A Transform turns a chunk into a chunk: verifies, rewrites, drops, or annotates events.
#pragma once

#include <memory>
#include <string_view>

#include "base/status.hpp"
#include "pipeline/chunk.hpp"
#include "state/kv_store.hpp"

namespace atfill::pipeline {

// Mutable per-worker state a transform may need (a Lua state, a parser); one per worker thread.
class TransformState {
 public:
  virtual ~TransformState() = default;
};

class Transform {
 public:
  virtual ~Transform() = default;

  virtual std::string_view name() const = 0;

  // Ordered transforms see every chunk in source order, one at a time (the ingest guard);
  // unordered ones run on several chunks at once, each worker with its own state.
  virtual bool ordered() const { return false; }

  // One state per worker thread; nullptr when the transform needs none.
  virtual std::unique_ptr<TransformState> NewState() const { return nullptr; }

  // Processes the chunk in place: an event that fails is removed, counted in chunk->dropped and,
  // when it is bad input, described in chunk->errors. Must not block. A non-OK Status is a failure
  // of the run (a bug or a broken dependency), not of an event. The transform object is immutable
  // after construction; `state` is this worker's (or nullptr).
  virtual Status Process(TransformState* state, EventChunk* chunk) const = 0;

  // Ordered transforms only, around each commit of a batch (every chunk processed so far):
  // PrepareCommit adds the transform's state writes (tombstones...) to the batch that also moves
  // the cursor; OnCommitted says whether that batch became durable, so the transform can forget
  // what it kept for uncommitted chunks.
  virtual Status PrepareCommit(TransformState* /*state*/, state::WriteBatch* /*batch*/) const {
    return Status::OK();
  }
  virtual void OnCommitted(TransformState* /*state*/, bool /*durable*/) const {}
};

}  // namespace atfill::pipeline
