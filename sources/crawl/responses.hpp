// What the crawl's Read hands to its Decode: the fetched answers as typed values in the chunk's
// payload (pipeline::ChunkPayload), and the decoding of them into records, errors and the state
// writes that go with them (the crawl log's host counters and recent repos, live-hold checkpoints).
#pragma once

#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/chunk.hpp"
#include "sources/crawl/options.hpp"
#include "sources/crawl/repo_diff.hpp"
#include "state/crawl_log.hpp"
#include "state/cursors.hpp"
#include "state/live_holds.hpp"

namespace atfill::sources {

// CrawlOptions::incremental: the cursor holding the rev of the repo `did` that a getRepo crawl
// last applied, and the collections it applied, as "REV\tNSID,NSID..." (sorted).
std::string RepoRevCursor(std::string_view did);
std::string RepoRevValue(std::string_view rev, std::vector<std::string> collections);
// The rev of a RepoRevValue when it covers every one of `collections`, else "".
std::string RepoRevFor(std::string_view value, const std::vector<std::string>& collections);

// One answer of a PDS, as Read received it.
struct FetchedResponse {
  enum class Kind : uint8_t {
    kRecordsPage,  // a listRecords page of (did, collection) with at least one record
    kRepo,         // a getRepo CAR of did, to verify with signing_key
  };
  Kind kind = Kind::kRecordsPage;
  std::string did;
  std::string collection;   // kRecordsPage
  std::string pds;          // the PDS endpoint (the crawl log's host)
  std::string signing_key;  // kRepo
  uint64_t recent_seq = 0;  // kRepo: the recent-repos entry's sequence number
  std::string body;
  // kRepo fetched with getRepo?since: the answer read against the stored records (body empty).
  std::shared_ptr<RepoDiff> diff;
  // kRepo fetched whole because a getRepo?since answer could not settle it: the table holds an
  // older state of the repo, so its records replace the stored rows, as a resync's do (the rows
  // the repo no longer holds go).
  bool replaces_stored = false;
};

// A chunk's answers, in the order they arrived.
struct FetchedResponses : pipeline::ChunkPayload {
  std::vector<FetchedResponse> items;
  size_t bytes = 0;  // of the bodies
};

// The count of records and the cursor of a listRecords page, without building the records.
struct PageScan {
  bool ok = false;
  size_t count = 0;
  std::string cursor;
  std::string error;
};
// `body` gets simdjson's padding as spare capacity (its contents are unchanged).
PageScan ScanRecordsPage(simdjson::ondemand::parser& parser, std::string& body);

// What decoding needs of the crawl; every pointer outlives the call.
struct ResponseDecoder {
  const CrawlOptions* options = nullptr;
  uint64_t job = 0;
  const state::CrawlLog* log = nullptr;
  const state::LiveHolds* holds = nullptr;
  // CrawlOptions::incremental: where each repo's applied rev is kept (RepoRevCursor).
  state::Cursors* cursors = nullptr;

  // Turns each answer into chunk events (position = chunk->seq), errors, counters and state
  // writes. A page that does not parse, or a repo that does not verify, is an error of its own and
  // yields no record. Thread-safe (the engine decodes chunks in parallel).
  void Decode(const FetchedResponses& in, pipeline::EventChunk* chunk) const;
};

}  // namespace atfill::sources
