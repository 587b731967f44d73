// An incremental repo fetch: com.atproto.sync.getRepo?since=REV, the blocks a PDS wrote after
// REV, applied to what the table holds of the repo at REV: a repeated getRepo backfill that costs
// what changed rather than the whole repo ([crawl] incremental). Pure, thread-safe.
//
// What the answer holds (atproto sync): the new signed commit, the MST nodes that changed since
// REV and the record blocks written since; nodes and records unchanged since are left out. So:
// - a key in a node the CAR holds is in the new tree; its record is written when its CID is not
//   the stored one and the CAR holds its block;
// - a stored key is deleted when the walk down the new tree to its place does not find it among
//   nodes the CAR holds: a node of the key's layer (or one below its height) without it, or an
//   empty place; when the walk reaches a node the CAR lacks, the key's place is a subtree
//   unchanged since REV, which holds it unless that subtree moved: a subtree keeps its CID when a
//   key next to it is deleted and its place joins the subtree's, so a stored key there may be gone
//   too. The deleted keys of a greater height than such a subtree's layer that lie in its place
//   split it into segments at REV, and all but the subtree's own segment are gone: when stored
//   keys lie in more than one segment (or a segment reaches beyond the key's collection, which
//   the table may not hold), the answer cannot tell which, and needs_full asks for the whole repo;
//   otherwise the deletes are exact;
// - a key in a held node whose record the CAR lacks and whose stored CID differs (a record written
//   since REV with the bytes of a record older than REV, so not sent again) cannot be written from
//   the answer: needs_full asks for the whole repo.
// The deletes rest on the table matching the repo at REV: a key the table lacks is not found
// here, and `atfill verify` finds what differs anyway.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "atproto/repo.hpp"
#include "base/status.hpp"
#include "pipeline/event.hpp"
#include "pipeline/sink_readers.hpp"
#include "sources/crawl/fetcher.hpp"

namespace atfill::sources {

struct RepoDiff {
  std::string rev;         // the new commit's rev; empty when unchanged
  std::string commit_cid;  // the new commit's CID ("bafy..."); empty when unchanged
  std::string data_cid;    // its MST root
  // The answer holds no commit: nothing was written since REV (a PDS answers since=<its head>
  // with the header's root and no block). No events.
  bool unchanged = false;
  // A key changed since REV whose record the answer does not carry: fetch the whole repo.
  bool needs_full = false;
  // Creates (not stored), updates (stored with another CID), then deletes, each with the new
  // commit's rev, origin crawl, in key order within each kind; only of `collections` (empty = all;
  // NSIDs or "prefix.*").
  std::vector<pipeline::RecordEvent> events;
  // Records left out as in RepoRecords::errors.
  std::vector<pipeline::EventError> errors;
  uint64_t nodes_read = 0;  // MST nodes of the new tree the answer held
};

// Reads a getRepo?since answer of `did` against `stored` (the table's records of the repo), after
// the checks of ReadRepoRecords (the commit's DID, its signature with `signing_key`). On failure
// nothing is returned and *failure says why, as ReadRepoRecords.
Result<RepoDiff> ReadRepoDiff(std::string_view did, std::string_view signing_key,
                              std::string_view car, std::span<const pipeline::StoredRecord> stored,
                              const std::vector<std::string>& collections,
                              const FetchLimits& limits, RepoFailure* failure = nullptr);

// The checks ReadRepoRecords and ReadRepoDiff share: the CAR read (block hashes, the commit), the
// commit's DID and its signature. `car` must outlive the reader. On failure *why says which.
Result<atproto::RepoReader> OpenSignedRepo(std::string_view did, std::string_view signing_key,
                                           std::string_view car, const FetchLimits& limits,
                                           RepoFailure* why);

}  // namespace atfill::sources
