// simnet's Jetstream (jetstream.localhost) read by a Boost.Beast WebSocket client: both wire
// versions deliver the whole generated log in seq order, frames decode with the project's
// decoders and carry CIDs that verify, folding a stream gives the ground truth, and cursors,
// filters, compression, the retention floor, injected disconnects, bursts and slow-consumer
// drops behave as SPEC.md (../shared/protocols/jetstream) §0-§2 says.
#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "atproto/json.hpp"
#include "net/http_client.hpp"
#include "sources/crawl/fetcher.hpp"
#include "sources/jetstream/jetstream_frames.hpp"
#include "tests/common/test_util.hpp"
#include "tools/simnet/jetstream.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill::simnet {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using namespace std::chrono_literals;
using sources::FrameKind;
using sources::JetstreamFrame;

constexpr auto kReadTimeout = std::chrono::milliseconds(10'000);
const std::vector<std::string> kCollections = {"app.bsky.feed.post", "app.bsky.feed.like",
                                               "app.bsky.graph.follow", "app.bsky.actor.profile",
                                               "com.example.simnet.note"};

SimnetOptions Options(uint64_t events) {
  SimnetOptions o;
  o.seed = 11;
  o.accounts = 40;
  o.pds_hosts = 3;
  o.collections = kCollections;
  o.max_records = 4;
  o.threads = 2;
  o.jetstream.events = events;
  return o;
}

std::unique_ptr<Simnet> StartOrDie(SimnetOptions options) {
  Result<std::unique_ptr<Simnet>> net = Simnet::Start(std::move(options));
  EXPECT_TRUE(net.ok()) << net.status().ToString();
  return net.ok() ? std::move(*net) : nullptr;
}

struct Message {
  bool binary = false;
  std::string data;
};

// A WebSocket client on its own io_context; every operation runs it for a bounded time.
class WsClient {
 public:
  enum class End { kMessage, kTimeout, kClosed, kDropped };

  explicit WsClient(uint16_t port) : port_(port), ws_(ioc_) {}

  // Connects to 127.0.0.1 and asks jetstream.localhost for the upgrade. False when refused
  // (refused_status() and response() tell why) or on a transport error.
  bool Connect(const std::string& target,
               const std::vector<std::pair<std::string, std::string>>& headers = {},
               int receive_buffer = 0) {
    beast::tcp_stream& tcp = beast::get_lowest_layer(ws_);
    if (receive_buffer > 0) {
      tcp.socket().open(asio::ip::tcp::v4());
      tcp.socket().set_option(asio::socket_base::receive_buffer_size(receive_buffer));
    }
    auto done = std::make_shared<std::optional<beast::error_code>>();
    tcp.async_connect(asio::ip::tcp::endpoint(asio::ip::make_address_v4("127.0.0.1"), port_),
                      [done](beast::error_code ec) { *done = ec; });
    if (!Run(*done, kReadTimeout) || **done) return false;
    ws_.set_option(websocket::stream_base::decorator([headers](websocket::request_type& req) {
      for (const auto& [name, value] : headers) req.set(name, value);
    }));
    done->reset();
    ws_.async_handshake(response_, "jetstream.localhost:" + std::to_string(port_), target,
                        [done](beast::error_code ec) { *done = ec; });
    if (!Run(*done, kReadTimeout)) return false;
    error_ = **done;
    return !error_;
  }

  // Offers permessage-deflate in the next Connect.
  void OfferDeflate() {
    websocket::permessage_deflate pmd;
    pmd.client_enable = true;
    ws_.set_option(pmd);
  }

  // The upgrade's answer (on refusal: the HTTP status, headers and body).
  const websocket::response_type& response() const { return response_; }
  int refused_status() const { return static_cast<int>(response_.result_int()); }

  End Read(Message* m, std::chrono::milliseconds timeout = kReadTimeout) {
    auto done = std::make_shared<std::optional<beast::error_code>>();
    buffer_.consume(buffer_.size());
    ws_.async_read(buffer_, [done](beast::error_code ec, size_t) { *done = ec; });
    if (!Run(*done, timeout)) return End::kTimeout;
    if (**done == websocket::error::closed) {
      close_code_ = ws_.reason().code;
      return End::kClosed;
    }
    if (**done) {
      error_ = **done;
      return End::kDropped;
    }
    m->binary = ws_.got_binary();
    m->data = beast::buffers_to_string(buffer_.data());
    return End::kMessage;
  }

  bool SendText(const std::string& text) {
    auto done = std::make_shared<std::optional<beast::error_code>>();
    ws_.text(true);
    ws_.async_write(asio::buffer(text), [done](beast::error_code ec, size_t) { *done = ec; });
    return Run(*done, kReadTimeout) && !**done;
  }

  beast::error_code error() const { return error_; }
  uint16_t close_code() const { return close_code_; }

 private:
  // Runs the io_context until `done` is set or `timeout` passes; then cancels what is pending.
  bool Run(const std::optional<beast::error_code>& done, std::chrono::milliseconds timeout) {
    ioc_.restart();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done && std::chrono::steady_clock::now() < deadline) {
      ioc_.run_one_until(deadline);
    }
    if (done) return true;
    beast::error_code ignored;
    beast::get_lowest_layer(ws_).socket().cancel(ignored);
    ioc_.restart();
    ioc_.run_for(std::chrono::seconds(5));
    return false;
  }

  uint16_t port_;
  asio::io_context ioc_;
  websocket::stream<beast::tcp_stream> ws_;
  websocket::response_type response_;
  beast::flat_buffer buffer_;
  beast::error_code error_;
  uint16_t close_code_ = 0;
};

struct HttpResult {
  int status = 0;
  std::string content_type;
  std::string body;
};

// One plain HTTP request to jetstream.localhost, bounded by 10 s.
HttpResult HttpCall(uint16_t port, http::verb verb, const std::string& target) {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.expires_after(10s);
  http::request<http::empty_body> req(verb, target, 11);
  req.set(http::field::host, "jetstream.localhost:" + std::to_string(port));
  req.keep_alive(false);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  bool ok = false;
  stream.async_connect(asio::ip::tcp::endpoint(asio::ip::make_address_v4("127.0.0.1"), port),
                       [&](beast::error_code ec) {
                         if (ec) return;
                         http::async_write(stream, req, [&](beast::error_code ec2, size_t) {
                           if (ec2) return;
                           http::async_read(stream, buffer, res,
                                            [&](beast::error_code ec3, size_t) { ok = !ec3; });
                         });
                       });
  ioc.run();
  HttpResult out;
  if (!ok) return out;
  out.status = static_cast<int>(res.result_int());
  out.content_type = std::string(res[http::field::content_type]);
  out.body = res.body();
  return out;
}

// Decodes one message of stream `version`; binary messages are decompressed with `decoder`.
Status Decode(int version, const Message& m, sources::ZstdFrameDecoder* decoder,
              JetstreamFrame* frame, std::string* text) {
  std::string kind;
  if (m.binary) {
    if (decoder == nullptr) return Status::Invalid("a binary message on an uncompressed stream");
    ATFILL_RETURN_IF_ERROR(decoder->Decompress(AsBytes(m.data), text, &kind));
  } else {
    *text = m.data;
  }
  return version == 1 ? sources::DecodeJetstreamV1(*text, frame, &kind)
                      : sources::DecodeJetstreamV2(*text, frame, &kind);
}

// What a connection received.
struct Stream {
  std::vector<JetstreamFrame> frames;  // event frames, in arrival order
  std::vector<std::string> texts;      // their decompressed texts
  std::vector<JetstreamFrame> others;  // info and error frames
  WsClient::End end = WsClient::End::kMessage;
  size_t binary = 0, text = 0;  // message types seen
  size_t wire_bytes = 0;        // message bytes as received
};

// Reads until an event frame with seq >= last_seq arrives (end = kMessage), an error frame
// (kMessage, in `others`), or the connection ends or stalls. Every message must decode.
Stream ReadUntil(WsClient& client, int version, uint64_t last_seq,
                 sources::ZstdFrameDecoder* decoder = nullptr) {
  Stream s;
  for (uint64_t guard = 0; guard < 20'000'000; ++guard) {
    Message m;
    s.end = client.Read(&m);
    if (s.end != WsClient::End::kMessage) return s;
    (m.binary ? s.binary : s.text) += 1;
    s.wire_bytes += m.data.size();
    JetstreamFrame frame;
    std::string text;
    const Status st = Decode(version, m, decoder, &frame, &text);
    EXPECT_TRUE(st.ok()) << st.ToString() << " in " << text.substr(0, 300);
    if (!st.ok()) return s;
    if (!frame.advances_cursor()) {
      const bool error = frame.kind() == FrameKind::kError;
      s.others.push_back(std::move(frame));
      if (error) return s;
      continue;
    }
    const uint64_t seq = frame.seq;
    s.frames.push_back(std::move(frame));
    s.texts.push_back(std::move(text));
    if (seq >= last_seq) return s;
  }
  return s;
}

std::vector<uint64_t> Seqs(const std::vector<JetstreamFrame>& frames) {
  std::vector<uint64_t> out;
  for (const JetstreamFrame& f : frames) out.push_back(f.seq);
  return out;
}

std::vector<uint64_t> Range(uint64_t first, uint64_t last) {
  std::vector<uint64_t> out;
  for (uint64_t s = first; s <= last; ++s) out.push_back(s);
  return out;
}

// A consumer's table: frames applied with atproto semantics, as the engine applies them.
struct Table {
  std::map<std::string, std::pair<std::string, std::string>> records;  // uri -> (cid, body)
  std::map<std::string, AccountStatus> accounts;

  void Apply(const JetstreamFrame& f) {
    if (const auto* r = std::get_if<pipeline::RecordEvent>(&f.payload)) {
      if (r->operation == pipeline::Operation::kDelete) {
        records.erase(r->Uri());
      } else {
        records[r->Uri()] = {r->cid.ToString(), r->body};
      }
    } else if (const auto* a = std::get_if<pipeline::AccountEvent>(&f.payload)) {
      accounts[a->did] = a->status;
      if (!a->active && pipeline::StatusPurgesRecords(a->status)) {
        const std::string prefix = "at://" + a->did + "/";
        auto it = records.lower_bound(prefix);
        while (it != records.end() && it->first.starts_with(prefix)) it = records.erase(it);
      }
    }
  }
};

// Compares a table with the truth, restricted to records whose DID passes `keep`.
template <typename Keep>
void ExpectTableIsTruth(const Table& table, const JetstreamTruth& truth, Keep keep) {
  std::map<std::string, std::pair<std::string, std::string>> want;
  for (const JetstreamTruthRecord& r : truth.records) {
    const std::string did = r.uri.substr(5, r.uri.find('/', 5) - 5);
    if (keep(did)) want[r.uri] = {r.cid, r.body};
  }
  EXPECT_EQ(table.records.size(), want.size());
  EXPECT_TRUE(table.records == want) << "the folded stream differs from the ground truth";
  for (const JetstreamTruthAccount& a : truth.accounts) {
    if (!keep(a.did)) continue;
    auto it = table.accounts.find(a.did);
    ASSERT_NE(it, table.accounts.end()) << a.did;
    EXPECT_EQ(it->second, a.status) << a.did;
  }
}

void ExpectTableIsTruth(const Table& table, const JetstreamTruth& truth) {
  ExpectTableIsTruth(table, truth, [](const std::string&) { return true; });
}

// Checks each frame against the log: kind, DID, time, and for writes a CID that verifies.
void ExpectFramesMatchLog(const JetstreamLog& log, const std::vector<JetstreamFrame>& frames) {
  for (const JetstreamFrame& f : frames) {
    ASSERT_GE(f.seq, 1u);
    ASSERT_LE(f.seq, log.size());
    EXPECT_EQ(f.time_us, log.TimeUs(f.seq)) << f.seq;
    const JetstreamKind kind = log.event(f.seq).kind;
    if (const auto* r = std::get_if<pipeline::RecordEvent>(&f.payload)) {
      ASSERT_TRUE(log.IsCommit(f.seq)) << f.seq;
      EXPECT_EQ(r->did, log.Did(f.seq));
      EXPECT_EQ(r->Uri(), log.Uri(f.seq));
      EXPECT_EQ(r->rev, log.Rev(f.seq));
      EXPECT_EQ(static_cast<int>(r->operation), static_cast<int>(kind) - 1) << f.seq;
      if (r->operation != pipeline::Operation::kDelete) {
        Result<atproto::Cid> cid = atproto::CidOfRecord(r->body);
        ASSERT_TRUE(cid.ok()) << cid.status().ToString();
        EXPECT_EQ(*cid, r->cid) << "seq " << f.seq << ": the frame's cid is not its record's";
      }
    } else if (const auto* a = std::get_if<pipeline::AccountEvent>(&f.payload)) {
      EXPECT_EQ(kind, JetstreamKind::kAccount) << f.seq;
      EXPECT_EQ(a->did, log.Did(f.seq));
      EXPECT_EQ(a->status, log.event(f.seq).status);
    } else if (const auto* i = std::get_if<sources::IdentityChange>(&f.payload)) {
      EXPECT_EQ(kind, JetstreamKind::kIdentity) << f.seq;
      EXPECT_EQ(i->did, log.Did(f.seq));
      EXPECT_EQ(i->handle, log.Handle(f.seq));
    } else {
      ADD_FAILURE() << "seq " << f.seq << ": unexpected frame kind";
    }
  }
}

TEST(SimnetJetstreamTest, LogHasEveryKindAndPurges) {
  auto net = StartOrDie(Options(3000));
  ASSERT_NE(net, nullptr);
  const JetstreamLog& log = *net->jetstream();
  ASSERT_EQ(log.size(), 3000u);
  std::map<JetstreamKind, int> kinds;
  int purges = 0, reactivations = 0;
  for (uint64_t seq = 1; seq <= log.size(); ++seq) {
    const JetstreamEvent& e = log.event(seq);
    ++kinds[e.kind];
    if (e.kind == JetstreamKind::kAccount) {
      purges += e.status == AccountStatus::kTakendown || e.status == AccountStatus::kDeleted;
      reactivations += e.status == AccountStatus::kActive;
    }
    if (seq > 1) {
      EXPECT_GT(log.TimeUs(seq), log.TimeUs(seq - 1));
    }
  }
  EXPECT_GT(kinds[JetstreamKind::kCreate], 1000);
  EXPECT_GT(kinds[JetstreamKind::kUpdate], 100);
  EXPECT_GT(kinds[JetstreamKind::kDelete], 100);
  EXPECT_GT(kinds[JetstreamKind::kIdentity], 10);
  EXPECT_GT(kinds[JetstreamKind::kAccount], 10);
  EXPECT_GT(purges, 0);
  EXPECT_GT(reactivations, 0);
  Result<JetstreamTruth> truth = net->JetstreamGroundTruth();
  ASSERT_TRUE(truth.ok()) << truth.status().ToString();
  EXPECT_GT(truth->records.size(), 500u);
  // The same seed gives the same log.
  Result<std::unique_ptr<Network>> again = Network::Generate(net->network().options(), net->port());
  ASSERT_TRUE(again.ok());
  Result<std::unique_ptr<JetstreamLog>> log2 =
      JetstreamLog::Generate(**again, net->network().options().jetstream);
  ASSERT_TRUE(log2.ok());
  Result<JetstreamTruth> truth2 = (*log2)->Truth();
  ASSERT_TRUE(truth2.ok());
  EXPECT_EQ(truth2->ToTsv(), truth->ToTsv());
}

// False deletions: the PDS keeps saying active (getRepoStatus), the truth keeps the account's
// records, and no later #account event names the account.
TEST(SimnetJetstreamTest, FalseDeletionsLeaveTheAccountActiveOnItsPds) {
  SimnetOptions o = Options(4000);
  o.jetstream.account_share = 0.1;
  o.jetstream.false_delete_share = 0.5;
  auto net = StartOrDie(o);
  ASSERT_NE(net, nullptr);
  const JetstreamLog& log = *net->jetstream();
  std::map<uint32_t, uint64_t> falsely_deleted;  // account -> seq of the false report
  int genuine_deletes = 0;
  for (uint64_t seq = 1; seq <= log.size(); ++seq) {
    const JetstreamEvent& e = log.event(seq);
    if (e.kind != JetstreamKind::kAccount) continue;
    EXPECT_EQ(falsely_deleted.count(e.account), 0u)
        << "seq " << seq << " names an account falsely deleted at " << falsely_deleted[e.account];
    if (e.false_report) {
      EXPECT_EQ(e.status, AccountStatus::kDeleted);
      EXPECT_EQ(log.StatusAt(e.account, seq), AccountStatus::kActive);
      falsely_deleted[e.account] = seq;
    } else {
      EXPECT_EQ(log.StatusAt(e.account, seq), e.status) << seq;
      genuine_deletes += e.status == AccountStatus::kDeleted;
    }
  }
  ASSERT_GE(falsely_deleted.size(), 2u);
  ASSERT_GE(genuine_deletes, 1);
  Result<JetstreamTruth> truth = net->JetstreamGroundTruth();
  ASSERT_TRUE(truth.ok()) << truth.status().ToString();
  // The PDS answers with the account's status after everything published (all of it here).
  net::HttpClientOptions ho;
  ho.allow_private_addresses = true;
  auto http = net::HttpClient::Start(ho);
  ASSERT_TRUE(http.ok());
  const auto& accounts = net->network().accounts();
  const auto ask = [&](const Account& a) {
    net::HttpRequest request;
    request.url = sources::GetRepoStatusUrl(net->pds_url(a.pds), a.did);
    return (*http)->Fetch(request);
  };
  uint64_t kept_records = 0;
  for (const auto& [account, seq] : falsely_deleted) {
    const Account& a = accounts[account];
    auto got = ask(a);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->status, 200) << got->body;
    auto status = sources::ParseRepoStatus(a.did, got->body);
    ASSERT_TRUE(status.ok()) << status.status().ToString();
    EXPECT_TRUE(status->active) << a.did;
    // Its records created before the false report (and after the last purge by a genuine
    // takedown) are still in the truth unless deleted one by one.
    uint64_t purged_at = 0;
    for (uint64_t s = 1; s < seq; ++s) {
      const JetstreamEvent& e = log.event(s);
      if (e.kind == JetstreamKind::kAccount && e.account == account &&
          (e.status == AccountStatus::kTakendown || e.status == AccountStatus::kDeleted)) {
        purged_at = s;
      }
    }
    for (uint64_t s = purged_at + 1; s < seq; ++s) {
      const JetstreamEvent& e = log.event(s);
      if (e.kind != JetstreamKind::kCreate || e.account != account) continue;
      ++kept_records;
      bool deleted = false;
      for (uint64_t later = s + 1; later <= log.size() && !deleted; ++later) {
        deleted = log.event(later).kind == JetstreamKind::kDelete && log.event(later).target == s;
      }
      if (deleted) continue;
      const std::string uri = log.Uri(s);
      EXPECT_TRUE(std::any_of(truth->records.begin(), truth->records.end(),
                              [&](const JetstreamTruthRecord& r) { return r.uri == uri; }))
          << uri << " was purged by a false report";
    }
  }
  EXPECT_GT(kept_records, 0u);
  for (uint64_t seq = 1; seq <= log.size(); ++seq) {
    const JetstreamEvent& e = log.event(seq);
    if (e.kind != JetstreamKind::kAccount || e.false_report || e.status != AccountStatus::kDeleted)
      continue;
    const Account& a = accounts[e.account];
    auto got = ask(a);
    ASSERT_TRUE(got.ok());
    auto status = sources::ParseRepoStatus(a.did, got->body);
    ASSERT_TRUE(status.ok()) << got->body;
    EXPECT_FALSE(status->active);
    EXPECT_EQ(status->status, "deleted");
  }
}

TEST(SimnetJetstreamTest, V2DeliversEveryEventInOrderAndFoldsToTheTruth) {
  auto net = StartOrDie(Options(3000));
  ASSERT_NE(net, nullptr);
  const JetstreamLog& log = *net->jetstream();
  EXPECT_EQ(net->jetstream_url(), "ws://jetstream.localhost:" + std::to_string(net->port()));
  WsClient client(net->port());
  // cursor=0 is seq 1 while the floor is 1.
  ASSERT_TRUE(client.Connect("/xrpc/network.bsky.jetstream.subscribeEvents?cursor=0"))
      << client.error().message();
  const Stream s = ReadUntil(client, 2, log.size());
  ASSERT_EQ(s.end, WsClient::End::kMessage);
  EXPECT_EQ(s.binary, 0u);
  EXPECT_TRUE(s.others.empty());
  EXPECT_EQ(Seqs(s.frames), Range(1, log.size()));
  ExpectFramesMatchLog(log, s.frames);
  // Frames are Go encoding/json: keys in order, <>& escaped.
  bool escaped = false;
  for (size_t i = 0; i < s.texts.size(); ++i) {
    const std::string& t = s.texts[i];
    ASSERT_TRUE(t.starts_with(
        "{\"$type\":\"message\",\"payload\":{\"$type\":\"network.bsky.jetstream.subscribeEvents#"))
        << t;
    EXPECT_EQ(t.find('<'), std::string::npos) << t;
    escaped = escaped || t.find("\\u003c") != std::string::npos;
    Result<std::string> want = log.FrameV2(s.frames[i].seq);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(t, *want);
  }
  EXPECT_TRUE(escaped);
  Table table;
  for (const JetstreamFrame& f : s.frames) table.Apply(f);
  Result<JetstreamTruth> truth = net->JetstreamGroundTruth();
  ASSERT_TRUE(truth.ok()) << truth.status().ToString();
  ExpectTableIsTruth(table, *truth);
  // After the last event the connection stays open and idle.
  Message m;
  EXPECT_EQ(client.Read(&m, 300ms), WsClient::End::kTimeout);
  EXPECT_GE(net->stats().jetstream_frames, log.size());
}

TEST(SimnetJetstreamTest, V1DeliversEveryEventInOrderAndFoldsToTheTruth) {
  auto net = StartOrDie(Options(3000));
  ASSERT_NE(net, nullptr);
  const JetstreamLog& log = *net->jetstream();
  WsClient client(net->port());
  ASSERT_TRUE(client.Connect("/subscribe?cursor=1")) << client.error().message();
  const Stream s = ReadUntil(client, 1, log.size());
  ASSERT_EQ(s.end, WsClient::End::kMessage);
  EXPECT_EQ(Seqs(s.frames), Range(1, log.size()));
  ExpectFramesMatchLog(log, s.frames);
  for (size_t i = 0; i < s.texts.size(); ++i) {
    ASSERT_TRUE(s.texts[i].starts_with("{\"did\":\"did:")) << s.texts[i];
    Result<std::string> want = log.FrameV1(s.frames[i].seq);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(s.texts[i], *want);
  }
  Table table;
  for (const JetstreamFrame& f : s.frames) table.Apply(f);
  Result<JetstreamTruth> truth = net->JetstreamGroundTruth();
  ASSERT_TRUE(truth.ok());
  ExpectTableIsTruth(table, *truth);
  // The truth through a seq is the fold of the stream up to it.
  Table half;
  for (const JetstreamFrame& f : s.frames) {
    if (f.seq <= 1234) half.Apply(f);
  }
  Result<JetstreamTruth> truth_half = net->JetstreamGroundTruth(1234);
  ASSERT_TRUE(truth_half.ok());
  EXPECT_EQ(truth_half->through_seq, 1234u);
  ExpectTableIsTruth(half, *truth_half);
  EXPECT_NE(truth_half->records.size(), truth->records.size());
}

TEST(SimnetJetstreamTest, CursorReplayIsInclusive) {
  auto net = StartOrDie(Options(2000));
  ASSERT_NE(net, nullptr);
  const JetstreamLog& log = *net->jetstream();
  const uint64_t n = log.size();
  for (int version : {1, 2}) {
    const std::string path =
        version == 1 ? "/subscribe" : "/xrpc/network.bsky.jetstream.subscribeEvents";
    SCOPED_TRACE("v" + std::to_string(version));
    {
      WsClient client(net->port());
      ASSERT_TRUE(client.Connect(path + "?cursor=1000"));
      const Stream s = ReadUntil(client, version, n);
      EXPECT_EQ(Seqs(s.frames), Range(1000, n));
    }
    // Timestamp cursors: the first event witnessed at or after the time.
    for (int64_t delta : {0, -1}) {
      WsClient client(net->port());
      ASSERT_TRUE(client.Connect(path + "?cursor=" + std::to_string(log.TimeUs(777) + delta)));
      const Stream s = ReadUntil(client, version, n);
      EXPECT_EQ(Seqs(s.frames), Range(777, n));
      EXPECT_TRUE(s.others.empty());
    }
    // No cursor, or one past the tip: live, and nothing is published after Start at rate 0.
    for (const std::string& query : std::vector<std::string>{
             "", "?cursor=2001", "?cursor=" + std::to_string(log.TimeUs(n) + 1)}) {
      WsClient client(net->port());
      ASSERT_TRUE(client.Connect(path + query));
      Message m;
      EXPECT_EQ(client.Read(&m, 300ms), WsClient::End::kTimeout) << query;
    }
  }
}

TEST(SimnetJetstreamTest, FiltersSelectExactlyTheMatchingEvents) {
  auto net = StartOrDie(Options(3000));
  ASSERT_NE(net, nullptr);
  const JetstreamLog& log = *net->jetstream();
  const uint64_t n = log.size();
  const std::string a = net->network().accounts()[3].did;
  const std::string b = net->network().accounts()[17].did;
  struct Case {
    int version;
    std::string query;
    std::function<bool(uint64_t)> want;
  };
  const auto did_in = [&](uint64_t seq) { return log.Did(seq) == a || log.Did(seq) == b; };
  const std::vector<Case> cases = {
      {2, "dids=" + a + "&dids=" + b, did_in},
      {2, "dids=" + a + "&dids=" + b + "&collections=app.bsky.feed.post",
       [&](uint64_t seq) {
         return did_in(seq) && (!log.IsCommit(seq) || log.Collection(seq) == "app.bsky.feed.post");
       }},
      {2, "kinds=identity&kinds=account", [&](uint64_t seq) { return !log.IsCommit(seq); }},
      {2, "kinds=commit&collections=app.bsky.graph.*",
       [&](uint64_t seq) {
         return log.IsCommit(seq) && log.Collection(seq).starts_with("app.bsky.graph.");
       }},
      {1, "wantedCollections=app.bsky.feed.*&wantedCollections=com.example.simnet.note",
       [&](uint64_t seq) {
         return !log.IsCommit(seq) || log.Collection(seq).starts_with("app.bsky.feed.") ||
                log.Collection(seq) == "com.example.simnet.note";
       }},
      {1, "wantedDids=" + a + "&wantedCollections=app.bsky.feed.like",
       [&](uint64_t seq) {
         return log.Did(seq) == a &&
                (!log.IsCommit(seq) || log.Collection(seq) == "app.bsky.feed.like");
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.query);
    std::vector<uint64_t> want;
    for (uint64_t seq = 1; seq <= n; ++seq) {
      if (c.want(seq)) want.push_back(seq);
    }
    ASSERT_GT(want.size(), 5u);
    ASSERT_LT(want.size(), n);
    WsClient client(net->port());
    const std::string path = c.version == 1 ? "/subscribe?cursor=1&"
                                            : "/xrpc/network.bsky.jetstream.subscribeEvents?"
                                              "cursor=1&";
    ASSERT_TRUE(client.Connect(path + c.query));
    const Stream s = ReadUntil(client, c.version, want.back());
    EXPECT_EQ(Seqs(s.frames), want);
    ExpectFramesMatchLog(log, s.frames);
  }
  // A DID-filtered stream folds to the truth of those DIDs.
  WsClient client(net->port());
  ASSERT_TRUE(client.Connect("/xrpc/network.bsky.jetstream.subscribeEvents?cursor=1&dids=" + a +
                             "&dids=" + b));
  uint64_t last = 0;
  for (uint64_t seq = 1; seq <= n; ++seq) {
    if (did_in(seq)) last = seq;
  }
  const Stream s = ReadUntil(client, 2, last);
  Table table;
  for (const JetstreamFrame& f : s.frames) table.Apply(f);
  Result<JetstreamTruth> truth = net->JetstreamGroundTruth();
  ASSERT_TRUE(truth.ok());
  ExpectTableIsTruth(table, *truth, [&](const std::string& did) { return did == a || did == b; });
}

TEST(SimnetJetstreamTest, MaxMessageSizeSkipsLargerFrames) {
  auto net = StartOrDie(Options(1500));
  ASSERT_NE(net, nullptr);
  const JetstreamLog& log = *net->jetstream();
  for (int version : {1, 2}) {
    std::vector<uint64_t> want;
    for (uint64_t seq = 1; seq <= log.size(); ++seq) {
      Result<std::string> f = version == 1 ? log.FrameV1(seq) : log.FrameV2(seq);
      ASSERT_TRUE(f.ok());
      if (f->size() <= 420) want.push_back(seq);
    }
    ASSERT_GT(want.size(), 100u);
    ASSERT_LT(want.size(), log.size() - 100);
    WsClient client(net->port());
    ASSERT_TRUE(
        client.Connect(std::string(version == 1 ? "/subscribe"
                                                : "/xrpc/"
                                                  "network.bsky.jetstream.subscribeEvents") +
                       "?cursor=1&maxMessageSizeBytes=420"));
    const Stream s = ReadUntil(client, version, want.back());
    EXPECT_EQ(Seqs(s.frames), want) << "v" << version;
    for (const std::string& t : s.texts) EXPECT_LE(t.size(), 420u);
  }
  // v1 reads a malformed size as "no cap".
  WsClient client(net->port());
  ASSERT_TRUE(client.Connect("/subscribe?cursor=1&maxMessageSizeBytes=lots"));
  EXPECT_EQ(Seqs(ReadUntil(client, 1, log.size()).frames), Range(1, log.size()));
}

TEST(SimnetJetstreamTest, CompressionWithTheServedDictionaryRoundTrips) {
  auto net = StartOrDie(Options(2000));
  ASSERT_NE(net, nullptr);
  const JetstreamLog& log = *net->jetstream();
  const uint64_t n = log.size();

  // v2: getZstdDictionary, then zstdDictionary=<its id>.
  const HttpResult got =
      HttpCall(net->port(), http::verb::get, "/xrpc/network.bsky.jetstream.getZstdDictionary");
  ASSERT_EQ(got.status, 200);
  EXPECT_EQ(got.content_type, "application/octet-stream");
  EXPECT_EQ(got.body, std::string(AsChars(net->jetstream_dictionary(2))));
  Result<std::shared_ptr<const sources::ZstdDictionary>> dict2 =
      sources::ZstdDictionary::Load(AsBytes(got.body));
  ASSERT_TRUE(dict2.ok()) << dict2.status().ToString();
  EXPECT_EQ((*dict2)->id(), 0x53494D32u);
  Result<sources::ZstdFrameDecoder> decoder2 = sources::ZstdFrameDecoder::Create(*dict2);
  ASSERT_TRUE(decoder2.ok());
  {
    WsClient client(net->port());
    ASSERT_TRUE(
        client.Connect("/xrpc/network.bsky.jetstream.subscribeEvents?cursor=1&"
                       "zstdDictionary=" +
                       std::to_string((*dict2)->id())));
    const Stream s = ReadUntil(client, 2, n, &*decoder2);
    EXPECT_EQ(Seqs(s.frames), Range(1, n));
    EXPECT_EQ(s.binary, n);
    EXPECT_EQ(s.text, 0u);
    size_t plain = 0;
    for (size_t i = 0; i < s.texts.size(); ++i) {
      Result<std::string> want = log.FrameV2(s.frames[i].seq);
      ASSERT_TRUE(want.ok());
      EXPECT_EQ(s.texts[i], *want);
      plain += want->size();
    }
    // The trained dictionary earns its keep on these small frames.
    EXPECT_LT(s.wire_bytes * 2, plain) << s.wire_bytes << " of " << plain;
  }
  // Frames name the dictionary: a decoder without it refuses them.
  {
    WsClient client(net->port());
    ASSERT_TRUE(client.Connect(
        "/xrpc/network.bsky.jetstream.subscribeEvents?cursor=1&zstdDictionary=1397312818"));
    Message m;
    ASSERT_EQ(client.Read(&m), WsClient::End::kMessage);
    Result<sources::ZstdFrameDecoder> bare = sources::ZstdFrameDecoder::Create(nullptr);
    ASSERT_TRUE(bare.ok());
    std::string out, kind;
    EXPECT_FALSE(bare->Decompress(AsBytes(m.data), &out, &kind).ok());
    EXPECT_EQ(kind, "wrong_dictionary");
  }
  // An unknown ID is refused before the upgrade, naming the current one.
  {
    WsClient client(net->port());
    EXPECT_FALSE(
        client.Connect("/xrpc/network.bsky.jetstream.subscribeEvents?zstdDictionary=20260811"));
    EXPECT_EQ(client.refused_status(), 400);
    EXPECT_NE(client.response().body().find("\"error\":\"UnknownZstdDictionary\""),
              std::string::npos)
        << client.response().body();
    EXPECT_NE(client.response().body().find("1397312818"), std::string::npos);
  }

  // v1: compress=true (or Socket-Encoding: zstd) with the v1 dictionary.
  const HttpResult v1dict =
      HttpCall(net->port(), http::verb::get, "/simnet/legacy_subscribe.zdict");
  ASSERT_EQ(v1dict.status, 200);
  EXPECT_EQ(v1dict.body, std::string(AsChars(net->jetstream_dictionary(1))));
  Result<std::shared_ptr<const sources::ZstdDictionary>> dict1 =
      sources::ZstdDictionary::Load(AsBytes(v1dict.body));
  ASSERT_TRUE(dict1.ok());
  EXPECT_EQ((*dict1)->id(), 0x53494D31u);
  Result<sources::ZstdFrameDecoder> decoder1 = sources::ZstdFrameDecoder::Create(*dict1);
  ASSERT_TRUE(decoder1.ok());
  for (const bool header : {false, true}) {
    WsClient client(net->port());
    ASSERT_TRUE(header ? client.Connect("/subscribe?cursor=1", {{"Socket-Encoding", "zstd"}})
                       : client.Connect("/subscribe?cursor=1&compress=true"));
    const Stream s = ReadUntil(client, 1, n, &*decoder1);
    EXPECT_EQ(Seqs(s.frames), Range(1, n));
    EXPECT_EQ(s.binary, n);
    for (size_t i = 0; i < s.texts.size(); ++i) {
      Result<std::string> want = log.FrameV1(s.frames[i].seq);
      ASSERT_TRUE(want.ok());
      EXPECT_EQ(s.texts[i], *want);
    }
  }
}

TEST(SimnetJetstreamTest, RetentionFloorRejectsOnV2AndClampsOnV1) {
  SimnetOptions o = Options(2000);
  o.jetstream.retention_events = 500;  // floor: seq 1501
  auto net = StartOrDie(o);
  ASSERT_NE(net, nullptr);
  const JetstreamLog& log = *net->jetstream();
  const std::string v2 = "/xrpc/network.bsky.jetstream.subscribeEvents";
  for (const char* cursor : {"10", "0", "1500"}) {
    WsClient client(net->port());
    EXPECT_FALSE(client.Connect(v2 + "?cursor=" + cursor));
    EXPECT_EQ(client.refused_status(), 400);
    const std::string& body = client.response().body();
    EXPECT_NE(body.find("\"error\":\"CursorTooOld\""), std::string::npos) << body;
    EXPECT_NE(body.find("below lookback floor 1501"), std::string::npos) << body;
  }
  {
    WsClient client(net->port());
    ASSERT_TRUE(client.Connect(v2 + "?cursor=1501"));
    EXPECT_EQ(Seqs(ReadUntil(client, 2, 2000).frames), Range(1501, 2000));
  }
  // A timestamp below the floor is clamped, announced by #info OutdatedCursor first.
  {
    WsClient client(net->port());
    ASSERT_TRUE(client.Connect(v2 + "?cursor=" + std::to_string(log.TimeUs(10))));
    Message m;
    ASSERT_EQ(client.Read(&m), WsClient::End::kMessage);
    JetstreamFrame info;
    std::string text;
    ASSERT_TRUE(Decode(2, m, nullptr, &info, &text).ok()) << text;
    ASSERT_EQ(info.kind(), FrameKind::kInfo) << text;
    EXPECT_EQ(std::get<sources::StreamInfo>(info.payload).name, "OutdatedCursor");
    EXPECT_NE(std::get<sources::StreamInfo>(info.payload).message.find("1501"), std::string::npos);
    EXPECT_EQ(Seqs(ReadUntil(client, 2, 2000).frames), Range(1501, 2000));
  }
  // v1 clamps silently, for seq and timestamp cursors.
  for (const std::string& cursor : std::vector<std::string>{"10", std::to_string(log.TimeUs(10))}) {
    WsClient client(net->port());
    ASSERT_TRUE(client.Connect("/subscribe?cursor=" + cursor));
    const Stream s = ReadUntil(client, 1, 2000);
    EXPECT_TRUE(s.others.empty());
    EXPECT_EQ(Seqs(s.frames), Range(1501, 2000)) << cursor;
  }
}

// Reconnects from the last seq after every cut until seq `n`; returns the deduplicated frames.
std::vector<JetstreamFrame> ReadWithReconnects(Simnet& net, int version, uint64_t n,
                                               int* connections) {
  std::vector<JetstreamFrame> frames;
  uint64_t last = 0;
  *connections = 0;
  while (last < n && *connections < 200) {
    ++*connections;
    WsClient client(net.port());
    const std::string path =
        version == 1 ? "/subscribe" : "/xrpc/network.bsky.jetstream.subscribeEvents";
    EXPECT_TRUE(client.Connect(path + "?cursor=" + std::to_string(std::max<uint64_t>(last, 1))));
    Stream s = ReadUntil(client, version, n);
    // Inclusive replay: the first frame repeats the last seq seen.
    if (last > 0) {
      EXPECT_FALSE(s.frames.empty());
      if (!s.frames.empty()) {
        EXPECT_EQ(s.frames.front().seq, last);
      }
    }
    for (JetstreamFrame& f : s.frames) {
      if (f.seq <= last) continue;
      last = f.seq;
      frames.push_back(std::move(f));
    }
    if (last < n) {
      // Cut without a close frame.
      EXPECT_EQ(s.end, WsClient::End::kDropped);
    }
  }
  return frames;
}

TEST(SimnetJetstreamTest, DisconnectFaultsAndResumeFromTheLastSeqLoseNothing) {
  for (int version : {2, 1}) {
    SCOPED_TRACE("v" + std::to_string(version));
    SimnetOptions o = Options(1500);
    if (version == 2) {
      o.jetstream.disconnect_after_frames = 200;
    } else {
      o.jetstream.disconnect_probability = 0.01;
    }
    auto net = StartOrDie(o);
    ASSERT_NE(net, nullptr);
    int connections = 0;
    const std::vector<JetstreamFrame> frames =
        ReadWithReconnects(*net, version, 1500, &connections);
    EXPECT_EQ(Seqs(frames), Range(1, 1500));
    if (version == 2) {
      // 200 frames a connection, one of them a repeat: 1500 events need 8 connections.
      EXPECT_EQ(connections, 8);
    } else {
      EXPECT_GE(connections, 5);
    }
    EXPECT_EQ(net->stats().jetstream_disconnects, static_cast<uint64_t>(connections - 1));
    Table table;
    for (const JetstreamFrame& f : frames) table.Apply(f);
    Result<JetstreamTruth> truth = net->JetstreamGroundTruth();
    ASSERT_TRUE(truth.ok());
    ExpectTableIsTruth(table, *truth);
  }
}

TEST(SimnetJetstreamTest, SubprotocolIsEchoedOnlyWhenOfferedExactly) {
  auto net = StartOrDie(Options(100));
  ASSERT_NE(net, nullptr);
  const std::string v2 = "/xrpc/network.bsky.jetstream.subscribeEvents?cursor=1";
  struct Case {
    std::string offer;
    std::string echoed;
  };
  for (const Case& c : std::vector<Case>{{"xrpc.v1.json", "xrpc.v1.json"},
                                         {"chat, xrpc.v1.json", "xrpc.v1.json"},
                                         {"XRPC.v1.json", ""},
                                         {"xrpc.v1", ""},
                                         {"", ""}}) {
    WsClient client(net->port());
    std::vector<std::pair<std::string, std::string>> headers;
    if (!c.offer.empty()) headers.emplace_back("Sec-WebSocket-Protocol", c.offer);
    ASSERT_TRUE(client.Connect(v2, headers)) << c.offer;
    const auto& res = client.response();
    EXPECT_EQ(std::string(res[http::field::sec_websocket_protocol]), c.echoed) << c.offer;
    // Framing is the same either way.
    EXPECT_EQ(Seqs(ReadUntil(client, 2, 100).frames), Range(1, 100));
  }
  // v2 is server-push only: a client message closes the connection with 1008.
  WsClient client(net->port());
  ASSERT_TRUE(client.Connect(v2));
  EXPECT_EQ(ReadUntil(client, 2, 100).frames.size(), 100u);
  ASSERT_TRUE(client.SendText("{\"type\":\"options_update\",\"payload\":{}}"));
  Message m;
  EXPECT_EQ(client.Read(&m), WsClient::End::kClosed);
  EXPECT_EQ(client.close_code(), 1008);
  // v1 ignores client messages.
  WsClient v1(net->port());
  ASSERT_TRUE(v1.Connect("/subscribe?cursor=1"));
  ASSERT_TRUE(v1.SendText("{\"type\":\"heartbeat\"}"));
  EXPECT_EQ(Seqs(ReadUntil(v1, 1, 100).frames), Range(1, 100));
}

TEST(SimnetJetstreamTest, DeflateIsNegotiatedOnV1Only) {
  auto net = StartOrDie(Options(300));
  ASSERT_NE(net, nullptr);
  for (int version : {1, 2}) {
    WsClient client(net->port());
    client.OfferDeflate();
    ASSERT_TRUE(client.Connect(version == 1
                                   ? "/subscribe?cursor=1"
                                   : "/xrpc/network.bsky.jetstream.subscribeEvents?cursor=1"));
    const std::string extensions(client.response()[http::field::sec_websocket_extensions]);
    if (version == 1) {
      EXPECT_NE(extensions.find("permessage-deflate"), std::string::npos) << extensions;
    } else {
      EXPECT_EQ(extensions, "");
    }
    EXPECT_EQ(Seqs(ReadUntil(client, version, 300).frames), Range(1, 300)) << "v" << version;
  }
}

TEST(SimnetJetstreamTest, InvalidRequestsAreRefusedBeforeTheUpgrade) {
  auto net = StartOrDie(Options(100));
  ASSERT_NE(net, nullptr);
  const std::string v2 = "/xrpc/network.bsky.jetstream.subscribeEvents?";
  const std::string did = net->network().accounts()[0].did;
  struct Case {
    std::string target;
    std::vector<std::pair<std::string, std::string>> headers;
    std::string error;  // v2: the XRPC error name; v1: "" (plain text)
  };
  const std::vector<Case> cases = {
      {v2 + "wantedDids=" + did, {}, "InvalidRequest"},
      {v2 + "wantedCollections=app.bsky.feed.post", {}, "InvalidRequest"},
      {v2 + "requireHello=true", {}, "InvalidRequest"},
      {v2 + "compress=true", {}, "InvalidRequest"},
      {v2, {{"Socket-Encoding", "zstd"}}, "InvalidRequest"},
      {v2 + "kinds=commit&kinds=bogus", {}, "InvalidRequest"},
      {v2 + "kinds=commit&kinds=identity&kinds=account&kinds=sync&kinds=commit",
       {},
       "InvalidRequest"},
      {v2 + "kinds=identity&collections=app.bsky.feed.post", {}, "InvalidRequest"},
      {v2 + "collections=app.bsky.fo*", {}, "InvalidRequest"},
      {v2 + "collections=*", {}, "InvalidRequest"},
      {v2 + "dids=did:nope", {}, "InvalidRequest"},
      {v2 + "cursor=-5", {}, "InvalidRequest"},
      {v2 + "cursor=abc", {}, "InvalidRequest"},
      {v2 + "maxMessageSizeBytes=1&maxMessageSizeBytes=2", {}, "InvalidRequest"},
      {v2 + "maxMessageSizeBytes=4294967296", {}, "InvalidRequest"},
      {v2 + "zstdDictionary=0", {}, "InvalidRequest"},
      {"/subscribe?wantedCollections=app.bsky.fo*", {}, ""},
      {"/subscribe?wantedDids=nope", {}, ""},
      {"/subscribe?cursor=-1", {}, ""},
      {"/subscribe?compress=true", {{"Sec-WebSocket-Extensions", "permessage-deflate"}}, ""},
  };
  for (const Case& c : cases) {
    WsClient client(net->port());
    EXPECT_FALSE(client.Connect(c.target, c.headers)) << c.target;
    EXPECT_EQ(client.refused_status(), 400) << c.target;
    const auto& res = client.response();
    if (c.error.empty()) {
      EXPECT_EQ(std::string(res[http::field::content_type]), "text/plain; charset=utf-8");
    } else {
      EXPECT_EQ(std::string(res[http::field::content_type]), "application/json");
      EXPECT_NE(res.body().find("\"error\":\"" + c.error + "\""), std::string::npos)
          << c.target << ": " << res.body();
    }
  }
  // Valid edge cases are accepted: 4 kinds, a wildcard whose head is an NSID prefix.
  for (const std::string& ok : std::vector<std::string>{
           v2 + "kinds=commit&kinds=identity&kinds=account&kinds=sync",
           v2 + "collections=app.bsky.*", "/subscribe?wantedCollections=x.*"}) {
    WsClient client(net->port());
    EXPECT_TRUE(client.Connect(ok)) << ok << ": " << client.response().body();
  }
  EXPECT_EQ(
      HttpCall(net->port(), http::verb::post, "/xrpc/network.bsky.jetstream.getZstdDictionary")
          .status,
      405);
  EXPECT_EQ(HttpCall(net->port(), http::verb::get, "/xrpc/com.atproto.sync.getRepo").status, 501);
  const HttpResult plain = HttpCall(net->port(), http::verb::get, v2 + "cursor=1");
  EXPECT_EQ(plain.status, 400);
  EXPECT_NE(plain.body.find("InvalidRequest"), std::string::npos);
  // Without SimnetOptions::jetstream.events there is no such host.
  SimnetOptions off = Options(0);
  auto quiet = StartOrDie(off);
  ASSERT_NE(quiet, nullptr);
  EXPECT_EQ(quiet->jetstream(), nullptr);
  EXPECT_EQ(quiet->jetstream_url(), "");
  EXPECT_EQ(HttpCall(quiet->port(), http::verb::get, "/subscribe").status, 404);
}

TEST(SimnetJetstreamTest, PublicationScheduleWithBursts) {
  SimnetOptions o = Options(100);
  o.jetstream.events_per_second = 1000;
  o.jetstream.burst_every = 4;
  o.jetstream.burst_size = 10;
  Result<std::unique_ptr<Network>> net = Network::Generate(o, 1);
  ASSERT_TRUE(net.ok());
  Result<std::unique_ptr<JetstreamLog>> log = JetstreamLog::Generate(**net, o.jetstream);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  const JetstreamLog& l = **log;
  EXPECT_EQ(l.published_at_start(), 0u);
  // Slots every 1 ms: seqs 1-4 in slots 0-3, the burst 5-14 in slot 4, 15-18 in 5-8, ...
  EXPECT_EQ(l.PublishedAt(0ms), 1u);
  EXPECT_EQ(l.PublishedAt(3500us), 4u);
  EXPECT_EQ(l.PublishedAt(4ms), 14u);
  EXPECT_EQ(l.PublishedAt(5ms), 15u);
  EXPECT_EQ(l.PublishedAt(9ms), 28u);
  EXPECT_EQ(l.PublishedAt(1h), 100u);
  for (uint64_t seq = 1; seq <= 100; ++seq) {
    EXPECT_GE(l.PublishedAt(l.PublishTime(seq)), seq) << seq;
    EXPECT_LT(l.PublishedAt(l.PublishTime(seq) - 2ns), seq) << seq;
  }
  EXPECT_EQ(l.PublishTime(5), l.PublishTime(14));
  EXPECT_LT(l.PublishTime(14), l.PublishTime(15));
  // Validation: bursts need a rate; a rate of 0 publishes everything at Start.
  SimnetOptions bad = Options(100);
  bad.jetstream.burst_every = 2;
  bad.jetstream.burst_size = 2;
  EXPECT_FALSE(bad.Validate().ok());
  bad = Options(100);
  bad.jetstream.published_at_start = 10;
  EXPECT_FALSE(bad.Validate().ok());
}

TEST(SimnetJetstreamTest, LiveStreamFollowsTheRateAndBursts) {
  SimnetOptions o = Options(1500);
  o.jetstream.events_per_second = 500;
  o.jetstream.published_at_start = 100;
  o.jetstream.burst_every = 100;
  o.jetstream.burst_size = 400;
  const auto t0 = std::chrono::steady_clock::now();
  auto net = StartOrDie(o);
  ASSERT_NE(net, nullptr);
  const JetstreamLog& log = *net->jetstream();
  // Without a cursor: from the tip at connection time, at least past what Start published.
  WsClient live(net->port());
  ASSERT_TRUE(live.Connect("/xrpc/network.bsky.jetstream.subscribeEvents"));
  WsClient replay(net->port());
  ASSERT_TRUE(replay.Connect("/subscribe?cursor=1"));
  const Stream l = ReadUntil(live, 2, 1500);
  ASSERT_FALSE(l.frames.empty());
  EXPECT_GT(l.frames.front().seq, 100u);
  EXPECT_EQ(Seqs(l.frames), Range(l.frames.front().seq, 1500));
  // The last event cannot arrive before its publication time.
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(elapsed, log.PublishTime(1500));
  const Stream r = ReadUntil(replay, 1, 1500);
  EXPECT_EQ(Seqs(r.frames), Range(1, 1500));
  Table table;
  for (const JetstreamFrame& f : r.frames) table.Apply(f);
  Result<JetstreamTruth> truth = net->JetstreamGroundTruth();
  ASSERT_TRUE(truth.ok());
  ExpectTableIsTruth(table, *truth);
}

// Waits (bounded) until the server has dropped `count` slow consumers.
bool WaitForSlowDrops(const Simnet& net, uint64_t count) {
  return testing::WaitUntil([&] { return net.stats().jetstream_slow_drops >= count; }, 10s);
}

TEST(SimnetJetstreamTest, SlowConsumersAreDropped) {
  SimnetOptions o = Options(400'000);
  o.jetstream.events_per_second = 20'000;
  o.jetstream.published_at_start = 0;
  o.jetstream.max_send_queue = 100;
  o.jetstream.send_buffer_bytes = 4096;
  o.jetstream.slow_drop_grace_ms = 20'000;
  auto net = StartOrDie(o);
  ASSERT_NE(net, nullptr);
  // v2: the client stops reading; the server gives up with ConsumerTooSlow once it drains.
  {
    WsClient client(net->port());
    ASSERT_TRUE(client.Connect("/xrpc/network.bsky.jetstream.subscribeEvents", {}, 4096));
    Message m;
    ASSERT_EQ(client.Read(&m), WsClient::End::kMessage);
    ASSERT_TRUE(WaitForSlowDrops(*net, 1));
    const Stream s = ReadUntil(client, 2, UINT64_MAX);
    ASSERT_EQ(s.others.size(), 1u);
    ASSERT_EQ(s.others[0].kind(), FrameKind::kError);
    EXPECT_EQ(std::get<sources::StreamError>(s.others[0].payload).name, "ConsumerTooSlow");
    EXPECT_LT(s.frames.size(), 100'000u);
    EXPECT_NE(client.Read(&m), WsClient::End::kMessage);
  }
  // v1: dropped without a frame.
  {
    WsClient client(net->port());
    ASSERT_TRUE(client.Connect("/subscribe", {}, 4096));
    Message m;
    ASSERT_EQ(client.Read(&m), WsClient::End::kMessage);
    ASSERT_TRUE(WaitForSlowDrops(*net, 2));
    const Stream s = ReadUntil(client, 1, UINT64_MAX);
    EXPECT_TRUE(s.others.empty());
    EXPECT_EQ(s.end, WsClient::End::kDropped);
  }
}

}  // namespace
}  // namespace atfill::simnet
