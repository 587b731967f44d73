#include "sinks/event_checks.hpp"

#include <string>

namespace atfill::sinks {
namespace {

Status Reject(const pipeline::RecordEvent& e, size_t index, const std::string& why) {
  std::string msg = "event " + std::to_string(index) + " (" +
                    std::string(pipeline::OperationName(e.operation)) + " " + e.Uri() + "): ";
  msg += why;
  return Status::Invalid(std::move(msg));
}

}  // namespace

Status CheckRecordEvent(const pipeline::RecordEvent& e, size_t index) {
  if (e.did.empty()) return Reject(e, index, "empty did");
  if (e.collection.empty()) return Reject(e, index, "empty collection");
  if (e.rkey.empty()) return Reject(e, index, "empty rkey");
  if (e.operation != pipeline::Operation::kCreate && e.operation != pipeline::Operation::kUpdate &&
      e.operation != pipeline::Operation::kDelete) {
    return Reject(e, index, "unknown operation " + std::to_string(static_cast<int>(e.operation)));
  }
  if (e.operation != pipeline::Operation::kDelete) {
    if (!e.cid.valid()) return Reject(e, index, "a create/update needs a valid CID");
    if (e.body.empty()) return Reject(e, index, "a create/update needs a record body");
  }
  return Status::OK();
}

Status CheckAccountEvent(const pipeline::AccountEvent& e, size_t index) {
  if (e.did.empty()) {
    return Status::Invalid("event " + std::to_string(index) + " (account " +
                           std::string(pipeline::AccountStatusName(e.status)) + "): empty did");
  }
  return Status::OK();
}

}  // namespace atfill::sinks
