#include "tools/simnet/firehose_relay.hpp"

#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "atproto/json.hpp"
#include "atproto/repo.hpp"
#include "atproto/tid.hpp"
#include "base/low_port.hpp"
#include "sources/firehose/firehose_frames.hpp"

namespace atfill::simnet {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

namespace {

Result<Bytes> Cbor(const std::string& json) {
  Bytes out;
  ATFILL_RETURN_IF_ERROR(atproto::JsonToCbor(json, &out));
  return out;
}

// One account's commits: each a list of writes.
std::vector<std::vector<sources::RepoWrite>> PlanCommits(
    const std::vector<std::pair<std::string, Bytes>>& served,
    const std::vector<std::pair<std::string, Bytes>>& ephemeral, const Bytes& temporary,
    uint32_t per_commit) {
  using sources::FirehoseAction;
  std::vector<std::vector<sources::RepoWrite>> commits;
  std::vector<sources::RepoWrite> first;
  for (const auto& [path, record] : ephemeral) {
    first.push_back({FirehoseAction::kCreate, path, record});
  }
  size_t i = 0;
  auto batch = [&](std::vector<sources::RepoWrite>& into) {
    for (uint32_t n = 0; n < per_commit && i < served.size(); ++n, ++i) {
      // The first served record is written with another value first, then updated.
      into.push_back(
          {FirehoseAction::kCreate, served[i].first, i == 0 ? temporary : served[i].second});
    }
  };
  batch(first);
  commits.push_back(std::move(first));
  while (i < served.size()) {
    std::vector<sources::RepoWrite> next;
    batch(next);
    commits.push_back(std::move(next));
  }
  if (!served.empty()) {
    commits.push_back({{FirehoseAction::kUpdate, served[0].first, served[0].second}});
  }
  std::vector<sources::RepoWrite> last;
  for (const auto& [path, record] : ephemeral) {
    last.push_back({FirehoseAction::kDelete, path, {}});
  }
  if (!last.empty()) commits.push_back(std::move(last));
  return commits;
}

}  // namespace

Result<FirehoseLog> BuildFirehoseLog(const Network& net, const FirehoseLogOptions& options) {
  using sources::FirehoseFrame;
  std::mt19937_64 rng(options.seed);
  std::uniform_real_distribution<double> unit(0, 1);
  const std::string collection = net.options().collections.front();
  // Per account, its commits as built (frames not yet numbered) and what happens to each.
  struct Planned {
    std::string did;
    std::vector<sources::FirehoseCommit> commits;
    std::vector<uint8_t> fate;  // 0 kept, 1 dropped, 2 bad signature, 3 tampered
    std::optional<sources::FirehoseSync> sync;
  };
  std::vector<Planned> planned;
  FirehoseLog log;
  ATFILL_ASSIGN_OR_RETURN(atproto::PrivateKey other,
                          atproto::PrivateKey::Generate(atproto::KeyType::kSecp256k1));
  for (const Account& a : net.accounts()) {
    if (a.status != AccountStatus::kActive || a.bad_signature || a.private_endpoint ||
        a.bad_scheme) {
      continue;
    }
    ATFILL_ASSIGN_OR_RETURN(auto generated, net.Records(a));
    std::vector<std::pair<std::string, Bytes>> served;
    for (const GeneratedRecord& r : generated) {
      ATFILL_ASSIGN_OR_RETURN(Bytes cbor, Cbor(r.json));
      served.emplace_back(r.collection + "/" + r.rkey, std::move(cbor));
    }
    std::vector<std::pair<std::string, Bytes>> ephemeral;
    for (uint32_t k = 0; k < options.ephemeral_records; ++k) {
      ATFILL_ASSIGN_OR_RETURN(
          Bytes cbor, Cbor("{\"$type\":\"" + collection + "\",\"text\":\"ephemeral " +
                           std::to_string(k) + "\",\"createdAt\":\"2024-01-01T00:00:00.000Z\"}"));
      ephemeral.emplace_back(collection + "/ephemeral-" + std::to_string(k), std::move(cbor));
    }
    ATFILL_ASSIGN_OR_RETURN(Bytes temporary, Cbor("{\"$type\":\"" + collection +
                                                  "\",\"text\":\"before the update\",\"createdAt\":"
                                                  "\"2024-01-01T00:00:00.000Z\"}"));
    const auto plan = PlanCommits(served, ephemeral, temporary, options.records_per_commit);
    ATFILL_ASSIGN_OR_RETURN(atproto::Tid head, atproto::Tid::Parse(a.rev));
    ATFILL_ASSIGN_OR_RETURN(atproto::PrivateKey key, net.CommitKey(a));
    Planned p;
    p.did = a.did;
    std::map<std::string, Bytes> records;
    std::string since;
    bool broken = false;
    for (size_t k = 0; k < plan.size(); ++k) {
      // Below the served rev, in order.
      ATFILL_ASSIGN_OR_RETURN(
          atproto::Tid rev,
          atproto::Tid::FromParts(head.timestamp_us() - (plan.size() - k), a.index % 1024));
      uint8_t fate = 0;
      const bool last = k + 1 == plan.size();
      const double draw = unit(rng);
      // An account's first commit is trusted as the start of its chain (nothing before it to
      // link to), so faults hit later ones only.
      if (k == 0) {
      } else if (!last && draw < options.drop_share) {
        fate = 1;
      } else if (draw < options.drop_share + options.bad_signature_share) {
        fate = 2;
      } else if (draw < options.drop_share + options.bad_signature_share + options.tampered_share) {
        fate = 3;
      }
      // A refused last commit leaves nothing after it to show the break: a #sync follows.
      const atproto::PrivateKey& signer = fate == 2 ? other : key;
      ATFILL_ASSIGN_OR_RETURN(
          sources::FirehoseCommit c,
          sources::BuildFirehoseCommit(a.did, rev.str(), since, &records, plan[k], signer, 0));
      if (fate == 3) {
        // The last block of the CAR is a record's (BuildFirehoseCommit writes them last);
        // without a record (a delete-only commit) the flip lands in an MST node: refused too.
        c.blocks.back() ^= 0x01;
      }
      since = rev.str();
      broken = broken || fate != 0;
      p.commits.push_back(std::move(c));
      p.fate.push_back(fate);
    }
    const bool refused_last = !p.fate.empty() && p.fate.back() >= 2;
    if (unit(rng) < options.sync_share || refused_last) {
      // The served commit, as getRepo signs it.
      atproto::RepoWriter writer;
      for (const GeneratedRecord& r : generated) {
        ATFILL_RETURN_IF_ERROR(writer.PutJson(r.collection, r.rkey, r.json).status());
      }
      ATFILL_ASSIGN_OR_RETURN(atproto::WrittenRepo written, writer.Write(a.did, a.rev, key));
      sources::FirehoseSync s;
      s.did = a.did;
      s.rev = a.rev;
      s.blocks = std::move(written.car);
      s.time = "2024-01-01T00:00:01.000Z";
      p.sync = std::move(s);
      broken = true;
    }
    if (broken) log.broken_dids.push_back(a.did);
    planned.push_back(std::move(p));
  }
  // Interleave the accounts: one commit of each in turn, then their #syncs.
  int64_t seq = 0;
  for (size_t round = 0;; ++round) {
    bool any = false;
    for (Planned& p : planned) {
      if (round >= p.commits.size()) continue;
      any = true;
      const uint8_t fate = p.fate[round];
      if (fate == 1) {
        ++log.dropped;
        continue;
      }
      sources::FirehoseCommit& c = p.commits[round];
      c.seq = ++seq;
      log.commits++;
      if (fate == 2) ++log.bad_signatures;
      if (fate == 3) ++log.tampered;
      log.frames.push_back({c.seq, p.did, sources::EncodeFirehoseFrame(FirehoseFrame{c})});
    }
    if (!any) break;
  }
  for (Planned& p : planned) {
    if (!p.sync) continue;
    p.sync->seq = ++seq;
    ++log.syncs;
    log.frames.push_back(
        {p.sync->seq, p.did, sources::EncodeFirehoseFrame(FirehoseFrame{*p.sync})});
  }
  return log;
}

struct FirehoseRelay::Impl {
  std::vector<FirehoseLogFrame> frames;
  FirehoseRelayOptions options;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  uint16_t port = 0;
  std::thread accept_thread;
  std::mutex mu;
  std::vector<std::shared_ptr<tcp::socket>> sockets;
  // A duplicate of each session's descriptor, taken before the session starts: shutting it down
  // wakes the session's blocking read without touching its socket object, which the session's
  // own thread may be closing (Beast's teardown on a close frame) at the same moment.
  std::vector<int> wake_fds;
  std::vector<std::thread> sessions;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> connections{0}, frames_sent{0};

  void Serve(std::shared_ptr<tcp::socket> socket) {
    // Named as simnet's io threads are, so benchmarks tell its CPU from the consumer's.
    pthread_setname_np(pthread_self(), "simnet-io");
    try {
      beast::flat_buffer buffer;
      http::request<http::string_body> req;
      http::read(*socket, buffer, req);
      std::string target(req.target());
      int64_t cursor = -1;
      if (auto q = target.find("cursor="); q != std::string::npos) {
        cursor = std::strtoll(target.c_str() + q + 7, nullptr, 10);
      }
      websocket::stream<tcp::socket&> ws(*socket);
      ws.binary(true);
      ws.accept(req);
      connections.fetch_add(1);
      uint64_t written = 0;
      const auto start = std::chrono::steady_clock::now();
      for (const FirehoseLogFrame& f : frames) {
        if (stopping.load()) return;
        if (cursor >= 0 && f.seq <= cursor) continue;
        if (options.frames_per_second > 0) {
          std::this_thread::sleep_until(
              start + std::chrono::microseconds(static_cast<int64_t>(
                          1e6 * static_cast<double>(written) / options.frames_per_second)));
        }
        ws.write(asio::buffer(f.bytes.data(), f.bytes.size()));
        frames_sent.fetch_add(1);
        ++written;
        if (options.disconnect_after_frames > 0 && written >= options.disconnect_after_frames) {
          // Without a close frame; the socket object itself is closed by the destructor alone
          // (another thread reads its descriptor then).
          ::shutdown(socket->native_handle(), SHUT_RDWR);
          return;
        }
      }
      // Idle until the client goes or the relay stops.
      beast::flat_buffer in;
      for (;;) ws.read(in);
    } catch (const std::exception&) {
      // The client went away, or the relay is stopping: the session ends.
    }
  }
};

Result<std::unique_ptr<FirehoseRelay>> FirehoseRelay::Start(std::vector<FirehoseLogFrame> frames,
                                                            FirehoseRelayOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->frames = std::move(frames);
  impl->options = options;
  Impl* s = impl.get();
  auto port = BindLowPort([s](uint16_t p) {
    boost::system::error_code ec;
    if (s->acceptor.is_open()) s->acceptor.close(ec);
    s->acceptor.open(tcp::v4(), ec);
    if (ec) return false;
    s->acceptor.bind({asio::ip::make_address_v4("127.0.0.1"), p}, ec);
    if (ec) return false;
    s->acceptor.listen(asio::socket_base::max_listen_connections, ec);
    return !ec;
  });
  if (!port) return Status::Unavailable("firehose relay: no free port below 32768 on 127.0.0.1");
  impl->port = *port;
  impl->accept_thread = std::thread([s] {
    while (!s->stopping.load()) {
      auto socket = std::make_shared<tcp::socket>(s->io);
      boost::system::error_code ec;
      s->acceptor.accept(*socket, ec);
      if (ec || s->stopping.load()) return;
      std::lock_guard<std::mutex> lock(s->mu);
      s->sockets.push_back(socket);
      const int wake = ::dup(socket->native_handle());
      if (wake >= 0) s->wake_fds.push_back(wake);
      s->sessions.emplace_back([s, socket] { s->Serve(socket); });
    }
  });
  return std::unique_ptr<FirehoseRelay>(new FirehoseRelay(std::move(impl)));
}

FirehoseRelay::FirehoseRelay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FirehoseRelay::~FirehoseRelay() {
  Impl& s = *impl_;
  s.stopping = true;
  boost::system::error_code ec;
  // A blocking accept is woken by shutting the listening socket down (the acceptor object is the
  // accept thread's until it has joined).
  ::shutdown(s.acceptor.native_handle(), SHUT_RDWR);
  if (s.accept_thread.joinable()) s.accept_thread.join();
  std::vector<std::thread> sessions;
  std::vector<int> wake_fds;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (const int fd : s.wake_fds) ::shutdown(fd, SHUT_RDWR);
    sessions.swap(s.sessions);
    wake_fds.swap(s.wake_fds);
  }
  for (auto& t : sessions) t.join();
  for (const int fd : wake_fds) ::close(fd);
  s.acceptor.close(ec);
}

std::string FirehoseRelay::url() const { return "ws://127.0.0.1:" + std::to_string(impl_->port); }
uint64_t FirehoseRelay::connections() const { return impl_->connections.load(); }
uint64_t FirehoseRelay::frames_sent() const { return impl_->frames_sent.load(); }

}  // namespace atfill::simnet
