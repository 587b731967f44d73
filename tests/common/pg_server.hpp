// PostgreSQL for tests: the shared test server tools/test starts (ATFILL_TEST_PG), a fresh database
// per test on it, private servers for tests that stop and restart one, and a plain connection for
// what the sink API does not offer.
//
//   ATFILL_TEST_PG        admin connection string of the shared server, e.g.
//                         "host=127.0.0.1 port=15432 user=postgres dbname=postgres"
//   ATFILL_TEST_PGSERVER  "<tools/pgserver> <DIR> <PORT>" of that server
// Without ATFILL_TEST_PG the PostgreSQL tests fail (they are not skipped): run tools/test, or start
// a server with `tools/pgserver start DIR PORT` and export both variables.
#pragma once

#include <libpq-fe.h>

#include <memory>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "tests/common/process.hpp"

namespace atfill::testing {

// ATFILL_TEST_PG, or an error saying how to get a server.
Result<std::string> TestServerConninfo();

// `conninfo` (key=value or URI) with its dbname replaced.
Result<std::string> WithDatabase(const std::string& conninfo, const std::string& dbname);

// A plain libpq connection.
class PgConnection {
 public:
  static Result<std::unique_ptr<PgConnection>> Open(const std::string& conninfo);
  ~PgConnection();
  PgConnection(const PgConnection&) = delete;
  PgConnection& operator=(const PgConnection&) = delete;

  // Runs statements that return no rows we need.
  Status Exec(const std::string& sql);
  // Every row as text ("NULL" for NULL).
  Result<std::vector<std::vector<std::string>>> Rows(const std::string& sql);
  // The first column of every row.
  Result<std::vector<std::string>> Column(const std::string& sql);
  PGconn* get() const { return conn_; }

 private:
  explicit PgConnection(PGconn* conn) : conn_(conn) {}
  PGconn* conn_;
};

// A new empty database (atfill_t_<pid>_<n>) on a server, dropped WITH (FORCE) by the destructor.
class PgDatabase {
 public:
  static Result<std::unique_ptr<PgDatabase>> Create(const std::string& admin_conninfo);
  // On the shared test server.
  static Result<std::unique_ptr<PgDatabase>> CreateOnTestServer();
  ~PgDatabase();

  const std::string& name() const { return name_; }
  const std::string& conninfo() const { return conninfo_; }

 private:
  PgDatabase(std::string admin, std::string name, std::string conninfo)
      : admin_(std::move(admin)), name_(std::move(name)), conninfo_(std::move(conninfo)) {}
  std::string admin_;
  std::string name_;
  std::string conninfo_;
};

// A server driven through tools/pgserver: Stop, Start and Restart run the script. Private servers
// (a cluster of the test's own, on a free port) are what outage tests use, so that stopping one
// never disturbs tests running in parallel on the shared server.
class PgServer {
 public:
  // A new cluster in a temporary folder; stopped and removed by the destructor.
  static Result<std::unique_ptr<PgServer>> StartPrivate();
  // The shared server of ATFILL_TEST_PG/ATFILL_TEST_PGSERVER (left running by the destructor).
  static Result<std::unique_ptr<PgServer>> Shared();
  ~PgServer();

  Status Start();
  Status Stop();
  Status Restart();
  const std::string& admin_conninfo() const { return admin_conninfo_; }

 private:
  PgServer() = default;
  Status Run(const std::string& verb);

  std::string script_;
  std::string dir_;
  int port_ = 0;
  std::string admin_conninfo_;
  std::unique_ptr<TempDir> owned_dir_;  // private servers only
  TempDir logs_;                        // the script's output
};

}  // namespace atfill::testing
