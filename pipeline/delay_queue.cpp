#include "pipeline/delay_queue.hpp"

#include <utility>

namespace atfill::pipeline {

DelayQueue::DelayQueue() : thread_([this] { Loop(); }) {}

DelayQueue::~DelayQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DelayQueue::After(std::chrono::microseconds delay, std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push(Entry{Clock::now() + delay, next_order_++, std::move(fn)});
  // Under the lock: the destructor takes it before the condition variable dies.
  cv_.notify_all();
}

void DelayQueue::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (queue_.empty()) {
      if (done_) return;
      cv_.wait(lock);
      continue;
    }
    // A copy: wait_until reads the time again after waking, when an After() meanwhile may have
    // grown the queue's storage and freed the entry it would refer to.
    const Clock::time_point due = queue_.top().due;
    if (!done_ && Clock::now() < due) {
      cv_.wait_until(lock, due);
      continue;
    }
    std::function<void()> fn = std::move(const_cast<Entry&>(queue_.top()).fn);
    queue_.pop();
    lock.unlock();
    fn();
    lock.lock();
  }
}

}  // namespace atfill::pipeline
