// The ingest guard: the tombstone rules of the delivery guarantee, against state.
//  * A record delete leaves a record tombstone (AT URI -> the delete's rev and time), or, under a
//    DeleteTombstoneRule, only where a stale create could still arrive (counted otherwise as
//    tombstones_skipped).
//  * A create/update at or before a record tombstone's rev, or without a rev where a tombstone
//    exists, is refused: it is older than the delete.
//  * An account event whose status purges records (deleted, takendown, suspended) leaves an account
//    tombstone; while it stands, creates and updates for that DID are refused. An active account
//    event lifts it.
// Revision order among live rows is the sink's rule; the guard only knows what was deleted.
// Tombstones are swept after their retention (state::Tombstones).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/transform.hpp"
#include "state/tombstones.hpp"

namespace atfill::stages {

// Ordered: sees every chunk in source order on the engine's commit node. Tombstones written by
// chunks not yet committed are kept in its state, so a delete and a later stale create in the same
// batch are handled as if the delete were already stored.
// When a record delete leaves a tombstone. Without a rule every delete does (file ingest, crawl).
// With one (the live consumer), only when a stale create could still arrive: the account holds
// records in that collection (in the sink, or created earlier in this run), or the collection is
// one a running backfill covers.
struct DeleteTombstoneRule {
  // Whether the sink holds records of `did` in `collection` (as of its last committed batch; what
  // later batches create the guard remembers itself). Called on the guard's ordered node. An
  // error counts as "holds".
  std::function<Result<bool>(const std::string& did, const std::string& collection)> sink_holds;
  // Collections whose deletes always leave a tombstone: those a running backfill covers (NSIDs,
  // "prefix.*", or "*" for all).
  std::vector<std::string> always;
};

class IngestGuard : public pipeline::Transform {
 public:
  // `tombstones` must outlive the guard. `now_us` stamps new tombstones (the sweep clock).
  explicit IngestGuard(state::Tombstones* tombstones, std::function<int64_t()> now_us = nullptr,
                       std::optional<DeleteTombstoneRule> rule = std::nullopt);

  std::string_view name() const override { return "ingest_guard"; }
  bool ordered() const override { return true; }
  std::unique_ptr<pipeline::TransformState> NewState() const override;
  Status Process(pipeline::TransformState* state, pipeline::EventChunk* chunk) const override;
  Status SealBatch(pipeline::TransformState* state, state::WriteBatch* batch) const override;
  void OnCommitted(pipeline::TransformState* state, bool durable) const override;

 private:
  state::Tombstones* tombstones_;
  std::function<int64_t()> now_us_;
  std::optional<DeleteTombstoneRule> rule_;
};

}  // namespace atfill::stages
