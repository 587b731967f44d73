// simnet's labeler (when SimnetOptions::labeler.labels > 0): its log here, its host in
// labeler_server.hpp. Its DID (LabelerLog::did, a did:plc) is served by plc.localhost with the
// service #atproto_labeler (http://labeler.localhost:PORT) and the verification method
// #atproto_label (a secp256k1 key derived from the seed). It serves
//   GET /xrpc/com.atproto.label.subscribeLabels?cursor=N   a WebSocket of DAG-CBOR frames
// one #labels frame per seq 1..labels, generated from the seed over the network's accounts:
// labels on accounts and on record URIs, negations of earlier labels, labels that expired long
// ago and labels that expire in 2099, and labels whose signature is made with another key. With
// a cursor the stream replays from seq cursor+1 (0: the whole history), then stays open idle;
// without one it sends only what is published later (nothing: the log is published at once);
// a cursor past the last seq gets an error frame FutureCursor and the connection closes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "atproto/crypto.hpp"
#include "base/bytes.hpp"
#include "base/status.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill::simnet {

// One label the labeler holds in force after its whole log (expired ones included: the caller
// decides what has expired), as atfill's atfill_labels view should show it when not expired.
struct LabelTruth {
  std::string uri;
  std::string val;
  std::string cts;
  std::string exp;  // empty when none
  int64_t exp_us = 0;
};

// The generated log: pure data.
class LabelerLog {
 public:
  static Result<std::unique_ptr<LabelerLog>> Generate(const Network& net,
                                                      const LabelerOptions& options);

  const std::string& did() const { return did_; }
  const atproto::PrivateKey& key() const { return *key_; }
  // The frame of `seq` (1..size()).
  const Bytes& frame(uint64_t seq) const { return frames_[seq - 1]; }
  uint64_t size() const { return frames_.size(); }
  // The DID document (endpoint: the labeler host's URL).
  std::string DidDocument(const std::string& endpoint) const;
  // The labels in force after frames 1..through_seq (signed correctly), sorted by (uri, val).
  std::vector<LabelTruth> Truth(uint64_t through_seq = UINT64_MAX) const;
  // How many frames of each kind the log holds.
  uint64_t negations = 0, expired = 0, expiring = 0, bad_signatures = 0;

  // What frame seq (1-based) carries: entries()[seq - 1].
  struct Entry {
    std::string uri, val, cts, exp;
    int64_t exp_us = 0;
    bool neg = false;
    bool bad_signature = false;
  };
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::string did_;
  std::optional<atproto::PrivateKey> key_;
  std::vector<Entry> entries_;
  std::vector<Bytes> frames_;
};

}  // namespace atfill::simnet
