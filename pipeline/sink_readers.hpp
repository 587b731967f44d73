// What a source may read back of the configured database (the crawl's incremental re-backfill,
// `atfill verify`), without the component registry (pipeline/components.hpp) around it.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"

namespace atfill::pipeline {

// One stored record as `atfill verify` compares it with its repo.
struct StoredRecord {
  std::string collection;
  std::string rkey;
  std::string cid;
  std::string rev;  // empty when the row has none
};

// Reads back what the configured database holds; callable from any thread.
struct SinkReaders {
  // Whether the database holds records of (did, collection).
  std::function<Result<bool>(const std::string& did, const std::string& collection)> holds;
  // The record JSON stored at an AT URI (nullopt when none).
  std::function<Result<std::optional<std::string>>(std::string_view uri)> record;
  // Deletes every row of a collection (one removed from the live consumer with purge), in
  // transactions of a few thousand rows beside the running sink's writes; returns the rows deleted.
  std::function<Result<uint64_t>(const std::string& collection)> purge_collection;
  // The DIDs of which the database holds records, in byte order (unset: the kind cannot tell).
  std::function<Result<std::vector<std::string>>()> dids;
  // The records stored of one DID, by collection then rkey (byte order).
  std::function<Result<std::vector<StoredRecord>>(const std::string& did)> repo_records;
};

}  // namespace atfill::pipeline
