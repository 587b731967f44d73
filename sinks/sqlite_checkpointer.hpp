// Internal to sinks/: WAL checkpoints of the SQLite sink on a thread of their own.
//
// In WAL mode every commit appends pages to the -wal file, and a checkpoint copies them into the
// database file. SQLite's automatic checkpoint runs inside the COMMIT of the writing connection,
// so the sink's thread, the one thread that can write, spends much of its time copying pages
// (docs/performance.md). Here a second connection copies them on another thread while the writer
// goes on with the next batch.
//
// The WAL can only start again from its beginning when a write transaction begins after every
// frame has been copied. A checkpoint that runs beside a busy writer never quite catches up, so
// once the WAL holds `cap_frames` the writer waits, before its next transaction, for one round
// that began after its last commit (a round copies little then: the rounds before it copied the
// rest). A reader holding an old snapshot keeps frames from being copied; the writer then waits
// for a round only each time the WAL has grown by another quarter of the cap, so a long read
// costs the writer as much as SQLite's own checkpoints would, not more.
#pragma once

#include <sqlite3.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "base/status.hpp"
#include "sinks/sqlite_util.hpp"

namespace atfill::sinks::sqlite {

class Checkpointer {
 public:
  // Opens its own connection to `path` (already in WAL mode) and starts the thread; installs a
  // WAL hook on `writer`, which replaces the writer's automatic checkpoints.
  // `synchronous` is the writer's PRAGMA synchronous value ("NORMAL" or "FULL"): a checkpoint
  // syncs the WAL before it overwrites the database file, as the writer's own would. Waits for
  // other connections' locks up to `busy_timeout_ms`, as the writer does.
  static Result<std::unique_ptr<Checkpointer>> Start(sqlite3* writer, const std::string& path,
                                                     const char* synchronous, int64_t cap_frames,
                                                     int64_t busy_timeout_ms);
  // Stops the thread (after the round in progress) and closes its connection.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // The writer, before it begins a transaction: waits for a round when the WAL is over its cap.
  // Unavailable when that round failed (e.g. the disk is full): nothing is begun, and the
  // engine's retry of the batch waits for another round.
  Status BeforeTransaction();

 private:
  Checkpointer(sqlite3* writer, Db db, int64_t cap_frames);
  static int OnCommit(void* self, sqlite3* db, const char* name, int frames);
  void Loop();

  sqlite3* writer_;
  Db db_;
  const int64_t cap_frames_;
  // A round starts once the WAL holds this many frames not yet copied (or when the writer waits),
  // so small commits (a live stream's) do not each cost a checkpoint and its syncs.
  const int64_t step_frames_;
  // Written by the writer's thread only (the hook runs inside its COMMIT).
  int64_t wal_frames_ = 0;
  int64_t next_wait_frames_;

  mutable std::mutex mu_;
  std::condition_variable wake_;  // a commit, or stop
  std::condition_variable done_;  // a round finished
  uint64_t commits_ = 0;          // commits seen by the hook
  int64_t frames_ = 0;            // the WAL's frames after the last commit
  int64_t copied_ = 0;            // frames the last round left copied (the WAL's start onwards)
  uint64_t covered_ = 0;          // commits the last finished round began after
  bool waiting_ = false;          // the writer waits for a round
  Status last_round_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace atfill::sinks::sqlite
