// The standard stage order, written once. Every verb, the benches, the tests' harness and programs
// that embed atfill fill the slots they use and take the order from here, so an embedded graph
// follows the same write rules as the launcher:
//
//   shard filter - CID verify - lexicon validate - script - account check - live hold - ingest
//   guard
//
// Why this order:
//  * the shard filter first: events of DIDs another process owns cost no work at all;
//  * CID verification before the script: a script sees only records whose bytes match their CID,
//    and a record it rewrites is not verified against a CID it no longer has;
//  * lexicon validation after CID verification (a record whose bytes are not its CID's is not
//    worth checking) and before the script, which sees only records that match their lexicon
//    (with CIDs verified, CidVerify reaches the verdict on its own parse and this slot is empty);
//  * the script before the account check and the hold: a record the script drops is never held or
//    asked about;
//  * the account check before the hold: an account deletion is confirmed with its PDS before it
//    is held or applied;
//  * the live hold before the guard: a held event reaches the guard when it is released, in order
//    with the events after it;
//  * the ingest guard last: its rev and tombstone rules see exactly what the sink will write.
#pragma once

#include <vector>

#include "pipeline/transform.hpp"

namespace atfill::pipeline {

// The stages of one job, each optional (nullptr: not in this job). The transforms are the
// caller's and must outlive the run.
struct StandardStages {
  const Transform* shard_filter = nullptr;   // pipeline::ShardFilter (--shard i/n)
  const Transform* cid_verify = nullptr;     // stages::CidVerify (and the lexicon check)
  const Transform* lexicon = nullptr;        // stages::LexiconValidate (CIDs not verified)
  const Transform* script = nullptr;         // stages::ScriptStage ([scripts])
  const Transform* account_check = nullptr;  // stages::AccountCheck (the live consumer)
  const Transform* live_hold = nullptr;      // stages::LiveHold (the live consumer)
  const Transform* ingest_guard = nullptr;   // stages::IngestGuard

  // The non-null stages in the standard order, as the Engine and RunAsJob take them.
  std::vector<const Transform*> InOrder() const {
    std::vector<const Transform*> out;
    for (const Transform* t :
         {shard_filter, cid_verify, lexicon, script, account_check, live_hold, ingest_guard}) {
      if (t != nullptr) out.push_back(t);
    }
    return out;
  }
};

}  // namespace atfill::pipeline
