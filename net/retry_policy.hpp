// Retry and rate-limit policies of the HTTP client, and the pure functions that turn them into
// waits (kept apart from the event loop so they can be tested without a network).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"

namespace atfill::net {

// Retries of 5xx, 408, connection resets and timeouts: jittered exponential backoff, or an
// explicit schedule. 503 and 429 may be given budgets of their own (a server that says "not now"
// is not failing).
struct RetryPolicy {
  // Attempts per request, the first included (1 = never retry); 1..100. Ignored when delays_ms
  // is set.
  int max_attempts = 5;
  // Backoff ceiling before the first retry, in milliseconds; doubles per retry.
  int64_t base_backoff_ms = 250;
  // Largest backoff ceiling, in milliseconds.
  int64_t max_backoff_ms = 30'000;
  // An explicit schedule, in milliseconds: the wait before retry k is delays_ms[k-1], without
  // jitter, and a request is retried delays_ms.size() times (max_attempts is ignored). Empty =
  // the jittered backoff above. At most 100 entries, each 0..86400000.
  std::vector<int64_t> delays_ms = {};
  // Retries of a 503, counted apart from the failures above (they use no attempt): each waits the
  // answer's Retry-After, or the schedule's wait for its count when it has none, capped at
  // max_retry_after_ms; the 503 is the answer once they are used up. -1 = a 503 is retried like
  // any other 5xx. -1..100.
  int unavailable_retries = -1;
  // Longest wait a 503's Retry-After is granted, in milliseconds; -1 = RateLimitPolicy's
  // max_wait_ms.
  int64_t max_retry_after_ms = -1;
  // 0: a 429 uses an attempt like a failure (after the host's cooldown), and the last one is the
  // answer. > 0: a 429 uses no attempt; the request waits each cooldown out until it has spent
  // this long throttled in all, in milliseconds, then fails with ResourceExhausted.
  int64_t max_throttled_ms = 0;

  Status Validate() const;
};

// A byte quota a server advertises in a response header: once a host's answer carries it,
// requests to that host are paced to it by a token bucket of response body bytes (no burst
// allowance). A request starts when the bucket is not in debt, reserving the average response
// size; it is charged its real size when it completes. A later value replaces the rate; 0 turns
// pacing off; answers without the header leave it as it is. The bucket is process-wide: every
// client with the same header and scope shares it per host.
struct ByteQuotaPolicy {
  // The response header carrying the quota, in decimal bytes per second; empty = no pacing.
  std::string header;
  // What the quota belongs to besides the host (the credential it is granted to, say): clients
  // naming the same scope share one bucket per host.
  std::string scope;
};

// How long a host cools down after a 429 (or after a response that says its quota is used up).
struct RateLimitPolicy {
  // Wait when a 429 carries neither a usable RateLimit-Reset nor Retry-After, in milliseconds.
  int64_t default_wait_ms = 5'000;
  // Longest wait any header can ask for, in milliseconds.
  int64_t max_wait_ms = 120'000;

  Status Validate() const;
};

// The backoff before retry number `retry` (1 for the first retry): "full jitter", a uniform draw
// in [0, min(max_backoff_ms, base_backoff_ms * 2^(retry-1))]. `uniform01` is a draw in [0, 1).
int64_t BackoffDelayMs(const RetryPolicy& policy, int retry, double uniform01);

// The wait before retry number `retry` (1 for the first) of a failure: delays_ms[retry-1] (the
// last entry past its end) when the policy has a schedule, else BackoffDelayMs.
int64_t RetryDelayMs(const RetryPolicy& policy, int retry, double uniform01);

// Attempts a request may make for failures, the first included.
int MaxAttempts(const RetryPolicy& policy);

// The cooldown a rate-limited host asks for, in milliseconds, from these response headers (each
// may be empty): RateLimit-Reset as unix seconds, if it lies after `now_unix_ms`; else
// Retry-After as delta seconds or an HTTP-date; else the policy's default. Clamped to
// [0, max_wait_ms]. Unparseable or past values fall through to the next source.
int64_t RateLimitWaitMs(const RateLimitPolicy& policy, std::string_view ratelimit_reset,
                        std::string_view retry_after, int64_t now_unix_ms);

// The wait named by a Retry-After value (delta seconds or HTTP-date) in milliseconds, or -1 when
// the value is empty, malformed or in the past. Not clamped.
int64_t ParseRetryAfterMs(std::string_view retry_after, int64_t now_unix_ms);

}  // namespace atfill::net
