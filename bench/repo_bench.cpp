// Reading repositories (com.atproto.sync.getRepo CARs): every block hash-checked, the MST walked,
// each record handed out (and, in the JSON variant, converted to atproto JSON as a crawl does).
#include <benchmark/benchmark.h>

#include <map>
#include <string>

#include "atproto/car.hpp"
#include "atproto/repo.hpp"
#include "atproto/tid.hpp"

namespace atfill::atproto {
namespace {

// A signed repository of `n` posts (~300 B each) under three collections.
const Bytes& RepoOf(int64_t n) {
  static std::map<int64_t, Bytes> repos;
  auto it = repos.find(n);
  if (it != repos.end()) return it->second;
  RepoWriter writer;
  const char* collections[] = {"app.bsky.feed.post", "app.bsky.feed.like", "app.bsky.graph.follow"};
  for (int64_t i = 0; i < n; ++i) {
    const std::string rkey =
        Tid::FromParts(1'780'000'000'000'000 + static_cast<uint64_t>(i) * 1000, 3)->str();
    const std::string json =
        "{\"$type\":\"" + std::string(collections[i % 3]) + "\",\"text\":\"post number " +
        std::to_string(i) +
        " with enough words to look like a real post on the network, about records and repos\","
        "\"createdAt\":\"2026-11-30T09:00:00.000Z\",\"langs\":[\"en\"],\"reply\":{\"root\":{"
        "\"uri\":"
        "\"at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/app.bsky.feed.post/3l2zpbbhuvw2h\",\"cid\":"
        "\"bafyreie5cvv4h45feadgeuwhbcutmh6t2ceseocckahdoe6uat64zmz454\"}}}";
    if (!writer.PutJson(collections[i % 3], rkey, json).ok()) std::abort();
  }
  auto key = PrivateKey::Generate(KeyType::kSecp256k1);
  auto repo = writer.Write("did:plc:ewvi7nxzyoun6zhxrhs64oiz", "3lbqzbaaaaa2a", *key);
  if (!repo.ok()) std::abort();
  return repos[n] = std::move(repo->car);
}

void BM_CarBlocks(benchmark::State& state) {
  const Bytes& car = RepoOf(state.range(0));
  int64_t blocks = 0;
  for (auto _ : state) {
    auto reader = CarReader::Open(car);
    CarBlock block;
    while (*reader->Next(&block)) ++blocks;
  }
  state.SetItemsProcessed(blocks);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * car.size()));
  state.SetLabel("blocks, hashes checked");
}

void BM_RepoWalk(benchmark::State& state) {
  const Bytes& car = RepoOf(state.range(0));
  const bool json = state.range(1) != 0;
  int64_t records = 0;
  for (auto _ : state) {
    auto reader = RepoReader::Open(ByteView(car));
    std::vector<RecordError> errors;
    Status s = reader->ForEachRecord(
        [&](const RepoRecord& r) {
          if (json) benchmark::DoNotOptimize(r.ToJson());
          ++records;
          return Status::OK();
        },
        &errors);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  state.SetItemsProcessed(records);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * car.size()));
  state.SetLabel(json ? "records as JSON" : "records");
}

BENCHMARK(BM_CarBlocks)->Arg(10000);
BENCHMARK(BM_RepoWalk)->Args({10000, 0})->Args({10000, 1})->Args({1000, 1});

}  // namespace
}  // namespace atfill::atproto

BENCHMARK_MAIN();
