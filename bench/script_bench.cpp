// The Lua record-script stage alone, on chunks of seeded Bluesky posts: no script for the
// collection (the lookup only), a pass-through script, a script that reads a field (the record is
// decoded, and kept byte for byte), one that rewrites a field (decoded and re-encoded), and the
// pattern functions on a field.
// Process is timed; refilling the chunk between iterations is not. us_per_record is the time per
// record in seconds (printed with an SI prefix: 300n = 0.3 µs).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "atproto/json.hpp"
#include "stages/script/script.hpp"

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
    // The script never fails, so no retry waits: the chunk is done when Start returns false.
    const bool handed_off = (*stage)->Start(worker.get(), &chunk, false, [](Status, bool) {});
    if (handed_off || chunk.events.size() != n) {
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

// The pattern functions on a metadata field (no decode), each a call into the worker's pattern
// state: a plain find, a match with captures, gmatch and gsub with a function (one find per
// match: 18 digits).
void BM_FindOnDid(benchmark::State& state) {
  RunScript(state, kPost,
            "function record(e) if e.did:find('blocked', 1, true) then return nil end return e "
            "end");
}
BENCHMARK(BM_FindOnDid)->ArgName("records")->Arg(1000);

void BM_MatchOnDid(benchmark::State& state) {
  RunScript(state, kPost,
            "function record(e) local method, id = e.did:match('^did:(%a+):(%w+)$') "
            "if method ~= 'plc' then return nil end return e end");
}
BENCHMARK(BM_MatchOnDid)->ArgName("records")->Arg(1000);

void BM_GmatchOnDid(benchmark::State& state) {
  RunScript(state, kPost,
            "function record(e) local n = 0 for part in e.did:gmatch('[^:]+') do n = n + 1 end "
            "if n ~= 3 then return nil end return e end");
}
BENCHMARK(BM_GmatchOnDid)->ArgName("records")->Arg(1000);

void BM_GsubFunctionOnDid(benchmark::State& state) {
  RunScript(state, kPost,
            "function record(e) local s, n = e.did:gsub('%d', function(d) return d end) "
            "if n == 0 then return nil end return e end");
}
BENCHMARK(BM_GsubFunctionOnDid)->ArgName("records")->Arg(1000);

// Issue 19's memory bomb: every record fails (1 MB strings until the 64 MiB cap), with the
// default four attempts; the time per record is what such a script costs a job.
void BM_MemoryBomb(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  ScriptOptions options;
  options.sources[kPost] =
      "function record(e) local t = {} for i = 1, 1e9 do t[i] = string.rep('x', 1e6) end end";
  options.retry_backoff = std::chrono::microseconds(0);
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
    chunk.errors.clear();
    chunk.counters.clear();
    chunk.dropped = 0;
    state.ResumeTiming();
    // Retries run at once (no backoff): the chunk is done when Start returns false.
    const bool handed_off = (*stage)->Start(worker.get(), &chunk, false, [](Status, bool) {});
    if (handed_off || chunk.errors.size() != n) {
      state.SkipWithError("the script did not fail on every record");
      return;
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(n));
  state.counters["us_per_record"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(n),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_MemoryBomb)->ArgName("records")->Arg(4)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace atfill::stages

BENCHMARK_MAIN();
