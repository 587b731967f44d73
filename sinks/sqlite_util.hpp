// Internal to sinks/: RAII handles over the SQLite C API and the mapping of its result codes to
// Status. Not part of the public sink API.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.hpp"

namespace atfill::sinks::sqlite {

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using Db = std::unique_ptr<sqlite3, DbCloser>;

struct StmtFinalizer {
  void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
};
using Stmt = std::unique_ptr<sqlite3_stmt, StmtFinalizer>;

// Maps a SQLite result code to a Status: BUSY, LOCKED and FULL are Unavailable (retrying later
// may succeed), IOERR/CANTOPEN/READONLY are IoError, CORRUPT/NOTADB are Corrupt, NOMEM is
// ResourceExhausted, TOOBIG is OutOfRange, anything else Internal. The message is
// "<what>: <sqlite message> (<code's generic text>)", the last part only when it adds something.
Status ErrorStatus(sqlite3* db, int rc, std::string_view what);

// Opens `path` with `flags` (SQLITE_OPEN_*), with extended result codes on and atfill's SQL
// functions registered (sqlite_functions.hpp). The error does not
// name the path; callers add it.
Result<Db> Open(const std::string& path, int flags);

// Runs one or more statements that return no rows we need.
Status Exec(sqlite3* db, const char* sql);

// Exec, tried again while the database is busy, for up to `timeout_ms`. Right after another
// connection made a new file a WAL database, a connection's first statements may meet its locks
// without SQLite's busy handler being asked (seen when sinks open one new file at once).
Status ExecRetryingBusy(sqlite3* db, const char* sql, int64_t timeout_ms);

// Prepares one statement; `persistent` hints SQLite that it is reused many times.
Result<Stmt> Prepare(sqlite3* db, std::string_view sql, bool persistent);

// Binds text that outlives the next sqlite3_step (SQLITE_STATIC: no copy).
inline int BindText(sqlite3_stmt* stmt, int index, std::string_view text) {
  return sqlite3_bind_text(stmt, index, text.data(), static_cast<int>(text.size()), SQLITE_STATIC);
}
// Binds NULL when `text` is empty.
inline int BindTextOrNull(sqlite3_stmt* stmt, int index, std::string_view text) {
  return text.empty() ? sqlite3_bind_null(stmt, index) : BindText(stmt, index, text);
}
// Column `index` of the current row as a view valid until the next step or reset; empty for NULL.
inline std::string_view ColumnText(sqlite3_stmt* stmt, int index) {
  const unsigned char* p = sqlite3_column_text(stmt, index);
  if (p == nullptr) return {};
  return {reinterpret_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt, index))};
}

// Resets a statement when it leaves scope, so an early return never leaves it mid-step.
class ResetOnExit {
 public:
  explicit ResetOnExit(sqlite3_stmt* stmt) : stmt_(stmt) {}
  ~ResetOnExit() { sqlite3_reset(stmt_); }
  ResetOnExit(const ResetOnExit&) = delete;
  ResetOnExit& operator=(const ResetOnExit&) = delete;

 private:
  sqlite3_stmt* stmt_;
};

}  // namespace atfill::sinks::sqlite
