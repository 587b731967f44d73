// The getRepo half of sources/crawl/fetcher.hpp: a repo CAR read, verified and turned into records.
#include <string>
#include <vector>

#include "atproto/cbor.hpp"
#include "atproto/cid.hpp"
#include "atproto/crypto.hpp"
#include "atproto/json.hpp"
#include "atproto/repo.hpp"
#include "atproto/syntax.hpp"
#include "base/bytes.hpp"
#include "base/strings.hpp"
#include "sources/crawl/fetcher.hpp"
#include "sources/crawl/repo_diff.hpp"

namespace atfill::sources {

using pipeline::EventError;
using pipeline::RecordEvent;

std::string_view RepoFailureKind(RepoFailure failure) {
  switch (failure) {
    case RepoFailure::kNone:
      return "";
    case RepoFailure::kBadRepo:
      return "bad_repo";
    case RepoFailure::kDidMismatch:
      return "did_mismatch";
    case RepoFailure::kMissingKey:
      return "missing_key";
    case RepoFailure::kBadKey:
      return "bad_key";
    case RepoFailure::kBadSignature:
      return "bad_signature";
  }
  return "bad_repo";
}

Result<atproto::RepoReader> OpenSignedRepo(std::string_view did, std::string_view signing_key,
                                           std::string_view car, const FetchLimits& limits,
                                           RepoFailure* why) {
  *why = RepoFailure::kNone;
  const auto fail = [&](RepoFailure kind, StatusCode code, std::string_view reason) {
    *why = kind;
    return Status(code, "repo " + std::string(did) + ": " + std::string(reason));
  };

  if (signing_key.empty()) {
    return fail(RepoFailure::kMissingKey, StatusCode::kInvalid,
                "no signing key to verify its commit with");
  }
  auto key = signing_key.starts_with("did:key:") ? atproto::PublicKey::FromDidKey(signing_key)
                                                 : atproto::PublicKey::FromMultibase(signing_key);
  if (!key.ok()) {
    return fail(RepoFailure::kBadKey, StatusCode::kInvalid,
                "signing key " + QuoteForMessage(signing_key) +
                    " is not a did:key or publicKeyMultibase: " + key.status().message());
  }

  atproto::RepoReadOptions options;
  // A record over the record limit is that record's error, not the repo's: sections may be a
  // little larger than the largest record accepted.
  constexpr uint64_t kSectionOverhead = 4096;  // CID and length varint, with room to spare
  if (limits.max_record_bytes > options.car.max_section_bytes - kSectionOverhead) {
    options.car.max_section_bytes = static_cast<size_t>(std::min<uint64_t>(
                                        limits.max_record_bytes, SIZE_MAX - kSectionOverhead)) +
                                    kSectionOverhead;
  }
  auto reader = atproto::RepoReader::Open(AsBytes(car), options);
  if (!reader.ok()) {
    return fail(RepoFailure::kBadRepo, reader.status().code(),
                "CAR is not a readable repository: " + reader.status().message());
  }
  const atproto::Commit& commit = reader->commit();
  if (commit.did != did) {
    return fail(RepoFailure::kDidMismatch, StatusCode::kInvalid,
                "its commit " + reader->commit_cid().ToString() + " is for another DID, " +
                    QuoteForMessage(commit.did, 200));
  }
  if (Status s = key->Verify(reader->unsigned_commit(), commit.sig); !s.ok()) {
    return fail(RepoFailure::kBadSignature, StatusCode::kInvalid,
                "commit " + reader->commit_cid().ToString() +
                    " signature does not verify with key " + key->ToMultibase() + ": " +
                    s.message());
  }
  return reader;
}

Result<RepoRecords> ReadRepoRecords(std::string_view did, std::string_view signing_key,
                                    std::string_view car,
                                    const std::vector<std::string>& collections,
                                    const FetchLimits& limits, RepoFailure* failure) {
  RepoFailure ignored;
  RepoFailure& why = failure != nullptr ? *failure : ignored;
  const auto fail = [&](RepoFailure kind, StatusCode code, std::string_view reason) {
    why = kind;
    return Status(code, "repo " + std::string(did) + ": " + std::string(reason));
  };
  ATFILL_ASSIGN_OR_RETURN(auto reader, OpenSignedRepo(did, signing_key, car, limits, &why));
  const atproto::Commit& commit = reader.commit();

  RepoRecords out;
  out.rev = commit.rev;
  out.commit_cid = reader.commit_cid().ToString();
  out.data_cid = commit.data.ToString();
  const auto wanted = [&](std::string_view collection) {
    return collections.empty() ||
           std::find(collections.begin(), collections.end(), collection) != collections.end();
  };
  const auto uri = [&](std::string_view collection, std::string_view rkey) {
    std::string u = "at://";
    u.append(did).append("/").append(collection).append("/").append(rkey);
    return u;
  };
  const auto visit = [&](const atproto::RepoRecord& record) -> Status {
    if (!wanted(record.collection)) return Status::OK();
    const auto bad = [&](std::string kind, std::string message) {
      out.errors.push_back(
          {std::move(kind), uri(record.collection, record.rkey), std::move(message)});
      return Status::OK();
    };
    // JSON is never shorter than the DAG-CBOR it encodes, so an oversize block is refused before
    // it is decoded.
    if (record.cbor.size() > limits.max_record_bytes) {
      return bad("oversize_record", "record block is " + std::to_string(record.cbor.size()) +
                                        " bytes, more than the limit of " +
                                        std::to_string(limits.max_record_bytes));
    }
    RecordEvent r;
    if (Status st = atproto::CborRecordToJson(record.cbor, &r.body, &r.created_at); !st.ok()) {
      return bad("bad_record", "record block " + record.cid.ToString() + ": " + st.message());
    }
    if (r.body.size() > limits.max_record_bytes) {
      return bad("oversize_record", "record is " + std::to_string(r.body.size()) +
                                        " bytes of JSON, more than the limit of " +
                                        std::to_string(limits.max_record_bytes));
    }
    r.did.assign(did);
    r.collection.assign(record.collection);
    r.rkey.assign(record.rkey);
    r.operation = pipeline::Operation::kCreate;
    r.cid = record.cid;
    r.rev = commit.rev;
    r.origin = pipeline::Origin::kCrawl;
    out.records.push_back(std::move(r));
    return Status::OK();
  };
  std::vector<atproto::RecordError> missing;
  if (Status s = reader.ForEachRecord(visit, &missing); !s.ok()) {
    return fail(
        RepoFailure::kBadRepo, s.code(),
        "its MST does not walk from commit " + reader.commit_cid().ToString() + ": " + s.message());
  }
  for (const atproto::RecordError& e : missing) {
    const size_t slash = e.path.find('/');
    const std::string_view collection = std::string_view(e.path).substr(0, slash);
    if (!wanted(collection)) continue;
    out.errors.push_back({"bad_record", uri(collection, std::string_view(e.path).substr(slash + 1)),
                          e.status.message()});
  }
  return out;
}

}  // namespace atfill::sources
