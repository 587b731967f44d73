#include "sources/verify_schedule.hpp"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <utility>

#include "pipeline/job.hpp"
#include "sources/components.hpp"

namespace atfill::sources {

VerifySchedule::VerifySchedule(pipeline::Environment env, VerifyScheduleOptions options, RunFn run)
    : env_(std::move(env)), options_(std::move(options)), run_(std::move(run)) {
  options_.targets.dids.clear();
}

VerifySchedule::~VerifySchedule() { Stop(); }

void VerifySchedule::Start() {
  if (options_.every_hours <= 0 || thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

void VerifySchedule::Stop(const std::function<void(uint64_t job_id)>& stop_job) {
  uint64_t running = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    running = running_id_;
  }
  cv_.notify_all();
  if (running != 0 && stop_job) stop_job(running);
  if (thread_.joinable()) thread_.join();
}

uint64_t VerifySchedule::runs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return runs_;
}

void VerifySchedule::Loop() {
  const auto every = std::chrono::microseconds(static_cast<int64_t>(options_.every_hours * 3.6e9));
  // The newest verify job's end (or now): a restart keeps the rhythm instead of verifying at once.
  int64_t last_end_us = pipeline::NowMicros();
  if (auto jobs = env_.jobs->List(); jobs.ok()) {
    int64_t newest = 0;
    for (const state::JobRecord& j : *jobs) {
      if (j.kind == "verify") newest = std::max({newest, j.finished_us, j.heartbeat_us});
    }
    if (newest > 0) last_end_us = newest;
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const auto due =
        std::chrono::system_clock::time_point(std::chrono::microseconds(last_end_us)) + every;
    if (cv_.wait_until(lock, due, [this] { return stopping_; })) break;
    lock.unlock();
    Result<state::JobRecord> job = CreateVerifyJob(env_, options_.targets, "schedule");
    if (!job.ok()) {
      env_.Log("atfill: verify schedule: " + job.status().message());
    } else {
      lock.lock();
      running_id_ = job->id;
      const bool stop_now = stopping_;
      lock.unlock();
      if (!stop_now) {
        Result<pipeline::JobOutcome> outcome = run_(std::move(*job));
        if (!outcome.ok()) env_.Log("atfill: verify schedule: " + outcome.status().message());
      }
    }
    last_end_us = pipeline::NowMicros();
    lock.lock();
    running_id_ = 0;
    ++runs_;
  }
}

}  // namespace atfill::sources
