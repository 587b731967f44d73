#include "sinks/postgres_util.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace atfill::sinks::pg {
namespace {

// libpq's messages end with a newline and may hold several lines.
std::string OneLine(const char* message) {
  std::string out;
  for (const char* p = message == nullptr ? "" : message; *p != '\0'; ++p) {
    const bool space = *p == '\n' || *p == '\t' || *p == ' ';
    if (!space) {
      out += *p;
    } else if (!out.empty() && out.back() != ' ') {
      out += ' ';
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out.empty() ? "no message from libpq" : out;
}

Status StatusFor(Failure failure, std::string_view sqlstate, std::string message) {
  switch (failure) {
    case Failure::kConnection:
    case Failure::kConflict:
    case Failure::kTransient:
      return Status::Unavailable(std::move(message));
    case Failure::kNone:
    case Failure::kOther:
      break;
  }
  if (sqlstate.starts_with("22")) return Status::Invalid(std::move(message));
  if (sqlstate.starts_with("54")) return Status::OutOfRange(std::move(message));
  if (sqlstate.starts_with("XX")) return Status::Corrupt(std::move(message));
  return Status::IoError(std::move(message));
}

}  // namespace

Failure ClassifySqlState(std::string_view s) {
  if (s == "40001" || s == "40P01" || s == "23505") return Failure::kConflict;
  if (s.starts_with("08") || s == "57P01" || s == "57P02" || s == "57P03" || s == "57P04") {
    return Failure::kConnection;
  }
  if (s == "55P03" || s == "57014" || s == "25006" || s == "40003" || s.starts_with("53")) {
    return Failure::kTransient;
  }
  return Failure::kOther;
}

Status CheckConninfo(const std::string& conninfo) {
  char* err = nullptr;
  PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &err);
  if (options == nullptr) {
    std::string why = err != nullptr ? OneLine(err) : "out of memory";
    if (err != nullptr) PQfreemem(err);
    return Status::Invalid("bad PostgreSQL connection string: " + why);
  }
  PQconninfoFree(options);
  return Status::OK();
}

Result<Conn> Connect(const std::string& conninfo, Clock::time_point deadline) {
  // Earlier entries are defaults the conninfo (expanded in place of "dbname") may override; the
  // encoding after it is not negotiable: every string the sink sends or reads is UTF-8.
  const char* const keywords[] = {
      "application_name", "keepalives", "keepalives_idle", "keepalives_interval",
      "keepalives_count", "dbname",     "client_encoding", nullptr};
  const char* const values[] = {"atfill", "1", "30", "10", "3", conninfo.c_str(), "UTF8", nullptr};
  Conn conn(PQconnectStartParams(keywords, values, 1));
  if (conn == nullptr) return Status::ResourceExhausted("out of memory starting a connection");
  if (PQstatus(conn.get()) == CONNECTION_BAD) {
    return Status::Unavailable(OneLine(PQerrorMessage(conn.get())));
  }
  PostgresPollingStatusType state = PGRES_POLLING_WRITING;
  while (state != PGRES_POLLING_OK) {
    if (state == PGRES_POLLING_FAILED) {
      return Status::Unavailable(OneLine(PQerrorMessage(conn.get())));
    }
    const auto remaining =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (remaining <= 0) return Status::Unavailable("timed out connecting");
    pollfd fd{};
    fd.fd = PQsocket(conn.get());
    fd.events = state == PGRES_POLLING_READING ? POLLIN : POLLOUT;
    const int rc = ::poll(&fd, 1, static_cast<int>(std::min<int64_t>(remaining, 60'000)));
    if (rc < 0 && errno != EINTR) {
      return Status::IoError(std::string("poll while connecting: ") + std::strerror(errno));
    }
    if (rc <= 0) continue;  // interrupted or timed out: the deadline check above decides
    state = PQconnectPoll(conn.get());
  }
  // Notices ("relation already exists, skipping"...) are not errors; libpq would print them.
  PQsetNoticeProcessor(
      conn.get(), [](void*, const char*) {}, nullptr);
  return conn;
}

std::string Describe(PGconn* conn) {
  std::string out;
  const char* host = PQhost(conn);
  out += host != nullptr && *host != '\0' ? host : "localhost";
  const char* port = PQport(conn);
  if (port != nullptr && *port != '\0') out += std::string(":") + port;
  const char* db = PQdb(conn);
  if (db != nullptr) out += std::string("/") + db;
  return out;
}

std::string DescribeConninfo(const std::string& conninfo) {
  PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), nullptr);
  if (options == nullptr) return "PostgreSQL (bad connection string)";
  std::string host, port, db;
  for (PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    const std::string_view key = o->keyword;
    if (key == "host" || (key == "hostaddr" && host.empty())) host = o->val;
    if (key == "port") port = o->val;
    if (key == "dbname") db = o->val;
  }
  PQconninfoFree(options);
  std::string out = host.empty() ? "localhost" : host;
  if (!port.empty()) out += ":" + port;
  if (!db.empty()) out += "/" + db;
  return out;
}

Status ResultError(PGconn* conn, const PGresult* result, std::string_view what, Failure* failure) {
  std::string sqlstate;
  std::string message(what);
  message += ": ";
  if (result != nullptr) {
    const char* code = PQresultErrorField(result, PG_DIAG_SQLSTATE);
    if (code != nullptr) sqlstate = code;
    const char* primary = PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY);
    if (primary != nullptr) {
      message += primary;
      const char* detail = PQresultErrorField(result, PG_DIAG_MESSAGE_DETAIL);
      if (detail != nullptr) message += std::string(" (") + detail + ")";
    } else {
      const char* text = PQresultErrorMessage(result);
      message += OneLine(text != nullptr && *text != '\0' ? text : PQerrorMessage(conn));
    }
  } else {
    message += OneLine(PQerrorMessage(conn));
  }
  if (!sqlstate.empty()) message += " [SQLSTATE " + sqlstate + "]";
  Failure kind =
      PQstatus(conn) == CONNECTION_BAD ? Failure::kConnection : ClassifySqlState(sqlstate);
  if (kind == Failure::kOther && sqlstate.empty()) {
    // No SQLSTATE and the connection still looks fine: libpq failed to send or read.
    kind = Failure::kConnection;
  }
  if (failure != nullptr) *failure = kind;
  return StatusFor(kind, sqlstate, std::move(message));
}

Status Exec(PGconn* conn, const char* sql, Failure* failure) {
  PgResult r(PQexec(conn, sql));
  const ExecStatusType st = r == nullptr ? PGRES_FATAL_ERROR : PQresultStatus(r.get());
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return Status::OK();
  std::string what = "running ";
  what.append(sql, std::min<size_t>(std::strlen(sql), 60));
  return ResultError(conn, r.get(), what, failure);
}

Result<PgResult> Query(PGconn* conn, const std::string& sql, const std::vector<const char*>& params,
                       Failure* failure) {
  PgResult r(PQexecParams(conn, sql.c_str(), static_cast<int>(params.size()), nullptr,
                          params.data(), nullptr, nullptr, 0));
  const ExecStatusType st = r == nullptr ? PGRES_FATAL_ERROR : PQresultStatus(r.get());
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return r;
  return ResultError(conn, r.get(), "running a query", failure);
}

Result<PgResult> RunPrepared(PGconn* conn, const char* name, int n_params,
                             const char* const* params, Failure* failure) {
  PgResult r(PQexecPrepared(conn, name, n_params, params, nullptr, nullptr, 0));
  const ExecStatusType st = r == nullptr ? PGRES_FATAL_ERROR : PQresultStatus(r.get());
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return r;
  return ResultError(conn, r.get(), name, failure);
}

std::string QuoteIdent(std::string_view name) {
  std::string out = "\"";
  for (char c : name) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

std::string QuoteLiteral(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') out += '\'';
    out += c;
  }
  out += '\'';
  return out;
}

void AppendArrayElement(std::string* out, std::string_view value) {
  if (!out->empty() && out->back() != '{') *out += ',';
  *out += '"';
  for (char c : value) {
    if (c == '"' || c == '\\') *out += '\\';
    *out += c;
  }
  *out += '"';
}

bool IsStorableText(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char* end = p + text.size();
  while (p < end) {
    // Runs of ASCII without NUL, eight bytes at a time.
    while (end - p >= 8) {
      uint64_t v;
      std::memcpy(&v, p, 8);
      const uint64_t has_zero = (v - 0x0101010101010101ULL) & ~v & 0x8080808080808080ULL;
      if ((v & 0x8080808080808080ULL) != 0 || has_zero != 0) break;
      p += 8;
    }
    if (p >= end) break;
    const unsigned char c = *p;
    if (c == 0) return false;
    if (c < 0x80) {
      ++p;
      continue;
    }
    size_t n;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return false;
    }
    if (static_cast<size_t>(end - p) < n) return false;
    if (p[1] < lo || p[1] > hi) return false;
    for (size_t i = 2; i < n; ++i) {
      if (p[i] < 0x80 || p[i] > 0xBF) return false;
    }
    p += n;
  }
  return true;
}

void CopyWriter::Reset() {
  buf_.clear();
  static constexpr char kSignature[] = "PGCOPY\n\377\r\n";
  buf_.append(kSignature, sizeof kSignature);  // with its final NUL: 11 bytes
  Put32(0);                                    // flags
  Put32(0);                                    // header extension length
}

void CopyWriter::Put16(uint16_t v) {
  const char b[2] = {static_cast<char>(v >> 8), static_cast<char>(v)};
  buf_.append(b, 2);
}

void CopyWriter::Put32(uint32_t v) {
  const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
  buf_.append(b, 4);
}

void CopyWriter::BeginRow(int16_t fields) { Put16(static_cast<uint16_t>(fields)); }

void CopyWriter::Int4(int32_t v) {
  Put32(4);
  Put32(static_cast<uint32_t>(v));
}

void CopyWriter::Int8(int64_t v) {
  Put32(8);
  Put32(static_cast<uint32_t>(static_cast<uint64_t>(v) >> 32));
  Put32(static_cast<uint32_t>(static_cast<uint64_t>(v)));
}

void CopyWriter::Bool(bool v) {
  Put32(1);
  buf_ += v ? '\1' : '\0';
}

void CopyWriter::Text(std::string_view v) {
  Put32(static_cast<uint32_t>(v.size()));
  buf_.append(v);
}

void CopyWriter::TextOrNull(std::string_view v) {
  if (v.empty()) {
    Null();
  } else {
    Text(v);
  }
}

void CopyWriter::Null() { Put32(0xFFFFFFFFu); }

Status CopyWriter::Send(PGconn* conn, const char* copy_sql, std::string_view what,
                        Failure* failure) {
  PgResult start(PQexec(conn, copy_sql));
  if (start == nullptr || PQresultStatus(start.get()) != PGRES_COPY_IN) {
    return ResultError(conn, start.get(), what, failure);
  }
  start.reset();
  Put16(0xFFFF);  // the trailer
  constexpr size_t kPiece = 1 << 20;
  bool sent = true;
  for (size_t at = 0; at < buf_.size() && sent; at += kPiece) {
    const size_t n = std::min(kPiece, buf_.size() - at);
    sent = PQputCopyData(conn, buf_.data() + at, static_cast<int>(n)) == 1;
  }
  // On a failed send the end message cannot go either; the result below reports the error.
  if (sent) sent = PQputCopyEnd(conn, nullptr) == 1;
  PgResult end(PQgetResult(conn));
  Status st;
  if (!sent || end == nullptr || PQresultStatus(end.get()) != PGRES_COMMAND_OK) {
    st = ResultError(conn, end.get(), what, failure);
  }
  end.reset();
  // Whatever follows (nothing, normally) is read and dropped so the connection is ready again.
  while (PGresult* extra = PQgetResult(conn)) PQclear(extra);
  return st;
}

}  // namespace atfill::sinks::pg
