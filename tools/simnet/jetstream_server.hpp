// jetstream.localhost: simnet's Jetstream host (internal to simnet; tests use simnet.hpp and
// jetstream.hpp). Serves, on the listener's io threads:
//   GET /subscribe                                        v1 stream (SPEC §1)
//   GET /xrpc/network.bsky.jetstream.subscribeEvents      v2 stream (SPEC §2)
//   GET /xrpc/network.bsky.jetstream.getZstdDictionary    the v2 dictionary's bytes
//   GET /simnet/legacy_subscribe.zdict                    the v1 dictionary's bytes (simnet only:
//                                                         real v1 clients ship theirs)
// v1 options_update messages replace the connection's collections and DIDs (SPEC 1.3); other v1
// client messages are read and ignored. Not simulated: requireHello, #sync events, the 503
// answers of a bootstrapping server.
#pragma once

#include <vector>

#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "base/bytes.hpp"
#include "base/status.hpp"
#include "tools/simnet/jetstream.hpp"

struct ZSTD_CDict_s;

namespace atfill::simnet {

class JetstreamServer {
 public:
  struct HttpAnswer {
    int status = 200;
    std::string content_type;
    std::string body;
  };

  // Generates the log and trains both dictionaries (on a salted sample log); the publication
  // clock starts when this returns.
  static Result<std::unique_ptr<JetstreamServer>> Create(const Network& net,
                                                         const JetstreamOptions& options);
  ~JetstreamServer();
  JetstreamServer(const JetstreamServer&) = delete;
  JetstreamServer& operator=(const JetstreamServer&) = delete;

  // One request to jetstream.localhost, called on the connection's strand. An accepted stream
  // request takes `stream` over (it becomes a WebSocket session on the stream's executor) and
  // returns nullopt; anything else is an answer the caller sends over HTTP.
  std::optional<HttpAnswer> Handle(
      boost::beast::http::request<boost::beast::http::string_body>&& req,
      boost::beast::tcp_stream& stream);

  const JetstreamLog& log() const { return *log_; }
  // JetstreamOptions::prerender: the v2 frame of `seq`, as text or compressed; null otherwise.
  const std::string* PrerenderedV2(uint64_t seq, bool compressed) const {
    const auto& frames = compressed ? v2_zstd_ : v2_text_;
    return seq < frames.size() ? &frames[seq] : nullptr;
  }
  ByteView dictionary(int version) const { return version == 1 ? v1_dict_ : v2_dict_; }
  ZSTD_CDict_s* cdict(int version) const { return version == 1 ? v1_cdict_ : v2_cdict_; }
  std::chrono::steady_clock::time_point start() const { return start_; }
  // Events published by now.
  uint64_t Published() const {
    return log_->PublishedAt(std::chrono::steady_clock::now() - start_);
  }

  // Every filter start so far, in the order they happened.
  std::vector<JetstreamFilterStart> filter_starts() const;
  void RecordFilterStart(JetstreamFilterStart start);

  std::atomic<uint64_t> connections{0};
  std::atomic<uint64_t> frames{0};
  std::atomic<uint64_t> disconnects{0};
  std::atomic<uint64_t> slow_drops{0};

 private:
  JetstreamServer() = default;

  std::unique_ptr<JetstreamLog> log_;
  Bytes v1_dict_, v2_dict_;
  ZSTD_CDict_s* v1_cdict_ = nullptr;
  ZSTD_CDict_s* v2_cdict_ = nullptr;
  std::vector<std::string> v2_text_, v2_zstd_;  // JetstreamOptions::prerender; [0] unused
  std::chrono::steady_clock::time_point start_;
  std::atomic<uint64_t> next_connection_{0};
  mutable std::mutex filters_mu_;
  std::vector<JetstreamFilterStart> filter_starts_;
};

}  // namespace atfill::simnet
