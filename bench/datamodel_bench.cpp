// The data model's hot paths on fixed, realistic Bluesky records: CidOfRecord (JSON parse +
// DAG-CBOR encode + SHA-256, what the CID-verify stage does per record), JsonToCbor alone,
// DecodeCbor of the same records' blocks (what repo and CAR readers do), and their JSON made
// from those blocks (what replay and the fetcher do).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>

#include "atproto/cbor.hpp"
#include "atproto/json.hpp"
#include "base/sha256.hpp"
#include "bench/sample_records.hpp"

namespace atfill::atproto {
namespace {

const std::string& Record(int which) {
  return which == 0 ? bench::SmallPost() : bench::LargePost();
}

Bytes CborOf(const std::string& json) {
  Bytes out;
  if (!JsonToCbor(json, &out).ok()) std::abort();
  return out;
}

void BM_CidOfRecord(benchmark::State& state) {
  const std::string& json = Record(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    auto cid = CidOfRecord(json);
    benchmark::DoNotOptimize(cid);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(json.size()));
  state.counters["json_bytes"] = static_cast<double>(json.size());
}
BENCHMARK(BM_CidOfRecord)->ArgName("large")->Arg(0)->Arg(1);

void BM_JsonToCbor(benchmark::State& state) {
  const std::string& json = Record(static_cast<int>(state.range(0)));
  Bytes out;
  for (auto _ : state) {
    out.clear();
    Status st = JsonToCbor(json, &out);
    benchmark::DoNotOptimize(st);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(json.size()));
  state.counters["cbor_bytes"] = static_cast<double>(out.size());
}
BENCHMARK(BM_JsonToCbor)->ArgName("large")->Arg(0)->Arg(1);

void BM_DecodeCbor(benchmark::State& state) {
  const Bytes cbor = CborOf(Record(static_cast<int>(state.range(0))));
  for (auto _ : state) {
    auto value = DecodeCbor(cbor);
    benchmark::DoNotOptimize(value);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(cbor.size()));
}
BENCHMARK(BM_DecodeCbor)->ArgName("large")->Arg(0)->Arg(1);

// A record's atproto JSON from its DAG-CBOR block, as replay and the fetcher make it: /0 through a
// Value (DecodeCbor + ValueToJson, as before CborToJson), /1 straight from the bytes
// (CborRecordToJson, createdAt captured). Each into a fresh string, as each event owns its body.
void BM_CborRecordToJson(benchmark::State& state) {
  const Bytes cbor = CborOf(Record(static_cast<int>(state.range(0))));
  const bool direct = state.range(1) == 1;
  for (auto _ : state) {
    std::string json;
    if (direct) {
      std::string created_at;
      Status st = CborRecordToJson(cbor, &json, &created_at);
      benchmark::DoNotOptimize(st);
      benchmark::DoNotOptimize(created_at.data());
    } else {
      auto value = DecodeCbor(cbor);
      ValueToJson(*value, &json);
      const Value* created = value->Find("createdAt");
      std::string created_at = created != nullptr ? created->as_string() : std::string();
      benchmark::DoNotOptimize(created_at.data());
    }
    benchmark::DoNotOptimize(json.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(cbor.size()));
}
BENCHMARK(BM_CborRecordToJson)->ArgNames({"large", "direct"})->ArgsProduct({{0, 1}, {0, 1}});

// The pieces CidOfRecord is made of, for reading its profile.
void BM_Sha256OfCbor(benchmark::State& state) {
  const Bytes cbor = CborOf(Record(static_cast<int>(state.range(0))));
  for (auto _ : state) benchmark::DoNotOptimize(Sha256(cbor));
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(cbor.size()));
}
BENCHMARK(BM_Sha256OfCbor)->ArgName("large")->Arg(0)->Arg(1);

void BM_JsonToValue(benchmark::State& state) {
  const std::string& json = Record(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    auto value = JsonToValue(json);
    benchmark::DoNotOptimize(value);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(json.size()));
}
BENCHMARK(BM_JsonToValue)->ArgName("large")->Arg(0)->Arg(1);

void BM_EncodeCbor(benchmark::State& state) {
  const Value value = *DecodeCbor(CborOf(Record(static_cast<int>(state.range(0)))));
  Bytes out;
  for (auto _ : state) {
    out.clear();
    EncodeCbor(value, &out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(out.size()));
}
BENCHMARK(BM_EncodeCbor)->ArgName("large")->Arg(0)->Arg(1);

}  // namespace
}  // namespace atfill::atproto
