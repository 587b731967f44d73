// The WebSocket client against a loopback Boost.Beast WebSocket server (plain and TLS), and the
// pure reconnect schedule.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "net/reconnect_policy.hpp"
#include "net/websocket.hpp"
#include "tests/common/http_test_server.hpp"
#include "tests/net/ws_test_server.hpp"

namespace atfill::net {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using ws_test::Pem;
using ws_test::ServerConn;
using ws_test::ServerTls;
using ws_test::TestCa;
using ws_test::WsPlan;
using ws_test::WsTestServer;

constexpr milliseconds kWait{10'000};

// ---------------------------------------------------------------------------------------------
// Client helpers.

struct Message {
  std::string data;
  bool binary = false;
};

// Records what the client reports; decides with `decide` (default: continue).
class Recorder {
 public:
  using Decide = std::function<SessionAction(const ConnectionEvent&)>;

  WebSocketHandlers Handlers(Decide decide = {}) {
    WebSocketHandlers h;
    h.on_message = [this](std::string_view data, bool binary) {
      std::lock_guard lock(mu_);
      messages_.push_back({std::string(data), binary});
      changed_.notify_all();
    };
    h.on_event = [this, decide = std::move(decide)](const ConnectionEvent& event) {
      const SessionAction action = decide ? decide(event) : SessionAction::kContinue;
      std::lock_guard lock(mu_);
      events_.push_back(event);
      times_.push_back(Clock::now());
      changed_.notify_all();
      return action;
    };
    return h;
  }

  bool WaitForEvents(ConnectionEventKind kind, size_t count, milliseconds timeout = kWait) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, timeout, [&] { return CountLocked(kind) >= count; });
  }

  bool WaitForMessages(size_t count, milliseconds timeout = kWait) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, timeout, [&] { return messages_.size() >= count; });
  }

  size_t Count(ConnectionEventKind kind) {
    std::lock_guard lock(mu_);
    return CountLocked(kind);
  }

  std::vector<ConnectionEvent> Events() {
    std::lock_guard lock(mu_);
    return events_;
  }

  // The `n`-th (0-based) event of `kind`, and when it arrived.
  std::pair<ConnectionEvent, Clock::time_point> Nth(ConnectionEventKind kind, size_t n) {
    std::lock_guard lock(mu_);
    size_t seen = 0;
    for (size_t i = 0; i < events_.size(); ++i) {
      if (events_[i].kind == kind && seen++ == n) return {events_[i], times_[i]};
    }
    ADD_FAILURE() << "no event " << ToString(kind) << " #" << n;
    return {};
  }

  std::vector<Message> Messages() {
    std::lock_guard lock(mu_);
    return messages_;
  }

 private:
  size_t CountLocked(ConnectionEventKind kind) const {
    return static_cast<size_t>(std::count_if(events_.begin(), events_.end(),
                                             [&](const auto& e) { return e.kind == kind; }));
  }

  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<ConnectionEvent> events_;
  std::vector<Clock::time_point> times_;
  std::vector<Message> messages_;
};

WebSocketOptions LoopbackOptions() {
  WebSocketOptions options;
  options.allow_private_addresses = true;
  options.connect_timeout_ms = 5'000;
  options.handshake_timeout_ms = 5'000;
  options.close_timeout_ms = 2'000;
  options.reconnect.base_backoff_ms = 10;
  options.reconnect.max_backoff_ms = 50;
  options.random_seed = 42;
  return options;
}

std::unique_ptr<WebSocketClient> StartClient(WebSocketOptions options) {
  Result<std::unique_ptr<WebSocketClient>> client = WebSocketClient::Start(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(*client) : nullptr;
}

WebSocketTarget Single(const std::string& url) { return WebSocketTarget{{url}, {}}; }

SessionAction StopOnEnd(const ConnectionEvent& e) {
  return e.kind == ConnectionEventKind::kConnected ? SessionAction::kContinue
                                                   : SessionAction::kStop;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string Pattern(size_t size) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<char>((i * 31 + 7) & 0xff);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Messages, limits, subprotocols.

TEST(WebSocketClientTest, DeliversTextAndBinaryInOrderAndIntact) {
  const std::string big = Pattern(size_t{1} << 20);
  std::string big_text(size_t{1} << 20, 'j');
  big_text.front() = '{';
  big_text.back() = '}';
  WsTestServer server([&](size_t) {
    WsPlan plan;
    plan.messages = {{"{\"seq\":1}", false},
                     {std::string("\x00\x01\xff", 3), true},
                     {big, true},
                     {big_text, false},
                     {"", false},
                     {"{\"seq\":2}", false}};
    return plan;
  });
  Recorder rec;
  auto client = StartClient(LoopbackOptions());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Connect(Single(server.Url("/xrpc/x?cursor=5")), rec.Handlers()).ok());
  ASSERT_TRUE(rec.WaitForMessages(6));
  const std::vector<Message> got = rec.Messages();
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(got[0].data, "{\"seq\":1}");
  EXPECT_FALSE(got[0].binary);
  EXPECT_EQ(got[1].data, std::string("\x00\x01\xff", 3));
  EXPECT_TRUE(got[1].binary);
  EXPECT_TRUE(got[2].data == big) << "1 MiB binary message differs, size " << got[2].data.size();
  EXPECT_TRUE(got[2].binary);
  EXPECT_TRUE(got[3].data == big_text) << "1 MiB text message differs";
  EXPECT_FALSE(got[3].binary);
  EXPECT_EQ(got[4].data, "");
  EXPECT_EQ(got[5].data, "{\"seq\":2}");
  EXPECT_TRUE(client->connected());

  const auto connected = rec.Nth(ConnectionEventKind::kConnected, 0).first;
  EXPECT_EQ(connected.url, server.Url("/xrpc/x?cursor=5"));
  EXPECT_EQ(connected.attempt, 1);
  EXPECT_EQ(connected.remote_address, "127.0.0.1:" + std::to_string(server.port()));
  ASSERT_EQ(server.Connections().size(), 1u);
  EXPECT_EQ(server.Connections()[0].target, "/xrpc/x?cursor=5");
  const WebSocketStats stats = client->stats();
  EXPECT_EQ(stats.messages, 6u);
  EXPECT_EQ(stats.bytes_received, 9u + 3u + (size_t{2} << 20) + 0u + 9u);
  EXPECT_EQ(stats.connections, 1u);
}

TEST(WebSocketClientTest, SendsUserAgentSubprotocolAndExtraHeaders) {
  WsTestServer server([](size_t) { return WsPlan{}; });
  WebSocketOptions options = LoopbackOptions();
  options.subprotocol = "xrpc.v1.json";
  options.headers = {{"X-Consumer", "jetstream-test"}};
  options.version = "9.8.7";
  Recorder rec;
  auto client = StartClient(options);
  ASSERT_TRUE(client->Connect(Single(server.Url("/")), rec.Handlers()).ok());
  ASSERT_TRUE(server.WaitFor([](const auto& c) { return !c.empty() && c[0].upgraded; }));
  const ServerConn conn = server.Connections()[0];
  EXPECT_EQ(conn.Header("user-agent"), "atfill/9.8.7 (+https://github.com/atfill)");
  EXPECT_EQ(conn.Header("sec-websocket-protocol"), "xrpc.v1.json");
  EXPECT_EQ(conn.Header("x-consumer"), "jetstream-test");
  EXPECT_EQ(conn.Header("host"), "127.0.0.1:" + std::to_string(server.port()));
  EXPECT_EQ(conn.Header("sec-websocket-extensions"), "");  // no permessage-deflate offer
}

TEST(WebSocketClientTest, MessageOverTheCapFailsNamingTheCapAndClosesWith1009) {
  WsTestServer server([](size_t) {
    WsPlan plan;
    plan.messages = {{"small", false}};
    // The header of a 100,000-byte binary frame; the client must refuse it from the header
    // alone (the payload never comes), so it has nothing unread when it closes.
    plan.raw = std::string("\x82\x7f\x00\x00\x00\x00\x00\x01\x86\xa0", 10);
    return plan;
  });
  WebSocketOptions options = LoopbackOptions();
  options.max_message_bytes = 65'536;
  Recorder rec;
  auto client = StartClient(options);
  ASSERT_TRUE(client->Connect(Single(server.Url("/")), rec.Handlers(StopOnEnd)).ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kStopped, 1));
  const ConnectionEvent failed = rec.Nth(ConnectionEventKind::kFailed, 0).first;
  EXPECT_EQ(failed.error.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(failed.error.message(), "65536")) << failed.error.message();
  EXPECT_EQ(failed.close_code, 1009);
  EXPECT_GE(failed.connected_ms, 0);
  ASSERT_EQ(rec.Messages().size(), 1u);
  EXPECT_EQ(rec.Messages()[0].data, "small");
  EXPECT_TRUE(server.WaitFor([](const auto& c) { return c[0].close_code == 1009; }));
  EXPECT_FALSE(client->connected());
}

TEST(WebSocketClientTest, AcceptsTheOfferedSubprotocolEchoedOrAbsent) {
  for (const bool echo : {true, false}) {
    WsTestServer server([&](size_t) {
      WsPlan plan;
      if (echo) plan.echo_subprotocol = "xrpc.v1.json";
      plan.messages = {{"hello", false}};
      return plan;
    });
    WebSocketOptions options = LoopbackOptions();
    options.subprotocol = "xrpc.v1.json";
    Recorder rec;
    auto client = StartClient(options);
    ASSERT_TRUE(client->Connect(Single(server.Url("/")), rec.Handlers()).ok());
    ASSERT_TRUE(rec.WaitForMessages(1)) << "echo " << echo;
    EXPECT_EQ(rec.Nth(ConnectionEventKind::kConnected, 0).first.subprotocol,
              echo ? "xrpc.v1.json" : "");
    EXPECT_EQ(rec.Count(ConnectionEventKind::kFailed), 0u);
  }
}

TEST(WebSocketClientTest, RejectsASubprotocolItDidNotOffer) {
  struct Case {
    std::string offered;
    std::string echoed;
  };
  for (const Case& c : {Case{"xrpc.v1.json", "xrpc.v2.cbor"}, Case{"", "xrpc.v1.json"}}) {
    WsTestServer server([&](size_t) {
      WsPlan plan;
      plan.echo_subprotocol = c.echoed;
      plan.messages = {{"must not arrive", false}};
      return plan;
    });
    WebSocketOptions options = LoopbackOptions();
    options.subprotocol = c.offered;
    Recorder rec;
    auto client = StartClient(options);
    ASSERT_TRUE(client->Connect(Single(server.Url("/")), rec.Handlers(StopOnEnd)).ok());
    ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kStopped, 1));
    EXPECT_EQ(rec.Count(ConnectionEventKind::kConnected), 0u);
    const ConnectionEvent failed = rec.Nth(ConnectionEventKind::kFailed, 0).first;
    EXPECT_EQ(failed.error.code(), StatusCode::kInvalid);
    EXPECT_TRUE(Contains(failed.error.message(), "'" + c.echoed + "'")) << failed.error.message();
    EXPECT_TRUE(rec.Messages().empty());
  }
}

// ---------------------------------------------------------------------------------------------
// Refusals and closes.

TEST(WebSocketClientTest, RefusedUpgradeSurfacesStatusBodyAndHeaders) {
  const std::string body =
      "{\"error\":\"CursorTooOld\",\"message\":\"cursor 5 below lookback floor 900; re-backfill "
      "from your last seq\"}";
  WsTestServer server([&](size_t) {
    WsPlan plan;
    plan.refuse_status = 400;
    plan.refuse_body = body;
    return plan;
  });
  Recorder rec;
  auto client = StartClient(LoopbackOptions());
  ASSERT_TRUE(
      client->Connect(Single(server.Url("/xrpc/sub?cursor=5")), rec.Handlers(StopOnEnd)).ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kStopped, 1));
  const ConnectionEvent refused = rec.Nth(ConnectionEventKind::kRefused, 0).first;
  EXPECT_EQ(refused.http_status, 400);
  EXPECT_EQ(refused.body, body);
  EXPECT_EQ(refused.connected_ms, -1);
  bool content_type = false;
  bool custom = false;
  for (const auto& [name, value] : refused.headers) {
    content_type |= name == "content-type" && value == "application/json";
    custom |= name == "x-test" && value == "refused";
  }
  EXPECT_TRUE(content_type);
  EXPECT_TRUE(custom);
  // The handler stopped the session: no second attempt.
  EXPECT_EQ(server.accepted(), 1u);
  EXPECT_EQ(client->stats().refusals, 1u);
  EXPECT_EQ(rec.Events().back().kind, ConnectionEventKind::kStopped);
}

TEST(WebSocketClientTest, RefusedWith404PlainText) {
  WsTestServer server([](size_t) {
    WsPlan plan;
    plan.refuse_status = 404;
    plan.refuse_body = "404 page not found\n";
    plan.refuse_content_type = "text/plain; charset=utf-8";
    return plan;
  });
  Recorder rec;
  auto client = StartClient(LoopbackOptions());
  ASSERT_TRUE(client
                  ->Connect(Single(server.Url("/xrpc/network.bsky.jetstream.subscribeEvents")),
                            rec.Handlers(StopOnEnd))
                  .ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kStopped, 1));
  const ConnectionEvent refused = rec.Nth(ConnectionEventKind::kRefused, 0).first;
  EXPECT_EQ(refused.http_status, 404);
  EXPECT_EQ(refused.body, "404 page not found\n");
}

TEST(WebSocketClientTest, ReportsTheServersCloseCodeAndReason) {
  WsTestServer server([](size_t) {
    WsPlan plan;
    plan.messages = {{"{\"$type\":\"error\",\"error\":\"ConsumerTooSlow\"}", false}};
    plan.then = WsPlan::Then::kClose;
    plan.close_code = 1008;
    plan.close_reason = "invalid options";
    return plan;
  });
  Recorder rec;
  auto client = StartClient(LoopbackOptions());
  ASSERT_TRUE(client->Connect(Single(server.Url("/")), rec.Handlers(StopOnEnd)).ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kStopped, 1));
  ASSERT_EQ(rec.Messages().size(), 1u);
  const ConnectionEvent closed = rec.Nth(ConnectionEventKind::kClosed, 0).first;
  EXPECT_EQ(closed.close_code, 1008);
  EXPECT_EQ(closed.close_reason, "invalid options");
  EXPECT_FALSE(closed.closed_by_client);
  EXPECT_GE(closed.connected_ms, 0);
  EXPECT_EQ(rec.Count(ConnectionEventKind::kFailed), 0u);
}

// Each connection delivers two messages and is closed by the server at once: every reconnect
// waits at most the first ceiling (10 ms) instead of doubling towards max_backoff_ms.
TEST(WebSocketClientTest, AConnectionThatDeliveredMessagesReconnectsAtTheFirstCeiling) {
  WsTestServer server([](size_t) {
    WsPlan plan;
    plan.messages = {{"{\"a\":1}", false}, {"{\"a\":2}", false}};
    plan.then = WsPlan::Then::kClose;
    plan.close_code = 1001;
    return plan;
  });
  WebSocketOptions options = LoopbackOptions();
  options.reconnect.max_backoff_ms = 60'000;
  options.reconnect.stable_after_ms = 60'000;
  Recorder rec;
  auto client = StartClient(options);
  size_t closes = 0;
  ASSERT_TRUE(client
                  ->Connect(Single(server.Url("/")), rec.Handlers([&](const ConnectionEvent& e) {
                    if (e.kind != ConnectionEventKind::kClosed) return SessionAction::kContinue;
                    return ++closes < 8 ? SessionAction::kContinue : SessionAction::kStop;
                  }))
                  .ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kStopped, 1));
  EXPECT_EQ(rec.Messages().size(), 16u);
  for (size_t i = 0; i + 1 < 8; ++i) {
    const ConnectionEvent closed = rec.Nth(ConnectionEventKind::kClosed, i).first;
    EXPECT_EQ(closed.messages, 2u) << i;
    EXPECT_GE(closed.retry_in_ms, 0) << i;
    EXPECT_LE(closed.retry_in_ms, 10) << i;
  }
}

TEST(WebSocketClientTest, CloseSends1000AndWaitsForTheAnswer) {
  WsTestServer server([](size_t) { return WsPlan{}; });
  Recorder again;  // declared before the client, which calls it until destroyed
  Recorder rec;
  auto client = StartClient(LoopbackOptions());
  ASSERT_TRUE(client->Connect(Single(server.Url("/")), rec.Handlers()).ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kConnected, 1));
  client->Close();
  // Close() returned: the session is over and reported.
  EXPECT_EQ(rec.Count(ConnectionEventKind::kStopped), 1u);
  EXPECT_FALSE(client->connected());
  const ConnectionEvent closed = rec.Nth(ConnectionEventKind::kClosed, 0).first;
  EXPECT_TRUE(closed.closed_by_client);
  EXPECT_EQ(closed.close_code, 1000);
  EXPECT_EQ(closed.retry_in_ms, -1);
  EXPECT_TRUE(server.WaitFor([](const auto& c) { return c[0].close_code == 1000; }));
  client->Close();  // idempotent
  EXPECT_EQ(rec.Count(ConnectionEventKind::kStopped), 1u);
  EXPECT_EQ(server.accepted(), 1u);

  // The client serves a new session after Close().
  ASSERT_TRUE(client->Connect(Single(server.Url("/again")), again.Handlers()).ok());
  ASSERT_TRUE(again.WaitForEvents(ConnectionEventKind::kConnected, 1));
  EXPECT_EQ(client->Connect(Single(server.Url("/")), again.Handlers()).code(),
            StatusCode::kInvalid);
}

TEST(WebSocketClientTest, CloseOfAServerThatNeverAnswersIsBounded) {
  WsTestServer server([](size_t) {
    WsPlan plan;
    plan.then = WsPlan::Then::kSilent;
    return plan;
  });
  WebSocketOptions options = LoopbackOptions();
  options.close_timeout_ms = 300;
  Recorder rec;
  auto client = StartClient(options);
  ASSERT_TRUE(client->Connect(Single(server.Url("/")), rec.Handlers()).ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kConnected, 1));
  const auto start = Clock::now();
  client->Close();
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  EXPECT_GE(took.count(), 300);
  EXPECT_LT(took.count(), 5'000);
  EXPECT_EQ(rec.Count(ConnectionEventKind::kStopped), 1u);
  const ConnectionEvent ended = rec.Events()[rec.Events().size() - 2];
  EXPECT_EQ(ended.kind, ConnectionEventKind::kFailed);
  EXPECT_TRUE(ended.closed_by_client);
  EXPECT_TRUE(Contains(ended.error.message(), "300 ms")) << ended.error.message();
}

TEST(WebSocketClientTest, SendWritesTextMessages) {
  WsTestServer server([](size_t) { return WsPlan{}; });
  Recorder rec;
  auto client = StartClient(LoopbackOptions());
  EXPECT_EQ(client->Send("too early").code(), StatusCode::kUnavailable);
  ASSERT_TRUE(client->Connect(Single(server.Url("/")), rec.Handlers()).ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kConnected, 1));
  ASSERT_TRUE(client->Send("{\"type\":\"options_update\"}").ok());
  ASSERT_TRUE(client->Send("second").ok());
  ASSERT_TRUE(server.WaitFor([](const auto& c) { return c[0].received.size() >= 2; }));
  EXPECT_EQ(server.Connections()[0].received,
            (std::vector<std::string>{"{\"type\":\"options_update\"}", "second"}));
}

// ---------------------------------------------------------------------------------------------
// Keep-alive and timeouts.

TEST(WebSocketClientTest, AnswersServerPings) {
  WsTestServer server([](size_t) {
    WsPlan plan;
    plan.ping = "heartbeat-1";
    return plan;
  });
  Recorder rec;
  auto client = StartClient(LoopbackOptions());
  ASSERT_TRUE(client->Connect(Single(server.Url("/")), rec.Handlers()).ok());
  ASSERT_TRUE(server.WaitFor([](const auto& c) { return !c.empty() && !c[0].pongs.empty(); }));
  EXPECT_EQ(server.Connections()[0].pongs, std::vector<std::string>{"heartbeat-1"});
  EXPECT_EQ(client->stats().pings_received, 1u);
}

TEST(WebSocketClientTest, IdleTimeoutDetectsAServerThatStopsResponding) {
  WsTestServer server([](size_t) {
    WsPlan plan;
    plan.messages = {{"last words", false}};
    plan.then = WsPlan::Then::kSilent;
    return plan;
  });
  WebSocketOptions options = LoopbackOptions();
  options.idle_timeout_ms = 400;
  Recorder rec;
  auto client = StartClient(options);
  ASSERT_TRUE(client->Connect(Single(server.Url("/")), rec.Handlers(StopOnEnd)).ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kStopped, 1));
  const auto [connected, connected_at] = rec.Nth(ConnectionEventKind::kConnected, 0);
  const auto [failed, failed_at] = rec.Nth(ConnectionEventKind::kFailed, 0);
  EXPECT_EQ(failed.error.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(failed.error.message(), "idle timeout")) << failed.error.message();
  EXPECT_GE(std::chrono::duration_cast<milliseconds>(failed_at - connected_at).count(), 400);
  EXPECT_GE(failed.connected_ms, 400);
  EXPECT_EQ(rec.Messages().size(), 1u);
}

TEST(WebSocketClientTest, IdleTimeoutSparesAServerThatAnswersPings) {
  // The server sends nothing but keeps reading, so it answers the client's keep-alive pings.
  WsTestServer server([](size_t) { return WsPlan{}; });
  WebSocketOptions options = LoopbackOptions();
  options.idle_timeout_ms = 200;
  Recorder rec;
  auto client = StartClient(options);
  ASSERT_TRUE(client->Connect(Single(server.Url("/")), rec.Handlers()).ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kConnected, 1));
  // Several idle periods pass with pongs as the only traffic.
  EXPECT_FALSE(rec.WaitForEvents(ConnectionEventKind::kFailed, 1, milliseconds(1'500)));
  EXPECT_GE(client->stats().pongs_received, 3u);
  EXPECT_TRUE(client->connected());
}

TEST(WebSocketClientTest, HandshakeTimeout) {
  WsTestServer server([](size_t) {
    WsPlan plan;
    plan.silent_before_upgrade = true;
    return plan;
  });
  WebSocketOptions options = LoopbackOptions();
  options.handshake_timeout_ms = 300;
  Recorder rec;
  auto client = StartClient(options);
  ASSERT_TRUE(client->Connect(Single(server.Url("/")), rec.Handlers(StopOnEnd)).ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kStopped, 1));
  const ConnectionEvent failed = rec.Nth(ConnectionEventKind::kFailed, 0).first;
  EXPECT_EQ(failed.error.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(failed.error.message(), "within 300 ms")) << failed.error.message();
}

// ---------------------------------------------------------------------------------------------
// Reconnect and failover.

TEST(WebSocketClientTest, ReconnectsAfterADropWithAFreshUrl) {
  WsTestServer server([](size_t index) {
    WsPlan plan;
    if (index == 0) {
      plan.messages = {{"{\"seq\":7}", false}};
      plan.then = WsPlan::Then::kDrop;
    } else {
      plan.messages = {{"{\"seq\":8}", false}};
    }
    return plan;
  });
  Recorder rec;
  auto client = StartClient(LoopbackOptions());
  std::atomic<int> cursor{0};
  std::atomic<int> url_calls{0};
  WebSocketTarget target;
  target.hosts = {"127.0.0.1:" + std::to_string(server.port())};
  target.url_for = [&](const std::string& host) {
    url_calls.fetch_add(1);
    return "ws://" + host + "/subscribe?cursor=" + std::to_string(cursor.load());
  };
  WebSocketHandlers handlers = rec.Handlers();
  auto deliver = handlers.on_message;
  handlers.on_message = [&, deliver](std::string_view data, bool binary) {
    cursor.fetch_add(1);
    deliver(data, binary);
  };
  ASSERT_TRUE(client->Connect(target, handlers).ok());
  ASSERT_TRUE(rec.WaitForMessages(2));
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kConnected, 2));
  const std::vector<ServerConn> conns = server.Connections();
  ASSERT_EQ(conns.size(), 2u);
  EXPECT_EQ(conns[0].target, "/subscribe?cursor=0");
  EXPECT_EQ(conns[1].target, "/subscribe?cursor=1");
  EXPECT_EQ(url_calls.load(), 2);
  const ConnectionEvent lost = rec.Nth(ConnectionEventKind::kFailed, 0).first;
  EXPECT_EQ(lost.error.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(lost.error.message(), "without a close frame")) << lost.error.message();
  EXPECT_GE(lost.retry_in_ms, 0);
  EXPECT_LE(lost.retry_in_ms, 10);  // the first retry's ceiling is base_backoff_ms
  EXPECT_EQ(lost.next_host, target.hosts[0]);
  EXPECT_EQ(rec.Nth(ConnectionEventKind::kConnected, 1).first.attempt, 2);
  EXPECT_EQ(rec.Messages()[1].data, "{\"seq\":8}");
}

TEST(WebSocketClientTest, FailsOverToTheNextHostAfterRepeatedFailures) {
  atfill::testing::RefusingPort down;
  WsTestServer server([](size_t) {
    WsPlan plan;
    plan.messages = {{"from B", false}};
    return plan;
  });
  WebSocketOptions options = LoopbackOptions();
  options.reconnect.failures_before_failover = 2;
  Recorder rec;
  auto client = StartClient(options);
  WebSocketTarget target;
  const std::string host_a = "127.0.0.1:" + std::to_string(down.port());
  const std::string host_b = "127.0.0.1:" + std::to_string(server.port());
  target.hosts = {host_a, host_b};
  target.url_for = [](const std::string& host) { return "ws://" + host + "/subscribe"; };
  ASSERT_TRUE(client->Connect(target, rec.Handlers()).ok());
  ASSERT_TRUE(rec.WaitForMessages(1));
  const std::vector<ConnectionEvent> events = rec.Events();
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[0].kind, ConnectionEventKind::kFailed);
  EXPECT_EQ(events[0].host, host_a);
  EXPECT_EQ(events[0].next_host, host_a);
  EXPECT_EQ(events[0].error.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(events[0].error.message(), "refused")) << events[0].error.message();
  EXPECT_EQ(events[1].kind, ConnectionEventKind::kFailed);
  EXPECT_EQ(events[1].host, host_a);
  EXPECT_EQ(events[1].next_host, host_b);
  EXPECT_EQ(events[2].kind, ConnectionEventKind::kConnected);
  EXPECT_EQ(events[2].host, host_b);
  EXPECT_EQ(events[2].attempt, 3);
  EXPECT_EQ(client->stats().attempts, 3u);
}

TEST(WebSocketClientTest, GivesUpAfterMaxConsecutiveFailures) {
  atfill::testing::RefusingPort down;
  WebSocketOptions options = LoopbackOptions();
  options.reconnect.max_consecutive_failures = 3;
  Recorder rec;
  auto client = StartClient(options);
  ASSERT_TRUE(
      client->Connect(Single("ws://127.0.0.1:" + std::to_string(down.port()) + "/"), rec.Handlers())
          .ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kStopped, 1));
  EXPECT_EQ(rec.Count(ConnectionEventKind::kFailed), 3u);
  EXPECT_GE(rec.Nth(ConnectionEventKind::kFailed, 1).first.retry_in_ms, 0);
  EXPECT_EQ(rec.Nth(ConnectionEventKind::kFailed, 2).first.retry_in_ms, -1);
  EXPECT_EQ(client->stats().attempts, 3u);
}

TEST(WebSocketClientTest, CloseDuringBackoffStopsAtOnce) {
  atfill::testing::RefusingPort down;
  WebSocketOptions options = LoopbackOptions();
  options.reconnect.base_backoff_ms = 60'000;
  options.reconnect.max_backoff_ms = 60'000;
  Recorder rec;
  auto client = StartClient(options);
  ASSERT_TRUE(
      client->Connect(Single("ws://127.0.0.1:" + std::to_string(down.port()) + "/"), rec.Handlers())
          .ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kFailed, 1));
  const auto start = Clock::now();
  client->Close();
  EXPECT_LT(std::chrono::duration_cast<milliseconds>(Clock::now() - start).count(), 5'000);
  EXPECT_EQ(rec.Count(ConnectionEventKind::kStopped), 1u);
  EXPECT_EQ(client->stats().attempts, 1u);
}

// ---------------------------------------------------------------------------------------------
// The SSRF guard, URLs and options.

TEST(WebSocketClientTest, RefusesLoopbackUnlessAllowed) {
  WsTestServer server([](size_t) { return WsPlan{}; });
  WebSocketOptions options = LoopbackOptions();
  options.allow_private_addresses = false;
  Recorder rec;
  auto client = StartClient(options);
  ASSERT_TRUE(client->Connect(Single(server.Url("/")), rec.Handlers(StopOnEnd)).ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kStopped, 1));
  const ConnectionEvent failed = rec.Nth(ConnectionEventKind::kFailed, 0).first;
  EXPECT_EQ(failed.error.code(), StatusCode::kInvalid);
  EXPECT_TRUE(Contains(failed.error.message(), "127.0.0.1 is loopback")) << failed.error.message();
  EXPECT_EQ(server.accepted(), 0u);
}

TEST(WebSocketClientTest, AnUnusableUrlStopsTheSession) {
  Recorder rec;
  auto client = StartClient(LoopbackOptions());
  ASSERT_TRUE(client->Connect(Single("http://127.0.0.1/"), rec.Handlers()).ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kStopped, 1));
  const ConnectionEvent failed = rec.Nth(ConnectionEventKind::kFailed, 0).first;
  EXPECT_EQ(failed.error.code(), StatusCode::kInvalid);
  EXPECT_TRUE(Contains(failed.error.message(), "only ws and wss")) << failed.error.message();
  EXPECT_EQ(failed.retry_in_ms, -1);
  EXPECT_EQ(client->Connect(WebSocketTarget{}, rec.Handlers()).code(), StatusCode::kInvalid);
}

TEST(WebSocketUrlTest, ParsesWsAndWss) {
  Result<WebSocketUrl> u = ParseWebSocketUrl("wss://Jetstream1.US-East.bsky.network/subscribe?x=1");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_TRUE(u->tls);
  EXPECT_EQ(u->host, "jetstream1.us-east.bsky.network");
  EXPECT_EQ(u->port, 443);
  EXPECT_EQ(u->target, "/subscribe?x=1");
  EXPECT_EQ(u->host_header, "jetstream1.us-east.bsky.network");
  EXPECT_FALSE(u->host_is_ip);

  u = ParseWebSocketUrl("ws://127.0.0.1:6008?cursor=1#frag");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_FALSE(u->tls);
  EXPECT_EQ(u->port, 6008);
  EXPECT_EQ(u->target, "/?cursor=1");
  EXPECT_EQ(u->host_header, "127.0.0.1:6008");
  EXPECT_TRUE(u->host_is_ip);

  u = ParseWebSocketUrl("WS://[::1]:80");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 80);
  EXPECT_EQ(u->target, "/");
  EXPECT_EQ(u->host_header, "[::1]");
  EXPECT_TRUE(u->host_is_ip);
}

TEST(WebSocketUrlTest, RejectsWhatIsNotAWebSocketUrl) {
  for (const char* url :
       {"", "http://example.com/", "example.com/x", "ws://", "ws:///path", "ws://user@host/",
        "ws://host:0/", "ws://host:65536/", "ws://host:/", "ws://host:12a/", "ws://[::1/",
        "ws://[zz]/", "ws://ho st/", "ws://host/a b", "ws://host/\r\nX: y", "ws://h%41/"}) {
    Result<WebSocketUrl> u = ParseWebSocketUrl(url);
    EXPECT_FALSE(u.ok()) << url;
    EXPECT_EQ(u.status().code(), StatusCode::kInvalid) << url;
  }
  EXPECT_TRUE(Contains(ParseWebSocketUrl("https://x/").status().message(), "'https'"));
}

TEST(WebSocketOptionsTest, ValidateNamesTheBadField) {
  struct Case {
    std::function<void(WebSocketOptions&)> edit;
    const char* field;
  };
  const Case cases[] = {
      {[](auto& o) { o.connect_timeout_ms = 0; }, "connect_timeout_ms"},
      {[](auto& o) { o.handshake_timeout_ms = -1; }, "handshake_timeout_ms"},
      {[](auto& o) { o.close_timeout_ms = 0; }, "close_timeout_ms"},
      {[](auto& o) { o.idle_timeout_ms = -1; }, "idle_timeout_ms"},
      {[](auto& o) { o.max_message_bytes = 0; }, "max_message_bytes"},
      {[](auto& o) { o.max_message_bytes = (uint64_t{1} << 30) + 1; }, "max_message_bytes"},
      {[](auto& o) { o.user_agent = "a\r\nb"; }, "user_agent"},
      {[](auto& o) { o.subprotocol = "two tokens"; }, "subprotocol"},
      {[](auto& o) {
         o.headers = {{"Bad Name", "v"}};
       },
       "headers"},
      {[](auto& o) {
         o.headers = {{"Sec-WebSocket-Protocol", "v"}};
       },
       "Sec-WebSocket-Protocol"},
      {[](auto& o) {
         o.headers = {{"X-Ok", "a\nb"}};
       },
       "X-Ok"},
      {[](auto& o) { o.reconnect.failures_before_failover = 0; }, "failures_before_failover"},
      {[](auto& o) { o.reconnect.max_backoff_ms = 1; }, "max_backoff_ms"},
  };
  EXPECT_TRUE(WebSocketOptions{}.Validate().ok());
  for (const Case& c : cases) {
    WebSocketOptions options;
    c.edit(options);
    Status st = options.Validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalid) << c.field;
    EXPECT_TRUE(Contains(st.message(), c.field)) << st.message();
    EXPECT_FALSE(WebSocketClient::Start(options).ok()) << c.field;
  }
  WebSocketOptions bad_pem;
  bad_pem.tls_ca_pem = "not a certificate";
  EXPECT_EQ(WebSocketClient::Start(bad_pem).status().code(), StatusCode::kInvalid);
}

// ---------------------------------------------------------------------------------------------
// wss.

TEST(WebSocketTlsTest, ConnectsToATrustedServerAndChecksTheIpAddress) {
  TestCa ca;
  const Pem leaf = ca.Leaf("IP:127.0.0.1");
  auto tls = ServerTls(leaf);
  WsTestServer server(
      [](size_t) {
        WsPlan plan;
        plan.messages = {{"secure hello", false}, {Pattern(200'000), true}};
        return plan;
      },
      tls.get());
  WebSocketOptions options = LoopbackOptions();
  options.tls_ca_pem = ca.cert_pem();
  Recorder rec;
  auto client = StartClient(options);
  ASSERT_TRUE(client->Connect(Single(server.Url("/tls?x=1", true)), rec.Handlers()).ok());
  ASSERT_TRUE(rec.WaitForMessages(2));
  EXPECT_EQ(rec.Messages()[0].data, "secure hello");
  EXPECT_TRUE(rec.Messages()[1].data == Pattern(200'000));
  EXPECT_EQ(server.Connections()[0].target, "/tls?x=1");
  EXPECT_EQ(server.Connections()[0].sni, "");  // no SNI for an IP literal (RFC 6066)
  client->Close();
  EXPECT_EQ(rec.Nth(ConnectionEventKind::kClosed, 0).first.close_code, 1000);
}

TEST(WebSocketTlsTest, SendsSniAndChecksTheHostName) {
  TestCa ca;
  const Pem leaf = ca.Leaf("DNS:localhost");
  auto tls = ServerTls(leaf);
  WsTestServer server(
      [](size_t) {
        WsPlan plan;
        plan.messages = {{"named", false}};
        return plan;
      },
      tls.get());
  WebSocketOptions options = LoopbackOptions();
  options.tls_ca_pem = ca.cert_pem();
  Recorder rec;
  auto client = StartClient(options);
  ASSERT_TRUE(client
                  ->Connect(Single("wss://localhost:" + std::to_string(server.port()) + "/"),
                            rec.Handlers())
                  .ok());
  ASSERT_TRUE(rec.WaitForMessages(1));
  EXPECT_EQ(server.Connections()[0].sni, "localhost");
  EXPECT_EQ(server.Connections()[0].Header("host"), "localhost:" + std::to_string(server.port()));
}

TEST(WebSocketTlsTest, RejectsUntrustedAndMismatchedCertificates) {
  TestCa ca;
  struct Case {
    std::string san;
    bool trust;
    const char* why;
  };
  for (const Case& c :
       {Case{"IP:127.0.0.1", false, "unable to get local issuer certificate"},
        Case{"DNS:other.example", true, "mismatch"}, Case{"IP:127.0.0.2", true, "mismatch"}}) {
    const Pem leaf = ca.Leaf(c.san);
    auto tls = ServerTls(leaf);
    WsTestServer server([](size_t) { return WsPlan{}; }, tls.get());
    WebSocketOptions options = LoopbackOptions();
    if (c.trust) options.tls_ca_pem = ca.cert_pem();
    Recorder rec;
    auto client = StartClient(options);
    ASSERT_TRUE(client->Connect(Single(server.Url("/", true)), rec.Handlers(StopOnEnd)).ok());
    ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kStopped, 1));
    EXPECT_EQ(rec.Count(ConnectionEventKind::kConnected), 0u) << c.san;
    const ConnectionEvent failed = rec.Nth(ConnectionEventKind::kFailed, 0).first;
    EXPECT_EQ(failed.error.code(), StatusCode::kUnavailable);
    EXPECT_TRUE(Contains(failed.error.message(), "certificate rejected")) << failed.error.message();
    EXPECT_TRUE(Contains(failed.error.message(), c.why)) << failed.error.message();
    EXPECT_FALSE(server.Connections()[0].upgraded);
  }
}

TEST(WebSocketTlsTest, ConnectTimeoutCoversTheTlsHandshake) {
  WsTestServer server([](size_t) {
    WsPlan plan;
    plan.silent_before_upgrade = true;
    return plan;
  });
  WebSocketOptions options = LoopbackOptions();
  options.connect_timeout_ms = 300;
  Recorder rec;
  auto client = StartClient(options);
  ASSERT_TRUE(client->Connect(Single(server.Url("/", true)), rec.Handlers(StopOnEnd)).ok());
  ASSERT_TRUE(rec.WaitForEvents(ConnectionEventKind::kStopped, 1));
  const ConnectionEvent failed = rec.Nth(ConnectionEventKind::kFailed, 0).first;
  EXPECT_EQ(failed.error.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(failed.error.message(), "longer than 300 ms")) << failed.error.message();
}

// ---------------------------------------------------------------------------------------------
// The reconnect schedule (pure).

TEST(ReconnectScheduleTest, BackoffStaysWithinTheJitteredCeilings) {
  ReconnectPolicy policy;
  policy.base_backoff_ms = 100;
  policy.max_backoff_ms = 3'000;
  policy.failures_before_failover = 1'000;
  ReconnectSchedule schedule(policy, {"a"}, 7);
  std::set<int64_t> distinct;
  for (int failure = 1; failure <= 40; ++failure) {
    const ReconnectStep step = schedule.AttemptEnded(-1);
    int64_t ceiling = 100;
    for (int i = 1; i < failure && ceiling < 3'000; ++i) ceiling *= 2;
    ceiling = std::min<int64_t>(ceiling, 3'000);
    EXPECT_GE(step.delay_ms, 0) << failure;
    EXPECT_LE(step.delay_ms, ceiling) << failure;
    EXPECT_FALSE(step.give_up);
    EXPECT_EQ(step.host, "a");
    EXPECT_EQ(schedule.consecutive_failures(), failure);
    if (failure > 6) distinct.insert(step.delay_ms);
  }
  // Full jitter: the capped draws are spread out, not pinned to the ceiling.
  EXPECT_GT(distinct.size(), 20u);
  EXPECT_LT(*distinct.begin(), 1'500);
  EXPECT_GT(*distinct.rbegin(), 1'500);
}

TEST(ReconnectScheduleTest, SameSeedSameDelaysOtherSeedOtherDelays) {
  ReconnectPolicy policy;
  auto run = [&](uint64_t seed) {
    ReconnectSchedule schedule(policy, {"a", "b"}, seed);
    std::vector<int64_t> delays;
    for (int i = 0; i < 12; ++i) delays.push_back(schedule.AttemptEnded(-1).delay_ms);
    return delays;
  };
  EXPECT_EQ(run(1234), run(1234));
  EXPECT_NE(run(1234), run(4321));
}

TEST(ReconnectScheduleTest, FailsOverAfterNFailuresAndWrapsAround) {
  ReconnectPolicy policy;
  policy.failures_before_failover = 2;
  ReconnectSchedule schedule(policy, {"a", "b", "c"}, 1);
  EXPECT_EQ(schedule.host(), "a");
  const char* expected_hosts[] = {"a", "b", "b", "c", "c", "a", "a", "b"};
  const bool expected_switch[] = {false, true, false, true, false, true, false, true};
  for (int i = 0; i < 8; ++i) {
    const ReconnectStep step = schedule.AttemptEnded(i % 2 == 0 ? -1 : 10);  // short-lived
    EXPECT_EQ(step.host, expected_hosts[i]) << i;
    EXPECT_EQ(step.failed_over, expected_switch[i]) << i;
    EXPECT_EQ(schedule.host(), step.host);
  }
  EXPECT_EQ(schedule.consecutive_failures(), 8);
}

TEST(ReconnectScheduleTest, AStableConnectionResetsTheCounts) {
  ReconnectPolicy policy;
  policy.base_backoff_ms = 100;
  policy.max_backoff_ms = 100'000;
  policy.failures_before_failover = 3;
  policy.stable_after_ms = 5'000;
  ReconnectSchedule schedule(policy, {"a", "b"}, 99);
  schedule.AttemptEnded(-1);
  schedule.AttemptEnded(4'999);  // up, but not long enough to count as stable
  EXPECT_EQ(schedule.host_failures(), 2);
  ReconnectStep step = schedule.AttemptEnded(5'000);
  EXPECT_EQ(schedule.host_failures(), 0);
  EXPECT_EQ(schedule.consecutive_failures(), 0);
  EXPECT_EQ(step.host, "a");
  EXPECT_FALSE(step.failed_over);
  EXPECT_LE(step.delay_ms, 100);  // back to the first ceiling
  // It takes three fresh failures to move to b.
  EXPECT_EQ(schedule.AttemptEnded(-1).host, "a");
  EXPECT_EQ(schedule.AttemptEnded(-1).host, "a");
  EXPECT_EQ(schedule.AttemptEnded(-1).host, "b");
}

// A stream that drops every few seconds but delivers events each time made progress: it must
// reconnect at the first ceiling, not back off towards max_backoff_ms and fall behind.
TEST(ReconnectScheduleTest, AConnectionThatDeliveredMessagesResetsTheCounts) {
  ReconnectPolicy policy;
  policy.base_backoff_ms = 100;
  policy.max_backoff_ms = 60'000;
  policy.stable_after_ms = 60'000;
  ReconnectSchedule schedule(policy, {"a", "b"}, 7);
  for (int i = 0; i < 6; ++i) schedule.AttemptEnded(-1);
  EXPECT_EQ(schedule.consecutive_failures(), 6);
  for (int i = 0; i < 20; ++i) {
    const ReconnectStep step = schedule.AttemptEnded(2'000, 150);  // up 2 s, 150 messages
    EXPECT_EQ(schedule.consecutive_failures(), 0) << i;
    EXPECT_LE(step.delay_ms, 100) << i;
    EXPECT_FALSE(step.failed_over) << i;
  }
  // Up for a while without a single message is still a failure.
  schedule.AttemptEnded(2'000, 0);
  EXPECT_EQ(schedule.consecutive_failures(), 1);
}

TEST(ReconnectScheduleTest, GivesUpAfterMaxConsecutiveFailures) {
  ReconnectPolicy policy;
  policy.max_consecutive_failures = 3;
  ReconnectSchedule schedule(policy, {"a"}, 5);
  EXPECT_FALSE(schedule.AttemptEnded(-1).give_up);
  EXPECT_FALSE(schedule.AttemptEnded(-1).give_up);
  EXPECT_TRUE(schedule.AttemptEnded(-1).give_up);
}

TEST(ReconnectScheduleTest, ValidateNamesTheBadField) {
  EXPECT_TRUE(ReconnectPolicy{}.Validate().ok());
  ReconnectPolicy p;
  p.base_backoff_ms = -1;
  EXPECT_TRUE(Contains(p.Validate().message(), "base_backoff_ms"));
  p = {};
  p.stable_after_ms = -1;
  EXPECT_TRUE(Contains(p.Validate().message(), "stable_after_ms"));
  p = {};
  p.max_consecutive_failures = -1;
  EXPECT_TRUE(Contains(p.Validate().message(), "max_consecutive_failures"));
  p = {};
  p.failures_before_failover = 1'001;
  EXPECT_TRUE(Contains(p.Validate().message(), "failures_before_failover"));
}

}  // namespace
}  // namespace atfill::net
