// Internal to sinks/: RAII handles over libpq, connecting with a deadline, the mapping of server
// errors to Status, and the builders of what the sink sends (binary COPY rows, array literals).
// Not part of the public sink API.
#pragma once

#include <libpq-fe.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"

namespace atfill::sinks::pg {

struct ConnCloser {
  void operator()(PGconn* conn) const { PQfinish(conn); }
};
using Conn = std::unique_ptr<PGconn, ConnCloser>;

struct ResultClearer {
  void operator()(PGresult* result) const { PQclear(result); }
};
using PgResult = std::unique_ptr<PGresult, ResultClearer>;

using Clock = std::chrono::steady_clock;

// What a failure means to the sink's retry logic.
enum class Failure : uint8_t {
  kNone,
  // The connection is gone (server down, restarted, admin shutdown, network): reconnect.
  kConnection,
  // A conflict with another transaction (serialization failure, deadlock, a row another
  // connection wrote in between): the batch may be retried at once.
  kConflict,
  // Transient on the server's side (a lock held past lock_timeout, disk full, too many
  // connections, read-only standby, a cancelled statement): Unavailable.
  kTransient,
  // Anything else: final for the batch.
  kOther,
};

// Maps a SQLSTATE (five characters; empty when the server sent none) to a Failure.
Failure ClassifySqlState(std::string_view sqlstate);

// The conninfo syntax check of libpq (key=value pairs or a postgresql:// URI); Invalid naming the
// problem otherwise.
Status CheckConninfo(const std::string& conninfo);

// Opens a connection within `deadline` (libpq's non-blocking connect, polled), in UTF-8, with TCP
// keepalives unless `conninfo` sets its own. The error (Unavailable: refused, timed out, auth
// failed...) does not name the server; callers add what they know.
Result<Conn> Connect(const std::string& conninfo, Clock::time_point deadline);

// "host:port/dbname" of an open connection, for messages (never the password).
std::string Describe(PGconn* conn);
// The same from a connection string (what it sets; libpq's defaults fill the rest).
std::string DescribeConninfo(const std::string& conninfo);

// A failed result (or none at all) as a Status, and its Failure. `what` says what was being done.
Status ResultError(PGconn* conn, const PGresult* result, std::string_view what, Failure* failure);

// Runs one or more statements that return no rows (simple query protocol).
Status Exec(PGconn* conn, const char* sql, Failure* failure);

// Runs `sql` with text parameters (nullptr is NULL) and returns its rows (PGRES_TUPLES_OK or
// PGRES_COMMAND_OK).
Result<PgResult> Query(PGconn* conn, const std::string& sql, const std::vector<const char*>& params,
                       Failure* failure);

// Runs a prepared statement with text parameters (nullptr is NULL).
Result<PgResult> RunPrepared(PGconn* conn, const char* name, int n_params,
                             const char* const* params, Failure* failure);

// A cell as a view valid while the result lives; empty for NULL.
inline std::string_view Cell(const PGresult* r, int row, int col) {
  return {PQgetvalue(r, row, col), static_cast<size_t>(PQgetlength(r, row, col))};
}

// "name" with embedded quotes doubled, for identifiers in SQL text.
std::string QuoteIdent(std::string_view name);
// 'text' with embedded quotes doubled (standard_conforming_strings is on since PostgreSQL 9.1).
std::string QuoteLiteral(std::string_view text);

// Appends `value` as one element of a text[] literal ("{...}").
void AppendArrayElement(std::string* out, std::string_view value);

// True when `text` is well-formed UTF-8 without NUL bytes: what a PostgreSQL text value can hold.
bool IsStorableText(std::string_view text);

// Rows for COPY ... FROM STDIN (FORMAT binary): no escaping, no parsing of numbers on the server.
class CopyWriter {
 public:
  // Starts a new stream (the binary COPY header).
  void Reset();
  void BeginRow(int16_t fields);
  void Int4(int32_t v);
  void Int8(int64_t v);
  void Bool(bool v);
  void Text(std::string_view v);
  // NULL when empty.
  void TextOrNull(std::string_view v);
  void Null();
  size_t size() const { return buf_.size(); }
  // Runs `copy_sql` (a COPY ... FROM STDIN (FORMAT binary)) and streams the rows written since
  // Reset(), plus the trailer. Returns once the server has them all.
  Status Send(PGconn* conn, const char* copy_sql, std::string_view what, Failure* failure);

 private:
  void Put16(uint16_t v);
  void Put32(uint32_t v);
  std::string buf_;
};

}  // namespace atfill::sinks::pg
