// Running a crawl job in-process for tests, as `atfill backfill` does: RocksDB state in a folder,
// CID verification and the ingest guard, the SQLite sink; then everything the job left behind.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sinks/sqlite_reader.hpp"
#include "sources/crawl/crawl_source.hpp"
#include "state/crawl_log.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"

namespace atfill::testing {

struct CrawlJobRun {
  state::JobRecord job;
  sources::CrawlStats stats;
  std::map<std::string, uint64_t> error_kinds;
  std::vector<state::ErrorEntry> errors;  // the first 100
  std::vector<state::RecentRepo> recent;
  std::vector<state::HostSummary> hosts;
  std::vector<sinks::RecordRow> rows;  // the whole table afterwards
};

// Runs (or resumes) the crawl job named `job_name` with its state in `state_dir` into the SQLite
// file `db`, to its end. `prepare` (when set) runs on the state store first. Failures to set up
// are test failures (the returned run is then empty).
CrawlJobRun RunCrawlJob(const std::filesystem::path& state_dir, const std::string& db,
                        const sources::CrawlOptions& options, const std::string& job_name = "crawl",
                        const std::function<void(state::KvStore&)>& prepare = nullptr);

// "kind=n kind=n " in kind order, for messages and comparisons.
std::string KindCounts(const std::map<std::string, uint64_t>& kinds);
// The job's status and stop reason, its error counts and first errors.
std::string Describe(const CrawlJobRun& run);

}  // namespace atfill::testing
