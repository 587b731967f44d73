#include "state/error_log.hpp"

#include <algorithm>
#include <map>

#include "state/codec.hpp"

namespace atfill::state {
namespace {

constexpr uint8_t kVersion = 1;

enum EntryTag : uint32_t {
  kTagSeq = 1,
  kTagKind = 2,
  kTagKey = 3,
  kTagMessage = 4,
  kTagAttempts = 5,
  kTagFirst = 6,
  kTagLast = 7,
  kTagResolved = 8,
};

enum TotalsTag : uint32_t {
  kTagNextSeq = 1,
  kTagEntries = 2,
  kTagOccurrences = 3,
  kTagDropped = 4,
};

std::string JobKey(char kind, uint64_t job) { return codec::KeyWithId(std::string(1, kind), job); }

std::string IndexKey(uint64_t job, std::string_view kind, std::string_view key) {
  std::string k = JobKey('k', job);
  k.append(kind);
  k.push_back('\0');
  k.append(key);
  return k;
}

std::string EntryKey(uint64_t job, uint64_t seq) {
  std::string k = JobKey('e', job);
  codec::AppendBe64(&k, seq);
  return k;
}

std::string CountKey(uint64_t job, std::string_view kind) {
  std::string k = JobKey('c', job);
  k.append(kind);
  return k;
}

std::string EncodeEntry(const ErrorEntry& e) {
  codec::RecordWriter w(kVersion);
  w.Uint(kTagSeq, e.seq);
  w.Str(kTagKind, e.kind);
  w.Str(kTagKey, e.key);
  w.Str(kTagMessage, e.message);
  w.Uint(kTagAttempts, e.attempts);
  w.Int(kTagFirst, e.first_us);
  w.Int(kTagLast, e.last_us);
  w.Bool(kTagResolved, e.resolved);
  return w.Take();
}

Result<ErrorEntry> DecodeEntry(std::string_view bytes, uint64_t job) {
  ErrorEntry e;
  const std::string what = "error log entry of job " + std::to_string(job);
  ATFILL_RETURN_IF_ERROR(codec::ReadRecord(bytes, kVersion, what, [&](const codec::Field& f) {
    switch (f.tag()) {
      case kTagSeq: {
        ATFILL_ASSIGN_OR_RETURN(e.seq, f.Uint());
        break;
      }
      case kTagKind:
        e.kind = f.Str();
        break;
      case kTagKey:
        e.key = f.Str();
        break;
      case kTagMessage:
        e.message = f.Str();
        break;
      case kTagAttempts: {
        ATFILL_ASSIGN_OR_RETURN(e.attempts, f.Uint());
        break;
      }
      case kTagFirst: {
        ATFILL_ASSIGN_OR_RETURN(e.first_us, f.Int());
        break;
      }
      case kTagLast: {
        ATFILL_ASSIGN_OR_RETURN(e.last_us, f.Int());
        break;
      }
      case kTagResolved: {
        ATFILL_ASSIGN_OR_RETURN(e.resolved, f.Bool());
        break;
      }
      default:
        break;
    }
    return Status::OK();
  }));
  if (e.seq == 0 || e.kind.empty()) return Status::Corrupt(what + ": missing seq or kind");
  return e;
}

struct StoredTotals {
  uint64_t next_seq = 1;
  ErrorTotals totals;
};

std::string EncodeTotals(const StoredTotals& t) {
  codec::RecordWriter w(kVersion);
  w.Uint(kTagNextSeq, t.next_seq);
  w.Uint(kTagEntries, t.totals.entries);
  w.Uint(kTagOccurrences, t.totals.occurrences);
  w.Uint(kTagDropped, t.totals.dropped);
  return w.Take();
}

Result<StoredTotals> LoadTotals(KvStore& kv, uint64_t job) {
  StoredTotals t;
  ATFILL_ASSIGN_OR_RETURN(auto raw, kv.Get(Family::kErrors, JobKey('m', job)));
  if (!raw) return t;
  const std::string what = "error log totals of job " + std::to_string(job);
  ATFILL_RETURN_IF_ERROR(codec::ReadRecord(*raw, kVersion, what, [&](const codec::Field& f) {
    switch (f.tag()) {
      case kTagNextSeq: {
        ATFILL_ASSIGN_OR_RETURN(t.next_seq, f.Uint());
        break;
      }
      case kTagEntries: {
        ATFILL_ASSIGN_OR_RETURN(t.totals.entries, f.Uint());
        break;
      }
      case kTagOccurrences: {
        ATFILL_ASSIGN_OR_RETURN(t.totals.occurrences, f.Uint());
        break;
      }
      case kTagDropped: {
        ATFILL_ASSIGN_OR_RETURN(t.totals.dropped, f.Uint());
        break;
      }
      default:
        break;
    }
    return Status::OK();
  }));
  return t;
}

Status ValidateKind(std::string_view kind) {
  const bool ok_chars = std::all_of(kind.begin(), kind.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
  });
  if (kind.empty() || kind.size() > 64 || !ok_chars) {
    return Status::Invalid("error log: kind '" + std::string(kind.substr(0, 80)) +
                           "' is not 1-64 characters of [a-z0-9_.-]");
  }
  return Status::OK();
}

// Cuts at a UTF-8 character boundary at or before `max` bytes.
std::string Truncate(std::string_view s, size_t max) {
  if (s.size() <= max) return std::string(s);
  size_t n = max;
  while (n > 0 && (static_cast<uint8_t>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n));
}

}  // namespace

bool IsOutcomeKind(std::string_view kind) {
  return kind == "repo_unavailable" || kind == "repo_desync" || kind == "resync_failed" ||
         kind == "resync_deferred";
}

Status ErrorLogOptions::Validate() const {
  if (max_entries_per_job == 0) return Status::Invalid("error log: max_entries_per_job is 0");
  if (max_key_bytes == 0 || max_message_bytes == 0) {
    return Status::Invalid("error log: max_key_bytes and max_message_bytes must be positive");
  }
  return Status::OK();
}

Result<ErrorAppendResult> ErrorLog::Append(uint64_t job, const NewError& error) {
  return AppendAll(job, std::span<const NewError>(&error, 1));
}

Result<ErrorAppendResult> ErrorLog::AppendAll(uint64_t job, std::span<const NewError> errors) {
  WriteBatch batch;
  std::lock_guard lock(append_mu_);
  ATFILL_ASSIGN_OR_RETURN(ErrorAppendResult result, StageLocked(job, errors, &batch));
  ATFILL_RETURN_IF_ERROR(kv_.Write(batch));
  return result;
}

Result<ErrorAppendResult> ErrorLog::AppendAll(uint64_t job, std::span<const NewError> errors,
                                              WriteBatch* batch) {
  std::lock_guard lock(append_mu_);
  return StageLocked(job, errors, batch);
}

Result<ErrorAppendResult> ErrorLog::StageLocked(uint64_t job, std::span<const NewError> errors,
                                                WriteBatch* batch) {
  ATFILL_RETURN_IF_ERROR(options_.Validate());
  for (const auto& e : errors) ATFILL_RETURN_IF_ERROR(ValidateKind(e.kind));
  ErrorAppendResult result;
  ATFILL_ASSIGN_OR_RETURN(StoredTotals totals, LoadTotals(kv_, job));
  // Entries touched by this call, by index key, so repeats within the call coalesce too.
  std::map<std::string, ErrorEntry> touched;
  std::map<std::string, int64_t> kind_counts;
  for (const auto& in : errors) {
    const std::string key = Truncate(in.key, options_.max_key_bytes);
    const std::string index = IndexKey(job, in.kind, key);
    ++totals.totals.occurrences;
    ++kind_counts[in.kind];
    auto it = touched.find(index);
    if (it == touched.end()) {
      ATFILL_ASSIGN_OR_RETURN(auto seq_raw, kv_.Get(Family::kErrors, index));
      if (seq_raw) {
        uint64_t seq = 0;
        if (seq_raw->size() != 8 || !codec::ReadBe64(*seq_raw, 0, &seq)) {
          return Status::Corrupt("error log index of job " + std::to_string(job) +
                                 " is not an 8-byte sequence number");
        }
        ATFILL_ASSIGN_OR_RETURN(auto entry_raw, kv_.Get(Family::kErrors, EntryKey(job, seq)));
        if (!entry_raw) {
          return Status::Corrupt("error log of job " + std::to_string(job) + ": index points at " +
                                 "missing entry " + std::to_string(seq));
        }
        ATFILL_ASSIGN_OR_RETURN(ErrorEntry stored, DecodeEntry(*entry_raw, job));
        it = touched.emplace(index, std::move(stored)).first;
      }
    }
    if (it != touched.end()) {
      ErrorEntry& e = it->second;
      ++e.attempts;
      e.first_us = std::min(e.first_us, in.time_us);
      e.last_us = std::max(e.last_us, in.time_us);
      e.message = Truncate(in.message, options_.max_message_bytes);
      e.resolved = false;
      ++result.coalesced;
      continue;
    }
    if (totals.totals.entries >= options_.max_entries_per_job) {
      ++totals.totals.dropped;
      ++result.dropped;
      continue;
    }
    ErrorEntry e;
    e.seq = totals.next_seq++;
    e.kind = in.kind;
    e.key = key;
    e.message = Truncate(in.message, options_.max_message_bytes);
    e.attempts = 1;
    e.first_us = e.last_us = in.time_us;
    touched.emplace(index, std::move(e));
    ++totals.totals.entries;
    ++result.added;
  }

  for (const auto& [index, e] : touched) {
    std::string seq;
    codec::AppendBe64(&seq, e.seq);
    batch->Put(Family::kErrors, index, seq);
    batch->Put(Family::kErrors, EntryKey(job, e.seq), EncodeEntry(e));
  }
  for (const auto& [kind, n] : kind_counts) batch->Add(Family::kErrors, CountKey(job, kind), n);
  batch->Put(Family::kErrors, JobKey('m', job), EncodeTotals(totals));
  result.cap_reached = totals.totals.entries >= options_.max_entries_per_job;
  return result;
}

Status ErrorLog::MarkResolved(uint64_t job, std::string_view kind, std::string_view key) {
  std::lock_guard lock(append_mu_);
  const std::string truncated = Truncate(key, options_.max_key_bytes);
  ATFILL_ASSIGN_OR_RETURN(auto seq_raw, kv_.Get(Family::kErrors, IndexKey(job, kind, truncated)));
  uint64_t seq = 0;
  if (!seq_raw || !codec::ReadBe64(*seq_raw, 0, &seq)) {
    return Status::NotFound("error log of job " + std::to_string(job) + " has no " +
                            std::string(kind) + " entry for '" + truncated + "'");
  }
  ATFILL_ASSIGN_OR_RETURN(auto entry_raw, kv_.Get(Family::kErrors, EntryKey(job, seq)));
  if (!entry_raw) {
    return Status::Corrupt("error log of job " + std::to_string(job) + ": index points at " +
                           "missing entry " + std::to_string(seq));
  }
  ATFILL_ASSIGN_OR_RETURN(ErrorEntry e, DecodeEntry(*entry_raw, job));
  e.resolved = true;
  WriteBatch batch;
  batch.Put(Family::kErrors, EntryKey(job, seq), EncodeEntry(e));
  return kv_.Write(batch);
}

Result<bool> ErrorLog::ResolveIfStored(uint64_t job, std::string_view kind, std::string_view key,
                                       WriteBatch* batch) {
  std::lock_guard lock(append_mu_);
  const std::string truncated = Truncate(key, options_.max_key_bytes);
  ATFILL_ASSIGN_OR_RETURN(auto seq_raw, kv_.Get(Family::kErrors, IndexKey(job, kind, truncated)));
  uint64_t seq = 0;
  if (!seq_raw || !codec::ReadBe64(*seq_raw, 0, &seq)) return false;
  ATFILL_ASSIGN_OR_RETURN(auto entry_raw, kv_.Get(Family::kErrors, EntryKey(job, seq)));
  if (!entry_raw) return false;
  ATFILL_ASSIGN_OR_RETURN(ErrorEntry e, DecodeEntry(*entry_raw, job));
  if (e.resolved) return false;
  e.resolved = true;
  batch->Put(Family::kErrors, EntryKey(job, seq), EncodeEntry(e));
  return true;
}

Result<std::vector<ErrorEntry>> ErrorLog::List(uint64_t job, uint64_t offset, uint64_t limit) {
  std::vector<ErrorEntry> out;
  if (limit == 0) return out;
  uint64_t skipped = 0;
  Status decode_error;
  ATFILL_RETURN_IF_ERROR(
      kv_.Scan(Family::kErrors, JobKey('e', job), [&](std::string_view, std::string_view value) {
        if (skipped < offset) {
          ++skipped;
          return true;
        }
        auto e = DecodeEntry(value, job);
        if (!e.ok()) {
          decode_error = e.status();
          return false;
        }
        out.push_back(std::move(e).value());
        return out.size() < limit;
      }));
  ATFILL_RETURN_IF_ERROR(decode_error);
  return out;
}

Result<std::map<std::string, uint64_t>> ErrorLog::CountsByKind(uint64_t job) {
  std::map<std::string, uint64_t> out;
  const std::string prefix = JobKey('c', job);
  Status decode_error;
  ATFILL_RETURN_IF_ERROR(
      kv_.Scan(Family::kErrors, prefix, [&](std::string_view key, std::string_view value) {
        auto n = DecodeCounter(value, "error log count of job " + std::to_string(job));
        if (!n.ok()) {
          decode_error = n.status();
          return false;
        }
        out.emplace(std::string(key.substr(prefix.size())), *n);
        return true;
      }));
  ATFILL_RETURN_IF_ERROR(decode_error);
  return out;
}

Result<ErrorTotals> ErrorLog::Totals(uint64_t job) {
  ATFILL_ASSIGN_OR_RETURN(StoredTotals t, LoadTotals(kv_, job));
  return t.totals;
}

Result<uint64_t> ErrorLog::Total(uint64_t job) {
  ATFILL_ASSIGN_OR_RETURN(ErrorTotals t, Totals(job));
  return t.occurrences;
}

Status ErrorLog::Clear(uint64_t job) {
  std::lock_guard lock(append_mu_);
  WriteBatch batch;
  for (char kind : {'e', 'k', 'c'}) {
    ATFILL_RETURN_IF_ERROR(
        kv_.Scan(Family::kErrors, JobKey(kind, job), [&](std::string_view key, std::string_view) {
          batch.Delete(Family::kErrors, key);
          return true;
        }));
  }
  batch.Delete(Family::kErrors, JobKey('m', job));
  return kv_.Write(batch);
}

}  // namespace atfill::state
