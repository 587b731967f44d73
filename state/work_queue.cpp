#include "state/work_queue.hpp"

#include "state/codec.hpp"

namespace atfill::state {
namespace {

constexpr uint8_t kVersion = 1;
enum Tag : uint32_t { kTagId = 1, kTagPayload = 2 };

std::string UnitPrefix(uint64_t job) { return codec::KeyWithId("q", job); }

std::string UnitKey(uint64_t job, uint64_t position) {
  std::string key = UnitPrefix(job);
  codec::AppendBe64(&key, position);
  return key;
}

std::string IdKey(uint64_t job, std::string_view id) {
  std::string key = codec::KeyWithId("u", job);
  key.append(id);
  return key;
}

std::string DoneKey(uint64_t job, std::string_view id) {
  std::string key = codec::KeyWithId("d", job);
  key.append(id);
  return key;
}

std::string CountKey(uint64_t job) { return codec::KeyWithId("n", job); }

Result<WorkUnit> DecodeUnit(uint64_t job, std::string_view key, std::string_view value) {
  WorkUnit unit;
  const std::string what = "work unit of job " + std::to_string(job);
  if (key.size() != 17 || !codec::ReadBe64(key, 9, &unit.position)) {
    return Status::Corrupt(what + ": key of " + std::to_string(key.size()) + " bytes");
  }
  ATFILL_RETURN_IF_ERROR(codec::ReadRecord(value, kVersion, what, [&](const codec::Field& f) {
    if (f.tag() == kTagId) unit.id = f.Str();
    if (f.tag() == kTagPayload) unit.payload = f.Str();
    return Status::OK();
  }));
  if (unit.id.empty()) return Status::Corrupt(what + ": no unit id");
  return unit;
}

}  // namespace

Result<uint64_t> WorkQueue::LastPosition(uint64_t job) {
  ATFILL_ASSIGN_OR_RETURN(auto last, kv_.LastKey(Family::kQueue, UnitPrefix(job)));
  if (!last) return uint64_t{0};
  uint64_t position = 0;
  if (!codec::ReadBe64(*last, UnitPrefix(job).size(), &position)) {
    return Status::Corrupt("work queue of job " + std::to_string(job) + ": malformed unit key");
  }
  return position;
}

Result<uint64_t> WorkQueue::AllocatePosition(uint64_t job) {
  std::lock_guard lock(mu_);
  auto it = next_position_.find(job);
  if (it == next_position_.end()) {
    ATFILL_ASSIGN_OR_RETURN(auto last, kv_.LastKey(Family::kQueue, UnitPrefix(job)));
    uint64_t next = 1;
    if (last) {
      uint64_t position = 0;
      if (!codec::ReadBe64(*last, 9, &position)) {
        return Status::Corrupt("work queue of job " + std::to_string(job) + ": malformed key");
      }
      next = position + 1;
    }
    it = next_position_.emplace(job, next).first;
  }
  return it->second++;
}

Result<std::optional<uint64_t>> WorkQueue::Push(WriteBatch* batch, uint64_t job,
                                                std::string_view unit_id,
                                                std::string_view payload) {
  if (unit_id.empty()) return Status::Invalid("work queue: empty unit id");
  ATFILL_ASSIGN_OR_RETURN(auto existing, kv_.Get(Family::kQueue, IdKey(job, unit_id)));
  if (existing) return std::optional<uint64_t>();
  ATFILL_ASSIGN_OR_RETURN(uint64_t position, AllocatePosition(job));
  codec::RecordWriter w(kVersion);
  w.Str(kTagId, unit_id);
  w.Str(kTagPayload, payload);
  std::string pos;
  codec::AppendBe64(&pos, position);
  batch->Put(Family::kQueue, UnitKey(job, position), w.Take());
  batch->Put(Family::kQueue, IdKey(job, unit_id), pos);
  batch->Add(Family::kQueue, CountKey(job), 1);
  return std::optional<uint64_t>(position);
}

void WorkQueue::Remove(WriteBatch* batch, uint64_t job, const WorkUnit& unit) {
  batch->Delete(Family::kQueue, UnitKey(job, unit.position));
  batch->Delete(Family::kQueue, IdKey(job, unit.id));
  batch->Add(Family::kQueue, CountKey(job), -1);
}

void WorkQueue::Finish(WriteBatch* batch, uint64_t job, const WorkUnit& unit) {
  Remove(batch, job, unit);
  batch->Put(Family::kQueue, DoneKey(job, unit.id), "");
}

Result<bool> WorkQueue::IsFinished(uint64_t job, std::string_view unit_id) {
  ATFILL_ASSIGN_OR_RETURN(auto done, kv_.Get(Family::kQueue, DoneKey(job, unit_id)));
  return done.has_value();
}

Result<std::optional<WorkUnit>> WorkQueue::Find(uint64_t job, std::string_view unit_id) {
  ATFILL_ASSIGN_OR_RETURN(auto pos_raw, kv_.Get(Family::kQueue, IdKey(job, unit_id)));
  if (!pos_raw) return std::optional<WorkUnit>();
  uint64_t position = 0;
  if (pos_raw->size() != 8 || !codec::ReadBe64(*pos_raw, 0, &position)) {
    return Status::Corrupt("work queue of job " + std::to_string(job) +
                           ": malformed position of '" + std::string(unit_id) + "'");
  }
  const std::string key = UnitKey(job, position);
  ATFILL_ASSIGN_OR_RETURN(auto value, kv_.Get(Family::kQueue, key));
  if (!value) {
    return Status::Corrupt("work queue of job " + std::to_string(job) + ": unit '" +
                           std::string(unit_id) + "' indexed at missing position " +
                           std::to_string(position));
  }
  ATFILL_ASSIGN_OR_RETURN(WorkUnit unit, DecodeUnit(job, key, *value));
  return std::optional<WorkUnit>(std::move(unit));
}

Status WorkQueue::Scan(uint64_t job, uint64_t after_position,
                       const std::function<bool(const WorkUnit&)>& fn) {
  Status error;
  ATFILL_RETURN_IF_ERROR(kv_.Scan(
      Family::kQueue, UnitPrefix(job),
      [&](std::string_view key, std::string_view value) {
        auto unit = DecodeUnit(job, key, value);
        if (!unit.ok()) {
          error = unit.status();
          return false;
        }
        return fn(*unit);
      },
      after_position == 0 ? std::string() : UnitKey(job, after_position)));
  return error;
}

Result<std::vector<WorkUnit>> WorkQueue::Pending(uint64_t job, uint64_t after_position,
                                                 size_t limit) {
  std::vector<WorkUnit> out;
  if (limit == 0) return out;
  ATFILL_RETURN_IF_ERROR(Scan(job, after_position, [&](const WorkUnit& unit) {
    out.push_back(unit);
    return out.size() < limit;
  }));
  return out;
}

Result<uint64_t> WorkQueue::Count(uint64_t job) {
  ATFILL_ASSIGN_OR_RETURN(auto raw, kv_.Get(Family::kQueue, CountKey(job)));
  if (!raw) return uint64_t{0};
  return DecodeCounter(*raw, "work queue count of job " + std::to_string(job));
}

Result<uint64_t> WorkQueue::Recount(uint64_t job) {
  uint64_t n = 0;
  ATFILL_RETURN_IF_ERROR(
      kv_.Scan(Family::kQueue, UnitPrefix(job), [&](std::string_view, std::string_view) {
        ++n;
        return true;
      }));
  WriteBatch batch;
  batch.Put(Family::kQueue, CountKey(job), EncodeCounter(n));
  ATFILL_RETURN_IF_ERROR(kv_.Write(batch));
  return n;
}

Status WorkQueue::Clear(uint64_t job) {
  WriteBatch batch;
  for (const std::string& prefix :
       {UnitPrefix(job), codec::KeyWithId("u", job), codec::KeyWithId("d", job)}) {
    ATFILL_RETURN_IF_ERROR(
        kv_.Scan(Family::kQueue, prefix, [&](std::string_view key, std::string_view) {
          batch.Delete(Family::kQueue, key);
          return true;
        }));
  }
  batch.Delete(Family::kQueue, CountKey(job));
  return kv_.Write(batch);
}

}  // namespace atfill::state
