#include "state/tombstones.hpp"

#include <vector>

#include "state/codec.hpp"

namespace atfill::state {
namespace {

constexpr uint8_t kVersion = 1;
constexpr char kRecordPrefix = 'r';
constexpr char kAccountPrefix = 'a';
constexpr char kIndexPrefix = 't';

enum Tag : uint32_t { kTagRev = 1, kTagTime = 2, kTagStatus = 3 };

std::string PrimaryKey(char kind, std::string_view id) {
  std::string key(1, kind);
  key.append(id);
  return key;
}

std::string IndexKey(int64_t time_us, char kind, std::string_view id) {
  std::string key(1, kIndexPrefix);
  codec::AppendOrderedI64(&key, time_us);
  key.push_back(kind);
  key.append(id);
  return key;
}

// Both kinds are stored as {text, time}; the text is the rev or the status.
std::string Encode(uint32_t text_tag, std::string_view text, int64_t time_us) {
  codec::RecordWriter w(kVersion);
  w.Str(text_tag, text);
  w.Int(kTagTime, time_us);
  return w.Take();
}

Status Decode(std::string_view bytes, std::string_view what, uint32_t text_tag, std::string* text,
              int64_t* time_us) {
  bool has_time = false;
  ATFILL_RETURN_IF_ERROR(codec::ReadRecord(bytes, kVersion, what, [&](const codec::Field& f) {
    if (f.tag() == text_tag) {
      *text = f.Str();
    } else if (f.tag() == kTagTime) {
      ATFILL_ASSIGN_OR_RETURN(*time_us, f.Int());
      has_time = true;
    }
    return Status::OK();
  }));
  if (!has_time) return Status::Corrupt(std::string(what) + ": no time field");
  return Status::OK();
}

}  // namespace

Status TombstoneOptions::Validate() const {
  if (retention_us < 0) {
    return Status::Invalid("tombstones: retention must not be negative, got " +
                           std::to_string(retention_us) + " µs");
  }
  if (sweep_batch == 0) return Status::Invalid("tombstones: sweep_batch must be positive");
  return Status::OK();
}

void Tombstones::PutRecord(WriteBatch* batch, std::string_view uri, const RecordTombstone& t) {
  batch->Put(Family::kTombstones, PrimaryKey(kRecordPrefix, uri),
             Encode(kTagRev, t.rev, t.deleted_at_us));
  batch->Put(Family::kTombstones, IndexKey(t.deleted_at_us, kRecordPrefix, uri), {});
}

Result<std::optional<RecordTombstone>> Tombstones::GetRecord(std::string_view uri) {
  ATFILL_ASSIGN_OR_RETURN(auto raw, kv_.Get(Family::kTombstones, PrimaryKey(kRecordPrefix, uri)));
  if (!raw) return std::optional<RecordTombstone>();
  RecordTombstone t;
  ATFILL_RETURN_IF_ERROR(
      Decode(*raw, "record tombstone " + std::string(uri), kTagRev, &t.rev, &t.deleted_at_us));
  return std::optional<RecordTombstone>(std::move(t));
}

void Tombstones::RemoveRecord(WriteBatch* batch, std::string_view uri) {
  batch->Delete(Family::kTombstones, PrimaryKey(kRecordPrefix, uri));
}

void Tombstones::PutAccount(WriteBatch* batch, std::string_view did, const AccountTombstone& t) {
  batch->Put(Family::kTombstones, PrimaryKey(kAccountPrefix, did),
             Encode(kTagStatus, t.status, t.time_us));
  batch->Put(Family::kTombstones, IndexKey(t.time_us, kAccountPrefix, did), {});
}

Result<std::optional<AccountTombstone>> Tombstones::GetAccount(std::string_view did) {
  ATFILL_ASSIGN_OR_RETURN(auto raw, kv_.Get(Family::kTombstones, PrimaryKey(kAccountPrefix, did)));
  if (!raw) return std::optional<AccountTombstone>();
  AccountTombstone t;
  ATFILL_RETURN_IF_ERROR(
      Decode(*raw, "account tombstone " + std::string(did), kTagStatus, &t.status, &t.time_us));
  return std::optional<AccountTombstone>(std::move(t));
}

void Tombstones::RemoveAccount(WriteBatch* batch, std::string_view did) {
  batch->Delete(Family::kTombstones, PrimaryKey(kAccountPrefix, did));
}

Result<uint64_t> Tombstones::Sweep(int64_t now_us, int64_t retention_us) {
  ATFILL_RETURN_IF_ERROR(options_.Validate());
  if (retention_us < 0) {
    return Status::Invalid("tombstones: sweep retention must not be negative");
  }
  // Saturates instead of overflowing for clocks near the int64 range.
  const int64_t cutoff = now_us < INT64_MIN + retention_us ? INT64_MIN : now_us - retention_us;
  const std::string index_prefix(1, kIndexPrefix);
  uint64_t removed = 0;
  std::string resume;
  while (true) {
    struct Expired {
      std::string index_key;
      int64_t time_us;
      char kind;
      std::string id;
    };
    std::vector<Expired> expired;
    Status parse_error;
    ATFILL_RETURN_IF_ERROR(kv_.Scan(
        Family::kTombstones, index_prefix,
        [&](std::string_view key, std::string_view) {
          uint64_t ordered = 0;
          if (key.size() < 10 || !codec::ReadBe64(key, 1, &ordered)) {
            parse_error = Status::Corrupt("tombstones: malformed index key of " +
                                          std::to_string(key.size()) + " bytes");
            return false;
          }
          const int64_t time_us = codec::OrderedToI64(ordered);
          if (time_us >= cutoff) return false;
          expired.push_back({std::string(key), time_us, key[9], std::string(key.substr(10))});
          return expired.size() < options_.sweep_batch;
        },
        resume));
    ATFILL_RETURN_IF_ERROR(parse_error);
    if (expired.empty()) break;

    WriteBatch batch;
    for (const auto& e : expired) {
      batch.Delete(Family::kTombstones, e.index_key);
      const std::string primary = PrimaryKey(e.kind, e.id);
      ATFILL_ASSIGN_OR_RETURN(auto raw, kv_.Get(Family::kTombstones, primary));
      if (!raw) continue;
      std::string text;
      int64_t stored_time = 0;
      ATFILL_RETURN_IF_ERROR(
          Decode(*raw, "tombstone " + std::string(e.id), kTagRev, &text, &stored_time));
      // A newer put of the same key has its own index entry; only the matching one deletes.
      if (stored_time != e.time_us) continue;
      batch.Delete(Family::kTombstones, primary);
      ++removed;
    }
    ATFILL_RETURN_IF_ERROR(kv_.Write(batch));
    if (expired.size() < options_.sweep_batch) break;
    resume = expired.back().index_key;
  }
  return removed;
}

Status Tombstones::ForEachRecord(const std::function<bool(std::string_view uri)>& fn) {
  return kv_.Scan(Family::kTombstones, std::string(1, kRecordPrefix),
                  [&](std::string_view key, std::string_view) { return fn(key.substr(1)); });
}

Status Tombstones::ForEachAccount(const std::function<bool(std::string_view did)>& fn) {
  return kv_.Scan(Family::kTombstones, std::string(1, kAccountPrefix),
                  [&](std::string_view key, std::string_view) { return fn(key.substr(1)); });
}

}  // namespace atfill::state
