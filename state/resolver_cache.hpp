// DID -> PDS resolution cache with an expiry time, so a restarted job does not resolve every DID
// again.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.hpp"
#include "state/kv_store.hpp"

namespace atfill::state {

struct ResolvedDid {
  std::string pds_endpoint;  // e.g. "https://morel.us-east.host.bsky.network"
  std::string handle;        // from alsoKnownAs; may be empty
  std::string signing_key;   // the #atproto verification method (multibase); may be empty
  int64_t resolved_at_us = 0;
  int64_t expires_at_us = 0;  // unix µs; Get treats the entry as absent from then on
  bool operator==(const ResolvedDid&) const = default;
};

// Stateless over a KvStore it does not own (which must outlive it); thread-safe as the store is.
// Layout: resolver family did -> record.
class ResolverCache {
 public:
  explicit ResolverCache(KvStore& kv) : kv_(kv) {}

  void Put(WriteBatch* batch, std::string_view did, const ResolvedDid& entry);
  // Put in a batch of its own, written now.
  Status Store(std::string_view did, const ResolvedDid& entry);
  // nullopt when absent or expired (expires_at_us <= now_us).
  Result<std::optional<ResolvedDid>> Get(std::string_view did, int64_t now_us);
  void Remove(WriteBatch* batch, std::string_view did);
  // Deletes every expired entry (a full scan; run rarely) and returns how many.
  Result<uint64_t> SweepExpired(int64_t now_us);

 private:
  KvStore& kv_;
};

}  // namespace atfill::state
