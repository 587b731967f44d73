#include "sinks/sqlite_checkpointer.hpp"

#include <algorithm>
#include <utility>

namespace atfill::sinks::sqlite {

Result<std::unique_ptr<Checkpointer>> Checkpointer::Start(sqlite3* writer, const std::string& path,
                                                          const char* synchronous,
                                                          int64_t cap_frames,
                                                          int64_t busy_timeout_ms) {
  ATFILL_ASSIGN_OR_RETURN(Db db, Open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX));
  sqlite3_busy_timeout(db.get(), static_cast<int>(busy_timeout_ms));
  const std::string pragma = std::string("PRAGMA synchronous = ") + synchronous;
  ATFILL_RETURN_IF_ERROR(ExecRetryingBusy(db.get(), pragma.c_str(), busy_timeout_ms));
  // Its own automatic checkpoints would never run (it writes nothing), but say so.
  sqlite3_wal_autocheckpoint(db.get(), 0);
  std::unique_ptr<Checkpointer> c(new Checkpointer(writer, std::move(db), cap_frames));
  // Replaces the writer's automatic checkpoint, which is itself a WAL hook.
  sqlite3_wal_hook(writer, &Checkpointer::OnCommit, c.get());
  c->thread_ = std::thread([p = c.get()] { p->Loop(); });
  return c;
}

Checkpointer::Checkpointer(sqlite3* writer, Db db, int64_t cap_frames)
    : writer_(writer),
      db_(std::move(db)),
      cap_frames_(cap_frames),
      step_frames_(std::max<int64_t>(1, cap_frames / 16)),
      next_wait_frames_(cap_frames) {}

Checkpointer::~Checkpointer() {
  sqlite3_wal_hook(writer_, nullptr, nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

int Checkpointer::OnCommit(void* self, sqlite3* /*db*/, const char* /*name*/, int frames) {
  auto* c = static_cast<Checkpointer*>(self);
  if (frames < c->wal_frames_) c->next_wait_frames_ = c->cap_frames_;  // the WAL started again
  c->wal_frames_ = frames;
  {
    std::lock_guard<std::mutex> lock(c->mu_);
    ++c->commits_;
    c->frames_ = frames;
  }
  c->wake_.notify_one();
  return SQLITE_OK;
}

Status Checkpointer::BeforeTransaction() {
  if (wal_frames_ < next_wait_frames_) return Status::OK();
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = commits_;
  waiting_ = true;
  wake_.notify_one();
  done_.wait(lock, [&] { return covered_ >= target || stop_; });
  waiting_ = false;
  // Until the WAL starts again (a reader may hold it), wait again only after another quarter.
  next_wait_frames_ = wal_frames_ + std::max<int64_t>(1, cap_frames_ / 4);
  if (!last_round_.ok()) {
    return Status::Unavailable(
        "the WAL holds " + std::to_string(wal_frames_) +
        " pages, over its cap, and the checkpoint failed: " + last_round_.message());
  }
  return Status::OK();
}

void Checkpointer::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] {
      if (stop_) return true;
      if (commits_ == covered_) return false;
      // frames_ < copied_: the WAL started again from its beginning.
      const int64_t uncopied = frames_ >= copied_ ? frames_ - copied_ : frames_;
      return waiting_ || uncopied >= step_frames_;
    });
    if (stop_) return;
    const uint64_t target = commits_;
    lock.unlock();
    // PASSIVE: copies what no reader still needs, never waits for a lock, never blocks the
    // writer.
    int log_frames = 0, copied = 0;
    const int rc = sqlite3_wal_checkpoint_v2(db_.get(), nullptr, SQLITE_CHECKPOINT_PASSIVE,
                                             &log_frames, &copied);
    Status st = rc == SQLITE_OK || (rc & 0xff) == SQLITE_BUSY
                    ? Status::OK()
                    : ErrorStatus(db_.get(), rc, "checkpointing the WAL");
    lock.lock();
    covered_ = target;
    copied_ = copied;
    last_round_ = std::move(st);
    done_.notify_all();
  }
}

}  // namespace atfill::sinks::sqlite
