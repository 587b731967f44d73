// What a loopback test server (simnet's hosts, the tests' HttpTestServer) answers one request
// with: a response, after a delay, or a fault of the connection (tools/simnet/http_session.hpp
// writes it).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace atfill::simnet {

struct HttpReply {
  enum class Fault {
    kNone,
    kDropMidBody,           // announce Content-Length, send half the body, close
    kCloseWithoutResponse,  // close the connection without a byte of response
    kReset,                 // reset the connection (RST) without a byte of response
  };
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string content_type = "application/json";
  int64_t delay_ms = 0;  // before the reply (or its fault) is written
  bool chunked = false;  // chunked transfer encoding instead of Content-Length
  Fault fault = Fault::kNone;
};

}  // namespace atfill::simnet
