// The serial half of a relay firehose consumer: each repo's commit chain (atproto sync 1.1). A
// verified commit applies when its prevData is the data CID of the repo's last applied commit; a
// rev not after the applied one is stale (a redelivery); anything else, and a #sync, marks the
// repo desynchronized. A desynchronized repo's commits are held (in memory, in arrival order)
// until its resync, a fresh getRepo, is applied: the resync replaces the repo's rows (a sink
// resync: rows older than the fetched rev go, the fetched records follow as creates, so records
// that vanished are deleted), sets the link to the fetched commit, and the held commits newer than
// it are judged again in order. A crash loses the held commits but not the desynchronized mark
// (state), and the resync after the restart fetches a repo at least as new as them.
//
// Counters (EventChunk::counters): firehose_applied, firehose_stale, firehose_desync,
// firehose_resynced, firehose_failed (resyncs that failed; the repo stays desynchronized and is
// resynced again later). A desync and a failed resync are also entries of the job's error log
// (kinds repo_desync, resync_failed; key the DID).
//
// Not thread-safe: one caller, in the order of the stream (seq order).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "pipeline/chunk.hpp"
#include "sources/firehose/firehose_frames.hpp"
#include "state/repo_chains.hpp"

namespace atfill::sources {

struct FirehoseChainOptions {
  // Collections indexed (NSIDs or "prefix.*"); empty = all. Ops on others are not emitted, and a
  // resync replaces only these.
  std::vector<std::string> collections;
  // Commits held per desynchronized repo at most; past it the oldest are dropped (the resync
  // fetches a repo newer than them anyway).
  size_t max_held_per_repo = 1000;
};

// What a verified #commit says of its repo's chain: nothing else of the frame is needed to judge
// it.
struct ChainCommit {
  int64_t seq = 0;
  std::string repo;
  std::string rev;
  std::string prev_data;  // the MST root before it, as text; empty when the frame has none
  std::string data;       // the MST root after it (the signed commit's data)
};

// A resync's fetched repo: the signed commit's rev and MST root, and its records (creates):
// sources/crawl/fetcher.hpp's ReadRepoRecords gives them as rev, data_cid and records.
struct FetchedRepo {
  std::string rev;
  std::string data;  // the MST root CID, as text
  std::vector<pipeline::RecordEvent> records;
};

class FirehoseChain {
 public:
  // `chains` reads the links committed in state; it must outlive this object.
  FirehoseChain(const state::RepoChains* chains, FirehoseChainOptions options);

  // A verified commit. Appends its events (apply), or nothing (stale, held), with the link and
  // counter. *resync is set when the repo has just become desynchronized: the caller fetches it
  // and calls Resynced or ResyncFailed. Errors are state read failures only.
  Status Commit(const FirehoseCommit& frame, const VerifiedCommit& verified,
                pipeline::EventChunk* chunk, bool* resync);
  // The same for a commit whose events were made (FirehoseCommitEvents) and filtered by
  // collection already: they are appended, held or dropped whole.
  Status Commit(ChainCommit commit, std::vector<pipeline::Event> events,
                pipeline::EventChunk* chunk, bool* resync);
  // A verified commit whose records could not be made into events (a record block that is not
  // valid atproto data): the repo is behind its chain and is resynced.
  void Unappliable(std::string_view did, int64_t seq, pipeline::EventChunk* chunk, bool* resync);
  // A verified #sync: the repo is desynchronized (its chain restarts from a fetched repo).
  Status Sync(const FirehoseSync& frame, pipeline::EventChunk* chunk, bool* resync);
  // The fetched repo of a desynchronized DID: the sink resync event and its records, the new link,
  // then the held commits newer than it, judged again (one may desynchronize the repo again:
  // *resync).
  Status Resynced(std::string_view did, FetchedRepo repo, pipeline::EventChunk* chunk,
                  bool* resync);
  // The same for a fetched repo already made into its events: the resync marker and the records
  // (as they came through the stages before this one).
  Status Resynced(std::string_view did, std::string rev, std::string data,
                  std::vector<pipeline::Event> events, pipeline::EventChunk* chunk, bool* resync);
  void ResyncFailed(std::string_view did, std::string_view why, pipeline::EventChunk* chunk);

  // Chunks through `through_seq` are durable: the links they wrote are now in state.
  void Committed(uint64_t through_seq);

  // Repos desynchronized now (awaiting their resync).
  size_t desynchronized() const { return held_.size(); }

 private:
  struct Held {
    ChainCommit commit;
    std::vector<pipeline::Event> events;
  };
  struct Pending {
    state::RepoChain link;
    uint64_t chunk_seq;
  };
  Result<std::optional<state::RepoChain>> Link(std::string_view did) const;
  void SetLink(std::string_view did, state::RepoChain link, pipeline::EventChunk* chunk);
  void Desync(std::string_view did, std::string why, pipeline::EventChunk* chunk);
  Status Judge(ChainCommit commit, std::vector<pipeline::Event> events, pipeline::EventChunk* chunk,
               bool* resync);

  const state::RepoChains* chains_;
  FirehoseChainOptions options_;
  // Links written by chunks not yet durable, newest per repo.
  std::map<std::string, Pending, std::less<>> pending_;
  // The held commits of each desynchronized repo, oldest first.
  std::map<std::string, std::deque<Held>, std::less<>> held_;
};

}  // namespace atfill::sources
