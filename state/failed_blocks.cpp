#include "state/failed_blocks.hpp"

#include "state/codec.hpp"

namespace atfill::state {
namespace {

constexpr uint8_t kVersion = 1;
enum Tag : uint32_t { kTagReason = 1, kTagAttempts = 2, kTagLastFailed = 3 };

std::string Key(uint64_t job, std::string_view block_id) {
  std::string key = codec::KeyWithId("b", job);
  key.append(block_id);
  return key;
}

Result<FailedBlock> Decode(uint64_t job, std::string_view block_id, std::string_view bytes) {
  FailedBlock b;
  b.block_id = std::string(block_id);
  const std::string what = "failed block " + b.block_id + " of job " + std::to_string(job);
  ATFILL_RETURN_IF_ERROR(codec::ReadRecord(bytes, kVersion, what, [&](const codec::Field& f) {
    switch (f.tag()) {
      case kTagReason:
        b.reason = f.Str();
        break;
      case kTagAttempts: {
        ATFILL_ASSIGN_OR_RETURN(b.attempts, f.Uint32());
        break;
      }
      case kTagLastFailed: {
        ATFILL_ASSIGN_OR_RETURN(b.last_failed_us, f.Int());
        break;
      }
      default:
        break;
    }
    return Status::OK();
  }));
  return b;
}

}  // namespace

Status FailedBlocks::Put(WriteBatch* batch, uint64_t job, const FailedBlock& block) {
  if (block.block_id.empty()) return Status::Invalid("failed blocks: empty block id");
  codec::RecordWriter w(kVersion);
  w.Str(kTagReason, block.reason);
  w.Uint(kTagAttempts, block.attempts);
  w.Int(kTagLastFailed, block.last_failed_us);
  batch->Put(Family::kFailedBlocks, Key(job, block.block_id), w.Take());
  return Status::OK();
}

Result<std::optional<FailedBlock>> FailedBlocks::Get(uint64_t job, std::string_view block_id) {
  ATFILL_ASSIGN_OR_RETURN(auto raw, kv_.Get(Family::kFailedBlocks, Key(job, block_id)));
  if (!raw) return std::optional<FailedBlock>();
  ATFILL_ASSIGN_OR_RETURN(FailedBlock b, Decode(job, block_id, *raw));
  return std::optional<FailedBlock>(std::move(b));
}

void FailedBlocks::Remove(WriteBatch* batch, uint64_t job, std::string_view block_id) {
  batch->Delete(Family::kFailedBlocks, Key(job, block_id));
}

Status FailedBlocks::Scan(uint64_t job, const std::function<bool(const FailedBlock&)>& fn) {
  const std::string prefix = codec::KeyWithId("b", job);
  Status error;
  ATFILL_RETURN_IF_ERROR(
      kv_.Scan(Family::kFailedBlocks, prefix, [&](std::string_view key, std::string_view value) {
        auto b = Decode(job, key.substr(prefix.size()), value);
        if (!b.ok()) {
          error = b.status();
          return false;
        }
        return fn(*b);
      }));
  return error;
}

Result<uint64_t> FailedBlocks::Count(uint64_t job) {
  uint64_t n = 0;
  ATFILL_RETURN_IF_ERROR(Scan(job, [&](const FailedBlock&) {
    ++n;
    return true;
  }));
  return n;
}

}  // namespace atfill::state
