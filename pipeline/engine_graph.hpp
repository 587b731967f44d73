// The flow-graph wiring of the engine, apart from what its nodes do (engine.cpp). Internal.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pipeline/chunk.hpp"

namespace atfill::pipeline::internal {

// A batch the ordered node sealed, on its way to the sink node; the bodies define it.
struct SealedBatch;

// The graph's side, for the node bodies to call back.
class GraphHandle {
 public:
  virtual ~GraphHandle() = default;
  // Cancels the graph: running bodies finish, nothing new starts. Thread-safe.
  virtual void Cancel() = 0;
  // Lets `chunks` more chunks past the in-flight limiter. Called from the commit body.
  virtual void Release(size_t chunks) = 0;
  // How an asynchronous stage's answer gives a chunk back to Work: a plain function, so that the
  // answering thread touches no memory of the graph from instrumented code once it has released
  // its writes to the run (see pipeline/tsan.hpp). Calling it puts the chunk back and ends the
  // Hold it came from. Thread-safe; called once per Hold.
  struct Resumer {
    void (*fn)(void* graph, EventChunk* chunk) = nullptr;
    void* graph = nullptr;
    void operator()(EventChunk* chunk) const { fn(graph, chunk); }
  };
  // Work is about to hand a chunk off to an asynchronous stage: the graph stays open until the
  // returned Resumer is called (or Unhold, when the stage needed no hand-off after all). Called
  // from Work.
  virtual Resumer Hold() = 0;
  virtual void Unhold() = 0;
};

// What the nodes do.
class GraphBodies {
 public:
  virtual ~GraphBodies() = default;
  // Called with the graph before it starts, and with nullptr once it is idle and about to go.
  virtual void Attach(GraphHandle* graph) = 0;
  // Serial. The next chunk with its seq set, or nullptr at the end of input (or to stop).
  virtual EventChunk* Read() = 0;
  // Concurrent, up to `workers` chunks at once. Does the chunk's work (or, for a chunk that came
  // back through a Resumer, what is left of it). Returns true when the chunk is ready for Order;
  // false when it was handed off (after a Hold), to come back through its Resumer.
  virtual bool Work(EventChunk* chunk) = 0;
  // Serial, in seq order: the ordered stages and the batcher. Returns a batch when this chunk
  // completed one, else nullptr.
  virtual SealedBatch* Order(EventChunk* chunk) = 0;
  // Serial, in the order batches were sealed: writes the batch to the sink and commits it.
  virtual void Write(SealedBatch* batch) = 0;
};

//   Read ─ limiter(in_flight) ─ Work(workers) ─ sequencer(seq) ─ Order ─ Write
//                                  ↑  ↓ hand-off
//                                  Resumer
// The sink node writes batch N while the ordered node works on batch N+1. Runs until Read returns
// nullptr and everything passed Write, or until Cancel.
void RunGraph(GraphBodies* bodies, uint32_t workers, uint32_t in_flight);

}  // namespace atfill::pipeline::internal
