// The PostgreSQL sink (libpq): for users who outgrow one machine. Several atfill processes, each
// given a shard of the DID space, can write into one database at once.
//
// Reads and raw SQL use the view
//   atfill_records(uri, did, collection, rkey, record, cid, rev, indexed_at, created_at)
// with the same columns, meanings and text formats as the SQLite sink's (sqlite_sink.hpp), so the
// two views of the same input compare equal column for column:
//   uri         'at://' || did || '/' || collection || '/' || rkey
//   record      the record's JSON text exactly as received (type text, not jsonb: the bytes are
//               kept; cast with record::jsonb to query it)
//   cid         the record CID, multibase base32 ("bafyrei...")
//   rev         the repo revision (TID) that wrote it; NULL when the source gave none
//   indexed_at  when atfill wrote the current version of the row, as text: ISO-8601 UTC with
//               microseconds, "YYYY-MM-DDTHH:MM:SS.ffffffZ"; it sorts as time. Every row of one
//               batch gets the same value. An identical redelivery keeps it.
//   created_at  the record's own createdAt string as the event gave it; NULL when empty
// Every table is named atfill_<name> (see postgres_schema.hpp) in the configured schema. The
// tables are versioned; opening upgrades older atfill tables in place and refuses newer ones.
// docs/postgres.md is the user's reference.
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
inline constexpr int kPostgresSchemaVersion = 7;

struct PostgresSinkOptions {
  // libpq connection string ("host=db.example port=5432 dbname=atfill user=atfill") or URI
  // ("postgresql://atfill@db.example/atfill"); empty takes everything from libpq's defaults and
  // PG* environment variables. Passwords are best kept in ~/.pgpass or PGPASSWORD.
  std::string conninfo;
  // The schema holding the atfill tables; created when missing (which needs the CREATE privilege
  // on the database).
  std::string schema = "public";
  // Longest one Write (or the open) spends getting a connection, in milliseconds: attempts with
  // backoff until then, after which the Write fails as Unavailable with nothing applied.
  int64_t connect_timeout_ms = 5000;
  // Longest a statement waits for a lock another connection holds, in milliseconds (PostgreSQL's
  // lock_timeout); after that the Write fails as Unavailable with nothing applied. At least 1.
  int64_t lock_timeout_ms = 5000;
  // Times one Write retries a batch that conflicted with another transaction (serialization
  // failure, deadlock, a row another writer changed in between) before failing as Unavailable.
  int32_t conflict_retries = 4;
  // DIDs and collections whose interned ids are remembered in memory; when the cache is full it
  // starts again empty, so memory stays bounded however many DIDs a job sees.
  size_t intern_cache_entries = 1 << 20;
  // The clock for indexed_at, unix microseconds. Empty: the system clock. Tests pass a fake.
  std::function<int64_t()> now_us;
  // Where the sink says, one line each, what keeps a job waiting as it opens: an upgrade of tables
  // written by an older atfill (a large table's upgrade rewrites it, which takes minutes) and its
  // end, or another process's creation or upgrade of them. Empty: nothing is said.
  std::function<void(std::string_view line)> log;

  Status Validate() const;
};

// Connects, creates (or migrates) the schema, and returns a Sink writing to it. Opening several
// sinks on one database at once is safe (the schema is created once, under an advisory lock).
// A server that cannot be reached within connect_timeout_ms is Unavailable; a server older than
// PostgreSQL 13 or whose encoding is neither UTF8 nor SQL_ASCII is Unsupported.
//
// pipeline::Sink::Write here:
//  * applies the write rules of pipeline/sink.hpp exactly as the SQLite sink does (the same
//    WriteStats, counted the same way) in one transaction per batch: the batch's records go to
//    the server in one binary COPY into a temporary staging table; one INSERT ... ON CONFLICT DO
//    NOTHING from it writes every new row; rows that already existed (read back in one query),
//    URIs seen more than once in the batch, and the rows account purges and resyncs touch are
//    decided by the rules in event order and the net changes applied set-based (a second COPY,
//    then at most one DELETE, UPDATE and INSERT). Returns once the batch is committed;
//  * an event missing its did, collection or rkey, a create/update without a valid CID or body,
//    or text PostgreSQL cannot store (not UTF-8, or holding a NUL byte) is Invalid, naming the
//    event's index and URI; nothing is sent;
//  * a server that is down, restarting or unreachable, a connection lost mid-batch, a lock held
//    past lock_timeout_ms, a full disk, too many connections, a read-only standby, or conflicts
//    past conflict_retries are Unavailable with nothing applied (the transaction is rolled back
//    by the server). The next Write reconnects (a connection found dead at the start of a Write
//    is replaced within the same Write). One exception: a connection lost during the COMMIT
//    leaves the outcome unknown (Unavailable saying so); writing the batch again is harmless.
//    Other server errors are IoError naming the SQLSTATE.
// The tables may be read concurrently (PostgresReader, psql). Sinks on one database each write in
// their own transactions; sharded processes (disjoint DIDs) never wait for each other except when
// two intern the same new collection at once.
Result<std::unique_ptr<pipeline::Sink>> OpenPostgresSink(const PostgresSinkOptions& options);

}  // namespace atfill::sinks
