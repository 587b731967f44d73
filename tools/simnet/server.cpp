#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <list>
#include <mutex>
#include <optional>
#include <thread>

#include "atproto/car.hpp"
#include "atproto/repo.hpp"
#include "base/json_writer.hpp"
#include "base/low_port.hpp"
#include "tools/simnet/archive_server.hpp"
#include "tools/simnet/http_session.hpp"
#include "tools/simnet/http_util.hpp"
#include "tools/simnet/jetstream_server.hpp"
#include "tools/simnet/labeler_server.hpp"
#include "tools/simnet/mix.hpp"
#include "tools/simnet/simnet.hpp"

#include <pthread.h>

namespace atfill::simnet {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr size_t kLockStripes = 64;

using Reply = HttpReply;

Reply Json(int status, std::string body) {
  Reply r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

Reply XrpcError(int status, std::string_view error, std::string_view message) {
  JsonWriter w;
  w.BeginObject().Key("error").String(error).Key("message").String(message).EndObject();
  return Json(status, w.Take());
}

// `limit` from the query: the default when absent, an error when not within 1..max.
Result<size_t> Limit(const Target& t, size_t default_limit, size_t max_limit) {
  const std::optional<std::string> text = t.Param("limit");
  if (!text) return default_limit;
  size_t value = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size() || value < 1 || value > max_limit) {
    return Status::Invalid("limit must be an integer from 1 to " + std::to_string(max_limit));
  }
  return value;
}

// A built repository: its records (by collection, then rkey) and its CAR.
struct RepoData {
  std::vector<GeneratedRecord> records;
  atproto::Cid head;
  std::string car;
  size_t bytes = 0;
};

// True when the Host header names `kName` (lower case; any case, any port).
bool IsHost(std::string_view host_header, std::string_view kName) {
  const std::string_view name = host_header.substr(0, host_header.rfind(':'));
  return name.size() == kName.size() &&
         std::equal(name.begin(), name.end(), kName.begin(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == b;
         });
}

}  // namespace

struct Simnet::Impl {
  class Session;

  std::unique_ptr<Network> net;
  // Declared before the io_context: WebSocket sessions it destroys still point at it.
  std::unique_ptr<JetstreamServer> jetstream;
  std::unique_ptr<ArchiveServer> archive;
  std::unique_ptr<LabelerServer> labeler;
  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  std::once_flag stopped;
  std::vector<int64_t> web_account;  // per host id: the did:web account it serves, or -1

  std::unique_ptr<std::atomic<uint64_t>[]> host_counters;
  std::atomic<uint64_t> connections{0}, requests{0}, ok{0}, client_errors{0}, rate_limited{0},
      server_errors{0}, timeouts{0}, truncated{0}, repos_built{0};

  // Repo cache: LRU by bytes. The stripe lock of an account serialises its build, so the first
  // commit made for it (kept in `commits`) is the one served for the whole run.
  std::array<std::mutex, kLockStripes> stripes;
  std::vector<std::optional<std::pair<atproto::Cid, atproto::Commit>>> commits;
  std::mutex cache_mu;
  std::list<uint32_t> lru;  // most recent first
  struct CacheEntry {
    std::shared_ptr<const RepoData> data;
    std::list<uint32_t>::iterator pos;
  };
  std::unordered_map<uint32_t, CacheEntry> cache;
  uint64_t cache_bytes = 0;

  void Accept();
  Reply Handle(std::string_view host_header, std::string_view target);
  Reply Route(size_t host, const Target& t);
  Reply Relay(const Target& t, std::optional<uint32_t> only_pds);
  Reply Pds(uint32_t pds, const Target& t);
  Reply ListRecords(const Account& a, const Target& t);
  Result<std::shared_ptr<const RepoData>> Repo(const Account& a);
  Result<std::shared_ptr<const RepoData>> Build(const Account& a);
  void CountStatus(int status) {
    if (status < 300) {
      ++ok;
    } else if (status < 500 && status != 429) {
      ++client_errors;
    }
  }
};

class Simnet::Impl::Session : public HttpSession {
 public:
  Session(Impl* server, tcp::socket socket)
      : HttpSession(std::move(socket), 1 << 20, "atfill-simnet"), server_(server) {}

 private:
  void OnRequest(Parser& parser) override {
    const http::request<http::string_body>& req = parser.get();
    const auto host = req[http::field::host];
    if (server_->archive != nullptr) {
      std::optional<ArchiveServer::Answer> answer =
          server_->archive->Handle(std::string_view(host.data(), host.size()), req);
      if (answer) {
        ++server_->requests;
        server_->CountStatus(answer->status);
        Reply r;
        r.status = answer->status;
        r.content_type = std::move(answer->content_type);
        r.headers = std::move(answer->headers);
        r.body = std::move(answer->body);
        if (answer->fault == ArchiveServer::Answer::Fault::kDrop) {
          r.fault = Reply::Fault::kCloseWithoutResponse;
        }
        if (answer->fault == ArchiveServer::Answer::Fault::kTruncate) {
          r.fault = Reply::Fault::kDropMidBody;
        }
        r.delay_ms = server_->net->options().latency_ms;
        return Answer(std::move(r));
      }
    }
    if (server_->jetstream != nullptr &&
        IsHost(std::string_view(host.data(), host.size()), "jetstream.localhost")) {
      ++server_->requests;
      std::optional<JetstreamServer::HttpAnswer> answer =
          server_->jetstream->Handle(parser.release(), stream());
      if (!answer) return;  // the connection is now a WebSocket session's
      server_->CountStatus(answer->status);
      Reply r;
      r.status = answer->status;
      r.content_type = std::move(answer->content_type);
      r.body = std::move(answer->body);
      return Answer(std::move(r));
    }
    if (server_->labeler != nullptr &&
        IsHost(std::string_view(host.data(), host.size()), "labeler.localhost")) {
      ++server_->requests;
      auto answer = server_->labeler->Handle(parser.release(), stream());
      if (!answer) return;  // the connection is now a WebSocket session's
      server_->CountStatus(answer->first);
      Reply r;
      r.status = answer->first;
      r.content_type = "application/json";
      r.body = std::move(answer->second);
      return Answer(std::move(r));
    }
    const auto target = req.target();
    Answer(server_->Handle(std::string_view(host.data(), host.size()),
                           std::string_view(target.data(), target.size())));
  }

  Impl* server_;
};

void Simnet::Impl::Accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) {
      ++connections;
      std::make_shared<Session>(this, std::move(socket))->Start();
    }
    Accept();
  });
}

Reply Simnet::Impl::Handle(std::string_view host_header, std::string_view target) {
  ++requests;
  std::string name(host_header.substr(0, host_header.rfind(':')));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const int64_t id = net->HostId(name);
  if (id < 0) {
    ++client_errors;
    return XrpcError(404, "NotFound", "no simulated host named \"" + name + "\"");
  }
  const size_t host = static_cast<size_t>(id);
  const uint64_t n = host_counters[host]++;
  const HostFaults& f = net->faults(host);
  const uint64_t seed = net->options().seed;
  const auto random = [&](uint64_t kind) { return Mix(Mix(seed ^ Mix(host * 16 + kind)) ^ n); };
  const int64_t delay = net->options().latency_ms + f.extra_latency_ms;

  if (f.timeout.Hits(n, random(1))) {
    ++timeouts;
    Reply r;
    r.fault = Reply::Fault::kCloseWithoutResponse;
    r.delay_ms = std::max<int64_t>(net->options().timeout_hold_ms, 1);
    return r;
  }
  Reply reply;
  if (f.rate_limit.Hits(n, random(2))) {
    ++rate_limited;
    const int64_t now_s = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
    reply = XrpcError(429, "RateLimitExceeded", "Rate Limit Exceeded");
    reply.headers = {{"RateLimit-Limit", "3000"},
                     {"RateLimit-Remaining", "0"},
                     {"RateLimit-Reset", std::to_string(now_s + f.rate_limit_reset_s)},
                     {"Retry-After", std::to_string(f.rate_limit_reset_s)}};
  } else if (f.server_error.Hits(n, random(3))) {
    ++server_errors;
    static constexpr int kStatuses[] = {500, 502, 503};
    const int status = f.server_error_status != 0 ? f.server_error_status : kStatuses[n % 3];
    reply = XrpcError(status, "InternalServerError", "simulated failure");
  } else {
    reply = Route(host, ParseTarget(target));
    CountStatus(reply.status);
    if (f.truncate.Hits(n, random(4))) {
      ++truncated;
      reply.fault = Reply::Fault::kDropMidBody;
    }
  }
  reply.delay_ms = delay;
  return reply;
}

Reply Simnet::Impl::Route(size_t host, const Target& t) {
  if (t.path == "/xrpc/_health") return Json(200, "{\"version\":\"atfill-simnet\"}");
  if (host == 0) return Relay(t, std::nullopt);
  if (host == 1) {
    if (labeler != nullptr && t.path.size() > 1 && t.path.substr(1) == labeler->log().did()) {
      return Json(200, labeler->log().DidDocument("http://labeler.localhost:" +
                                                  std::to_string(net->port())));
    }
    const Account* a =
        t.path.size() > 1 ? net->FindDid(std::string_view(t.path).substr(1)) : nullptr;
    if (a == nullptr || a->web >= 0) {
      return XrpcError(404, "NotFound", "DID not registered: " + t.path.substr(1));
    }
    return Json(200, net->DidDocument(*a));
  }
  const size_t pds_end = 2 + net->options().pds_hosts;
  if (host < pds_end) return Pds(static_cast<uint32_t>(host - 2), t);
  if (t.path != "/.well-known/did.json" || web_account[host] < 0) {
    return XrpcError(404, "NotFound", "not found: " + t.path);
  }
  return Json(200, net->DidDocument(net->accounts()[static_cast<size_t>(web_account[host])]));
}

Reply Simnet::Impl::Relay(const Target& t, std::optional<uint32_t> only_pds) {
  const bool by_collection = t.path == "/xrpc/com.atproto.sync.listReposByCollection";
  if (!by_collection && t.path != "/xrpc/com.atproto.sync.listRepos") {
    return XrpcError(501, "MethodNotImplemented", "method not implemented: " + t.path);
  }
  if (by_collection && only_pds) {
    return XrpcError(501, "MethodNotImplemented", "a PDS does not serve listReposByCollection");
  }
  Result<size_t> limit = by_collection ? Limit(t, 500, 2000) : Limit(t, 500, 1000);
  if (!limit.ok()) return XrpcError(400, "InvalidRequest", limit.status().message());
  size_t collection = 0;
  if (by_collection) {
    const std::optional<std::string> name = t.Param("collection");
    if (!name || name->empty()) {
      return XrpcError(400, "InvalidRequest",
                       "Error: Params must have the property \"collection\"");
    }
    const auto& all = net->options().collections;
    collection = static_cast<size_t>(std::find(all.begin(), all.end(), *name) - all.begin());
    if (collection == all.size()) return Json(200, "{\"repos\":[]}");
  }
  const std::string cursor = t.Param("cursor").value_or("");
  const std::vector<uint32_t>& order = net->by_did();
  auto it = std::upper_bound(
      order.begin(), order.end(), cursor,
      [&](const std::string& c, uint32_t i) { return c < net->accounts()[i].did; });
  JsonWriter w;
  w.BeginObject().Key("repos").BeginArray();
  size_t count = 0;
  std::string last;
  bool more = false;
  for (; it != order.end(); ++it) {
    const Account& a = net->accounts()[*it];
    if (by_collection && a.collection_counts[collection] == 0) continue;
    if (only_pds && a.pds != *only_pds) continue;
    if (count == *limit) {
      more = true;
      break;
    }
    w.BeginObject().Key("did").String(a.did);
    if (!by_collection) {
      Result<std::shared_ptr<const RepoData>> repo = Repo(a);
      if (!repo.ok()) return XrpcError(500, "InternalServerError", repo.status().ToString());
      w.Key("head").String((*repo)->head.ToString()).Key("rev").String(a.rev);
      w.Key("active").Bool(a.status == AccountStatus::kActive);
      if (a.status != AccountStatus::kActive) w.Key("status").String(AccountStatusName(a.status));
    }
    w.EndObject();
    last = a.did;
    ++count;
  }
  w.EndArray();
  if (more) w.Key("cursor").String(last);
  w.EndObject();
  return Json(200, w.Take());
}

Reply Simnet::Impl::Pds(uint32_t pds, const Target& t) {
  if (t.path == "/xrpc/com.atproto.sync.listRepos") return Relay(t, pds);
  const bool list_records = t.path == "/xrpc/com.atproto.repo.listRecords";
  const bool get_repo = t.path == "/xrpc/com.atproto.sync.getRepo";
  const bool get_status = t.path == "/xrpc/com.atproto.sync.getRepoStatus";
  if (!list_records && !get_repo && !get_status) {
    return XrpcError(501, "MethodNotImplemented", "method not implemented: " + t.path);
  }
  const char* param = list_records ? "repo" : "did";
  const std::optional<std::string> did = t.Param(param);
  if (!did || did->empty()) {
    return XrpcError(400, "InvalidRequest",
                     std::string("Error: Params must have the property \"") + param + "\"");
  }
  const Account* a = net->FindDid(*did);
  if (a == nullptr || a->pds != pds) {
    return XrpcError(400, "RepoNotFound", "Could not find repo for DID: " + *did);
  }
  if (get_status) {
    // With a Jetstream, the status its published #account events have given the account.
    const AccountStatus status = jetstream != nullptr
                                     ? jetstream->log().StatusAt(a->index, jetstream->Published())
                                     : a->status;
    JsonWriter w;
    w.BeginObject().Key("did").String(a->did);
    w.Key("active").Bool(status == AccountStatus::kActive);
    if (status != AccountStatus::kActive) {
      w.Key("status").String(AccountStatusName(status));
    } else {
      w.Key("rev").String(a->rev);
    }
    w.EndObject();
    return Json(200, w.Take());
  }
  if (a->status == AccountStatus::kDeactivated) {
    return XrpcError(400, "RepoDeactivated", "Repo has been deactivated: " + a->did);
  }
  if (a->status == AccountStatus::kTakendown) {
    return XrpcError(400, "RepoTakendown", "Repo has been takendown: " + a->did);
  }
  if (list_records) return ListRecords(*a, t);
  Result<std::shared_ptr<const RepoData>> repo = Repo(*a);
  if (!repo.ok()) return XrpcError(500, "InternalServerError", repo.status().ToString());
  Reply r;
  r.body = (*repo)->car;
  r.content_type = "application/vnd.ipld.car";
  return r;
}

Reply Simnet::Impl::ListRecords(const Account& a, const Target& t) {
  const std::optional<std::string> collection = t.Param("collection");
  if (!collection || collection->empty()) {
    return XrpcError(400, "InvalidRequest", "Error: Params must have the property \"collection\"");
  }
  Result<size_t> limit = Limit(t, 50, 100);
  if (!limit.ok()) return XrpcError(400, "InvalidRequest", limit.status().message());
  const bool ascending = t.Param("reverse").value_or("") == "true";
  const std::optional<std::string> cursor = t.Param("cursor");
  Result<std::shared_ptr<const RepoData>> repo = Repo(a);
  if (!repo.ok()) return XrpcError(500, "InternalServerError", repo.status().ToString());
  const std::vector<GeneratedRecord>& records = (*repo)->records;
  const auto lo = std::lower_bound(
      records.begin(), records.end(), *collection,
      [](const GeneratedRecord& r, const std::string& c) { return r.collection < c; });
  const auto hi = std::upper_bound(
      lo, records.end(), *collection,
      [](const std::string& c, const GeneratedRecord& r) { return c < r.collection; });
  // The default order is newest first, as a PDS answers; reverse=true gives oldest first. The
  // cursor is the last rkey returned.
  std::vector<const GeneratedRecord*> page;
  std::string uri_prefix = "at://" + a.did + "/" + *collection + "/";
  bool more = false;
  const auto take = [&](const GeneratedRecord& r) {
    if (cursor && (ascending ? r.rkey <= *cursor : r.rkey >= *cursor)) return true;
    if (page.size() == *limit) {
      more = true;
      return false;
    }
    page.push_back(&r);
    return true;
  };
  if (ascending) {
    for (auto it = lo; it != hi && take(*it); ++it) {
    }
  } else {
    for (auto it = hi; it != lo && take(*(it - 1)); --it) {
    }
  }
  JsonWriter w;
  w.BeginObject();
  if (more) w.Key("cursor").String(page.back()->rkey);
  w.Key("records").BeginArray();
  for (const GeneratedRecord* r : page) {
    const std::string uri = uri_prefix + r->rkey;
    const atproto::Cid cid =
        r->cid_mismatch ? atproto::Cid::Compute(atproto::Cid::Codec::kDagCbor, AsBytes(uri))
                        : r->cid;
    w.BeginObject().Key("uri").String(uri).Key("cid").String(cid.ToString());
    w.Key("value").Raw(r->json).EndObject();
  }
  w.EndArray().EndObject();
  return Json(200, w.Take());
}

Result<std::shared_ptr<const RepoData>> Simnet::Impl::Repo(const Account& a) {
  const auto lookup = [&]() -> std::shared_ptr<const RepoData> {
    std::lock_guard lock(cache_mu);
    auto it = cache.find(a.index);
    if (it == cache.end()) return nullptr;
    lru.splice(lru.begin(), lru, it->second.pos);
    return it->second.data;
  };
  if (auto hit = lookup()) return hit;
  std::lock_guard build_lock(stripes[a.index % kLockStripes]);
  if (auto hit = lookup()) return hit;
  ATFILL_ASSIGN_OR_RETURN(std::shared_ptr<const RepoData> data, Build(a));
  std::lock_guard lock(cache_mu);
  lru.push_front(a.index);
  cache[a.index] = CacheEntry{data, lru.begin()};
  cache_bytes += data->bytes;
  while (cache_bytes > net->options().repo_cache_bytes && lru.size() > 1) {
    auto victim = cache.find(lru.back());
    cache_bytes -= victim->second.data->bytes;
    cache.erase(victim);
    lru.pop_back();
  }
  return data;
}

// Called with the account's stripe lock held.
Result<std::shared_ptr<const RepoData>> Simnet::Impl::Build(const Account& a) {
  ++repos_built;
  auto data = std::make_shared<RepoData>();
  ATFILL_ASSIGN_OR_RETURN(data->records, net->Records(a));
  atproto::RepoWriter writer;
  for (const GeneratedRecord& r : data->records) {
    ATFILL_RETURN_IF_ERROR(writer.PutJson(r.collection, r.rkey, r.json).status());
  }
  ATFILL_ASSIGN_OR_RETURN(atproto::PrivateKey key, net->CommitKey(a));
  ATFILL_ASSIGN_OR_RETURN(atproto::WrittenRepo written, writer.Write(a.did, a.rev, key));
  auto& stored = commits[a.index];
  if (!stored) {
    stored.emplace(written.commit_cid, written.commit);
    data->head = written.commit_cid;
    data->car.assign(AsChars(written.car));
  } else {
    // A rebuild after eviction: the new signature differs (ECDSA here is randomized), so the
    // first commit is put back to keep the head stable.
    data->head = stored->first;
    const atproto::Cid roots[] = {stored->first};
    atproto::CarWriter car(roots);
    ATFILL_RETURN_IF_ERROR(car.Add(stored->first, atproto::EncodeSignedCommit(stored->second)));
    ATFILL_ASSIGN_OR_RETURN(atproto::CarReader reader, atproto::CarReader::Open(written.car));
    atproto::CarBlock block;
    bool first = true;
    while (true) {
      ATFILL_ASSIGN_OR_RETURN(bool more, reader.Next(&block));
      if (!more) break;
      if (!first) ATFILL_RETURN_IF_ERROR(car.Add(block.cid, block.data));
      first = false;
    }
    data->car.assign(AsChars(car.bytes()));
  }
  data->bytes = data->car.size() + sizeof(RepoData);
  for (const GeneratedRecord& r : data->records) {
    data->bytes += r.json.size() + r.collection.size() + r.rkey.size() + sizeof(GeneratedRecord);
  }
  return std::shared_ptr<const RepoData>(std::move(data));
}

Simnet::Simnet(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Simnet::~Simnet() { Stop(); }

Result<std::unique_ptr<Simnet>> Simnet::Start(SimnetOptions options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>();
  beast::error_code ec;
  const auto loopback = asio::ip::make_address_v4("127.0.0.1");
  impl->acceptor.open(tcp::v4(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec && options.port != 0) {
    impl->acceptor.bind(tcp::endpoint(loopback, options.port), ec);
  } else if (!ec) {
    // No port given: one below the ephemeral range (base/low_port.hpp).
    const auto bound = BindLowPort([&](uint16_t port) {
      beast::error_code attempt;
      impl->acceptor.bind(tcp::endpoint(loopback, port), attempt);
      return !attempt;
    });
    if (!bound) ec = asio::error::address_in_use;
  }
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::IoError("cannot listen on 127.0.0.1:" + std::to_string(options.port) + ": " +
                           ec.message());
  }
  const uint16_t port = impl->acceptor.local_endpoint().port();
  ATFILL_ASSIGN_OR_RETURN(impl->net, Network::Generate(options, port));
  const Network& net = *impl->net;
  impl->host_counters = std::make_unique<std::atomic<uint64_t>[]>(net.host_count());
  impl->web_account.assign(net.host_count(), -1);
  for (const Account& a : net.accounts()) {
    if (a.web >= 0) {
      impl->web_account[2 + options.pds_hosts + static_cast<size_t>(a.web)] = a.index;
    }
  }
  impl->commits.resize(net.accounts().size());
  if (options.jetstream.events > 0) {
    ATFILL_ASSIGN_OR_RETURN(impl->jetstream, JetstreamServer::Create(net, options.jetstream));
  }
  if (options.labeler.labels > 0) {
    ATFILL_ASSIGN_OR_RETURN(impl->labeler, LabelerServer::Create(net, options.labeler));
  }
  if (!options.archive.dir.empty()) {
    const JetstreamServer* j = impl->jetstream.get();
    ATFILL_ASSIGN_OR_RETURN(
        impl->archive,
        ArchiveServer::Create(options.archive, net, j != nullptr ? &j->log() : nullptr,
                              j != nullptr ? j->dictionary(2) : ByteView(), port));
  }
  impl->Accept();
  Impl* raw = impl.get();
  for (int i = 0; i < options.threads; ++i) {
    raw->threads.emplace_back([raw] {
      // Named, so that benchmarks and profiles can tell simnet's CPU from the client's.
      pthread_setname_np(pthread_self(), "simnet-io");
      raw->ioc.run();
    });
  }
  return std::unique_ptr<Simnet>(new Simnet(std::move(impl)));
}

void Simnet::Stop() {
  std::call_once(impl_->stopped, [this] {
    impl_->ioc.stop();
    for (std::thread& t : impl_->threads) t.join();
    beast::error_code ignored;
    impl_->acceptor.close(ignored);
  });
}

uint16_t Simnet::port() const { return impl_->net->port(); }
std::string Simnet::relay_url() const { return impl_->net->relay_url(); }
std::string Simnet::plc_url() const { return impl_->net->plc_url(); }
std::string Simnet::labeler_url() const {
  return impl_->labeler == nullptr ? std::string()
                                   : "http://labeler.localhost:" + std::to_string(port());
}
const LabelerLog* Simnet::labeler() const {
  return impl_->labeler == nullptr ? nullptr : &impl_->labeler->log();
}
std::string Simnet::pds_url(uint32_t pds) const { return impl_->net->pds_url(pds); }
const Network& Simnet::network() const { return *impl_->net; }

std::string Simnet::jetstream_url() const {
  if (impl_->jetstream == nullptr) return "";
  return "ws://jetstream.localhost:" + std::to_string(impl_->net->port());
}

std::string Simnet::archive_url() const {
  if (impl_->archive == nullptr) return "";
  return "http://archive.localhost:" + std::to_string(impl_->net->port());
}

void Simnet::SetArchiveFaults(ArchiveFaults faults) {
  if (impl_->archive != nullptr) impl_->archive->SetFaults(std::move(faults));
}

ArchiveStats Simnet::archive_stats() const {
  return impl_->archive != nullptr ? impl_->archive->stats() : ArchiveStats{};
}

const JetstreamLog* Simnet::jetstream() const {
  return impl_->jetstream != nullptr ? &impl_->jetstream->log() : nullptr;
}

std::vector<JetstreamFilterStart> Simnet::jetstream_filter_starts() const {
  return impl_->jetstream != nullptr ? impl_->jetstream->filter_starts()
                                     : std::vector<JetstreamFilterStart>{};
}

ByteView Simnet::jetstream_dictionary(int version) const {
  return impl_->jetstream != nullptr ? impl_->jetstream->dictionary(version) : ByteView();
}

Result<JetstreamTruth> Simnet::JetstreamGroundTruth(uint64_t through_seq) const {
  if (impl_->jetstream == nullptr) return Status::Invalid("this simnet runs no jetstream");
  return impl_->jetstream->log().Truth(through_seq);
}
Result<GroundTruth> Simnet::Truth() const { return impl_->net->Truth(); }

SimnetStats Simnet::stats() const {
  SimnetStats s;
  s.connections = impl_->connections;
  s.requests = impl_->requests;
  s.ok = impl_->ok;
  s.client_errors = impl_->client_errors;
  s.rate_limited = impl_->rate_limited;
  s.server_errors = impl_->server_errors;
  s.timeouts = impl_->timeouts;
  s.truncated = impl_->truncated;
  s.repos_built = impl_->repos_built;
  if (const JetstreamServer* j = impl_->jetstream.get()) {
    s.jetstream_connections = j->connections;
    s.jetstream_frames = j->frames;
    s.jetstream_disconnects = j->disconnects;
    s.jetstream_slow_drops = j->slow_drops;
  }
  return s;
}

uint64_t Simnet::host_requests(size_t host_id) const {
  if (host_id >= impl_->net->host_count()) return 0;
  return impl_->host_counters[host_id];
}

}  // namespace atfill::simnet
