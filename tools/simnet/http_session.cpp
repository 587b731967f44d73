#include "tools/simnet/http_session.hpp"

#include <boost/asio/write.hpp>

#include <chrono>

namespace atfill::simnet {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

HttpSession::HttpSession(tcp::socket socket, size_t body_limit, std::string server_name)
    : stream_(std::move(socket)),
      timer_(stream_.get_executor()),
      body_limit_(body_limit),
      server_name_(std::move(server_name)) {}

void HttpSession::Start() { Read(); }

void HttpSession::Read() {
  parser_.emplace();
  parser_->body_limit(body_limit_);
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) {
                     if (ec) return self->Close();
                     const auto& req = self->parser_->get();
                     self->keep_alive_ = req.keep_alive();
                     self->version_ = req.version();
                     self->OnRequest(*self->parser_);
                   });
}

void HttpSession::Answer(HttpReply reply) {
  if (reply.delay_ms <= 0) return Write(std::move(reply));
  timer_.expires_after(std::chrono::milliseconds(reply.delay_ms));
  timer_.async_wait(
      [self = shared_from_this(), r = std::move(reply)](beast::error_code ec) mutable {
        if (ec) {
          self->OnAnswering();
          return self->Close();
        }
        self->Write(std::move(r));
      });
}

void HttpSession::Write(HttpReply r) {
  OnAnswering();
  using Fault = HttpReply::Fault;
  if (r.fault == Fault::kCloseWithoutResponse) return Close();
  if (r.fault == Fault::kReset) {
    beast::error_code ignored;
    stream_.socket().set_option(asio::socket_base::linger(true, 0), ignored);
    stream_.socket().close(ignored);
    return;
  }
  if (r.fault == Fault::kDropMidBody) {
    raw_ = "HTTP/1.1 " + std::to_string(r.status) + " OK\r\nContent-Type: " + r.content_type +
           "\r\nContent-Length: " + std::to_string(r.body.size()) + "\r\n\r\n" +
           r.body.substr(0, r.body.size() / 2);
    asio::async_write(stream_.socket(), asio::buffer(raw_),
                      [self = shared_from_this()](beast::error_code, size_t) { self->Close(); });
    return;
  }
  response_.emplace(static_cast<http::status>(r.status), version_);
  response_->set(http::field::server, server_name_);
  response_->set(http::field::content_type, r.content_type);
  for (const auto& [name, value] : r.headers) response_->insert(name, value);
  response_->body() = std::move(r.body);
  response_->keep_alive(keep_alive_);
  if (r.chunked) {
    response_->chunked(true);
  } else {
    response_->prepare_payload();
  }
  http::async_write(stream_, *response_, [self = shared_from_this()](beast::error_code ec, size_t) {
    if (ec || !self->keep_alive_) return self->Close();
    self->response_.reset();
    self->Read();
  });
}

void HttpSession::Close() {
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.socket().close(ignored);
}

}  // namespace atfill::simnet
