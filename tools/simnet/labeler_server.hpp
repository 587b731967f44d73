// labeler.localhost: simnet's labeler host (internal to simnet; tests use simnet.hpp and
// labeler.hpp), serving the log of labeler.hpp over subscribeLabels.
#pragma once

#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "base/status.hpp"
#include "tools/simnet/labeler.hpp"

namespace atfill::simnet {

class LabelerServer {
 public:
  static Result<std::unique_ptr<LabelerServer>> Create(const Network& net,
                                                       const LabelerOptions& options);
  // One request to labeler.localhost: an accepted subscription takes `stream` over and returns
  // nullopt; anything else is an answer (status, JSON body) the caller sends.
  std::optional<std::pair<int, std::string>> Handle(
      boost::beast::http::request<boost::beast::http::string_body>&& req,
      boost::beast::tcp_stream& stream);

  const LabelerLog& log() const { return *log_; }
  const LabelerOptions& options() const { return options_; }
  std::atomic<uint64_t> connections{0};
  std::atomic<uint64_t> frames_sent{0};

 private:
  LabelerServer() = default;
  LabelerOptions options_;
  std::unique_ptr<LabelerLog> log_;
};

}  // namespace atfill::simnet
