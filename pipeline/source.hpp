// A Source produces EventChunks.
#pragma once

#include <string>

#include "base/status.hpp"
#include "pipeline/chunk.hpp"
#include "pipeline/transform.hpp"
#include "state/job_store.hpp"

namespace atfill::pipeline {

class Source {
 public:
  virtual ~Source() = default;

  // Fills `chunk` with the next run of input. chunk->seq is the engine's number for it (0, 1,
  // 2... in Read order), set before the call: a source that keeps per-chunk state uses it rather
  // than counting its own Reads. Returns false at the end
  // of input. Called from one thread at a time, in order; may block only in sources whose input
  // is local (files); network sources hand I/O to net/ and return tick chunks while waiting.
  virtual Result<bool> Read(EventChunk* chunk) = 0;

  // Turns chunk->raw into chunk->events and chunk->errors. Thread-safe and re-entrant: the engine
  // runs it on several chunks at once. The default does nothing (sources that produce events
  // directly).
  virtual void Decode(EventChunk* /*chunk*/) const {}

  // A stage of the source's own that keeps its state in step with the stream (the firehose's repo
  // chains), or nullptr. The engine runs it first in its ordered node: after Decode and the
  // unordered stages, before the standard ordered stages (live hold, ingest guard), so what it
  // passes on is what they see. The source owns it.
  virtual const Transform* OrderedStage() const { return nullptr; }

  // Where reading starts: the resume_cursor of the last applied chunk, or empty for the start.
  // Called once, before the first Read.
  virtual Status Seek(const std::string& resume_cursor) = 0;

  virtual std::string Describe() const = 0;

  // After Read returned false: why input that exists was left unread (units deferred because
  // their host was down...), or empty when the source finished everything. A job that ends with
  // such a reason pauses with it instead of completing.
  virtual state::StopReason Unfinished() const { return {}; }

  // Every chunk with seq <= `through_seq` (the chunks Read returned, counted from 0) is durable:
  // its events in the sink and its state writes in state. Runs on the engine's sink thread,
  // possibly while Read runs on another: implementations synchronise what they touch.
  virtual void Committed(uint64_t /*through_seq*/) {}
};

}  // namespace atfill::pipeline
