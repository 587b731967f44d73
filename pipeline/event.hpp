// The events every source produces and every stage and sink consumes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "atproto/cid.hpp"
#include "base/status.hpp"

namespace atfill::pipeline {

enum class Operation : uint8_t { kCreate, kUpdate, kDelete };
enum class Origin : uint8_t { kLive, kCrawl, kReplay };

std::string_view OperationName(Operation op);
std::string_view OriginName(Origin origin);

// One record write or delete, whatever the source.
struct RecordEvent {
  std::string did;
  std::string collection;
  std::string rkey;
  Operation operation = Operation::kCreate;
  // The record's CID as the source stated it; not valid() for deletes.
  atproto::Cid cid;
  // The repo revision (TID) of the commit that wrote it; empty when the source gives none
  // (listRecords does not).
  std::string rev;
  // The record exactly as received, atproto JSON; empty for deletes.
  std::string body;
  // The record's own createdAt string when it has one (copied, not normalised); else empty.
  std::string created_at;
  Origin origin = Origin::kLive;
  // Where the source found it (its cursor unit: a line number, a time_us, a seq...); events of one
  // source arrive in increasing position order.
  uint64_t position = 0;

  // "at://did/collection/rkey"
  std::string Uri() const;
};

// Account status as Jetstream and the relay report it.
enum class AccountStatus : uint8_t {
  kActive,
  kDeactivated,
  kDeleted,
  kTakendown,
  kSuspended,
  kDesynchronized,
  kThrottled,
  kOther,
};

AccountStatus ParseAccountStatus(std::string_view text);
std::string_view AccountStatusName(AccountStatus status);
// deleted, takendown and suspended remove the account's records.
bool StatusPurgesRecords(AccountStatus status);

struct AccountEvent {
  std::string did;
  bool active = true;
  AccountStatus status = AccountStatus::kActive;
  // A repo resync (Jetstream v2 #sync), not a status change: the sink removes the DID's records
  // in `resync_collections` (NSIDs or "prefix.*"; empty = every collection) and the current
  // records follow as creates. No tombstone is left or lifted; `active`/`status` are ignored.
  bool resync = false;
  std::vector<std::string> resync_collections;
  // When set, a purge or resync removes only rows whose rev is older than this (or that have
  // none): a gap replay's marker applied as of its time (sources/archive/replay.hpp) leaves the
  // rows the live stream beside it wrote since. Set by sources only; not kept by EncodeEvent.
  std::string purge_before_rev;
  // Upstream relay sequence number and time (unix microseconds), 0 when unknown.
  int64_t seq = 0;
  int64_t time_us = 0;
  Origin origin = Origin::kLive;
  uint64_t position = 0;
};

using Event = std::variant<RecordEvent, AccountEvent>;

// The marker that begins a repo's replacement by a fetched copy of it (commit `rev`): the sink
// removes the DID's rows in `collections` older than `rev`, and the fetched records, which follow
// it as creates, are then exactly what the table holds of those collections.
AccountEvent ResyncMarker(std::string_view did, const std::vector<std::string>& collections,
                          std::string_view rev);

// `nsid` matches one of `patterns` (exact NSIDs or "prefix.*"; "*" matches every collection); an
// empty list matches every collection.
bool CollectionMatches(std::string_view nsid, const std::vector<std::string>& patterns);

inline uint64_t PositionOf(const Event& e) {
  return std::visit([](const auto& x) { return x.position; }, e);
}
inline const std::string& DidOf(const Event& e) {
  return std::visit([](const auto& x) -> const std::string& { return x.did; }, e);
}

// A self-contained binary form of one event (versioned; fields a reader does not know are
// skipped), for events kept in state: live events held while their repo is backfilled.
std::string EncodeEvent(const Event& event);
// Corrupt, naming the problem, when `bytes` is not what EncodeEvent wrote.
Result<Event> DecodeEvent(std::string_view bytes);

}  // namespace atfill::pipeline
