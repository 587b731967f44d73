// Running jobs the way atfill does, for integration tests: a source through CID verification and
// the ingest guard into a SQLite file, with RocksDB state; `atfill` child processes killed with
// SIGKILL once the table they write reaches given row counts; and the table compared with what it
// should hold (uri -> cid).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "pipeline/run.hpp"
#include "pipeline/source.hpp"
#include "state/error_log.hpp"
#include "state/job_store.hpp"
#include "state/kv_store.hpp"
#include "tests/common/process.hpp"

namespace atfill::testing {

struct SourceJobRun {
  state::JobRecord job;
  std::map<std::string, uint64_t> error_kinds;
  std::vector<state::ErrorEntry> errors;  // the first 100
};

// Builds the job's source once the job is known, over the job's state store.
using JobSourceFactory = std::function<Result<std::unique_ptr<pipeline::Source>>(
    state::KvStore& kv, const state::JobRecord& job)>;

// Runs (or resumes) the job of `kind` named `job_name`, with its state in `state_dir`, into the
// SQLite file `db`, to its end. `make_source` builds the source once the job is known; `prepare`
// (when set) runs on the state store first; `after` (when set) sees the state store and the job
// before the store closes. `extra` transforms run between CID verification and the guard.
// Failures to set up are test failures (the run is then empty).
SourceJobRun RunSourceJob(
    const std::filesystem::path& state_dir, const std::string& db, const std::string& kind,
    const std::string& job_name, const JobSourceFactory& make_source,
    const std::function<void(state::KvStore&)>& prepare = nullptr,
    const std::function<void(state::KvStore&, const state::JobRecord&)>& after = nullptr,
    const std::vector<const pipeline::Transform*>& extra = {});

// A source that forwards to `source` without owning it, for factories whose caller keeps the
// source (to read its stats after the job ended: RunAsJob destroys what the factory returns).
std::unique_ptr<pipeline::Source> Borrow(pipeline::Source* source);

// `count` row counts drawn from [lo, hi], sorted: where a crash test kills its runs.
std::vector<uint64_t> KillPoints(std::mt19937_64& rng, int count, uint64_t lo, uint64_t hi);

// Starts `argv` in `dir` once per target, waits until the SQLite table in `db` holds at least
// that many rows and kills the child with SIGKILL. Returns how many runs were killed; a run that
// ended before its kill point is a test failure naming it.
int KillAtRowCounts(const std::vector<std::string>& argv, const std::filesystem::path& dir,
                    const std::string& db, const std::vector<uint64_t>& targets);

// The seed of a randomized crash test: ATFILL_TEST_SEED when set, else a random one.
uint64_t TestSeed();

// Runs `argv` (an `atfill run`) in `dir` `kills` times, each killed with SIGKILL once the table in
// `db` holds a row count drawn with `seed` from [lo, hi] (KillPoints, KillAtRowCounts), then once
// more to its end, which must be a pause because the stream went quiet (exit 4, stop reason
// stream_idle). That last run's result goes to `last` (when not null). Its failures are fatal: call
// it under ASSERT_NO_FATAL_FAILURE.
void KillThenRunUntilIdle(const std::vector<std::string>& argv, const std::filesystem::path& dir,
                          const std::string& db, uint64_t seed, int kills, uint64_t lo, uint64_t hi,
                          ProcessResult* last = nullptr);

// uri -> cid of `records`: anything whose elements have uri and cid members (a ground truth's
// records, a table's rows, a manifest account's records).
template <typename Records>
std::map<std::string, std::string> UriCids(const Records& records) {
  std::map<std::string, std::string> out;
  for (const auto& r : records) out[r.uri] = r.cid;
  return out;
}

// uri -> cid of the records in the SQLite file `db`; a failure to read it is a test failure (the
// map is then empty).
std::map<std::string, std::string> TableCids(const std::string& db);

// For a failure message: the first 5 URIs of `want` that `got` lacks or holds with another CID,
// and the first 5 of `got` that `want` lacks.
std::string DiffCids(const std::map<std::string, std::string>& want,
                     const std::map<std::string, std::string>& got);

}  // namespace atfill::testing
