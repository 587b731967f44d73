#include "sinks/sqlite_sink.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <future>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "atproto/cid.hpp"
#include "base/clock.hpp"
#include "sinks/event_checks.hpp"
#include "sinks/intern_cache.hpp"
#include "sinks/sqlite_checkpointer.hpp"
#include "sinks/sqlite_compressor.hpp"
#include "sinks/sqlite_schema.hpp"
#include "sinks/sqlite_util.hpp"

namespace atfill::sinks {
namespace {

using pipeline::AccountEvent;
using pipeline::Event;
using pipeline::Operation;
using pipeline::RecordEvent;
using pipeline::WriteStats;
using sqlite::BindText;
using sqlite::BindTextOrNull;
using sqlite::ColumnText;
using sqlite::ResetOnExit;
using sqlite::Stmt;

// zstd's trainer needs a few samples to learn from at all; past the maximum, the bodies held for
// training would cost more memory than a dictionary saves.
constexpr size_t kMinDictionarySamples = 8;
constexpr size_t kMaxDictionarySamples = 100'000;

bool IsBusyCode(int rc) { return (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED; }

using Clock = std::chrono::steady_clock;

// Between tries at a locked database: sleeps *backoff (then doubles it, up to 100 ms), never past
// `deadline`; false, without sleeping, once the deadline has passed.
bool WaitToRetryBusy(Clock::time_point deadline, std::chrono::milliseconds* backoff) {
  const auto remaining =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (remaining.count() <= 0) return false;
  std::this_thread::sleep_for(std::min(*backoff, remaining));
  *backoff = std::min(*backoff * 2, std::chrono::milliseconds(100));
  return true;
}

// Binds the record column's value: the JSON text, or the zstd frame of it as a blob (what
// atfill_json tells apart); without a copy, so it must outlive the step. The code of the bind
// (SQLITE_TOOBIG for a body past SQLite's limit).
int BindBody(sqlite3_stmt* s, int index, const sqlite::EncodedBody& body) {
  if (!body.compressed) return BindText(s, index, body.bytes);
  return sqlite3_bind_blob(s, index, body.bytes.data(), static_cast<int>(body.bytes.size()),
                           SQLITE_STATIC);
}

// Binds a row's cid: its 36 binary bytes beside a compressed body (schema version 4: the view
// then reads it through atfill_cid), else its text, `text` (which may be empty then). Without a
// copy: the event and the text must outlive the step.
void BindCid(sqlite3_stmt* s, int index, const RecordEvent& e, const sqlite::EncodedBody& body,
             std::string_view text) {
  if (body.compressed) {
    const ByteView binary = e.cid.binary();
    sqlite3_bind_blob(s, index, binary.data(), static_cast<int>(binary.size()), SQLITE_STATIC);
  } else {
    BindText(s, index, text);
  }
}

// Binds the record INSERT's parameters (did_id, collection_id, rkey, cid, rev, indexed_at,
// created_at, record); the code of the body's bind (the only one that can fail: SQLITE_TOOBIG).
// Texts are bound without a copy and must outlive the step.
int BindRow(sqlite3_stmt* s, const RecordEvent& e, int64_t did_id, int64_t collection_id,
            std::string_view cid, int64_t now, const sqlite::EncodedBody& body) {
  sqlite3_bind_int64(s, 1, did_id);
  sqlite3_bind_int64(s, 2, collection_id);
  BindText(s, 3, e.rkey);
  BindCid(s, 4, e, body, cid);
  BindTextOrNull(s, 5, e.rev);
  sqlite3_bind_int64(s, 6, now);
  BindTextOrNull(s, 7, e.created_at);
  return BindBody(s, 8, body);
}

// The owner lock of a bulk load: flock(2) on a file beside the database, held by the loading
// sink while it lives (flock, unlike fcntl locks, also excludes a second open in the same
// process).
class BulkOwnerLock {
 public:
  BulkOwnerLock() = default;
  BulkOwnerLock(const BulkOwnerLock&) = delete;
  BulkOwnerLock& operator=(const BulkOwnerLock&) = delete;
  BulkOwnerLock(BulkOwnerLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(o.path_) {}
  BulkOwnerLock& operator=(BulkOwnerLock&& o) noexcept {
    if (this != &o) {
      Release();
      fd_ = std::exchange(o.fd_, -1);
      path_ = o.path_;
    }
    return *this;
  }
  ~BulkOwnerLock() { Release(); }

  // True when this now holds the lock; false when another holder has it (or the file cannot be
  // made: a load then goes on without an owner, as a killed one does).
  bool TryLock(const std::string& path) {
    Release();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      return false;
    }
    fd_ = fd;
    path_ = path;
    return true;
  }
  bool held() const { return fd_ >= 0; }
  // Removes the file (the load is finished), still holding the lock until Release.
  void Remove() {
    if (held()) ::unlink(path_.c_str());
  }
  void Release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string path_;
};

// The statements of one interned table.
struct InternTable {
  Stmt find;    // SELECT id WHERE key = ?1
  Stmt insert;  // INSERT (key) VALUES (?1)
  InternCache cache;
};

class SqliteSink final : public pipeline::Sink {
 public:
  // Errors do not name the database; OpenSqliteSink adds it.
  static Result<std::unique_ptr<pipeline::Sink>> Open(const SqliteSinkOptions& options);

  // Builds the indexes of a bulk load this sink owns. A failure leaves the load layout, which
  // the next open finishes (or continues, with bulk_load).
  ~SqliteSink() override {
    StopWarm();
    if (bulk_owner_.held() && sqlite::FinishBulkLoad(db_.get(), options_.path, options_.log).ok()) {
      bulk_owner_.Remove();
    }
  }

  Result<WriteStats> Write(std::span<const Event> batch) override;
  std::string_view name() const override { return "sqlite"; }

 private:
  SqliteSink(SqliteSinkOptions options, sqlite::Db db)
      : options_(std::move(options)),
        db_(std::move(db)),
        dids_{nullptr, nullptr, InternCache(options_.intern_cache_entries)},
        collections_{nullptr, nullptr, InternCache(options_.intern_cache_entries)} {}

  Status Prepare();
  // Fills copies of the intern caches from the tables (newest ids first, up to their size) on a
  // thread and a read connection of its own, and the next Write after it finished takes them in.
  // Without it a new process looks up every account of its first batches in the DID index: on a
  // stream that is one random index seek per event until the cache has met each account once.
  // Write never waits for it (a short job ends before it is done), and an id never leaves the
  // tables, so the copies are right whenever they are taken; what they lack is looked up.
  void StartWarm();
  void AdoptWarm();
  void StopWarm();
  Status WriteOnce(std::span<const Event> batch, int64_t now, WriteStats* stats);
  Status ApplyWrite(const RecordEvent& e, int64_t now, WriteStats* stats);
  // A create/update whose INSERT conflicted: the rev guard against the stored row. `cid` is the
  // event's CID text, empty when the body is compressed (its CID is then stored binary).
  Status ApplyToExisting(const RecordEvent& e, int64_t did_id, int64_t collection_id,
                         const std::string& cid, int64_t now, const sqlite::EncodedBody& body,
                         WriteStats* stats);
  Status ApplyDelete(const RecordEvent& e, WriteStats* stats);
  Status ApplyAccount(const AccountEvent& e, WriteStats* stats);
  // Removes the DID's rows in `collections` (all when empty); the number removed.
  // Only rows whose rev is older than `before_rev` (or that have none) when it is not empty.
  Result<uint64_t> RemoveRows(int64_t did_id, const std::vector<std::string>& collections,
                              const std::string& before_rev, const char* what);
  // The stored row's cid: its text, or the CID its binary form holds (schema version 4).
  struct StoredCid {
    std::string_view text;
    std::optional<atproto::Cid> binary;
  };
  // Looks up the stored row of (did_id, collection_id, rkey); when it exists calls
  // on_row(const StoredCid&, rev) (views valid only during the call) and returns its rowid.
  template <typename OnRow>
  Result<std::optional<int64_t>> ReadRow(int64_t did_id, int64_t collection_id,
                                         std::string_view rkey, OnRow&& on_row);
  Result<std::optional<int64_t>> Lookup(InternTable& table, std::string_view key);
  Result<int64_t> Intern(InternTable& table, std::string_view key);
  // Steps a statement that returns no rows; records the code of a failure for the retry logic.
  Status Run(sqlite3_stmt* stmt, const char* what);
  Status Failed(int rc, const char* what);
  void Rollback();

  SqliteSinkOptions options_;
  sqlite::Db db_;
  Stmt begin_, commit_, rollback_;
  Stmt insert_row_, select_row_, update_row_, update_rev_, delete_row_, purge_did_,
      purge_did_before_;
  InternTable dids_;
  InternTable collections_;
  // StartWarm's copies (nullopt where it gave up); warm_done_ is set once they are ready.
  struct WarmCaches {
    std::optional<InternCache> dids, collections;
  };
  std::future<WarmCaches> warm_;
  std::atomic<bool> warm_stop_{false};
  std::atomic<bool> warm_done_{false};
  // Null when bodies are stored as text (compress off).
  std::unique_ptr<sqlite::Compressor> compressor_;
  int last_failure_rc_ = SQLITE_OK;
  // Held while this sink owns a bulk load, to be finished by the destructor.
  BulkOwnerLock bulk_owner_;
  // Null when the writer checkpoints itself (background_checkpoint off). Declared last: it goes
  // first, while the writer's connection is still open.
  std::unique_ptr<sqlite::Checkpointer> checkpointer_;
};

Result<std::unique_ptr<pipeline::Sink>> SqliteSink::Open(const SqliteSinkOptions& options) {
  // NOMUTEX: the Sink contract already keeps calls on one thread at a time.
  ATFILL_ASSIGN_OR_RETURN(
      sqlite::Db db,
      sqlite::Open(options.path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX));
  sqlite3* raw = db.get();
  sqlite3_busy_timeout(raw, static_cast<int>(options.busy_timeout_ms));

  // Only takes effect while the file is still empty, so it must precede the switch to WAL, which
  // writes the first page.
  std::string page_size = "PRAGMA page_size = " + std::to_string(options.page_size_bytes);
  ATFILL_RETURN_IF_ERROR(sqlite::Exec(raw, page_size.c_str()));
  {
    ATFILL_ASSIGN_OR_RETURN(Stmt wal, sqlite::Prepare(raw, "PRAGMA journal_mode = WAL", false));
    // The switch needs the file to itself and SQLite does not always wait for it (another
    // connection opening the same new file at once, e.g. a backfill beside the live consumer):
    // retry a busy switch within the busy timeout.
    const auto deadline = Clock::now() + std::chrono::milliseconds(options.busy_timeout_ms);
    auto backoff = std::chrono::milliseconds(2);
    int rc = sqlite3_step(wal.get());
    while (IsBusyCode(rc) && WaitToRetryBusy(deadline, &backoff)) {
      sqlite3_reset(wal.get());
      rc = sqlite3_step(wal.get());
    }
    if (rc != SQLITE_ROW) return sqlite::ErrorStatus(raw, rc, "switching to WAL mode");
    if (ColumnText(wal.get(), 0) != "wal") {
      return Status::Unsupported("cannot use WAL mode (journal_mode stays " +
                                 std::string(ColumnText(wal.get(), 0)) + ")");
    }
  }
  std::string pragmas = "PRAGMA synchronous = ";
  pragmas += options.synchronous == SqliteSynchronous::kFull ? "FULL" : "NORMAL";
  pragmas += "; PRAGMA cache_size = -" + std::to_string(options.cache_bytes / 1024 + 1);
  // Retried within the busy timeout, like the switch above.
  ATFILL_RETURN_IF_ERROR(sqlite::ExecRetryingBusy(raw, pragmas.c_str(), options.busy_timeout_ms));
  // Says in options.log what the job waits for here: an upgrade may rewrite the record table.
  ATFILL_RETURN_IF_ERROR(sqlite::MigrateSchema(raw, options.path, options.log));
  // A bulk load belongs to the sink holding its owner lock; the kernel releases the lock of a
  // process that dies. Only a load without an owner (killed) is taken over: continued by a
  // bulk_load sink, finished by any other. A load whose owner is alive is left to it.
  BulkOwnerLock owner;
  {
    ATFILL_ASSIGN_OR_RETURN(bool in_bulk, sqlite::InBulkLayout(raw));
    bool empty = false;
    if (options.bulk_load && !in_bulk) {
      ATFILL_ASSIGN_OR_RETURN(bool has_rows, sqlite::HasRecordRows(raw));
      empty = !has_rows;
    }
    if ((in_bulk || empty) && owner.TryLock(options.path + "-bulkload")) {
      if (options.bulk_load) {
        ATFILL_ASSIGN_OR_RETURN(bool bulk, sqlite::BeginBulkLoad(raw));
        if (!bulk) owner.Release();
      } else {
        ATFILL_RETURN_IF_ERROR(sqlite::FinishBulkLoad(raw, options.path, options.log));
        ATFILL_ASSIGN_OR_RETURN(bool still, sqlite::InBulkLayout(raw));
        if (!still) owner.Remove();
        owner.Release();
      }
    }
  }

  int64_t actual_page_size = 0;
  {
    ATFILL_ASSIGN_OR_RETURN(Stmt ps, sqlite::Prepare(raw, "PRAGMA page_size", false));
    int rc = sqlite3_step(ps.get());
    if (rc != SQLITE_ROW) return sqlite::ErrorStatus(raw, rc, "reading the page size");
    actual_page_size = sqlite3_column_int64(ps.get(), 0);
  }
  if (actual_page_size <= 0) {
    return Status::Corrupt("the database reports page size " + std::to_string(actual_page_size));
  }
  const int64_t checkpoint_frames =
      std::clamp<int64_t>(options.wal_autocheckpoint_bytes / actual_page_size, 1, INT_MAX);
  std::unique_ptr<sqlite::Checkpointer> checkpointer;
  if (options.background_checkpoint) {
    ATFILL_ASSIGN_OR_RETURN(
        checkpointer,
        sqlite::Checkpointer::Start(
            raw, options.path, options.synchronous == SqliteSynchronous::kFull ? "FULL" : "NORMAL",
            checkpoint_frames, options.busy_timeout_ms));
  } else {
    std::string checkpoint = "PRAGMA wal_autocheckpoint = " + std::to_string(checkpoint_frames);
    ATFILL_RETURN_IF_ERROR(sqlite::Exec(raw, checkpoint.c_str()));
  }

  if (options.max_database_bytes > 0) {
    uint64_t pages = options.max_database_bytes / static_cast<uint64_t>(actual_page_size);
    // SQLite never lowers the cap below the file's current size; the first write then fails.
    std::string cap = "PRAGMA max_page_count = " + std::to_string(std::max<uint64_t>(pages, 1));
    ATFILL_RETURN_IF_ERROR(sqlite::Exec(raw, cap.c_str()));
  }

  std::unique_ptr<SqliteSink> sink(new SqliteSink(options, std::move(db)));
  sink->checkpointer_ = std::move(checkpointer);
  sink->bulk_owner_ = std::move(owner);
  ATFILL_RETURN_IF_ERROR(sink->Prepare());
  if (options.compress) {
    sqlite::CompressorOptions compressor;
    compressor.train_samples = options.dictionary_samples;
    ATFILL_ASSIGN_OR_RETURN(sink->compressor_, sqlite::Compressor::Open(raw, compressor));
  }
  sink->StartWarm();
  return std::unique_ptr<pipeline::Sink>(std::move(sink));
}

Status SqliteSink::Prepare() {
  sqlite3* db = db_.get();
  auto prep = [db](Stmt* out, std::string_view sql) -> Status {
    ATFILL_ASSIGN_OR_RETURN(*out, sqlite::Prepare(db, sql, true));
    return Status::OK();
  };
  ATFILL_RETURN_IF_ERROR(prep(&begin_, "BEGIN IMMEDIATE"));
  ATFILL_RETURN_IF_ERROR(prep(&commit_, "COMMIT"));
  ATFILL_RETURN_IF_ERROR(prep(&rollback_, "ROLLBACK"));
  // New rows are the common case of a backfill: one INSERT that does nothing on conflict is
  // measurably faster than looking the row up first, and only a conflict pays for the SELECT.
  ATFILL_RETURN_IF_ERROR(prep(&insert_row_,
                              "INSERT INTO atfill_record_rows"
                              "(did_id, collection_id, rkey, cid, rev, indexed_at, created_at, "
                              "record) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) "
                              "ON CONFLICT (collection_id, rkey, did_id) DO NOTHING"));
  ATFILL_RETURN_IF_ERROR(prep(&select_row_,
                              "SELECT id, cid, rev FROM atfill_record_rows "
                              "WHERE did_id = ?1 AND collection_id = ?2 AND rkey = ?3"));
  ATFILL_RETURN_IF_ERROR(prep(&update_row_,
                              "UPDATE atfill_record_rows SET cid = ?1, rev = ?2, indexed_at = ?3, "
                              "created_at = ?4, record = ?5 WHERE id = ?6"));
  ATFILL_RETURN_IF_ERROR(
      prep(&update_rev_, "UPDATE atfill_record_rows SET rev = ?1 WHERE id = ?2"));
  ATFILL_RETURN_IF_ERROR(prep(&delete_row_, "DELETE FROM atfill_record_rows WHERE id = ?1"));
  ATFILL_RETURN_IF_ERROR(prep(&purge_did_, "DELETE FROM atfill_record_rows WHERE did_id = ?1"));
  ATFILL_RETURN_IF_ERROR(prep(&purge_did_before_,
                              "DELETE FROM atfill_record_rows WHERE did_id = ?1 AND "
                              "(rev IS NULL OR rev < ?2)"));
  ATFILL_RETURN_IF_ERROR(prep(&dids_.find, "SELECT id FROM atfill_dids WHERE did = ?1"));
  ATFILL_RETURN_IF_ERROR(prep(&dids_.insert, "INSERT INTO atfill_dids(did) VALUES (?1)"));
  ATFILL_RETURN_IF_ERROR(
      prep(&collections_.find, "SELECT id FROM atfill_collections WHERE nsid = ?1"));
  ATFILL_RETURN_IF_ERROR(
      prep(&collections_.insert, "INSERT INTO atfill_collections(nsid) VALUES (?1)"));
  return Status::OK();
}

void SqliteSink::StartWarm() {
  warm_ = std::async(std::launch::async, [this] {
    WarmCaches out;
    auto db = sqlite::Open(options_.path, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX);
    if (db.ok()) {  // else the lookups do it all
      sqlite3_busy_timeout(db->get(), static_cast<int>(options_.busy_timeout_ms));
      // Ids are given in order, so the first row's (the largest) is about how many rows there are.
      auto fill = [&](const char* sql) -> std::optional<InternCache> {
        InternCache cache(options_.intern_cache_entries);
        auto prepared = sqlite::Prepare(db->get(), sql, false);
        if (!prepared.ok()) return std::nullopt;
        sqlite3_stmt* s = prepared->get();
        sqlite3_bind_int64(s, 1, static_cast<int64_t>(options_.intern_cache_entries));
        int rc = SQLITE_OK;
        while (!warm_stop_.load(std::memory_order_relaxed) &&
               (rc = sqlite3_step(s)) == SQLITE_ROW) {
          const int64_t id = sqlite3_column_int64(s, 0);
          if (cache.size() == 0) cache.Reserve(static_cast<size_t>(std::max<int64_t>(0, id)));
          const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(s, 1));
          // The keys are unique: each is added without a lookup.
          cache.Add(std::string_view(text == nullptr ? "" : text,
                                     static_cast<size_t>(sqlite3_column_bytes(s, 1))),
                    id);
        }
        if (warm_stop_.load(std::memory_order_relaxed) || rc != SQLITE_DONE) return std::nullopt;
        return cache;
      };
      out.collections = fill("SELECT id, nsid FROM atfill_collections ORDER BY id DESC LIMIT ?1");
      out.dids = fill("SELECT id, did FROM atfill_dids ORDER BY id DESC LIMIT ?1");
    }
    warm_done_.store(true, std::memory_order_release);
    if (options_.on_warmed) options_.on_warmed();
    return out;
  });
}

void SqliteSink::AdoptWarm() {
  if (!warm_.valid() || !warm_done_.load(std::memory_order_acquire)) return;
  WarmCaches warmed = warm_.get();
  // Replaces what the lookups learned meanwhile; what the copies lack is looked up again.
  if (warmed.collections) collections_.cache = std::move(*warmed.collections);
  if (warmed.dids) dids_.cache = std::move(*warmed.dids);
}

void SqliteSink::StopWarm() {
  warm_stop_.store(true, std::memory_order_relaxed);
  if (warm_.valid()) warm_.wait();
}

Result<WriteStats> SqliteSink::Write(std::span<const Event> batch) {
  AdoptWarm();
  WriteStats stats;
  if (batch.empty()) return stats;
  const int64_t now = options_.now_us ? options_.now_us() : SystemNowUs();
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(options_.busy_timeout_ms);
  auto backoff = std::chrono::milliseconds(2);
  for (;;) {
    auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (remaining.count() < 0) remaining = std::chrono::milliseconds(0);
    // SQLite's own busy handler waits (with backoff) for the lock inside each statement; the loop
    // below covers a lock lost mid-batch, which only a whole retry of the batch can fix.
    sqlite3_busy_timeout(db_.get(), static_cast<int>(remaining.count()));
    last_failure_rc_ = SQLITE_OK;
    stats = WriteStats{};
    Status st = WriteOnce(batch, now, &stats);
    if (st.ok()) {
      if (compressor_ != nullptr) compressor_->Committed();
      return stats;
    }
    Rollback();
    if (!IsBusyCode(last_failure_rc_)) return st;
    if (!WaitToRetryBusy(deadline, &backoff)) {
      return Status::Unavailable(
          "SQLite database " + options_.path + " stayed locked by another connection for " +
          std::to_string(options_.busy_timeout_ms) +
          " ms; nothing of the batch was written (last error: " + sqlite3_errstr(last_failure_rc_) +
          ")");
    }
  }
}

Status SqliteSink::WriteOnce(std::span<const Event> batch, int64_t now, WriteStats* stats) {
  if (checkpointer_ != nullptr) {
    Status st = checkpointer_->BeforeTransaction();
    if (!st.ok()) return st.WithContext("SQLite database " + options_.path);
  }
  ATFILL_RETURN_IF_ERROR(Run(begin_.get(), "BEGIN IMMEDIATE"));
  // The batch is applied in the order it came. A stream's order is the cheapest for every index
  // of the record table: its record keys and createdAt follow time, so the key and created_at
  // indexes take each row at their right edge, and the batch is read once, front to back.
  // Reordering it (by account, or by key) costs more than it saves (docs/performance.md).
  for (size_t i = 0; i < batch.size(); ++i) {
    if (const auto* r = std::get_if<RecordEvent>(&batch[i])) {
      ATFILL_RETURN_IF_ERROR(CheckRecordEvent(*r, i));
      Status st =
          r->operation == Operation::kDelete ? ApplyDelete(*r, stats) : ApplyWrite(*r, now, stats);
      if (!st.ok()) return st.WithContext("event " + std::to_string(i) + " (" + r->Uri() + ")");
    } else {
      const auto& a = std::get<AccountEvent>(batch[i]);
      ATFILL_RETURN_IF_ERROR(CheckAccountEvent(a, i));
      Status st = ApplyAccount(a, stats);
      if (!st.ok()) {
        return st.WithContext("event " + std::to_string(i) + " (account " + a.did + ")");
      }
    }
  }
  return Run(commit_.get(), "COMMIT");
}

// What a create/update does to an existing row.
enum class WriteVerdict : uint8_t { kStale, kUnchanged, kUnchangedNewerRev, kUpdate };

Status SqliteSink::ApplyWrite(const RecordEvent& e, int64_t now, WriteStats* stats) {
  ATFILL_ASSIGN_OR_RETURN(int64_t did_id, Intern(dids_, e.did));
  ATFILL_ASSIGN_OR_RETURN(int64_t collection_id, Intern(collections_, e.collection));
  sqlite::EncodedBody body{e.body, false};
  if (compressor_ != nullptr) {
    auto encoded = compressor_->Encode(collection_id, e.body);
    if (!encoded.ok()) {
      last_failure_rc_ = sqlite3_extended_errcode(db_.get());
      return encoded.status().WithContext("SQLite database " + options_.path);
    }
    body = *encoded;
  }
  // A compressed row stores its CID binary and needs no text (but to compare it with a stored
  // text CID, on a conflict).
  std::string cid;
  if (!body.compressed) cid = e.cid.ToString();
  {
    sqlite3_stmt* s = insert_row_.get();
    ResetOnExit reset(s);
    int rc = BindRow(s, e, did_id, collection_id, cid, now, body);
    if (rc != SQLITE_OK) return Failed(rc, "binding the record body");
    ATFILL_RETURN_IF_ERROR(Run(s, "inserting the record"));
    if (sqlite3_changes(db_.get()) > 0) {
      ++stats->inserted;
      return Status::OK();
    }
  }
  return ApplyToExisting(e, did_id, collection_id, cid, now, body, stats);
}

Status SqliteSink::ApplyToExisting(const RecordEvent& e, int64_t did_id, int64_t collection_id,
                                   const std::string& cid, int64_t now,
                                   const sqlite::EncodedBody& body, WriteStats* stats) {
  WriteVerdict verdict = WriteVerdict::kStale;
  // A binary stored CID compares as a CID; a text one with the event's text (computed here when
  // the row's body is compressed, whose CID goes in binary and needs no text otherwise).
  std::string text_of_cid;
  auto same_cid = [&](const StoredCid& stored) {
    if (stored.binary) return *stored.binary == e.cid;
    if (cid.empty()) text_of_cid = e.cid.ToString();
    return stored.text == (cid.empty() ? text_of_cid : cid);
  };
  auto decide = [&](const StoredCid& stored_cid, std::string_view stored_rev) {
    const bool has_rev = !e.rev.empty();
    const bool stored_has_rev = !stored_rev.empty();
    if (has_rev && stored_has_rev && stored_rev > e.rev) {
      verdict = WriteVerdict::kStale;
    } else if (same_cid(stored_cid)) {
      // Raising the stored rev keeps a later delete between the two revs stale.
      verdict = has_rev && (!stored_has_rev || e.rev > stored_rev)
                    ? WriteVerdict::kUnchangedNewerRev
                    : WriteVerdict::kUnchanged;
    } else if (!has_rev && stored_has_rev) {
      verdict = WriteVerdict::kStale;
    } else {
      verdict = WriteVerdict::kUpdate;
    }
  };
  ATFILL_ASSIGN_OR_RETURN(std::optional<int64_t> rowid,
                          ReadRow(did_id, collection_id, e.rkey, decide));
  if (!rowid) return Status::Internal("the insert conflicted but no row matches the key");
  switch (verdict) {
    case WriteVerdict::kStale:
      ++stats->stale;
      return Status::OK();
    case WriteVerdict::kUnchanged:
      ++stats->unchanged;
      return Status::OK();
    case WriteVerdict::kUnchangedNewerRev: {
      sqlite3_stmt* s = update_rev_.get();
      ResetOnExit reset(s);
      BindText(s, 1, e.rev);
      sqlite3_bind_int64(s, 2, *rowid);
      ATFILL_RETURN_IF_ERROR(Run(s, "raising the record's rev"));
      ++stats->unchanged;
      return Status::OK();
    }
    case WriteVerdict::kUpdate: {
      sqlite3_stmt* s = update_row_.get();
      ResetOnExit reset(s);
      BindCid(s, 1, e, body, cid);
      BindTextOrNull(s, 2, e.rev);
      sqlite3_bind_int64(s, 3, now);
      BindTextOrNull(s, 4, e.created_at);
      int rc = BindBody(s, 5, body);
      if (rc != SQLITE_OK) return Failed(rc, "binding the record body");
      sqlite3_bind_int64(s, 6, *rowid);
      ATFILL_RETURN_IF_ERROR(Run(s, "updating the record"));
      ++stats->updated;
      return Status::OK();
    }
  }
  return Status::Internal("unknown write verdict");
}

Status SqliteSink::ApplyDelete(const RecordEvent& e, WriteStats* stats) {
  ATFILL_ASSIGN_OR_RETURN(std::optional<int64_t> did_id, Lookup(dids_, e.did));
  if (!did_id) return Status::OK();
  ATFILL_ASSIGN_OR_RETURN(std::optional<int64_t> collection_id, Lookup(collections_, e.collection));
  if (!collection_id) return Status::OK();
  bool stale = false;
  auto decide = [&](const StoredCid&, std::string_view stored_rev) {
    stale = !e.rev.empty() && !stored_rev.empty() && stored_rev > e.rev;
  };
  ATFILL_ASSIGN_OR_RETURN(std::optional<int64_t> rowid,
                          ReadRow(*did_id, *collection_id, e.rkey, decide));
  if (!rowid) return Status::OK();
  if (stale) {
    ++stats->stale;
    return Status::OK();
  }
  sqlite3_stmt* s = delete_row_.get();
  ResetOnExit reset(s);
  sqlite3_bind_int64(s, 1, *rowid);
  ATFILL_RETURN_IF_ERROR(Run(s, "deleting the record"));
  ++stats->deleted;
  return Status::OK();
}

Result<uint64_t> SqliteSink::RemoveRows(int64_t did_id, const std::vector<std::string>& collections,
                                        const std::string& before_rev, const char* what) {
  if (collections.empty()) {
    sqlite3_stmt* s = before_rev.empty() ? purge_did_.get() : purge_did_before_.get();
    ResetOnExit reset(s);
    sqlite3_bind_int64(s, 1, did_id);
    if (!before_rev.empty()) BindText(s, 2, before_rev);
    ATFILL_RETURN_IF_ERROR(Run(s, what));
    return static_cast<uint64_t>(sqlite3_changes64(db_.get()));
  }
  // Rare (a resync under a collection filter): statements made for the occasion.
  ATFILL_ASSIGN_OR_RETURN(
      Stmt list,
      sqlite::Prepare(db_.get(),
                      "SELECT id, nsid FROM atfill_collections WHERE id IN (SELECT "
                      "DISTINCT collection_id FROM atfill_record_rows WHERE did_id = ?1)",
                      false));
  sqlite3_bind_int64(list.get(), 1, did_id);
  std::vector<int64_t> matching;
  int rc;
  while ((rc = sqlite3_step(list.get())) == SQLITE_ROW) {
    if (pipeline::CollectionMatches(ColumnText(list.get(), 1), collections)) {
      matching.push_back(sqlite3_column_int64(list.get(), 0));
    }
  }
  if (rc != SQLITE_DONE) return Failed(rc, what);
  ATFILL_ASSIGN_OR_RETURN(Stmt remove,
                          sqlite::Prepare(db_.get(),
                                          "DELETE FROM atfill_record_rows WHERE did_id = ?1 AND "
                                          "collection_id = ?2 AND (?3 IS NULL OR rev IS NULL OR "
                                          "rev < ?3)",
                                          false));
  uint64_t removed = 0;
  for (int64_t collection_id : matching) {
    sqlite3_reset(remove.get());
    sqlite3_bind_int64(remove.get(), 1, did_id);
    sqlite3_bind_int64(remove.get(), 2, collection_id);
    if (!before_rev.empty()) BindText(remove.get(), 3, before_rev);
    ATFILL_RETURN_IF_ERROR(Run(remove.get(), what));
    removed += static_cast<uint64_t>(sqlite3_changes64(db_.get()));
  }
  return removed;
}

Status SqliteSink::ApplyAccount(const AccountEvent& e, WriteStats* stats) {
  if (!e.resync && !pipeline::StatusPurgesRecords(e.status)) return Status::OK();
  ++(e.resync ? stats->resyncs : stats->purged_accounts);
  ATFILL_ASSIGN_OR_RETURN(std::optional<int64_t> did_id, Lookup(dids_, e.did));
  if (!did_id) return Status::OK();
  const std::string& before_rev = e.purge_before_rev;
  if (e.resync) {
    ATFILL_ASSIGN_OR_RETURN(uint64_t n, RemoveRows(*did_id, e.resync_collections, before_rev,
                                                   "removing the records of a resynced repo"));
    stats->resynced_records += n;
  } else {
    ATFILL_ASSIGN_OR_RETURN(uint64_t n,
                            RemoveRows(*did_id, {}, before_rev, "purging the account's records"));
    stats->purged_records += n;
  }
  return Status::OK();
}

template <typename OnRow>
Result<std::optional<int64_t>> SqliteSink::ReadRow(int64_t did_id, int64_t collection_id,
                                                   std::string_view rkey, OnRow&& on_row) {
  sqlite3_stmt* s = select_row_.get();
  ResetOnExit reset(s);
  sqlite3_bind_int64(s, 1, did_id);
  sqlite3_bind_int64(s, 2, collection_id);
  BindText(s, 3, rkey);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_DONE) return std::optional<int64_t>();
  if (rc != SQLITE_ROW) return Failed(rc, "reading the stored record");
  StoredCid stored;
  if (sqlite3_column_type(s, 1) != SQLITE_BLOB) {
    stored.text = ColumnText(s, 1);
  } else {
    const auto* bytes = static_cast<const uint8_t*>(sqlite3_column_blob(s, 1));
    auto cid =
        atproto::Cid::FromBinary(ByteView(bytes, static_cast<size_t>(sqlite3_column_bytes(s, 1))));
    if (!cid.ok()) {
      return Status::Corrupt("the stored record's cid is a blob but not a binary CID: " +
                             cid.status().message())
          .WithContext("SQLite database " + options_.path);
    }
    stored.binary = *cid;
  }
  on_row(stored, ColumnText(s, 2));
  return std::optional<int64_t>(sqlite3_column_int64(s, 0));
}

Result<std::optional<int64_t>> SqliteSink::Lookup(InternTable& table, std::string_view key) {
  if (std::optional<int64_t> id = table.cache.Find(key)) return id;
  sqlite3_stmt* s = table.find.get();
  ResetOnExit reset(s);
  BindText(s, 1, key);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_DONE) return std::optional<int64_t>();
  if (rc != SQLITE_ROW) return Failed(rc, "looking up an interned id");
  int64_t id = sqlite3_column_int64(s, 0);
  table.cache.Add(key, id);
  return std::optional<int64_t>(id);
}

Result<int64_t> SqliteSink::Intern(InternTable& table, std::string_view key) {
  ATFILL_ASSIGN_OR_RETURN(std::optional<int64_t> found, Lookup(table, key));
  if (found) return *found;
  sqlite3_stmt* s = table.insert.get();
  ResetOnExit reset(s);
  BindText(s, 1, key);
  ATFILL_RETURN_IF_ERROR(Run(s, "interning an id"));
  int64_t id = sqlite3_last_insert_rowid(db_.get());
  // Ids added inside the transaction are forgotten by Rollback() if the batch fails.
  table.cache.Add(key, id);
  return id;
}

Status SqliteSink::Run(sqlite3_stmt* stmt, const char* what) {
  int rc = sqlite3_step(stmt);
  if (rc == SQLITE_DONE || rc == SQLITE_ROW) return Status::OK();
  return Failed(rc, what);
}

Status SqliteSink::Failed(int rc, const char* what) {
  last_failure_rc_ = rc;
  return sqlite::ErrorStatus(db_.get(), rc, what).WithContext("SQLite database " + options_.path);
}

void SqliteSink::Rollback() {
  // SQLite rolls the transaction back by itself after some errors (SQLITE_FULL, SQLITE_NOMEM...).
  if (!sqlite3_get_autocommit(db_.get())) {
    sqlite3_stmt* s = rollback_.get();
    ResetOnExit reset(s);
    (void)sqlite3_step(s);  // nothing more to undo if this fails; the batch error is reported
  }
  // An id interned by the rolled-back transaction no longer exists; the cache may hold some.
  dids_.cache.Clear();
  collections_.cache.Clear();
  if (compressor_ != nullptr) compressor_->RolledBack();
}

}  // namespace

Status SqliteSinkOptions::Validate() const {
  if (path.empty()) return Status::Invalid("SqliteSinkOptions.path is empty");
  if (path == ":memory:" || path.starts_with("file:")) {
    return Status::Invalid("SqliteSinkOptions.path must name a file (got '" + path +
                           "'): WAL mode and readers need one");
  }
  if (busy_timeout_ms < 0 || busy_timeout_ms > INT_MAX) {
    return Status::Invalid("SqliteSinkOptions.busy_timeout_ms must be in [0, " +
                           std::to_string(INT_MAX) + "], got " + std::to_string(busy_timeout_ms));
  }
  if (cache_bytes <= 0) {
    return Status::Invalid("SqliteSinkOptions.cache_bytes must be positive, got " +
                           std::to_string(cache_bytes));
  }
  if (page_size_bytes < 512 || page_size_bytes > 65536 ||
      (page_size_bytes & (page_size_bytes - 1)) != 0) {
    return Status::Invalid(
        "SqliteSinkOptions.page_size_bytes must be a power of two in [512, 65536], got " +
        std::to_string(page_size_bytes));
  }
  if (wal_autocheckpoint_bytes <= 0) {
    return Status::Invalid("SqliteSinkOptions.wal_autocheckpoint_bytes must be positive, got " +
                           std::to_string(wal_autocheckpoint_bytes));
  }
  if (intern_cache_entries == 0) {
    return Status::Invalid("SqliteSinkOptions.intern_cache_entries must be positive");
  }
  if (dictionary_samples < kMinDictionarySamples || dictionary_samples > kMaxDictionarySamples) {
    return Status::Invalid("SqliteSinkOptions.dictionary_samples must be in [" +
                           std::to_string(kMinDictionarySamples) + ", " +
                           std::to_string(kMaxDictionarySamples) + "], got " +
                           std::to_string(dictionary_samples));
  }
  return Status::OK();
}

Result<std::unique_ptr<pipeline::Sink>> OpenSqliteSink(const SqliteSinkOptions& options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  auto sink = SqliteSink::Open(options);
  if (!sink.ok()) return sink.status().WithContext("opening SQLite database " + options.path);
  return sink;
}

std::string SqliteVersion() { return sqlite3_libversion(); }

}  // namespace atfill::sinks
