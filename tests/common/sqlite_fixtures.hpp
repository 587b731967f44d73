// What the SQLite sink's tests share: the schemas older atfill versions wrote (frozen: these are
// what databases in the field hold, so they never follow the current schema code), and a child
// process that writes into a database until the test kills it with SIGKILL.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "pipeline/sink.hpp"
#include "sinks/sqlite_sink.hpp"

namespace atfill::testing {

// The interned tables and the view, as versions 1 and 2 wrote them.
inline constexpr const char* kFrozenInternTables = R"sql(
CREATE TABLE atfill_dids(
  id INTEGER PRIMARY KEY,
  did TEXT NOT NULL UNIQUE);
CREATE TABLE atfill_collections(
  id INTEGER PRIMARY KEY,
  nsid TEXT NOT NULL UNIQUE);
)sql";
inline constexpr const char* kFrozenRecordColumns = R"sql(
  id INTEGER PRIMARY KEY,
  did_id INTEGER NOT NULL REFERENCES atfill_dids(id),
  collection_id INTEGER NOT NULL REFERENCES atfill_collections(id),
  rkey TEXT NOT NULL,
  cid TEXT NOT NULL,
  rev TEXT,
  indexed_at INTEGER NOT NULL,
  created_at TEXT,
  record TEXT NOT NULL,)sql";
inline constexpr const char* kFrozenView = R"sql(
CREATE VIEW atfill_records(uri, did, collection, rkey, record, cid, rev, indexed_at, created_at) AS
SELECT 'at://' || d.did || '/' || c.nsid || '/' || r.rkey,
       d.did, c.nsid, r.rkey, r.record, r.cid, r.rev,
       strftime('%Y-%m-%dT%H:%M:%S', r.indexed_at / 1000000, 'unixepoch') ||
           printf('.%06dZ', r.indexed_at % 1000000),
       r.created_at
FROM atfill_record_rows r
JOIN atfill_dids d ON d.id = r.did_id
JOIN atfill_collections c ON c.id = r.collection_id;
)sql";

// The schema atfill wrote at version 1, as it wrote it.
inline std::string FrozenSchemaV1() {
  return std::string(R"sql(
CREATE TABLE atfill_schema_version(version INTEGER NOT NULL);
INSERT INTO atfill_schema_version(version) VALUES (1);
)sql") + kFrozenInternTables +
         "CREATE TABLE atfill_record_rows(" + kFrozenRecordColumns +
         "\n  UNIQUE(did_id, collection_id, rkey));" + kFrozenView;
}

// The schema atfill wrote at version 2, as it wrote it (indexes and planner statistics too).
inline std::string FrozenSchemaV2() {
  return std::string(R"sql(
CREATE TABLE atfill_schema_version(version INTEGER NOT NULL);
INSERT INTO atfill_schema_version(version) VALUES (2);
)sql") + kFrozenInternTables +
         "CREATE TABLE atfill_record_rows(" + kFrozenRecordColumns + R"sql(
  did_epoch INTEGER GENERATED ALWAYS AS (id >> 18) VIRTUAL);
CREATE UNIQUE INDEX atfill_record_rows_key ON atfill_record_rows(collection_id, rkey, did_id);
CREATE INDEX atfill_record_rows_by_did ON atfill_record_rows(did_epoch, did_id, collection_id);
CREATE INDEX atfill_record_rows_by_created ON atfill_record_rows(collection_id, created_at);
ANALYZE sqlite_schema;
INSERT INTO sqlite_stat1(tbl, idx, stat) VALUES
  ('atfill_record_rows', 'atfill_record_rows_key', '100000000 10000000 10 1'),
  ('atfill_record_rows', 'atfill_record_rows_by_did', '100000000 262144 20 5'),
  ('atfill_record_rows', 'atfill_record_rows_by_created', '100000000 10000000 2');
)sql" + kFrozenView;
}

// Forks a child process that opens a sink with `options` and writes batch_at(0), batch_at(1), ...
// until it is killed; once `commits` of the batches i for which signal_after(i) holds are
// committed, kills it with SIGKILL and reaps it. A child that ends otherwise (its open, a write
// or its signal failed: exit 2, 3 or 4) fails the test.
inline void KillSinkWriterAfter(const sinks::SqliteSinkOptions& options,
                                const std::function<std::vector<pipeline::Event>(size_t)>& batch_at,
                                const std::function<bool(size_t)>& signal_after, int commits) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    auto sink = sinks::OpenSqliteSink(options);
    if (!sink.ok()) _exit(2);
    for (size_t i = 0;; ++i) {
      if (!(*sink)->Write(batch_at(i)).ok()) _exit(3);
      const char byte = 1;
      if (signal_after(i) && write(fds[1], &byte, 1) != 1) _exit(4);
    }
  }
  ASSERT_GT(pid, 0);
  for (int i = 0; i < commits; ++i) {
    char byte = 0;
    ASSERT_EQ(read(fds[0], &byte, 1), 1);
  }
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  close(fds[0]);
  close(fds[1]);
}

}  // namespace atfill::testing
