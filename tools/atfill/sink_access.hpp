// The configured sink ([sink] kind) and what the launcher reads back from it: one place that
// knows which database a config names.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.hpp"
#include "pipeline/sink.hpp"
#include "tools/atfill/app_config.hpp"

namespace atfill::cli {

// A new sink on the configured database (created or migrated as needed).
Result<std::unique_ptr<pipeline::Sink>> OpenConfiguredSink(const AppConfig& config);

// "sqlite:/path/atfill.db" or "postgres:host=... dbname=..." (without a password), for job
// parameters and messages.
std::string SinkLocation(const AppConfig& config);

// Whether the configured database holds records of (did, collection), for the live consumer's
// tombstone rule; callable from any thread.
std::function<Result<bool>(const std::string& did, const std::string& collection)> SinkHoldsRecords(
    const AppConfig& config);

// The record JSON stored at an AT URI (nullopt when none), for scripts' atfill.get_record;
// thread-safe (one connection behind a mutex, opened at the first call).
std::function<Result<std::optional<std::string>>(std::string_view uri)> SinkRecordReader(
    const AppConfig& config);

}  // namespace atfill::cli
