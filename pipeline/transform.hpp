// A Transform turns a chunk into a chunk: verifies, rewrites, drops, or annotates events.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "base/status.hpp"
#include "pipeline/chunk.hpp"
#include "state/kv_store.hpp"

namespace atfill::pipeline {

// Mutable per-worker state a transform may need (a Lua state, a parser); one per worker thread.
class TransformState {
 public:
  virtual ~TransformState() = default;
};

class AsyncTransform;

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

  // Ordered transforms only, around each batch. The engine writes batch N to the sink while the
  // transform already processes the chunks of batch N+1, so:
  //  * SealBatch runs on the ordered node once the batch's last chunk was processed: it adds the
  //    transform's state writes for that batch (tombstones...) to `batch`, which the engine
  //    commits together with the cursor after the sink made the batch durable;
  //  * OnCommitted runs on the engine's sink node, once per sealed batch in sealing order, when
  //    that state write is durable (or, with durable false, when the run gave up on it). It may
  //    run while Process runs on another thread: the transform's state must guard what both
  //    touch.
  virtual Status SealBatch(TransformState* /*state*/, state::WriteBatch* /*batch*/) const {
    return Status::OK();
  }
  virtual void OnCommitted(TransformState* /*state*/, bool /*durable*/) const {}

  // Non-null when the transform is asynchronous (see AsyncTransform): the engine calls its Start
  // instead of Process.
  virtual const AsyncTransform* AsAsync() const { return nullptr; }
};

// A transform that waits on I/O (an account check asks a PDS) without holding a flow-graph
// thread: Start hands the chunk to the I/O side and returns; the answer re-enters the graph
// through `done`, and the chunk goes on to the next stage. Meanwhile the worker takes other chunks.
// The engine's in-flight limit bounds how many chunks wait at once, and the sequencer after the
// unordered stages keeps the commit order: a chunk that waits holds back the commits of the
// chunks after it, never their processing. Unordered only (ordered() must stay false).
class AsyncTransform : public Transform {
 public:
  // How a handed-off chunk comes back: call it once, from any thread (an I/O or timer thread: it
  // must be cheap and must not block).
  class Done {
   public:
    // `again` false: the transform is through with the chunk (`status` as Process's). True: the
    // chunk comes back to this transform's Start, on whichever worker is free (the rest of its
    // work after a wait, such as a retry's backoff).
    using Fn = std::function<void(Status status, bool again)>;
    Done() = default;
    template <typename F,
              typename = std::enable_if_t<std::is_invocable_r_v<void, F&, Status, bool>>>
    Done(F fn) : fn_(std::move(fn)) {}
    // Through: the chunk goes on to the next stage.
    void operator()(Status status) const { fn_(std::move(status), false); }
    // Not through: Start runs again on the chunk.
    void Again() const { fn_(Status::OK(), true); }

   private:
    Fn fn_;
  };

  // Starts (or, after done.Again(), continues) processing `chunk` in place, with Process's
  // rules; thread-safe, must not block. Returns false when the chunk needed no waiting: it is
  // processed already and `done` is never called. Returns true when the chunk was handed off:
  // `done` is called exactly once, possibly before Start returns, and the chunk is the
  // transform's until then. `state` is the calling worker's (it must not be used after Start
  // returns).
  // `again` is true when the engine calls it again on a chunk after done.Again().
  virtual bool Start(TransformState* state, EventChunk* chunk, bool again, Done done) const = 0;

  // The engine never calls it; a caller outside the engine (a bench, a test) uses Start.
  Status Process(TransformState*, EventChunk*) const final {
    return Status::Internal(std::string(name()) + " is asynchronous: run it with Start");
  }
  const AsyncTransform* AsAsync() const final { return this; }
};

}  // namespace atfill::pipeline
