// pipeline::AccountStatusLookup over the network: resolves the DID (PLC directory or did:web,
// with the resolver's cache), then asks its PDS com.atproto.sync.getRepoStatus, all on the
// HttpClient's event loop.
#pragma once

#include <cstdint>
#include <string>

#include "net/http_client.hpp"
#include "pipeline/account_status.hpp"
#include "sources/crawl/resolver.hpp"

namespace atfill::sources {

class PdsAccountStatus : public pipeline::AccountStatusLookup {
 public:
  // `resolver` and `http` must outlive every lookup in flight.
  PdsAccountStatus(sources::DidResolver* resolver, net::HttpClient* http)
      : resolver_(resolver), http_(http) {}

  // The answer comes on the HttpClient's loop thread (inline for a DID that cannot resolve).
  // `timeout_ms` bounds the whole lookup, the DID's resolution included: when it passes with no
  // answer, the answer is kUnknown at once ("no answer within N ms (resolving the DID)" names the
  // step), and whatever answers later is ignored.
  void Lookup(const std::string& did, int64_t timeout_ms, Done done) const override;

 private:
  struct Pending;

  sources::DidResolver* resolver_;
  net::HttpClient* http_;
};

}  // namespace atfill::sources
