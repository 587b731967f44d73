// Record tombstones (AT URI -> rev and deletion time) and account tombstones (DID -> status and
// time), kept so a late create/update cannot resurrect what was deleted, and swept after a
// retention period (72 hours by default).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.hpp"
#include "state/kv_store.hpp"

namespace atfill::state {

struct RecordTombstone {
  std::string rev;            // the deleting commit's rev; empty when unknown
  int64_t deleted_at_us = 0;  // unix µs; the sweep clock
  bool operator==(const RecordTombstone&) const = default;
};

struct AccountTombstone {
  std::string status;   // e.g. "deleted", "takendown", "deactivated"
  int64_t time_us = 0;  // unix µs; the sweep clock
  bool operator==(const AccountTombstone&) const = default;
};

struct TombstoneOptions {
  // Tombstones older than this are swept, µs.
  int64_t retention_us = int64_t{72} * 3600 * 1000000;
  // Deletions per WriteBatch during a sweep.
  size_t sweep_batch = 10000;
  Status Validate() const;
};

// Stateless over a KvStore it does not own (which must outlive it). Get/Put/Remove are
// thread-safe. Sweep reads then deletes, so it must not run while a batch writing a tombstone of
// the same key is in flight: run it from the thread that commits batches, or between commits
// (a tombstone re-put meanwhile could otherwise be swept with the old one).
//
// Layout (tombstones family): "r"+uri and "a"+did hold the tombstones; "t"+time+kind+id is a
// time-ordered index, so a sweep reads only what has expired. Put and Remove never read: an index
// entry left behind by an overwrite or Remove is recognised (its time differs from the tombstone's,
// or the tombstone is gone) and dropped by the sweep that reaches it.
class Tombstones {
 public:
  explicit Tombstones(KvStore& kv, TombstoneOptions options = {}) : kv_(kv), options_(options) {}

  void PutRecord(WriteBatch* batch, std::string_view uri, const RecordTombstone& tombstone);
  Result<std::optional<RecordTombstone>> GetRecord(std::string_view uri);
  void RemoveRecord(WriteBatch* batch, std::string_view uri);

  void PutAccount(WriteBatch* batch, std::string_view did, const AccountTombstone& tombstone);
  Result<std::optional<AccountTombstone>> GetAccount(std::string_view did);
  void RemoveAccount(WriteBatch* batch, std::string_view did);

  // Calls fn(uri) / fn(did) for every record / account tombstone, in key order, until fn returns
  // false. For building in-memory filters at start-up.
  Status ForEachRecord(const std::function<bool(std::string_view uri)>& fn);
  Status ForEachAccount(const std::function<bool(std::string_view did)>& fn);

  // Removes every tombstone whose time is before now_us - retention_us and returns how many.
  // Commits as it goes (sweep_batch deletions per write); an error leaves earlier commits done.
  // Invalid for a negative retention or invalid options.
  Result<uint64_t> Sweep(int64_t now_us) { return Sweep(now_us, options_.retention_us); }
  Result<uint64_t> Sweep(int64_t now_us, int64_t retention_us);

 private:
  KvStore& kv_;
  TombstoneOptions options_;
};

}  // namespace atfill::state
