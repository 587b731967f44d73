// A relay firehose for tests and benchmarks: com.atproto.sync.subscribeRepos over WebSocket on
// its own 127.0.0.1 port, serving a log of frames built from a simnet network's repos.
//
// The log (BuildFirehoseLog) writes each active account's repo, as its PDS serves it with
// getRepo, in a chain of signed commits (sources/firehose/firehose_frames.hpp BuildFirehoseCommit):
// the records are created a few per commit, one record is first written with another value and then
// updated to its served one, and records that the served repo does not hold are created and then
// deleted. Every commit's rev is below the served repo's, so a getRepo resync is newer than all of
// them. The accounts' commits interleave; seqs count from 1.
//
// Faults, each drawn from the seed and counted in FirehoseLog:
//   drop_share           a commit is left out of the stream (never an account's last): the next
//                        commit's prevData breaks the chain, so the consumer must resync the repo
//   sync_share           an account gets a #sync frame (its served commit) after its commits
//   bad_signature_share  a commit is signed with another key (a consumer must refuse it)
//   tampered_share       a record block of a commit has a byte flipped (its CID no longer
//                        matches: refused)
// A refused commit breaks its repo's chain the same way as a dropped one. After all of it, the
// served repos are the truth (Simnet::Truth()).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/bytes.hpp"
#include "base/status.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill::simnet {

struct FirehoseLogOptions {
  uint64_t seed = 1;
  uint32_t records_per_commit = 3;
  // Records created and later deleted per account.
  uint32_t ephemeral_records = 1;
  double drop_share = 0;
  double sync_share = 0;
  double bad_signature_share = 0;
  double tampered_share = 0;
};

struct FirehoseLogFrame {
  int64_t seq = 0;
  std::string did;
  Bytes bytes;  // the binary WebSocket message
};

struct FirehoseLog {
  std::vector<FirehoseLogFrame> frames;  // in seq order (dropped commits are not there)
  uint64_t commits = 0;                  // #commit frames in the log
  uint64_t dropped = 0;
  uint64_t syncs = 0;
  uint64_t bad_signatures = 0;
  uint64_t tampered = 0;
  // Accounts whose chain a consumer sees break (a drop, a #sync or a refused commit).
  std::vector<std::string> broken_dids;
};

Result<FirehoseLog> BuildFirehoseLog(const Network& net, const FirehoseLogOptions& options);

struct FirehoseRelayOptions {
  // Each connection closes its socket without a close frame after writing this many frames
  // (0 = never).
  uint64_t disconnect_after_frames = 0;
  // Frames written per second per connection (0 = as fast as the connection takes them).
  double frames_per_second = 0;
};

// Serves `log` until destroyed: GET /xrpc/com.atproto.sync.subscribeRepos?cursor=N sends the
// frames after seq N (all of them without a cursor) and then stays open, idle. One thread per
// connection; the destructor closes every connection and joins them.
class FirehoseRelay {
 public:
  static Result<std::unique_ptr<FirehoseRelay>> Start(std::vector<FirehoseLogFrame> frames,
                                                      FirehoseRelayOptions options = {});
  ~FirehoseRelay();
  FirehoseRelay(const FirehoseRelay&) = delete;
  FirehoseRelay& operator=(const FirehoseRelay&) = delete;

  std::string url() const;  // "ws://127.0.0.1:PORT"
  uint64_t connections() const;
  uint64_t frames_sent() const;

 private:
  struct Impl;
  explicit FirehoseRelay(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace atfill::simnet
