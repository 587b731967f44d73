// The unit that flows through the graph: a run of events from one source, in source order.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/event.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"

namespace atfill::pipeline {

// Bad input found by a source or a stage: skipped, counted and written to the job's error log.
struct EventError {
  std::string kind;     // short machine-readable kind: "bad_json", "cid_mismatch", "invalid_did"...
  std::string key;      // what it concerns: "line 17", an AT URI, a DID
  std::string message;  // the reason, a sentence
};

// An error an earlier run of the job logged that this chunk's work supersedes (a deferred unit
// that has now finished, a stalled listing that now answers): the entry is marked resolved with
// the chunk's commit. Not an error when no such entry exists.
struct ResolvedError {
  std::string kind;
  std::string key;
};

// Undecoded input a source hands from its Read to its own Decode as typed values rather than
// bytes in `raw` (the crawl's fetched answers, say). Each source derives its own; only the source
// that made a payload reads it.
struct ChunkPayload {
  virtual ~ChunkPayload() = default;
};

struct EventChunk {
  // Assigned by the engine: 0, 1, 2... in the order the source produced the chunks.
  uint64_t seq = 0;
  // Undecoded input the source's Decode turns into events (e.g. JSON lines, '\n'-separated).
  std::string raw;
  // Undecoded input of the source's own type (see ChunkPayload), beside or instead of `raw`; the
  // source's Decode may release it. Copies of a chunk share it.
  std::shared_ptr<ChunkPayload> payload;
  // Source position of the first raw unit (a line number, a byte offset...), for error keys.
  uint64_t raw_first_position = 0;
  std::vector<Event> events;
  std::vector<EventError> errors;
  std::vector<ResolvedError> resolved_errors;
  // The source's resume position once every event of this chunk (and before) is applied.
  std::string resume_cursor;
  // Input units read (lines, frames), including ones that produced no event.
  uint64_t units_read = 0;
  uint64_t bytes_read = 0;
  // How far the source is through its input after this chunk, in the unit of its total (for an
  // event file, bytes of the files as stored); 0 when the source cannot tell.
  uint64_t input_done = 0;
  // Events removed by stages for bad input (failed checks, each also in `errors`) or dropped by a
  // script.
  uint64_t dropped = 0;
  // Events the ingest guard refused because a tombstone says they are out of date (not errors).
  uint64_t refused = 0;
  // An empty chunk a waiting source emits so the batcher can flush on time.
  bool tick = false;
  // The batch this chunk joins is sealed at once, whatever the batch limits: the source waits for
  // its earlier chunks to commit before it reads on (the replay's account sweep).
  bool seal = false;
  // State writes that belong to this chunk's input (a crawl unit leaving the queue, a listing
  // cursor and the units its page queued...). They are committed in the same state write as the
  // batch holding the chunk, after the sink made its events durable; chunks commit in order.
  state::WriteBatch state_writes;
  // Deltas to the job's named counters (JobCounters::extra), committed with the batch.
  std::vector<std::pair<std::string, int64_t>> counters;
  // The job's stage from this chunk on, when the source knows it.
  std::optional<state::JobStage> stage;
};

// Keeps the chunk's events for which keep(event) is true, in their order, and counts the others
// in chunk->dropped: what a stage that removes bad input does (keep may add to chunk->errors).
template <typename Keep>
void KeepEvents(EventChunk* chunk, Keep&& keep) {
  std::vector<Event>& events = chunk->events;
  size_t kept = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    if (!keep(events[i])) {
      ++chunk->dropped;
      continue;
    }
    if (kept != i) events[kept] = std::move(events[i]);
    ++kept;
  }
  events.resize(kept);
}

}  // namespace atfill::pipeline
