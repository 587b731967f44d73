#include "net/retry_policy.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <string>

namespace atfill::net {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// A non-negative decimal integer filling all of `s`, or -1. Saturates instead of overflowing so
// that an absurd value still means "a long time".
int64_t ParseSeconds(std::string_view s) {
  s = Trim(s);
  if (s.empty() || s.size() > 32) return -1;
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (end != s.data() + s.size()) return -1;
  if (ec == std::errc::result_out_of_range) return std::numeric_limits<int64_t>::max() / 1000;
  if (ec != std::errc()) return -1;
  return static_cast<int64_t>(
      std::min<uint64_t>(value, std::numeric_limits<int64_t>::max() / 1000));
}

}  // namespace

Status RetryPolicy::Validate() const {
  if (max_attempts < 1 || max_attempts > 100) {
    return Status::Invalid("RetryPolicy.max_attempts must be in 1..100, got " +
                           std::to_string(max_attempts));
  }
  if (base_backoff_ms < 0) {
    return Status::Invalid("RetryPolicy.base_backoff_ms must not be negative, got " +
                           std::to_string(base_backoff_ms));
  }
  if (max_backoff_ms < base_backoff_ms) {
    return Status::Invalid("RetryPolicy.max_backoff_ms (" + std::to_string(max_backoff_ms) +
                           ") must be at least base_backoff_ms (" +
                           std::to_string(base_backoff_ms) + ")");
  }
  constexpr int64_t kDayMs = 86'400'000;
  if (delays_ms.size() > 100) {
    return Status::Invalid("RetryPolicy.delays_ms has " + std::to_string(delays_ms.size()) +
                           " entries; at most 100");
  }
  for (const int64_t d : delays_ms) {
    if (d < 0 || d > kDayMs) {
      return Status::Invalid("RetryPolicy.delays_ms entries must be in 0..86400000, got " +
                             std::to_string(d));
    }
  }
  if (unavailable_retries < -1 || unavailable_retries > 100) {
    return Status::Invalid("RetryPolicy.unavailable_retries must be in -1..100, got " +
                           std::to_string(unavailable_retries));
  }
  if (max_retry_after_ms < -1 || max_retry_after_ms > kDayMs) {
    return Status::Invalid("RetryPolicy.max_retry_after_ms must be in -1..86400000, got " +
                           std::to_string(max_retry_after_ms));
  }
  if (max_throttled_ms < 0 || max_throttled_ms > 7 * kDayMs) {
    return Status::Invalid("RetryPolicy.max_throttled_ms must be in 0..604800000, got " +
                           std::to_string(max_throttled_ms));
  }
  return Status::OK();
}

int64_t RetryDelayMs(const RetryPolicy& policy, int retry, double uniform01) {
  if (policy.delays_ms.empty()) return BackoffDelayMs(policy, retry, uniform01);
  const size_t i = static_cast<size_t>(std::max(retry, 1) - 1);
  return policy.delays_ms[std::min(i, policy.delays_ms.size() - 1)];
}

int MaxAttempts(const RetryPolicy& policy) {
  return policy.delays_ms.empty() ? policy.max_attempts
                                  : static_cast<int>(policy.delays_ms.size()) + 1;
}

Status RateLimitPolicy::Validate() const {
  if (default_wait_ms < 0) {
    return Status::Invalid("RateLimitPolicy.default_wait_ms must not be negative, got " +
                           std::to_string(default_wait_ms));
  }
  if (max_wait_ms < default_wait_ms) {
    return Status::Invalid("RateLimitPolicy.max_wait_ms (" + std::to_string(max_wait_ms) +
                           ") must be at least default_wait_ms (" +
                           std::to_string(default_wait_ms) + ")");
  }
  return Status::OK();
}

int64_t BackoffDelayMs(const RetryPolicy& policy, int retry, double uniform01) {
  int64_t ceiling = std::max<int64_t>(policy.base_backoff_ms, 0);
  for (int i = 1; i < retry && ceiling < policy.max_backoff_ms; ++i) ceiling *= 2;
  ceiling = std::min(ceiling, policy.max_backoff_ms);
  if (ceiling <= 0) return 0;
  const double u = std::clamp(uniform01, 0.0, 1.0);
  return std::min(ceiling, static_cast<int64_t>(u * static_cast<double>(ceiling + 1)));
}

int64_t ParseRetryAfterMs(std::string_view retry_after, int64_t now_unix_ms) {
  retry_after = Trim(retry_after);
  if (retry_after.empty()) return -1;
  if (int64_t seconds = ParseSeconds(retry_after); seconds >= 0) return seconds * 1000;
  // An HTTP-date; libcurl's parser handles the three formats RFC 9110 allows.
  if (retry_after.size() > 64) return -1;
  const std::string text(retry_after);
  const time_t when = curl_getdate(text.c_str(), nullptr);
  if (when < 0) return -1;
  const int64_t wait = static_cast<int64_t>(when) * 1000 - now_unix_ms;
  return wait > 0 ? wait : -1;
}

int64_t RateLimitWaitMs(const RateLimitPolicy& policy, std::string_view ratelimit_reset,
                        std::string_view retry_after, int64_t now_unix_ms) {
  int64_t wait = -1;
  if (int64_t reset_s = ParseSeconds(ratelimit_reset); reset_s >= 0) {
    const int64_t until = reset_s * 1000 - now_unix_ms;
    if (until > 0) wait = until;
  }
  if (wait < 0) wait = ParseRetryAfterMs(retry_after, now_unix_ms);
  if (wait < 0) wait = policy.default_wait_ms;
  return std::clamp<int64_t>(wait, 0, policy.max_wait_ms);
}

}  // namespace atfill::net
