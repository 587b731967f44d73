// A sink that writes nothing: for trying a pipeline config without a database.
#pragma once

#include <memory>

#include "base/status.hpp"
#include "pipeline/sink.hpp"

namespace atfill::sinks {

// Returns a Sink named "dry-run" that checks every event as the real sinks do (an invalid event
// fails the batch with Invalid) and counts what would be written, without storing anything. Having
// no table to compare with, it counts every create/update as `inserted`, every delete as `deleted`
// and every purging account event as one `purged_accounts` (with `purged_records` 0); `updated`,
// `unchanged` and `stale` stay 0. Write never fails otherwise and is idempotent trivially.
Result<std::unique_ptr<pipeline::Sink>> NewDryRunSink();

}  // namespace atfill::sinks
