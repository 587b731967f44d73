// The verify job's source (`atfill verify`): compares the records the database holds of each repo
// with the repo its PDS serves now, and (with repair) hands the engine the writes that make the
// table equal to it.
//
// For each DID (the given ones, or every DID the database holds, in byte order): resolve it
// (DidResolver, cached in state), fetch com.atproto.sync.getRepo from its PDS, read the CAR with
// ReadRepoRecords (the commit's DID and signature against the DID document's #atproto key, the
// MST walked, every record block hash-checked), keep the records of the wanted collections, and
// compare them with the stored rows of those collections (SinkReaders::repo_records):
//   verify_missing    in the repo, not stored
//   verify_extra      stored, not in the repo
//   verify_different  stored with another CID than the repo's
// Each difference is an entry of the job's error log (kind above, key the record's AT URI, a
// sentence with both CIDs and the commit's rev) and a job counter of the same name; a repo that
// could not be checked (resolution failed, the PDS did not answer 200, a bad CAR, a commit signed
// for another DID or with another key) is one entry keyed by its DID with the reason
// ("resolve_failed" and the resolver's kinds, "fetch_failed", and RepoFailureKind's), counted in
// "verify_repos_failed", and the other repos go on.
//
// With repair, the differences become events through the job's standard stages (CID verify, the
// ingest guard, the sink), as every other source's: a create for a missing record and an update
// for a different one (the repo's body and CID, rev = the commit's rev, origin crawl), a delete
// for an extra one (rev = the commit's rev).
//
// Resumable: the resume cursor is the last DID whose comparison (and repair) is committed; a
// resumed job goes on after it. Threading: the engine calls Read/Seek on one thread; the HTTP
// clients' callbacks only append to a completion list that Read drains (waiting at most tick_ms,
// then returning a tick chunk). Up to repos_in_flight repos are resolved or fetched at once;
// their chunks are emitted in DID order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "pipeline/sink_readers.hpp"
#include "pipeline/source.hpp"
#include "sources/crawl/options.hpp"
#include "state/kv_store.hpp"

namespace atfill::sources {

// Job counter names (JobCounters::extra) and error kinds of the differences.
inline constexpr const char* kVerifyMissing = "verify_missing";
inline constexpr const char* kVerifyExtra = "verify_extra";
inline constexpr const char* kVerifyDifferent = "verify_different";
// Job counters: repos compared (with or without differences), repos with a difference, repos
// that could not be checked, records compared (those of the repo's wanted collections), writes
// handed to the engine by a repair.
inline constexpr const char* kVerifyReposChecked = "verify_repos_checked";
inline constexpr const char* kVerifyReposDiffering = "verify_repos_differing";
inline constexpr const char* kVerifyReposFailed = "verify_repos_failed";
inline constexpr const char* kVerifyRecords = "verify_records";
inline constexpr const char* kVerifyRepairs = "verify_repairs";

// What a verify job checks: its parameters "dids", "collections" and "repair".
struct VerifyTargets {
  std::vector<std::string> dids;         // empty: every stored repo
  std::vector<std::string> collections;  // NSIDs or "prefix.*"; empty: every collection
  bool repair = false;
};

struct VerifyOptions {
  // The repos to check; empty: every DID the database holds.
  std::vector<std::string> dids;
  // The collections compared (NSIDs or "prefix.*"); empty: every collection.
  std::vector<std::string> collections;
  // Hand the engine the writes that remove the differences.
  bool repair = false;
  // Repos resolved or fetched at once; 1..1024.
  uint32_t repos_in_flight = 8;
  // The network side, as a crawl's: resolver, http and resolver_http, limits (record and CAR
  // sizes), allow_loopback_endpoints / allow_private_endpoints, tick_ms. Its discovery, mode and
  // targets are not read.
  CrawlOptions net;

  Status Validate() const;
};

class VerifySource : public pipeline::Source {
 public:
  // `readers` must hold `dids` (when options.dids is empty) and `repo_records` (Unsupported
  // otherwise); `kv` holds the resolver cache and must outlive the source. Starts the HTTP
  // clients.
  static Result<std::unique_ptr<VerifySource>> Create(VerifyOptions options,
                                                      pipeline::SinkReaders readers,
                                                      state::KvStore* kv);
  ~VerifySource() override;

  Status Seek(const std::string& resume_cursor) override;
  Result<bool> Read(pipeline::EventChunk* chunk) override;
  std::string Describe() const override;

 private:
  struct Impl;
  explicit VerifySource(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace atfill::sources
