// What an attempt of a request ends with, and what may start next: retries and their backoff,
// redirects followed by hand, 429 cooldowns, hosts marked down and probed, byte quotas, and the
// per-host and global in-flight limits (HttpClient::Impl, net/http_client_impl.hpp).
#include "net/http_client_impl.hpp"

namespace atfill::net {

void HttpClient::Impl::Schedule() {
  const auto now = Clock::now();
  for (size_t n = ready_.size(); n > 0 && InFlight() < options_.max_in_flight; --n) {
    Host* h = ready_.front();
    ready_.pop_front();
    if (h->queue.empty()) {
      h->in_ready = false;
      MaybeForget(h);
      continue;
    }
    const bool down = h->down.load();
    if (down && now < h->down_until) {
      h->in_ready = false;
      DeferWaiting(h);
      continue;
    }
    const bool idle = h->in_flight.load() == 0;
    if (h->cooldown_until > now || h->paced_until > now ||
        (idle && counters_.active_hosts.load() >= options_.max_hosts)) {
      ready_.push_back(h);
      continue;
    }
    // A down host past its wait gets one probe at a time, with no retries.
    const int limit = down ? 1 : options_.max_per_host;
    while (!h->queue.empty() && h->in_flight.load() < limit &&
           InFlight() < options_.max_in_flight) {
      double reserved = 0;
      if (h->quota) {
        if (const int64_t wait = h->quota->Acquire(&reserved); wait > 0) {
          h->paced_until = now + milliseconds(wait);
          counters_.paced_ms.fetch_add(wait, std::memory_order_relaxed);
          timers_.push(Timer{h->paced_until, 0});
          break;
        }
      }
      Transfer* t = Find(h->queue.front());
      h->queue.pop_front();
      if (t == nullptr) {
        if (h->quota) h->quota->Settle(reserved, 0, {});
        continue;
      }
      t->probe = down;
      t->reserved = reserved;
      StartAttempt(t);
    }
    PublishQueued(h);
    if (h->queue.empty()) {
      h->in_ready = false;
      MaybeForget(h);
    } else {
      ready_.push_back(h);
    }
  }
}

Status HttpClient::Impl::Configure(CURL* e, Transfer* t) {
  const HttpRequest& r = t->request;
  CURLcode rc = CURLE_OK;
  // Variadic setopt: every value is passed with the exact type libcurl reads.
  auto set = [&](CURLoption option, auto value) {
    if (rc == CURLE_OK) rc = curl_easy_setopt(e, option, value);
  };
  set(CURLOPT_URL, r.url.c_str());
  set(CURLOPT_PRIVATE, static_cast<void*>(t));
  set(CURLOPT_ERRORBUFFER, t->error_buffer.data());
  set(CURLOPT_NOSIGNAL, 1L);
  set(CURLOPT_PROTOCOLS_STR, "http,https");
  set(CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  // Environment proxies would bypass the address check and make behaviour depend on the shell.
  set(CURLOPT_PROXY, "");
  // A request with credentials follows its redirects in OnAttemptDone, so that they never
  // leave their origin.
  const bool follow = options_.max_redirects > 0 && r.credentials.empty();
  set(CURLOPT_FOLLOWLOCATION, follow ? 1L : 0L);
  set(CURLOPT_MAXREDIRS, static_cast<long>(options_.max_redirects));
  set(CURLOPT_USERAGENT, options_.user_agent.c_str());
  set(CURLOPT_ACCEPT_ENCODING, "");  // every encoding libcurl decodes; caps apply after decoding
  set(CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout_ms));
  set(CURLOPT_TIMEOUT_MS, static_cast<long>(t->timeout_ms));
  set(CURLOPT_TCP_KEEPALIVE, 1L);
  set(CURLOPT_MAXFILESIZE_LARGE,
      static_cast<curl_off_t>(std::min<uint64_t>(t->max_bytes, INT64_MAX)));
  if (options_.http2) {
    set(CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_2TLS));
    // Only TLS negotiates HTTP/2; on plain http waiting would just serialise new hosts.
    if (r.url.size() >= 6 && EqualsIgnoreCase(std::string_view(r.url).substr(0, 6), "https:")) {
      set(CURLOPT_PIPEWAIT, 1L);
    }
  } else {
    set(CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  }
  set(CURLOPT_WRITEFUNCTION, &Impl::OnBody);
  set(CURLOPT_WRITEDATA, static_cast<void*>(t));
  set(CURLOPT_HEADERFUNCTION, &Impl::OnHeader);
  set(CURLOPT_HEADERDATA, static_cast<void*>(t));
  if (!options_.allow_private_addresses && !r.trusted_endpoint) {
    set(CURLOPT_OPENSOCKETFUNCTION, &Impl::OnOpenSocket);
    set(CURLOPT_OPENSOCKETDATA, static_cast<void*>(t));
  }
  if (r.method == "HEAD") {
    set(CURLOPT_NOBODY, 1L);
  } else if (r.method == "GET" && r.body.empty()) {
    set(CURLOPT_HTTPGET, 1L);
  } else if (r.method == "POST" || !r.body.empty()) {
    set(CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
    set(CURLOPT_POSTFIELDS, r.body.data());
    if (r.method != "POST") set(CURLOPT_CUSTOMREQUEST, r.method.c_str());
  } else {
    set(CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
  // "Expect:" stops libcurl from waiting for a 100-continue before large bodies.
  curl_slist* list = curl_slist_append(nullptr, "Expect:");
  HttpHeaders headers = r.headers;
  if (!r.credentials.empty()) {
    const Result<std::string> here = HostKey(r.url);
    if (here.ok() && *here == t->origin) {
      headers.insert(headers.end(), r.credentials.begin(), r.credentials.end());
    }
  }
  for (const auto& [name, value] : headers) {
    if (list == nullptr) break;
    // "Name;" is libcurl's spelling of a header with an empty value.
    const std::string line = value.empty() ? name + ";" : name + ": " + value;
    curl_slist* grown = curl_slist_append(list, line.c_str());
    if (grown == nullptr) {
      curl_slist_free_all(list);
      list = nullptr;
    }
    list = grown;
  }
  if (list == nullptr) return Status::Internal("out of memory building request headers");
  t->header_list = list;
  set(CURLOPT_HTTPHEADER, list);
  if (rc != CURLE_OK) {
    return Status::Internal(std::string("curl_easy_setopt failed: ") + curl_easy_strerror(rc));
  }
  return Status::OK();
}

void HttpClient::Impl::OnAttemptDone(Transfer* t, CURLcode code, int status) {
  Host* h = t->host;
  const std::string what = t->request.method + " " + t->request.url;
  // Attempts that used none of the retries (503s and 429s with budgets of their own, redirect
  // hops) leave the failures' count alone.
  const int failures = t->attempts - t->free_attempts;
  const bool exhausted = t->probe || failures >= MaxAttempts(t->retry);
  if (code != CURLE_OK) {
    if (t->body_over_cap || code == CURLE_FILESIZE_EXCEEDED) {
      Finish(t, Status::ResourceExhausted(what + ": response body exceeds the cap of " +
                                          std::to_string(t->max_bytes) + " bytes"));
      return;
    }
    if (t->headers_over_cap) {
      Finish(t, Status::ResourceExhausted(what + ": response headers exceed " +
                                          std::to_string(kMaxHeaderBytes) + " bytes"));
      return;
    }
    if (!t->refused.empty()) {
      Finish(t, Status::Invalid(what + ": refused to connect: " + t->refused));
      return;
    }
    counters_.transport_errors.fetch_add(1, std::memory_order_relaxed);
    std::string error = curl_easy_strerror(code);
    if (t->error_buffer[0] != '\0') error += std::string(" (") + t->error_buffer.data() + ")";
    t->last_transport_error = error;
    if (code == CURLE_URL_MALFORMAT || code == CURLE_UNSUPPORTED_PROTOCOL) {
      Finish(t, Status::Invalid(what + ": " + error));
      return;
    }
    NoteFailure(h, error);
    if (!IsRetryableTransport(code) || exhausted) {
      Finish(t, Status::Unavailable(what + ": " + error + " (after " + std::to_string(t->attempts) +
                                    " attempt" + (t->attempts == 1 ? "" : "s") + ")"));
    } else if (h->down.load()) {
      FinishDeferred(t);
    } else {
      Retry(t, RetryDelayMs(t->retry, failures, uniform_(rng_)));
    }
    return;
  }

  t->response.status = status;
  const int status_class = status / 100;
  if (status_class >= 1 && status_class <= 5) {
    counters_.by_class[status_class].fetch_add(1, std::memory_order_relaxed);
  }
  const int64_t now_unix_ms = options_.now_unix_ms();
  if (status == 429) {
    counters_.rate_limited.fetch_add(1, std::memory_order_relaxed);
    int64_t wait = RateLimitWaitMs(options_.rate_limit, t->response.ratelimit_reset(),
                                   t->response.retry_after(), now_unix_ms);
    if (const int64_t cap = t->retry.max_throttled_ms; cap > 0) {
      ++t->free_attempts;
      if (t->throttled_ms >= cap) {
        Finish(t, Status::ResourceExhausted(what + ": throttled (HTTP 429) for " +
                                            std::to_string(t->throttled_ms) +
                                            " ms in all; giving up"));
        return;
      }
      wait = std::clamp<int64_t>(wait, 1, cap - t->throttled_ms);
      t->throttled_ms += wait;
      Cooldown(h, wait);
      Enqueue(t, /*front=*/true);  // the host's cooldown holds it back
      return;
    }
    Cooldown(h, wait);
    if (exhausted) {
      Finish(t, std::move(t->response));
    } else {
      Retry(t, 0);  // the host's cooldown holds it back
    }
    return;
  }
  const int64_t max_retry_after = t->retry.max_retry_after_ms >= 0
                                      ? t->retry.max_retry_after_ms
                                      : options_.rate_limit.max_wait_ms;
  if (status == 503 && t->retry.unavailable_retries >= 0) {
    NoteFailure(h, "HTTP 503");
    ++t->free_attempts;
    if (t->probe || t->unavailable >= t->retry.unavailable_retries) {
      Finish(t, std::move(t->response));
    } else if (h->down.load()) {
      FinishDeferred(t);
    } else {
      ++t->unavailable;
      int64_t delay = ParseRetryAfterMs(t->response.retry_after(), now_unix_ms);
      if (delay < 0) delay = RetryDelayMs(t->retry, t->unavailable, uniform_(rng_));
      Retry(t, std::min(delay, max_retry_after));
    }
    return;
  }
  if (IsRetryableStatus(status)) {
    NoteFailure(h, "HTTP " + std::to_string(status));
    if (exhausted) {
      Finish(t, std::move(t->response));
    } else if (h->down.load()) {
      FinishDeferred(t);
    } else {
      int64_t delay = RetryDelayMs(t->retry, failures, uniform_(rng_));
      // A 503 with Retry-After states how long the server needs; honour it up to the cap.
      if (int64_t asked = ParseRetryAfterMs(t->response.retry_after(), now_unix_ms); asked > 0) {
        delay = std::max(delay, std::min(asked, max_retry_after));
      }
      Retry(t, delay);
    }
    return;
  }
  NoteAnswer(h);
  if (IsRedirect(status) && !t->request.credentials.empty() && options_.max_redirects > 0) {
    FollowRedirect(t, what);
    return;
  }
  // A server that announces its quota is used up gets a cooldown now rather than a 429 later.
  if (status_class == 2 && TrimView(t->response.ratelimit_remaining()) == "0") {
    RateLimitPolicy reset_only = options_.rate_limit;
    reset_only.default_wait_ms = 0;
    Cooldown(h, RateLimitWaitMs(reset_only, t->response.ratelimit_reset(), {}, now_unix_ms));
  }
  Finish(t, std::move(t->response));
}

void HttpClient::Impl::FollowRedirect(Transfer* t, const std::string& what) {
  const int status = t->response.status;
  const std::string_view location = t->response.Header("location");
  if (location.empty()) {
    Finish(t, std::move(t->response));  // nowhere to go: the 3xx is the answer
    return;
  }
  if (++t->redirects > options_.max_redirects) {
    Finish(t, Status::Invalid(what + ": more than " + std::to_string(options_.max_redirects) +
                              " redirects"));
    return;
  }
  std::string next = ResolveLocation(t->request.url, location);
  Result<std::string> key = HostKey(next);
  if (!key.ok()) {
    Finish(t, Status::Invalid(what + ": redirected to '" + next.substr(0, 200) +
                              "', not an http(s) URL"));
    return;
  }
  ++t->free_attempts;
  HttpRequest& r = t->request;
  r.url = std::move(next);
  if ((status == 303 && r.method != "HEAD") ||
      ((status == 301 || status == 302) && r.method == "POST")) {
    r.method = "GET";
    r.body.clear();
    std::erase_if(r.headers,
                  [](const auto& h) { return EqualsIgnoreCase(h.first, "content-type"); });
  }
  Host* from = t->host;
  t->host = GetOrCreateHost(*key);
  Enqueue(t, /*front=*/true);
  MaybeForget(from);
}

void HttpClient::Impl::Retry(Transfer* t, int64_t delay_ms) {
  counters_.retries.fetch_add(1, std::memory_order_relaxed);
  if (delay_ms <= 0) {
    Enqueue(t, /*front=*/true);
    return;
  }
  t->host->backing_off.insert(t->id);
  PublishQueued(t->host);
  timers_.push(Timer{Clock::now() + milliseconds(delay_ms), t->id});
}

void HttpClient::Impl::Cooldown(Host* h, int64_t wait_ms) {
  if (wait_ms <= 0) return;
  const auto until = Clock::now() + milliseconds(wait_ms);
  if (until <= h->cooldown_until) return;
  h->cooldown_until = until;
  h->cooldown_until_ns.store(ToNanos(until));
  timers_.push(Timer{until, 0});
}

void HttpClient::Impl::NoteFailure(Host* h, const std::string& error) {
  h->last_error = error;
  if (h->consecutive_failures.fetch_add(1) + 1 >= options_.host_failure_threshold) MarkDown(h);
}

void HttpClient::Impl::NoteAnswer(Host* h) {
  h->consecutive_failures.store(0);
  h->down.store(false);
}

void HttpClient::Impl::MarkDown(Host* h) {
  if (!h->down.exchange(true)) {
    counters_.hosts_marked_down.fetch_add(1, std::memory_order_relaxed);
  }
  h->down_until = Clock::now() + milliseconds(options_.host_down_ms);
  DeferWaiting(h);
}

void HttpClient::Impl::DeferWaiting(Host* h) {
  std::vector<uint64_t> ids(h->queue.begin(), h->queue.end());
  ids.insert(ids.end(), h->backing_off.begin(), h->backing_off.end());
  h->queue.clear();
  h->backing_off.clear();
  PublishQueued(h);
  for (uint64_t id : ids) {
    if (Transfer* t = Find(id)) FinishDeferred(t);
  }
}

void HttpClient::Impl::FinishDeferred(Transfer* t) {
  const Host* h = t->host;
  counters_.deferred.fetch_add(1, std::memory_order_relaxed);
  std::string message = "host " + h->key + " failed " +
                        std::to_string(h->consecutive_failures.load()) +
                        " times in a row; deferred";
  if (!h->last_error.empty()) message += " (last error: " + h->last_error + ")";
  Finish(t, Status::Unavailable(std::move(message)));
}

}  // namespace atfill::net
