#include "net/endpoint.hpp"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>

#include "base/version.hpp"

namespace atfill::net {

std::string DefaultUserAgent(std::string_view version) {
  return "atfill/" + std::string(version.empty() ? kVersion : version) +
         " (+https://github.com/atfill)";
}
namespace {

struct UrlDeleter {
  void operator()(CURLU* url) const { curl_url_cleanup(url); }
};
struct CurlStringDeleter {
  void operator()(char* s) const { curl_free(s); }
};
using CurlString = std::unique_ptr<char, CurlStringDeleter>;

struct UrlParts {
  std::string scheme;  // lower-case
  std::string host;    // lower-case; an IPv6 literal keeps its brackets
  std::string port;    // explicit, the scheme's default when the URL has none
};

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// URL syntax is libcurl's, so the key is computed from exactly what the transfer will use.
Result<UrlParts> ParseUrl(std::string_view url) {
  if (url.empty()) return Status::Invalid("empty URL");
  if (url.find('\0') != std::string_view::npos) return Status::Invalid("URL contains a NUL byte");
  std::unique_ptr<CURLU, UrlDeleter> handle(curl_url());
  if (!handle) return Status::Internal("curl_url() failed (out of memory)");
  const std::string text(url);
  if (CURLUcode rc = curl_url_set(handle.get(), CURLUPART_URL, text.c_str(), 0); rc != CURLUE_OK) {
    return Status::Invalid("malformed URL '" + text + "': " + curl_url_strerror(rc));
  }
  auto part = [&](CURLUPart which, unsigned flags, std::string* out) -> bool {
    char* raw = nullptr;
    if (curl_url_get(handle.get(), which, &raw, flags) != CURLUE_OK || raw == nullptr) return false;
    CurlString owned(raw);
    *out = Lower(owned.get());
    return true;
  };
  UrlParts parts;
  if (!part(CURLUPART_SCHEME, 0, &parts.scheme)) {
    return Status::Invalid("URL '" + text + "' has no scheme");
  }
  if (parts.scheme != "http" && parts.scheme != "https") {
    return Status::Invalid("URL '" + text + "' has scheme '" + parts.scheme +
                           "'; only http and https are allowed");
  }
  if (!part(CURLUPART_HOST, 0, &parts.host) || parts.host.empty()) {
    return Status::Invalid("URL '" + text + "' has no host");
  }
  if (!part(CURLUPART_PORT, CURLU_DEFAULT_PORT, &parts.port)) {
    return Status::Invalid("URL '" + text + "' has no usable port");
  }
  return parts;
}

std::string FormatAddress(int family, const void* raw) {
  std::array<char, INET6_ADDRSTRLEN> buffer{};
  if (inet_ntop(family, raw, buffer.data(), buffer.size()) == nullptr) return "(unprintable)";
  return buffer.data();
}

// The class of a non-public IPv4 address, or nullptr for a public one. `a` is in host order.
const char* Ipv4Class(uint32_t a) {
  auto in = [a](uint32_t prefix, int bits) {
    const uint32_t mask = bits == 0 ? 0 : ~uint32_t{0} << (32 - bits);
    return (a & mask) == prefix;
  };
  if (in(0x00000000, 8)) return "unspecified";  // 0.0.0.0/8, "this network"
  if (in(0x7f000000, 8)) return "loopback";
  if (in(0x0a000000, 8) || in(0xac100000, 12) || in(0xc0a80000, 16)) return "private";
  if (in(0xa9fe0000, 16)) return "link-local";
  if (in(0x64400000, 10)) return "shared (CGNAT)";
  if (in(0xe0000000, 4)) return "multicast";
  if (a == 0xffffffff) return "broadcast";
  // IETF protocol assignments, documentation ranges, benchmarking, and 240/4.
  if (in(0xc0000000, 24) || in(0xc0000200, 24) || in(0xc6336400, 24) || in(0xcb007100, 24) ||
      in(0xc6120000, 15) || in(0xf0000000, 4)) {
    return "reserved";
  }
  return nullptr;
}

Status CheckIpv4(const in_addr& address, const std::string& shown) {
  if (const char* cls = Ipv4Class(ntohl(address.s_addr))) {
    return Status::Invalid("address " + shown + " is " + cls + ", not a public address");
  }
  return Status::OK();
}

Status CheckIpv6(const in6_addr& address) {
  const uint8_t* b = address.s6_addr;
  const std::string shown = FormatAddress(AF_INET6, &address);
  auto zero_prefix = [b](int n) { return std::all_of(b, b + n, [](uint8_t x) { return x == 0; }); };
  auto refuse = [&shown](const char* cls) {
    return Status::Invalid("address " + shown + " is " + cls + ", not a public address");
  };
  // Addresses that carry an IPv4 address are as public as that address.
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  static constexpr uint8_t kNat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
  if (std::memcmp(b, kMapped, 12) == 0 || std::memcmp(b, kNat64, 12) == 0) {
    in_addr v4{};
    std::memcpy(&v4.s_addr, b + 12, 4);
    return CheckIpv4(v4, shown);
  }
  if (zero_prefix(15) && b[15] == 0) return refuse("unspecified");
  if (zero_prefix(15) && b[15] == 1) return refuse("loopback");
  if (zero_prefix(12)) return refuse("reserved");  // deprecated IPv4-compatible ::a.b.c.d
  if ((b[0] & 0xfe) == 0xfc) return refuse("private");
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) return refuse("link-local");
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) return refuse("private");  // site-local fec0::/10
  if (b[0] == 0xff) return refuse("multicast");
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d && b[3] == 0xb8) return refuse("reserved");
  return Status::OK();
}

}  // namespace

Result<std::string> HostKey(std::string_view url) {
  ATFILL_ASSIGN_OR_RETURN(UrlParts parts, ParseUrl(url));
  return parts.scheme + "://" + parts.host + ":" + parts.port;
}

Status CheckPublicAddress(const sockaddr* address, size_t length) {
  if (address == nullptr) return Status::Invalid("no address");
  if (address->sa_family == AF_INET && length >= sizeof(sockaddr_in)) {
    sockaddr_in v4{};
    std::memcpy(&v4, address, sizeof(v4));
    return CheckIpv4(v4.sin_addr, FormatAddress(AF_INET, &v4.sin_addr));
  }
  if (address->sa_family == AF_INET6 && length >= sizeof(sockaddr_in6)) {
    sockaddr_in6 v6{};
    std::memcpy(&v6, address, sizeof(v6));
    return CheckIpv6(v6.sin6_addr);
  }
  return Status::Invalid("address family " + std::to_string(address->sa_family) +
                         " is not IPv4 or IPv6");
}

Status CheckPublicEndpoint(std::string_view url, bool allow_private) {
  ATFILL_ASSIGN_OR_RETURN(UrlParts parts, ParseUrl(url));
  if (allow_private) return Status::OK();
  std::string host = parts.host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    return Status::Unavailable("cannot resolve host '" + host + "' of " + std::string(url) + ": " +
                               gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owned(found, &freeaddrinfo);
  int checked = 0;
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    Status st = CheckPublicAddress(ai->ai_addr, ai->ai_addrlen);
    if (!st.ok()) {
      return Status::Invalid("endpoint " + std::string(url) + " refused: host '" + host +
                             "' resolves to " + st.message());
    }
    ++checked;
  }
  if (checked == 0) {
    return Status::Unavailable("host '" + host + "' of " + std::string(url) +
                               " has no IPv4 or IPv6 address");
  }
  return Status::OK();
}

void AppendPercentEncoded(std::string_view value, std::string* out) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (const char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if ((u >= 'A' && u <= 'Z') || (u >= 'a' && u <= 'z') || (u >= '0' && u <= '9') || u == '-' ||
        u == '.' || u == '_' || u == '~') {
      out->push_back(c);
    } else {
      out->push_back('%');
      out->push_back(kHex[u >> 4]);
      out->push_back(kHex[u & 0xF]);
    }
  }
}

}  // namespace atfill::net
