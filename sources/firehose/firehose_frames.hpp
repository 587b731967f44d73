// Relay firehose frames (com.atproto.sync.subscribeRepos): each WebSocket binary message is two
// DAG-CBOR items back to back, a header {op, t} and a body. op 1 is a message whose `t` names the
// body's type (#commit, #sync, #identity, #account, #info); op -1 is an error {error, message}
// after which the server closes the connection.
//
// A #commit is verified as atproto sync 1.1 describes (VerifyFirehoseCommit): the signed commit
// in its blocks, the record blocks of its ops, and the ops against the commit's MST by inverting
// them onto the partial tree the blocks carry and reaching `prevData`.
//
// Every decoder and check turns bad input into an error, never a crash: a Status naming the frame
// (its seq and repo when they were read) and the reason, and a short error kind for the job's
// error log and the counters:
//   decoding (DecodeFirehoseFrame):
//     bad_cbor        the header or the body is not DAG-CBOR, or bytes follow the body
//     bad_header      the header is not {op: 1, t: text} nor {op: -1}
//     unknown_type    a message type this decoder does not know (consumers skip it)
//     bad_frame       a field of the wrong type, an op of the wrong shape, frame_too_large
//     missing_field   a field the lexicon requires is absent (seq, repo, rev, commit, ...)
//     bad_seq         seq <= 0
//     invalid_did, invalid_rev, invalid_path, unknown_action
//   verification (VerifyFirehoseCommit, VerifyFirehoseSync):
//     too_big         a commit flagged tooBig (its blocks are incomplete; resync the repo)
//     bad_car         `blocks` is not a CAR, or a block does not hash to its CID
//     no_commit_block the commit CID's block is not among the blocks
//     bad_commit      the commit block does not decode, or names another DID or rev
//     bad_signature   the commit's signature does not verify with the account's key
//     bad_op          an op breaks the sync 1.1 rules (a create with a prev, an update or delete
//                     without one, two ops on one path)
//     missing_record  a create's or update's record block is not among the blocks
//     op_mismatch     the commit's tree does not hold what an op says it wrote
//     incomplete_proof the blocks lack an MST node the inversion needs
//     bad_mst         an MST node is malformed
//     no_prev_data    the commit has no prevData to check the inversion against (a repo's
//                     first commit, without since, may have none: its ops must invert onto
//                     the empty tree)
//     inversion_mismatch the ops inverted onto the new tree do not reach prevData
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "atproto/car.hpp"
#include "atproto/cid.hpp"
#include "atproto/crypto.hpp"
#include "atproto/repo.hpp"
#include "base/bytes.hpp"
#include "base/status.hpp"
#include "pipeline/event.hpp"

namespace atfill::sources {

// The largest frame DecodeFirehoseFrame accepts, in bytes: a commit's blocks may hold 2,000,000
// bytes (the lexicon's maxLength) plus up to 200 ops and the fields around them.
inline constexpr size_t kMaxFirehoseFrameBytes = 5u << 20;

enum class FirehoseAction : uint8_t { kCreate, kUpdate, kDelete };

struct FirehoseOp {
  FirehoseAction action = FirehoseAction::kCreate;
  std::string path;                  // "collection/rkey", a valid MST key
  std::optional<atproto::Cid> cid;   // the record after the op; null for a delete
  std::optional<atproto::Cid> prev;  // the record before (sync 1.1: updates and deletes)
};

struct FirehoseCommit {
  int64_t seq = 0;
  std::string repo;   // the DID
  std::string rev;    // the commit's rev (a TID)
  std::string since;  // the previous commit's rev; empty when null
  atproto::Cid commit;
  Bytes blocks;  // a CAR: the commit block, the MST nodes the ops touch, the records written
  std::vector<FirehoseOp> ops;
  std::optional<atproto::Cid> prev_data;  // the MST root before this commit
  bool too_big = false;
  bool rebase = false;
  std::string time;  // when the relay saw it (RFC 3339)
};

// The repo's state was reset (a migration, a broken chain): consumers resync it.
struct FirehoseSync {
  int64_t seq = 0;
  std::string did;
  std::string rev;
  Bytes blocks;  // a CAR holding the signed commit
  std::string time;
};

struct FirehoseIdentity {
  int64_t seq = 0;
  std::string did;
  std::string handle;  // empty when absent
  std::string time;
};

struct FirehoseAccount {
  int64_t seq = 0;
  std::string did;
  bool active = true;
  std::string status;  // empty when absent
  std::string time;
};

// Advisory (OutdatedCursor, ...); carries no seq.
struct FirehoseInfo {
  std::string name;
  std::string message;
};

// An error frame (op -1): terminal.
struct FirehoseError {
  std::string name;  // FutureCursor, ConsumerTooSlow, ...
  std::string message;
};

enum class FirehoseKind : uint8_t { kCommit, kSync, kIdentity, kAccount, kInfo, kError };
std::string_view FirehoseKindName(FirehoseKind kind);

struct FirehoseFrame {
  // In FirehoseKind order.
  using Payload = std::variant<FirehoseCommit, FirehoseSync, FirehoseIdentity, FirehoseAccount,
                               FirehoseInfo, FirehoseError>;
  Payload payload;

  FirehoseKind kind() const { return static_cast<FirehoseKind>(payload.index()); }
  // The relay's seq (the cursor), 0 for info and error frames.
  int64_t seq() const;
  // The repo the frame is about; empty for info and error frames.
  std::string_view did() const;
};

// Decodes one binary message. Unknown body fields are ignored; the fields the lexicon requires
// are checked (rebase and blobs, which sync 1.1 retired, are optional). *frame is unspecified
// after an error. Thread-safe.
Status DecodeFirehoseFrame(ByteView bytes, FirehoseFrame* frame, std::string* error_kind);

// What a reader needs of a message to route it, read without decoding its blocks or ops: its
// kind and, for #commit, #sync, #identity and #account, seq, DID and time.
struct FirehoseHead {
  FirehoseKind kind = FirehoseKind::kInfo;
  int64_t seq = 0;
  std::string did;
  std::string time;
};

// Reads the head of one binary message: the header, then only the body's top-level seq, repo
// (#commit) or did, and time, skipping every other field by its length. False for anything it
// cannot read so (info and error frames, unknown types, malformed input): the caller decodes such
// a message with DecodeFirehoseFrame, which says what is wrong. A message it reads may still fail
// DecodeFirehoseFrame (a field of the wrong shape further in). Thread-safe.
bool PeekFirehoseFrame(ByteView bytes, FirehoseHead* head);

// One record an op wrote, as the verified frame holds it.
struct VerifiedOp {
  FirehoseAction action = FirehoseAction::kCreate;
  std::string_view collection;  // views into the FirehoseOp's path
  std::string_view rkey;
  std::optional<atproto::Cid> cid;  // null for a delete
  ByteView record;                  // the record block (empty for a delete): a view into blocks
};

// What VerifyFirehoseCommit proved: the signed commit (commit.data is the repo's MST root after
// this commit) and each op's record.
struct VerifiedCommit {
  atproto::Commit commit;
  atproto::BlockStore blocks;  // views into FirehoseCommit::blocks
  std::vector<VerifiedOp> ops;
};

// Sync 1.1 verification of a #commit against `key`, the account's signing key: the CAR's blocks
// hash to their CIDs; the commit block decodes and names the frame's repo and rev; its signature
// verifies; each create and update has its record block, and the commit's tree holds each op's
// cid (a delete: no value); inverting the ops onto that tree (a create deleted, an update or a
// delete restored to `prev`) reaches prev_data. *out is replaced; it holds views into
// `frame.blocks`, which must outlive it. Thread-safe.
Status VerifyFirehoseCommit(const FirehoseCommit& frame, const atproto::PublicKey& key,
                            VerifiedCommit* out, std::string* error_kind);

// A #sync: its blocks hold the repo's signed commit (the root) naming the frame's DID and rev,
// signed by `key`. *commit receives it. Same error kinds as above.
Status VerifyFirehoseSync(const FirehoseSync& frame, const atproto::PublicKey& key,
                          atproto::Commit* commit, std::string* error_kind);

// The verified ops as pipeline events: creates and updates with the record as atproto JSON (from
// its DAG-CBOR block) and its createdAt, deletes without a body; rev = the commit's rev,
// position = the frame's seq. A record block that does not convert to JSON is an error naming
// the record's path (kind bad_record): the caller refuses the whole commit.
Status FirehoseCommitEvents(const FirehoseCommit& frame, const VerifiedCommit& verified,
                            pipeline::Origin origin, std::vector<pipeline::Event>* events,
                            std::string* error_kind);

// The binary message a relay sends for `frame` (DecodeFirehoseFrame's inverse): for simulated
// relays and tests.
Bytes EncodeFirehoseFrame(const FirehoseFrame& frame);

// One write of a commit BuildFirehoseCommit makes.
struct RepoWrite {
  FirehoseAction action = FirehoseAction::kCreate;
  std::string path;  // "collection/rkey"
  Bytes record;      // the record's DAG-CBOR block; empty for a delete
};

// Applies `writes` to the repo whose records are *records (path -> record block; updated in
// place), signs the commit of `rev` with `key`, and returns the #commit a relay sends for it:
// blocks = the signed commit, the new tree's nodes a consumer needs to invert the writes (the
// covering proof of each written path) and the records written; ops with prev set as sync 1.1
// asks; prevData = the tree before. Invalid when a write does not fit the records (a create of a
// present path, an update or delete of an absent one, two writes on one path). For simulated
// relays and tests: it builds both trees whole.
Result<FirehoseCommit> BuildFirehoseCommit(std::string_view did, std::string_view rev,
                                           std::string_view since,
                                           std::map<std::string, Bytes>* records,
                                           const std::vector<RepoWrite>& writes,
                                           const atproto::PrivateKey& key, int64_t seq);

}  // namespace atfill::sources
