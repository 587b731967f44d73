// The crawl's response parsers (sources/crawl/fetcher.hpp), on the same input: a listRecords page,
// the repo listings (listRepos, listReposByCollection) and a getRepoStatus answer. A page that
// parses was valid JSON throughout; every record it keeps is the repo and collection asked for,
// with a valid rkey, a dag-cbor CID and a body that is one JSON object within the size limit. Each
// record of the page is either kept or reported, whatever the limit.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "atproto/cid.hpp"
#include "atproto/syntax.hpp"
#include "sources/crawl/fetcher.hpp"
#include "tests/fuzz/fuzz_util.hpp"

namespace {

namespace sources = atfill::sources;
using atfill::fuzz::Check;
using atfill::fuzz::IsJson;

constexpr std::string_view kDid = "did:plc:abcdefghijklmnopqrstuvwx";
constexpr std::string_view kCollection = "app.bsky.feed.post";

void CheckPage(const sources::RecordsPage& page, const sources::FetchLimits& limits) {
  for (const auto& r : page.records) {
    Check(r.did == kDid && r.collection == kCollection, "a record is of the repo asked for");
    Check(atfill::atproto::ValidateRecordKey(r.rkey).ok(), "a record has a valid rkey");
    Check(r.cid.valid() && r.cid.codec() == atfill::atproto::Cid::Codec::kDagCbor,
          "a record has a dag-cbor CID");
    Check(r.body.size() <= limits.max_record_bytes, "a record is within the limit");
    Check(r.body.starts_with('{') && IsJson(r.body), "a record body is one JSON object");
  }
  for (const auto& e : page.errors) {
    Check(e.kind == "bad_record" || e.kind == "oversize_record", "a record error has its kind");
  }
}

void CheckRepos(const atfill::Result<sources::ReposPage>& page, std::string_view body) {
  if (!page.ok()) return;
  Check(IsJson(body), "a repo listing that parses is valid JSON");
  for (const auto& repo : page->repos) {
    Check(atfill::atproto::ValidateDid(repo.did).ok(), "a listed repo has a valid DID");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const sources::FetchLimits wide;
  sources::FetchLimits narrow;
  narrow.max_record_bytes = 64;
  auto page = sources::ParseListRecordsPage(kDid, kCollection, body, wide);
  auto small = sources::ParseListRecordsPage(kDid, kCollection, body, narrow);
  Check(page.ok() == small.ok(), "the record limit does not change whether a page parses");
  if (page.ok()) {
    Check(IsJson(body), "a page that parses is valid JSON");
    CheckPage(*page, wide);
    CheckPage(*small, narrow);
    Check(page->cursor == small->cursor, "the cursor does not depend on the limit");
    Check(
        page->records.size() + page->errors.size() == small->records.size() + small->errors.size(),
        "each record is kept or reported");
    Check(small->records.size() <= page->records.size(), "a lower limit keeps no more records");
  }
  CheckRepos(sources::ParseListRepos(body), body);
  CheckRepos(sources::ParseListReposByCollection(body), body);
  (void)sources::ParseRepoStatus(kDid, body);
  return 0;
}
