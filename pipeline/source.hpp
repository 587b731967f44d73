// A Source produces EventChunks.
#pragma once

#include <string>

#include "base/status.hpp"
#include "pipeline/chunk.hpp"
#include "state/job_store.hpp"

namespace atfill::pipeline {

class Source {
 public:
  virtual ~Source() = default;

  // Fills `chunk` (seq is set by the engine) with the next run of input. Returns false at the end
  // of input. Called from one thread at a time, in order; may block only in sources whose input
  // is local (files); network sources hand I/O to net/ and return tick chunks while waiting.
  virtual Result<bool> Read(EventChunk* chunk) = 0;

  // Turns chunk->raw into chunk->events and chunk->errors. Thread-safe and re-entrant: the engine
  // runs it on several chunks at once. The default does nothing (sources that produce events
  // directly).
  virtual void Decode(EventChunk* /*chunk*/) const {}

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
