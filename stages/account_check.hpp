// The account check: before a live #account "deleted" event purges an account, its PDS is asked
// (through a pipeline::AccountStatusLookup: com.atproto.sync.getRepoStatus, within
// AccountCheckOptions::timeout_ms, the DID resolution included):
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
//
// The stage is asynchronous: a chunk with deletions is handed to the lookup (its questions asked
// at once) and re-enters the graph when every answer is in, so no flow-graph thread waits on a
// PDS. The chunk's events keep their order, and the engine commits it in its place.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "base/status.hpp"
#include "pipeline/account_status.hpp"
#include "pipeline/transform.hpp"

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

class AccountCheck : public pipeline::AsyncTransform {
 public:
  // `lookup` must outlive the stage and every chunk it holds.
  explicit AccountCheck(const pipeline::AccountStatusLookup* lookup,
                        AccountCheckOptions options = {});

  std::string_view name() const override { return "account_check"; }
  // Unordered. A chunk without deletions is done at once (false); one with deletions is handed
  // off (true) and `done` runs on the lookup's thread once the last answer is applied.
  bool Start(pipeline::TransformState* state, pipeline::EventChunk* chunk, bool again,
             Done done) const override;

  // Thread-safe.
  AccountCheckStats stats() const;

 private:
  struct Pending;
  void Finish(Pending* pending) const;

  const pipeline::AccountStatusLookup* lookup_;
  AccountCheckOptions options_;
  mutable std::atomic<uint64_t> checks_{0}, refused_{0}, unconfirmed_{0};
};

}  // namespace atfill::stages
