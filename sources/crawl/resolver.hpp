// The crawl's resolver: DID -> PDS endpoint (and handle and signing key) from the DID document,
// via the PLC directory for did:plc and the DID's own host for did:web, cached with a TTL in
// state.
//
// Where the document comes from:
// - did:plc:<24 base32 chars>   GET {plc_url}/{did}
// - did:web:<host>[%3A<port>]   GET https://<host>[:<port>]/.well-known/did.json, except that
//   a host named "localhost" or "*.localhost" is fetched over plain http, and only when
//   ResolverOptions allows loopback endpoints (simnet's did:web DIDs are
//   "did:web:web-0001.localhost%3A<port>"); without that permission such a DID is bad_endpoint.
//   Path-based did:web (a ':' in the identifier) is invalid_did, as atproto does not allow it.
// - every other method is unsupported_did_method.
//
// Which endpoints are refused (bad_endpoint), in the document's #atproto_pds service and in a
// did:web host: a URL that is not http(s) or has no host; a host that is an IP literal of a
// loopback, private, link-local or otherwise non-public address (net::CheckPublicAddress); a host
// named "localhost" or "*.localhost". allow_loopback_endpoints lifts the refusal for loopback
// literals and localhost names; allow_private_endpoints lifts it for every non-public literal.
// The resolver never resolves host names (its work runs on the HttpClient's loop thread, which
// must not block on DNS), so a host NAME that resolves to a private address passes here and is
// refused when a connection is opened, by the HttpClient's connect-time guard
// (HttpClientOptions::allow_private_addresses = false), as a failure of that request.
//
// Every failure is a value (ResolveOutcome with an error kind and a sentence), never a crash and
// never a failure of the job: it belongs to the unit being resolved.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.hpp"
#include "net/http_client.hpp"
#include "state/resolver_cache.hpp"

namespace atfill::sources {

struct ResolverOptions {
  // The PLC directory's base URL (http or https, no query); a trailing '/' is ignored.
  std::string plc_url = "https://plc.directory";
  // How long a resolution stays in the cache, in seconds; 0 = no caching (neither read nor
  // written).
  int64_t cache_ttl_s = 24 * 3600;
  // Accept loopback endpoints: IP literals 127.0.0.0/8 and ::1, and the names "localhost" and
  // "*.localhost" (for which did:web documents are fetched over http). Tests and simnet set it.
  // Private (10/8, 192.168/16, ...) and link-local literals stay refused, so simnet's
  // private_endpoint fault (http://10.0.0.1) is still bad_endpoint.
  bool allow_loopback_endpoints = false;
  // Accept every non-public IP literal (private, link-local, CGNAT, ...) and loopback as above:
  // for networks whose PDSs live on a private network.
  bool allow_private_endpoints = false;
  // Time allowed per attempt of a document request, in milliseconds; 1..600000.
  int64_t timeout_ms = 10'000;
  // Largest DID document accepted, in bytes; 1..16 MiB.
  uint64_t max_document_bytes = 256 * 1024;
  // The service whose endpoint is resolved and the verification method whose key is read: a
  // PDS's by default; a labeler's ("#atproto_labeler", "#atproto_label") for the label
  // subscription, which then reads ResolvedDid::pds_endpoint as the labeler's endpoint. A
  // resolver for other fragments must not share a cache with one for the defaults.
  std::string service_id = "#atproto_pds";
  std::string key_id = "#atproto";

  // OK, or Invalid naming the first field out of range and its value.
  Status Validate() const;
};

// What a resolution ended with. On success `doc` is set and error_kind is empty. On failure
// error_kind is one of:
//   invalid_did             not a DID, or a did:plc / did:web identifier of the wrong shape
//   unsupported_did_method  a DID method other than plc and web
//   did_not_found           the PLC directory or the did:web host answered 404 or 410
//   bad_did_document        not JSON, not an object, `id` is not the DID, larger than
//                           max_document_bytes
//   no_pds_endpoint         no #atproto_pds service
//   bad_endpoint            the endpoint (or the did:web host) is refused, see the top of the file
//   resolve_failed          the request failed: a transport failure or 5xx/408/429 after the
//                           HttpClient's retries, or the client shut down (retryable); any other
//                           answer (an unexpected 4xx, a 3xx) is not retryable
//   invalid_options         the resolver was built with options that fail Validate()
struct ResolveOutcome {
  // pds_endpoint (no trailing '/'), handle (from alsoKnownAs; may be empty), signing_key (the
  // #atproto verification method's publicKeyMultibase; may be empty), resolved_at_us,
  // expires_at_us (resolved_at_us + cache_ttl_s).
  std::optional<state::ResolvedDid> doc;
  std::string error_kind;
  // A sentence naming the DID and the reason; empty on success.
  std::string message;
  // True when resolving again later may succeed.
  bool retryable = false;
  // True when `doc` came from the cache without a request.
  bool from_cache = false;

  bool ok() const { return doc.has_value(); }
};

// Parses `json`, the DID document of `did` (pure, thread-safe, never throws):
// - `id` must equal `did` exactly;
// - the service whose `id` is "#atproto_pds" or "<did>#atproto_pds" gives the endpoint (its
//   `type`, normally AtprotoPersonalDataServer, is not checked); its serviceEndpoint must be a
//   string URL accepted by the endpoint rules above, and loses any trailing '/';
// - the verificationMethod whose `id` is "#atproto" or "<did>#atproto" gives signing_key from
//   publicKeyMultibase (empty when absent);
// - the first alsoKnownAs entry "at://<valid handle>" gives the handle (empty when none).
// resolved_at_us = now_us, expires_at_us = now_us + cache_ttl_s seconds.
ResolveOutcome ParseDidDocument(std::string_view did, std::string_view json,
                                const ResolverOptions& options, int64_t now_us);

// The endpoint rules above applied to one URL, without DNS: OK or Invalid with the reason.
Status CheckResolvedEndpoint(std::string_view url, const ResolverOptions& options);

// Counters since construction.
struct ResolverStats {
  uint64_t lookups = 0;       // Resolve() calls
  uint64_t cache_hits = 0;    // calls answered from the cache
  uint64_t coalesced = 0;     // calls that joined a request already in flight for the DID
  uint64_t fetched = 0;       // document requests submitted
  uint64_t failures = 0;      // calls that completed with an error
  uint64_t cache_errors = 0;  // cache reads or writes that failed (a read error counts as a miss)
};

class DidResolver {
 public:
  // `http` must not be null and must outlive the resolver; `cache` may be null (no persistent
  // cache) and must outlive every resolution in flight. The resolver itself may be destroyed
  // with resolutions in flight: their `done` still runs when the HttpClient completes them (at the
  // latest when it shuts down). `now_us` is the unix clock in microseconds (empty = the system
  // clock); it dates cache entries and decides expiry. `options` should pass Validate(); if not,
  // every Resolve() fails with invalid_options.
  DidResolver(net::HttpClient* http, state::ResolverCache* cache, ResolverOptions options,
              std::function<int64_t()> now_us = nullptr);
  ~DidResolver();
  DidResolver(const DidResolver&) = delete;
  DidResolver& operator=(const DidResolver&) = delete;

  // Resolves `did` and calls `done` exactly once: inline on the caller's thread for a cache hit
  // and for a failure decided before any request (invalid DID, unsupported method, refused
  // did:web host, invalid options); otherwise on the HttpClient's loop thread, so `done` must be
  // cheap, must not block and must not throw. Thread-safe. Concurrent resolutions of one DID
  // share one request (each caller gets its own copy of the outcome). The cache is read on the
  // caller's thread; a successful resolution is written to it (expires_at = now + ttl) on the
  // loop thread before `done` runs. A cached entry whose endpoint the current options refuse is
  // ignored and the DID is fetched again. Failures are never cached.
  void Resolve(const std::string& did, std::function<void(ResolveOutcome)> done);

  // Thread-safe snapshot.
  ResolverStats stats() const;
  const ResolverOptions& options() const;

 private:
  class Core;
  net::HttpClient* const http_;
  // Shared with the callbacks of requests in flight.
  const std::shared_ptr<Core> core_;
};

}  // namespace atfill::sources
