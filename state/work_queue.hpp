// Per-job queue of work units (unit id -> payload), e.g. one (did, collection) to crawl, kept in
// insertion order so a restarted job resumes where it was.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "state/kv_store.hpp"

namespace atfill::state {

struct WorkUnit {
  uint64_t position = 0;  // insertion order within the job, from 1; never reused
  std::string id;         // unique within the job's queue
  std::string payload;
  bool operator==(const WorkUnit&) const = default;
};

// Thread-safe over a KvStore it does not own (which must outlive it). Positions are allocated
// from an in-memory counter per job (seeded from the last stored position on first use), so use
// ONE WorkQueue per KvStore.
//
// Push and Remove only append to a caller's batch, so a unit leaves the queue in the same commit
// as the records it produced. The exact count: each Push adds +1 and each Remove -1 to a counter
// key with WriteBatch::Add in the same batch. Adds commute, so the count stays exact whatever
// order batches commit in and whichever batches are dropped uncommitted, provided that
//   - a unit id is not pushed again before its first push is committed (Push itself refuses an
//     id that is already committed in the queue), and
//   - a unit is removed at most once (remove what Scan returned, once).
// Recount() rebuilds the counter from the units; call it at resume, when no batch is in flight.
//
// Layout (queue family, job J as 8 big-endian bytes): "q"+J+position -> {id, payload};
// "u"+J+id -> position; "n"+J -> counter; "d"+J+id -> "" for finished units.
class WorkQueue {
 public:
  explicit WorkQueue(KvStore& kv) : kv_(kv) {}

  // Stages the unit; returns its position, or nullopt when a unit with this id is already queued.
  // Invalid for an empty id.
  Result<std::optional<uint64_t>> Push(WriteBatch* batch, uint64_t job, std::string_view unit_id,
                                       std::string_view payload);
  void Remove(WriteBatch* batch, uint64_t job, const WorkUnit& unit);
  // Remove, and remember the id as finished so IsFinished answers true from that commit on
  // (a crawl does not fetch a finished unit again when a listing names it twice). Only the id
  // is kept.
  void Finish(WriteBatch* batch, uint64_t job, const WorkUnit& unit);
  Result<bool> IsFinished(uint64_t job, std::string_view unit_id);
  // The committed unit with this id, if queued.
  Result<std::optional<WorkUnit>> Find(uint64_t job, std::string_view unit_id);
  // Calls fn for committed units with position > after_position, in insertion order, until fn
  // returns false.
  Status Scan(uint64_t job, uint64_t after_position,
              const std::function<bool(const WorkUnit&)>& fn);
  // The first `limit` units after `after_position`.
  Result<std::vector<WorkUnit>> Pending(uint64_t job, uint64_t after_position, size_t limit);
  Result<uint64_t> Count(uint64_t job);
  // The position of the last committed unit, 0 when the queue is empty.
  Result<uint64_t> LastPosition(uint64_t job);
  // Counts the units, stores that as the count, and returns it.
  Result<uint64_t> Recount(uint64_t job);
  // Removes every unit of the job and its count (immediately). Not while batches are in flight.
  Status Clear(uint64_t job);

 private:
  Result<uint64_t> AllocatePosition(uint64_t job);

  KvStore& kv_;
  std::mutex mu_;
  std::map<uint64_t, uint64_t> next_position_;
};

}  // namespace atfill::state
