#include "sources/crawl/resolver.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <simdjson.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "atproto/syntax.hpp"
#include "base/clock.hpp"
#include "net/endpoint.hpp"

namespace atfill::sources {
namespace {

constexpr int64_t kMicrosPerSecond = 1'000'000;
// Caps that keep now + ttl and the request settings far from overflow and from nonsense.
constexpr int64_t kMaxCacheTtlS = int64_t{100} * 365 * 24 * 3600;
constexpr int64_t kMaxTimeoutMs = 600'000;
constexpr uint64_t kMaxDocumentBytesCap = uint64_t{16} << 20;
// Input echoed into messages is cut to this many bytes.
constexpr size_t kMaxShownBytes = 200;

// `text` as it may appear in a message: quoted, control and non-ASCII bytes as '?', cut short.
std::string Shown(std::string_view text) {
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < kMaxShownBytes; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    out.push_back(c < 0x20 || c >= 0x7f ? '?' : static_cast<char>(c));
  }
  if (text.size() > kMaxShownBytes) out += "...";
  out.push_back('\'');
  return out;
}

ResolveOutcome Failure(std::string kind, std::string message, bool retryable = false) {
  ResolveOutcome out;
  out.error_kind = std::move(kind);
  out.message = std::move(message);
  out.retryable = retryable;
  return out;
}

char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// "localhost" or a name below it (RFC 6761: always loopback); `host` is lower-case.
bool IsLocalhostName(std::string_view host) {
  while (!host.empty() && host.back() == '.') host.remove_suffix(1);
  return host == "localhost" || host.ends_with(".localhost");
}

bool IsLoopbackIpv4(const in_addr& a) { return (ntohl(a.s_addr) >> 24) == 127; }

bool IsLoopbackIpv6(const in6_addr& a) {
  static constexpr uint8_t kLoopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::equal(a.s6_addr, a.s6_addr + 16, kLoopback)) return true;
  return std::equal(a.s6_addr, a.s6_addr + 12, kMapped) && a.s6_addr[12] == 127;
}

// The host part of a HostKey ("scheme://host:port"): everything between "://" and the last ':'.
std::string_view KeyHost(std::string_view key) {
  const size_t start = key.find("://");
  if (start == std::string_view::npos) return {};
  key.remove_prefix(start + 3);
  const size_t colon = key.rfind(':');
  return colon == std::string_view::npos ? key : key.substr(0, colon);
}

// Checks an IP literal host; nullopt when `host` is not one.
std::optional<Status> CheckIpLiteral(std::string_view host, const ResolverOptions& options) {
  Status verdict;
  bool loopback = false;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    const std::string inner(host.substr(1, host.size() - 2));
    sockaddr_in6 v6{};
    v6.sin6_family = AF_INET6;
    if (inet_pton(AF_INET6, inner.c_str(), &v6.sin6_addr) != 1) {
      return Status::Invalid("host " + Shown(host) + " is not a usable IPv6 address");
    }
    verdict = net::CheckPublicAddress(reinterpret_cast<const sockaddr*>(&v6), sizeof(v6));
    loopback = IsLoopbackIpv6(v6.sin6_addr);
  } else {
    const std::string text(host);
    sockaddr_in v4{};
    v4.sin_family = AF_INET;
    if (inet_pton(AF_INET, text.c_str(), &v4.sin_addr) != 1) return std::nullopt;
    verdict = net::CheckPublicAddress(reinterpret_cast<const sockaddr*>(&v4), sizeof(v4));
    loopback = IsLoopbackIpv4(v4.sin_addr);
  }
  if (verdict.ok() || options.allow_private_endpoints) return Status::OK();
  if (loopback && options.allow_loopback_endpoints) return Status::OK();
  return verdict;
}

// Where the DID document of `did` is fetched from, or why it cannot be.
struct Location {
  std::string url;
  // The PLC directory of the config (reached wherever it points), not a host named by the DID.
  bool trusted = false;
  ResolveOutcome failure;  // error_kind set when `url` is empty
};

Location Fail(std::string kind, std::string message) {
  Location out;
  out.failure = Failure(std::move(kind), std::move(message));
  return out;
}

Location LocatePlc(std::string_view did, const ResolverOptions& options) {
  const std::string_view id = did.substr(8);  // after "did:plc:"
  bool valid = id.size() == 24;
  for (char c : id) valid = valid && ((c >= 'a' && c <= 'z') || (c >= '2' && c <= '7'));
  if (!valid) {
    return Fail("invalid_did", "DID " + Shown(did) +
                                   " is not a valid did:plc: the identifier must be 24 characters "
                                   "of base32 (a-z, 2-7)");
  }
  std::string_view base = options.plc_url;
  while (!base.empty() && base.back() == '/') base.remove_suffix(1);
  Location out;
  out.url = std::string(base) + "/" + std::string(did);
  out.trusted = true;
  return out;
}

Location LocateWeb(std::string_view did, const ResolverOptions& options) {
  Result<atproto::Did> parsed = atproto::Did::Parse(did);
  if (!parsed.ok()) {
    return Fail("invalid_did", "DID " + Shown(did) + " is not valid: " + parsed.status().message());
  }
  Result<std::string> web_host = parsed->WebHost();
  if (!web_host.ok()) {
    return Fail("invalid_did",
                "DID " + Shown(did) + " is not a usable did:web: " + web_host.status().message());
  }
  std::string host = *web_host;
  std::string port;
  if (const size_t colon = host.find(':'); colon != std::string::npos) {
    port = host.substr(colon + 1);
    host.resize(colon);
  }
  bool host_ok = !host.empty() && host.size() <= 253 && host.front() != '.' && host.front() != '-';
  for (char& c : host) {
    c = Lower(c);
    host_ok = host_ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-');
  }
  if (!host_ok) {
    return Fail("invalid_did", "DID " + Shown(did) + " does not name a valid host name");
  }
  if (!port.empty() || web_host->find(':') != std::string::npos) {
    bool port_ok = !port.empty() && port.size() <= 5 && port.front() != '0';
    int value = 0;
    for (char c : port) {
      port_ok = port_ok && c >= '0' && c <= '9';
      if (port_ok) value = value * 10 + (c - '0');
    }
    if (!port_ok || value > 65535) {
      return Fail("invalid_did", "DID " + Shown(did) + " has port " + Shown(port) +
                                     ", not a number from 1 to 65535");
    }
  }
  const bool plain_http = IsLocalhostName(host) &&
                          (options.allow_loopback_endpoints || options.allow_private_endpoints);
  Location out;
  out.url = std::string(plain_http ? "http://" : "https://") + host +
            (port.empty() ? "" : ":" + port) + "/.well-known/did.json";
  if (Status st = CheckResolvedEndpoint(out.url, options); !st.ok()) {
    return Fail("bad_endpoint",
                "the did:web host of " + Shown(did) + " is refused: " + st.message());
  }
  return out;
}

Location Locate(std::string_view did, const ResolverOptions& options) {
  if (Status st = atproto::ValidateDid(did); !st.ok()) {
    return Fail("invalid_did", "DID " + Shown(did) + " is not valid: " + st.message());
  }
  if (did.starts_with("did:plc:")) return LocatePlc(did, options);
  if (did.starts_with("did:web:")) return LocateWeb(did, options);
  const size_t method_end = did.find(':', 4);
  return Fail("unsupported_did_method", "DID " + Shown(did) + " uses the method '" +
                                            std::string(did.substr(4, method_end - 4)) +
                                            "'; only plc and web are supported");
}

// True when `id` names `fragment` ("#atproto_pds") of `did`, relative or absolute.
bool NamesFragment(std::string_view id, std::string_view did, std::string_view fragment) {
  if (id == fragment) return true;
  return id.size() == did.size() + fragment.size() && id.starts_with(did) && id.ends_with(fragment);
}

}  // namespace

Status ResolverOptions::Validate() const {
  Result<std::string> key = net::HostKey(plc_url);
  if (!key.ok()) {
    return Status::Invalid("ResolverOptions.plc_url " + Shown(plc_url) +
                           " is not usable: " + key.status().message());
  }
  if (plc_url.find_first_of("?#") != std::string::npos) {
    return Status::Invalid("ResolverOptions.plc_url " + Shown(plc_url) +
                           " has a query or fragment; give the directory's base URL");
  }
  if (cache_ttl_s < 0 || cache_ttl_s > kMaxCacheTtlS) {
    return Status::Invalid("ResolverOptions.cache_ttl_s is " + std::to_string(cache_ttl_s) +
                           "; it must be 0.." + std::to_string(kMaxCacheTtlS) + " seconds");
  }
  if (timeout_ms < 1 || timeout_ms > kMaxTimeoutMs) {
    return Status::Invalid("ResolverOptions.timeout_ms is " + std::to_string(timeout_ms) +
                           "; it must be 1.." + std::to_string(kMaxTimeoutMs) + " milliseconds");
  }
  if (max_document_bytes < 1 || max_document_bytes > kMaxDocumentBytesCap) {
    return Status::Invalid("ResolverOptions.max_document_bytes is " +
                           std::to_string(max_document_bytes) + "; it must be 1.." +
                           std::to_string(kMaxDocumentBytesCap) + " bytes");
  }
  return Status::OK();
}

Status CheckResolvedEndpoint(std::string_view url, const ResolverOptions& options) {
  Result<std::string> key = net::HostKey(url);
  if (!key.ok()) return key.status();
  const std::string_view host = KeyHost(*key);
  if (host.empty()) return Status::Invalid("URL " + Shown(url) + " has no host");
  if (std::optional<Status> literal = CheckIpLiteral(host, options)) {
    if (!literal->ok()) return Status::Invalid("URL " + Shown(url) + ": " + literal->message());
    return Status::OK();
  }
  if (IsLocalhostName(host) && !options.allow_loopback_endpoints &&
      !options.allow_private_endpoints) {
    return Status::Invalid("URL " + Shown(url) + " names host " + Shown(host) +
                           ", which is loopback");
  }
  return Status::OK();
}

ResolveOutcome ParseDidDocument(std::string_view did, std::string_view json,
                                const ResolverOptions& options, int64_t now_us) {
  namespace dom = simdjson::dom;
  const std::string who = "the DID document of " + Shown(did);
  if (json.size() > options.max_document_bytes) {
    return Failure("bad_did_document", who + " is " + std::to_string(json.size()) +
                                           " bytes, more than the " +
                                           std::to_string(options.max_document_bytes) + " allowed");
  }
  // One parser per thread keeps its buffers between documents.
  thread_local dom::parser parser;
  const simdjson::padded_string padded(json);
  dom::element root;
  if (const auto code = parser.parse(padded).get(root); code != simdjson::SUCCESS) {
    return Failure("bad_did_document",
                   who + " is not JSON: " + std::string(simdjson::error_message(code)));
  }
  dom::object doc;
  if (root.get_object().get(doc) != simdjson::SUCCESS) {
    return Failure("bad_did_document", who + " is not a JSON object");
  }
  std::string_view id;
  if (doc["id"].get_string().get(id) != simdjson::SUCCESS) {
    return Failure("bad_did_document", who + " has no string 'id'");
  }
  if (id != did) {
    return Failure("bad_did_document", who + " has id " + Shown(id) + ", not the DID");
  }

  bool has_service = false;
  std::optional<std::string_view> endpoint;
  dom::array services;
  if (doc["service"].get_array().get(services) == simdjson::SUCCESS) {
    for (dom::element item : services) {
      dom::object service;
      std::string_view service_id;
      if (item.get_object().get(service) != simdjson::SUCCESS ||
          service["id"].get_string().get(service_id) != simdjson::SUCCESS ||
          !NamesFragment(service_id, did, options.service_id)) {
        continue;
      }
      has_service = true;
      std::string_view value;
      if (service["serviceEndpoint"].get_string().get(value) == simdjson::SUCCESS) endpoint = value;
      break;
    }
  }
  if (!has_service) {
    return Failure("no_pds_endpoint", who + " has no " + options.service_id + " service");
  }
  if (!endpoint) {
    return Failure("bad_endpoint",
                   who + " has an " + options.service_id + " service without a string endpoint");
  }
  std::string_view url = *endpoint;
  while (!url.empty() && url.back() == '/') url.remove_suffix(1);
  if (Status st = CheckResolvedEndpoint(url, options); !st.ok()) {
    return Failure("bad_endpoint", "the " + options.service_id + " endpoint in " + who +
                                       " is refused: " + st.message());
  }

  state::ResolvedDid resolved;
  resolved.pds_endpoint = std::string(url);
  dom::array methods;
  if (doc["verificationMethod"].get_array().get(methods) == simdjson::SUCCESS) {
    for (dom::element item : methods) {
      dom::object method;
      std::string_view method_id;
      if (item.get_object().get(method) != simdjson::SUCCESS ||
          method["id"].get_string().get(method_id) != simdjson::SUCCESS ||
          !NamesFragment(method_id, did, options.key_id)) {
        continue;
      }
      std::string_view key;
      if (method["publicKeyMultibase"].get_string().get(key) == simdjson::SUCCESS) {
        resolved.signing_key = std::string(key);
      }
      break;
    }
  }
  dom::array aliases;
  if (doc["alsoKnownAs"].get_array().get(aliases) == simdjson::SUCCESS) {
    for (dom::element item : aliases) {
      std::string_view alias;
      if (item.get_string().get(alias) != simdjson::SUCCESS || !alias.starts_with("at://")) {
        continue;
      }
      alias.remove_prefix(5);
      if (atproto::ValidateHandle(alias).ok()) {
        resolved.handle = std::string(alias);
        break;
      }
    }
  }
  resolved.resolved_at_us = now_us;
  resolved.expires_at_us = now_us + options.cache_ttl_s * kMicrosPerSecond;
  ResolveOutcome out;
  out.doc = std::move(resolved);
  return out;
}

class DidResolver::Core {
 public:
  using Waiter = std::function<void(ResolveOutcome)>;

  Core(state::ResolverCache* cache, ResolverOptions options, std::function<int64_t()> now_us)
      : cache_(cache),
        options_(std::move(options)),
        options_status_(options_.Validate()),
        now_us_(now_us ? std::move(now_us) : std::function<int64_t()>(SystemNowUs)) {}

  const ResolverOptions& options() const { return options_; }
  const Status& options_status() const { return options_status_; }
  bool use_cache() const { return cache_ != nullptr && options_.cache_ttl_s > 0; }

  // A cached resolution still acceptable under the current options, or nullopt.
  std::optional<state::ResolvedDid> Cached(const std::string& did) {
    Result<std::optional<state::ResolvedDid>> cached = cache_->Get(did, now_us_());
    if (!cached.ok()) {
      cache_errors_.fetch_add(1, std::memory_order_relaxed);
      return std::nullopt;
    }
    if (!cached->has_value() || !CheckResolvedEndpoint((*cached)->pds_endpoint, options_).ok()) {
      return std::nullopt;
    }
    cache_hits_.fetch_add(1, std::memory_order_relaxed);
    return std::move(*cached);
  }

  // Adds `done` to the waiters of a request in flight for `did` and returns true (the call is
  // coalesced); false, leaving `done` alone, when there is none.
  bool JoinInFlight(const std::string& did, Waiter& done) {
    std::lock_guard lock(mu_);
    auto it = in_flight_.find(did);
    if (it == in_flight_.end()) return false;
    it->second.push_back(std::move(done));
    coalesced_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  // Adds `done` to the waiters of `did`. True when no request was in flight, so the caller must
  // submit one now; false when the call joined one.
  bool JoinOrStart(const std::string& did, Waiter& done) {
    std::lock_guard lock(mu_);
    auto [it, inserted] = in_flight_.try_emplace(did);
    it->second.push_back(std::move(done));
    (inserted ? fetched_ : coalesced_).fetch_add(1, std::memory_order_relaxed);
    return inserted;
  }

  ResolveOutcome FromResponse(const std::string& did, Result<net::HttpResponse> response);

  // Stores a success in the cache, then hands the outcome to every waiter of `did`.
  void Complete(const std::string& did, ResolveOutcome outcome) {
    if (outcome.ok() && use_cache() && !cache_->Store(did, *outcome.doc).ok()) {
      cache_errors_.fetch_add(1, std::memory_order_relaxed);
    }
    std::vector<Waiter> waiters;
    {
      std::lock_guard lock(mu_);
      if (auto it = in_flight_.find(did); it != in_flight_.end()) {
        waiters = std::move(it->second);
        in_flight_.erase(it);
      }
    }
    for (size_t i = 0; i < waiters.size(); ++i) {
      Finish(i + 1 == waiters.size() ? std::move(outcome) : outcome, waiters[i]);
    }
  }

  void Finish(ResolveOutcome outcome, const Waiter& done) {
    if (!outcome.ok()) failures_.fetch_add(1, std::memory_order_relaxed);
    done(std::move(outcome));
  }

  void CountLookup() { lookups_.fetch_add(1, std::memory_order_relaxed); }

  ResolverStats stats() const {
    ResolverStats s;
    s.lookups = lookups_.load(std::memory_order_relaxed);
    s.cache_hits = cache_hits_.load(std::memory_order_relaxed);
    s.coalesced = coalesced_.load(std::memory_order_relaxed);
    s.fetched = fetched_.load(std::memory_order_relaxed);
    s.failures = failures_.load(std::memory_order_relaxed);
    s.cache_errors = cache_errors_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  state::ResolverCache* const cache_;
  const ResolverOptions options_;
  const Status options_status_;
  const std::function<int64_t()> now_us_;

  std::mutex mu_;
  // DIDs with a request in flight -> the callers waiting for it.
  std::unordered_map<std::string, std::vector<Waiter>> in_flight_;

  std::atomic<uint64_t> lookups_{0};
  std::atomic<uint64_t> cache_hits_{0};
  std::atomic<uint64_t> coalesced_{0};
  std::atomic<uint64_t> fetched_{0};
  std::atomic<uint64_t> failures_{0};
  std::atomic<uint64_t> cache_errors_{0};
};

ResolveOutcome DidResolver::Core::FromResponse(const std::string& did,
                                               Result<net::HttpResponse> response) {
  const std::string who = "the DID document of " + Shown(did);
  if (!response.ok()) {
    const Status& st = response.status();
    switch (st.code()) {
      case StatusCode::kResourceExhausted:
        return Failure("bad_did_document", who + " is too large: " + st.message());
      case StatusCode::kInvalid:
        // A malformed URL or an address the HttpClient's connect-time guard refused.
        return Failure("bad_endpoint", "fetching " + who + " was refused: " + st.message());
      default:
        return Failure("resolve_failed", "fetching " + who + " failed: " + st.message(),
                       /*retryable=*/true);
    }
  }
  const net::HttpResponse& r = *response;
  const std::string from = " (from " + Shown(r.effective_url) + ")";
  if (r.status >= 200 && r.status < 300) return ParseDidDocument(did, r.body, options_, now_us_());
  if (r.status == 404 || r.status == 410) {
    return Failure("did_not_found",
                   who + " does not exist: HTTP " + std::to_string(r.status) + from);
  }
  const bool retryable = r.status >= 500 || r.status == 408 || r.status == 429;
  return Failure("resolve_failed",
                 "fetching " + who + " failed: HTTP " + std::to_string(r.status) + " after " +
                     std::to_string(r.attempts) + " attempt(s)" + from,
                 retryable);
}

DidResolver::DidResolver(net::HttpClient* http, state::ResolverCache* cache,
                         ResolverOptions options, std::function<int64_t()> now_us)
    : http_(http), core_(std::make_shared<Core>(cache, std::move(options), std::move(now_us))) {}

DidResolver::~DidResolver() = default;

void DidResolver::Resolve(const std::string& did, std::function<void(ResolveOutcome)> done) {
  core_->CountLookup();
  if (!done) done = [](ResolveOutcome) {};
  if (const Status& st = core_->options_status(); !st.ok()) {
    core_->Finish(Failure("invalid_options", "cannot resolve " + Shown(did) + ": " + st.message()),
                  done);
    return;
  }
  Location location = Locate(did, core_->options());
  if (location.url.empty()) {
    core_->Finish(std::move(location.failure), done);
    return;
  }
  if (core_->JoinInFlight(did, done)) return;
  if (core_->use_cache()) {
    if (std::optional<state::ResolvedDid> cached = core_->Cached(did)) {
      ResolveOutcome hit;
      hit.doc = std::move(cached);
      hit.from_cache = true;
      core_->Finish(std::move(hit), done);
      return;
    }
  }
  if (!core_->JoinOrStart(did, done)) return;
  net::HttpRequest request;
  request.url = std::move(location.url);
  request.trusted_endpoint = location.trusted;
  request.headers = {{"Accept", "application/did+ld+json, application/json"}};
  request.timeout_ms = core_->options().timeout_ms;
  request.max_response_bytes = core_->options().max_document_bytes;
  http_->Submit(std::move(request), [core = core_, did](Result<net::HttpResponse> response) {
    core->Complete(did, core->FromResponse(did, std::move(response)));
  });
}

ResolverStats DidResolver::stats() const { return core_->stats(); }

const ResolverOptions& DidResolver::options() const { return core_->options(); }

}  // namespace atfill::sources
