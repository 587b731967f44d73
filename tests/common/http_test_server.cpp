#include "tests/common/http_test_server.hpp"
#include "base/low_port.hpp"
#include "tools/simnet/http_session.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace atfill::testing {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr uint64_t kMaxRequestBodyBytes = 16 << 20;

}  // namespace

std::string_view TestRequest::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (key == name) return value;
  }
  return {};
}

TestResponse JsonResponse(int status, std::string body) {
  TestResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

TestResponse XrpcErrorResponse(int status, std::string_view error, std::string_view message) {
  return JsonResponse(status, "{\"error\":\"" + std::string(error) + "\",\"message\":\"" +
                                  std::string(message) + "\"}");
}

TestResponse RateLimitedResponse(std::optional<int64_t> ratelimit_reset_unix_s,
                                 std::optional<std::string> retry_after) {
  TestResponse r = XrpcErrorResponse(429, "RateLimitExceeded", "Rate Limit Exceeded");
  if (ratelimit_reset_unix_s) {
    r.headers.emplace_back("RateLimit-Limit", "3000");
    r.headers.emplace_back("RateLimit-Remaining", "0");
    r.headers.emplace_back("RateLimit-Reset", std::to_string(*ratelimit_reset_unix_s));
  }
  if (retry_after) r.headers.emplace_back("Retry-After", *retry_after);
  return r;
}

TestResponse DelayedResponse(TestResponse response, int64_t delay_ms) {
  response.delay_ms = delay_ms;
  return response;
}

TestResponse DropMidBodyResponse(size_t total_bytes) {
  TestResponse r;
  r.body.assign(total_bytes, 'x');
  r.content_type = "application/octet-stream";
  r.fault = TestResponse::Fault::kDropMidBody;
  return r;
}

TestResponse FaultResponse(TestResponse::Fault fault) {
  TestResponse r;
  r.fault = fault;
  return r;
}

TestResponse HugeResponse(size_t bytes, bool chunked) {
  TestResponse r;
  r.body.assign(bytes, 'x');
  r.content_type = "application/octet-stream";
  r.chunked = chunked;
  return r;
}

RefusingPort::RefusingPort() {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    throw std::runtime_error("cannot reserve a loopback port");
  }
  port_ = ntohs(address.sin_port);
}

RefusingPort::~RefusingPort() {
  if (fd_ >= 0) close(fd_);
}

std::string RefusingPort::Url(std::string_view path) const {
  return "http://127.0.0.1:" + std::to_string(port_) + std::string(path);
}

void ConcurrencyGauge::Enter() {
  std::lock_guard lock(mu_);
  max_ = std::max(max_, ++current_);
  changed_.notify_all();
}

void ConcurrencyGauge::Leave() {
  std::lock_guard lock(mu_);
  --current_;
  changed_.notify_all();
}

int ConcurrencyGauge::current() const {
  std::lock_guard lock(mu_);
  return current_;
}

int ConcurrencyGauge::max() const {
  std::lock_guard lock(mu_);
  return max_;
}

bool ConcurrencyGauge::WaitForCurrent(int count, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return changed_.wait_for(lock, timeout, [&] { return current_ >= count; });
}

struct HttpTestServer::Impl {
  class Session;
  struct Parked {
    std::shared_ptr<Session> session;
    TestResponse response;
  };

  Handler handler;
  std::shared_ptr<ConcurrencyGauge> shared_gauge;
  ConcurrencyGauge gauge;
  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  uint16_t port = 0;

  mutable std::mutex mu;
  mutable std::condition_variable changed;
  bool hold = false;
  std::vector<Parked> parked;
  std::vector<TestRequest> log;
  int64_t connection_count = 0;

  void Enter() {
    gauge.Enter();
    if (shared_gauge) shared_gauge->Enter();
  }
  void Leave() {
    gauge.Leave();
    if (shared_gauge) shared_gauge->Leave();
  }

  void Accept();
  // Parks the response when hold is on (true), else leaves it to the caller (false).
  bool MaybePark(const std::shared_ptr<Session>& session, TestResponse& response) {
    std::lock_guard lock(mu);
    if (!hold) return false;
    parked.push_back(Parked{session, std::move(response)});
    changed.notify_all();
    return true;
  }
};

// The request stops counting as served (OnAnswering) before a byte of the answer leaves, so a
// client that reacts to the answer can never be seen exceeding its limit.
class HttpTestServer::Impl::Session : public simnet::HttpSession {
 public:
  Session(Impl* server, tcp::socket socket, uint64_t id)
      : HttpSession(std::move(socket), kMaxRequestBodyBytes, "atfill-test"),
        server_(server),
        id_(id) {}

  // Runs a parked or delayed response on this session's executor.
  void Continue(TestResponse response) { Answer(std::move(response)); }

 private:
  void OnRequest(Parser& parser) override {
    http::request<http::string_body> req = parser.release();
    TestRequest request;
    request.method = std::string(req.method_string());
    request.target = std::string(req.target());
    for (const auto& field : req) {
      std::string name(field.name_string());
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      request.headers.emplace_back(std::move(name), std::string(field.value()));
    }
    request.body = std::move(req.body());
    request.connection = id_;
    request.arrived = std::chrono::steady_clock::now();
    server_->Enter();
    {
      std::lock_guard lock(server_->mu);
      server_->log.push_back(request);
      server_->changed.notify_all();
    }
    TestResponse response = server_->handler(request);
    auto self = std::static_pointer_cast<Session>(shared_from_this());
    if (server_->MaybePark(self, response)) return;
    Continue(std::move(response));
  }

  void OnAnswering() override { server_->Leave(); }

  Impl* server_;
  uint64_t id_;
};

void HttpTestServer::Impl::Accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) return;  // closed: the server is stopping
    uint64_t id = 0;
    {
      std::lock_guard lock(mu);
      id = static_cast<uint64_t>(++connection_count);
      changed.notify_all();
    }
    std::make_shared<Session>(this, std::move(socket), id)->Start();
    Accept();
  });
}

HttpTestServer::HttpTestServer(Handler handler, std::shared_ptr<ConcurrencyGauge> shared_gauge,
                               int threads)
    : impl_(std::make_unique<Impl>()) {
  impl_->handler = std::move(handler);
  impl_->shared_gauge = std::move(shared_gauge);
  const auto loopback = asio::ip::make_address("127.0.0.1");
  impl_->acceptor.open(tcp::v4());
  impl_->acceptor.set_option(asio::socket_base::reuse_address(true));
  // A port below the ephemeral range (base/low_port.hpp).
  const auto bound = BindLowPort([&](uint16_t port) {
    beast::error_code ec;
    impl_->acceptor.bind(tcp::endpoint(loopback, port), ec);
    return !ec;
  });
  if (!bound) throw std::runtime_error("HttpTestServer: no free port below 32768 on 127.0.0.1");
  impl_->acceptor.listen(asio::socket_base::max_listen_connections);
  impl_->port = impl_->acceptor.local_endpoint().port();
  impl_->Accept();
  for (int i = 0; i < std::max(threads, 1); ++i) {
    impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  }
}

HttpTestServer::~HttpTestServer() {
  impl_->ioc.stop();
  for (std::thread& t : impl_->threads) t.join();
  beast::error_code ignored;
  impl_->acceptor.close(ignored);
  // Sessions own sockets of this io_context: let them go before it does.
  std::lock_guard lock(impl_->mu);
  impl_->parked.clear();
}

uint16_t HttpTestServer::port() const { return impl_->port; }

std::string HttpTestServer::Url(std::string_view path) const {
  return HostKey() + std::string(path);
}

std::string HttpTestServer::HostKey() const {
  return "http://127.0.0.1:" + std::to_string(impl_->port);
}

void HttpTestServer::SetHold(bool hold) {
  std::vector<Impl::Parked> release;
  {
    std::lock_guard lock(impl_->mu);
    impl_->hold = hold;
    if (!hold) release.swap(impl_->parked);
    impl_->changed.notify_all();
  }
  for (Impl::Parked& p : release) {
    auto session = p.session;
    asio::post(session->stream().get_executor(),
               [session, r = std::move(p.response)]() mutable { session->Continue(std::move(r)); });
  }
}

int64_t HttpTestServer::requests() const {
  std::lock_guard lock(impl_->mu);
  return static_cast<int64_t>(impl_->log.size());
}

int64_t HttpTestServer::connections() const {
  std::lock_guard lock(impl_->mu);
  return impl_->connection_count;
}

int HttpTestServer::concurrent() const { return impl_->gauge.current(); }
int HttpTestServer::max_concurrent() const { return impl_->gauge.max(); }

int HttpTestServer::held() const {
  std::lock_guard lock(impl_->mu);
  return static_cast<int>(impl_->parked.size());
}

std::vector<TestRequest> HttpTestServer::received() const {
  std::lock_guard lock(impl_->mu);
  return impl_->log;
}

bool HttpTestServer::WaitForHeld(int count, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(impl_->mu);
  return impl_->changed.wait_for(lock, timeout,
                                 [&] { return static_cast<int>(impl_->parked.size()) >= count; });
}

bool HttpTestServer::WaitForRequests(int64_t count, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(impl_->mu);
  return impl_->changed.wait_for(lock, timeout,
                                 [&] { return static_cast<int64_t>(impl_->log.size()) >= count; });
}

}  // namespace atfill::testing
