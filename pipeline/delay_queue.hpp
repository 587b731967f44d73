// Runs callbacks after a delay, on one thread of its own: a stage that must wait (a retry's
// backoff) hands the wait here and frees its flow-graph worker, instead of sleeping on it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

namespace atfill::pipeline {

class DelayQueue {
 public:
  DelayQueue();
  // Runs every callback still waiting at once (whoever waits for them is not left hanging), then
  // joins the thread. Must not run on the queue's thread.
  ~DelayQueue();
  DelayQueue(const DelayQueue&) = delete;
  DelayQueue& operator=(const DelayQueue&) = delete;

  // Runs `fn` on the queue's thread once `delay` has passed; callbacks due at the same time run
  // in the order they were given. `fn` must be cheap and must not block (it delays the others).
  // Thread-safe.
  void After(std::chrono::microseconds delay, std::function<void()> fn);

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    Clock::time_point due;
    uint64_t order;
    std::function<void()> fn;
    bool operator>(const Entry& o) const { return due != o.due ? due > o.due : order > o.order; }
  };
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue_;
  uint64_t next_order_ = 0;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace atfill::pipeline
