// A repeated backfill of one repo that changed 1% since the last: the bytes of the whole CAR
// (com.atproto.sync.getRepo) against those of getRepo?since=<the last rev> (the new commit, the
// changed MST nodes and the new records), and the time to read each: ReadRepoRecords of the whole
// repo against ReadRepoDiff of the answer with the stored records of the repo at that rev.
// Counters: car_bytes (the answer), events (records handed to the engine), needs_full (1 when the
// answer could not settle the deletes).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "atproto/car.hpp"
#include "atproto/crypto.hpp"
#include "atproto/repo.hpp"
#include "atproto/tid.hpp"
#include "base/bytes.hpp"
#include "sources/crawl/fetcher.hpp"
#include "sources/crawl/repo_diff.hpp"

namespace atfill::sources {
namespace {

constexpr const char* kDid = "did:plc:ewvi7nxzyoun6zhxrhs64oiz";

struct Scenario {
  std::string full_car;                        // the repo now
  std::string since_car;                       // what getRepo?since=<old rev> answers
  std::vector<pipeline::StoredRecord> stored;  // the table: the repo at the old rev
  std::string key;                             // the signing key, multibase
};

std::string Post(const char* collection, uint64_t i, const char* what) {
  return "{\"$type\":\"" + std::string(collection) + "\",\"text\":\"" + what + " number " +
         std::to_string(i) +
         " with enough words to look like a real post on the network, about records and repos\","
         "\"createdAt\":\"2026-11-30T09:00:00.000Z\",\"langs\":[\"en\"]}";
}

// `n` records under three collections, TID keys; then `permille`/1000 of them deleted, as many
// updated and as many created (newer TIDs, as a PDS writes them).
const Scenario& ScenarioOf(int64_t n, int64_t permille) {
  static std::map<std::pair<int64_t, int64_t>, Scenario> cache;
  auto it = cache.find({n, permille});
  if (it != cache.end()) return it->second;
  const char* collections[] = {"app.bsky.feed.post", "app.bsky.feed.like", "app.bsky.graph.follow"};
  std::map<std::string, std::pair<const char*, std::string>> records;  // key -> (collection, json)
  auto rkey = [](uint64_t i) {
    return atproto::Tid::FromParts(1'780'000'000'000'000 + i * 1000, 3)->str();
  };
  for (int64_t i = 0; i < n; ++i) {
    const char* c = collections[i % 3];
    records[std::string(c) + "/" + rkey(i)] = {c, Post(c, i, "post")};
  }
  auto write = [&](const std::string& rev, const atproto::PrivateKey& key) {
    atproto::RepoWriter writer;
    for (const auto& [k, v] : records) {
      if (!writer.PutJson(v.first, k.substr(k.find('/') + 1), v.second).ok()) std::abort();
    }
    auto repo = writer.Write(kDid, rev, key);
    if (!repo.ok()) std::abort();
    return std::move(*repo);
  };
  auto key = atproto::PrivateKey::Generate(atproto::KeyType::kSecp256k1);
  const atproto::WrittenRepo before = write("3lbqzbaaaaa2a", *key);
  std::vector<std::string> keys;
  for (const auto& [k, v] : records) keys.push_back(k);
  std::mt19937 rng(7);
  std::shuffle(keys.begin(), keys.end(), rng);
  const int64_t changes = std::max<int64_t>(1, n * permille / 1000);
  for (int64_t i = 0; i < changes; ++i) records.erase(keys[i]);
  for (int64_t i = changes; i < 2 * changes; ++i) {
    auto& r = records[keys[i]];
    r.second = Post(r.first, static_cast<uint64_t>(i), "edited");
  }
  for (int64_t i = 0; i < changes; ++i) {
    const char* c = collections[i % 3];
    records[std::string(c) + "/" + rkey(static_cast<uint64_t>(n + i))] = {
        c, Post(c, static_cast<uint64_t>(n + i), "new")};
  }
  const atproto::WrittenRepo after = write("3lbqzbaaaab2a", *key);

  Scenario s;
  s.key = key->public_key().ToMultibase();
  s.full_car.assign(AsChars(after.car));
  std::set<atproto::Cid> old;
  auto r = atproto::CarReader::Open(before.car);
  atproto::CarBlock b;
  while (*r->Next(&b)) old.insert(b.cid);
  auto a = atproto::CarReader::Open(after.car);
  atproto::CarWriter w(a->roots());
  while (*a->Next(&b)) {
    if (!old.count(b.cid) && !w.Add(b.cid, b.data).ok()) std::abort();
  }
  s.since_car.assign(AsChars(w.bytes()));
  auto reader = atproto::RepoReader::Open(ByteView(before.car));
  if (!reader.ok()) std::abort();
  if (!reader
           ->ForEachRecord(
               [&](const atproto::RepoRecord& rec) {
                 s.stored.push_back({std::string(rec.collection), std::string(rec.rkey),
                                     rec.cid.ToString(), "3lbqzbaaaaa2a"});
                 return Status::OK();
               },
               nullptr)
           .ok()) {
    std::abort();
  }
  return cache[{n, permille}] = std::move(s);
}

void BM_RepoFull(benchmark::State& state) {
  const Scenario& s = ScenarioOf(state.range(0), state.range(1));
  size_t events = 0;
  for (auto _ : state) {
    auto got = ReadRepoRecords(kDid, s.key, s.full_car, {}, {});
    if (!got.ok()) std::abort();
    events = got->records.size();
  }
  state.counters["car_bytes"] = static_cast<double>(s.full_car.size());
  state.counters["events"] = static_cast<double>(events);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.full_car.size()));
}

void BM_RepoSince(benchmark::State& state) {
  const Scenario& s = ScenarioOf(state.range(0), state.range(1));
  size_t events = 0;
  bool needs_full = false;
  for (auto _ : state) {
    auto got = ReadRepoDiff(kDid, s.key, s.since_car, s.stored, {}, {});
    if (!got.ok()) std::abort();
    events = got->events.size();
    needs_full = got->needs_full;
  }
  state.counters["car_bytes"] = static_cast<double>(s.since_car.size());
  state.counters["events"] = static_cast<double>(events);
  state.counters["needs_full"] = needs_full ? 1 : 0;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.since_car.size()));
}

// 10,000 records, 1% (10 per mille) of them deleted, as many updated and as many created.
BENCHMARK(BM_RepoFull)->Args({10000, 10})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RepoSince)->Args({10000, 10})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace atfill::sources

BENCHMARK_MAIN();
