#include "stages/cid_verify.hpp"

#include <algorithm>

#include "atproto/json.hpp"

namespace atfill::stages {

Status CidVerify::Process(pipeline::TransformState* /*state*/, pipeline::EventChunk* chunk) const {
  auto& events = chunk->events;
  // Compacts in place: kept events slide forward, order preserved.
  size_t keep = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    auto* record = std::get_if<pipeline::RecordEvent>(&events[i]);
    bool ok = true;
    if (record != nullptr && record->operation != pipeline::Operation::kDelete) {
      auto cid = atproto::CidOfRecord(record->body);
      if (!cid.ok()) {
        chunk->errors.push_back({"bad_record", record->Uri(),
                                 "record is not valid atproto data: " + cid.status().message()});
        ok = false;
      } else if (*cid != record->cid) {
        chunk->errors.push_back(
            {"cid_mismatch", record->Uri(),
             "record hashes to " + cid->ToString() + ", source said " + record->cid.ToString()});
        ok = false;
      }
    }
    if (ok) {
      if (keep != i) events[keep] = std::move(events[i]);
      ++keep;
    } else {
      ++chunk->dropped;
    }
  }
  events.resize(keep);
  return Status::OK();
}

}  // namespace atfill::stages
