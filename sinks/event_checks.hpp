// Internal to sinks/: what every sink requires of an event before writing it.
#pragma once

#include <cstddef>

#include "base/status.hpp"
#include "pipeline/event.hpp"

namespace atfill::sinks {

// OK when the record event can be written: did, collection and rkey are present, and a
// create/update carries a valid CID and a non-empty body. `index` is the event's position in its
// batch; the error names it and the event's URI.
Status CheckRecordEvent(const pipeline::RecordEvent& e, size_t index);

// OK when the account event names a DID.
Status CheckAccountEvent(const pipeline::AccountEvent& e, size_t index);

}  // namespace atfill::sinks
