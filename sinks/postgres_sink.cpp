#include "sinks/postgres_sink.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/clock.hpp"
#include "sinks/event_checks.hpp"
#include "sinks/intern_cache.hpp"
#include "sinks/postgres_schema.hpp"
#include "sinks/postgres_util.hpp"

namespace atfill::sinks {
namespace {

using pg::Clock;
using pg::Failure;
using pg::PgResult;
using pipeline::AccountEvent;
using pipeline::Event;
using pipeline::Operation;
using pipeline::RecordEvent;
using pipeline::WriteStats;

constexpr uint32_t kNoSlot = UINT32_MAX;

// One URI the batch touches (a record event whose account and collection have ids).
struct Slot {
  int64_t did_id = 0;
  int32_t collection_id = 0;
  uint32_t first = 0;  // index of its first event in the batch
  // The first event is a create/update: the insert of new rows tried it.
  bool staged_write = false;
  // The insert skipped it (a row was already there), or (first event a delete) it was read back.
  bool read_back = false;
  bool stored_exists = false;
  std::string stored_cid;
  std::string stored_rev;
};

// A row as the rules see it while the batch is applied.
struct RowState {
  bool exists = false;
  // The event whose cid, body and created_at the row holds; -1: the row as it was stored.
  int64_t content = -1;
  std::string_view cid;
  std::string_view rev;
};

struct SlotKey {
  int64_t did_id;
  int32_t collection_id;
  std::string_view rkey;
  friend bool operator==(const SlotKey&, const SlotKey&) = default;
};

struct SlotKeyHash {
  size_t operator()(const SlotKey& k) const {
    const size_t h = std::hash<std::string_view>()(k.rkey);
    return h ^ (static_cast<size_t>(k.did_id) * 0x9E3779B97F4A7C15ULL) ^
           (static_cast<size_t>(k.collection_id) << 32);
  }
};

// An interned table's names the batch needs and the cache does not know.
struct Pending {
  int64_t id = 0;
  bool insert = false;  // a create/update names it: intern it when missing
};

// The statements of one interned table.
struct InternTable {
  const char* statement;  // the prepared intern statement's name
  InternCache cache;
  std::unordered_map<std::string_view, Pending> pending;
};

// Temporary tables of the sink's session: emptied at every commit, invisible to other sessions.
constexpr const char* kSessionSql = R"sql(
CREATE TEMPORARY TABLE atfill_stage(
  slot integer NOT NULL,
  did_id bigint NOT NULL,
  collection_id integer NOT NULL,
  rkey text COLLATE "C" NOT NULL,
  w boolean NOT NULL,
  cid text COLLATE "C",
  rev text COLLATE "C",
  created_at text,
  record text,
  collection text COLLATE "C" NOT NULL) ON COMMIT DELETE ROWS;
CREATE TEMPORARY TABLE atfill_net(
  did_id bigint NOT NULL,
  collection_id integer NOT NULL,
  rkey text COLLATE "C" NOT NULL,
  action text COLLATE "C" NOT NULL,
  expect_cid text COLLATE "C",
  expect_rev text COLLATE "C",
  cid text COLLATE "C",
  rev text COLLATE "C",
  created_at text,
  record text,
  collection text COLLATE "C" NOT NULL) ON COMMIT DELETE ROWS;
)sql";

constexpr const char* kCopyStage = "COPY pg_temp.atfill_stage FROM STDIN (FORMAT binary)";
constexpr const char* kCopyNet = "COPY pg_temp.atfill_net FROM STDIN (FORMAT binary)";

// One batch, in one READ COMMITTED transaction:
//  1. the DIDs and collections the cache does not know are interned (one statement each);
//  2. each URI the batch touches becomes a slot; one binary COPY stages the slots in key order,
//     with the first event's row when that event is a create/update;
//  3. INSERT ... SELECT ... ON CONFLICT DO NOTHING writes those rows: a backfill's batch is done
//     here but for the commit. When the insert skipped URIs (rows already there), or a URI's first
//     event is a delete, one query reads the stored cid and rev of every URI the insert did not
//     write;
//  4. the rules of pipeline/sink.hpp run here, in event order, over those rows (exactly what
//     SqliteSink does per event, so the WriteStats match). An INSERT ... ON CONFLICT DO UPDATE
//     WHERE <rev guard> cannot do this part: its RETURNING sees only the new row, so it cannot
//     tell updated from unchanged from stale, and it applies one event per URI per statement.
//     Account purges and resyncs remove the rows the batch touches here, and the DID's other rows
//     (which no event of the batch reaches) with one DELETE at the event's place;
//  5. the net change of each slot (insert, full update, rev raise, delete) goes in a second COPY
//     and at most one INSERT, UPDATE and DELETE, each requiring the row to be as it was read:
//     a row another writer changed in between makes the batch a conflict, retried whole.
// Nothing is locked between steps 3 and 5 (sharded processes write disjoint rows); the checks in
// 5 and the unique key catch the writers that do meet.
class PostgresSink final : public pipeline::Sink {
 public:
  static Result<std::unique_ptr<pipeline::Sink>> Open(const PostgresSinkOptions& options);

  Result<WriteStats> Write(std::span<const Event> batch) override;
  std::string_view name() const override { return "postgres"; }

 private:
  explicit PostgresSink(PostgresSinkOptions options)
      : options_(std::move(options)),
        server_(pg::DescribeConninfo(options_.conninfo)),
        dids_{"atfill_intern_dids", InternCache(options_.intern_cache_entries), {}},
        collections_{"atfill_intern_collections", InternCache(options_.intern_cache_entries), {}} {}

  std::string Table(const char* name) const { return pg::QualifiedName(options_.schema, name); }

  // Connects (retrying with backoff until `deadline`), migrating the schema when `migrate`.
  Status Connect(Clock::time_point deadline, bool migrate);
  Status ConnectOnce(Clock::time_point deadline, bool migrate);
  // The session's settings, temporary tables and prepared statements.
  Status SetUpSession();
  Status CheckBatch(std::span<const Event> batch);

  Status WriteOnce(std::span<const Event> batch, int64_t now, WriteStats* stats);
  Status ResolveIds(std::span<const Event> batch);
  Status Intern(InternTable& table);
  void BuildSlots(std::span<const Event> batch);
  Status StageAndInsertNew(std::span<const Event> batch, int64_t now);
  Status ApplyInOrder(std::span<const Event> batch, WriteStats* stats);
  Status ApplyAccount(std::span<const Event> batch, const AccountEvent& a, int64_t did_id,
                      WriteStats* stats);
  Status ApplyNet(std::span<const Event> batch, int64_t now);
  // Removes the DID's rows the batch does not touch (the rules decide the others); the count.
  Result<uint64_t> RemoveUntouched(int64_t did_id, const std::vector<int32_t>* collection_ids,
                                   const std::string& before_rev);
  Result<std::vector<int32_t>> MatchingCollections(const std::vector<std::string>& patterns);
  Status Conflict(std::string message);
  // After a failed attempt: rolls back what the server still holds, forgets interned ids.
  void AbandonAttempt();

  PostgresSinkOptions options_;
  std::string server_;
  pg::Conn conn_;
  Failure failure_ = Failure::kNone;
  // The attempt failed at its first statement: the connection was already dead.
  bool dead_before_batch_ = false;
  // The attempt failed at its COMMIT.
  bool committing_ = false;
  InternTable dids_;
  InternTable collections_;

  // Per batch (kept across batches to reuse their memory).
  std::vector<std::string> cids_;  // the CID text of each create/update, by event index
  std::vector<int64_t> did_ids_;   // by event index; 0: unknown (nothing stored)
  std::vector<int32_t> collection_ids_;
  std::vector<uint32_t> slot_of_;  // by event index; kNoSlot when nothing can be stored
  std::vector<Slot> slots_;
  std::vector<uint32_t> stage_order_;  // slots in key order
  std::unordered_map<SlotKey, uint32_t, SlotKeyHash> slot_index_;
  std::vector<RowState> physical_;  // each slot's row as the table holds it now
  std::vector<RowState> current_;   // each slot's row as the rules have it so far
  std::unordered_map<int64_t, std::vector<uint32_t>> slots_of_did_;
  std::optional<std::vector<std::pair<int32_t, std::string>>> all_collections_;
  pg::CopyWriter copy_;
  std::string array_a_, array_b_;
};

Result<std::unique_ptr<pipeline::Sink>> PostgresSink::Open(const PostgresSinkOptions& options) {
  std::unique_ptr<PostgresSink> sink(new PostgresSink(options));
  ATFILL_RETURN_IF_ERROR(
      sink->Connect(Clock::now() + std::chrono::milliseconds(options.connect_timeout_ms), true));
  return std::unique_ptr<pipeline::Sink>(std::move(sink));
}

Status PostgresSink::Connect(Clock::time_point deadline, bool migrate) {
  auto backoff = std::chrono::milliseconds(20);
  for (;;) {
    Status st = ConnectOnce(deadline, migrate);
    if (st.ok()) return st;
    conn_.reset();
    if (st.code() != StatusCode::kUnavailable) return st;
    const auto remaining =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    // No attempt is left that could have a chance: report why the last one failed (an attempt
    // started at the deadline would only say it timed out).
    if (remaining <= backoff) {
      return st.WithContext("cannot reach PostgreSQL at " + server_ + " in the connect timeout (" +
                            std::to_string(options_.connect_timeout_ms) + " ms)");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

Status PostgresSink::ConnectOnce(Clock::time_point deadline, bool migrate) {
  ATFILL_ASSIGN_OR_RETURN(conn_, pg::Connect(options_.conninfo, deadline));
  PGconn* c = conn_.get();
  if (PQserverVersion(c) < 130000) {
    return Status::Unsupported("PostgreSQL " + std::to_string(PQserverVersion(c)) + " at " +
                               pg::Describe(c) + " is too old; atfill needs 13 or newer");
  }
  const char* encoding = PQparameterStatus(c, "server_encoding");
  const std::string_view enc = encoding == nullptr ? "" : encoding;
  if (enc != "UTF8" && enc != "SQL_ASCII") {
    return Status::Unsupported("database " + pg::Describe(c) + " is encoded in " +
                               std::string(enc) +
                               "; atfill stores records as UTF-8 text and needs a UTF8 database");
  }
  if (migrate) {
    // Says in options_.log what the job waits for here: an upgrade may rewrite the record table.
    Status st = pg::MigrateSchema(c, options_.schema, options_.log);
    if (!st.ok()) return st.WithContext("schema " + options_.schema + " of " + pg::Describe(c));
  }
  return SetUpSession();
}

Status PostgresSink::SetUpSession() {
  PGconn* c = conn_.get();
  // temp_buffers must be set before the session's first temporary table. JIT compilation would
  // cost more than any of these statements takes.
  const std::string settings = "SET lock_timeout = " + std::to_string(options_.lock_timeout_ms) +
                               "; SET temp_buffers = '64MB'; SET jit = off";
  ATFILL_RETURN_IF_ERROR(pg::Exec(c, settings.c_str(), nullptr));
  ATFILL_RETURN_IF_ERROR(pg::Exec(c, kSessionSql, nullptr));

  const std::string rows = Table("atfill_record_rows");
  auto prepare = [&](const char* name, const std::string& sql, int n_params) -> Status {
    PgResult r(PQprepare(c, name, sql.c_str(), n_params, nullptr));
    if (r == nullptr || PQresultStatus(r.get()) != PGRES_COMMAND_OK) {
      return pg::ResultError(c, r.get(), std::string("preparing ") + name, nullptr);
    }
    return Status::OK();
  };
  // $1: every name the batch needs and the cache lacks; $2: those to create when missing. The
  // inserts go in one order in every process, so two interning the same new names never deadlock.
  auto intern_sql = [&](const char* table, const char* column) {
    const std::string t = Table(table);
    return std::string("WITH found AS (SELECT id, ") + column + " AS k FROM " + t + " WHERE " +
           column + " = ANY($1::text[])), ins AS (INSERT INTO " + t + "(" + column +
           ") SELECT u.k FROM unnest($2::text[]) AS u(k) WHERE u.k NOT IN (SELECT k FROM found) "
           "ORDER BY u.k COLLATE \"C\" ON CONFLICT (" +
           column + ") DO NOTHING RETURNING id, " + column +
           " AS k) SELECT id, k FROM found UNION ALL SELECT id, k FROM ins";
  };
  ATFILL_RETURN_IF_ERROR(prepare(dids_.statement, intern_sql("atfill_dids", "did"), 2));
  ATFILL_RETURN_IF_ERROR(
      prepare(collections_.statement, intern_sql("atfill_collections", "nsid"), 2));
  // Every new row in one statement. The stage holds the batch's rows in the primary key's order,
  // so the key takes them as a run per collection (near its right edge when record keys are TIDs).
  ATFILL_RETURN_IF_ERROR(prepare(
      "atfill_insert_new",
      "WITH ins AS (INSERT INTO " + rows +
          " (did_id, collection_id, rkey, cid, rev, indexed_at, created_at, record, collection) "
          "SELECT did_id, collection_id, rkey, cid, rev, $1::bigint, created_at, record, "
          "collection FROM pg_temp.atfill_stage WHERE w ON CONFLICT (did_id, collection_id, rkey) "
          "DO NOTHING "
          "RETURNING 1) SELECT count(*) FROM ins",
      1));
  // Only when the insert skipped some rows, or a URI's first event is a delete: the stored cid
  // and rev of each URI the insert did not write (the rows this transaction wrote have its xid).
  // LIMIT 1 keeps each lookup a probe of the primary key.
  ATFILL_RETURN_IF_ERROR(prepare(
      "atfill_read_stored",
      "SELECT s.slot, x.cid, x.rev FROM pg_temp.atfill_stage s LEFT JOIN LATERAL (SELECT y.cid, "
      "y.rev, y.xmin = pg_current_xact_id()::xid AS mine FROM " +
          rows +
          " y WHERE y.did_id = s.did_id AND y.collection_id = s.collection_id AND y.rkey = s.rkey "
          "LIMIT 1) x ON true WHERE x.mine IS NOT TRUE",
      0));
  // By account through (did_epoch, did_id, ...): one probe per block of rows (schema version 5).
  ATFILL_RETURN_IF_ERROR(prepare(
      "atfill_remove_untouched",
      "DELETE FROM " + rows + " r USING " + Table("atfill_record_epochs") +
          " e WHERE r.did_epoch = e.epoch AND r.did_id = $1::bigint AND ($2::integer[] IS NULL OR "
          "r.collection_id = "
          "ANY($2::integer[])) AND ($3::text IS NULL OR r.rev IS NULL OR r.rev < $3::text) AND "
          "NOT EXISTS (SELECT 1 FROM pg_temp.atfill_stage s WHERE s.did_id = r.did_id AND "
          "s.collection_id = r.collection_id AND s.rkey = r.rkey)",
      3));
  ATFILL_RETURN_IF_ERROR(
      prepare("atfill_list_collections", "SELECT id, nsid FROM " + Table("atfill_collections"), 0));
  // The net changes; each row must still be as the batch read it (else another writer got in
  // between: a conflict, and the batch is tried again).
  const std::string same_row =
      " AND r.did_id = n.did_id AND r.collection_id = n.collection_id AND r.rkey = n.rkey AND "
      "r.cid = n.expect_cid AND r.rev IS NOT DISTINCT FROM n.expect_rev";
  ATFILL_RETURN_IF_ERROR(prepare(
      "atfill_net_delete",
      "DELETE FROM " + rows + " r USING pg_temp.atfill_net n WHERE n.action = 'd'" + same_row, 0));
  ATFILL_RETURN_IF_ERROR(prepare(
      "atfill_net_update",
      "UPDATE " + rows +
          " r SET cid = COALESCE(n.cid, r.cid), rev = n.rev, indexed_at = CASE WHEN n.action = "
          "'u' THEN $1::bigint ELSE r.indexed_at END, created_at = CASE WHEN n.action = 'u' THEN "
          "n.created_at ELSE r.created_at END, record = COALESCE(n.record, r.record) FROM "
          "pg_temp.atfill_net n WHERE n.action IN ('u', 'r')" +
          same_row,
      1));
  ATFILL_RETURN_IF_ERROR(
      prepare("atfill_net_insert",
              "INSERT INTO " + rows +
                  " (did_id, collection_id, rkey, cid, rev, indexed_at, created_at, record, "
                  "collection) SELECT did_id, collection_id, rkey, cid, rev, $1::bigint, "
                  "created_at, record, collection FROM pg_temp.atfill_net WHERE action = 'i'",
              1));
  return Status::OK();
}

Status PostgresSink::CheckBatch(std::span<const Event> batch) {
  cids_.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    if (const auto* r = std::get_if<RecordEvent>(&batch[i])) {
      ATFILL_RETURN_IF_ERROR(CheckRecordEvent(*r, i));
      const char* bad = nullptr;
      if (!pg::IsStorableText(r->did)) bad = "did";
      if (!pg::IsStorableText(r->collection)) bad = "collection";
      if (!pg::IsStorableText(r->rkey)) bad = "rkey";
      if (!pg::IsStorableText(r->rev)) bad = "rev";
      if (!pg::IsStorableText(r->created_at)) bad = "created_at";
      if (!pg::IsStorableText(r->body)) bad = "record body";
      if (bad != nullptr) {
        return Status::Invalid("event " + std::to_string(i) + " (" +
                               std::string(pipeline::OperationName(r->operation)) + " " + r->Uri() +
                               "): the " + bad +
                               " is not UTF-8 text without NUL bytes, which PostgreSQL cannot "
                               "store as text");
      }
      if (r->operation != Operation::kDelete) cids_[i] = r->cid.ToString();
    } else {
      const auto& a = std::get<AccountEvent>(batch[i]);
      ATFILL_RETURN_IF_ERROR(CheckAccountEvent(a, i));
      if (!pg::IsStorableText(a.did) || !pg::IsStorableText(a.purge_before_rev)) {
        return Status::Invalid("event " + std::to_string(i) + " (account " + a.did +
                               "): the did or purge_before_rev is not UTF-8 text without NUL "
                               "bytes, which PostgreSQL cannot store as text");
      }
    }
  }
  return Status::OK();
}

Result<WriteStats> PostgresSink::Write(std::span<const Event> batch) {
  WriteStats stats;
  if (batch.empty()) return stats;
  ATFILL_RETURN_IF_ERROR(CheckBatch(batch));
  const int64_t now = options_.now_us ? options_.now_us() : SystemNowUs();
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(options_.connect_timeout_ms);
  int conflicts = 0;
  bool replaced_dead_connection = false;
  for (;;) {
    if (conn_ == nullptr) {
      Status st = Connect(deadline, false);
      if (!st.ok()) {
        if (st.code() != StatusCode::kUnavailable) return st;
        return Status::Unavailable(st.message() + "; nothing of the batch was written");
      }
    }
    failure_ = Failure::kNone;
    dead_before_batch_ = false;
    committing_ = false;
    stats = WriteStats{};
    Status st = WriteOnce(batch, now, &stats);
    if (st.ok()) return stats;
    AbandonAttempt();
    switch (failure_) {
      case Failure::kConnection:
        conn_.reset();
        // Dead before the batch began (the server restarted since the last batch): a new
        // connection gets its chance within this Write.
        if (dead_before_batch_ && !replaced_dead_connection) {
          replaced_dead_connection = true;
          continue;
        }
        if (committing_) {
          // The commit may have happened before the connection went: writing the batch again
          // is harmless (the rules are idempotent).
          return Status::Unavailable("lost the connection to PostgreSQL at " + server_ +
                                     " while committing (" + st.message() +
                                     "); the batch may or may not be written");
        }
        return Status::Unavailable("lost the connection to PostgreSQL at " + server_ + " (" +
                                   st.message() +
                                   "); nothing of the batch was written (rolled back)");
      case Failure::kConflict:
        if (conflicts++ < options_.conflict_retries) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5 << std::min(conflicts, 6)));
          continue;
        }
        return Status::Unavailable(
            "the batch kept conflicting with other writers of PostgreSQL at " + server_ + " (" +
            st.message() + "); nothing of the batch was written");
      case Failure::kTransient:
        return Status::Unavailable("PostgreSQL at " + server_ + ": " + st.message() +
                                   "; nothing of the batch was written");
      case Failure::kNone:
      case Failure::kOther:
        return st.WithContext("PostgreSQL at " + server_);
    }
  }
}

void PostgresSink::AbandonAttempt() {
  if (conn_ != nullptr && PQstatus(conn_.get()) == CONNECTION_OK &&
      PQtransactionStatus(conn_.get()) != PQTRANS_IDLE) {
    Failure ignored = Failure::kNone;
    // Nothing more to undo if this fails: the server rolls back a transaction whose connection
    // goes away, and the batch's error is the one reported.
    (void)pg::Exec(conn_.get(), "ROLLBACK", &ignored);
    if (PQtransactionStatus(conn_.get()) != PQTRANS_IDLE) conn_.reset();
  }
  if (conn_ != nullptr && PQstatus(conn_.get()) != CONNECTION_OK) conn_.reset();
  // An id interned by the rolled-back transaction no longer exists; the caches may hold some.
  dids_.cache.Clear();
  collections_.cache.Clear();
}

Status PostgresSink::Conflict(std::string message) {
  failure_ = Failure::kConflict;
  return Status::Unavailable(std::move(message));
}

Status PostgresSink::WriteOnce(std::span<const Event> batch, int64_t now, WriteStats* stats) {
  {
    Status st = pg::Exec(conn_.get(), "BEGIN", &failure_);
    if (!st.ok()) {
      dead_before_batch_ = failure_ == Failure::kConnection;
      return st;
    }
  }
  all_collections_.reset();
  ATFILL_RETURN_IF_ERROR(ResolveIds(batch));
  BuildSlots(batch);
  ATFILL_RETURN_IF_ERROR(StageAndInsertNew(batch, now));
  ATFILL_RETURN_IF_ERROR(ApplyInOrder(batch, stats));
  ATFILL_RETURN_IF_ERROR(ApplyNet(batch, now));
  committing_ = true;
  return pg::Exec(conn_.get(), "COMMIT", &failure_);
}

Status PostgresSink::ResolveIds(std::span<const Event> batch) {
  did_ids_.assign(batch.size(), 0);
  collection_ids_.assign(batch.size(), 0);
  dids_.pending.clear();
  collections_.pending.clear();
  auto need = [](InternTable& t, std::string_view name, bool insert) -> int64_t {
    if (std::optional<int64_t> id = t.cache.Find(name)) return *id;
    Pending& p = t.pending[name];
    p.insert = p.insert || insert;
    return 0;
  };
  for (size_t i = 0; i < batch.size(); ++i) {
    if (const auto* r = std::get_if<RecordEvent>(&batch[i])) {
      // A delete never interns: a name nobody wrote has no rows to delete.
      const bool write = r->operation != Operation::kDelete;
      did_ids_[i] = need(dids_, r->did, write);
      collection_ids_[i] = static_cast<int32_t>(need(collections_, r->collection, write));
    } else {
      const auto& a = std::get<AccountEvent>(batch[i]);
      if (a.resync || pipeline::StatusPurgesRecords(a.status))
        did_ids_[i] = need(dids_, a.did, false);
    }
  }
  ATFILL_RETURN_IF_ERROR(Intern(dids_));
  ATFILL_RETURN_IF_ERROR(Intern(collections_));
  if (dids_.pending.empty() && collections_.pending.empty()) return Status::OK();
  auto resolve = [](InternTable& t, std::string_view name) -> int64_t {
    auto it = t.pending.find(name);
    return it == t.pending.end() ? 0 : it->second.id;
  };
  for (size_t i = 0; i < batch.size(); ++i) {
    if (const auto* r = std::get_if<RecordEvent>(&batch[i])) {
      if (did_ids_[i] == 0) did_ids_[i] = resolve(dids_, r->did);
      if (collection_ids_[i] == 0) {
        collection_ids_[i] = static_cast<int32_t>(resolve(collections_, r->collection));
      }
    } else if (did_ids_[i] == 0) {
      did_ids_[i] = resolve(dids_, std::get<AccountEvent>(batch[i]).did);
    }
  }
  return Status::OK();
}

Status PostgresSink::Intern(InternTable& table) {
  // A name another connection is inserting at this moment is not returned (it waits for that
  // transaction, then skips it); the next round's snapshot sees it committed.
  for (int round = 0; round < 3; ++round) {
    array_a_ = "{";
    array_b_ = "{";
    for (const auto& [name, p] : table.pending) {
      if (p.id != 0) continue;
      pg::AppendArrayElement(&array_a_, name);
      if (p.insert) pg::AppendArrayElement(&array_b_, name);
    }
    if (array_a_.size() == 1) return Status::OK();
    if (round > 0 && array_b_.size() == 1) return Status::OK();  // what is left is not stored
    array_a_ += '}';
    array_b_ += '}';
    const char* params[] = {array_a_.c_str(), array_b_.c_str()};
    ATFILL_ASSIGN_OR_RETURN(PgResult r,
                            pg::RunPrepared(conn_.get(), table.statement, 2, params, &failure_));
    const int n = PQntuples(r.get());
    for (int row = 0; row < n; ++row) {
      const std::string_view id_text = pg::Cell(r.get(), row, 0);
      int64_t id = 0;
      std::from_chars(id_text.data(), id_text.data() + id_text.size(), id);
      auto it = table.pending.find(pg::Cell(r.get(), row, 1));
      if (it == table.pending.end() || id <= 0) {
        failure_ = Failure::kOther;
        return Status::Internal("interning returned a name that was not asked for");
      }
      it->second.id = id;
      if (!table.cache.Find(it->first)) table.cache.Add(it->first, id);
    }
    bool missing = false;
    for (const auto& [name, p] : table.pending) missing = missing || (p.insert && p.id == 0);
    if (!missing) return Status::OK();
  }
  return Conflict("another connection kept interning the same names");
}

void PostgresSink::BuildSlots(std::span<const Event> batch) {
  slot_of_.assign(batch.size(), kNoSlot);
  slots_.clear();
  slot_index_.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto* r = std::get_if<RecordEvent>(&batch[i]);
    if (r == nullptr || did_ids_[i] == 0 || collection_ids_[i] == 0) continue;
    auto [it, added] = slot_index_.try_emplace(SlotKey{did_ids_[i], collection_ids_[i], r->rkey},
                                               static_cast<uint32_t>(slots_.size()));
    if (added) {
      Slot& s = slots_.emplace_back();
      s.did_id = did_ids_[i];
      s.collection_id = collection_ids_[i];
      s.first = static_cast<uint32_t>(i);
      s.staged_write = r->operation != Operation::kDelete;
    }
    slot_of_[i] = it->second;
  }
}

Status PostgresSink::StageAndInsertNew(std::span<const Event> batch, int64_t now) {
  if (slots_.empty()) return Status::OK();
  // The primary key's order, (collection_id, rkey, did_id) (rkeys as bytes, like the "C"
  // collation).
  stage_order_.resize(slots_.size());
  for (size_t s = 0; s < slots_.size(); ++s) stage_order_[s] = static_cast<uint32_t>(s);
  auto rkey = [&](uint32_t s) -> std::string_view {
    return std::get<RecordEvent>(batch[slots_[s].first]).rkey;
  };
  std::sort(stage_order_.begin(), stage_order_.end(), [&](uint32_t x, uint32_t y) {
    const Slot& a = slots_[x];
    const Slot& b = slots_[y];
    if (a.collection_id != b.collection_id) return a.collection_id < b.collection_id;
    if (const int c = rkey(x).compare(rkey(y)); c != 0) return c < 0;
    return a.did_id < b.did_id;
  });
  uint64_t staged_writes = 0;
  copy_.Reset();
  for (const uint32_t s : stage_order_) {
    const Slot& slot = slots_[s];
    const auto& r = std::get<RecordEvent>(batch[slot.first]);
    staged_writes += slot.staged_write ? 1 : 0;
    copy_.BeginRow(10);
    copy_.Int4(static_cast<int32_t>(s));
    copy_.Int8(slot.did_id);
    copy_.Int4(slot.collection_id);
    copy_.Text(r.rkey);
    copy_.Bool(slot.staged_write);
    if (slot.staged_write) {
      copy_.Text(cids_[slot.first]);
      copy_.TextOrNull(r.rev);
      copy_.TextOrNull(r.created_at);
      copy_.Text(r.body);
    } else {
      copy_.Null();
      copy_.Null();
      copy_.Null();
      copy_.Null();
    }
    copy_.Text(r.collection);
  }
  ATFILL_RETURN_IF_ERROR(copy_.Send(conn_.get(), kCopyStage, "staging the batch", &failure_));

  const std::string now_text = std::to_string(now);
  const char* params[] = {now_text.c_str()};
  {
    ATFILL_ASSIGN_OR_RETURN(
        PgResult r, pg::RunPrepared(conn_.get(), "atfill_insert_new", 1, params, &failure_));
    uint64_t inserted = 0;
    const std::string_view text = pg::Cell(r.get(), 0, 0);
    std::from_chars(text.data(), text.data() + text.size(), inserted);
    if (inserted == staged_writes) {
      // Every URI whose first event is a create/update is new; the others have no stored row
      // unless some URI's first event is a delete.
      if (staged_writes == slots_.size()) return Status::OK();
    }
  }
  ATFILL_ASSIGN_OR_RETURN(
      PgResult r, pg::RunPrepared(conn_.get(), "atfill_read_stored", 0, nullptr, &failure_));
  const int n = PQntuples(r.get());
  for (int row = 0; row < n; ++row) {
    const std::string_view slot_text = pg::Cell(r.get(), row, 0);
    uint32_t s = 0;
    std::from_chars(slot_text.data(), slot_text.data() + slot_text.size(), s);
    if (s >= slots_.size()) {
      failure_ = Failure::kOther;
      return Status::Internal("the staged rows came back with an unknown slot");
    }
    Slot& slot = slots_[s];
    slot.read_back = true;
    slot.stored_exists = !PQgetisnull(r.get(), row, 1);
    if (slot.stored_exists) {
      slot.stored_cid = pg::Cell(r.get(), row, 1);
      slot.stored_rev = pg::Cell(r.get(), row, 2);
    } else if (slot.staged_write) {
      // The insert skipped the URI for a row that is gone now: another connection deleted it.
      return Conflict("a row changed while the batch was being written");
    }
  }
  return Status::OK();
}

// What a create/update does to a row, as SqliteSink decides it.
void ApplyWriteRule(const RecordEvent& e, int64_t index, std::string_view cid, RowState* row,
                    WriteStats* stats) {
  if (!row->exists) {
    *row = RowState{true, index, cid, e.rev};
    ++stats->inserted;
    return;
  }
  const bool has_rev = !e.rev.empty();
  const bool stored_has_rev = !row->rev.empty();
  if (has_rev && stored_has_rev && row->rev > e.rev) {
    ++stats->stale;
  } else if (row->cid == cid) {
    // Raising the stored rev keeps a later delete between the two revs stale.
    if (has_rev && (!stored_has_rev || e.rev > row->rev)) row->rev = e.rev;
    ++stats->unchanged;
  } else if (!has_rev && stored_has_rev) {
    ++stats->stale;
  } else {
    *row = RowState{true, index, cid, e.rev};
    ++stats->updated;
  }
}

Status PostgresSink::ApplyInOrder(std::span<const Event> batch, WriteStats* stats) {
  physical_.assign(slots_.size(), RowState{});
  current_.assign(slots_.size(), RowState{});
  for (size_t s = 0; s < slots_.size(); ++s) {
    const Slot& slot = slots_[s];
    if (slot.staged_write && !slot.read_back) {
      // New: the insert wrote the first event; the rules start from no row.
      const auto& r = std::get<RecordEvent>(batch[slot.first]);
      physical_[s] = RowState{true, slot.first, cids_[slot.first], r.rev};
    } else if (slot.stored_exists) {
      physical_[s] = RowState{true, -1, slot.stored_cid, slot.stored_rev};
      current_[s] = physical_[s];
    }
  }
  slots_of_did_.clear();
  bool indexed_dids = false;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (const auto* r = std::get_if<RecordEvent>(&batch[i])) {
      const uint32_t s = slot_of_[i];
      if (s == kNoSlot) continue;  // a delete of a row that cannot exist
      RowState& row = current_[s];
      if (r->operation != Operation::kDelete) {
        ApplyWriteRule(*r, static_cast<int64_t>(i), cids_[i], &row, stats);
      } else if (row.exists) {
        if (!r->rev.empty() && !row.rev.empty() && row.rev > r->rev) {
          ++stats->stale;
        } else {
          row = RowState{};
          ++stats->deleted;
        }
      }
      continue;
    }
    const auto& a = std::get<AccountEvent>(batch[i]);
    if (!a.resync && !pipeline::StatusPurgesRecords(a.status)) continue;
    ++(a.resync ? stats->resyncs : stats->purged_accounts);
    if (did_ids_[i] == 0) continue;  // an account never stored has no rows
    if (!indexed_dids) {
      for (size_t s = 0; s < slots_.size(); ++s) {
        slots_of_did_[slots_[s].did_id].push_back(static_cast<uint32_t>(s));
      }
      indexed_dids = true;
    }
    Status st = ApplyAccount(batch, a, did_ids_[i], stats);
    if (!st.ok()) return st.WithContext("event " + std::to_string(i) + " (account " + a.did + ")");
  }
  return Status::OK();
}

Status PostgresSink::ApplyAccount(std::span<const Event> batch, const AccountEvent& a,
                                  int64_t did_id, WriteStats* stats) {
  const bool filtered = a.resync && !a.resync_collections.empty();
  const std::string& before = a.purge_before_rev;
  auto removes = [&](const RowState& row) {
    return row.exists && (before.empty() || row.rev.empty() || row.rev < before);
  };
  uint64_t removed = 0;
  // The rows the batch touches: by the rules, as they are at this point of the batch.
  auto it = slots_of_did_.find(did_id);
  if (it != slots_of_did_.end()) {
    for (const uint32_t s : it->second) {
      RowState& row = current_[s];
      if (!removes(row)) continue;
      if (filtered) {
        const auto& first = std::get<RecordEvent>(batch[slots_[s].first]);
        if (!pipeline::CollectionMatches(first.collection, a.resync_collections)) continue;
      }
      row = RowState{};
      ++removed;
    }
  }
  // The others, in the table: no event of the batch reaches them, so removing them now is the
  // same as at this event's place in the batch.
  std::vector<int32_t> ids;
  if (filtered) {
    ATFILL_ASSIGN_OR_RETURN(ids, MatchingCollections(a.resync_collections));
  }
  if (!filtered || !ids.empty()) {
    ATFILL_ASSIGN_OR_RETURN(uint64_t n, RemoveUntouched(did_id, filtered ? &ids : nullptr, before));
    removed += n;
  }
  (a.resync ? stats->resynced_records : stats->purged_records) += removed;
  return Status::OK();
}

Result<std::vector<int32_t>> PostgresSink::MatchingCollections(
    const std::vector<std::string>& patterns) {
  if (!all_collections_) {
    ATFILL_ASSIGN_OR_RETURN(
        PgResult r, pg::RunPrepared(conn_.get(), "atfill_list_collections", 0, nullptr, &failure_));
    all_collections_.emplace();
    for (int row = 0; row < PQntuples(r.get()); ++row) {
      const std::string_view id_text = pg::Cell(r.get(), row, 0);
      int32_t id = 0;
      std::from_chars(id_text.data(), id_text.data() + id_text.size(), id);
      all_collections_->emplace_back(id, std::string(pg::Cell(r.get(), row, 1)));
    }
  }
  std::vector<int32_t> ids;
  for (const auto& [id, nsid] : *all_collections_) {
    if (pipeline::CollectionMatches(nsid, patterns)) ids.push_back(id);
  }
  return ids;
}

Result<uint64_t> PostgresSink::RemoveUntouched(int64_t did_id,
                                               const std::vector<int32_t>* collection_ids,
                                               const std::string& before_rev) {
  const std::string did_text = std::to_string(did_id);
  std::string ids_text;
  if (collection_ids != nullptr) {
    ids_text = "{";
    for (const int32_t id : *collection_ids) {
      if (ids_text.size() > 1) ids_text += ',';
      ids_text += std::to_string(id);
    }
    ids_text += '}';
  }
  const char* params[] = {did_text.c_str(), collection_ids != nullptr ? ids_text.c_str() : nullptr,
                          before_rev.empty() ? nullptr : before_rev.c_str()};
  ATFILL_ASSIGN_OR_RETURN(
      PgResult r, pg::RunPrepared(conn_.get(), "atfill_remove_untouched", 3, params, &failure_));
  return std::strtoull(PQcmdTuples(r.get()), nullptr, 10);
}

Status PostgresSink::ApplyNet(std::span<const Event> batch, int64_t now) {
  uint64_t deletes = 0, updates = 0, inserts = 0;
  copy_.Reset();
  for (size_t s = 0; s < slots_.size(); ++s) {
    const RowState& was = physical_[s];
    const RowState& row = current_[s];
    char action;
    if (was.exists && !row.exists) {
      action = 'd';
      ++deletes;
    } else if (!was.exists && row.exists) {
      action = 'i';
      ++inserts;
    } else if (was.exists && row.content != was.content) {
      action = 'u';
      ++updates;
    } else if (was.exists && row.rev != was.rev) {
      action = 'r';  // the same record with a newer rev
      ++updates;
    } else {
      continue;
    }
    const Slot& slot = slots_[s];
    const auto& key = std::get<RecordEvent>(batch[slot.first]);
    copy_.BeginRow(11);
    copy_.Int8(slot.did_id);
    copy_.Int4(slot.collection_id);
    copy_.Text(key.rkey);
    copy_.Text(std::string_view(&action, 1));
    if (was.exists) {
      copy_.Text(was.cid);
      copy_.TextOrNull(was.rev);
    } else {
      copy_.Null();
      copy_.Null();
    }
    if (action == 'i' || action == 'u') {
      const auto& e = std::get<RecordEvent>(batch[static_cast<size_t>(row.content)]);
      copy_.Text(row.cid);
      copy_.TextOrNull(row.rev);
      copy_.TextOrNull(e.created_at);
      copy_.Text(e.body);
    } else {
      copy_.Null();
      copy_.TextOrNull(row.rev);
      copy_.Null();
      copy_.Null();
    }
    copy_.Text(key.collection);
  }
  if (deletes + updates + inserts == 0) return Status::OK();
  ATFILL_RETURN_IF_ERROR(
      copy_.Send(conn_.get(), kCopyNet, "staging the batch's changes", &failure_));
  const std::string now_text = std::to_string(now);
  const char* params[] = {now_text.c_str()};
  auto run = [&](const char* statement, int n_params, uint64_t want) -> Status {
    if (want == 0) return Status::OK();
    ATFILL_ASSIGN_OR_RETURN(PgResult r,
                            pg::RunPrepared(conn_.get(), statement, n_params, params, &failure_));
    const uint64_t got = std::strtoull(PQcmdTuples(r.get()), nullptr, 10);
    if (got != want) {
      return Conflict(std::string(statement) + " changed " + std::to_string(got) + " rows of " +
                      std::to_string(want) + ": another writer changed them in between");
    }
    return Status::OK();
  };
  ATFILL_RETURN_IF_ERROR(run("atfill_net_delete", 0, deletes));
  ATFILL_RETURN_IF_ERROR(run("atfill_net_update", 1, updates));
  return run("atfill_net_insert", 1, inserts);
}

}  // namespace

Status PostgresSinkOptions::Validate() const {
  ATFILL_RETURN_IF_ERROR(pg::CheckConninfo(conninfo).WithContext("PostgresSinkOptions.conninfo"));
  if (schema.empty() || schema.size() > 63 || schema.find('\0') != std::string::npos) {
    return Status::Invalid(
        "PostgresSinkOptions.schema must be a name of 1 to 63 bytes without NUL, got '" + schema +
        "'");
  }
  if (connect_timeout_ms < 1 || connect_timeout_ms > INT_MAX) {
    return Status::Invalid("PostgresSinkOptions.connect_timeout_ms must be in [1, " +
                           std::to_string(INT_MAX) + "], got " +
                           std::to_string(connect_timeout_ms));
  }
  if (lock_timeout_ms < 1 || lock_timeout_ms > INT_MAX) {
    return Status::Invalid("PostgresSinkOptions.lock_timeout_ms must be in [1, " +
                           std::to_string(INT_MAX) + "], got " + std::to_string(lock_timeout_ms));
  }
  if (conflict_retries < 0 || conflict_retries > 100) {
    return Status::Invalid("PostgresSinkOptions.conflict_retries must be in [0, 100], got " +
                           std::to_string(conflict_retries));
  }
  if (intern_cache_entries == 0) {
    return Status::Invalid("PostgresSinkOptions.intern_cache_entries must be positive");
  }
  return Status::OK();
}

Result<std::unique_ptr<pipeline::Sink>> OpenPostgresSink(const PostgresSinkOptions& options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  auto sink = PostgresSink::Open(options);
  if (!sink.ok()) {
    return sink.status().WithContext("opening the PostgreSQL sink at " +
                                     pg::DescribeConninfo(options.conninfo));
  }
  return sink;
}

}  // namespace atfill::sinks
