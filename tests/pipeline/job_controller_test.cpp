// The job controller (pipeline/job_controller.hpp) with fake kinds over a real RocksDB state:
// planning, the shard filter, stop requests from files and from the API, restart recovery, groups
// of jobs beside each other, stage transitions, and the order its plans' pieces are released in.
#include "pipeline/job_controller.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"
#include "tests/common/process.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::pipeline {
namespace {

RecordEvent Record(uint64_t n) {
  RecordEvent r;
  r.did = "did:plc:account" + std::to_string(n % 50);
  r.collection = "app.bsky.feed.post";
  r.rkey = "r" + std::to_string(n);
  r.body = "{}";
  r.position = n;
  return r;
}

// `chunks` chunks of one record each (0: without end); positions count from 1.
class CountingSource : public Source {
 public:
  explicit CountingSource(uint64_t chunks) : chunks_(chunks) {}
  Status Seek(const std::string& cursor) override {
    next_ = cursor.empty() ? 0 : std::stoull(cursor);
    return Status::OK();
  }
  Result<bool> Read(EventChunk* chunk) override {
    if (chunks_ != 0 && next_ >= chunks_) return false;
    chunk->events.push_back(Record(++next_));
    chunk->units_read = 1;
    chunk->resume_cursor = std::to_string(next_);
    return true;
  }
  std::string Describe() const override { return "counting source"; }

 private:
  uint64_t chunks_;
  uint64_t next_ = 0;
};

// A CountingSource whose every chunk logs an outcome (repo_unavailable: an account its PDS reports
// deactivated), but chunk `error_at` (from 1; 0 = none), which logs an error (bad_repo).
class OutcomeSource : public CountingSource {
 public:
  OutcomeSource(uint64_t chunks, uint64_t error_at) : CountingSource(chunks), error_at_(error_at) {}
  Result<bool> Read(EventChunk* chunk) override {
    ATFILL_ASSIGN_OR_RETURN(bool more, CountingSource::Read(chunk));
    if (!more) return false;
    const std::string did = "did:plc:account" + chunk->resume_cursor;
    if (chunk->resume_cursor == std::to_string(error_at_)) {
      chunk->errors.push_back({"bad_repo", did, "its commit does not verify"});
    } else {
      chunk->errors.push_back({"repo_unavailable", did, "HTTP 400 RepoDeactivated"});
    }
    return true;
  }

 private:
  uint64_t error_at_;
};

// `chunks` chunks, then the end of a stream that went quiet (the consumer pauses "stream_idle").
class IdleStream : public CountingSource {
 public:
  explicit IdleStream(uint64_t chunks) : CountingSource(chunks) {}
  state::StopReason Unfinished() const override {
    return {"stream_idle", "no message for a while"};
  }
};

// Chunks until its gate opens (a backfill that outlasts the stream's first run).
class GatedSource : public CountingSource {
 public:
  GatedSource(std::mutex* mu, std::condition_variable* cv, bool* open)
      : CountingSource(0), mu_(mu), cv_(cv), open_(open) {}
  Result<bool> Read(EventChunk* chunk) override {
    std::unique_lock lock(*mu_);
    if (cv_->wait_for(lock, std::chrono::milliseconds(5), [this] { return *open_; })) return false;
    lock.unlock();
    return CountingSource::Read(chunk);
  }

 private:
  std::mutex* mu_;
  std::condition_variable* cv_;
  bool* open_;
};

class RecordingSink : public Sink {
 public:
  Result<WriteStats> Write(std::span<const Event> batch) override {
    std::lock_guard lock(mu);
    for (const auto& e : batch) dids.insert(std::get<RecordEvent>(e).did);
    written += batch.size();
    WriteStats s;
    s.inserted = batch.size();
    return s;
  }
  std::string_view name() const override { return "recording"; }
  std::mutex mu;
  std::set<std::string> dids;
  uint64_t written = 0;
};

// Notes when it is destroyed, to check the order a plan's pieces go in.
struct Piece {
  Piece(std::vector<int>* log, int n) : log(log), n(n) {}
  ~Piece() { log->push_back(n); }
  std::vector<int>* log;
  int n;
};

class JobControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state::RocksDbOptions o;
    o.path = (dir_.path() / "state").string();
    auto kv = state::OpenRocksDb(o);
    ASSERT_TRUE(kv.ok()) << kv.status().message();
    kv_ = std::move(*kv);
    jobs_ = std::make_unique<state::JobStore>(*kv_);
    errors_ = std::make_unique<state::ErrorLog>(*kv_);
  }

  std::unique_ptr<JobController> MakeController(JobControllerOptions options = {}) {
    options.requests_dir = dir_.path() / "requests";
    auto c = std::make_unique<JobController>(kv_.get(), jobs_.get(), errors_.get(), options);
    // "count": N records (params "chunks"; 0 = without end) into the shared sink.
    c->SetPlanner("count", [this](state::JobRecord& job, const JobContext& ctx) {
      JobPlan plan = PlanOf(std::make_shared<CountingSource>(std::stoull(job.params["chunks"])),
                            "job/" + std::to_string(job.id) + "/count");
      plan.batch = BatcherOptions{.max_events = 10, .max_delay_ms = 5, .max_chunks = 10};
      if (ctx.hold_live) job.params["held"] = "1";
      return Result<JobPlan>(std::move(plan));
    });
    return c;
  }

  // A plan of `source` (owned by it) into the shared sink.
  // Kind "gated": each run reads a GatedSource that waits until `*open`.
  void SetGatedPlanner(JobController& c, std::mutex* mu, std::condition_variable* cv, bool* open) {
    c.SetPlanner("gated", [this, mu, cv, open](state::JobRecord& job, const JobContext&) {
      return Result<JobPlan>(PlanOf(std::make_shared<GatedSource>(mu, cv, open),
                                    "job/" + std::to_string(job.id) + "/gated"));
    });
  }

  JobPlan PlanOf(std::shared_ptr<Source> source, std::string cursor) {
    JobPlan plan;
    plan.source = source.get();
    plan.keep.push_back(std::move(source));
    plan.sink = &sink_;
    plan.cursor_name = std::move(cursor);
    return plan;
  }

  state::JobRecord NewJob(const std::string& kind, uint64_t chunks) {
    state::JobRecord r;
    r.kind = kind;
    r.stage = state::JobStage::kReplaying;
    r.params["chunks"] = std::to_string(chunks);
    auto created = jobs_->Create(r);
    EXPECT_TRUE(created.ok()) << created.status().message();
    return created.ok() ? *created : r;
  }

  testing::TempDir dir_;
  std::unique_ptr<state::KvStore> kv_;
  std::unique_ptr<state::JobStore> jobs_;
  std::unique_ptr<state::ErrorLog> errors_;
  RecordingSink sink_;
};

TEST_F(JobControllerTest, RunsAJobOfARegisteredKindToItsEnd) {
  auto c = MakeController();
  auto outcome = c->Run(NewJob("count", 120));
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  EXPECT_EQ(outcome->job.status, state::JobStatus::kCompleted);
  EXPECT_EQ(outcome->job.counters.events_read, 120u);
  EXPECT_FALSE(outcome->unresolved_errors);
  EXPECT_EQ(sink_.written, 120u);
  auto stored = jobs_->Get(outcome->job.id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->status, state::JobStatus::kCompleted);
  EXPECT_FALSE(c->Running(outcome->job.id));
}

// What the network reported of its accounts is logged but is no error: a job whose log holds only
// outcomes, even past the log's cap, completes without unresolved errors and is not stopped at
// the cap; one error before the cap makes it one with errors, and one past the cap (which the
// log cannot store) fails the job at the cap as before.
TEST_F(JobControllerTest, OutcomesInTheErrorLogAreNotErrorsEvenPastItsCap) {
  errors_ =
      std::make_unique<state::ErrorLog>(*kv_, state::ErrorLogOptions{.max_entries_per_job = 4});
  auto c = MakeController();
  c->SetPlanner("outcomes", [this](state::JobRecord& job, const JobContext&) {
    JobPlan plan = PlanOf(std::make_shared<OutcomeSource>(std::stoull(job.params["chunks"]),
                                                          std::stoull(job.params["error_at"])),
                          "job/" + std::to_string(job.id) + "/outcomes");
    plan.batch = BatcherOptions{.max_events = 1, .max_delay_ms = 5, .max_chunks = 1};
    return Result<JobPlan>(std::move(plan));
  });
  const auto run = [&](uint64_t error_at) {
    state::JobRecord job = NewJob("outcomes", 12);
    job.params["error_at"] = std::to_string(error_at);
    auto outcome = c->Run(std::move(job));
    EXPECT_TRUE(outcome.ok()) << outcome.status().message();
    return outcome.ok() ? *outcome : JobOutcome{};
  };

  const JobOutcome clean = run(0);
  EXPECT_EQ(clean.job.status, state::JobStatus::kCompleted) << clean.job.stop_reason.sentence;
  EXPECT_FALSE(clean.unresolved_errors);
  EXPECT_EQ(clean.job.counters.failed_records, 0u);
  auto kinds = errors_->CountsByKind(clean.job.id);
  ASSERT_TRUE(kinds.ok());
  EXPECT_EQ(kinds->at("repo_unavailable"), 12u);  // counted past the cap of 4

  const JobOutcome early = run(1);
  EXPECT_EQ(early.job.status, state::JobStatus::kCompleted) << early.job.stop_reason.sentence;
  EXPECT_TRUE(early.unresolved_errors);
  EXPECT_EQ(early.job.counters.failed_records, 1u);

  const JobOutcome late = run(9);
  EXPECT_EQ(late.job.status, state::JobStatus::kFailed);
  EXPECT_EQ(late.job.stop_reason.code, "error_cap");
  EXPECT_EQ(late.job.counters.failed_records, 1u);
}

TEST_F(JobControllerTest, AKindWithoutAPlannerIsRefusedByName) {
  auto c = MakeController();
  auto outcome = c->Run(NewJob("firehose", 1));
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(outcome.status().message().find("firehose"), std::string::npos);
}

TEST_F(JobControllerTest, APlannersErrorIsTheRunsError) {
  auto c = MakeController();
  c->SetPlanner("broken", [](state::JobRecord&, const JobContext&) -> Result<JobPlan> {
    return Status::Invalid("no relay is configured");
  });
  auto outcome = c->Run(NewJob("broken", 1));
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.status().code(), StatusCode::kInvalid);
  EXPECT_EQ(outcome.status().message(), "no relay is configured");
}

TEST_F(JobControllerTest, AShardedControllerWritesOnlyItsShardsAccounts) {
  JobControllerOptions options;
  options.shard = *Shard::Parse("1/3");
  auto c = MakeController(options);
  auto outcome = c->Run(NewJob("count", 300));
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  EXPECT_EQ(outcome->job.params["shard"], "1/3");
  ASSERT_FALSE(sink_.dids.empty());
  EXPECT_LT(sink_.written, 300u);
  for (const auto& did : sink_.dids) EXPECT_TRUE(options.shard.Owns(did)) << did;
}

TEST_F(JobControllerTest, APauseRequestFileFromAnotherProcessPausesTheJob) {
  auto c = MakeController();
  const auto dir = dir_.path() / "requests";
  state::JobRecord job = NewJob("count", 0);  // runs until stopped
  // The first committed batch is the gate: the request is written once the job runs.
  std::atomic<bool> asked{false};
  c->SetObserver([&](const state::JobRecord& j, const state::JobCounters*, const BatchReport* b) {
    if (b != nullptr && !asked.exchange(true)) {
      ASSERT_TRUE(JobController::WriteRequest(dir, j.id, "pause").ok());
    }
  });
  auto outcome = c->Run(job);
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  EXPECT_TRUE(asked.load());
  EXPECT_EQ(outcome->job.status, state::JobStatus::kPaused);
  EXPECT_GT(outcome->job.counters.events_read, 0u);
  // The request was served: a later run of the job is not paused by it again.
  EXPECT_FALSE(std::filesystem::exists(JobController::RequestPath(dir, job.id, "pause")));
}

TEST_F(JobControllerTest, ACancelRequestOutranksAPause) {
  auto c = MakeController();
  const auto dir = dir_.path() / "requests";
  state::JobRecord job = NewJob("count", 0);
  std::atomic<bool> asked{false};
  c->SetObserver([&](const state::JobRecord& j, const state::JobCounters*, const BatchReport* b) {
    if (b != nullptr && !asked.exchange(true)) {
      ASSERT_TRUE(JobController::WriteRequest(dir, j.id, "pause").ok());
      ASSERT_TRUE(JobController::WriteRequest(dir, j.id, "cancel").ok());
    }
  });
  auto outcome = c->Run(job);
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  EXPECT_EQ(outcome->job.status, state::JobStatus::kCancelled);
}

TEST_F(JobControllerTest, AnInterruptPausesEveryRunningJob) {
  std::atomic<bool> interrupted{false};
  JobControllerOptions options;
  options.interrupted = [&] { return interrupted.load(); };
  auto c = MakeController(options);
  c->SetObserver([&](const state::JobRecord&, const state::JobCounters*, const BatchReport* b) {
    if (b != nullptr) interrupted = true;
  });
  auto outcome = c->Run(NewJob("count", 0));
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  EXPECT_EQ(outcome->job.status, state::JobStatus::kPaused);
}

TEST_F(JobControllerTest, SteeringAJobNoProcessRunsMarksItAtOnce) {
  auto c = MakeController();
  // Marked running by a process that died: a pause waits for the restart that resumes it, a
  // cancel is final at once.
  state::JobRecord orphan = NewJob("count", 5);
  auto p = c->Steer(orphan.id, StopKind::kPause, "admin API");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(p.status().message().find("not running in this process"), std::string::npos);
  auto x = c->Steer(orphan.id, StopKind::kCancel, "admin API");
  ASSERT_TRUE(x.ok()) << x.status().message();
  EXPECT_EQ(x->status, state::JobStatus::kCancelled);
  EXPECT_EQ(x->stop_reason.sentence, "cancelled on request (admin API)");
  EXPECT_EQ(jobs_->Get(orphan.id)->status, state::JobStatus::kCancelled);
  // Nothing is left to do to a cancelled job.
  auto again = c->Steer(orphan.id, StopKind::kPause, "admin API");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kUnsupported);
  // The transitions this process made are in its stage history.
  auto changes = c->StageChanges(orphan.id, 0);
  ASSERT_FALSE(changes.empty());
  EXPECT_EQ(changes.back().to, state::JobStage::kCancelled);

  // Paused already (work was left): a pause answers it as it is.
  state::JobRecord deferred = NewJob("count", 5);
  deferred.status = state::JobStatus::kPaused;
  deferred.stop_reason = {"hosts_unavailable", "some hosts were down"};
  state::WriteBatch b;
  ASSERT_TRUE(jobs_->Put(&b, deferred).ok());
  ASSERT_TRUE(kv_->Write(b).ok());
  auto paused = c->Steer(deferred.id, StopKind::kPause, "admin API");
  ASSERT_TRUE(paused.ok()) << paused.status().message();
  EXPECT_EQ(paused->stop_reason.code, "hosts_unavailable");
}

TEST_F(JobControllerTest, ARunningJobIsAskedAndAnsweredAsPausing) {
  auto c = MakeController();
  state::JobRecord job = NewJob("count", 0);
  Result<state::JobRecord> steered = Status::Internal("not steered");
  std::atomic<bool> asked{false};
  c->SetObserver([&](const state::JobRecord& j, const state::JobCounters*, const BatchReport* b) {
    if (b != nullptr && !asked.exchange(true)) steered = c->Steer(j.id, StopKind::kPause, "test");
  });
  auto outcome = c->Run(job);
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  ASSERT_TRUE(steered.ok()) << steered.status().message();
  EXPECT_EQ(steered->status, state::JobStatus::kPausing);
  EXPECT_EQ(outcome->job.status, state::JobStatus::kPaused);
}

TEST_F(JobControllerTest, RecoverFinishesCancellationsAndReturnsWhatARestartResumes) {
  auto c = MakeController();
  auto put = [&](state::JobStatus status, std::string code) {
    state::JobRecord j = NewJob("count", 1);
    j.status = status;
    j.stop_reason.code = std::move(code);
    state::WriteBatch b;
    EXPECT_TRUE(jobs_->Put(&b, j).ok());
    EXPECT_TRUE(kv_->Write(b).ok());
    return j.id;
  };
  const uint64_t running = put(state::JobStatus::kRunning, "");
  const uint64_t pausing = put(state::JobStatus::kPausing, "");
  const uint64_t asked = put(state::JobStatus::kPaused, "paused");
  const uint64_t deferred = put(state::JobStatus::kPaused, "hosts_unavailable");
  const uint64_t cancelling = put(state::JobStatus::kCancelling, "");
  const uint64_t done = put(state::JobStatus::kCompleted, "");
  auto resumable = c->Recover();
  ASSERT_TRUE(resumable.ok()) << resumable.status().message();
  std::vector<uint64_t> ids;
  for (const auto& j : *resumable) ids.push_back(j.id);
  EXPECT_EQ(ids, (std::vector<uint64_t>{running, pausing, deferred}));
  EXPECT_EQ(jobs_->Get(cancelling)->status, state::JobStatus::kCancelled);
  EXPECT_EQ(jobs_->Get(asked)->status, state::JobStatus::kPaused);
  EXPECT_EQ(jobs_->Get(done)->status, state::JobStatus::kCompleted);
}

TEST_F(JobControllerTest, AGroupRunsItsJobsBesideTheCallerAndStopsASequenceAtAPause) {
  auto c = MakeController();
  state::JobRecord first = NewJob("count", 50);
  state::JobRecord endless = NewJob("count", 0);
  state::JobRecord never = NewJob("count", 50);
  std::mutex mu;
  std::vector<std::pair<uint64_t, state::JobStatus>> ended;
  JobGroup group(c.get());
  // A stop asked for before the job has started is handed to it when it starts.
  JobContext ctx;
  ctx.hold_live = true;
  ASSERT_TRUE(group
                  .Start({first, endless, never}, ctx,
                         [&](const state::JobRecord& j, const Result<JobOutcome>& o) {
                           std::lock_guard lock(mu);
                           ended.emplace_back(j.id,
                                              o.ok() ? o->job.status : state::JobStatus::kFailed);
                         })
                  .ok());
  EXPECT_TRUE(group.started());
  EXPECT_TRUE(c->Running(never.id));  // waiting for its turn counts as running
  EXPECT_TRUE(c->RequestStop(endless.id, StopKind::kPause));
  group.Wait();
  EXPECT_FALSE(group.running());
  EXPECT_TRUE(group.unfinished());
  EXPECT_FALSE(c->Running(never.id));
  std::lock_guard lock(mu);
  ASSERT_EQ(ended.size(), 2u);  // the third never ran
  EXPECT_EQ(ended[0], std::make_pair(first.id, state::JobStatus::kCompleted));
  EXPECT_EQ(ended[1], std::make_pair(endless.id, state::JobStatus::kPaused));
  EXPECT_EQ(jobs_->Get(first.id)->params["held"], "1");       // the context reached the planner
  EXPECT_EQ(jobs_->Get(never.id)->counters.events_read, 0u);  // it never ran
  group.Close();
  EXPECT_EQ(group.Start({never}).code(), StatusCode::kUnavailable);
}

TEST_F(JobControllerTest, APlansPiecesAreReleasedLastToFirstAfterItsEndHook) {
  auto c = MakeController();
  std::vector<int> log;
  bool after_ran_first = false;
  c->SetPlanner("pieces", [&](state::JobRecord&, const JobContext&) {
    JobPlan plan;
    auto source = std::make_shared<CountingSource>(3);
    plan.keep.push_back(std::make_shared<Piece>(&log, 1));
    plan.keep.push_back(source);
    plan.keep.push_back(std::make_shared<Piece>(&log, 2));
    plan.source = source.get();
    plan.sink = &sink_;
    plan.cursor_name = "pieces";
    plan.after = [&](const state::JobRecord& ended) {
      after_ran_first = log.empty() && ended.status == state::JobStatus::kCompleted;
    };
    return Result<JobPlan>(std::move(plan));
  });
  auto outcome = c->Run(NewJob("pieces", 3));
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  EXPECT_TRUE(after_ran_first);
  EXPECT_EQ(log, (std::vector<int>{2, 1}));
}

// A job paused and resumed at once (the admin API's resume while the paused run is still ending):
// the next start, announced while the earlier run ends, keeps the job counted as running, so a
// second resume is refused instead of starting the job twice.
TEST_F(JobControllerTest, ARunEndingAfterTheNextStartLeavesTheJobToThatStart) {
  auto c = MakeController();
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  SetGatedPlanner(*c, &mu, &cv, &open);
  const state::JobRecord job = NewJob("gated", 0);
  Result<JobOutcome> first = Status::Internal("not run");
  std::thread run([&] { first = c->Run(job); });
  EXPECT_TRUE(testing::WaitUntil([&] { return c->Running(job.id); }, std::chrono::seconds(20)));
  c->Starting(job.id);  // the next run is announced before this one has ended
  {
    std::lock_guard lock(mu);
    open = true;
  }
  cv.notify_all();
  run.join();
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(first->job.status, state::JobStatus::kCompleted);
  EXPECT_TRUE(c->Running(job.id));  // still claimed by the announced start
  c->Ended(job.id);                 // which does not run after all
  EXPECT_FALSE(c->Running(job.id));
}

TEST_F(JobControllerTest, AnIdleStreamWaitsForTheBackfillsBesideItThenRunsAgain) {
  auto c = MakeController();
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  SetGatedPlanner(*c, &mu, &cv, &open);
  std::vector<bool> held_at_start;  // per run of the consumer: did it hold for a backfill?
  c->SetPlanner("live", [&](state::JobRecord&, const JobContext& ctx) {
    held_at_start.push_back(ctx.backfill_running && ctx.backfill_running());
    return Result<JobPlan>(PlanOf(std::make_shared<IdleStream>(3), "live"));
  });
  state::JobRecord live = NewJob("live", 0);
  LiveService service;
  service.live_job = [&]() -> Result<state::JobRecord> { return jobs_->Get(live.id); };
  service.backfills = {NewJob("gated", 0)};
  std::vector<std::string> waits;
  service.waiting = [&](std::string_view what) {
    waits.emplace_back(what);
    // The consumer waits now: the backfill may end.
    std::lock_guard lock(mu);
    open = true;
    cv.notify_all();
  };
  std::vector<state::JobStatus> backfills_ended;
  service.backfill_done = [&](const state::JobRecord&, const Result<JobOutcome>& o) {
    backfills_ended.push_back(o.ok() ? o->job.status : state::JobStatus::kFailed);
  };
  auto outcome = c->RunLive(std::move(service));
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  EXPECT_EQ(outcome->job.stop_reason.code, "stream_idle");
  EXPECT_EQ(waits, (std::vector<std::string>{"backfill"}));
  EXPECT_EQ(held_at_start, (std::vector<bool>{true, false}));
  EXPECT_EQ(backfills_ended, (std::vector<state::JobStatus>{state::JobStatus::kCompleted}));
}

TEST_F(JobControllerTest, AnIdleStreamWaitsForTheGapReplayItStartedThenRunsAgain) {
  auto c = MakeController();
  int runs = 0;
  uint64_t gap_id = 0;
  c->SetPlanner("live", [&](state::JobRecord&, const JobContext& ctx) -> Result<JobPlan> {
    // The first run finds its cursor too old and replays the gap beside itself.
    if (runs++ == 0) {
      if (ctx.beside == nullptr) return Status::Internal("no group for the gap");
      state::JobRecord gap = NewJob("count", 40);
      gap_id = gap.id;
      ATFILL_RETURN_IF_ERROR(ctx.beside->Start({gap}));
    }
    return PlanOf(std::make_shared<IdleStream>(2), "live");
  });
  state::JobRecord live = NewJob("live", 0);
  LiveService service;
  service.live_job = [&]() -> Result<state::JobRecord> { return jobs_->Get(live.id); };
  auto outcome = c->RunLive(std::move(service));
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  EXPECT_EQ(runs, 2);
  ASSERT_NE(gap_id, 0u);
  EXPECT_EQ(jobs_->Get(gap_id)->status, state::JobStatus::kCompleted);
  EXPECT_EQ(outcome->job.stop_reason.code, "stream_idle");
}

}  // namespace
}  // namespace atfill::pipeline
