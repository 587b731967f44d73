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

namespace atfill::atproto {
namespace {

// ~300 bytes: an app.bsky.feed.post with text, createdAt, langs and a hashtag facet.
const std::string& SmallPost() {
  static const std::string json =
      R"({"$type":"app.bsky.feed.post","text":"Finished the distributed systems book )"
      R"(tonight. The chapter on consensus finally made Raft click for me. #reading",)"
      R"("createdAt":"2024-11-05T21:14:09.387Z","langs":["en"],"facets":[{"index":)"
      R"({"byteStart":109,"byteEnd":117},"features":[{"$type":"app.bsky.richtext.facet#tag",)"
      R"("tag":"reading"}]}]})";
  return json;
}

// ~2 KB: a reply (root and parent strongRefs) with a quote of another post and three images
// (blob refs, alt text, aspect ratios), link and mention facets, and self-labels.
const std::string& LargePost() {
  static const std::string json = [] {
    std::string images;
    for (int i = 0; i < 3; ++i) {
      if (i > 0) images += ",";
      images += R"({"alt":"Photo )" + std::to_string(i + 1) +
                R"( of the harbour at dusk: fishing boats moored along the quay, gulls on the )"
                R"(railings, and the lighthouse just switching on in the distance.",)"
                R"("image":{"$type":"blob","ref":{"$link":"bafkreihdwdcefgh4dqkjv67uzcmw7ojee6)"
                R"(xedzdetojuzjevtenxquvyku"},"mimeType":"image/jpeg","size":)" +
                std::to_string(734512 + i * 1031) +
                R"(},"aspectRatio":{"width":2000,)"
                R"("height":1500}})";
    }
    return std::string(R"({"$type":"app.bsky.feed.post",)") +
           R"("text":"Evening walk along the harbour with @alice.example.com. The new )"
           R"(waterfront path is open; details and opening hours on the city site: )"
           R"(https://example.org/harbour-path and more photos later this week.",)"
           R"("createdAt":"2024-11-05T18:42:51.112Z","langs":["en","nl"],)"
           R"("reply":{"root":{"uri":"at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/app.bsky.feed.post/)"
           R"(3l7x2kb6qzs2a","cid":)"
           R"("bafyreiclp443lavogvhj3d2ob2cxbfuscni2k5jk7bebjzg7khl3esabwq"},)"
           R"("parent":{"uri":"at://did:plc:vwzwgnygau7ed7b7wt5ux7y2/app.bsky.feed.post/)"
           R"(3l7x3hjm5ur2c","cid":)"
           R"("bafyreihldkhcwijkde7gx4rpkkuw7pl6lbyu5gieunyc7ihactn5bkd2nm"}},)"
           R"("embed":{"$type":"app.bsky.embed.recordWithMedia","record":{"$type":)"
           R"("app.bsky.embed.record","record":{"uri":"at://did:plc:z72i7hdynmk6r22z27h6tvur/)"
           R"(app.bsky.feed.post/3l7wzq4xkbc2k","cid":)"
           R"("bafyreid3imdulnhgeytpf6uk7zahjvrsqlofkmm5b5ub2maw4kqus6jp4i"}},)"
           R"("media":{"$type":"app.bsky.embed.images","images":[)" +
           images +
           R"(]}},"facets":[{"index":{"byteStart":36,"byteEnd":54},"features":[{"$type":)"
           R"("app.bsky.richtext.facet#mention","did":"did:plc:vwzwgnygau7ed7b7wt5ux7y2"}]},)"
           R"({"index":{"byteStart":141,"byteEnd":173},"features":[{"$type":)"
           R"("app.bsky.richtext.facet#link","uri":"https://example.org/harbour-path"}]}],)"
           R"("labels":{"$type":"com.atproto.label.defs#selfLabels","values":[]},)"
           R"("tags":["harbour","photography"]})";
  }();
  return json;
}

const std::string& Record(int which) { return which == 0 ? SmallPost() : LargePost(); }

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
