#include "net/reconnect_policy.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "net/retry_policy.hpp"

namespace atfill::net {

Status ReconnectPolicy::Validate() const {
  if (base_backoff_ms < 0) {
    return Status::Invalid("ReconnectPolicy.base_backoff_ms must not be negative, got " +
                           std::to_string(base_backoff_ms));
  }
  if (max_backoff_ms < base_backoff_ms) {
    return Status::Invalid("ReconnectPolicy.max_backoff_ms (" + std::to_string(max_backoff_ms) +
                           ") must be at least base_backoff_ms (" +
                           std::to_string(base_backoff_ms) + ")");
  }
  if (failures_before_failover < 1 || failures_before_failover > 1000) {
    return Status::Invalid("ReconnectPolicy.failures_before_failover must be in 1..1000, got " +
                           std::to_string(failures_before_failover));
  }
  if (stable_after_ms < 0) {
    return Status::Invalid("ReconnectPolicy.stable_after_ms must not be negative, got " +
                           std::to_string(stable_after_ms));
  }
  if (max_consecutive_failures < 0) {
    return Status::Invalid("ReconnectPolicy.max_consecutive_failures must not be negative, got " +
                           std::to_string(max_consecutive_failures));
  }
  return Status::OK();
}

ReconnectSchedule::ReconnectSchedule(ReconnectPolicy policy, std::vector<std::string> hosts,
                                     uint64_t seed)
    : policy_(policy), hosts_(std::move(hosts)) {
  if (hosts_.empty()) hosts_.emplace_back();
  if (seed == 0) {
    std::random_device device;
    seed = (uint64_t{device()} << 32) ^ device();
  }
  rng_.seed(seed);
}

ReconnectStep ReconnectSchedule::AttemptEnded(int64_t connected_ms, uint64_t messages) {
  ReconnectStep step;
  if (connected_ms >= 0 && (messages > 0 || connected_ms >= policy_.stable_after_ms)) {
    host_failures_ = 0;
    consecutive_failures_ = 0;
  } else {
    ++host_failures_;
    ++consecutive_failures_;
    if (host_failures_ >= policy_.failures_before_failover && hosts_.size() > 1) {
      index_ = (index_ + 1) % hosts_.size();
      host_failures_ = 0;
      step.failed_over = true;
    }
  }
  step.host = hosts_[index_];
  step.give_up = policy_.max_consecutive_failures > 0 &&
                 consecutive_failures_ >= policy_.max_consecutive_failures;
  // The retry number drives the exponent: the backoff keeps growing across a failover, so a
  // fleet that is down everywhere is not hammered host after host.
  const RetryPolicy shape{.max_attempts = 1,
                          .base_backoff_ms = policy_.base_backoff_ms,
                          .max_backoff_ms = policy_.max_backoff_ms};
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  step.delay_ms = BackoffDelayMs(shape, std::max(1, consecutive_failures_), u);
  return step;
}

}  // namespace atfill::net
