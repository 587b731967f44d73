// Retry and rate-limit policies of the HTTP client, and the pure functions that turn them into
// waits (kept apart from the event loop so they can be tested without a network).
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.hpp"

namespace atfill::net {

// Retries of 5xx, 408, connection resets and timeouts: jittered exponential backoff.
struct RetryPolicy {
  // Attempts per request, the first included (1 = never retry); 1..100.
  int max_attempts = 5;
  // Backoff ceiling before the first retry, in milliseconds; doubles per retry.
  int64_t base_backoff_ms = 250;
  // Largest backoff ceiling, in milliseconds.
  int64_t max_backoff_ms = 30'000;

  Status Validate() const;
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
