// Reading repositories (com.atproto.sync.getRepo CARs): every block hash-checked, the MST walked,
// each record handed out (and, in the JSON variant, converted to atproto JSON as a crawl does).
// And the commit's signing key: parsed from its did:key form and used to verify a signature, per
// curve (a getRepo crawl does both once per repo).
#include <benchmark/benchmark.h>

#include <map>
#include <string>

#include "atproto/car.hpp"
#include "atproto/crypto.hpp"
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

// Arguments: curve (0 secp256k1, 1 P-256), what (0 parse the did:key, 1 verify, 2 sign).
void BM_CommitKey(benchmark::State& state) {
  const KeyType type = state.range(0) == 0 ? KeyType::kSecp256k1 : KeyType::kP256;
  auto key = PrivateKey::Generate(type);
  if (!key.ok()) return state.SkipWithError(key.status().ToString().c_str());
  const Bytes message(200, 0x5a);  // about an unsigned commit's size
  auto signature = key->Sign(message);
  if (!signature.ok()) return state.SkipWithError(signature.status().ToString().c_str());
  const std::string did_key = key->public_key().ToDidKey();
  const PublicKey public_key = key->public_key();
  for (auto _ : state) {
    if (state.range(1) == 0) {
      auto parsed = PublicKey::FromDidKey(did_key);
      if (!parsed.ok()) return state.SkipWithError("parse");
      benchmark::DoNotOptimize(parsed);
    } else if (state.range(1) == 1) {
      if (!public_key.Verify(message, *signature).ok()) return state.SkipWithError("verify");
    } else {
      auto sig = key->Sign(message);
      if (!sig.ok()) return state.SkipWithError("sign");
      benchmark::DoNotOptimize(sig);
    }
  }
  state.SetLabel(std::string(type == KeyType::kSecp256k1 ? "secp256k1" : "P-256") +
                 (state.range(1) == 0   ? ", parse did:key"
                  : state.range(1) == 1 ? ", verify"
                                        : ", sign"));
}

BENCHMARK(BM_CarBlocks)->Arg(10000);
BENCHMARK(BM_CommitKey)->ArgsProduct({{0, 1}, {0, 1, 2}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RepoWalk)->Args({10000, 0})->Args({10000, 1})->Args({1000, 1});

}  // namespace
}  // namespace atfill::atproto

BENCHMARK_MAIN();
