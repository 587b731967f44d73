// What the admin HTTP API (docs/admin.md) asks of the process that owns the jobs. AdminServer
// turns HTTP requests into these calls and their answers into JSON; the process running
// `atfill run` implements it over its job store, crawl log, error log and live consumer.
//
// Threading: every method may be called from several server threads at once, and while the
// engine runs; implementations synchronise themselves. No method may block for long (a request
// waits for it): starting, pausing, resuming or cancelling a job only asks for it and returns.
//
// Errors: a method's Status code becomes the HTTP status (AdminServer maps it):
//   kNotFound -> 404, kInvalid -> 400, kUnsupported -> 409 ("the job's state does not allow
//   that"), kUnavailable -> 503, anything else -> 500. The message is sent to the client as
//   {"error": message}, so it should be a sentence for people.
//
// "Finished" below means state::IsTerminal(status): completed, failed or cancelled.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "pipeline/job_details.hpp"
#include "state/crawl_log.hpp"
#include "state/job_store.hpp"

namespace atfill::admin {

// One stage transition of a job. `index` numbers a job's transitions from 0 in the order they
// happened, without gaps, so a reader that has seen transitions [0, k) asks for "since k" and
// misses none however fast the job moves.
struct StageChange {
  uint64_t index = 0;
  state::JobStage from = state::JobStage::kPending;
  state::JobStage to = state::JobStage::kPending;
  int64_t at_us = 0;  // unix µs
};

// A job as listed.
struct JobSummary {
  state::JobRecord job;
  uint64_t queued_units = 0;  // units waiting in the job's work queue (state::WorkQueue::Count)
};

// A job with what it keeps for people (atfill job --hosts --recent).
using JobDetails = pipeline::JobDetails;

// POST /admin/backfill. AdminServer has checked the syntax: every collection is an NSID, every
// DID a DID, source and mode are empty or one of the listed values, and collections or dids is
// non-empty.
struct BackfillRequest {
  std::vector<std::string> collections;  // NSIDs; empty = the config's [crawl] collections
  std::vector<std::string> dids;         // non-empty = an account backfill of these DIDs
  std::string source;                    // "crawl" | "auto" | "replay"; empty = the config's
  std::string mode;                      // "listRecords" | "getRepo"; empty = the config's
};

// POST /admin/collections. AdminServer has checked the syntax: every name is an NSID, and add or
// remove is non-empty.
struct CollectionsRequest {
  std::vector<std::string> add;
  std::vector<std::string> remove;
  bool backfill = true;  // the added collections get a backfill job
  bool purge = false;    // the removed collections' rows are deleted
};

// GET and POST /admin/collections.
struct CollectionsAnswer {
  std::vector<std::string> collections;  // the live consumer's set now
  std::vector<std::string> added;        // POST: what the request added (not there before)
  std::vector<std::string> removed;      // POST: what it removed
  uint64_t backfill_job = 0;             // POST: the job backfilling `added`; 0 = none
  std::vector<std::pair<std::string, uint64_t>> purged;  // POST with purge: rows deleted
};

// GET /admin/lexicons: one lexicon document of the catalog records are validated against.
struct LexiconInfo {
  std::string nsid;
  bool record = false;       // it defines a record type
  bool from_config = false;  // from [lexicons] dirs
  std::string published_by;  // with use_network: the DID that published it (else the API's)
};

// POST /admin/lexicons and DELETE /admin/lexicons/{nsid}.
struct LexiconAnswer {
  std::string nsid;
  bool record = false;
  bool replaced = false;                 // POST: a document of that NSID was there before
  std::vector<std::string> collections;  // the live consumer's set after (empty: none runs)
  bool collection_changed = false;       // the NSID joined (POST) or left (DELETE) that set
  uint64_t backfill_job = 0;             // POST: the job backfilling it; 0 = none
};

// One labeler of the label subscriptions: its saved cursor.
struct LabelerCursor {
  std::string did;
  uint64_t cursor = 0;  // the seq of its last label written
};

// The label subscriptions ([labels] labelers), the "labels" job, in LiveStatus::labels.
struct LabelsStatus {
  bool configured = false;  // false: no job and no [labels] labelers; the rest is unset
  uint64_t job_id = 0;      // 0 = no run yet
  std::string status;       // the job's status ("running", "paused"...), or "not started"
  std::vector<LabelerCursor> labelers;
  double labels_per_s = 0;  // labels accepted per second over the job's running time
  uint64_t frames = 0;      // #labels frames received
  uint64_t labels = 0;      // labels accepted
  uint64_t stored = 0;      // labels stored
  uint64_t negated = 0;     // negations stored
  uint64_t stale = 0;       // labels and negations older than the stored one
  uint64_t refused = 0;     // labels refused, all kinds
  std::map<std::string, uint64_t> refused_by;  // the same by kind (bad_signature...)
  uint64_t bad_frames = 0;                     // messages that were not frames
  uint64_t connection_errors = 0;              // connections failed, refused or dropped
  std::string error;  // why the job stopped, for people; empty = it did not
};

// The live (Jetstream) consumer, GET /admin/jetstream/status.
struct LiveStatus {
  bool configured = false;   // false: this process runs no live consumer; the rest is unset
  std::string status;        // e.g. "connecting", "streaming", "reconnecting", "stopped", "failed"
  std::string host;          // the Jetstream URL it reads
  std::string protocol;      // "v1" or "v2"
  uint64_t cursor = 0;       // the applied watermark: the v2 seq, or the v1 time_us
  int64_t witnessed_us = 0;  // event time (unix µs) of the newest applied event; 0 = none yet
  double lag_s = -1;         // how far behind the network it is, seconds; -1 = unknown
  double events_per_s = 0;   // events read per second, recently
  double records_per_s = 0;  // records written per second, recently
  uint64_t job_id = 0;       // the live job's id; 0 = none
  std::string error;         // the last error, for people; empty = none
  LabelsStatus labels;       // set whether or not the live consumer is configured; the answer
                             // holds "labels" only when labels.configured
};

// One sample of the live consumer's lag, GET /admin/jetstream/history.
struct LiveSample {
  int64_t at_us = 0;    // when it was taken, unix µs
  double lag_s = -1;    // LiveStatus::lag_s then; -1 = unknown
  uint64_t cursor = 0;  // LiveStatus::cursor then
};

class AdminBackend {
 public:
  virtual ~AdminBackend() = default;

  // Every job, newest (highest id) first.
  virtual Result<std::vector<JobSummary>> ListJobs() = 0;

  // NotFound when there is no job `id`.
  virtual Result<JobDetails> GetJob(uint64_t id) = 0;

  // The transitions of job `id` with index >= since, ascending by index. Keeping the
  // transitions seen since this process started is enough (after a restart numbering may start
  // again at 0). NotFound when there is no job `id`; a job with no recorded transition answers
  // an empty list. An implementation records a transition before it publishes the job status
  // that follows it, so a reader that sees a final status then asks for transitions gets all.
  virtual Result<std::vector<StageChange>> StageChanges(uint64_t id, uint64_t since) = 0;

  // Creates a backfill job and starts it asynchronously; returns its id at once. Invalid when
  // the config cannot serve it (e.g. a replay without an archive); Unavailable while the process
  // is shutting down.
  virtual Result<uint64_t> StartBackfill(const BackfillRequest& request) = 0;

  // Ask job `id` to pause, resume or cancel; return the job as it is right after asking (e.g.
  // "pausing"). NotFound; Unsupported when its status does not allow it (pausing a completed
  // job, resuming a running one). Idempotent where the CLI is (pausing a paused job answers it).
  virtual Result<state::JobRecord> Pause(uint64_t id) = 0;
  virtual Result<state::JobRecord> Resume(uint64_t id) = 0;
  virtual Result<state::JobRecord> Cancel(uint64_t id) = 0;

  // Starts a new job that retries what finished job `id` could not do (failed units or archive
  // blocks); returns the new job's id. NotFound; Unsupported when `id` is not finished or has
  // nothing failed.
  virtual Result<uint64_t> RetryFailed(uint64_t id) = 0;

  // Deletes the per-repo details (hosts, recent repos) and the leftover queue of finished job
  // `id`; the job record stays. NotFound; Unsupported when the job is not finished.
  virtual Status ClearDetails(uint64_t id) = 0;
  // ClearDetails for every finished job; returns how many jobs were cleared.
  virtual Result<uint64_t> ClearAllDetails() = 0;

  // The live consumer's state; {configured = false} when there is none.
  virtual Result<LiveStatus> Live() = 0;

  // The live consumer's collections, and changing them while it runs (the change is saved, the
  // consumer keeps its place, the added collections are backfilled beside it). Unsupported when
  // this process runs no live consumer; Invalid when the change cannot apply (e.g. it would leave
  // no collection).
  virtual Result<CollectionsAnswer> Collections() {
    return Status::Unsupported("this process runs no live consumer ([live] hosts)");
  }
  virtual Result<CollectionsAnswer> ChangeCollections(const CollectionsRequest&) {
    return Status::Unsupported("this process runs no live consumer ([live] hosts)");
  }

  // The lexicon catalog (stages/lexicon_validate.hpp). AddLexicon takes one lexicon document
  // (Invalid with the reason when it is not one); a record type's NSID joins the live consumer's
  // collections and, with `backfill`, is backfilled; its records are validated from then on, and
  // the document is kept in state. RemoveLexicon undoes that for a document the API added.
  virtual Result<std::vector<LexiconInfo>> Lexicons() {
    return Status::Unsupported("lexicons are managed by atfill run");
  }
  virtual Result<LexiconAnswer> AddLexicon(std::string_view /*document*/, bool /*backfill*/) {
    return Status::Unsupported("lexicons are managed by atfill run");
  }
  virtual Result<LexiconAnswer> RemoveLexicon(std::string_view /*nsid*/) {
    return Status::Unsupported("lexicons are managed by atfill run");
  }

  // The per-batch audit trail of job `id` (kept with [jobs] record_batches): entries with
  // batch_no >= from, ascending, at most `limit`. NotFound when there is no job `id`; a job
  // without a trail answers an empty list.
  virtual Result<std::vector<state::BatchAudit>> Batches(uint64_t id, uint64_t from,
                                                         size_t limit) = 0;

  // The live consumer's lag as sampled while this process runs, oldest first; a bounded window
  // (the newest samples), empty when there is no live consumer. `interval_ms` is set to the
  // sampling interval.
  virtual Result<std::vector<LiveSample>> LiveHistory(int64_t* interval_ms) = 0;
};

}  // namespace atfill::admin
