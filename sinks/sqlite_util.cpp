#include "sinks/sqlite_util.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "sinks/sqlite_functions.hpp"

namespace atfill::sinks::sqlite {

Status ErrorStatus(sqlite3* db, int rc, std::string_view what) {
  std::string msg(what);
  msg += ": ";
  // The connection's message describes the last failure on it; when there is no connection (an
  // open that failed to allocate one) only the code's generic text exists.
  std::string_view detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  msg += detail;
  if (detail != sqlite3_errstr(rc)) {
    msg += " (";
    msg += sqlite3_errstr(rc);
    msg += ")";
  }
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_FULL:
      return Status::Unavailable(std::move(msg));
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_PERM:
      return Status::IoError(std::move(msg));
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return Status::Corrupt(std::move(msg));
    case SQLITE_NOMEM:
      return Status::ResourceExhausted(std::move(msg));
    case SQLITE_TOOBIG:
      return Status::OutOfRange(std::move(msg));
    default:
      return Status::Internal(std::move(msg));
  }
}

Result<Db> Open(const std::string& path, int flags) {
  // SQLite's memory statistics take a global mutex on every allocation it makes (several per
  // inserted row); atfill never reads them. Takes effect only before SQLite initializes itself,
  // i.e. at the first connection this process opens; later calls change nothing.
  static const bool kNoMemStatus = [] {
    return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0) == SQLITE_OK;
  }();
  (void)kNoMemStatus;
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  Db db(raw);
  if (rc != SQLITE_OK) return ErrorStatus(raw, rc, "cannot open");
  sqlite3_extended_result_codes(raw, 1);
  // Every atfill connection reads the view, whose record column may call atfill_json.
  rc = RegisterSqliteFunctions(raw);
  if (rc != SQLITE_OK) return ErrorStatus(raw, rc, "registering atfill_json");
  return db;
}

Status Exec(sqlite3* db, const char* sql) {
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return ErrorStatus(db, rc, std::string("executing `") + sql + "`");
  return Status::OK();
}

Status ExecRetryingBusy(sqlite3* db, const char* sql, int64_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto backoff = std::chrono::milliseconds(2);
  for (;;) {
    Status st = Exec(db, sql);
    const int rc = sqlite3_extended_errcode(db) & 0xff;
    if (st.ok() || (rc != SQLITE_BUSY && rc != SQLITE_LOCKED)) return st;
    const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (remaining.count() <= 0) return st;
    std::this_thread::sleep_for(std::min(backoff, remaining));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
}

Result<Stmt> Prepare(sqlite3* db, std::string_view sql, bool persistent) {
  sqlite3_stmt* raw = nullptr;
  int rc = sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()),
                              persistent ? SQLITE_PREPARE_PERSISTENT : 0, &raw, nullptr);
  Stmt stmt(raw);
  if (rc != SQLITE_OK) {
    return ErrorStatus(db, rc, "preparing `" + std::string(sql) + "`");
  }
  return stmt;
}

}  // namespace atfill::sinks::sqlite
