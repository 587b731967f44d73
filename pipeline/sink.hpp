// A Sink makes batches of events durable in a database.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "base/status.hpp"
#include "pipeline/event.hpp"

namespace atfill::pipeline {

// What one batch did to the table.
struct WriteStats {
  uint64_t inserted = 0;          // new rows
  uint64_t updated = 0;           // rows whose CID/body changed
  uint64_t unchanged = 0;         // same CID redelivered: row and indexed_at kept
  uint64_t stale = 0;             // writes or deletes older (by rev) than the stored row: ignored
  uint64_t deleted = 0;           // rows removed by record deletes
  uint64_t purged_accounts = 0;   // account purges applied
  uint64_t purged_records = 0;    // rows removed by account purges
  uint64_t resyncs = 0;           // repo resyncs applied
  uint64_t resynced_records = 0;  // rows removed by resyncs (the current ones follow as creates)

  WriteStats& operator+=(const WriteStats& o);
  uint64_t records_written() const { return inserted + updated; }
};

// The write rules every sink implements, in one transaction per batch, in event order:
//  * create/update: upsert by AT URI. A stored row with a rev newer than the event's is kept
//    (stale); a row with a rev is not replaced by an event without one unless the CIDs match;
//    an identical CID keeps the row and its indexed_at (unchanged).
//  * delete: removes the row unless the stored rev is newer than the delete's (stale); a delete
//    without a rev removes the row.
//  * account event whose status purges (deleted, takendown, suspended): removes every row of the
//    DID. Other account events change nothing in the sink.
//  * resync (AccountEvent::resync): removes the DID's rows in the event's collections (all when
//    it names none); the creates that follow in the stream bring the current records back.
//  * a purge or resync with AccountEvent::purge_before_rev removes only the rows whose rev is
//    older than it (or that have none).
// Tombstones (refusing creates after a delete) are the ingest guard's job, not the sink's.
class Sink {
 public:
  virtual ~Sink() = default;

  // Applies `batch` atomically and returns once it is durable. Called by one thread at a time;
  // not re-entrant. Idempotent: writing the same batch again leaves the same table. A transient
  // failure (database locked, disk full, server down) is Unavailable and nothing of the batch is
  // applied; any other error is final for the batch.
  virtual Result<WriteStats> Write(std::span<const Event> batch) = 0;

  // "sqlite", "postgres", "dry-run".
  virtual std::string_view name() const = 0;
};

}  // namespace atfill::pipeline
