// Lexicon documents and records against them. The input's first line is a lexicon document, the
// rest a record of its main type (or of any NSID). Nothing may crash; a document that loads must
// build into a catalog; a record's verdict must be the same whether it is validated on its own
// parse or on the CID check's, and an invalid one must say why.
#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "atproto/json.hpp"
#include "atproto/lexicon.hpp"

namespace {

using atfill::atproto::LexiconCatalog;
using atfill::atproto::LexiconVerdict;

class OnItsParse final : public atfill::atproto::ParsedRecordVisitor {
 public:
  OnItsParse(const LexiconCatalog& catalog, std::string_view nsid)
      : catalog_(catalog), nsid_(nsid) {}
  void Visit(const simdjson::dom::element& record) override {
    verdict = catalog_.Validate(nsid_, "3kznmn7xqxl22", record);
    seen = true;
  }
  LexiconVerdict verdict;
  bool seen = false;

 private:
  const LexiconCatalog& catalog_;
  std::string_view nsid_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nl = input.find('\n');
  const std::string_view document = input.substr(0, nl);
  const std::string_view record =
      nl == std::string_view::npos ? std::string_view() : input.substr(nl + 1);
  LexiconCatalog::Builder builder;
  std::string nsid;
  if (!builder.Add(document, {}, &nsid).ok()) return 0;
  auto catalog = builder.Build();
  if (!catalog.ok()) std::abort();  // Add checked it: it must build
  const LexiconVerdict own = catalog->ValidateJson(nsid, "3kznmn7xqxl22", record);
  if (own.outcome == LexiconVerdict::Outcome::kInvalid && own.reason.empty()) std::abort();
  if (own.valid() && !own.path.empty()) std::abort();
  OnItsParse visit(*catalog, nsid);
  auto cid = atfill::atproto::CidOfRecord(record, &visit);
  if (cid.ok() != visit.seen) std::abort();
  if (visit.seen && (visit.verdict.outcome != own.outcome || visit.verdict.path != own.path ||
                     visit.verdict.reason != own.reason)) {
    std::abort();
  }
  return 0;
}
