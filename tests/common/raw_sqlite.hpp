// A raw connection to an atfill SQLite database, for what the sink API does not offer
// (inspecting the schema, holding locks, plain SQL on the view). atfill's SQL functions are
// registered on it, as on every connection atfill opens, unless asked not to be (a program that
// knows nothing of atfill).
#pragma once

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <string>
#include <vector>

#include "sinks/sqlite_functions.hpp"

namespace atfill::testing {

class RawDb {
 public:
  explicit RawDb(const std::string& path, bool atfill_functions = true) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK) << path;
    if (atfill_functions) {
      EXPECT_EQ(sinks::RegisterSqliteFunctions(db_), SQLITE_OK);
    }
  }
  ~RawDb() { sqlite3_close(db_); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;
  sqlite3* get() const { return db_; }
  // Runs `sql`; returns sqlite3_exec's code.
  int Exec(const std::string& sql) const {
    char* err = nullptr;
    int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
    if (err != nullptr) sqlite3_free(err);
    return rc;
  }
  // Column `col` (the first by default) of every row of `sql`, as text ("NULL" for NULL); a
  // statement that fails to prepare or to run fails the test. A query plan's steps:
  // Column("EXPLAIN QUERY PLAN " + query, 3).
  std::vector<std::string> Column(const std::string& sql, int col = 0) const {
    std::vector<std::string> out;
    sqlite3_stmt* s = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr), SQLITE_OK)
        << sql << ": " << sqlite3_errmsg(db_);
    int rc = SQLITE_DONE;
    while (s != nullptr && (rc = sqlite3_step(s)) == SQLITE_ROW) {
      const unsigned char* t = sqlite3_column_text(s, col);
      out.push_back(t == nullptr ? "NULL" : reinterpret_cast<const char*>(t));
    }
    EXPECT_EQ(rc, SQLITE_DONE) << sql << ": " << sqlite3_errmsg(db_);
    sqlite3_finalize(s);
    return out;
  }

 private:
  sqlite3* db_ = nullptr;
};

}  // namespace atfill::testing
