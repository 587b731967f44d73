// Live events of repos being backfilled wait for the repo's checkpoint, as the atproto backfill
// guide describes: while a crawl running beside the live consumer has a repo queued, that repo's
// live events (records and account events) are held in state instead of applied; once the crawl
// has written the repo (its checkpoint, with the fetched commit's rev), the held events are
// applied before the repo's next live events, dropping record events at or below the
// checkpoint's rev (the fetched repo already has them).
//
// The sink's rules (rev guard, tombstones) would make the table converge without holding; holding
// keeps the order the guide asks for: nothing of a repo's live stream reaches the sink before the
// snapshot it builds on.
//
// Crash safety: a held event is written to state in the same batch as the live cursor that passed
// it, and a release deletes it in the same batch as the cursor of the chunk that applied it; a
// crash replays from the cursor, so each held event is applied once after its checkpoint (or, when
// a crash lands between, again: idempotent writes).
#pragma once

#include <functional>

#include "pipeline/transform.hpp"
#include "state/live_holds.hpp"

namespace atfill::stages {

struct LiveHoldOptions {
  // Whether a crawl is running beside the consumer. While none is, nothing new is held and every
  // repo still held (a crawl that stopped before finishing it) is released.
  std::function<bool()> backfill_running;
  // Whether every live event is held, whatever its repo: while a replay of the stream's gap runs
  // beside the consumer (the gap's older events must land first). When it turns false, the held
  // repos are released once no crawl runs (they have no checkpoint: nothing is dropped).
  std::function<bool()> hold_all;
  // Repos released per chunk at most (bounds the work of one chunk; the rest follow).
  size_t max_releases_per_chunk = 256;
  // The order of held events: must grow across restarts (default: the wall clock in µs, made
  // strictly increasing).
  std::function<uint64_t()> clock;
  // Whether the consumer still takes a collection (its collections change at run time): a held
  // record event of one it no longer takes is dropped at its release (counter live_unwanted).
  // Unset: every collection.
  std::function<bool(std::string_view collection)> consumes;
};

// Ordered (the live consumer's graph, before the ingest guard). Counters: live_held (events
// held), live_released (held events applied), live_hold_dropped (held record events at or below
// the checkpoint's rev), live_holds_released (repos released).
class LiveHold : public pipeline::Transform {
 public:
  // `holds` must outlive the transform.
  LiveHold(state::LiveHolds* holds, LiveHoldOptions options);

  std::string_view name() const override { return "live_hold"; }
  bool ordered() const override { return true; }
  std::unique_ptr<pipeline::TransformState> NewState() const override;
  Status Process(pipeline::TransformState* state, pipeline::EventChunk* chunk) const override;
  Status SealBatch(pipeline::TransformState* state, state::WriteBatch* batch) const override;
  void OnCommitted(pipeline::TransformState* state, bool durable) const override;

 private:
  state::LiveHolds* holds_;
  LiveHoldOptions options_;
};

}  // namespace atfill::stages
