// The Lua record-script stage alone, on chunks of seeded Bluesky posts: no script for the
// collection (the lookup only), a pass-through script, a script that reads a field (the record is
// decoded, and kept byte for byte), and one that rewrites a field (decoded and re-encoded).
// Process is timed; refilling the chunk between iterations is not. us_per_record is the time per
// record in seconds (printed with an SI prefix: 300n = 0.3 µs).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "atproto/json.hpp"
#include "stages/script.hpp"

namespace atfill::stages {
namespace {

constexpr const char* kPost = "app.bsky.feed.post";

std::string RandomWords(std::mt19937_64& rng, int words) {
  static const char* kWords[] = {"harbour", "evening", "raft",   "consensus",  "book", "the",
                                 "a",       "walk",    "photos", "lighthouse", "gull", "path"};
  std::string out;
  for (int i = 0; i < words; ++i) {
    if (i > 0) out += ' ';
    out += kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
  }
  return out;
}

// ~300-byte posts with text, createdAt, langs and a tag facet; seeded, so every run is the same.
std::vector<pipeline::Event> Posts(size_t n) {
  std::mt19937_64 rng(42);
  std::vector<pipeline::Event> events;
  events.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    pipeline::RecordEvent r;
    r.did = "did:plc:" + std::to_string(100000000000000000 + rng() % 900000000000000000);
    r.collection = kPost;
    r.rkey = "3l" + std::to_string(1000000000 + i);
    r.rev = "3l7x" + std::to_string(100000000 + rng() % 900000000);
    r.operation = pipeline::Operation::kCreate;
    r.origin = pipeline::Origin::kLive;
    r.body = R"({"$type":"app.bsky.feed.post","text":")" + RandomWords(rng, 12) +
             R"( #reading","createdAt":"2024-11-05T21:14:09.387Z","langs":["en"],"facets":)"
             R"([{"index":{"byteStart":10,"byteEnd":18},"features":[{"$type":)"
             R"("app.bsky.richtext.facet#tag","tag":"reading"}]}]})";
    r.cid = *atproto::CidOfRecord(r.body);
    r.created_at = "2024-11-05T21:14:09.387Z";
    r.position = i;
    events.emplace_back(std::move(r));
  }
  return events;
}

void RunScript(benchmark::State& state, const std::string& collection, const std::string& source) {
  const size_t n = static_cast<size_t>(state.range(0));
  ScriptOptions options;
  options.sources[collection] = source;
  auto stage = ScriptStage::Create(options);
  if (!stage.ok()) {
    state.SkipWithError(stage.status().ToString().c_str());
    return;
  }
  auto worker = (*stage)->NewState();
  const std::vector<pipeline::Event> events = Posts(n);
  pipeline::EventChunk chunk;
  for (auto _ : state) {
    state.PauseTiming();
    chunk.events = events;
    chunk.counters.clear();
    chunk.dropped = 0;
    state.ResumeTiming();
    Status st = (*stage)->Process(worker.get(), &chunk);
    if (!st.ok() || chunk.events.size() != n) {
      state.SkipWithError("the script did not keep every record");
      return;
    }
    benchmark::DoNotOptimize(chunk.events.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(n));
  state.counters["us_per_record"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(n),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Records of a collection without a script: what every other collection pays.
void BM_NoScript(benchmark::State& state) {
  RunScript(state, "app.bsky.feed.like", "function record(e) return e end");
}
BENCHMARK(BM_NoScript)->ArgName("records")->Arg(1000);

void BM_PassThrough(benchmark::State& state) {
  RunScript(state, kPost, "function record(e) return e end");
}
BENCHMARK(BM_PassThrough)->ArgName("records")->Arg(1000);

// Reads the metadata only (no decode): a filter on the author.
void BM_FilterOnDid(benchmark::State& state) {
  RunScript(state, kPost,
            "function record(e) if e.did == 'did:plc:blocked' then return nil end return e end");
}
BENCHMARK(BM_FilterOnDid)->ArgName("records")->Arg(1000);

// Reads a field of the record: decoded, compared, kept byte for byte.
void BM_ReadField(benchmark::State& state) {
  RunScript(state, kPost,
            "function record(e) if e.record.text == '' then return nil end return e end");
}
BENCHMARK(BM_ReadField)->ArgName("records")->Arg(1000);

// Rewrites a field: decoded and re-encoded.
void BM_ModifyField(benchmark::State& state) {
  RunScript(state, kPost, "function record(e) e.record.text = e.record.text:upper() return e end");
}
BENCHMARK(BM_ModifyField)->ArgName("records")->Arg(1000);

}  // namespace
}  // namespace atfill::stages

BENCHMARK_MAIN();
