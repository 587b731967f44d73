// Lexicon validation per record, next to the CID check it runs beside: a like, a short post with a
// facet and a 2 KB reply with a quote, three images and facets (bench/sample_records.hpp), against
// the atproto lexicons (../shared/lexicons, or $ATFILL_SHARED/lexicons).
//
//   BM_LexiconValidate   the validation alone, on a record already parsed
//   BM_CidOfRecord       the CID check alone (parse, DAG-CBOR, SHA-256), what cid_verify does
//   BM_CidAndLexicon     both on one parse, what cid_verify does with [lexicons]
//
//   build/bench/lexicon_bench                                      (Release build)
#include <benchmark/benchmark.h>
#include <simdjson.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "atproto/json.hpp"
#include "atproto/lexicon.hpp"
#include "bench/sample_records.hpp"

namespace atfill::atproto {
namespace {

const LexiconCatalog& Catalog() {
  static const LexiconCatalog catalog = [] {
    const char* shared = std::getenv("ATFILL_SHARED");
    const std::string dir =
        std::string(shared != nullptr ? shared : ATFILL_SOURCE_DIR "/../shared") + "/lexicons";
    LexiconCatalog::Builder b;
    if (Status s = b.AddPath(dir); !s.ok()) {
      std::fprintf(stderr, "lexicon_bench: %s\n", s.ToString().c_str());
      std::exit(1);
    }
    return std::move(*b.Build());
  }();
  return catalog;
}

struct Sample {
  const char* collection;
  const std::string& json;
};
Sample Pick(int64_t which) {
  switch (which) {
    case 0:
      return {"app.bsky.feed.like", bench::Like()};
    case 1:
      return {"app.bsky.feed.post", bench::SmallPost()};
    default:
      return {"app.bsky.feed.post", bench::LargePost()};
  }
}
const char* kNames[] = {"like", "post", "post_embeds"};

void Label(benchmark::State& state, const Sample& s) {
  state.SetLabel(kNames[state.range(0)]);
  state.SetItemsProcessed(state.iterations());
  state.counters["json_bytes"] = static_cast<double>(s.json.size());
}

void BM_LexiconValidate(benchmark::State& state) {
  const Sample s = Pick(state.range(0));
  const LexiconCatalog& catalog = Catalog();
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(s.json).value();
  if (!catalog.Validate(s.collection, "3l7x2kb6qzs2a", doc).valid()) {
    state.SkipWithError("the sample record does not validate");
    return;
  }
  for (auto _ : state) {
    auto verdict = catalog.Validate(s.collection, "3l7x2kb6qzs2a", doc);
    benchmark::DoNotOptimize(verdict);
  }
  Label(state, s);
}
BENCHMARK(BM_LexiconValidate)->DenseRange(0, 2);

void BM_CidOfRecord(benchmark::State& state) {
  const Sample s = Pick(state.range(0));
  for (auto _ : state) {
    auto cid = CidOfRecord(s.json);
    benchmark::DoNotOptimize(cid);
  }
  Label(state, s);
}
BENCHMARK(BM_CidOfRecord)->DenseRange(0, 2);

class Validating final : public ParsedRecordVisitor {
 public:
  Validating(const LexiconCatalog& catalog, const char* collection)
      : catalog_(catalog), collection_(collection) {}
  void Visit(const simdjson::dom::element& record) override {
    valid_ = catalog_.Validate(collection_, "3l7x2kb6qzs2a", record).valid();
  }
  bool valid_ = false;

 private:
  const LexiconCatalog& catalog_;
  const char* collection_;
};

void BM_CidAndLexicon(benchmark::State& state) {
  const Sample s = Pick(state.range(0));
  Validating visitor(Catalog(), s.collection);
  for (auto _ : state) {
    auto cid = CidOfRecord(s.json, &visitor);
    benchmark::DoNotOptimize(cid);
  }
  if (!visitor.valid_) state.SkipWithError("the sample record does not validate");
  Label(state, s);
}
BENCHMARK(BM_CidAndLexicon)->DenseRange(0, 2);

}  // namespace
}  // namespace atfill::atproto

BENCHMARK_MAIN();
