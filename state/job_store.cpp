#include "state/job_store.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "state/codec.hpp"

namespace atfill::state {
namespace {

constexpr uint8_t kVersion = 1;
constexpr std::string_view kNextJobIdKey = "next_job_id";

constexpr std::array<std::string_view, 7> kStatusNames = {
    "running", "pausing", "paused", "cancelling", "cancelled", "completed", "failed"};
constexpr std::array<std::string_view, 9> kStageNames = {"pending",
                                                         "discovering",
                                                         "resolving_and_fetching",
                                                         "replaying",
                                                         "replaying_accounts",
                                                         "retrying_blocks",
                                                         "completed",
                                                         "failed",
                                                         "cancelled"};

enum JobTag : uint32_t {
  kTagId = 1,
  kTagKind = 2,
  kTagStatus = 3,
  kTagStage = 4,
  kTagTotalRepos = 5,
  kTagResolvedRepos = 6,
  kTagProcessedRepos = 7,
  kTagTotalRecords = 8,
  kTagRecordsWritten = 9,
  kTagFailedRecords = 10,
  kTagBytes = 11,
  kTagEventsRead = 12,
  kTagExtraCounter = 13,
  kTagCreated = 14,
  kTagStarted = 15,
  kTagUpdated = 16,
  kTagFinished = 17,
  kTagHeartbeat = 18,
  kTagStopCode = 19,
  kTagStopSentence = 20,
  kTagStartedBy = 21,
  kTagParam = 22,
  kTagWaitingCode = 23,
  kTagWaitingSentence = 24,
  kTagWaitingSince = 25,
};

enum AuditTag : uint32_t {
  kTagBatchNo = 1,
  kTagFirstPosition = 2,
  kTagLastPosition = 3,
  kTagCount = 4,
  kTagFailures = 5,
  kTagDuration = 6,
  kTagAttempts = 7,
  kTagCommittedAt = 8,
};

template <size_t N>
std::string AcceptedNames(const std::array<std::string_view, N>& names) {
  std::string out;
  for (auto n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

std::string JobKey(uint64_t id) { return codec::KeyWithId("j", id); }

std::string AuditKey(uint64_t job, uint64_t batch_no) {
  std::string key = codec::KeyWithId("a", job);
  codec::AppendBe64(&key, batch_no);
  return key;
}

}  // namespace

std::string_view JobStatusName(JobStatus status) {
  const auto i = static_cast<size_t>(status);
  return i < kStatusNames.size() ? kStatusNames[i] : std::string_view("?");
}

Result<JobStatus> ParseJobStatus(std::string_view name) {
  for (size_t i = 0; i < kStatusNames.size(); ++i) {
    if (kStatusNames[i] == name) return static_cast<JobStatus>(i);
  }
  return Status::Invalid("unknown job status '" + std::string(name) +
                         "'; expected one of: " + AcceptedNames(kStatusNames));
}

std::string_view JobStageName(JobStage stage) {
  const auto i = static_cast<size_t>(stage);
  return i < kStageNames.size() ? kStageNames[i] : std::string_view("?");
}

Result<JobStage> ParseJobStage(std::string_view name) {
  for (size_t i = 0; i < kStageNames.size(); ++i) {
    if (kStageNames[i] == name) return static_cast<JobStage>(i);
  }
  return Status::Invalid("unknown job stage '" + std::string(name) +
                         "'; expected one of: " + AcceptedNames(kStageNames));
}

bool IsTerminal(JobStatus status) {
  return status == JobStatus::kCancelled || status == JobStatus::kCompleted ||
         status == JobStatus::kFailed;
}

std::string EncodeJobRecord(const JobRecord& r) {
  codec::RecordWriter w(kVersion);
  w.Uint(kTagId, r.id);
  w.Str(kTagKind, r.kind);
  w.Uint(kTagStatus, static_cast<uint64_t>(r.status));
  w.Uint(kTagStage, static_cast<uint64_t>(r.stage));
  const JobCounters& c = r.counters;
  w.Uint(kTagTotalRepos, c.total_repos);
  w.Uint(kTagResolvedRepos, c.resolved_repos);
  w.Uint(kTagProcessedRepos, c.processed_repos);
  w.Uint(kTagTotalRecords, c.total_records);
  w.Uint(kTagRecordsWritten, c.records_written);
  w.Uint(kTagFailedRecords, c.failed_records);
  w.Uint(kTagBytes, c.bytes);
  w.Uint(kTagEventsRead, c.events_read);
  for (const auto& [name, value] : c.extra) w.StrUint(kTagExtraCounter, name, value);
  w.Int(kTagCreated, r.created_us);
  w.Int(kTagStarted, r.started_us);
  w.Int(kTagUpdated, r.updated_us);
  w.Int(kTagFinished, r.finished_us);
  w.Int(kTagHeartbeat, r.heartbeat_us);
  w.Str(kTagStopCode, r.stop_reason.code);
  w.Str(kTagStopSentence, r.stop_reason.sentence);
  w.Str(kTagStartedBy, r.started_by);
  for (const auto& [name, value] : r.params) w.StrPair(kTagParam, name, value);
  if (!r.waiting.empty()) {
    w.Str(kTagWaitingCode, r.waiting.code);
    w.Str(kTagWaitingSentence, r.waiting.sentence);
    w.Int(kTagWaitingSince, r.waiting_since_us);
  }
  return w.Take();
}

Result<JobRecord> DecodeJobRecord(std::string_view bytes) {
  JobRecord r;
  bool has_id = false, has_status = false, has_stage = false;
  JobCounters& c = r.counters;
  auto uint_into = [](const codec::Field& f, uint64_t* out) -> Status {
    ATFILL_ASSIGN_OR_RETURN(*out, f.Uint());
    return Status::OK();
  };
  auto int_into = [](const codec::Field& f, int64_t* out) -> Status {
    ATFILL_ASSIGN_OR_RETURN(*out, f.Int());
    return Status::OK();
  };
  ATFILL_RETURN_IF_ERROR(
      codec::ReadRecord(bytes, kVersion, "job record", [&](const codec::Field& f) -> Status {
        switch (f.tag()) {
          case kTagId:
            has_id = true;
            return uint_into(f, &r.id);
          case kTagKind:
            r.kind = f.Str();
            return Status::OK();
          case kTagStatus: {
            ATFILL_ASSIGN_OR_RETURN(uint64_t v, f.Uint());
            if (v >= kStatusNames.size())
              return f.Error("status " + std::to_string(v) + " is unknown");
            r.status = static_cast<JobStatus>(v);
            has_status = true;
            return Status::OK();
          }
          case kTagStage: {
            ATFILL_ASSIGN_OR_RETURN(uint64_t v, f.Uint());
            if (v >= kStageNames.size())
              return f.Error("stage " + std::to_string(v) + " is unknown");
            r.stage = static_cast<JobStage>(v);
            has_stage = true;
            return Status::OK();
          }
          case kTagTotalRepos:
            return uint_into(f, &c.total_repos);
          case kTagResolvedRepos:
            return uint_into(f, &c.resolved_repos);
          case kTagProcessedRepos:
            return uint_into(f, &c.processed_repos);
          case kTagTotalRecords:
            return uint_into(f, &c.total_records);
          case kTagRecordsWritten:
            return uint_into(f, &c.records_written);
          case kTagFailedRecords:
            return uint_into(f, &c.failed_records);
          case kTagBytes:
            return uint_into(f, &c.bytes);
          case kTagEventsRead:
            return uint_into(f, &c.events_read);
          case kTagExtraCounter: {
            std::string name;
            uint64_t value = 0;
            ATFILL_RETURN_IF_ERROR(f.StrUint(&name, &value));
            c.extra[std::move(name)] = value;
            return Status::OK();
          }
          case kTagCreated:
            return int_into(f, &r.created_us);
          case kTagStarted:
            return int_into(f, &r.started_us);
          case kTagUpdated:
            return int_into(f, &r.updated_us);
          case kTagFinished:
            return int_into(f, &r.finished_us);
          case kTagHeartbeat:
            return int_into(f, &r.heartbeat_us);
          case kTagStopCode:
            r.stop_reason.code = f.Str();
            return Status::OK();
          case kTagStopSentence:
            r.stop_reason.sentence = f.Str();
            return Status::OK();
          case kTagStartedBy:
            r.started_by = f.Str();
            return Status::OK();
          case kTagWaitingCode:
            r.waiting.code = f.Str();
            return Status::OK();
          case kTagWaitingSentence:
            r.waiting.sentence = f.Str();
            return Status::OK();
          case kTagWaitingSince:
            return int_into(f, &r.waiting_since_us);
          case kTagParam: {
            std::string name, value;
            ATFILL_RETURN_IF_ERROR(f.StrPair(&name, &value));
            r.params[std::move(name)] = std::move(value);
            return Status::OK();
          }
          default:
            return Status::OK();
        }
      }));
  if (!has_id || !has_status || !has_stage) {
    return Status::Corrupt("job record: missing " +
                           std::string(!has_id       ? "id"
                                       : !has_status ? "status"
                                                     : "stage") +
                           " field");
  }
  return r;
}

std::string EncodeBatchAudit(const BatchAudit& a) {
  codec::RecordWriter w(kVersion);
  w.Uint(kTagBatchNo, a.batch_no);
  w.Str(kTagFirstPosition, a.first_position);
  w.Str(kTagLastPosition, a.last_position);
  w.Uint(kTagCount, a.count);
  w.Uint(kTagFailures, a.failures);
  w.Int(kTagDuration, a.duration_us);
  w.Uint(kTagAttempts, a.attempts);
  w.Int(kTagCommittedAt, a.committed_at_us);
  return w.Take();
}

Result<BatchAudit> DecodeBatchAudit(std::string_view bytes) {
  BatchAudit a;
  bool has_batch_no = false;
  ATFILL_RETURN_IF_ERROR(
      codec::ReadRecord(bytes, kVersion, "batch audit", [&](const codec::Field& f) -> Status {
        switch (f.tag()) {
          case kTagBatchNo: {
            ATFILL_ASSIGN_OR_RETURN(a.batch_no, f.Uint());
            has_batch_no = true;
            break;
          }
          case kTagFirstPosition:
            a.first_position = f.Str();
            break;
          case kTagLastPosition:
            a.last_position = f.Str();
            break;
          case kTagCount: {
            ATFILL_ASSIGN_OR_RETURN(a.count, f.Uint());
            break;
          }
          case kTagFailures: {
            ATFILL_ASSIGN_OR_RETURN(a.failures, f.Uint());
            break;
          }
          case kTagDuration: {
            ATFILL_ASSIGN_OR_RETURN(a.duration_us, f.Int());
            break;
          }
          case kTagAttempts: {
            ATFILL_ASSIGN_OR_RETURN(a.attempts, f.Uint32());
            break;
          }
          case kTagCommittedAt: {
            ATFILL_ASSIGN_OR_RETURN(a.committed_at_us, f.Int());
            break;
          }
          default:
            break;
        }
        return Status::OK();
      }));
  if (!has_batch_no) return Status::Corrupt("batch audit: missing batch_no field");
  return a;
}

Status JobStoreOptions::Validate() const {
  if (max_audit_batches == 0) return Status::Invalid("job store: max_audit_batches is 0");
  return Status::OK();
}

Result<JobRecord> JobStore::Create(JobRecord record) {
  std::lock_guard lock(create_mu_);
  ATFILL_ASSIGN_OR_RETURN(auto raw, kv_.Get(Family::kMeta, kNextJobIdKey));
  uint64_t id = 1;
  if (raw) {
    ATFILL_ASSIGN_OR_RETURN(id, DecodeCounter(*raw, "state meta next_job_id"));
  }
  record.id = id;
  WriteBatch batch;
  batch.Put(Family::kMeta, kNextJobIdKey, EncodeCounter(id + 1));
  batch.Put(Family::kJobs, JobKey(id), EncodeJobRecord(record));
  ATFILL_RETURN_IF_ERROR(kv_.Write(batch));
  return record;
}

Result<JobRecord> JobStore::Get(uint64_t id) {
  ATFILL_ASSIGN_OR_RETURN(auto raw, kv_.Get(Family::kJobs, JobKey(id)));
  if (!raw) return Status::NotFound("job " + std::to_string(id) + " does not exist");
  auto decoded = DecodeJobRecord(*raw);
  if (!decoded.ok()) return decoded.status().WithContext("job " + std::to_string(id));
  if (decoded->id != id) {
    return Status::Corrupt("job " + std::to_string(id) + ": record carries id " +
                           std::to_string(decoded->id));
  }
  return decoded;
}

Status JobStore::Put(WriteBatch* batch, const JobRecord& record) {
  if (record.id == 0) return Status::Invalid("job store: a job record needs an id (use Create)");
  batch->Put(Family::kJobs, JobKey(record.id), EncodeJobRecord(record));
  return Status::OK();
}

Result<std::vector<JobRecord>> JobStore::List() {
  std::vector<JobRecord> out;
  Status error;
  ATFILL_RETURN_IF_ERROR(
      kv_.Scan(Family::kJobs, "j", [&](std::string_view key, std::string_view value) {
        uint64_t id = 0;
        codec::ReadBe64(key, 1, &id);
        auto decoded = DecodeJobRecord(value);
        if (!decoded.ok()) {
          error = decoded.status().WithContext("job " + std::to_string(id));
          return false;
        }
        out.push_back(std::move(decoded).value());
        return true;
      }));
  ATFILL_RETURN_IF_ERROR(error);
  std::reverse(out.begin(), out.end());
  return out;
}

Status JobStore::PutBatchAudit(WriteBatch* batch, uint64_t job, const BatchAudit& audit) {
  if (job == 0) return Status::Invalid("job store: batch audit for job 0");
  ATFILL_RETURN_IF_ERROR(options_.Validate());
  batch->Put(Family::kJobs, AuditKey(job, audit.batch_no), EncodeBatchAudit(audit));
  if (audit.batch_no >= options_.max_audit_batches) {
    batch->Delete(Family::kJobs, AuditKey(job, audit.batch_no - options_.max_audit_batches));
  }
  return Status::OK();
}

Result<std::vector<BatchAudit>> JobStore::ListBatchAudit(uint64_t job, uint64_t from_batch_no,
                                                         size_t limit) {
  std::vector<BatchAudit> out;
  if (limit == 0) return out;
  Status error;
  const std::string prefix = codec::KeyWithId("a", job);
  ATFILL_RETURN_IF_ERROR(kv_.Scan(
      Family::kJobs, prefix,
      [&](std::string_view, std::string_view value) {
        auto decoded = DecodeBatchAudit(value);
        if (!decoded.ok()) {
          error = decoded.status().WithContext("job " + std::to_string(job));
          return false;
        }
        out.push_back(std::move(decoded).value());
        return out.size() < limit;
      },
      from_batch_no == 0 ? std::string() : AuditKey(job, from_batch_no - 1)));
  ATFILL_RETURN_IF_ERROR(error);
  return out;
}

}  // namespace atfill::state
