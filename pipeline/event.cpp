#include "pipeline/event.hpp"

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

bool StatusPurgesRecords(AccountStatus status) {
  return status == AccountStatus::kDeleted || status == AccountStatus::kTakendown ||
         status == AccountStatus::kSuspended;
}

}  // namespace atfill::pipeline
