#include "pipeline/event.hpp"

#include "base/bytes.hpp"
#include "state/codec.hpp"

namespace atfill::pipeline {

std::string_view OperationName(Operation op) {
  switch (op) {
    case Operation::kCreate:
      return "create";
    case Operation::kUpdate:
      return "update";
    case Operation::kDelete:
      return "delete";
  }
  return "unknown";
}

std::string_view OriginName(Origin origin) {
  switch (origin) {
    case Origin::kLive:
      return "live";
    case Origin::kCrawl:
      return "crawl";
    case Origin::kReplay:
      return "replay";
  }
  return "unknown";
}

std::string RecordEvent::Uri() const {
  std::string uri;
  uri.reserve(5 + did.size() + 1 + collection.size() + 1 + rkey.size());
  uri += "at://";
  uri += did;
  uri += '/';
  uri += collection;
  uri += '/';
  uri += rkey;
  return uri;
}

AccountStatus ParseAccountStatus(std::string_view text) {
  // An active account carries no status upstream, so the empty string means active.
  if (text.empty() || text == "active") return AccountStatus::kActive;
  if (text == "deactivated") return AccountStatus::kDeactivated;
  if (text == "deleted") return AccountStatus::kDeleted;
  if (text == "takendown") return AccountStatus::kTakendown;
  if (text == "suspended") return AccountStatus::kSuspended;
  if (text == "desynchronized") return AccountStatus::kDesynchronized;
  if (text == "throttled") return AccountStatus::kThrottled;
  return AccountStatus::kOther;
}

std::string_view AccountStatusName(AccountStatus status) {
  switch (status) {
    case AccountStatus::kActive:
      return "active";
    case AccountStatus::kDeactivated:
      return "deactivated";
    case AccountStatus::kDeleted:
      return "deleted";
    case AccountStatus::kTakendown:
      return "takendown";
    case AccountStatus::kSuspended:
      return "suspended";
    case AccountStatus::kDesynchronized:
      return "desynchronized";
    case AccountStatus::kThrottled:
      return "throttled";
    case AccountStatus::kOther:
      return "other";
  }
  return "other";
}

bool CollectionMatches(std::string_view nsid, const std::vector<std::string>& patterns) {
  if (patterns.empty()) return true;
  for (const std::string& p : patterns) {
    if (p == "*") return true;
    if (p.size() > 2 && p.ends_with(".*")) {
      if (nsid.starts_with(std::string_view(p).substr(0, p.size() - 1))) return true;
    } else if (nsid == p) {
      return true;
    }
  }
  return false;
}

AccountEvent ResyncMarker(std::string_view did, const std::vector<std::string>& collections,
                          std::string_view rev) {
  AccountEvent marker;
  marker.did.assign(did);
  marker.resync = true;
  marker.resync_collections = collections;
  marker.purge_before_rev.assign(rev);
  return marker;
}

bool StatusPurgesRecords(AccountStatus status) {
  return status == AccountStatus::kDeleted || status == AccountStatus::kTakendown ||
         status == AccountStatus::kSuspended;
}

}  // namespace atfill::pipeline

namespace atfill::pipeline {
namespace {

constexpr uint8_t kEventVersion = 1;
// Record event fields.
enum : uint32_t {
  kTagKind = 1,  // 1 record, 2 account
  kTagDid = 2,
  kTagCollection = 3,
  kTagRkey = 4,
  kTagOperation = 5,
  kTagCid = 6,
  kTagRev = 7,
  kTagBody = 8,
  kTagCreatedAt = 9,
  kTagOrigin = 10,
  kTagPosition = 11,
  // Account event fields.
  kTagActive = 20,
  kTagStatus = 21,
  kTagResync = 22,
  kTagResyncCollection = 23,
  kTagSeq = 24,
  kTagTime = 25,
};

}  // namespace

std::string EncodeEvent(const Event& event) {
  state::codec::RecordWriter w(kEventVersion);
  if (const auto* r = std::get_if<RecordEvent>(&event)) {
    w.Uint(kTagKind, 1);
    w.Str(kTagDid, r->did);
    w.Str(kTagCollection, r->collection);
    w.Str(kTagRkey, r->rkey);
    w.Uint(kTagOperation, static_cast<uint64_t>(r->operation));
    if (r->cid.valid()) {
      const ByteView b = r->cid.binary();
      w.Str(kTagCid, AsChars(b));
    }
    w.Str(kTagRev, r->rev);
    w.Str(kTagBody, r->body);
    w.Str(kTagCreatedAt, r->created_at);
    w.Uint(kTagOrigin, static_cast<uint64_t>(r->origin));
    w.Uint(kTagPosition, r->position);
    return w.Take();
  }
  const auto& a = std::get<AccountEvent>(event);
  w.Uint(kTagKind, 2);
  w.Str(kTagDid, a.did);
  w.Bool(kTagActive, a.active);
  w.Uint(kTagStatus, static_cast<uint64_t>(a.status));
  w.Bool(kTagResync, a.resync);
  for (const auto& c : a.resync_collections) w.Str(kTagResyncCollection, c);
  w.Int(kTagSeq, a.seq);
  w.Int(kTagTime, a.time_us);
  w.Uint(kTagOrigin, static_cast<uint64_t>(a.origin));
  w.Uint(kTagPosition, a.position);
  return w.Take();
}

Result<Event> DecodeEvent(std::string_view bytes) {
  uint64_t kind = 0;
  RecordEvent r;
  AccountEvent a;
  auto small = [](const state::codec::Field& f, uint64_t max) -> Result<uint64_t> {
    ATFILL_ASSIGN_OR_RETURN(uint64_t v, f.Uint());
    if (v > max) return f.Error("out of range");
    return v;
  };
  Status st = state::codec::ReadRecord(
      bytes, kEventVersion, "held event", [&](const state::codec::Field& f) -> Status {
        switch (f.tag()) {
          case kTagKind: {
            ATFILL_ASSIGN_OR_RETURN(kind, small(f, 2));
            return Status::OK();
          }
          case kTagDid:
            r.did = a.did = f.Str();
            return Status::OK();
          case kTagCollection:
            r.collection = f.Str();
            return Status::OK();
          case kTagRkey:
            r.rkey = f.Str();
            return Status::OK();
          case kTagOperation: {
            ATFILL_ASSIGN_OR_RETURN(uint64_t v, small(f, 2));
            r.operation = static_cast<Operation>(v);
            return Status::OK();
          }
          case kTagCid: {
            auto cid = atproto::Cid::FromBinary(AsBytes(f.payload()));
            if (!cid.ok()) return f.Error(cid.status().message());
            r.cid = *cid;
            return Status::OK();
          }
          case kTagRev:
            r.rev = f.Str();
            return Status::OK();
          case kTagBody:
            r.body = f.Str();
            return Status::OK();
          case kTagCreatedAt:
            r.created_at = f.Str();
            return Status::OK();
          case kTagOrigin: {
            ATFILL_ASSIGN_OR_RETURN(uint64_t v, small(f, 2));
            r.origin = a.origin = static_cast<Origin>(v);
            return Status::OK();
          }
          case kTagPosition: {
            ATFILL_ASSIGN_OR_RETURN(uint64_t v, f.Uint());
            r.position = a.position = v;
            return Status::OK();
          }
          case kTagActive: {
            ATFILL_ASSIGN_OR_RETURN(a.active, f.Bool());
            return Status::OK();
          }
          case kTagStatus: {
            ATFILL_ASSIGN_OR_RETURN(uint64_t v,
                                    small(f, static_cast<uint64_t>(AccountStatus::kOther)));
            a.status = static_cast<AccountStatus>(v);
            return Status::OK();
          }
          case kTagResync: {
            ATFILL_ASSIGN_OR_RETURN(a.resync, f.Bool());
            return Status::OK();
          }
          case kTagResyncCollection:
            a.resync_collections.push_back(f.Str());
            return Status::OK();
          case kTagSeq: {
            ATFILL_ASSIGN_OR_RETURN(a.seq, f.Int());
            return Status::OK();
          }
          case kTagTime: {
            ATFILL_ASSIGN_OR_RETURN(a.time_us, f.Int());
            return Status::OK();
          }
          default:
            return Status::OK();
        }
      });
  if (!st.ok()) return st;
  if (kind == 1) return Event(std::move(r));
  if (kind == 2) return Event(std::move(a));
  return Status::Corrupt("held event: no kind field");
}

}  // namespace atfill::pipeline
