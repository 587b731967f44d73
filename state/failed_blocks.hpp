// Archive blocks a job could not read (download or decode failure), kept for the
// retrying_blocks stage.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.hpp"
#include "state/kv_store.hpp"

namespace atfill::state {

struct FailedBlock {
  std::string block_id;  // e.g. "<segment>/<block index>"; unique within the job
  std::string reason;
  uint32_t attempts = 0;
  int64_t last_failed_us = 0;  // unix µs
  bool operator==(const FailedBlock&) const = default;
};

// Stateless over a KvStore it does not own (which must outlive it); thread-safe as the store is.
// Layout: failed_blocks family "b"+job (8 big-endian bytes)+block_id -> record.
class FailedBlocks {
 public:
  explicit FailedBlocks(KvStore& kv) : kv_(kv) {}

  // Invalid for an empty block_id.
  Status Put(WriteBatch* batch, uint64_t job, const FailedBlock& block);
  Result<std::optional<FailedBlock>> Get(uint64_t job, std::string_view block_id);
  void Remove(WriteBatch* batch, uint64_t job, std::string_view block_id);
  // The job's failed blocks in block_id order, until fn returns false.
  Status Scan(uint64_t job, const std::function<bool(const FailedBlock&)>& fn);
  Result<uint64_t> Count(uint64_t job);

 private:
  KvStore& kv_;
};

}  // namespace atfill::state
