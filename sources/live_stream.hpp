// What the live stream sources (sources/jetstream/jetstream.hpp, sources/firehose/firehose.hpp)
// share: the checks of the options fields they have in common, so that both refuse the same values
// with the same messages, the start of a WebSocket session and its end told to Read, and the query
// encoding of their URLs.
#pragma once

#include <cctype>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "atproto/syntax.hpp"
#include "base/status.hpp"
#include "base/strings.hpp"
#include "net/websocket.hpp"
#include "state/job_store.hpp"

namespace atfill::sources {

// Checks the fields JetstreamOptions and FirehoseOptions share: hosts (at least one; `kind` names
// them in the message, as in "at least one Jetstream host is needed"; each a ws:// or wss:// URL),
// collections (NSIDs or "prefix.*"), dids, chunk_messages, tick_ms, idle_exit_ms and
// max_buffered_bytes (at least max_message_bytes). The first field that fails is the error.
template <typename Options>
Status ValidateLiveStreamOptions(const Options& o, std::string_view kind) {
  if (o.hosts.empty()) {
    return Status::Invalid("live: hosts: at least one " + std::string(kind) + " host is needed");
  }
  for (const auto& h : o.hosts) {
    auto url = net::ParseWebSocketUrl(h);
    if (!url.ok()) return url.status().WithContext("live: hosts");
  }
  for (const auto& c : o.collections) {
    const bool prefix = c.size() > 2 && c.compare(c.size() - 2, 2, ".*") == 0;
    if (!prefix && !atproto::Nsid::Parse(c).ok()) {
      return Status::Invalid("live: collections: " + QuoteForMessage(c) +
                             " is neither an NSID nor a prefix ending in .*");
    }
  }
  for (const auto& d : o.dids) {
    if (!atproto::Did::Parse(d).ok()) {
      return Status::Invalid("live: dids: " + QuoteForMessage(d) + " is not a DID");
    }
  }
  if (o.chunk_messages == 0) return Status::Invalid("live: chunk_messages must be at least 1");
  if (o.tick_ms < 1) return Status::Invalid("live: tick_ms must be at least 1");
  if (o.idle_exit_ms < 0) return Status::Invalid("live: idle_exit_ms must not be negative");
  if (o.max_buffered_bytes < o.max_message_bytes) {
    return Status::Invalid("live: max_buffered_bytes must be at least max_message_bytes");
  }
  return Status::OK();
}

// Starts a source's next WebSocket session: closes the one open, then, under `shared.mu`, clears
// `shared.stopped` and `shared.reopen` and runs `reset` (the source's own per-session state, when
// set), then connects `ws` to `hosts` in order, each at the URL `url_for` gives, with `handlers`.
// A reopen starts as soon as the last session's kStopped handler has run, which is before the
// client counts that session as ended: Close waits for that (at once when none is running).
template <typename Shared>
Status StartLiveSession(net::WebSocketClient& ws, Shared& shared,
                        const std::vector<std::string>& hosts,
                        std::function<std::string(const std::string& host)> url_for,
                        net::WebSocketHandlers handlers,
                        const std::function<void()>& reset = nullptr) {
  ws.Close();
  {
    std::lock_guard<std::mutex> lock(shared.mu);
    shared.stopped = false;
    shared.reopen = false;
    if (reset) reset();
  }
  net::WebSocketTarget target;
  target.hosts = hosts;
  target.url_for = std::move(url_for);
  return ws.Connect(std::move(target), std::move(handlers));
}

// Tells Read that the WebSocket session ended (net::ConnectionEventKind::kStopped): it waits on
// `shared.cv` for that before it opens the next one. `Shared` has mu, cv and stopped (under mu).
template <typename Shared>
void MarkSessionStopped(Shared& shared) {
  std::lock_guard<std::mutex> lock(shared.mu);
  shared.stopped = true;
  shared.cv.notify_one();
}

// `name` followed by each host, as a stream source's Describe says it ("firehose wss://a wss://b").
inline std::string DescribeLiveStream(std::string name, const std::vector<std::string>& hosts) {
  for (const auto& h : hosts) name += " " + h;
  return name;
}

// Why a stream source that ended by idle_exit_ms stopped ("stream_idle": the job pauses and the
// next run continues from the cursor); empty when it did not (`idle_exit` false).
inline state::StopReason IdleStopReason(bool idle_exit, int64_t idle_exit_ms) {
  if (!idle_exit) return {};
  return {"stream_idle", "no message for " + std::to_string(idle_exit_ms) +
                             " ms (live.idle_exit_ms); run again to continue from the cursor"};
}

// `v` percent-encoded for a query value, keeping what the stream hosts read as it is: the
// unreserved bytes, ':' (DIDs, NSIDs) and '*' (collection prefixes).
inline std::string PercentEncodeQueryValue(std::string_view v) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : v) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == ':' || c == '*') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

}  // namespace atfill::sources
