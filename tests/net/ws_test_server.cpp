#include "tests/net/ws_test_server.hpp"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <cctype>
#include <future>
#include <stdexcept>
#include <type_traits>

#include "base/low_port.hpp"

namespace atfill::net::ws_test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

WsTestServer::WsTestServer(PlanFn plan, ssl::context* tls)
    : plan_(std::move(plan)), tls_(tls), acceptor_(io_) {
  const auto loopback = asio::ip::make_address("127.0.0.1");
  acceptor_.open(tcp::v4());
  acceptor_.set_option(tcp::acceptor::reuse_address(true));
  const auto bound = BindLowPort([&](uint16_t port) {
    beast::error_code ec;
    acceptor_.bind(tcp::endpoint(loopback, port), ec);
    return !ec;
  });
  if (!bound) throw std::runtime_error("WsTestServer: no free port below 32768 on 127.0.0.1");
  acceptor_.listen();
  port_ = acceptor_.local_endpoint().port();
  Accept();
  thread_ = std::thread([this] { io_.run(); });
}

WsTestServer::~WsTestServer() {
  std::promise<void> done;
  asio::post(io_, [this, &done] {
    beast::error_code ignored;
    acceptor_.close(ignored);
    for (auto& close : closers_) close();
    closers_.clear();
    done.set_value();
  });
  done.get_future().wait();
  io_.stop();
  thread_.join();
}

template <bool kTls>
class WsTestServer::Session : public std::enable_shared_from_this<Session<kTls>> {
 public:
  using Next = std::conditional_t<kTls, beast::ssl_stream<beast::tcp_stream>, beast::tcp_stream>;

  Session(WsTestServer* server, size_t index, WsPlan plan, tcp::socket socket)
      : server_(server),
        index_(index),
        plan_(std::move(plan)),
        ws_(MakeStream(std::move(socket), server->tls_)) {}

  void Start() {
    if (plan_.silent_before_upgrade) return;
    auto self = this->shared_from_this();
    if constexpr (kTls) {
      ws_.next_layer().async_handshake(ssl::stream_base::server, [self](beast::error_code ec) {
        if (ec) return;
        const char* sni =
            SSL_get_servername(self->ws_.next_layer().native_handle(), TLSEXT_NAMETYPE_host_name);
        const std::string name = sni == nullptr ? "" : sni;
        self->server_->Update(self->index_, [&](ServerConn& c) { c.sni = name; });
        self->ReadRequest();
      });
    } else {
      ReadRequest();
    }
  }

  void Shutdown() { beast::get_lowest_layer(ws_).close(); }

 private:
  static websocket::stream<Next> MakeStream(tcp::socket socket, ssl::context* tls) {
    if constexpr (kTls) {
      return websocket::stream<Next>(std::move(socket), *tls);
    } else {
      (void)tls;
      return websocket::stream<Next>(std::move(socket));
    }
  }

  void ReadRequest() {
    auto self = this->shared_from_this();
    http::async_read(ws_.next_layer(), buffer_, request_, [self](beast::error_code ec, size_t) {
      if (ec) return;
      self->OnRequest();
    });
  }

  void OnRequest() {
    const std::string target(request_.target().data(), request_.target().size());
    std::vector<std::pair<std::string, std::string>> headers;
    for (const auto& field : request_) {
      std::string name(field.name_string().data(), field.name_string().size());
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      headers.emplace_back(name, std::string(field.value().data(), field.value().size()));
    }
    server_->Update(index_, [&](ServerConn& c) {
      c.target = target;
      c.headers = headers;
    });
    auto self = this->shared_from_this();
    if (plan_.refuse_status != 0) {
      refusal_.result(static_cast<unsigned>(plan_.refuse_status));
      refusal_.version(11);
      refusal_.set(http::field::content_type, plan_.refuse_content_type);
      refusal_.set("X-Test", "refused");
      refusal_.keep_alive(false);
      refusal_.body() = plan_.refuse_body;
      refusal_.prepare_payload();
      http::async_write(ws_.next_layer(), refusal_, [self](beast::error_code, size_t) {
        beast::get_lowest_layer(self->ws_).close();
      });
      return;
    }
    ws_.set_option(websocket::stream_base::decorator(
        [echo = plan_.echo_subprotocol](websocket::response_type& response) {
          if (echo) response.set(http::field::sec_websocket_protocol, *echo);
        }));
    ws_.control_callback([this](websocket::frame_type kind, beast::string_view payload) {
      if (kind != websocket::frame_type::pong) return;
      const std::string text(payload.data(), payload.size());
      server_->Update(index_, [&](ServerConn& c) { c.pongs.push_back(text); });
    });
    ws_.async_accept(request_, [self](beast::error_code ec) {
      if (ec) return;
      self->server_->Update(self->index_, [](ServerConn& c) { c.upgraded = true; });
      self->SendNext();
    });
  }

  void SendNext() {
    auto self = this->shared_from_this();
    if (next_ < plan_.messages.size()) {
      const auto& [payload, binary] = plan_.messages[next_++];
      ws_.binary(binary);
      ws_.async_write(asio::buffer(payload), [self](beast::error_code ec, size_t) {
        if (!ec) self->SendNext();
      });
      return;
    }
    if (!plan_.raw.empty() && !raw_sent_) {
      raw_sent_ = true;
      asio::async_write(ws_.next_layer(), asio::buffer(plan_.raw),
                        [self](beast::error_code ec, size_t) {
                          if (!ec) self->SendNext();
                        });
      return;
    }
    if (!plan_.ping.empty() && !pinged_) {
      pinged_ = true;
      ws_.async_ping(websocket::ping_data(plan_.ping.c_str()), [self](beast::error_code ec) {
        if (!ec) self->SendNext();
      });
      return;
    }
    switch (plan_.then) {
      case WsPlan::Then::kRead:
        return Read();
      case WsPlan::Then::kSilent:
        return;
      case WsPlan::Then::kClose:
        ws_.async_close(
            websocket::close_reason(static_cast<websocket::close_code>(plan_.close_code),
                                    plan_.close_reason.c_str()),
            [self](beast::error_code) {});
        return;
      case WsPlan::Then::kDrop:
        beast::get_lowest_layer(ws_).close();
        return;
    }
  }

  void Read() {
    auto self = this->shared_from_this();
    ws_.async_read(read_buffer_, [self](beast::error_code ec, size_t) {
      if (ec == websocket::error::closed) {
        const int code = static_cast<int>(self->ws_.reason().code);
        self->server_->Update(self->index_, [&](ServerConn& c) { c.close_code = code; });
        return;
      }
      if (ec) return;
      const std::string text = beast::buffers_to_string(self->read_buffer_.data());
      self->read_buffer_.consume(self->read_buffer_.size());
      self->server_->Update(self->index_, [&](ServerConn& c) { c.received.push_back(text); });
      self->Read();
    });
  }

  WsTestServer* server_;
  size_t index_;
  WsPlan plan_;
  websocket::stream<Next> ws_;
  beast::flat_buffer buffer_;
  beast::flat_buffer read_buffer_;
  http::request<http::string_body> request_;
  http::response<http::string_body> refusal_;
  size_t next_ = 0;
  bool raw_sent_ = false;
  bool pinged_ = false;
};

void WsTestServer::Accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec) return;
    size_t index = 0;
    {
      std::lock_guard lock(mu_);
      index = conns_.size();
      conns_.emplace_back();
      changed_.notify_all();
    }
    WsPlan plan = plan_(index);
    if (tls_ != nullptr) {
      auto session =
          std::make_shared<Session<true>>(this, index, std::move(plan), std::move(socket));
      closers_.push_back([session] { session->Shutdown(); });
      session->Start();
    } else {
      auto session =
          std::make_shared<Session<false>>(this, index, std::move(plan), std::move(socket));
      closers_.push_back([session] { session->Shutdown(); });
      session->Start();
    }
    Accept();
  });
}

namespace {

std::string ToPem(const std::function<int(BIO*)>& write) {
  BIO* bio = BIO_new(BIO_s_mem());
  EXPECT_EQ(write(bio), 1);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(size));
  BIO_free(bio);
  return out;
}

}  // namespace

TestCa::TestCa() : key_(EVP_EC_gen("P-256")), cert_(Make("atfill test CA", "", key_, true)) {}

TestCa::~TestCa() {
  X509_free(cert_);
  EVP_PKEY_free(key_);
}

std::string TestCa::cert_pem() const {
  return ToPem([&](BIO* b) { return PEM_write_bio_X509(b, cert_); });
}

Pem TestCa::Leaf(const std::string& san) const {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = Make("atfill test server", san, key, false);
  Pem out{ToPem([&](BIO* b) { return PEM_write_bio_X509(b, cert); }), ToPem([&](BIO* b) {
            return PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr);
          })};
  X509_free(cert);
  EVP_PKEY_free(key);
  return out;
}

X509* TestCa::Make(const std::string& cn, const std::string& san, EVP_PKEY* key, bool ca) const {
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  static int serial = 1;
  ASN1_INTEGER_set(X509_get_serialNumber(cert), serial++);
  X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert, ca ? name : X509_get_subject_name(cert_));
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, ca ? cert : cert_, cert, nullptr, nullptr, 0);
  auto add = [&](int nid, const std::string& value) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    EXPECT_NE(ext, nullptr) << value;
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
  };
  add(NID_basic_constraints, ca ? "critical,CA:TRUE" : "CA:FALSE");
  if (ca) add(NID_key_usage, "critical,keyCertSign,cRLSign");
  if (!san.empty()) add(NID_subject_alt_name, san);
  EXPECT_GT(X509_sign(cert, ca ? key : key_, EVP_sha256()), 0);
  return cert;
}

std::unique_ptr<ssl::context> ServerTls(const Pem& leaf) {
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_server);
  ctx->use_certificate_chain(asio::buffer(leaf.cert));
  ctx->use_private_key(asio::buffer(leaf.key), ssl::context::pem);
  return ctx;
}

}  // namespace atfill::net::ws_test
