// The key-value layer under atfill's state: named column families, atomic multi-family batches,
// prefix scans. RocksDB in production; an in-memory store in tests.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"

namespace atfill::state {

enum class Family : uint8_t {
  kMeta,        // schema version, process info
  kJobs,        // job records
  kQueue,       // per-job work units
  kCursors,     // relay per collection, Jetstream watermark and witnessed time, archive seq, files
  kTombstones,  // record and account tombstones
  kErrors,      // per-job error log
  kFailedBlocks,  // archive blocks that failed
  kResolver,      // DID -> PDS cache
};
inline constexpr int kFamilyCount = 8;
// The column family name ("meta", "jobs", "queue", "cursors", "tombstones", "errors",
// "failed_blocks", "resolver"); "?" for a value outside the enum.
std::string_view FamilyName(Family f);

// Counters are 8-byte little-endian unsigned integers that WriteBatch::Add changes in place.
std::string EncodeCounter(uint64_t value);
// Corrupt (naming `what`) unless `bytes` is exactly 8 bytes.
Result<uint64_t> DecodeCounter(std::string_view bytes, std::string_view what);

// A set of writes applied atomically by KvStore::Write, in order.
// Not thread-safe: one batch is built by one thread at a time.
class WriteBatch {
 public:
  enum class OpType : uint8_t {
    kPut,
    kDelete,
    // Adds `value` (an EncodeCounter of the two's-complement delta) to the counter at `key`
    // (absent = 0), wrapping modulo 2^64. Commutative, so batches that each add to one counter
    // may commit in any order and the sum stays exact without reading the counter first.
    kAdd,
  };
  struct Op {
    Family family;
    OpType type;
    std::string key;
    std::string value;
  };
  void Put(Family f, std::string_view key, std::string_view value) {
    ops_.push_back({f, OpType::kPut, std::string(key), std::string(value)});
  }
  void Delete(Family f, std::string_view key) {
    ops_.push_back({f, OpType::kDelete, std::string(key), {}});
  }
  // Adds `delta` (may be negative) to the counter at `key`. Adding to a value that is not a
  // counter is an error: the memory store rejects the Write, RocksDB reports Corrupt on the read.
  void Add(Family f, std::string_view key, int64_t delta) {
    ops_.push_back(
        {f, OpType::kAdd, std::string(key), EncodeCounter(static_cast<uint64_t>(delta))});
  }
  // Appends every op of `other`, after this batch's own.
  void Append(const WriteBatch& other) {
    ops_.insert(ops_.end(), other.ops_.begin(), other.ops_.end());
  }
  const std::vector<Op>& ops() const { return ops_; }
  bool empty() const { return ops_.empty(); }
  size_t size() const { return ops_.size(); }
  void Clear() { ops_.clear(); }

 private:
  std::vector<Op> ops_;
};

// Thread-safe: every method may be called from any thread concurrently, and `fn` callbacks of
// Scan may call back into the store.
class KvStore {
 public:
  virtual ~KvStore() = default;

  // nullopt when absent.
  virtual Result<std::optional<std::string>> Get(Family f, std::string_view key) = 0;
  // All ops or none; durable (synced) when it returns OK (RocksDB with sync=false: survives a
  // process crash, not a power loss).
  virtual Status Write(const WriteBatch& batch) = 0;
  // Calls fn(key, value) for keys starting with `prefix`, in key order, from `start_after`
  // (exclusive; empty = from the prefix's start) until fn returns false. The scan sees one
  // consistent snapshot taken when it starts: a batch committed meanwhile is seen entirely or
  // not at all.
  virtual Status Scan(Family f, std::string_view prefix,
                      const std::function<bool(std::string_view, std::string_view)>& fn,
                      std::string_view start_after = {}) = 0;
  // The greatest key starting with `prefix`; nullopt when there is none.
  virtual Result<std::optional<std::string>> LastKey(Family f, std::string_view prefix) = 0;
};

struct RocksDbOptions {
  // Directory holding the database; created when missing.
  std::string path;
  // Sync the WAL on every Write. Off by default: every write survives the process being killed
  // either way, and the engine writes state only after the sink made a batch durable, so state
  // that loses its last writes to a power cut is behind the sink, never ahead, and the input is
  // replayed into idempotent writes. Power-loss safety comes from the sink's own sync setting.
  bool sync = false;
  // Memtable size per column family, bytes; all families together are capped at 8 times this.
  size_t write_buffer_bytes = 4 << 20;
  // Block cache shared by all families, bytes.
  size_t block_cache_bytes = 16 << 20;
  Status Validate() const;
};

// Opens (creating if needed) the RocksDB state directory. A second process opening the same
// directory gets Unavailable with a message naming the directory and the holder (pid, host) as
// recorded at open, instead of touching anything. The holder is recorded in the file OWNER in the
// directory, written after a successful open and removed when the store is destroyed (in the
// instant between RocksDB's open and that write, a refused opener may read the previous
// holder's file).
// A directory written by a newer schema than this build understands is Unsupported. On a disk
// with less than kStateOpenMinFreeBytes free it opens nothing and is Unavailable, saying so:
// RocksDB writes on open (a log, a manifest, options), and a write that fails there aborts the
// process rather than failing.
Result<std::unique_ptr<KvStore>> OpenRocksDb(const RocksDbOptions& options);

inline constexpr uint64_t kStateOpenMinFreeBytes = 1u << 20;
// The bytes free for this process on the file system of `path` (or of its nearest existing
// parent); nullopt when that cannot be asked.
std::optional<uint64_t> StateDirFreeBytes(const std::string& path);

// A read-only view of a state directory, held by another process or by none (a RocksDB secondary
// instance): reads see what had been written when it opened; Write is Unsupported. It writes
// nothing into the directory (its own files go to a temporary folder, and it keeps no log), so it
// works on a full disk. NotFound when the directory holds no state.
Result<std::unique_ptr<KvStore>> OpenRocksDbReadOnly(const RocksDbOptions& options);

// Whether another process holds the state directory open for writing, asked of RocksDB's lock
// file without taking the lock or writing anything (this process's own locks do not count). False
// when there is no lock file (no state yet).
bool StateDirHeld(const std::string& path);

// The version of the RocksDB library this process runs with (the shared library loaded).
std::string RocksDbVersion();

// Everything in memory; for tests. Values are copied out under a mutex, so readers never see a
// partly applied batch.
std::unique_ptr<KvStore> NewMemoryKvStore();

}  // namespace atfill::state
