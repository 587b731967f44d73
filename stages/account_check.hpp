// The account check: before a live #account "deleted" event purges an account, its PDS is asked
// (com.atproto.sync.getRepoStatus, within AccountCheckOptions::timeout_ms, the DID resolution
// included):
//  * the PDS says the repo is active: nothing is purged and no account tombstone is left; the event
//    is removed from the chunk and the mismatch is logged (error kind account_status_mismatch,
//    keyed by the DID);
//  * the PDS says anything else (inactive with any status, RepoNotFound): the purge goes ahead;
//  * the PDS cannot be asked (the DID does not resolve, transport failure, timeout, 5xx, an answer
//    that is not a getRepoStatus object): the purge goes ahead, counted as unconfirmed.
// Every deleted account is asked about, not only those that hold records: a wrong delete also
// leaves an account tombstone that refuses the account's later writes, and whether the sink holds
// records is not known for the batches not yet committed. Deletions are rare on the network (a
// request each costs little). Takedowns and suspensions come from the relay's moderation and purge
// without asking. Counters (committed with the batch): account_checks, account_purges_refused,
// account_purges_unconfirmed.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "base/status.hpp"
#include "net/http_client.hpp"
#include "pipeline/transform.hpp"
#include "stages/resolver.hpp"

namespace atfill::stages {

struct AccountCheckOptions {
  // The whole check (resolution and request), milliseconds; 1..600000.
  int64_t timeout_ms = 5000;
  Status Validate() const;
};

struct AccountCheckStats {
  uint64_t checks = 0;       // PDSs asked (or tried)
  uint64_t refused = 0;      // purges not applied: the PDS said active
  uint64_t unconfirmed = 0;  // purges applied because the PDS could not be asked
};

class AccountCheck : public pipeline::Transform {
 public:
  // `resolver` and `http` must outlive the stage.
  AccountCheck(DidResolver* resolver, net::HttpClient* http, AccountCheckOptions options = {});

  std::string_view name() const override { return "account_check"; }
  // Unordered, and an exception to "must not block": a chunk with a deleted account waits for its
  // PDS (at most timeout_ms). Later chunks are still decoded meanwhile; they
  // commit after this one in any case, since the purge must precede them.
  Status Process(pipeline::TransformState* state, pipeline::EventChunk* chunk) const override;

  AccountCheckStats stats() const;

 private:
  DidResolver* resolver_;
  net::HttpClient* http_;
  AccountCheckOptions options_;
  mutable std::atomic<uint64_t> checks_{0}, refused_{0}, unconfirmed_{0};
};

}  // namespace atfill::stages
