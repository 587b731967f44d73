#include "tests/common/pg_server.hpp"
#include "base/low_port.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <sstream>

namespace atfill::testing {
namespace {

std::string ErrorText(PGconn* conn) {
  std::string out = PQerrorMessage(conn);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// A free TCP port on 127.0.0.1 below 32768 (free again once the probe closes).
Result<int> FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Status::IoError("socket() failed");
  // Below the ephemeral range (base/low_port.hpp): the server binds it after this probe closes.
  const auto port = BindLowPort([&](uint16_t candidate) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(candidate);
    return ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  });
  ::close(fd);
  if (!port) return Status::IoError("cannot find a free port below 32768 on 127.0.0.1");
  return static_cast<int>(*port);
}

std::string PgServerScript() {
  // ATFILL_TEST_PGSERVER's first word is the script tools/test used; else the one of this tree.
  if (const char* env = std::getenv("ATFILL_TEST_PGSERVER"); env != nullptr && *env != '\0') {
    std::istringstream in(env);
    std::string script;
    in >> script;
    if (!script.empty()) return script;
  }
  return ATFILL_PGSERVER_SCRIPT;
}

}  // namespace

Result<std::string> TestServerConninfo() {
  const char* env = std::getenv("ATFILL_TEST_PG");
  if (env == nullptr || *env == '\0') {
    return Status::NotFound(
        "ATFILL_TEST_PG is not set: the PostgreSQL tests need a server. Run tools/test (it starts "
        "one), or start one with `tools/pgserver start DIR PORT` and export "
        "ATFILL_TEST_PG=\"host=127.0.0.1 port=PORT user=postgres dbname=postgres\" and "
        "ATFILL_TEST_PGSERVER=\"$PWD/tools/pgserver DIR PORT\"");
  }
  return std::string(env);
}

Result<std::string> WithDatabase(const std::string& conninfo, const std::string& dbname) {
  char* err = nullptr;
  PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &err);
  if (options == nullptr) {
    std::string why = err != nullptr ? err : "out of memory";
    if (err != nullptr) PQfreemem(err);
    return Status::Invalid("bad connection string '" + conninfo + "': " + why);
  }
  auto quote = [](std::string_view v) {
    std::string out = "'";
    for (char c : v) {
      if (c == '\'' || c == '\\') out += '\\';
      out += c;
    }
    return out + "'";
  };
  std::string out;
  for (PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
    if (o->val == nullptr || std::string_view(o->keyword) == "dbname") continue;
    out += std::string(o->keyword) + "=" + quote(o->val) + " ";
  }
  PQconninfoFree(options);
  return out + "dbname=" + quote(dbname);
}

Result<std::unique_ptr<PgConnection>> PgConnection::Open(const std::string& conninfo) {
  PGconn* conn = PQconnectdb(conninfo.c_str());
  if (conn == nullptr || PQstatus(conn) != CONNECTION_OK) {
    std::string why = conn != nullptr ? ErrorText(conn) : "out of memory";
    PQfinish(conn);
    return Status::Unavailable("connecting to " + conninfo + ": " + why);
  }
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  return std::unique_ptr<PgConnection>(new PgConnection(conn));
}

PgConnection::~PgConnection() { PQfinish(conn_); }

Status PgConnection::Exec(const std::string& sql) {
  PGresult* r = PQexec(conn_, sql.c_str());
  const ExecStatusType st = r == nullptr ? PGRES_FATAL_ERROR : PQresultStatus(r);
  PQclear(r);
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return Status::OK();
  return Status::IoError(sql + ": " + ErrorText(conn_));
}

Result<std::vector<std::vector<std::string>>> PgConnection::Rows(const std::string& sql) {
  PGresult* r = PQexec(conn_, sql.c_str());
  if (r == nullptr || PQresultStatus(r) != PGRES_TUPLES_OK) {
    PQclear(r);
    return Status::IoError(sql + ": " + ErrorText(conn_));
  }
  std::vector<std::vector<std::string>> rows;
  for (int i = 0; i < PQntuples(r); ++i) {
    rows.emplace_back();
    for (int c = 0; c < PQnfields(r); ++c) {
      rows.back().push_back(PQgetisnull(r, i, c) ? "NULL" : PQgetvalue(r, i, c));
    }
  }
  PQclear(r);
  return rows;
}

Result<std::vector<std::string>> PgConnection::Column(const std::string& sql) {
  ATFILL_ASSIGN_OR_RETURN(auto rows, Rows(sql));
  std::vector<std::string> out;
  for (auto& row : rows) out.push_back(row.empty() ? "" : row[0]);
  return out;
}

Result<std::unique_ptr<PgDatabase>> PgDatabase::Create(const std::string& admin_conninfo) {
  static std::atomic<int> counter{0};
  const std::string name =
      "atfill_t_" + std::to_string(::getpid()) + "_" + std::to_string(counter.fetch_add(1));
  ATFILL_ASSIGN_OR_RETURN(auto admin, PgConnection::Open(admin_conninfo));
  ATFILL_RETURN_IF_ERROR(admin->Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"));
  ATFILL_RETURN_IF_ERROR(admin->Exec("CREATE DATABASE " + name));
  ATFILL_ASSIGN_OR_RETURN(std::string conninfo, WithDatabase(admin_conninfo, name));
  return std::unique_ptr<PgDatabase>(new PgDatabase(admin_conninfo, name, conninfo));
}

Result<std::unique_ptr<PgDatabase>> PgDatabase::CreateOnTestServer() {
  ATFILL_ASSIGN_OR_RETURN(std::string admin, TestServerConninfo());
  return Create(admin);
}

PgDatabase::~PgDatabase() {
  auto admin = PgConnection::Open(admin_);
  // A server stopped by the test is gone with its databases' files anyway.
  if (admin.ok()) (void)(*admin)->Exec("DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)");
}

Result<std::unique_ptr<PgServer>> PgServer::StartPrivate() {
  std::unique_ptr<PgServer> server(new PgServer());
  server->script_ = PgServerScript();
  server->owned_dir_ = std::make_unique<TempDir>();
  server->dir_ = server->owned_dir_->path().string();
  ATFILL_ASSIGN_OR_RETURN(server->port_, FreePort());
  server->admin_conninfo_ =
      "host=127.0.0.1 port=" + std::to_string(server->port_) + " user=postgres dbname=postgres";
  ATFILL_RETURN_IF_ERROR(server->Start());
  return server;
}

Result<std::unique_ptr<PgServer>> PgServer::Shared() {
  ATFILL_ASSIGN_OR_RETURN(std::string admin, TestServerConninfo());
  const char* env = std::getenv("ATFILL_TEST_PGSERVER");
  std::istringstream in(env == nullptr ? "" : env);
  std::unique_ptr<PgServer> server(new PgServer());
  if (!(in >> server->script_ >> server->dir_ >> server->port_)) {
    return Status::NotFound("ATFILL_TEST_PGSERVER is not \"<tools/pgserver> <DIR> <PORT>\"");
  }
  server->admin_conninfo_ = admin;
  return server;
}

PgServer::~PgServer() {
  if (owned_dir_ != nullptr) (void)Stop();
}

Status PgServer::Run(const std::string& verb) {
  ProcessResult r = RunProcess({script_, verb, dir_, std::to_string(port_)}, logs_.path(),
                               std::chrono::seconds(90));
  if (r.exit_code != 0) {
    return Status::Unavailable(script_ + " " + verb + " " + dir_ + " " + std::to_string(port_) +
                               " failed (exit " + std::to_string(r.exit_code) + "): " + r.err);
  }
  return Status::OK();
}

Status PgServer::Start() { return Run("start"); }
Status PgServer::Stop() { return Run("stop"); }
Status PgServer::Restart() { return Run("restart"); }

}  // namespace atfill::testing
