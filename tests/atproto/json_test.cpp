#include <gtest/gtest.h>
#include <simdjson.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "atproto/cbor.hpp"
#include "atproto/cid.hpp"
#include "atproto/json.hpp"
#include "atproto/json_check.hpp"
#include "base/encoding.hpp"
#include "tests/common/jetstream_lines.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::atproto {
namespace {

namespace dom = simdjson::dom;

// The vector files are read with simdjson's DOM; each case's "json" member is handed to the code
// under test as compact JSON text.
struct Case {
  std::string label;
  std::string json;
  dom::element raw;
};

std::vector<Case> LoadCases(dom::parser& parser, const std::filesystem::path& path,
                            const char* json_key, const char* label_key) {
  std::vector<Case> cases;
  auto doc = parser.load(path.string());
  EXPECT_EQ(doc.error(), simdjson::SUCCESS) << path;
  if (doc.error() != simdjson::SUCCESS) return cases;
  for (dom::element item : doc.get_array()) {
    Case c;
    c.raw = item;
    c.json = simdjson::minify(item[json_key]);
    std::string_view label;
    if (item[label_key].get(label) == simdjson::SUCCESS) c.label = std::string(label);
    cases.push_back(std::move(c));
  }
  return cases;
}

Value Parse(std::string_view json) {
  auto v = JsonToValue(json);
  EXPECT_TRUE(v.ok()) << json << ": " << v.status().ToString();
  return v.ok() ? *v : Value();
}

std::string CborHex(std::string_view json) {
  Bytes out;
  Status st = JsonToCbor(json, &out);
  EXPECT_TRUE(st.ok()) << json << ": " << st.ToString();
  return HexEncode(out);
}

void ExpectReject(std::string_view json, StatusCode code, std::string_view fragment) {
  Bytes out = {0x99};
  Status st = JsonToCbor(json, &out);
  ASSERT_FALSE(st.ok()) << "accepted: " << json;
  EXPECT_EQ(st.code(), code) << json << ": " << st.ToString();
  EXPECT_NE(st.message().find(fragment), std::string::npos) << json << ": " << st.message();
  EXPECT_EQ(out, Bytes{0x99}) << "output changed on error: " << json;
  auto v = JsonToValue(json);
  ASSERT_FALSE(v.ok()) << "JsonToValue accepted: " << json;
  EXPECT_EQ(v.status().message(), st.message());
}

TEST(JsonFixtureTest, DataModelFixtures) {
  ATFILL_SHARED_PATH(path, "vectors/interop/data-model/data-model-fixtures.json");
  dom::parser parser;
  const std::vector<Case> cases = LoadCases(parser, path, "json", "cid");
  ASSERT_GT(cases.size(), 0u);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    const std::string want_cbor(c.raw["cbor_base64"].get_string().value());
    const std::string want_cid(c.raw["cid"].get_string().value());

    // JSON -> exact DAG-CBOR bytes and CID, directly and through a Value.
    Bytes cbor;
    ASSERT_TRUE(JsonToCbor(c.json, &cbor).ok());
    EXPECT_EQ(Base64Encode(cbor, Base64Alphabet::kStandard, false), want_cbor);
    auto cid = CidOfJson(c.json);
    ASSERT_TRUE(cid.ok()) << cid.status().ToString();
    EXPECT_EQ(cid->ToString(), want_cid);
    EXPECT_EQ(Cid::Compute(Cid::Codec::kDagCbor, cbor).ToString(), want_cid);
    const Value from_json = Parse(c.json);
    EXPECT_EQ(EncodeCbor(from_json), cbor);

    // CBOR -> Value -> JSON -> the same data.
    auto fixture_cbor = Base64Decode(want_cbor);
    ASSERT_TRUE(fixture_cbor.ok());
    auto decoded = DecodeCbor(*fixture_cbor);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(*decoded, from_json);
    const std::string json_again = ValueToJson(*decoded);
    EXPECT_EQ(Parse(json_again), *decoded) << json_again;
    EXPECT_EQ(CidOfJson(json_again)->ToString(), want_cid);
    // The same JSON straight from the bytes.
    std::string transcoded;
    ASSERT_TRUE(CborToJson(*fixture_cbor, &transcoded).ok());
    EXPECT_EQ(transcoded, json_again);

    // No fixture has a top-level $type, so none is a record.
    EXPECT_FALSE(CidOfRecord(c.json).ok());
  }
}

TEST(JsonFixtureTest, DataModelValid) {
  ATFILL_SHARED_PATH(path, "vectors/interop/data-model/data-model-valid.json");
  dom::parser parser;
  const std::vector<Case> cases = LoadCases(parser, path, "json", "note");
  ASSERT_GT(cases.size(), 0u);
  for (const Case& c : cases) {
    auto v = JsonObjectToValue(c.json);
    ASSERT_TRUE(v.ok()) << c.label << ": " << c.json << ": " << v.status().ToString();
    EXPECT_EQ(Parse(ValueToJson(*v)), *v) << c.label;
    EXPECT_TRUE(CidOfJson(c.json).ok()) << c.label;
  }
}

TEST(JsonFixtureTest, DataModelInvalid) {
  ATFILL_SHARED_PATH(path, "vectors/interop/data-model/data-model-invalid.json");
  dom::parser parser;
  const std::vector<Case> cases = LoadCases(parser, path, "json", "note");
  ASSERT_GT(cases.size(), 0u);
  for (const Case& c : cases) {
    auto v = JsonObjectToValue(c.json);
    EXPECT_FALSE(v.ok()) << "accepted invalid case \"" << c.label << "\": " << c.json;
    if (!v.ok()) {
      EXPECT_FALSE(v.status().message().empty()) << c.label;
    }
    EXPECT_FALSE(CidOfRecord(c.json).ok()) << c.label;
  }
}

// The lexicon record-data files are lexicon validation cases; only their valid records are plain
// data-model checks. "full" is excepted: its blobs link to dag-cbor CIDs and its "$bytes": "123"
// has non-zero trailing bits, both refused by the data-model rules here (raw blob refs, strict
// base64); the invalid file needs lexicons throughout and is not used.
TEST(JsonFixtureTest, LexiconRecordDataValid) {
  ATFILL_SHARED_PATH(path, "vectors/interop/lexicon/record-data-valid.json");
  dom::parser parser;
  const std::vector<Case> cases = LoadCases(parser, path, "data", "name");
  ASSERT_GT(cases.size(), 0u);
  size_t checked = 0;
  for (const Case& c : cases) {
    auto cid = CidOfRecord(c.json);
    if (c.label == "full") {
      EXPECT_FALSE(cid.ok());
      continue;
    }
    ++checked;
    EXPECT_TRUE(cid.ok()) << c.label << ": " << cid.status().ToString();
  }
  EXPECT_GT(checked, 0u);
}

// Real records from the network, with the CIDs their repositories committed.
TEST(JsonFixtureTest, JetstreamRecordsMatchTheirCids) {
  ATFILL_SHARED_PATH(corpus, "protocols/jetstream/data/internal/corpus/testdata/expected_v1.jsonl");
  ATFILL_SHARED_PATH(golden,
                     "protocols/jetstream/data/internal/subscribe/testdata/golden_v1.jsonl");
  dom::parser parser;
  size_t checked = 0;
  for (const auto& path : {corpus, golden}) {
    testing::ForEachRecordCommit(path, parser, [&](dom::element commit) {
      const std::string record = simdjson::minify(commit["record"]);
      const std::string_view want = commit["cid"].get_string().value();
      auto cid = CidOfRecord(record);
      ASSERT_TRUE(cid.ok()) << record << ": " << cid.status().ToString();
      EXPECT_EQ(cid->ToString(), want) << record;
      // The Value path and the DAG-CBOR decoder agree with the direct encoder.
      const Value v = Parse(record);
      Bytes direct;
      ASSERT_TRUE(JsonToCbor(record, &direct).ok());
      EXPECT_EQ(EncodeCbor(v), direct);
      EXPECT_EQ(*DecodeCbor(direct), v);
      EXPECT_EQ(Parse(ValueToJson(v)), v);
      ++checked;
    });
  }
  EXPECT_GT(checked, 100u);
}

TEST(JsonNumberTest, WholeNumbersAreIntegers) {
  EXPECT_EQ(Parse("123").as_int(), 123);
  EXPECT_EQ(Parse("123.0").as_int(), 123);
  EXPECT_EQ(Parse("1e2").as_int(), 100);
  EXPECT_EQ(Parse("1E+2").as_int(), 100);
  EXPECT_EQ(Parse("100e-2").as_int(), 1);
  EXPECT_EQ(Parse("-0").as_int(), 0);
  EXPECT_EQ(Parse("-0.0").as_int(), 0);
  EXPECT_EQ(Parse("0e99999999999999999999").as_int(), 0);
  EXPECT_EQ(Parse("-9223372036854775808").as_int(), INT64_MIN);
  EXPECT_EQ(Parse("9223372036854775807").as_int(), INT64_MAX);
  EXPECT_EQ(Parse("9223372036854775807.000").as_int(), INT64_MAX);
  EXPECT_EQ(Parse("-9.223372036854775808e18").as_int(), INT64_MIN);
  // Beyond 2^53 integers stay exact, with or without a fraction.
  EXPECT_EQ(Parse("9007199254740993").as_int(), 9007199254740993);
  EXPECT_EQ(Parse("9007199254740993.0").as_int(), 9007199254740993);
  EXPECT_EQ(CborHex("9007199254740993"), "1b0020000000000001");
  EXPECT_EQ(CborHex("{\"a\":[1.0,2e0,-3.00]}"), "a1616183010222");
  EXPECT_EQ(CborHex("-1"), "20");
}

TEST(JsonNumberTest, OtherNumbersAreErrors) {
  ExpectReject("0.5", StatusCode::kInvalid, "not an integer");
  ExpectReject("1e-3", StatusCode::kInvalid, "not an integer");
  ExpectReject("1e-400", StatusCode::kInvalid, "not an integer");
  ExpectReject("1.0000000000000000001", StatusCode::kInvalid, "not an integer");
  ExpectReject("{\"a\":[1,2.5]}", StatusCode::kInvalid, "\"2.5\" is not an integer");
  ExpectReject("9223372036854775808", StatusCode::kOutOfRange, "signed 64-bit");
  ExpectReject("18446744073709551615", StatusCode::kOutOfRange, "signed 64-bit");
  ExpectReject("-9223372036854775809", StatusCode::kOutOfRange, "signed 64-bit");
  ExpectReject("123456789012345678901234", StatusCode::kOutOfRange, "signed 64-bit");
  ExpectReject("1e400", StatusCode::kOutOfRange, "signed 64-bit");
  ExpectReject("9.3e18", StatusCode::kOutOfRange, "signed 64-bit");
  ExpectReject("1e99999999999999999999", StatusCode::kOutOfRange, "signed 64-bit");
  ExpectReject("01", StatusCode::kInvalid, "not a valid JSON number");
  ExpectReject("[1x]", StatusCode::kInvalid, "invalid JSON");
  ExpectReject("-", StatusCode::kInvalid, "not a valid JSON number");
}

TEST(JsonTest, KeysAreSortedAndDuplicatesRefused) {
  // {"a":3,"b":1,"aa":2}: shorter keys first, then bytewise.
  EXPECT_EQ(CborHex("{\"b\":1,\"aa\":2,\"a\":3}"),
            "a3616103616201626161"
            "02");
  ExpectReject("{\"a\":1,\"a\":2}", StatusCode::kInvalid, "duplicate key \"a\"");
  // Duplicates are judged after unescaping.
  ExpectReject("{\"a\":1,\"\\u0061\":2}", StatusCode::kInvalid, "duplicate key");
  ExpectReject("{\"x\":{\"k\":1,\"j\":0,\"k\":2}}", StatusCode::kInvalid, "at /x: duplicate");
}

TEST(JsonTest, StringsAreNeverNormalised) {
  // "é" precomposed and decomposed stay distinct.
  EXPECT_EQ(CborHex("\"\\u00e9\""), "62c3a9");
  EXPECT_EQ(CborHex("\"e\\u0301\""), "6365cc81");
  EXPECT_EQ(CborHex("\"\\ud83d\\ude00\""), "64f09f9880");
  EXPECT_EQ(CborHex("\"a\\u0000b\""), "63610062");
  ExpectReject("\"\\ud800\"", StatusCode::kInvalid, "invalid JSON");
  ExpectReject("\"\xff\"", StatusCode::kInvalid, "UTF-8");
  ExpectReject("{\"\xc3\x28\":1}", StatusCode::kInvalid, "UTF-8");
}

TEST(JsonTest, LinksAndBytes) {
  const std::string link = "bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a";
  const Value v = Parse("{\"$link\":\"" + link + "\"}");
  ASSERT_EQ(v.kind(), Value::Kind::kLink);
  EXPECT_EQ(v.as_link().ToString(), link);
  // Padding is optional on input, and never written.
  EXPECT_EQ(Parse("{\"$bytes\":\"AQID\"}").as_bytes(), (Bytes{1, 2, 3}));
  EXPECT_EQ(Parse("{\"$bytes\":\"AQI=\"}").as_bytes(), (Bytes{1, 2}));
  EXPECT_EQ(Parse("{\"$bytes\":\"AQI\"}").as_bytes(), (Bytes{1, 2}));
  EXPECT_EQ(ValueToJson(Value::BytesValue({1, 2})), "{\"$bytes\":\"AQI\"}");
  EXPECT_EQ(Parse("{\"$bytes\":\"\"}").as_bytes(), Bytes{});

  ExpectReject("{\"$link\":1234}", StatusCode::kInvalid, "$link must be a string");
  ExpectReject("{\"$link\":\".\"}", StatusCode::kInvalid, "$link");
  ExpectReject("{\"$link\":\"QmbWqxBEKC3P8tqsKc98xmWNzrzDtRLMiMPL8wBuTGsMnR\"}",
               StatusCode::kUnsupported, "CIDv0");
  ExpectReject("{\"$link\":\"" + link + "\",\"other\":1}", StatusCode::kInvalid, "no other fields");
  ExpectReject("{\"$bytes\":[1,2,3]}", StatusCode::kInvalid, "$bytes must be a string");
  ExpectReject("{\"$bytes\":\"AQID\",\"other\":\"x\"}", StatusCode::kInvalid, "no other fields");
  ExpectReject("{\"$bytes\":\"AQ-_\"}", StatusCode::kInvalid, "$bytes");
  ExpectReject("{\"$bytes\":\"AR\"}", StatusCode::kInvalid, "$bytes");  // trailing bits
  ExpectReject("{\"$link\":\"" + link + "\",\"$bytes\":\"AQID\"}", StatusCode::kInvalid,
               "no other fields");
}

TEST(JsonTest, TypeRules) {
  EXPECT_TRUE(JsonToValue("{\"$type\":\"com.example.x\",\"a\":1}").ok());
  ExpectReject("{\"$type\":null}", StatusCode::kInvalid, "$type must be a string, not null");
  ExpectReject("{\"$type\":123}", StatusCode::kInvalid, "$type must be a string, not a number");
  ExpectReject("{\"$type\":\"\"}", StatusCode::kInvalid, "$type must not be empty");
  ExpectReject("{\"a\":[{\"$type\":\"\"}]}", StatusCode::kInvalid,
               "at /a/0/$type: $type must not be empty");
  // JSON Pointer escaping of '/' and '~' in keys.
  ExpectReject("{\"a/b~\":{\"$type\":false}}", StatusCode::kInvalid, "at /a~1b~0/$type");
}

TEST(JsonTest, Blobs) {
  const std::string raw = "bafkreiccldh766hwcnuxnf2wh6jgzepf2nlu2lvcllt63eww5p6chi4ity";
  const std::string ref = "{\"$link\":\"" + raw + "\"}";
  const auto blob = [&](std::string_view fields) {
    return "{\"b\":{\"$type\":\"blob\"," + std::string(fields) + "}}";
  };
  const Value ok = Parse(blob("\"ref\":" + ref + ",\"mimeType\":\"image/jpeg\",\"size\":10000"));
  const Value* b = ok.Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->Find("ref")->as_link().ToString(), raw);
  EXPECT_EQ(b->Find("size")->as_int(), 10000);
  EXPECT_TRUE(JsonToValue(blob("\"ref\":" + ref + ",\"mimeType\":\"a/b\",\"size\":0")).ok());

  ExpectReject(blob("\"mimeType\":\"image/jpeg\",\"size\":10000"), StatusCode::kInvalid,
               "at /b: blob is missing \"ref\"");
  ExpectReject(blob("\"ref\":" + ref + ",\"size\":1"), StatusCode::kInvalid,
               "missing \"mimeType\"");
  ExpectReject(blob("\"ref\":" + ref + ",\"mimeType\":\"a/b\""), StatusCode::kInvalid,
               "missing \"size\"");
  ExpectReject(blob("\"ref\":" + ref + ",\"mimeType\":\"a/b\",\"size\":\"10000\""),
               StatusCode::kInvalid, "at /b/size: blob size must be an integer");
  ExpectReject(blob("\"ref\":" + ref + ",\"mimeType\":\"a/b\",\"size\":1.5"), StatusCode::kInvalid,
               "not an integer");
  ExpectReject(blob("\"ref\":" + ref + ",\"mimeType\":\"a/b\",\"size\":-1"), StatusCode::kInvalid,
               "must not be negative");
  ExpectReject(blob("\"ref\":" + ref + ",\"mimeType\":\"\",\"size\":1"), StatusCode::kInvalid,
               "mimeType must be a non-empty string");
  ExpectReject(blob("\"ref\":" + ref + ",\"mimeType\":5,\"size\":1"), StatusCode::kInvalid,
               "mimeType");
  ExpectReject(blob("\"ref\":" + ref + ",\"mimeType\":\"a/b\",\"size\":1,\"x\":1"),
               StatusCode::kInvalid, "unexpected field \"x\"");
  ExpectReject(blob("\"ref\":\"" + raw + "\",\"mimeType\":\"a/b\",\"size\":1"),
               StatusCode::kInvalid, "at /b/ref: blob ref must be a $link object");
  ExpectReject(
      blob("\"ref\":{\"$link\":\"bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a"
           "\"},\"mimeType\":\"a/b\",\"size\":1"),
      StatusCode::kInvalid, "raw codec");
  // Legacy blobs are plain maps.
  const Value legacy = Parse("{\"cid\":\"" + raw + "\",\"mimeType\":\"image/png\"}");
  EXPECT_EQ(legacy.Find("cid")->as_string(), raw);
}

TEST(JsonTest, DepthLimit) {
  const auto nested = [](size_t depth) {
    return std::string(depth, '[') + std::string(depth, ']');
  };
  EXPECT_TRUE(JsonToValue(nested(kJsonMaxDepth)).ok());
  ExpectReject(nested(kJsonMaxDepth + 1), StatusCode::kOutOfRange, "depth limit of 128");
  ExpectReject(nested(5000), StatusCode::kOutOfRange, "depth");
  // A $link object is a scalar in the data model: it does not count as a level.
  std::string deep = std::string(kJsonMaxDepth, '[') +
                     "{\"$link\":\"bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a\"}" +
                     std::string(kJsonMaxDepth, ']');
  EXPECT_TRUE(JsonToValue(deep).ok());
  Bytes cbor;
  ASSERT_TRUE(JsonToCbor(deep, &cbor).ok());
  EXPECT_TRUE(DecodeCbor(cbor).ok());
}

TEST(JsonTest, MalformedJson) {
  ExpectReject("", StatusCode::kInvalid, "invalid JSON");
  ExpectReject("{", StatusCode::kInvalid, "invalid JSON");
  ExpectReject("{\"a\":1}x", StatusCode::kInvalid, "invalid JSON");
  ExpectReject("{\"a\":1} {\"b\":2}", StatusCode::kInvalid, "invalid JSON");
  ExpectReject("[1,]", StatusCode::kInvalid, "invalid JSON");
  ExpectReject("{'a':1}", StatusCode::kInvalid, "invalid JSON");
  ExpectReject("tru", StatusCode::kInvalid, "invalid JSON");
}

TEST(JsonTest, TopLevelRules) {
  EXPECT_EQ(Parse("\"blah\"").as_string(), "blah");
  auto object = JsonObjectToValue("\"blah\"");
  ASSERT_FALSE(object.ok());
  EXPECT_NE(object.status().message().find("top level must be a JSON object"), std::string::npos);
  EXPECT_FALSE(JsonObjectToValue("[]").ok());
  EXPECT_TRUE(JsonObjectToValue("{}").ok());

  auto record = CidOfRecord("{\"$type\":\"app.bsky.feed.like\",\"createdAt\":\"x\"}");
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ(record->codec(), Cid::Codec::kDagCbor);
  EXPECT_EQ(*record, *CidOfJson("{\"createdAt\":\"x\",\"$type\":\"app.bsky.feed.like\"}"));
  auto untyped = CidOfRecord("{\"createdAt\":\"x\"}");
  ASSERT_FALSE(untyped.ok());
  EXPECT_NE(untyped.status().message().find("$type"), std::string::npos);
  EXPECT_FALSE(CidOfRecord("[]").ok());
  EXPECT_FALSE(CidOfRecord("{\"$bytes\":\"AQID\"}").ok());
  EXPECT_FALSE(JsonObjectToValue("{\"$bytes\":\"AQID\"}").ok());
  EXPECT_TRUE(JsonToValue("{\"$bytes\":\"AQID\"}").ok());
  EXPECT_FALSE(CidOfRecord("{\"$type\":\"\"}").ok());
  EXPECT_FALSE(CidOfRecord("{\"$type\":7}").ok());
}

TEST(JsonTest, JsonToCborAppends) {
  Bytes out = {0x01, 0x02};
  ASSERT_TRUE(JsonToCbor("{\"a\":true}", &out).ok());
  EXPECT_EQ(HexEncode(out), "0102a16161f5");
  // Long strings take more bytes in CBOR (a 5-byte head) than in JSON (two quotes): the writer
  // grows past its first guess.
  std::string big = "[";
  for (int i = 0; i < 10; ++i) big += (i ? ",\"" : "\"") + std::string(70000, 'a' + i) + "\"";
  big += "]";
  Bytes cbor;
  ASSERT_TRUE(JsonToCbor(big, &cbor).ok());
  EXPECT_GT(cbor.size(), big.size());
  EXPECT_EQ(EncodeCbor(Parse(big)), cbor);
}

TEST(JsonTest, ValueToJsonEscapes) {
  Value::Map map;
  map.emplace_back("q\"k", Value::String("line\nbreak\ttab\\ \x01 \x7f \xc3\xa9 \"end\""));
  map.emplace_back("n", Value::Int(INT64_MIN));
  map.emplace_back(
      "l", Value::Link(*Cid::Parse("bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a")));
  map.emplace_back("a", Value::MakeArray({Value::Null(), Value::Bool(false), Value::Bool(true)}));
  const Value v = Value::MakeMap(std::move(map));
  const std::string json = ValueToJson(v);
  EXPECT_EQ(json,
            "{\"q\\\"k\":\"line\\nbreak\\ttab\\\\ \\u0001 \x7f \xc3\xa9 \\\"end\\\"\","
            "\"n\":-9223372036854775808,"
            "\"l\":{\"$link\":\"bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a\"},"
            "\"a\":[null,false,true]}");
  Value canonical = v;
  canonical.Canonicalize();
  EXPECT_EQ(Parse(json), canonical);
  std::string appended = "x";
  ValueToJson(Value::Int(5), &appended);
  EXPECT_EQ(appended, "x5");
}

TEST(JsonTest, ThreadsGetTheSameAnswers) {
  const std::string post =
      "{\"$type\":\"app.bsky.feed.post\",\"text\":\"hello\",\"createdAt\":"
      "\"2024-01-01T00:00:00.000Z\",\"langs\":[\"en\"]}";
  const Cid want = *CidOfRecord(post);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        auto cid = CidOfRecord(i % 7 == 0 ? std::string("{\"$type\":\"x\",\"n\":1.5}") : post);
        if (i % 7 == 0 ? cid.ok() : (!cid.ok() || *cid != want)) ++mismatches[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(JsonCheckTest, NumbersFollowTheRfc8259Grammar) {
  for (const char* ok :
       {"0", "-0", "12", "-3.25", "1e9", "1E+2", "2.5e-3", "123456789012345678901"}) {
    EXPECT_TRUE(IsJsonNumber(ok)) << ok;
  }
  for (const char* bad : {"", "-", "01", "1.", ".5", "1e", "+1", "0x10", "1.2.3", "NaN", "1 "}) {
    EXPECT_FALSE(IsJsonNumber(bad)) << bad;
  }
}

// What On Demand would skip unseen inside a value no decoder reads is an error; nesting past the
// limit stops the visit and says so.
TEST(JsonCheckTest, EveryTokenOfAValueIsChecked) {
  struct Case {
    const char* json;
    bool ok;
  };
  const Case cases[] = {
      {R"({"a":[1,{"b":"c"},true,null,-2.5e3]})", true},
      {R"({"a":[1,%]})", false},
      {R"({"a":{"b":nul}})", false},
      {R"({"a":[tru]})", false},
      {R"({"a":01})", false},
      {R"({"a":"\q"})", false},
  };
  for (const Case& c : cases) {
    simdjson::padded_string text(std::string_view(c.json));
    simdjson::ondemand::parser parser;
    simdjson::ondemand::document doc;
    ASSERT_EQ(parser.iterate(text).get(doc), simdjson::SUCCESS) << c.json;
    simdjson::ondemand::value root;
    ASSERT_EQ(doc.get_value().get(root), simdjson::SUCCESS) << c.json;
    bool too_deep = false;
    const simdjson::error_code e = CheckJsonValue(root, 0, kJsonMaxDepth, &too_deep);
    EXPECT_EQ(e == simdjson::SUCCESS, c.ok) << c.json << ": " << simdjson::error_message(e);
    EXPECT_FALSE(too_deep) << c.json;
  }
  simdjson::padded_string deep(std::string_view(R"({"a":[[["x"]]]})"));
  simdjson::ondemand::parser parser;
  simdjson::ondemand::document doc;
  ASSERT_EQ(parser.iterate(deep).get(doc), simdjson::SUCCESS);
  simdjson::ondemand::value root;
  ASSERT_EQ(doc.get_value().get(root), simdjson::SUCCESS);
  bool too_deep = false;
  EXPECT_EQ(CheckJsonValue(root, 0, 3, &too_deep), simdjson::SUCCESS);
  EXPECT_TRUE(too_deep);
}

}  // namespace
}  // namespace atfill::atproto
