// The verifying live source: a relay firehose consumer (com.atproto.sync.subscribeRepos) over the
// WebSocket client (net/websocket.hpp: reconnect with jittered backoff, failover along the hosts).
//
// Where the work runs (docs/architecture.md):
//  * the WebSocket loop thread only queues binary messages;
//  * Read (the engine's reader) frames them into chunks: it reads each message's head (kind, seq,
//    DID, time: PeekFirehoseFrame) and nothing more, attaches the account's signing key to each
//    #commit and #sync, tracks #identity and #account frames, and starts key resolutions and
//    resync getRepos on the HTTP client (nothing blocks on the network). An account whose key is
//    not known yet has its frames wait, in order, while other accounts go on;
//  * Decode (the engine's workers, under its in-flight limit) decodes and verifies every #commit
//    and #sync against the key (sync 1.1: CAR hashes, signature, record blocks, MST inversion onto
//    prevData), makes the commits' events, and reads and verifies resync answers (getRepo CARs);
//  * the source's ordered stage (OrderedStage: "firehose chain", first in the engine's ordered
//    node, after the unordered stages) judges each repo's chain in stream order
//    (sources/firehose/firehose_chain.hpp): applied, stale (a redelivery), or desynchronized, in
//    which case the repo is fetched again and its rows replaced (so records that vanished are
//    deleted) while its commits are held.
// A commit that fails verification is refused: nothing of it lands, it is counted
// (firehose_refused and firehose_refused_<kind>) and logged in the job's error log (kind its
// verification kind, key "seq <seq> <did>"); every valid frame around it still lands.
//
// A repo whose account is not active (an #account frame says so, or getRepo answers
// RepoDeactivated, RepoTakendown, RepoSuspended or RepoNotFound) is not resynced until an
// #account frame says it is active again (or an #identity frame moves it): counted
// (firehose_resync_deferred) and shown (FirehoseStats::inactive), not retried.
//
// Cursor: the relay's seq, as the applied watermark: a chunk's resume cursor is the newest seq
// such that every frame at or below it was taken into a chunk (frames waiting for a key hold it
// back). A restart asks the relay for the events after it (a repeat would be stale in the chain
// anyway). Repos a crash left desynchronized are resynced at Seek.
//
// Counters (job counters): firehose_frames, firehose_verified (commits that verified),
// firehose_refused(_<kind>), firehose_bad_frames, firehose_applied, firehose_stale,
// firehose_desync, firehose_resynced, firehose_failed (resyncs that failed and are tried again),
// firehose_resync_deferred. Desyncs and resyncs are logged (repo_desync, resync_failed,
// resync_deferred) but are not failed records.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "net/http_client.hpp"
#include "net/websocket.hpp"
#include "pipeline/source.hpp"
#include "sources/crawl/fetcher.hpp"
#include "sources/crawl/resolver.hpp"
#include "state/kv_store.hpp"

namespace atfill::sources {

struct FirehoseOptions {
  // Relays (or PDSs) tried in order (failover): "wss://bsky.network" or "ws://127.0.0.1:2583";
  // the path /xrpc/com.atproto.sync.subscribeRepos is appended. At least one. The operator's, so
  // reached wherever they point.
  std::vector<std::string> hosts;
  // Commit collections indexed (NSIDs or "prefix.*"); empty = all. The firehose carries every
  // collection, so the filter is applied here (commits are verified whole either way).
  std::vector<std::string> collections;
  // Accounts indexed; empty = all. Others' frames are read and skipped.
  std::vector<std::string> dids;
  // Where a consumer without a saved cursor starts: 0 = the live tip, else after this seq.
  uint64_t start_seq = 0;
  // Largest message accepted, bytes.
  uint64_t max_message_bytes = uint64_t{8} << 20;
  // Messages received and not yet read, bytes, before the connection is dropped and resumed
  // later from the newest seq read.
  uint64_t max_buffered_bytes = uint64_t{256} << 20;
  // Messages per chunk at most.
  uint32_t chunk_messages = 1024;
  // How long Read waits for input before it returns a tick chunk, milliseconds.
  int64_t tick_ms = 50;
  // End the input after this long without a message nor an answer that moved the job on (a key
  // resolved, a repo fetched), whatever still waits, milliseconds; 0 = never. For tests and
  // benchmarks.
  int64_t idle_exit_ms = 0;
  // Resolution of DIDs to their signing key and PDS (the crawl's [resolver] and [net]).
  ResolverOptions resolver;
  net::HttpClientOptions http;
  // Resyncs: getRepo requests in flight at most; a failed one is tried again after
  // resync_retry_ms (milliseconds); records larger than the limits are left out (logged).
  uint32_t max_resyncs_in_flight = 8;
  int64_t resync_retry_ms = 30'000;
  FetchLimits limits;
  // Largest getRepo answer, bytes.
  uint64_t max_repo_bytes = uint64_t{512} << 20;
  // Commits held per desynchronized repo (FirehoseChainOptions::max_held_per_repo).
  size_t max_held_per_repo = 1000;
  // Frames waiting for their account's signing key (being resolved), bytes: at this much, no new
  // message is read until keys arrive; the connection's buffer (max_buffered_bytes) takes the
  // stream meanwhile. The frames of one read (chunk_messages) may pass it.
  uint64_t max_waiting_bytes = uint64_t{64} << 20;
  net::WebSocketOptions websocket;

  Status Validate() const;
};

struct FirehoseStats {
  uint64_t messages = 0;     // received
  uint64_t bytes = 0;        // received
  uint64_t connections = 0;  // upgrades that succeeded
  uint64_t connection_failures = 0;
  uint64_t last_seq = 0;  // the newest seq read
  uint64_t verified = 0;  // commits that verified
  uint64_t refused = 0;   // commits and syncs that did not
  uint64_t resyncs_started = 0;
  uint64_t peak_waiting_bytes = 0;  // the most the frames waiting for keys held at once
  uint64_t desynchronized = 0;      // repos whose commits are held for their resync now
  uint64_t inactive = 0;            // desynchronized repos whose account is not active now
  std::string host;
  std::string last_error;
};

class FirehoseSource : public pipeline::Source {
 public:
  // `kv` holds the chains, the resolver cache and nothing else of ours; it must outlive the
  // source. Starts the WebSocket and HTTP clients; the connection opens at Seek.
  static Result<std::unique_ptr<FirehoseSource>> Create(FirehoseOptions options,
                                                        state::KvStore* kv);
  ~FirehoseSource() override;

  // `resume_cursor`: "" (start_seq or the live tip) or "<seq>:<time_us>" as Read writes it (the
  // relay's time of that frame, shown by atfill status; "<seq>" alone is accepted).
  Status Seek(const std::string& resume_cursor) override;
  // One thread, in order (the engine's reader). See the header comment.
  Result<bool> Read(pipeline::EventChunk* chunk) override;
  // On the engine's workers: decoding and verification.
  void Decode(pipeline::EventChunk* chunk) const override;
  // The chains, judged in stream order.
  const pipeline::Transform* OrderedStage() const override;
  std::string Describe() const override;
  state::StopReason Unfinished() const override;
  // On the sink thread: the chain's links through that chunk are in state.
  void Committed(uint64_t through_seq) override;

  // The collections to index from the next chunk read on (FirehoseOptions::collections' rules;
  // not empty). The firehose carries every collection, so nothing is asked of the relay: chunks
  // read before the change keep the filter they were read under, so what lands of a removed
  // collection is the stream up to one point. Thread-safe.
  Status SetCollections(std::vector<std::string> collections);
  std::vector<std::string> collections() const;
  bool Consumes(std::string_view collection) const;
  // Waits at most `timeout` until every chunk read before the last SetCollections is committed
  // (Unavailable otherwise).
  Status WaitFilterApplied(std::chrono::milliseconds timeout) const;

  // Thread-safe snapshot.
  FirehoseStats stats() const;

 private:
  struct Impl;
  explicit FirehoseSource(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace atfill::sources
