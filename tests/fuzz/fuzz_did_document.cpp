// DID documents as the PLC directory or a did:web host serves them (sources::ParseDidDocument).
// Each input is parsed for the DID its own "id" names (so accepted documents are reachable) and
// for a fixed DID, under the default endpoint rules and with loopback endpoints allowed. An
// outcome is either a document or an error with a kind and a sentence; an accepted endpoint
// passes the endpoint rules and ends in no '/'; the handle is valid; and the resolved entry
// round-trips through the resolver cache. Seeds: ours, and the PLC directory's documents of the
// shared Jetstream capture.
#include <simdjson.h>
#include <zstd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "atproto/syntax.hpp"
#include "sources/crawl/resolver.hpp"
#include "state/kv_store.hpp"
#include "state/resolver_cache.hpp"
#include "tests/fuzz/fuzz_util.hpp"

namespace {

namespace sources = atfill::sources;
using atfill::fuzz::Check;

constexpr int64_t kNowUs = 1'700'000'000'000'000;

void Resolve(std::string_view did, std::string_view json, const sources::ResolverOptions& options) {
  const sources::ResolveOutcome out = sources::ParseDidDocument(did, json, options, kNowUs);
  if (!out.ok()) {
    Check(!out.error_kind.empty() && !out.message.empty(), "a failure has a kind and a sentence");
    Check(out.error_kind == "bad_did_document" || out.error_kind == "no_pds_endpoint" ||
              out.error_kind == "bad_endpoint",
          "a document failure has a document kind");
    return;
  }
  Check(out.error_kind.empty() && out.message.empty(), "a success carries no error");
  Check(atfill::fuzz::IsJson(json), "an accepted document is valid JSON");
  const atfill::state::ResolvedDid& doc = *out.doc;
  Check(!doc.pds_endpoint.ends_with('/'), "the endpoint loses its trailing '/'");
  Check(sources::CheckResolvedEndpoint(doc.pds_endpoint, options).ok(),
        "the endpoint passes the endpoint rules");
  Check(doc.handle.empty() || atfill::atproto::ValidateHandle(doc.handle).ok(),
        "the handle is valid");
  Check(
      doc.resolved_at_us == kNowUs && doc.expires_at_us == kNowUs + options.cache_ttl_s * 1'000'000,
      "resolved and expiry times");
  static const std::unique_ptr<atfill::state::KvStore> kv = atfill::state::NewMemoryKvStore();
  atfill::state::ResolverCache cache(*kv);
  Check(cache.Store(did, doc).ok(), "a resolved DID can be cached");
  auto cached = cache.Get(did, kNowUs);
  Check(cached.ok() && cached->has_value() && **cached == doc, "a cached DID reads back the same");
}

}  // namespace

// The shared capture holds every DID document of its window as one zstd-compressed JSON object
// (DID -> document); each document becomes a seed of its own in the work folder (run_fuzz.sh's
// ATFILL_FUZZ_WORK, in the build tree), before libFuzzer reads its corpus folders.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto packed = atfill::fuzz::ReadSharedFile("internal/corpus/testdata/did_docs.json.zst");
  if (!packed) return 0;
  std::string json(size_t{1} << 20, '\0');
  const size_t n = ZSTD_decompress(json.data(), json.size(), packed->data(), packed->size());
  atfill::fuzz::Check(!ZSTD_isError(n), "the shared DID documents decompress");
  json.resize(n);
  simdjson::dom::parser parser;
  simdjson::dom::object docs;
  atfill::fuzz::Check(
      parser.parse(simdjson::padded_string(json)).get_object().get(docs) == simdjson::SUCCESS,
      "the shared DID documents are an object");
  size_t i = 0;
  for (auto [did, doc] : docs) {
    atfill::fuzz::WriteSeed("plc_directory_" + std::to_string(i++) + ".json",
                            simdjson::minify(doc));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  sources::ResolverOptions strict;
  sources::ResolverOptions loopback;
  loopback.allow_loopback_endpoints = true;
  sources::ResolverOptions open;
  open.allow_private_endpoints = true;

  std::string did = "did:plc:abcdefghijklmnopqrstuvwx";
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  std::string_view id;
  if (parser.parse(simdjson::padded_string(json)).get(root) == simdjson::SUCCESS &&
      root["id"].get_string().get(id) == simdjson::SUCCESS) {
    did.assign(id);
  }
  for (const auto* options : {&strict, &loopback, &open}) Resolve(did, json, *options);
  Resolve("did:web:example.com", json, strict);
  return 0;
}
