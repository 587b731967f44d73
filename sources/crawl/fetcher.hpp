// The crawl's request URLs and response parsing: repo listings (listReposByCollection,
// listRepos), listRecords pages and getRepo CARs, turned into events and per-item errors. Pure
// functions, no network: the crawl source fetches with net::HttpClient and hands the bodies here.
// (fetcher.cpp: URLs, listings and pages; repo_records.cpp: getRepo CARs.)
// All functions are thread-safe (JSON parsing reuses one parser and buffer per thread).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "pipeline/chunk.hpp"
#include "pipeline/event.hpp"

namespace atfill::sources {

// --- URLs ---------------------------------------------------------------------------------------
// `base` is a host URL ("https://pds.example", "http://pds-0001.localhost:1234"); trailing '/'s are
// dropped. Query values are percent-encoded (everything but A-Z a-z 0-9 - . _ ~). A `limit` of 0
// and an empty `cursor` are left out of the query (the server's default, the first page).

// {relay}/xrpc/com.atproto.sync.listReposByCollection?collection=&limit=&cursor=
std::string ListReposByCollectionUrl(std::string_view relay, std::string_view collection,
                                     uint32_t limit, std::string_view cursor);
// {host}/xrpc/com.atproto.sync.listRepos?limit=&cursor=
std::string ListReposUrl(std::string_view host, uint32_t limit, std::string_view cursor);
// {pds}/xrpc/com.atproto.repo.listRecords?repo=&collection=&limit=&cursor=
std::string ListRecordsUrl(std::string_view pds, std::string_view did, std::string_view collection,
                           uint32_t limit, std::string_view cursor);
// {pds}/xrpc/com.atproto.sync.getRepo?did=
std::string GetRepoUrl(std::string_view pds, std::string_view did);
// {pds}/xrpc/com.atproto.sync.getRepoStatus?did=
std::string GetRepoStatusUrl(std::string_view pds, std::string_view did);

// A getRepoStatus answer: {"did", "active", "status"?, "rev"?}. `did` must match the one asked
// about; Corrupt naming the reason otherwise.
struct RepoStatus {
  bool active = false;
  std::string status;  // "takendown", "deactivated", "deleted"...; empty when absent
};
Result<RepoStatus> ParseRepoStatus(std::string_view did, std::string_view body);

// --- Repo listings ------------------------------------------------------------------------------

struct ListedRepo {
  std::string did;
  // listRepos' `active` (true when absent); always true for listReposByCollection.
  bool active = true;
  // listRepos' `status` as received ("deactivated", "takendown", ...), "" when absent.
  std::string status;
  // listRepos' `rev` as received (not validated), "" when absent.
  std::string rev;
};

struct ReposPage {
  std::vector<ListedRepo> repos;
  // The next page's cursor; empty on the last page.
  std::string cursor;
  // Entries left out: kind "invalid_did" (no did string, or not a valid DID; key the DID text or
  // "repos[i]") or "bad_repo_entry" (not an object, or `active`/`status`/`rev` of the wrong type;
  // key the DID).
  std::vector<pipeline::EventError> errors;
};

// com.atproto.sync.listReposByCollection: {"repos":[{"did":...}],"cursor":...}. Invalid when the
// body is not valid JSON, not an object, has no `repos` array, or a cursor that is not a string
// (null counts as absent).
Result<ReposPage> ParseListReposByCollection(std::string_view body);
// com.atproto.sync.listRepos: {"repos":[{"did","head","rev","active"?,"status"?}],"cursor"}.
// Fails as ParseListReposByCollection.
Result<ReposPage> ParseListRepos(std::string_view body);

// --- Records ------------------------------------------------------------------------------------

struct FetchLimits {
  // Largest record accepted, in bytes of its JSON text; a larger one is an "oversize_record"
  // error for that record alone.
  uint64_t max_record_bytes = 1 << 20;
};

struct RecordsPage {
  std::vector<pipeline::RecordEvent> records;
  // Records left out, each with kind "bad_record" or "oversize_record", key the record's AT URI
  // (or, without a usable uri string, "<did>/<collection> listRecords record <i>"), and a sentence.
  std::vector<pipeline::EventError> errors;
  // The next page's cursor; empty on the last page.
  std::string cursor;
};

// One com.atproto.repo.listRecords page of (did, collection):
// {"cursor"?: string, "records": [{"uri", "cid", "value"}]}. Every record becomes a RecordEvent
// {did, collection, rkey from the uri, kCreate, cid, rev "", body = the exact text of `value` as
// received (no re-serialisation, surrounding whitespace trimmed), created_at = value.createdAt
// when it is a string (unescaped, not normalised), origin kCrawl, position 0}. The CID is NOT
// checked against the body here (CidVerify does that downstream).
//
// A record is an error, and the rest of the page still counts, when its uri is not
// at://<did>/<collection>/<valid rkey>, its cid is not a dag-cbor CID, its value is not an
// object (or nests deeper than atproto::kJsonMaxDepth), or its value's text is larger than
// limits.max_record_bytes. The call fails (Invalid) only when the body is not a listRecords
// response: not valid JSON (anywhere, record values included), not an object, no `records`
// array, or a cursor that is not a string.
Result<RecordsPage> ParseListRecordsPage(std::string_view did, std::string_view collection,
                                         std::string_view body, const FetchLimits& limits);

// Why ReadRepoRecords failed as a whole.
enum class RepoFailure : uint8_t {
  kNone,
  kBadRepo,       // the CAR, its commit block or its MST is malformed, truncated or incomplete
  kDidMismatch,   // the commit is signed for another DID
  kMissingKey,    // no signing key was given
  kBadKey,        // the signing key does not parse as a did:key or publicKeyMultibase
  kBadSignature,  // the commit signature does not verify with the signing key
};
// The error-log kind: "bad_repo", "did_mismatch", "missing_key", "bad_key", "bad_signature"
// ("" for kNone).
std::string_view RepoFailureKind(RepoFailure failure);

struct RepoRecords {
  std::string rev;         // the signed commit's rev
  std::string commit_cid;  // the commit block's CID ("bafy...")
  std::string data_cid;    // the commit's MST root ("bafy..."): a firehose resync's new link
  std::vector<pipeline::RecordEvent> records;
  // Records left out while the rest are kept: "oversize_record" (JSON text larger than
  // FetchLimits::max_record_bytes) or "bad_record" (block missing from the CAR, not DAG-CBOR, or
  // not a map); key the record's AT URI.
  std::vector<pipeline::EventError> errors;
};

// Reads a com.atproto.sync.getRepo CAR of `did` (blocks in any order): checks that the commit's
// did is `did`, verifies the commit signature with `signing_key` (the #atproto verification
// method's publicKeyMultibase, or a "did:key:..." string), walks the MST and returns the records of
// `collections` (empty = all), in key order, as RecordEvents {did, collection, rkey, kCreate, cid
// of the record block (hash-checked when the CAR was read), rev = the commit's rev, body = the
// record as atproto JSON (the data model's JSON encoding: $link, $bytes, blobs), created_at as in
// ParseListRecordsPage, origin kCrawl, position 0}.
//
// On failure nothing is returned (no record of the repo may be written): the Status message names
// the DID and the reason, and *failure (when given) says why; on success *failure is kNone.
Result<RepoRecords> ReadRepoRecords(std::string_view did, std::string_view signing_key,
                                    std::string_view car,
                                    const std::vector<std::string>& collections,
                                    const FetchLimits& limits, RepoFailure* failure = nullptr);

}  // namespace atfill::sources
