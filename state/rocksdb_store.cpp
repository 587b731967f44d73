#include <fcntl.h>
#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/merge_operator.h>
#include <rocksdb/table.h>
#include <rocksdb/version.h>
#include <rocksdb/write_batch.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "state/kv_store.hpp"

namespace atfill::state {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSchemaKey = "schema_version";
constexpr uint64_t kSchemaVersion = 1;
constexpr std::string_view kOwnerFile = "OWNER";

// WriteBatch::kAdd on RocksDB: counters are summed lazily by the merge operator.
class AddOperator final : public rocksdb::AssociativeMergeOperator {
 public:
  bool Merge(const rocksdb::Slice& /*key*/, const rocksdb::Slice* existing,
             const rocksdb::Slice& value, std::string* new_value,
             rocksdb::Logger* /*logger*/) const override {
    uint64_t base = 0;
    if (existing != nullptr) {
      auto decoded = DecodeCounter(std::string_view(existing->data(), existing->size()), "");
      if (!decoded.ok()) return false;
      base = *decoded;
    }
    auto delta = DecodeCounter(std::string_view(value.data(), value.size()), "");
    if (!delta.ok()) return false;
    *new_value = EncodeCounter(base + *delta);
    return true;
  }
  const char* Name() const override { return "atfill.add64"; }
};

Status FromRocks(const rocksdb::Status& s, std::string_view context) {
  if (s.ok()) return Status::OK();
  std::string msg = std::string(context) + ": " + s.ToString();
  if (s.IsNotFound()) return Status::NotFound(std::move(msg));
  if (s.IsCorruption()) return Status::Corrupt(std::move(msg));
  if (s.IsIOError()) return Status::IoError(std::move(msg));
  if (s.IsInvalidArgument()) return Status::Invalid(std::move(msg));
  if (s.IsNotSupported()) return Status::Unsupported(std::move(msg));
  if (s.IsBusy() || s.IsTryAgain() || s.IsTimedOut()) return Status::Unavailable(std::move(msg));
  if (s.IsIncomplete() || s.IsAborted()) return Status::Cancelled(std::move(msg));
  return Status::Internal(std::move(msg));
}

// RocksDB reports a held LOCK as an IOError: "While lock file: <dir>/LOCK: <strerror>" when another
// process holds it, "lock hold by current process ..." when this one does.
bool IsLockError(const rocksdb::Status& s) {
  if (!s.IsIOError()) return false;
  const std::string text = s.ToString();
  return text.find("While lock file") != std::string::npos ||
         text.find("lock hold by current process") != std::string::npos;
}

std::string FormatUtc(int64_t unix_us) {
  const std::time_t secs = static_cast<std::time_t>(unix_us / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  if (std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm) == 0) return "?";
  return buf;
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

Status WriteOwnerFile(const fs::path& dir) {
  const int64_t now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  std::ostringstream text;
  text << "pid=" << getpid() << "\nhost=" << HostName() << "\nstarted=" << FormatUtc(now_us)
       << "\nstarted_us=" << now_us << "\n";
  // Written aside and renamed, so a reader never sees half a file.
  const fs::path tmp = dir / "OWNER.tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text.str();
    out.flush();
    if (!out) return Status::IoError("state: cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, dir / kOwnerFile, ec);
  if (ec) return Status::IoError("state: cannot rename " + tmp.string() + ": " + ec.message());
  return Status::OK();
}

// The sentence for a state directory whose LOCK someone holds.
std::string LockedMessage(const std::string& dir, bool by_this_process) {
  std::ifstream in(fs::path(dir) / kOwnerFile, std::ios::binary);
  std::string pid, host, started;
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = line.substr(0, eq);
    const std::string value = line.substr(eq + 1);
    if (name == "pid") pid = value;
    if (name == "host") host = value;
    if (name == "started") started = value;
  }
  std::string msg = "state directory " + dir + " is in use by ";
  if (pid.empty()) {
    msg += by_this_process ? "this process" : "another process (its OWNER file is missing)";
  } else {
    msg += "pid " + pid + " on host " + (host.empty() ? "?" : host);
    if (!started.empty()) msg += " since " + started;
    if (by_this_process) msg += " (this process)";
  }
  msg += "; stop that process or use another directory";
  return msg;
}

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty() && static_cast<uint8_t>(end.back()) == 0xff) end.pop_back();
  if (!end.empty()) end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
  return end;
}

class RocksDbStore final : public KvStore {
 public:
  // `secondary_dir` non-empty: a read-only secondary instance whose own folder this store removes.
  RocksDbStore(std::string path, bool sync, std::unique_ptr<rocksdb::DB> db,
               std::vector<rocksdb::ColumnFamilyHandle*> handles,
               std::array<rocksdb::ColumnFamilyHandle*, kFamilyCount> families,
               std::string secondary_dir = {})
      : path_(std::move(path)),
        secondary_dir_(std::move(secondary_dir)),
        db_(std::move(db)),
        handles_(std::move(handles)),
        families_(families) {
    write_options_.sync = sync;
  }

  ~RocksDbStore() override {
    std::error_code ec;
    // Removed while the lock is still held, so it cannot be the next owner's file. A read-only
    // view holds no lock and leaves the owner's file alone.
    if (secondary_dir_.empty()) fs::remove(fs::path(path_) / kOwnerFile, ec);
    for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h);
    db_->Close().PermitUncheckedError();
    if (!secondary_dir_.empty()) fs::remove_all(secondary_dir_, ec);
  }

  Result<std::optional<std::string>> Get(Family f, std::string_view key) override {
    ATFILL_ASSIGN_OR_RETURN(auto* cf, Handle(f));
    std::string value;
    auto s = db_->Get(rocksdb::ReadOptions(), cf, rocksdb::Slice(key.data(), key.size()), &value);
    if (s.IsNotFound()) return std::optional<std::string>();
    if (!s.ok()) return FromRocks(s, "state: get from " + std::string(FamilyName(f)));
    return std::optional<std::string>(std::move(value));
  }

  Status Write(const WriteBatch& batch) override {
    if (!secondary_dir_.empty()) {
      return Status::Unsupported("state directory " + path_ +
                                 " is open read-only (another process holds it)");
    }
    if (batch.empty()) return Status::OK();
    rocksdb::WriteBatch wb;
    for (const auto& op : batch.ops()) {
      ATFILL_ASSIGN_OR_RETURN(auto* cf, Handle(op.family));
      const rocksdb::Slice key(op.key.data(), op.key.size());
      const rocksdb::Slice value(op.value.data(), op.value.size());
      rocksdb::Status s;
      switch (op.type) {
        case WriteBatch::OpType::kPut:
          s = wb.Put(cf, key, value);
          break;
        case WriteBatch::OpType::kDelete:
          s = wb.Delete(cf, key);
          break;
        case WriteBatch::OpType::kAdd:
          s = wb.Merge(cf, key, value);
          break;
      }
      if (!s.ok()) return FromRocks(s, "state: building a write batch");
    }
    return FromRocks(db_->Write(write_options_, &wb), "state: write to " + path_);
  }

  Status Scan(Family f, std::string_view prefix,
              const std::function<bool(std::string_view, std::string_view)>& fn,
              std::string_view start_after) override {
    ATFILL_ASSIGN_OR_RETURN(auto* cf, Handle(f));
    const std::string end = PrefixEnd(prefix);
    const rocksdb::Slice end_slice(end);
    rocksdb::ReadOptions ro;
    if (!end.empty()) ro.iterate_upper_bound = &end_slice;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf));
    const bool after = !start_after.empty() && start_after >= prefix;
    const std::string_view target = after ? start_after : prefix;
    it->Seek(rocksdb::Slice(target.data(), target.size()));
    if (after && it->Valid() &&
        it->key() == rocksdb::Slice(start_after.data(), start_after.size())) {
      it->Next();
    }
    for (; it->Valid(); it->Next()) {
      const std::string_view k(it->key().data(), it->key().size());
      if (!k.starts_with(prefix)) break;
      if (!fn(k, std::string_view(it->value().data(), it->value().size()))) break;
    }
    return FromRocks(it->status(), "state: scan of " + std::string(FamilyName(f)));
  }

  Result<std::optional<std::string>> LastKey(Family f, std::string_view prefix) override {
    ATFILL_ASSIGN_OR_RETURN(auto* cf, Handle(f));
    const std::string end = PrefixEnd(prefix);
    const rocksdb::Slice end_slice(end);
    rocksdb::ReadOptions ro;
    if (!end.empty()) ro.iterate_upper_bound = &end_slice;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf));
    it->SeekToLast();
    if (!it->Valid()) {
      ATFILL_RETURN_IF_ERROR(
          FromRocks(it->status(), "state: seek in " + std::string(FamilyName(f))));
      return std::optional<std::string>();
    }
    const std::string_view k(it->key().data(), it->key().size());
    if (!k.starts_with(prefix)) return std::optional<std::string>();
    return std::optional<std::string>(std::string(k));
  }

 private:
  Result<rocksdb::ColumnFamilyHandle*> Handle(Family f) const {
    const auto i = static_cast<size_t>(f);
    if (i >= families_.size()) {
      return Status::Invalid("state: unknown column family " + std::to_string(i));
    }
    return families_[i];
  }

  std::string path_;
  std::string secondary_dir_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  std::array<rocksdb::ColumnFamilyHandle*, kFamilyCount> families_{};
  rocksdb::WriteOptions write_options_;
};

// Modest settings for a small state: small memtables with a global cap, one small shared block
// cache, bloom filters for the point lookups (tombstones, resolver), LZ4 when the build has it.
rocksdb::ColumnFamilyOptions FamilyOptions(const RocksDbOptions& options,
                                           const std::shared_ptr<rocksdb::Cache>& cache,
                                           const std::shared_ptr<rocksdb::MergeOperator>& add) {
  rocksdb::ColumnFamilyOptions cf;
  cf.write_buffer_size = options.write_buffer_bytes;
  cf.max_write_buffer_number = 2;
  cf.target_file_size_base = 16 << 20;
  cf.max_bytes_for_level_base = 64 << 20;
  cf.level_compaction_dynamic_level_bytes = true;
  cf.merge_operator = add;
  const auto supported = rocksdb::GetSupportedCompressions();
  cf.compression =
      std::find(supported.begin(), supported.end(), rocksdb::kLZ4Compression) != supported.end()
          ? rocksdb::kLZ4Compression
          : rocksdb::kNoCompression;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = cache;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.cache_index_and_filter_blocks = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return cf;
}

Status CheckSchema(KvStore& kv, const std::string& path) {
  ATFILL_ASSIGN_OR_RETURN(auto stored, kv.Get(Family::kMeta, kSchemaKey));
  if (!stored) {
    WriteBatch batch;
    batch.Put(Family::kMeta, kSchemaKey, std::to_string(kSchemaVersion));
    return kv.Write(batch);
  }
  if (*stored != std::to_string(kSchemaVersion)) {
    return Status::Unsupported("state directory " + path + " has schema version '" + *stored +
                               "'; this build of atfill understands version " +
                               std::to_string(kSchemaVersion));
  }
  return Status::OK();
}

}  // namespace

namespace {

class SilentLogger : public rocksdb::Logger {
 public:
  using rocksdb::Logger::Logv;
  void Logv(const char*, va_list) override {}
};

rocksdb::DBOptions DbOptions(const RocksDbOptions& options) {
  rocksdb::DBOptions db;
  db.create_if_missing = true;
  db.create_missing_column_families = true;
  db.max_background_jobs = 2;
  db.max_open_files = 256;
  db.db_write_buffer_size = options.write_buffer_bytes * 8;
  db.max_total_wal_size = 64 << 20;
  db.keep_log_file_num = 3;
  db.max_log_file_size = 1 << 20;
  db.stats_dump_period_sec = 0;
  db.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  return db;
}

// Our families first (default, then Family order), then any others already in the directory.
Result<std::vector<rocksdb::ColumnFamilyDescriptor>> Descriptors(const RocksDbOptions& options,
                                                                 const rocksdb::DBOptions& db) {
  const std::string& path = options.path;
  auto cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  auto add = std::make_shared<AddOperator>();
  const rocksdb::ColumnFamilyOptions cf_options = FamilyOptions(options, cache, add);

  // Every family already in the directory must be opened, ours first.
  std::vector<std::string> names = {rocksdb::kDefaultColumnFamilyName};
  for (int i = 0; i < kFamilyCount; ++i) {
    names.emplace_back(FamilyName(static_cast<Family>(i)));
  }
  if (fs::exists(fs::path(path) / "CURRENT")) {
    std::vector<std::string> existing;
    auto s = rocksdb::DB::ListColumnFamilies(db, path, &existing);
    if (!s.ok()) return FromRocks(s, "state: listing column families in " + path);
    for (const auto& name : existing) {
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const auto& name : names) descriptors.emplace_back(name, cf_options);
  return descriptors;
}

}  // namespace

std::optional<uint64_t> StateDirFreeBytes(const std::string& path) {
  fs::path at = fs::absolute(path);
  std::error_code ec;
  while (!fs::exists(at, ec) && at.has_parent_path() && at != at.parent_path()) {
    at = at.parent_path();
  }
  const fs::space_info space = fs::space(at, ec);
  if (ec) return std::nullopt;
  return static_cast<uint64_t>(space.available);
}

Result<std::unique_ptr<KvStore>> OpenRocksDb(const RocksDbOptions& options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  const std::string& path = options.path;
  if (const auto free = StateDirFreeBytes(path); free && *free < kStateOpenMinFreeBytes) {
    return Status::Unavailable("state: the disk of " + path + " is full (" +
                               std::to_string(*free >> 10) +
                               " KiB free): the state cannot be opened for writing until there "
                               "is at least " +
                               std::to_string(kStateOpenMinFreeBytes >> 10) + " KiB");
  }
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return Status::IoError("state: cannot create directory " + path + ": " + ec.message());
  const rocksdb::DBOptions db = DbOptions(options);
  ATFILL_ASSIGN_OR_RETURN(auto descriptors, Descriptors(options, db));

  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  auto s = rocksdb::DB::Open(db, path, descriptors, &handles, &raw);
  if (!s.ok()) {
    if (IsLockError(s)) {
      const bool ours = s.ToString().find("current process") != std::string::npos;
      return Status::Unavailable(LockedMessage(path, ours));
    }
    return FromRocks(s, "state: opening " + path);
  }
  std::array<rocksdb::ColumnFamilyHandle*, kFamilyCount> families{};
  for (int i = 0; i < kFamilyCount; ++i) families[i] = handles[i + 1];
  auto store = std::make_unique<RocksDbStore>(path, options.sync, std::unique_ptr<rocksdb::DB>(raw),
                                              std::move(handles), families);
  ATFILL_RETURN_IF_ERROR(CheckSchema(*store, path));
  ATFILL_RETURN_IF_ERROR(WriteOwnerFile(path));
  return std::unique_ptr<KvStore>(std::move(store));
}

Result<std::unique_ptr<KvStore>> OpenRocksDbReadOnly(const RocksDbOptions& options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  const std::string& path = options.path;
  if (!fs::exists(fs::path(path) / "CURRENT")) {
    return Status::NotFound("state directory " + path + " holds no atfill state yet");
  }
  rocksdb::DBOptions db = DbOptions(options);
  db.create_if_missing = false;
  db.create_missing_column_families = false;
  // A secondary instance may keep every file open; -1 is what RocksDB asks for here.
  db.max_open_files = -1;
  // Nothing of a read-only view is worth a log file, and the temporary folder may sit on a full
  // disk.
  db.info_log = std::make_shared<SilentLogger>();
  ATFILL_ASSIGN_OR_RETURN(auto descriptors, Descriptors(options, db));
  std::string secondary = (fs::temp_directory_path() / "atfill-secondary-XXXXXX").string();
  if (::mkdtemp(secondary.data()) == nullptr) {
    return Status::IoError("state: cannot create a folder for a read-only view of " + path);
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  auto s = rocksdb::DB::OpenAsSecondary(db, path, secondary, descriptors, &handles, &raw);
  if (!s.ok()) {
    std::error_code ec;
    fs::remove_all(secondary, ec);
    return FromRocks(s, "state: opening a read-only view of " + path);
  }
  std::unique_ptr<rocksdb::DB> owned(raw);
  owned->TryCatchUpWithPrimary().PermitUncheckedError();
  std::array<rocksdb::ColumnFamilyHandle*, kFamilyCount> families{};
  for (int i = 0; i < kFamilyCount; ++i) families[i] = handles[i + 1];
  return std::unique_ptr<KvStore>(std::make_unique<RocksDbStore>(
      path, false, std::move(owned), std::move(handles), families, secondary));
}

bool StateDirHeld(const std::string& path) {
  const std::string lock = (fs::path(path) / "LOCK").string();
  const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // RocksDB holds a write lock on the whole file for as long as a DB is open on it.
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  const bool held = ::fcntl(fd, F_GETLK, &probe) == 0 && probe.l_type != F_UNLCK;
  ::close(fd);
  return held;
}

std::string RocksDbVersion() { return rocksdb::GetRocksVersionAsString(); }

}  // namespace atfill::state
