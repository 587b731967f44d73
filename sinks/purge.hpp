// Deleting every row of one collection beside a running sink: what a collection removed from the
// live consumer with purge asks for (docs/admin.md). Rows go in transactions of kPurgeRows, so
// the sink's own batches (another connection, maybe another process) wait at most one of them.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.hpp"
#include "sinks/postgres_reader.hpp"

namespace atfill::sinks {

inline constexpr int kPurgeRows = 5000;

// The SQLite database at `path` (a database that does not exist holds nothing to delete).
Result<uint64_t> SqlitePurgeCollection(const std::string& path, const std::string& collection);
// The PostgreSQL tables `options` names.
Result<uint64_t> PostgresPurgeCollection(const PostgresReaderOptions& options,
                                         const std::string& collection);

}  // namespace atfill::sinks
