// The per-job error log: records that could not be ingested and why (CID mismatch, bad JSON,
// invalid DID, script error, ...), coalesced by (kind, key) with an attempt count, capped per job
// with exact per-kind counts beyond the cap.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "state/kv_store.hpp"

namespace atfill::state {

struct ErrorLogOptions {
  // Distinct (kind, key) entries stored per job; later new keys are counted but not stored.
  uint64_t max_entries_per_job = 10000;
  // Longer keys and messages are truncated to this many bytes before storing.
  size_t max_key_bytes = 1024;
  size_t max_message_bytes = 4096;
  Status Validate() const;
};

// One error to append. `kind` is a short machine name: 1-64 of [a-z0-9_.-] ("cid_mismatch",
// "invalid_did", "bad_json", "script_error"). `key` says where (an AT URI, "line 17", a DID).
struct NewError {
  std::string kind;
  std::string key;
  std::string message;
  int64_t time_us = 0;  // unix µs
};

// Whether entries of `kind` record an outcome the network reported rather than a failure:
// "repo_unavailable", an account its PDS reports deactivated, taken down, suspended or gone; a
// firehose repo whose chain broke ("repo_desync") and its resync's failure or deferral for an
// inactive account ("resync_failed", "resync_deferred"), which concern a repo, not a record. The
// log keeps and lists them like the errors (atfill job --errors); the engine does not count them
// among a job's errors (JobCounters::failed_records), and they do not make a completed job one
// that completed with errors.
bool IsOutcomeKind(std::string_view kind);

struct ErrorEntry {
  uint64_t seq = 0;  // position in the job's log, from 1, in first-seen order
  std::string kind;
  std::string key;
  std::string message;  // the latest message
  uint64_t attempts = 0;
  int64_t first_us = 0;
  int64_t last_us = 0;
  bool resolved = false;
  bool operator==(const ErrorEntry&) const = default;
};

struct ErrorAppendResult {
  uint64_t added = 0;      // new entries stored
  uint64_t coalesced = 0;  // appends onto an existing entry (attempts + 1)
  uint64_t dropped = 0;    // new keys not stored because the log was full
  // The log holds max_entries_per_job entries after this call: the job may stop with that reason.
  bool cap_reached = false;
};

struct ErrorTotals {
  uint64_t occurrences = 0;  // every appended error, coalesced and dropped ones included
  uint64_t entries = 0;      // stored entries (at most max_entries_per_job)
  uint64_t dropped = 0;      // appends of new keys refused by the cap
  bool operator==(const ErrorTotals&) const = default;
};

// Thread-safe. Appends are read-modify-write, so they are serialised by a mutex inside this
// object and committed immediately (not through a caller's batch); use ONE ErrorLog per KvStore
// so the counters stay exact. Reads do not take the mutex.
//
// Counting: CountsByKind and Total count occurrences: every appended error, including those
// coalesced onto an entry (a key failing three times counts three) and those dropped beyond the
// cap, so they stay exact however many errors a job has; attempts on each entry tell repeats
// apart.
//
// Layout (errors family, per job J as 8 big-endian bytes): "m"+J totals; "c"+J+kind occurrence
// counter; "e"+J+seq entry; "k"+J+kind+'\0'+key -> seq (the coalescing index).
class ErrorLog {
 public:
  explicit ErrorLog(KvStore& kv, ErrorLogOptions options = {}) : kv_(kv), options_(options) {}

  // Invalid for a malformed kind or invalid options; then nothing of the call is stored.
  Result<ErrorAppendResult> Append(uint64_t job, const NewError& error);
  // Appends many with one write; coalesces within the call too.
  Result<ErrorAppendResult> AppendAll(uint64_t job, std::span<const NewError> errors);
  // The same, but the writes go into `batch` for the caller to commit with other state (the
  // engine commits a batch's errors with its cursor, so a replay after a crash does not count
  // them twice). It reads what is stored, so `batch` must be committed (or dropped) before the
  // next append for the same job.
  Result<ErrorAppendResult> AppendAll(uint64_t job, std::span<const NewError> errors,
                                      WriteBatch* batch);

  // Marks the stored entry resolved (a retry succeeded). NotFound when (kind, key) is not stored.
  // A later Append of the same key clears the flag.
  Status MarkResolved(uint64_t job, std::string_view kind, std::string_view key);
  // The same into `batch`, for an entry that may not exist: false (and nothing written) when
  // (kind, key) is not stored or already resolved.
  Result<bool> ResolveIfStored(uint64_t job, std::string_view kind, std::string_view key,
                               WriteBatch* batch);

  // Stored entries in first-seen order, skipping `offset`, at most `limit`.
  Result<std::vector<ErrorEntry>> List(uint64_t job, uint64_t offset, uint64_t limit);
  Result<std::map<std::string, uint64_t>> CountsByKind(uint64_t job);
  Result<ErrorTotals> Totals(uint64_t job);
  // Totals().occurrences.
  Result<uint64_t> Total(uint64_t job);
  // Deletes the job's whole log.
  Status Clear(uint64_t job);

  const ErrorLogOptions& options() const { return options_; }

 private:
  // Reads what is stored and puts the appends' writes into `batch`; append_mu_ held.
  Result<ErrorAppendResult> StageLocked(uint64_t job, std::span<const NewError> errors,
                                        WriteBatch* batch);

  KvStore& kv_;
  const ErrorLogOptions options_;
  std::mutex append_mu_;
};

}  // namespace atfill::state
