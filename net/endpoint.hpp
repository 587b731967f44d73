// Endpoint checks: which URLs atfill may talk to (the SSRF guard) and how requests are grouped
// into hosts for per-host limits.
#pragma once

#include <string>
#include <string_view>

#include "base/status.hpp"

struct sockaddr;

namespace atfill::net {

// The host key of an http(s) URL: "scheme://host:port" with the scheme and host lower-cased and
// the port made explicit ("https://pds.example.com:443", "http://127.0.0.1:8080"; an IPv6 host
// keeps its brackets). Every request with the same key shares one host's limits, cooldown and
// failure count. Invalid when the URL does not parse, has no host, or is not http or https.
Result<std::string> HostKey(std::string_view url);

// OK when `address` (an AF_INET or AF_INET6 socket address of `length` bytes) is a public unicast
// address. Otherwise Invalid naming the address and its class: unspecified, loopback, private
// (10/8, 172.16/12, 192.168/16, fc00::/7), link-local (169.254/16, fe80::/10), shared CGNAT
// (100.64/10), multicast, broadcast or reserved. IPv4-mapped (::ffff:a.b.c.d) and NAT64
// (64:ff9b::/96) IPv6 addresses are judged by the IPv4 address they carry. Pure; thread-safe.
Status CheckPublicAddress(const sockaddr* address, size_t length);

// The SSRF guard for endpoints that come from the network (DID documents, configs): OK when `url`
// is http(s) with a host and every address the host resolves to passes CheckPublicAddress.
// With `allow_private` only the URL shape is checked (tests and simnet run on loopback).
// Blocks on DNS (getaddrinfo) for host names, so call it off the flow graph's threads; IP
// literals resolve without DNS. HttpClient also checks the address it actually connects to (see
// HttpClientOptions::allow_private_addresses), so a name that resolves differently later (DNS
// rebinding) is still refused. Thread-safe.
Status CheckPublicEndpoint(std::string_view url, bool allow_private);

// The User-Agent atfill's clients send: "atfill/<version> (+https://github.com/atfill)", with
// the version this library was built as when `version` is empty.
std::string DefaultUserAgent(std::string_view version);

// Appends `value` percent-encoded for a URL query (every byte but A-Z a-z 0-9 - . _ ~).
void AppendPercentEncoded(std::string_view value, std::string* out);

}  // namespace atfill::net
