// One HTTP/1.1 connection of a loopback test server (simnet's hosts, the tests' HttpTestServer):
// reads each request, hands it to its owner, writes the owner's reply after the reply's delay, or
// the fault it asks for, and reads the next request while the client keeps the connection alive.
// Boost.Beast on the caller's io_context; everything runs on the session's executor.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "tools/simnet/http_reply.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace atfill::simnet {

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  using Parser = boost::beast::http::request_parser<boost::beast::http::string_body>;

  // `server_name` goes in each reply's Server header; a request body over `body_limit` bytes
  // closes the connection.
  HttpSession(boost::asio::ip::tcp::socket socket, size_t body_limit, std::string server_name);
  virtual ~HttpSession() = default;
  HttpSession(const HttpSession&) = delete;
  HttpSession& operator=(const HttpSession&) = delete;

  // Reads the first request.
  void Start();
  // Answers the request OnRequest was given, now or later, on the session's executor.
  void Answer(HttpReply reply);

  boost::beast::tcp_stream& stream() { return stream_; }

 protected:
  // A request has been read: answer it (Answer, now or later) or take the connection over (a
  // WebSocket upgrade: the parser's message and stream() are then the taker's).
  virtual void OnRequest(Parser& parser) = 0;
  // Just before the reply's first byte (or fault) leaves, or when its delay was cut short by the
  // server stopping.
  virtual void OnAnswering() {}
  void Close();

 private:
  void Read();
  void Write(HttpReply reply);

  boost::beast::tcp_stream stream_;
  boost::asio::steady_timer timer_;
  const size_t body_limit_;
  const std::string server_name_;
  boost::beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
  std::optional<boost::beast::http::response<boost::beast::http::string_body>> response_;
  std::string raw_;
  bool keep_alive_ = true;
  unsigned version_ = 11;
};

}  // namespace atfill::simnet
