// Job records (DESIGN.md "Jobs"): status, stage, counters, times, stop reason, parameters, and an
// optional per-batch audit trail, stored in the jobs family with a versioned binary encoding.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "state/kv_store.hpp"

namespace atfill::state {

enum class JobStatus : uint8_t {
  kRunning,
  kPausing,
  kPaused,
  kCancelling,
  kCancelled,
  kCompleted,
  kFailed,
};

enum class JobStage : uint8_t {
  kPending,
  kDiscovering,
  kResolvingAndFetching,
  kReplaying,
  kReplayingAccounts,
  kRetryingBlocks,
  kCompleted,
  kFailed,
  kCancelled,
};

// "running", "pausing", ...; "?" for a value outside the enum.
std::string_view JobStatusName(JobStatus status);
// Invalid naming the text and the accepted names.
Result<JobStatus> ParseJobStatus(std::string_view name);
// "pending", "discovering", "resolving_and_fetching", ...; "?" outside the enum.
std::string_view JobStageName(JobStage stage);
Result<JobStage> ParseJobStage(std::string_view name);
// cancelled, completed and failed: nothing will move the job again.
bool IsTerminal(JobStatus status);

struct JobCounters {
  uint64_t total_repos = 0;
  uint64_t resolved_repos = 0;
  uint64_t processed_repos = 0;
  uint64_t total_records = 0;
  uint64_t records_written = 0;
  uint64_t failed_records = 0;
  uint64_t bytes = 0;
  uint64_t events_read = 0;
  // Further named counters ("archive_segments", ...); keep it small.
  std::map<std::string, uint64_t> extra;
  bool operator==(const JobCounters&) const = default;
};

struct StopReason {
  std::string code;      // machine-readable, e.g. "error_cap", "unfinished_units"; empty = none
  std::string sentence;  // for people
  bool empty() const { return code.empty() && sentence.empty(); }
  bool operator==(const StopReason&) const = default;
};

struct JobRecord {
  uint64_t id = 0;   // allocated by JobStore::Create, from 1
  std::string kind;  // "ingest", "backfill", "replay", ...
  JobStatus status = JobStatus::kRunning;
  JobStage stage = JobStage::kPending;
  JobCounters counters;
  // Unix µs; 0 = not yet.
  int64_t created_us = 0;
  int64_t started_us = 0;
  int64_t updated_us = 0;
  int64_t finished_us = 0;
  int64_t heartbeat_us = 0;
  StopReason stop_reason;
  // What the running job waits for while it makes no progress (code "sink_unavailable": the sink
  // refuses writes, as on a full disk or while its database restarts; the sentence names the sink,
  // its reason, the attempts and the next try), with the time the wait began; empty otherwise.
  // The next commit clears it.
  StopReason waiting;
  int64_t waiting_since_us = 0;
  std::string started_by;  // "cli", "api", ...
  std::map<std::string, std::string> params;
  bool operator==(const JobRecord&) const = default;
};

// One committed sink batch of a job.
struct BatchAudit {
  uint64_t batch_no = 0;       // consecutive per job
  std::string first_position;  // source positions (cursor values) the batch covers
  std::string last_position;
  uint64_t count = 0;     // records in the batch
  uint64_t failures = 0;  // records refused
  int64_t duration_us = 0;
  uint32_t attempts = 0;  // commit attempts
  int64_t committed_at_us = 0;
  bool operator==(const BatchAudit&) const = default;
};

// Versioned encodings (version byte, then tagged fields; unknown fields are skipped). Decoding
// garbage is Corrupt with the byte offset, never a crash.
std::string EncodeJobRecord(const JobRecord& record);
Result<JobRecord> DecodeJobRecord(std::string_view bytes);
std::string EncodeBatchAudit(const BatchAudit& audit);
Result<BatchAudit> DecodeBatchAudit(std::string_view bytes);

struct JobStoreOptions {
  // Audit entries kept per job: writing batch n deletes batch n - max_audit_batches.
  uint64_t max_audit_batches = 100000;
  Status Validate() const;
};

// Thread-safe over a KvStore it does not own (which must outlive it). Create takes a mutex to
// allocate ids; use ONE JobStore per KvStore so ids stay unique. Put/PutBatchAudit only append to
// a caller's batch, so job counters commit atomically with cursors, queue removals and tombstones.
//
// Layout: jobs family "j"+id (8 big-endian bytes) -> record, "a"+id+batch_no -> audit;
// meta family "next_job_id" -> counter.
class JobStore {
 public:
  explicit JobStore(KvStore& kv, JobStoreOptions options = {}) : kv_(kv), options_(options) {}

  // Allocates the next id, stores `record` with it (written immediately) and returns it.
  Result<JobRecord> Create(JobRecord record);
  // NotFound when no such job; Corrupt when its bytes do not decode.
  Result<JobRecord> Get(uint64_t id);
  // Invalid when record.id is 0.
  Status Put(WriteBatch* batch, const JobRecord& record);
  // Every job, newest (highest id) first. Corrupt (naming the job) if any record does not decode.
  Result<std::vector<JobRecord>> List();

  // Invalid when job is 0 or the options are. Deletes the entry falling out of the window.
  Status PutBatchAudit(WriteBatch* batch, uint64_t job, const BatchAudit& audit);
  // Audit entries with batch_no >= from_batch_no, ascending, at most `limit`.
  Result<std::vector<BatchAudit>> ListBatchAudit(uint64_t job, uint64_t from_batch_no,
                                                 size_t limit);

 private:
  KvStore& kv_;
  const JobStoreOptions options_;
  std::mutex create_mu_;
};

}  // namespace atfill::state
