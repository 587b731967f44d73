// atfill validate: records against lexicons, one verdict a line.
#include <simdjson.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "atproto/json.hpp"
#include "atproto/lexicon.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/atfill/line_blocks.hpp"

namespace atfill::cli {
namespace {

// The verdict of the record CidOfRecord has parsed, against the lexicon its $type names.
class Verdict final : public atproto::ParsedRecordVisitor {
 public:
  explicit Verdict(const atproto::LexiconCatalog& catalog) : catalog_(catalog) {}
  void Visit(const simdjson::dom::element& record) override {
    std::string_view type;
    if (record["$type"].get_string().get(type) != simdjson::SUCCESS) type = {};
    nsid_ = std::string(type);
    verdict_ = catalog_.Validate(nsid_, {}, record);
  }
  const std::string& nsid() const { return nsid_; }
  const atproto::LexiconVerdict& verdict() const { return verdict_; }

 private:
  const atproto::LexiconCatalog& catalog_;
  std::string nsid_;
  atproto::LexiconVerdict verdict_;
};

// A verdict per line of `in`, computed on every core and printed in input order (RunLineBlocks);
// returns the invalid ones.
size_t ValidateLines(std::istream& in, const atproto::LexiconCatalog& catalog, size_t* line_no) {
  return RunLineBlocks(in, line_no, [&catalog](LineBlock* b) {
    Verdict verdict(catalog);
    for (const std::string& line : b->lines) {
      std::string_view text = line;
      if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
      auto cid = atproto::CidOfRecord(text, &verdict);
      if (!cid.ok()) {
        b->out += "invalid: not an atproto record: " + cid.status().message();
        ++b->bad;
      } else if (verdict.verdict().outcome == atproto::LexiconVerdict::Outcome::kUnknown) {
        b->out += "unknown: no lexicon for " + verdict.nsid();
      } else if (verdict.verdict().valid()) {
        b->out += "valid";
      } else {
        b->out += "invalid: " + verdict.verdict().Describe();
        ++b->bad;
      }
      b->out += '\n';
    }
  });
}

}  // namespace

int RunValidate(std::span<char* const> args) {
  std::vector<std::string> lexicons;
  std::vector<std::string> paths;
  CLI::App app{"", "atfill validate"};
  PrepareVerbApp(app);
  app.add_option("--lexicons", lexicons, "a lexicon file or a folder of them (repeatable)")
      ->required()
      ->allow_extra_args(false);
  app.add_option("FILE", paths, "files of records, one JSON object a line (none: stdin)");
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  atproto::LexiconCatalog::Builder builder;
  for (const std::string& path : lexicons) {
    if (Status s = builder.AddPath(path); !s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.message().c_str());
      return s.code() == StatusCode::kInvalid ? kExitInputInvalid : kExitIo;
    }
  }
  auto catalog = builder.Build();
  if (!catalog.ok()) {
    std::fprintf(stderr, "error: %s\n", catalog.status().message().c_str());
    return kExitIo;
  }
  for (const std::string& ref : catalog->unresolved()) {
    std::fprintf(stderr, "warning: %s is not among the lexicons; records reaching it fail\n",
                 ref.c_str());
  }
  size_t invalid = 0;
  size_t line_no = 0;
  if (paths.empty()) {
    invalid = ValidateLines(std::cin, *catalog, &line_no);
  } else {
    for (const std::string& path : paths) {
      std::ifstream in(path, std::ios::binary);
      if (!in) {
        std::fflush(stdout);
        std::fprintf(stderr, "error: cannot open %s\n", path.c_str());
        return kExitIo;
      }
      invalid += ValidateLines(in, *catalog, &line_no);
    }
  }
  std::fflush(stdout);
  return invalid == 0 ? kExitOk : kExitInputInvalid;
}

}  // namespace atfill::cli
