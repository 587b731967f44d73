// simnet's Jetstream event log: what jetstream.localhost serves (SPEC.md in
// ../shared/protocols/jetstream, §0-§2), its frames on both wire versions, its publication
// schedule and the ground truth of applying it.
//
// The log is generated from the seed over Network::accounts(): creates of new records (bodies
// in the atproto JSON data model, with blobs ($link) and bytes ($bytes), real CIDs), updates and
// deletes of records the log created earlier, #identity events (a new handle) and #account
// events (deactivated, takendown, deleted; inactive accounts become active again). Only active
// accounts write; a takendown or deleted account's records are gone (purged) and are never
// updated or deleted afterwards; a deleted account never comes back. Accounts start with their
// Network status. The log does not touch the records the PDS hosts serve.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/bytes.hpp"
#include "base/status.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill::simnet {

// Event kinds, numbered as Jetstream's segment kinds (SPEC §0).
enum class JetstreamKind : uint8_t {
  kCreate = 1,
  kUpdate = 2,
  kDelete = 3,
  kIdentity = 4,
  kAccount = 5,
  // A #sync (v2 only): the account's commit chain broke. One of its records vanished without a
  // delete event; CreateResync rows (sent as creates) for each of its current records follow.
  kSync = 6,
  kCreateResync = 7,
};

// One event, compactly; everything else (DID, rkey, rev, record, times) derives from it and its
// seq.
struct JetstreamEvent {
  // Creates, updates, deletes, resync rows: the seq of the record's create (its own seq for a
  // create).
  // Identity: the handle's version (handle "user-NNNN-vV.simnet.test").
  uint64_t target = 0;
  uint32_t account = 0;  // index into Network::accounts()
  JetstreamKind kind = JetstreamKind::kCreate;
  uint8_t collection = 0;  // commits: index into SimnetOptions::collections
  // Account events: the new status; kActive = active again.
  AccountStatus status = AccountStatus::kActive;
  // Account events: a false "deleted" (JetstreamOptions::false_delete_share); the account's
  // status is unchanged.
  bool false_report = false;
};

struct JetstreamTruthRecord {
  std::string uri;
  std::string cid;
  std::string body;  // the record's atproto JSON as the last create/update carried it
};

struct JetstreamTruthAccount {
  std::string did;
  AccountStatus status = AccountStatus::kActive;  // after its last #account event
  uint64_t seq = 0;                               // that event's seq
};

// The state after applying events 1..through_seq with atproto semantics: creates and updates
// set a record, deletes remove it, an #account event with status takendown or deleted removes
// every record of its DID (deactivated keeps them).
struct JetstreamTruth {
  uint64_t through_seq = 0;
  std::vector<JetstreamTruthRecord> records;    // live records, sorted by URI
  std::vector<JetstreamTruthAccount> accounts;  // every DID an #account event named, by DID
  // "uri\tcid\n" per live record.
  std::string ToTsv() const;
};

// The generated log. Immutable after Generate; every method is thread-safe.
class JetstreamLog {
 public:
  // `salt` makes a different log from the same network (simnet trains its dictionaries on a
  // salted sample log).
  static Result<std::unique_ptr<JetstreamLog>> Generate(const Network& net,
                                                        const JetstreamOptions& options,
                                                        uint64_t salt = 0);

  const Network& network() const { return *net_; }
  const JetstreamOptions& options() const { return options_; }
  // The last seq; seqs are 1..size().
  uint64_t size() const { return events_.size() - 1; }
  const JetstreamEvent& event(uint64_t seq) const { return events_[seq]; }

  // Witnessed time (unix µs); strictly increasing with seq.
  int64_t TimeUs(uint64_t seq) const;
  // The first seq whose witnessed time is >= time_us; size() + 1 when there is none.
  uint64_t SeqAtTime(int64_t time_us) const;

  const std::string& Did(uint64_t seq) const;
  bool IsCommit(uint64_t seq) const;
  // Commits only: the record's collection, rkey, "at://" URI, and the commit's rev (a TID,
  // increasing per account).
  const std::string& Collection(uint64_t seq) const;
  std::string Rkey(uint64_t seq) const;
  std::string Uri(uint64_t seq) const;
  std::string Rev(uint64_t seq) const;
  // Identity events: the new handle.
  std::string Handle(uint64_t seq) const;
  // Creates and updates: the record's atproto JSON (Go encoding/json style: keys sorted, <>&
  // escaped) and its CID.
  Result<std::string> Record(uint64_t seq) const;
  Result<atproto::Cid> RecordCid(uint64_t seq) const;

  // The frame of `seq` exactly as the v1 /subscribe stream (SPEC §1.2) and the v2
  // subscribeEvents stream (§2.3) send it, uncompressed.
  Result<std::string> FrameV1(uint64_t seq) const;
  Result<std::string> FrameV2(uint64_t seq) const;

  // The status the account's PDS reports after events 1..through_seq (false deletes do not count;
  // before its first #account event, its Network status).
  AccountStatus StatusAt(uint32_t account, uint64_t through_seq) const;

  // Ground truth of events 1..min(through_seq, size()).
  Result<JetstreamTruth> Truth(uint64_t through_seq = UINT64_MAX) const;

  // Publication: how many events are published `elapsed` after Start, and how long after Start
  // `seq` is published (zero for those published at Start).
  uint64_t PublishedAt(std::chrono::nanoseconds elapsed) const;
  std::chrono::nanoseconds PublishTime(uint64_t seq) const;
  uint64_t published_at_start() const { return published_at_start_; }

 private:
  JetstreamLog() = default;

  const Network* net_ = nullptr;
  JetstreamOptions options_;
  uint64_t seed_ = 0;
  uint64_t published_at_start_ = 0;
  std::vector<JetstreamEvent> events_;  // [0] unused
  // Per account, the seqs of its #account events that changed its status, ascending.
  std::vector<std::vector<uint64_t>> status_changes_;
};

// Trains a zstd dictionary (ZDICT_trainFromBuffer, at most `capacity` bytes) on the frames of
// `version` (1 or 2) of the first `samples` events of `log`, and gives it the ID `id`.
Result<Bytes> TrainJetstreamDictionary(const JetstreamLog& log, int version, uint32_t id,
                                       uint64_t samples, size_t capacity);

}  // namespace atfill::simnet
