// A loopback WebSocket server (Boost.Beast, plain and TLS) whose connections each follow a plan,
// and test certificates made with OpenSSL at run time, for the WebSocket client's tests. A file of
// its own so that Beast's server templates compile beside the tests rather than in their unit.
#pragma once

#include <openssl/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace atfill::net::ws_test {

// Each accepted connection follows the plan made for it.
struct WsPlan {
  // Accept the TCP connection and never read or answer anything.
  bool silent_before_upgrade = false;
  // Non-zero: answer the upgrade request with this HTTP status and body instead of 101.
  int refuse_status = 0;
  std::string refuse_body;
  std::string refuse_content_type = "application/json";
  // The Sec-WebSocket-Protocol answered, whatever was offered; nullopt = none.
  std::optional<std::string> echo_subprotocol;
  // Sent in order after the upgrade: (payload, binary).
  std::vector<std::pair<std::string, bool>> messages;
  // Non-empty: a ping with this payload after the messages.
  std::string ping;
  // Bytes written raw to the TCP stream after the messages (plain ws only), such as a frame
  // header announcing a payload that never follows.
  std::string raw;
  enum class Then {
    kRead,    // keep reading (answers pings, records pongs, data and the client's close)
    kSilent,  // read and send nothing more
    kClose,   // send a close frame with close_code and close_reason
    kDrop,    // close the TCP connection without a close frame
  };
  Then then = Then::kRead;
  uint16_t close_code = 1000;
  std::string close_reason;
};

// What the server saw on one connection.
struct ServerConn {
  std::string target;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string sni;                                           // TLS only
  bool upgraded = false;
  std::vector<std::string> pongs;     // payloads of pongs received
  std::vector<std::string> received;  // data messages received
  int close_code = -1;                // code of the client's close frame, once read

  std::string Header(const std::string& name) const {
    for (const auto& [k, v] : headers) {
      if (k == name) return v;
    }
    return "";
  }
};

class WsTestServer {
 public:
  using PlanFn = std::function<WsPlan(size_t index)>;

  // `tls` (optional) must outlive the server.
  explicit WsTestServer(PlanFn plan, boost::asio::ssl::context* tls = nullptr);
  ~WsTestServer();

  uint16_t port() const { return port_; }
  std::string Url(const std::string& path, bool tls = false) const {
    return std::string(tls ? "wss" : "ws") + "://127.0.0.1:" + std::to_string(port_) + path;
  }

  std::vector<ServerConn> Connections() const {
    std::lock_guard lock(mu_);
    return conns_;
  }

  size_t accepted() const {
    std::lock_guard lock(mu_);
    return conns_.size();
  }

  // Waits (bounded) until `pred` holds over the connections seen so far.
  bool WaitFor(const std::function<bool(const std::vector<ServerConn>&)>& pred,
               std::chrono::milliseconds timeout = std::chrono::milliseconds{10'000}) const {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, timeout, [&] { return pred(conns_); });
  }

  // Applies `edit` to connection `index` under the lock and wakes waiters.
  void Update(size_t index, const std::function<void(ServerConn&)>& edit) {
    std::lock_guard lock(mu_);
    edit(conns_[index]);
    changed_.notify_all();
  }

 private:
  template <bool kTls>
  class Session;

  // Accepts connections until the acceptor closes.
  void Accept();

  PlanFn plan_;
  boost::asio::ssl::context* tls_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::vector<std::function<void()>> closers_;  // io thread only
  uint16_t port_ = 0;
  std::thread thread_;

  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  std::vector<ServerConn> conns_;
};

struct Pem {
  std::string cert;
  std::string key;
};

// An EC P-256 CA that signs server certificates.
class TestCa {
 public:
  TestCa();
  ~TestCa();
  TestCa(const TestCa&) = delete;
  TestCa& operator=(const TestCa&) = delete;

  std::string cert_pem() const;

  // A server certificate for `san` ("IP:127.0.0.1", "DNS:localhost") signed by this CA.
  Pem Leaf(const std::string& san) const;

 private:
  // Self-signed when `ca` (the CA itself), else signed by the CA.
  X509* Make(const std::string& cn, const std::string& san, EVP_PKEY* key, bool ca) const;

  EVP_PKEY* key_;
  X509* cert_;
};

// A TLS server context presenting `leaf`.
std::unique_ptr<boost::asio::ssl::context> ServerTls(const Pem& leaf);

}  // namespace atfill::net::ws_test
