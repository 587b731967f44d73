// The SQLite sink: atfill's embedded default database.
//
// Reads and raw SQL use the view
//   atfill_records(uri, did, collection, rkey, record, cid, rev, indexed_at, created_at)
// where
//   uri         'at://' || did || '/' || collection || '/' || rkey
//   record      the record's JSON text exactly as received (stored compressed when `compress` is
//               on; the view gives back the text through the SQL function atfill_json, which
//               atfill registers on its connections and the sqlite3 shell gets by loading
//               build/sinks/libatfill_sqlite_ext: see sqlite_functions.hpp, docs/queries.md)
//   cid         the record CID, multibase base32 ("bafyrei...")
//   rev         the repo revision (TID) that wrote it; NULL when the source gave none
//   indexed_at  when atfill wrote the current version of the row: ISO-8601 UTC with microseconds,
//               "YYYY-MM-DDTHH:MM:SS.ffffffZ" (e.g. 2026-11-30T09:00:00.123456Z); it sorts as time.
//               Every row of one batch gets the same value. An identical redelivery keeps it.
//   created_at  the record's own createdAt string as the event gave it; NULL when empty
// Every table is named atfill_<name> (see sqlite_schema.hpp), so the database can also hold a
// user's own tables. The schema is versioned; opening upgrades an older atfill database in place
// and refuses one written by a newer atfill.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.hpp"
#include "pipeline/sink.hpp"

namespace atfill::sinks {

// The schema version this build writes and reads.
inline constexpr int kSqliteSchemaVersion = 5;

// When a commit reaches the disk. The sink always runs in WAL mode.
enum class SqliteSynchronous : uint8_t {
  // The WAL is synced at checkpoints only: a committed batch survives the process being killed
  // (even kill -9), but the last batches may be lost on power loss or an OS crash. The database is
  // never corrupted either way. Default: at-least-once delivery replays what was lost.
  kNormal,
  // The WAL is synced at every commit: a committed batch also survives power loss. Slower.
  kFull,
};

struct SqliteSinkOptions {
  // Database file; created (with the schema) when missing. Its folder must exist.
  std::string path;
  // Longest one Write waits for another connection's write lock, in milliseconds, retrying with
  // backoff; after that the Write fails as Unavailable with nothing applied. 0 fails at once.
  int64_t busy_timeout_ms = 5000;
  SqliteSynchronous synchronous = SqliteSynchronous::kNormal;
  // Page size of a database this sink creates, in bytes: a power of two in [512, 65536]. An
  // existing database keeps the page size it was created with. With records of a few hundred
  // bytes, 16 KiB pages measured no worse than SQLite's default 4 KiB (docs/performance.md).
  int64_t page_size_bytes = 16384;
  // Page cache of the sink's connection, in bytes.
  int64_t cache_bytes = 64 << 20;
  // WAL size that triggers an automatic checkpoint, in bytes (rounded to whole pages). Larger
  // values checkpoint less often at the cost of a larger -wal file (this much plus one batch),
  // which costs less CPU per record when DIDs interleave (docs/performance.md).
  int64_t wal_autocheckpoint_bytes = 128 << 20;
  // Checkpoint on a thread of the sink's own (a second connection) instead of inside the
  // writer's COMMIT: the copying of WAL pages into the database then runs beside the writes
  // instead of between them, which the writer's rate shows (docs/performance.md). The WAL stays
  // within wal_autocheckpoint_bytes plus a batch: at that size the writer waits for the
  // checkpoint to catch up before its next transaction (see sqlite_checkpointer.hpp).
  bool background_checkpoint = true;
  // DIDs and collections whose interned ids are remembered in memory; when the cache is full it
  // starts again empty, so memory stays bounded however many DIDs a job sees.
  size_t intern_cache_entries = 1 << 20;
  // Largest size the database file may reach, in bytes; 0 for no limit. A batch that would grow
  // the file past it fails as Unavailable with nothing applied, exactly like a full disk.
  uint64_t max_database_bytes = 0;
  // A fresh backfill's load (a crawl: each account's records together). When the record table is
  // empty at open, the sink loads it in a layout that takes that order at the indexes' right edge
  // (the key by account instead of by collection and record key, and no created_at index) and
  // builds the final indexes from the whole table when the sink is destroyed (the job ended or
  // paused). Every write rule and every query answers the same in either layout; only the query
  // by collection newest first scans the table until the indexes are built. The load belongs to
  // its sink (a lock on the file `path`-bulkload, removed when the indexes are built): other sinks
  // opened meanwhile, in this process or another, write into the load layout and leave the load
  // to it. A process killed mid-load leaves the load layout and no owner: a sink opened again with
  // bulk_load takes the load over and continues it, one opened without it builds the indexes
  // first. A table that already holds rows is written as it is. Wrong for a stream's order
  // (accounts interleaved): leave it off there.
  bool bulk_load = false;
  // Store record bodies as zstd frames made with a dictionary per collection, trained on the
  // collection's first `dictionary_samples` bodies this sink writes (rows before those stay
  // text). Off: every body is stored as its text, and a database that never held a compressed
  // row keeps a view that any SQLite program reads without atfill's extension. Rows already
  // compressed stay readable either way.
  bool compress = false;
  // Bodies of a collection the sink sees before it trains the collection's dictionary.
  size_t dictionary_samples = 1000;
  // The clock for indexed_at, unix microseconds. Empty: the system clock. Tests pass a fake.
  std::function<int64_t()> now_us;
  // Called on its own thread once the intern caches' warm-up from the tables is ready to be taken
  // in by the next Write (or has given up); for tests that wait for it.
  std::function<void()> on_warmed;
  // Where the sink says, one line at a time, what keeps a job waiting before its first batch or
  // after its last: an upgrade of the tables written by an older atfill (a large table's takes
  // minutes), and the index builds ending a bulk load. Empty: nothing is said.
  std::function<void(std::string_view line)> log;

  Status Validate() const;
};

// Opens (creating or migrating as needed) the database and returns a Sink writing to it.
// pipeline::Sink::Write here:
//  * applies the write rules of pipeline/sink.hpp per event, in order, in one BEGIN IMMEDIATE
//    transaction per batch; returns once the batch is committed (durable as `synchronous` says);
//  * WriteStats: a create/update whose CID equals the stored one is `unchanged` (when its rev is
//    newer the stored rev is raised to it, so a later stale delete stays stale, but the row and
//    indexed_at are kept); a write ignored because the stored rev is newer, or because it has no
//    rev while the stored row has one and the CIDs differ, is `stale`; a delete of a row that does
//    not exist counts nowhere; every purging account event counts one `purged_accounts`, even when
//    the DID had no rows;
//  * an event missing its did, collection or rkey, or a create/update without a valid CID or body,
//    is Invalid (the message names the event's index and URI); the batch is rolled back;
//  * another writer holding the lock past busy_timeout_ms, a full disk, or max_database_bytes
//    reached is Unavailable, with the batch rolled back; I/O errors are IoError.
// The database may be read concurrently by other connections (SqliteReader, the sqlite3 shell).
// Two sinks on one file serialise on SQLite's write lock.
Result<std::unique_ptr<pipeline::Sink>> OpenSqliteSink(const SqliteSinkOptions& options);

// The version of the SQLite library this process runs with (sqlite3_libversion: the shared library
// loaded, which may be newer than the headers it was built with).
std::string SqliteVersion();

}  // namespace atfill::sinks
