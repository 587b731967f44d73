#include "net/http_client_impl.hpp"

namespace atfill::net {

std::string_view HttpResponse::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (EqualsIgnoreCase(key, name)) return value;
  }
  return {};
}

Status HttpClientOptions::Validate() const {
  constexpr int64_t kDay = 24LL * 3600 * 1000;
  ATFILL_RETURN_IF_ERROR(Bounded("max_in_flight", max_in_flight, 1, 100'000));
  ATFILL_RETURN_IF_ERROR(Bounded("max_per_host", max_per_host, 1, 1'000));
  ATFILL_RETURN_IF_ERROR(Bounded("max_hosts", max_hosts, 1, 100'000));
  ATFILL_RETURN_IF_ERROR(Bounded<int64_t>("connect_timeout_ms", connect_timeout_ms, 1, kDay));
  ATFILL_RETURN_IF_ERROR(Bounded<int64_t>("timeout_ms", timeout_ms, 1, kDay));
  ATFILL_RETURN_IF_ERROR(
      Bounded<uint64_t>("max_response_bytes", max_response_bytes, 1, uint64_t{1} << 40));
  ATFILL_RETURN_IF_ERROR(Bounded("max_redirects", max_redirects, 0, 50));
  ATFILL_RETURN_IF_ERROR(Bounded("host_failure_threshold", host_failure_threshold, 1, 1'000));
  ATFILL_RETURN_IF_ERROR(Bounded<int64_t>("host_down_ms", host_down_ms, 0, kDay));
  if (Status st = retry.Validate(); !st.ok()) return st.WithContext("HttpClientOptions.retry");
  if (Status st = rate_limit.Validate(); !st.ok()) {
    return st.WithContext("HttpClientOptions.rate_limit");
  }
  if (user_agent.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
    return Status::Invalid("HttpClientOptions.user_agent has a line break or NUL");
  }
  if (version.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
    return Status::Invalid("HttpClientOptions.version has a line break or NUL");
  }
  return Status::OK();
}

HttpClient::Impl::Impl(HttpClientOptions options) : options_(std::move(options)) {
  if (!options_.now_unix_ms) options_.now_unix_ms = &SystemNowUnixMs;
  if (options_.user_agent.empty()) options_.user_agent = DefaultUserAgent(options_.version);
  rng_.seed(options_.random_seed != 0 ? options_.random_seed : std::random_device{}());
}

HttpClient::Impl::~Impl() {
  RequestStop();
  Join();
  if (multi_ != nullptr) curl_multi_cleanup(multi_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

Status HttpClient::Impl::Init() {
  ATFILL_RETURN_IF_ERROR(CurlGlobalInit());
  // The loop waits in epoll for the sockets libcurl names (its socket interface), so each
  // wake-up costs what happened on it, not a pass over every transfer and socket
  // (curl_multi_perform and curl_multi_poll are linear in them, which a crawl's hundreds of
  // transfers made measurable in bench/crawl_bench).
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return Status::Internal(std::string("epoll_create1: ") + strerror(errno));
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Status::Internal(std::string("eventfd: ") + strerror(errno));
  epoll_event wake{};
  wake.events = EPOLLIN;
  wake.data.fd = wake_fd_;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &wake) != 0) {
    return Status::Internal(std::string("epoll_ctl: ") + strerror(errno));
  }
  multi_ = curl_multi_init();
  if (multi_ == nullptr) return Status::Internal("curl_multi_init failed");
  CURLMcode rc = curl_multi_setopt(multi_, CURLMOPT_PIPELINING,
                                   options_.http2 ? CURLPIPE_MULTIPLEX : CURLPIPE_NOTHING);
  if (rc == CURLM_OK) {
    rc = curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS,
                           static_cast<long>(std::max(options_.max_in_flight, 16)));
  }
  if (rc == CURLM_OK) rc = curl_multi_setopt(multi_, CURLMOPT_SOCKETFUNCTION, &OnCurlSocket);
  if (rc == CURLM_OK) rc = curl_multi_setopt(multi_, CURLMOPT_SOCKETDATA, this);
  if (rc == CURLM_OK) rc = curl_multi_setopt(multi_, CURLMOPT_TIMERFUNCTION, &OnCurlTimer);
  if (rc == CURLM_OK) rc = curl_multi_setopt(multi_, CURLMOPT_TIMERDATA, this);
  if (rc != CURLM_OK) {
    return Status::Internal(std::string("curl_multi_setopt failed: ") + curl_multi_strerror(rc));
  }
  accepting_ = true;
  thread_ = std::thread([this] { Run(); });
  return Status::OK();
}

void HttpClient::Impl::Submit(HttpRequest request, HttpCallback done) {
  auto transfer = std::make_unique<Transfer>();
  transfer->request = std::move(request);
  transfer->done = std::move(done);
  transfer->submitted = Clock::now();
  transfer->impl = this;
  counters_.submitted.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(pending_mu_);
    if (accepting_) {
      pending_.push_back(std::move(transfer));
      // Under the lock: the loop clears accepting_ under it before the handle can go away.
      Wake();
      return;
    }
  }
  counters_.cancelled.fetch_add(1, std::memory_order_relaxed);
  counters_.completed.fetch_add(1, std::memory_order_relaxed);
  Deliver(transfer->done,
          Status::Cancelled("HTTP client is shut down; " + transfer->request.method + " " +
                            transfer->request.url + " not sent"));
}

void HttpClient::Impl::After(int64_t delay_ms, std::function<void()> fn) {
  Alarm alarm{Clock::now() + milliseconds(std::max<int64_t>(delay_ms, 0)), std::move(fn)};
  {
    std::lock_guard lock(pending_mu_);
    if (accepting_) {
      pending_alarms_.push_back(std::move(alarm));
      Wake();
      return;
    }
  }
  Ring(alarm);
}

void HttpClient::Impl::RequestStop() {
  std::lock_guard lock(pending_mu_);
  stop_.store(true);
  if (accepting_) Wake();
}

void HttpClient::Impl::Wake() {
  const uint64_t one = 1;
  // A full counter (it never is: the loop reads it on every wake-up) still wakes the loop.
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

void HttpClient::Impl::Join() {
  std::lock_guard lock(join_mu_);
  if (thread_.joinable() && !OnLoopThread()) thread_.join();
}

void HttpClient::Impl::Detach() {
  std::lock_guard lock(join_mu_);
  if (thread_.joinable()) thread_.detach();
}

HttpClientStats HttpClient::Impl::Stats() const {
  HttpClientStats s;
  auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  s.submitted = get(counters_.submitted);
  s.completed = get(counters_.completed);
  s.responses_2xx = get(counters_.by_class[2]);
  s.responses_3xx = get(counters_.by_class[3]);
  s.responses_4xx = get(counters_.by_class[4]);
  s.responses_5xx = get(counters_.by_class[5]);
  s.transport_errors = get(counters_.transport_errors);
  s.retries = get(counters_.retries);
  s.rate_limited = get(counters_.rate_limited);
  s.hosts_marked_down = get(counters_.hosts_marked_down);
  s.deferred = get(counters_.deferred);
  s.cancelled = get(counters_.cancelled);
  s.bytes_received = get(counters_.bytes_received);
  s.bytes_sent = get(counters_.bytes_sent);
  s.attempts = get(counters_.attempts);
  s.paced_ms = counters_.paced_ms.load(std::memory_order_relaxed);
  s.in_flight = counters_.in_flight.load(std::memory_order_relaxed);
  s.queued = std::max<int64_t>(0, counters_.live.load(std::memory_order_relaxed) - s.in_flight);
  s.active_hosts = counters_.active_hosts.load(std::memory_order_relaxed);
  return s;
}

HostStatus HttpClient::Impl::HostState(std::string_view key) const {
  HostStatus out;
  std::shared_lock lock(hosts_mu_);
  auto it = hosts_.find(std::string(key));
  if (it == hosts_.end()) return out;
  const Host& h = *it->second;
  out.known = true;
  out.in_flight = h.in_flight.load(std::memory_order_relaxed);
  out.queued = h.queued.load(std::memory_order_relaxed);
  out.consecutive_failures = h.consecutive_failures.load(std::memory_order_relaxed);
  out.down = h.down.load(std::memory_order_relaxed);
  const int64_t left_ns =
      h.cooldown_until_ns.load(std::memory_order_relaxed) - ToNanos(Clock::now());
  out.cooldown_remaining_ms = left_ns > 0 ? (left_ns + 999'999) / 1'000'000 : 0;
  return out;
}

void HttpClient::Impl::Deliver(HttpCallback& done, Result<HttpResponse> outcome) noexcept {
  if (done) done(std::move(outcome));
}

void HttpClient::Impl::Ring(Alarm& alarm) noexcept {
  if (alarm.fn) alarm.fn();
}

size_t HttpClient::Impl::OnBody(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  if (t->response.body.size() + n > t->max_bytes) {
    t->body_over_cap = true;
    return 0;  // anything but n aborts the transfer
  }
  if (t->response.body.empty()) {
    // Large bodies (repository CARs) would otherwise be copied through every doubling.
    curl_off_t announced = -1;
    if (curl_easy_getinfo(t->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &announced) == CURLE_OK &&
        announced > 0 && static_cast<uint64_t>(announced) <= t->max_bytes) {
      t->response.body.reserve(static_cast<size_t>(announced));
    }
  }
  t->response.body.append(data, n);
  t->impl->counters_.bytes_received.fetch_add(n, std::memory_order_relaxed);
  return n;
}

size_t HttpClient::Impl::OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  t->header_bytes += n;
  if (t->header_bytes > kMaxHeaderBytes) {
    t->headers_over_cap = true;
    return 0;
  }
  std::string_view line(data, n);
  if (line.starts_with("HTTP/")) {
    // A new response begins (after a redirect or an interim 1xx): keep only the last one's.
    t->response.headers.clear();
    return n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos || colon == 0) return n;
  std::string name(TrimView(line.substr(0, colon)));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  t->response.headers.emplace_back(std::move(name), std::string(TrimView(line.substr(colon + 1))));
  return n;
}

curl_socket_t HttpClient::Impl::OnOpenSocket(void* user, curlsocktype purpose,
                                             curl_sockaddr* address) {
  auto* t = static_cast<Transfer*>(user);
  if (purpose == CURLSOCKTYPE_IPCXN) {
    Status verdict = CheckPublicAddress(&address->addr, address->addrlen);
    if (!verdict.ok()) {
      t->refused = verdict.message();
      return CURL_SOCKET_BAD;
    }
  }
  return socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
}

void HttpClient::Impl::Run() {
  loop_id_.store(std::this_thread::get_id());
  while (!stop_.load()) {
    DrainSubmissions();
    FireTimers();
    FireAlarms();
    if (schedule_needed_) {
      schedule_needed_ = false;
      Schedule();
    }
    int running = 0;
    if (curl_due_ && Clock::now() >= curl_deadline_) {
      curl_due_ = false;
      curl_multi_socket_action(multi_, CURL_SOCKET_TIMEOUT, 0, &running);
    }
    if (HarvestCompletions()) {
      schedule_needed_ = true;
      continue;  // freed slots: schedule before sleeping
    }
    std::array<epoll_event, 64> events;
    const int n =
        ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), NextWaitMs());
    for (int i = 0; i < n; ++i) {
      const int fd = events[static_cast<size_t>(i)].data.fd;
      const uint32_t what = events[static_cast<size_t>(i)].events;
      if (fd == wake_fd_) {
        uint64_t count = 0;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_, &count, sizeof(count));
        continue;
      }
      int mask = 0;
      if ((what & EPOLLIN) != 0) mask |= CURL_CSELECT_IN;
      if ((what & EPOLLOUT) != 0) mask |= CURL_CSELECT_OUT;
      if ((what & (EPOLLERR | EPOLLHUP)) != 0) mask |= CURL_CSELECT_ERR;
      curl_multi_socket_action(multi_, fd, mask, &running);
    }
  }
  CancelEverything();
}

int HttpClient::Impl::OnCurlSocket(CURL* /*easy*/, curl_socket_t fd, int what, void* user,
                                   void* /*socket_data*/) {
  auto* self = static_cast<Impl*>(user);
  if (what == CURL_POLL_REMOVE) {
    // The socket may be closed already, which removed it from the set.
    ::epoll_ctl(self->epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    return 0;
  }
  epoll_event ev{};
  ev.data.fd = fd;
  if (what == CURL_POLL_IN || what == CURL_POLL_INOUT) ev.events |= EPOLLIN;
  if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT) ev.events |= EPOLLOUT;
  if (::epoll_ctl(self->epoll_fd_, EPOLL_CTL_MOD, fd, &ev) != 0 && errno == ENOENT) {
    ::epoll_ctl(self->epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
  return 0;
}

int HttpClient::Impl::OnCurlTimer(CURLM* /*multi*/, long timeout_ms, void* user) {
  auto* self = static_cast<Impl*>(user);
  self->curl_due_ = timeout_ms >= 0;
  if (timeout_ms >= 0) self->curl_deadline_ = Clock::now() + milliseconds(timeout_ms);
  return 0;
}

int HttpClient::Impl::NextWaitMs() {
  int64_t wait = kMaxPollMs;
  if (curl_due_) {
    const int64_t left_ms = std::chrono::ceil<milliseconds>(curl_deadline_ - Clock::now()).count();
    wait = std::min(wait, std::max<int64_t>(left_ms, 0));
  }
  if (!alarms_.empty()) {
    const auto left = alarms_.begin()->first - Clock::now();
    wait = std::min(wait, std::max<int64_t>(std::chrono::ceil<milliseconds>(left).count(), 0));
  }
  if (!timers_.empty()) {
    const auto left = timers_.top().when - Clock::now();
    // Rounded up so the loop does not wake just before the timer and spin.
    const int64_t left_ms = std::chrono::ceil<milliseconds>(left).count();
    wait = std::min(wait, std::max<int64_t>(left_ms, 0));
  }
  return static_cast<int>(wait);
}

void HttpClient::Impl::DrainSubmissions() {
  std::vector<std::unique_ptr<Transfer>> batch;
  std::vector<Alarm> alarms;
  {
    std::lock_guard lock(pending_mu_);
    batch.swap(pending_);
    alarms.swap(pending_alarms_);
  }
  for (auto& transfer : batch) Accept(std::move(transfer));
  for (Alarm& alarm : alarms) {
    const Clock::time_point when = alarm.when;
    alarms_.emplace(when, std::move(alarm));
  }
}

void HttpClient::Impl::FireAlarms() {
  const auto now = Clock::now();
  while (!alarms_.empty() && alarms_.begin()->first <= now) {
    // Taken out first: the alarm may call After(), which only queues.
    Alarm alarm = std::move(alarms_.begin()->second);
    alarms_.erase(alarms_.begin());
    Ring(alarm);
  }
}

void HttpClient::Impl::Accept(std::unique_ptr<Transfer> owned) {
  HttpRequest& request = owned->request;
  Status valid = ValidateRequest(request);
  Result<std::string> key = valid.ok() ? HostKey(request.url) : Result<std::string>(valid);
  if (!key.ok()) {
    counters_.completed.fetch_add(1, std::memory_order_relaxed);
    Deliver(owned->done, key.status().WithContext(request.method + " " + request.url));
    return;
  }
  owned->retry = request.retry.value_or(options_.retry);
  owned->origin = *key;
  owned->max_bytes =
      request.max_response_bytes > 0 ? request.max_response_bytes : options_.max_response_bytes;
  owned->timeout_ms = request.timeout_ms > 0 ? request.timeout_ms : options_.timeout_ms;
  Host* host = GetOrCreateHost(*key);
  owned->host = host;
  owned->id = next_id_++;
  Transfer* t = owned.get();
  transfers_.emplace(t->id, std::move(owned));
  counters_.live.fetch_add(1, std::memory_order_relaxed);
  if (host->down.load() && Clock::now() < host->down_until) {
    FinishDeferred(t);
    return;
  }
  Enqueue(t, /*front=*/false);
}

HttpClient::Impl::Host* HttpClient::Impl::GetOrCreateHost(const std::string& key) {
  if (auto it = hosts_.find(key); it != hosts_.end()) return it->second.get();
  auto host = std::make_unique<Host>(key);
  if (!options_.quota.header.empty()) host->quota = QuotaBucketFor(options_.quota, key);
  std::unique_lock lock(hosts_mu_);
  return hosts_.emplace(key, std::move(host)).first->second.get();
}

void HttpClient::Impl::MaybeForget(Host* h) {
  // While CancelEverything runs, transfers not yet finished may still point at the host.
  if (cancelling_ || h->in_ready || !h->queue.empty() || !h->backing_off.empty() ||
      h->in_flight.load() > 0 || h->down.load() || h->consecutive_failures.load() > 0 ||
      h->cooldown_until > Clock::now() || h->paced_until > Clock::now()) {
    return;
  }
  std::unique_lock lock(hosts_mu_);
  hosts_.erase(h->key);
}

void HttpClient::Impl::PublishQueued(Host* h) {
  h->queued.store(static_cast<int>(h->queue.size() + h->backing_off.size()));
}

void HttpClient::Impl::Enqueue(Transfer* t, bool front) {
  Host* h = t->host;
  if (front) {
    h->queue.push_front(t->id);
  } else {
    h->queue.push_back(t->id);
  }
  PublishQueued(h);
  if (!h->in_ready) {
    h->in_ready = true;
    ready_.push_back(h);
  }
  schedule_needed_ = true;
}

HttpClient::Impl::Transfer* HttpClient::Impl::Find(uint64_t id) {
  auto it = transfers_.find(id);
  return it == transfers_.end() ? nullptr : it->second.get();
}

void HttpClient::Impl::FireTimers() {
  const auto now = Clock::now();
  while (!timers_.empty() && timers_.top().when <= now) {
    const uint64_t id = timers_.top().id;
    timers_.pop();
    schedule_needed_ = true;
    if (id == 0) continue;
    Transfer* t = Find(id);
    if (t == nullptr || t->host->backing_off.erase(id) == 0) continue;  // already completed
    Host* h = t->host;
    PublishQueued(h);
    if (h->down.load() && now < h->down_until) {
      FinishDeferred(t);
    } else {
      Enqueue(t, /*front=*/true);
    }
  }
}

void HttpClient::Impl::StartAttempt(Transfer* t) {
  ++t->attempts;
  counters_.attempts.fetch_add(1, std::memory_order_relaxed);
  t->response = HttpResponse{};
  t->header_bytes = 0;
  t->body_over_cap = false;
  t->headers_over_cap = false;
  t->refused.clear();
  t->error_buffer[0] = '\0';
  CURL* easy = AcquireEasy();
  if (easy == nullptr) {
    Finish(t, Status::Internal("curl_easy_init failed (out of memory)"));
    return;
  }
  if (Status st = Configure(easy, t); !st.ok()) {
    curl_slist_free_all(t->header_list);
    t->header_list = nullptr;
    ReleaseEasy(easy);
    Finish(t, st.WithContext(t->request.method + " " + t->request.url));
    return;
  }
  if (CURLMcode rc = curl_multi_add_handle(multi_, easy); rc != CURLM_OK) {
    curl_slist_free_all(t->header_list);
    t->header_list = nullptr;
    ReleaseEasy(easy);
    Finish(t, Status::Internal(std::string("curl_multi_add_handle failed: ") +
                               curl_multi_strerror(rc)));
    return;
  }
  t->easy = easy;
  if (t->host->in_flight.fetch_add(1) == 0) counters_.active_hosts.fetch_add(1);
  counters_.in_flight.fetch_add(1);
  counters_.bytes_sent.fetch_add(t->request.body.size(), std::memory_order_relaxed);
}

CURL* HttpClient::Impl::AcquireEasy() {
  if (!idle_easy_.empty()) {
    CURL* e = idle_easy_.back();
    idle_easy_.pop_back();
    return e;
  }
  return curl_easy_init();
}

void HttpClient::Impl::ReleaseEasy(CURL* e) {
  curl_easy_reset(e);
  if (idle_easy_.size() < static_cast<size_t>(options_.max_in_flight)) {
    idle_easy_.push_back(e);
  } else {
    curl_easy_cleanup(e);
  }
}

void HttpClient::Impl::DetachEasy(Transfer* t) {
  if (t->easy == nullptr) return;
  curl_multi_remove_handle(multi_, t->easy);
  ReleaseEasy(t->easy);
  t->easy = nullptr;
  curl_slist_free_all(t->header_list);
  t->header_list = nullptr;
  if (t->host->in_flight.fetch_sub(1) == 1) counters_.active_hosts.fetch_sub(1);
  counters_.in_flight.fetch_sub(1);
}

bool HttpClient::Impl::HarvestCompletions() {
  bool any = false;
  int left = 0;
  while (CURLMsg* msg = curl_multi_info_read(multi_, &left)) {
    if (msg->msg != CURLMSG_DONE) continue;
    CURL* e = msg->easy_handle;
    const CURLcode code = msg->data.result;
    char* user = nullptr;
    curl_easy_getinfo(e, CURLINFO_PRIVATE, &user);
    auto* t = reinterpret_cast<Transfer*>(user);
    long status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    char* effective = nullptr;
    if (curl_easy_getinfo(e, CURLINFO_EFFECTIVE_URL, &effective) == CURLE_OK && effective) {
      t->response.effective_url = effective;
    }
    DetachEasy(t);
    any = true;
    if (t->host->quota) {
      t->host->quota->Settle(
          t->reserved, code == CURLE_OK ? t->response.body.size() : 0,
          code == CURLE_OK ? t->response.Header(options_.quota.header) : std::string_view());
      t->reserved = 0;
    }
    if (auto* observe = g_response_observer.load(std::memory_order_relaxed)) {
      observe(code == CURLE_OK ? static_cast<int>(status) : 0);
    }
    OnAttemptDone(t, code, static_cast<int>(status));
  }
  return any;
}

void HttpClient::Impl::Finish(Transfer* t, Result<HttpResponse> outcome) {
  auto node = transfers_.extract(t->id);
  std::unique_ptr<Transfer> owned = std::move(node.mapped());
  if (outcome.ok()) {
    HttpResponse& r = outcome.value();
    r.attempts = owned->attempts;
    r.elapsed_ms =
        std::chrono::duration_cast<milliseconds>(Clock::now() - owned->submitted).count();
    r.last_transport_error = owned->last_transport_error;
    r.throttled_ms = owned->throttled_ms;
  }
  HttpCallback done = std::move(owned->done);
  Host* h = owned->host;
  owned.reset();
  counters_.live.fetch_sub(1, std::memory_order_relaxed);
  counters_.completed.fetch_add(1, std::memory_order_relaxed);
  MaybeForget(h);
  Deliver(done, std::move(outcome));
}

void HttpClient::Impl::CancelEverything() {
  std::vector<std::unique_ptr<Transfer>> batch;
  std::vector<Alarm> alarms;
  {
    std::lock_guard lock(pending_mu_);
    accepting_ = false;
    batch.swap(pending_);
    alarms.swap(pending_alarms_);
  }
  cancelling_ = true;
  const Status cancelled = Status::Cancelled("HTTP client shut down");
  for (auto& t : batch) {
    counters_.cancelled.fetch_add(1, std::memory_order_relaxed);
    counters_.completed.fetch_add(1, std::memory_order_relaxed);
    Deliver(t->done, cancelled.WithContext(t->request.method + " " + t->request.url));
  }
  std::vector<uint64_t> ids;
  ids.reserve(transfers_.size());
  for (const auto& [id, t] : transfers_) ids.push_back(id);
  for (uint64_t id : ids) {
    Transfer* t = Find(id);
    if (t == nullptr) continue;
    DetachEasy(t);
    t->host->queue.clear();
    t->host->backing_off.clear();
    t->host->in_ready = false;
    counters_.cancelled.fetch_add(1, std::memory_order_relaxed);
    Finish(t, cancelled.WithContext(t->request.method + " " + t->request.url));
  }
  for (CURL* e : idle_easy_) curl_easy_cleanup(e);
  idle_easy_.clear();
  ready_.clear();
  // Alarms ring early rather than never: their owners wait for them as for a request.
  for (auto& [when, alarm] : alarms_) alarms.push_back(std::move(alarm));
  alarms_.clear();
  for (Alarm& alarm : alarms) Ring(alarm);
}

Result<std::unique_ptr<HttpClient>> HttpClient::Start(HttpClientOptions options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>(std::move(options));
  ATFILL_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<HttpClient>(new HttpClient(std::move(impl)));
}

HttpClient::HttpClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpClient::~HttpClient() {
  if (impl_ && impl_->OnLoopThread()) {
    // Destroyed from its own callback, against the contract: let the loop wind down on its own
    // rather than free what it is still using.
    impl_->RequestStop();
    impl_->Detach();
    static_cast<void>(impl_.release());
    return;
  }
  Shutdown();
}

void HttpClient::Submit(HttpRequest request, HttpCallback done) {
  impl_->Submit(std::move(request), std::move(done));
}

Result<HttpResponse> HttpClient::Fetch(HttpRequest request) {
  if (impl_->OnLoopThread()) {
    return Status::Internal(
        "HttpClient::Fetch called on the client's loop thread (it would wait "
        "for itself); use Submit from callbacks");
  }
  auto promise = std::make_shared<std::promise<Result<HttpResponse>>>();
  std::future<Result<HttpResponse>> future = promise->get_future();
  Submit(std::move(request),
         [promise](Result<HttpResponse> outcome) { promise->set_value(std::move(outcome)); });
  return future.get();
}

void HttpClient::After(int64_t delay_ms, std::function<void()> fn) {
  impl_->After(delay_ms, std::move(fn));
}

void HttpClient::Shutdown() {
  impl_->RequestStop();
  impl_->Join();
}

HttpClientStats HttpClient::stats() const { return impl_->Stats(); }

HostStatus HttpClient::HostState(std::string_view host) const { return impl_->HostState(host); }

const HttpClientOptions& HttpClient::options() const { return impl_->options(); }

void SetResponseObserver(void (*observer)(int status)) {
  g_response_observer.store(observer, std::memory_order_relaxed);
}

}  // namespace atfill::net
