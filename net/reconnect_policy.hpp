// When and where a long-lived connection (the WebSocket client) tries again after it ends:
// jittered exponential backoff, failover along a list of hosts, and a reset once a connection has
// proved stable. Pure and single-threaded, so it is tested without a network.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/status.hpp"

namespace atfill::net {

struct ReconnectPolicy {
  // Ceiling of the wait before the first retry, in milliseconds; doubles per consecutive failure.
  int64_t base_backoff_ms = 1'000;
  // Largest ceiling, in milliseconds. Every wait is a uniform draw in [0, ceiling] ("full jitter").
  int64_t max_backoff_ms = 60'000;
  // Consecutive failed attempts on one host before the next host of the list is tried; 1..1000.
  int failures_before_failover = 3;
  // A connection that delivered at least one data message, or that stayed up at least this long
  // (in milliseconds), counts as a success: the failure counts and the backoff start over (and
  // the next attempt stays on the same host). Counting delivery matters for a stream that drops
  // every few seconds: it made progress, so it reconnects at once rather than backing off to
  // max_backoff_ms and falling behind.
  int64_t stable_after_ms = 60'000;
  // Consecutive failed attempts over all hosts after which the caller should give up; 0 = never.
  int max_consecutive_failures = 0;

  // OK, or Invalid naming the first field out of range and its value.
  Status Validate() const;
};

// What to do after an attempt ended.
struct ReconnectStep {
  // Wait before the next attempt, in milliseconds (0 <= delay_ms <= max_backoff_ms).
  int64_t delay_ms = 0;
  // The host (an entry of the list) the next attempt uses.
  std::string host;
  // The host differs from the one the ended attempt used.
  bool failed_over = false;
  // max_consecutive_failures was reached: no further attempt should be made.
  bool give_up = false;
};

// The schedule of one connection's attempts over `hosts` (tried in list order, wrapping around).
// Not thread-safe: one owner drives it.
class ReconnectSchedule {
 public:
  // `policy` must be valid and `hosts` non-empty (a single empty host stands in otherwise).
  // `seed` seeds the jitter; 0 = seeded from std::random_device.
  ReconnectSchedule(ReconnectPolicy policy, std::vector<std::string> hosts, uint64_t seed);

  // The host the next (or current) attempt uses.
  const std::string& host() const { return hosts_[index_]; }
  size_t host_index() const { return index_; }

  // Records the end of the current attempt. `connected_ms` is how long the connection was open,
  // or -1 when it never opened (refused, failed to connect or to upgrade); `messages` is how many
  // data messages it delivered.
  ReconnectStep AttemptEnded(int64_t connected_ms, uint64_t messages = 0);

  // Failed attempts in a row on the current host, and over all hosts.
  int host_failures() const { return host_failures_; }
  int consecutive_failures() const { return consecutive_failures_; }

 private:
  ReconnectPolicy policy_;
  std::vector<std::string> hosts_;
  size_t index_ = 0;
  int host_failures_ = 0;
  int consecutive_failures_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace atfill::net
