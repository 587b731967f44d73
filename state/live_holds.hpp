// Live events held back while their repo is backfilled (the atproto backfill guide's rule): a
// crawl that runs beside the live consumer marks each repo it queues and checkpoints it when the
// repo's records are written; the live consumer holds that repo's events until the checkpoint, then
// applies those newer than the checkpoint's rev.
//
// Layout (queue family): "ha"+did -> counter of the repo's unfinished units; "hc"+did -> the
// checkpoint rev (empty when the crawl gave none); "hb"+did+"\0"+be64(order) -> one held event
// (opaque bytes). Every write goes into a caller's batch, so a mark commits with the crawl batch
// that queued or finished the unit and a held event with the live cursor that passed it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "state/kv_store.hpp"

namespace atfill::state {

// A checkpoint as stored: "rev" or "rev\ncollection\n...".
struct HoldCheckpoint {
  std::string rev;
  std::vector<std::string> collections;  // empty: every collection
  static HoldCheckpoint Parse(std::string_view value);
  // Whether the crawl wrote `collection` of the repo (an NSID, or a ".*" prefix listed).
  bool Covers(std::string_view collection) const;
};

// Stateless over a KvStore it does not own; thread-safe.
class LiveHolds {
 public:
  explicit LiveHolds(KvStore& kv) : kv_(kv) {}

  // The crawl side.
  void MarkQueued(WriteBatch* batch, std::string_view did) const;
  // A unit of the repo is written: the checkpoint, with no rev yet.
  void MarkFinished(WriteBatch* batch, std::string_view did) const;
  // The checkpoint's rev (the fetched commit's), after MarkFinished in the same batch, and the
  // collections the crawl wrote of the repo (empty: all of them). A held record event is dropped
  // only when the checkpoint covers its collection: a backfill of one collection added at run time
  // says nothing of the repo's other collections.
  void SetCheckpointRev(WriteBatch* batch, std::string_view did, std::string_view rev,
                        const std::vector<std::string>& collections = {}) const;

  // The repo's unfinished units (marks queued minus finished; 0 when none or unknown).
  Result<int64_t> Unfinished(std::string_view did) const;
  // The repo's checkpoint rev, when the crawl finished a unit of it and the hold is not released.
  Result<std::optional<std::string>> Checkpoint(std::string_view did) const;
  // Calls fn(did, rev) for every checkpointed repo, in DID order, until it returns false.
  Status ScanCheckpoints(const std::function<bool(std::string_view, std::string_view)>& fn) const;
  // Calls fn(did) for every repo with held events or marks, in DID order, until it returns false.
  Status ScanHeldRepos(const std::function<bool(std::string_view)>& fn) const;

  // The live side: holds one event; `order` must grow with arrival (across restarts too).
  void Hold(WriteBatch* batch, std::string_view did, uint64_t order, std::string_view event) const;
  // Calls fn(order, event) for the repo's held events in arrival order until it returns false.
  Status ScanHeld(std::string_view did,
                  const std::function<bool(uint64_t, std::string_view)>& fn) const;
  // Deletes the repo's marks, its checkpoint and its held events of these orders (those ScanHeld
  // gave).
  void Release(WriteBatch* batch, std::string_view did, const std::vector<uint64_t>& orders) const;

 private:
  KvStore& kv_;
};

}  // namespace atfill::state
