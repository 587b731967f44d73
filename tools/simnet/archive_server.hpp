// archive.localhost and cdn.localhost: simnet's Jetstream v2 archive (internal to simnet; tests
// use simnet.hpp). Serves, on the listener's io threads, from the sealed segments of
// ArchiveOptions::dir (opened once, at Start):
//   GET  /xrpc/network.bsky.jetstream.listSegments       ?limit&cursor (cursor = next index)
//   POST /xrpc/network.bsky.jetstream.planSnapshot       sources::PlanSegment per segment over
//                                                        the window (afterSeq, beforeSeq], pages
//                                                        of at most max_plan_entries entries
//   GET  /xrpc/network.bsky.jetstream.getSegment         ?name, Range/If-Range/If-None-Match
//   GET  /xrpc/network.bsky.jetstream.getBlock           ?segment&blockIndex, Range
//   GET  /xrpc/network.bsky.jetstream.getZstdDictionary  the Jetstream's v2 dictionary, if any
//   GET  cdn.localhost/blocks/<segment>/<index>          a block frame (the redirect fault)
// The four archive methods are also answered at jetstream.localhost. ArchiveFaults apply in this
// order: no_archive_status, required_key, the quota, then the per-target faults.
#pragma once

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/bytes.hpp"
#include "base/status.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill::jss {
class SegmentReader;
}

namespace atfill::simnet {

class JetstreamLog;

class ArchiveServer {
 public:
  struct Answer {
    enum class Fault : uint8_t { kNone, kDrop, kTruncate };
    int status = 200;
    std::string content_type = "application/json";
    std::vector<std::pair<std::string, std::string>> headers;
    std::string body;
    Fault fault = Fault::kNone;
  };

  // Writes the network's repos into options.dir first when options.from_repos, then the log
  // when options.from_jetstream (`log` must then be set), then opens every sealed segment there.
  // `dictionary` (may be empty) is what getZstdDictionary serves; `port` names cdn.localhost in
  // redirects.
  static Result<std::unique_ptr<ArchiveServer>> Create(const ArchiveOptions& options,
                                                       const Network& network,
                                                       const JetstreamLog* log, ByteView dictionary,
                                                       uint16_t port);
  ~ArchiveServer();
  ArchiveServer(const ArchiveServer&) = delete;
  ArchiveServer& operator=(const ArchiveServer&) = delete;

  // A request to archive.localhost or cdn.localhost, or an archive method at
  // jetstream.localhost: its answer. nullopt for every other request (which is only looked at
  // for an Authorization header). Thread-safe.
  std::optional<Answer> Handle(
      std::string_view host_header,
      const boost::beast::http::request<boost::beast::http::string_body>& req);

  void SetFaults(ArchiveFaults faults);
  ArchiveStats stats() const;

 private:
  struct Segment;
  struct Bucket {
    double tokens = 0;
    int64_t last_ns = 0;
  };
  using Request = boost::beast::http::request<boost::beast::http::string_body>;

  ArchiveServer() = default;
  Answer Archive(std::string_view method, const Request& req);
  Answer Cdn(std::string_view path);
  Answer ListSegments(const Request& req);
  Answer PlanSnapshot(const Request& req);
  Answer GetSegment(const Request& req);
  Answer GetBlock(const Request& req);
  const Segment* Find(std::string_view name) const;
  // The injected fault for `target` (spending one of its hits), if any.
  std::optional<ArchiveFault> TakeFault(const std::string& target);

  ArchiveOptions options_;
  uint16_t port_ = 0;
  std::string dictionary_;
  std::vector<Segment> segments_;  // ascending index

  mutable std::mutex mu_;  // faults_, hits_, buckets_
  ArchiveFaults faults_;
  std::map<std::string, uint32_t> hits_;
  std::map<std::string, Bucket> buckets_;  // by Authorization value

  std::atomic<uint64_t> requests_{0}, list_segments_{0}, plan_snapshots_{0}, get_segments_{0},
      get_blocks_{0}, faults_served_{0}, key_rejections_{0}, quota_rejections_{0}, bytes_{0},
      cdn_requests_{0}, authorization_elsewhere_{0};
};

}  // namespace atfill::simnet
