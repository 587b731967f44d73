#include <chrono>
#include <utility>

#include "sinks/label_sinks.hpp"
#include "sinks/sqlite_util.hpp"

namespace atfill::sinks {
namespace {

using sqlite::Stmt;

// WITHOUT ROWID, keyed by subject first: the labels of a record or an account are one range of
// the key (the index by subject), and a label is found by (uri, src, val) for its upsert or its
// negation. A negation is a row too (neg = 1, with its cts), so that a label older than it that
// arrives later loses to it; the view leaves negations out. indexed_at is the database's clock at
// the write. The view compares exp_us with the query's clock (julianday has millisecond
// precision, enough for a label's expiry).
constexpr const char* kLabelTable = R"sql(
CREATE TABLE IF NOT EXISTS atfill_label_rows(
  uri TEXT NOT NULL,
  src TEXT NOT NULL,
  val TEXT NOT NULL,
  cid TEXT,
  cts TEXT NOT NULL,
  cts_us INTEGER NOT NULL,
  exp TEXT,
  exp_us INTEGER,
  indexed_at INTEGER NOT NULL,
  neg INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (uri, src, val)) WITHOUT ROWID;
)sql";

constexpr const char* kLabelView = R"sql(
CREATE VIEW IF NOT EXISTS atfill_labels(src, uri, cid, val, neg, cts, exp) AS
SELECT src, uri, cid, val, 0, cts, exp FROM atfill_label_rows
WHERE neg = 0
  AND (exp_us IS NULL
       OR exp_us > CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER));
)sql";

// A table made before negations were kept (no neg column: every row is a label) gets the column,
// and the view that reads it; in one IMMEDIATE transaction, so that the check and the change see
// the same table whoever else opens the file.
constexpr const char* kAddNeg = R"sql(
ALTER TABLE atfill_label_rows ADD COLUMN neg INTEGER NOT NULL DEFAULT 0;
DROP VIEW IF EXISTS atfill_labels;
)sql";

Status UpgradeAndCreateView(sqlite3* db, int64_t busy_timeout_ms) {
  ATFILL_RETURN_IF_ERROR(sqlite::ExecRetryingBusy(db, "BEGIN IMMEDIATE", busy_timeout_ms));
  Status st = [&]() -> Status {
    ATFILL_ASSIGN_OR_RETURN(
        Stmt has_neg,
        sqlite::Prepare(
            db, "SELECT count(*) FROM pragma_table_info('atfill_label_rows') WHERE name = 'neg'",
            false));
    const int rc = sqlite3_step(has_neg.get());
    if (rc != SQLITE_ROW) return sqlite::ErrorStatus(db, rc, "reading the label table's columns");
    if (sqlite3_column_int(has_neg.get(), 0) == 0) {
      ATFILL_RETURN_IF_ERROR(sqlite::Exec(db, kAddNeg));
    }
    return sqlite::Exec(db, kLabelView);
  }();
  if (st.ok()) st = sqlite::Exec(db, "COMMIT");
  if (!st.ok() && !sqlite3_get_autocommit(db)) (void)sqlite::Exec(db, "ROLLBACK");
  return st;
}

class SqliteLabelSink final : public pipeline::LabelSink {
 public:
  SqliteLabelSink(std::string path, sqlite::Db db) : path_(std::move(path)), db_(std::move(db)) {}

  Status Prepare() {
    ATFILL_ASSIGN_OR_RETURN(
        upsert_,
        sqlite::Prepare(db_.get(),
                        "INSERT INTO atfill_label_rows(uri, src, val, cid, cts, cts_us, exp, "
                        "exp_us, neg, indexed_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, "
                        "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)) "
                        "ON CONFLICT (uri, src, val) DO UPDATE SET cid = excluded.cid, "
                        "cts = excluded.cts, cts_us = excluded.cts_us, exp = excluded.exp, "
                        "exp_us = excluded.exp_us, neg = excluded.neg, "
                        "indexed_at = excluded.indexed_at "
                        "WHERE excluded.cts_us >= atfill_label_rows.cts_us",
                        true));
    return Status::OK();
  }

  Result<pipeline::LabelWriteStats> WriteLabels(std::span<const pipeline::Label> labels) override {
    pipeline::LabelWriteStats stats;
    if (labels.empty()) return stats;
    sqlite3* db = db_.get();
    Status st = sqlite::Exec(db, "BEGIN IMMEDIATE");
    for (size_t i = 0; st.ok() && i < labels.size(); ++i) st = Apply(labels[i], &stats);
    if (st.ok()) st = sqlite::Exec(db, "COMMIT");
    if (!st.ok()) {
      if (!sqlite3_get_autocommit(db)) (void)sqlite::Exec(db, "ROLLBACK");
      return st.WithContext("writing labels to SQLite database " + path_);
    }
    return stats;
  }

  std::string Describe() const override { return "sqlite:" + path_; }

 private:
  Status Apply(const pipeline::Label& l, pipeline::LabelWriteStats* stats) {
    sqlite3_stmt* s = upsert_.get();
    sqlite::ResetOnExit reset(s);
    sqlite::BindText(s, 1, l.uri);
    sqlite::BindText(s, 2, l.src);
    sqlite::BindText(s, 3, l.val);
    sqlite::BindTextOrNull(s, 4, l.cid);
    sqlite::BindText(s, 5, l.cts);
    sqlite3_bind_int64(s, 6, l.cts_us);
    sqlite::BindTextOrNull(s, 7, l.exp);
    if (l.exp.empty()) {
      sqlite3_bind_null(s, 8);
    } else {
      sqlite3_bind_int64(s, 8, l.exp_us);
    }
    sqlite3_bind_int(s, 9, l.neg ? 1 : 0);
    const int rc = sqlite3_step(s);
    if (rc != SQLITE_DONE) {
      return sqlite::ErrorStatus(db_.get(), rc, l.neg ? "applying a negation" : "storing a label");
    }
    const uint64_t changed = static_cast<uint64_t>(sqlite3_changes(db_.get()));
    stats->Count(l, changed);
    return Status::OK();
  }

  std::string path_;
  sqlite::Db db_;
  Stmt upsert_;
};

}  // namespace

Result<std::unique_ptr<pipeline::LabelSink>> OpenSqliteLabelSink(const SqliteSinkOptions& options) {
  auto db =
      sqlite::Open(options.path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX);
  if (!db.ok()) return db.status().WithContext("opening SQLite database " + options.path);
  sqlite3* raw = db->get();
  sqlite3_busy_timeout(raw, static_cast<int>(options.busy_timeout_ms));
  // The record sink may open the same new file at once: both retry their first statements
  // while it is busy (see ExecRetryingBusy).
  std::string setup = "PRAGMA journal_mode = WAL; PRAGMA synchronous = ";
  setup += options.synchronous == SqliteSynchronous::kFull ? "FULL;" : "NORMAL;";
  setup += kLabelTable;
  Status st = sqlite::ExecRetryingBusy(raw, setup.c_str(), options.busy_timeout_ms);
  if (st.ok()) st = UpgradeAndCreateView(raw, options.busy_timeout_ms);
  if (!st.ok()) return st.WithContext("creating the label tables in " + options.path);
  auto sink = std::make_unique<SqliteLabelSink>(options.path, std::move(*db));
  ATFILL_RETURN_IF_ERROR(sink->Prepare());
  return std::unique_ptr<pipeline::LabelSink>(std::move(sink));
}

}  // namespace atfill::sinks
