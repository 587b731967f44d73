#include <gtest/gtest.h>

#include <string>

#include "atproto/cbor.hpp"
#include "atproto/cid.hpp"
#include "atproto/json.hpp"
#include "atproto/value.hpp"
#include "base/encoding.hpp"

namespace atfill::atproto {
namespace {

Bytes Hex(std::string_view hex) {
  std::string compact;
  for (char c : hex) {
    if (c != ' ') compact += c;
  }
  auto bytes = HexDecode(compact);
  EXPECT_TRUE(bytes.ok()) << hex;
  return bytes.ok() ? *bytes : Bytes{};
}

// The 36-byte binary form of a dag-cbor CID, as hex.
const std::string& CidHex() {
  static const std::string hex = HexEncode(
      Cid::Parse("bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a")->binary());
  return hex;
}

// Decoding must fail with `code` and a message holding `fragment`; transcoding to JSON must fail
// with the very same status.
void ExpectReject(std::string_view hex, StatusCode code, std::string_view fragment,
                  const CborLimits& limits = {}) {
  auto v = DecodeCbor(Hex(hex), limits);
  ASSERT_FALSE(v.ok()) << "accepted " << hex;
  EXPECT_EQ(v.status().code(), code) << hex << ": " << v.status().ToString();
  EXPECT_NE(v.status().message().find(fragment), std::string::npos)
      << hex << ": " << v.status().message();
  std::string json;
  const Status transcoded = CborToJson(Hex(hex), &json, nullptr, limits);
  EXPECT_EQ(transcoded.ToString(), v.status().ToString()) << hex;
}

// Decodes `hex`, which must be valid; CborToJson must write exactly the decoded value's JSON.
Value Decoded(std::string_view hex) {
  auto v = DecodeCbor(Hex(hex));
  EXPECT_TRUE(v.ok()) << hex << ": " << v.status().ToString();
  if (!v.ok()) return Value();
  std::string json = "prefix:";
  const Status transcoded = CborToJson(Hex(hex), &json);
  EXPECT_TRUE(transcoded.ok()) << hex << ": " << transcoded.ToString();
  EXPECT_EQ(json, "prefix:" + ValueToJson(*v)) << hex;
  return *v;
}

TEST(CborDecodeTest, AcceptsCanonicalData) {
  const Value v = Decoded("a2 6161 01 6162 83 f5 f4 f6");
  ASSERT_EQ(v.kind(), Value::Kind::kMap);
  ASSERT_EQ(v.as_map().size(), 2u);
  EXPECT_EQ(v.Find("a")->as_int(), 1);
  const Value::Array& arr = v.Find("b")->as_array();
  ASSERT_EQ(arr.size(), 3u);
  EXPECT_TRUE(arr[0].as_bool());
  EXPECT_FALSE(arr[1].as_bool());
  EXPECT_TRUE(arr[2].is_null());
  EXPECT_EQ(v.Find("c"), nullptr);

  EXPECT_EQ(Decoded("43 010203").as_bytes(), (Bytes{1, 2, 3}));
  EXPECT_EQ(Decoded("63 e282ac").as_string(), "\xe2\x82\xac");
  EXPECT_EQ(Decoded("a0").as_map().size(), 0u);
  EXPECT_EQ(Decoded("80").as_array().size(), 0u);
  // Shorter keys sort first: "b" before "aa".
  EXPECT_EQ(Decoded("a2 6162 02 626161 01").as_map()[1].first, "aa");
}

TEST(CborDecodeTest, IntegersAtEveryHeadWidth) {
  const std::pair<const char*, int64_t> cases[] = {
      {"00", 0},
      {"17", 23},
      {"1818", 24},
      {"18ff", 255},
      {"190100", 256},
      {"19ffff", 65535},
      {"1a00010000", 65536},
      {"1b0000000100000000", 4294967296},
      {"1b7fffffffffffffff", INT64_MAX},
      {"20", -1},
      {"37", -24},
      {"3818", -25},
      {"3b7fffffffffffffff", INT64_MIN},
  };
  for (const auto& [hex, want] : cases) {
    EXPECT_EQ(Decoded(hex).as_int(), want) << hex;
    EXPECT_EQ(EncodeCbor(Value::Int(want)), Hex(hex)) << hex;
  }
}

TEST(CborDecodeTest, RejectsNonMinimalHeads) {
  ExpectReject("1817", StatusCode::kInvalid, "non-minimal");
  ExpectReject("1900ff", StatusCode::kInvalid, "non-minimal");
  ExpectReject("1a0000ffff", StatusCode::kInvalid, "non-minimal");
  ExpectReject("1b00000000ffffffff", StatusCode::kInvalid, "non-minimal");
  ExpectReject("3817", StatusCode::kInvalid, "non-minimal");
  ExpectReject("7801 61", StatusCode::kInvalid, "non-minimal");
  ExpectReject("5801 00", StatusCode::kInvalid, "non-minimal");
  ExpectReject("9800", StatusCode::kInvalid, "non-minimal");
  ExpectReject("b800", StatusCode::kInvalid, "non-minimal");
  ExpectReject("a1 7801 61 01", StatusCode::kInvalid, "at byte 1: non-minimal");
}

TEST(CborDecodeTest, RejectsIntegersOutsideInt64) {
  ExpectReject("1b8000000000000000", StatusCode::kOutOfRange, "9223372036854775808");
  ExpectReject("1bffffffffffffffff", StatusCode::kOutOfRange, "signed 64-bit");
  ExpectReject("3b8000000000000000", StatusCode::kOutOfRange, "-9223372036854775809");
  ExpectReject("3bffffffffffffffff", StatusCode::kOutOfRange, "-18446744073709551616");
}

TEST(CborDecodeTest, RejectsUnsortedAndDuplicateKeys) {
  ExpectReject("a2 6162 01 6161 02", StatusCode::kInvalid, "at byte 4: map keys out of order");
  // Length first: "aa" may not precede "b".
  ExpectReject("a2 626161 01 6162 02", StatusCode::kInvalid, "out of order");
  ExpectReject("a2 6161 01 6161 02", StatusCode::kInvalid, "at byte 4: duplicate map key \"a\"");
}

TEST(CborDecodeTest, RejectsNonStringKeys) {
  ExpectReject("a1 01 02", StatusCode::kInvalid, "map key must be a text string");
  ExpectReject("a1 4161 02", StatusCode::kInvalid, "map key must be a text string");
  ExpectReject("a1 f6 02", StatusCode::kInvalid, "map key must be a text string");
}

TEST(CborDecodeTest, RejectsFloatsUndefinedAndSimpleValues) {
  ExpectReject("f93c00", StatusCode::kInvalid, "floating-point");
  ExpectReject("f97e00", StatusCode::kInvalid, "floating-point");
  ExpectReject("fa3f800000", StatusCode::kInvalid, "floating-point");
  ExpectReject("fb3ff0000000000000", StatusCode::kInvalid, "floating-point");
  ExpectReject("fb0000000000000000", StatusCode::kInvalid, "floating-point");
  ExpectReject("f7", StatusCode::kInvalid, "undefined");
  ExpectReject("f0", StatusCode::kInvalid, "simple values");
  ExpectReject("f820", StatusCode::kInvalid, "simple values");
  ExpectReject("ff", StatusCode::kInvalid, "break");
  ExpectReject("fc", StatusCode::kInvalid, "reserved");
  ExpectReject("a1 6161 fa3f800000", StatusCode::kInvalid, "at byte 3: floating-point");
}

TEST(CborDecodeTest, RejectsIndefiniteLengths) {
  ExpectReject("9f 01 ff", StatusCode::kInvalid, "indefinite-length");
  ExpectReject("bf 6161 01 ff", StatusCode::kInvalid, "indefinite-length");
  ExpectReject("5f 4100 ff", StatusCode::kInvalid, "indefinite-length");
  ExpectReject("7f 6161 ff", StatusCode::kInvalid, "indefinite-length");
  ExpectReject("1c", StatusCode::kInvalid, "reserved");
}

TEST(CborDecodeTest, TagsOnlyCidLinks) {
  const Value link = Decoded("d82a 5825 00" + CidHex());
  ASSERT_EQ(link.kind(), Value::Kind::kLink);
  EXPECT_EQ(link.as_link().ToString(),
            "bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a");

  ExpectReject("c1 00", StatusCode::kInvalid, "tag 1 is not allowed");
  ExpectReject("d82b 5825 00" + CidHex(), StatusCode::kInvalid, "tag 43");
  ExpectReject("d9002a 5825 00" + CidHex(), StatusCode::kInvalid, "non-minimal");
  // No 0x00 identity-multibase prefix before the binary CID.
  ExpectReject("d82a 5824 " + CidHex(), StatusCode::kInvalid, "0x00");
  ExpectReject("d82a 40", StatusCode::kInvalid, "0x00");
  ExpectReject("d82a 6161", StatusCode::kInvalid, "must wrap a byte string");
  ExpectReject("d82a 5826 00" + CidHex() + "00", StatusCode::kInvalid, "trailing");
  // A CIDv1 with the dag-pb codec is a real CID, but not one atproto uses.
  std::string dag_pb = CidHex();
  dag_pb[2] = '7';
  dag_pb[3] = '0';
  ExpectReject("d82a 5825 00" + dag_pb, StatusCode::kUnsupported, "dag-pb");
}

TEST(CborDecodeTest, RejectsInvalidUtf8) {
  ExpectReject("62 c328", StatusCode::kInvalid, "UTF-8");
  ExpectReject("62 c080", StatusCode::kInvalid, "UTF-8");      // overlong
  ExpectReject("63 eda080", StatusCode::kInvalid, "UTF-8");    // surrogate
  ExpectReject("64 f4908080", StatusCode::kInvalid, "UTF-8");  // above U+10FFFF
  ExpectReject("a1 61ff 01", StatusCode::kInvalid, "at byte 1: text string is not valid UTF-8");
  // Byte strings are not text: any bytes go.
  EXPECT_EQ(Decoded("42 c328").as_bytes().size(), 2u);
}

TEST(CborDecodeTest, DepthLimit) {
  CborLimits limits;
  limits.max_depth = 4;
  EXPECT_TRUE(DecodeCbor(Hex("81818181 00"), limits).ok());
  ExpectReject("8181818181 00", StatusCode::kOutOfRange, "depth", limits);
  ExpectReject("a1 6161 a1 6161 a1 6161 a1 6161 a1 6161 00", StatusCode::kOutOfRange, "depth",
               limits);
  // The default limit (128) stops a deep input without exhausting the stack.
  std::string nested;
  for (size_t i = 0; i < 100000; ++i) nested += "81";
  ExpectReject(nested + "00", StatusCode::kOutOfRange, "depth limit of 128");
}

TEST(CborDecodeTest, TruncatedInput) {
  ExpectReject("", StatusCode::kCorrupt, "at byte 0: input is truncated");
  ExpectReject("18", StatusCode::kCorrupt, "truncated");
  ExpectReject("1b000000", StatusCode::kCorrupt, "truncated");
  ExpectReject("62 61", StatusCode::kCorrupt, "runs past the end");
  ExpectReject("a1 6161", StatusCode::kCorrupt, "truncated");
  ExpectReject("82 01", StatusCode::kCorrupt, "runs past the end");
  ExpectReject("d82a", StatusCode::kCorrupt, "truncated");
  // A huge declared length fails before anything is allocated.
  ExpectReject("9b 7fffffffffffffff", StatusCode::kOutOfRange, "exceeds the limit");
  ExpectReject("5a ffffffff", StatusCode::kOutOfRange, "exceeds the limit");
  ExpectReject("9a 000fffff 00", StatusCode::kCorrupt, "runs past the end");
}

TEST(CborDecodeTest, TrailingBytes) {
  ExpectReject("01 02", StatusCode::kInvalid, "at byte 1: 1 trailing bytes");
  ExpectReject("a0 00 00", StatusCode::kInvalid, "2 trailing bytes");
}

TEST(CborDecodeTest, SizeAndItemLimits) {
  CborLimits limits;
  limits.max_items = 2;
  EXPECT_TRUE(DecodeCbor(Hex("82 01 02"), limits).ok());
  ExpectReject("83 01 02 03", StatusCode::kOutOfRange, "array length of 3", limits);
  ExpectReject("63 616263", StatusCode::kOutOfRange, "text string length of 3", limits);
  limits = {};
  limits.max_bytes = 3;
  ExpectReject("83 01 02 03", StatusCode::kOutOfRange, "exceeds the limit of 3", limits);
}

TEST(CborToJsonTest, WritesAtprotoJsonAndCapturesATopLevelField) {
  const Bytes cbor = Hex("a4 61 61 81 43 010203 62 6964 d82a 5825 00" + CidHex() +
                         " 64 74657874 62 0a22 69 637265617465644174 64 32303234");
  std::string json;
  CborTopField field{.key = "createdAt", .value = {}, .found = false};
  ASSERT_TRUE(CborToJson(cbor, &json, &field).ok());
  EXPECT_EQ(json,
            "{\"a\":[{\"$bytes\":\"AQID\"}],\"id\":{\"$link\":"
            "\"bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a\"},"
            "\"text\":\"\\n\\\"\",\"createdAt\":\"2024\"}");
  EXPECT_TRUE(field.found);
  EXPECT_EQ(field.value, "2024");
  EXPECT_EQ(Decoded(HexEncode(cbor)).Find("createdAt")->as_string(), "2024");

  // Only a text string at the top level is captured: not a nested one, not an integer.
  field = CborTopField{.key = "createdAt", .value = {}, .found = false};
  json.clear();
  ASSERT_TRUE(CborToJson(Hex("a1 61 61 a1 69 637265617465644174 61 78"), &json, &field).ok());
  EXPECT_FALSE(field.found);
  json.clear();
  ASSERT_TRUE(CborToJson(Hex("a1 69 637265617465644174 07"), &json, &field).ok());
  EXPECT_FALSE(field.found);
  EXPECT_EQ(json, "{\"createdAt\":7}");
  // A long string (two-byte head) comes back whole.
  const std::string long_text(300, 'x');
  json.clear();
  ASSERT_TRUE(CborToJson(Hex("a1 69 637265617465644174 79012c" +
                             HexEncode(Bytes(long_text.begin(), long_text.end()))),
                         &json, &field)
                  .ok());
  EXPECT_TRUE(field.found);
  EXPECT_EQ(field.value, long_text);
}

TEST(CborToJsonTest, ARecordBlockMustBeAMap) {
  std::string json;
  std::string created_at = "unchanged";
  ASSERT_TRUE(CborRecordToJson(Hex("a1 6161 01"), &json, &created_at).ok());
  EXPECT_EQ(json, "{\"a\":1}");
  EXPECT_EQ(created_at, "unchanged");  // the record has no createdAt
  json.clear();
  ASSERT_TRUE(CborRecordToJson(Hex("a1 69 637265617465644174 61 78"), &json, &created_at).ok());
  EXPECT_EQ(created_at, "x");

  for (const char* not_a_map : {"", "01", "81 01", "61 61"}) {
    const Status st = CborRecordToJson(Hex(not_a_map), &json, &created_at);
    EXPECT_EQ(st.code(), StatusCode::kInvalid) << not_a_map;
    EXPECT_EQ(st.message(), "the record is not a DAG-CBOR map") << not_a_map;
  }
  const Status unsorted = CborRecordToJson(Hex("a2 6162 01 6161 02"), &json, &created_at);
  EXPECT_EQ(unsorted.code(), StatusCode::kInvalid);
  EXPECT_EQ(unsorted.message(),
            "the record is not a DAG-CBOR map: at byte 4: map keys out of order: \"a\" after "
            "\"b\"");
  const Status truncated = CborRecordToJson(Hex("a1 6161"), &json, &created_at);
  EXPECT_EQ(truncated.code(), StatusCode::kCorrupt);
  EXPECT_EQ(truncated.message(), "the record is not a DAG-CBOR map: at byte 3: input is truncated");
}

TEST(CborEncodeTest, MapsAreWrittenInCanonicalOrder) {
  Value::Map map;
  map.emplace_back("bb", Value::Int(1));
  map.emplace_back("a", Value::Bool(true));
  map.emplace_back("c", Value::MakeArray({Value::Null(), Value::String("x")}));
  const Value v = Value::MakeMap(std::move(map));
  const Bytes bytes = EncodeCbor(v);
  EXPECT_EQ(bytes, Hex("a3 6161 f5 6163 82 f6 6178 626262 01"));

  // Decoding gives the canonical order; Canonicalize makes the builder's Value equal to it.
  Value sorted = v;
  EXPECT_FALSE(*DecodeCbor(bytes) == sorted);
  sorted.Canonicalize();
  EXPECT_EQ(*DecodeCbor(bytes), sorted);
  EXPECT_EQ(sorted.as_map()[0].first, "a");
  EXPECT_EQ(sorted.as_map()[2].first, "bb");

  Bytes appended = {0xaa};
  EncodeCbor(v, &appended);
  EXPECT_EQ(appended.size(), bytes.size() + 1);
  EXPECT_EQ(appended[0], 0xaa);
}

TEST(CborEncodeTest, RoundTripsEveryKind) {
  const Cid cid = *Cid::Parse("bafkreiccldh766hwcnuxnf2wh6jgzepf2nlu2lvcllt63eww5p6chi4ity");
  Value::Map nested;
  nested.emplace_back("z", Value::MakeArray());
  nested.emplace_back("link", Value::Link(cid));
  Value::Map map;
  map.emplace_back("int_max", Value::Int(INT64_MAX));
  map.emplace_back("int_min", Value::Int(INT64_MIN));
  map.emplace_back("bytes", Value::BytesValue(Bytes(300, 0x5a)));
  map.emplace_back("text", Value::String(std::string(70000, 'q')));
  map.emplace_back("empty", Value::String(""));
  map.emplace_back("nested", Value::MakeMap(std::move(nested)));
  Value v = Value::MakeMap(std::move(map));
  v.Canonicalize();
  const Bytes bytes = EncodeCbor(v);
  auto back = DecodeCbor(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, v);
  EXPECT_EQ(EncodeCbor(*back), bytes);
  EXPECT_EQ(back->Find("nested")->Find("link")->as_link(), cid);
}

TEST(CborDecodeTest, PrefixDecodesTheFirstOfTwoItems) {
  Value first = Value::MakeMap({{"op", Value::Int(1)}, {"t", Value::String("#commit")}});
  first.Canonicalize();
  Bytes both = EncodeCbor(first);
  const size_t first_size = both.size();
  EncodeCbor(Value::Int(7), &both);
  size_t consumed = 0;
  auto got = DecodeCborPrefix(both, &consumed);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, first);
  EXPECT_EQ(consumed, first_size);
  EXPECT_EQ(DecodeCbor(ByteView(both).subspan(consumed))->as_int(), 7);
  // The same rules as DecodeCbor: a truncated first item is Corrupt, a broken one Invalid.
  EXPECT_EQ(DecodeCborPrefix(ByteView(both).first(first_size - 1), &consumed).status().code(),
            StatusCode::kCorrupt);
  const Bytes unsorted = {0xa2, 0x62, 'o', 'p', 0x01, 0x61, 't', 0x01};  // "op" before "t"
  EXPECT_EQ(DecodeCborPrefix(unsorted, &consumed).status().code(), StatusCode::kInvalid);
  CborLimits small;
  small.max_bytes = both.size() - 1;
  EXPECT_EQ(DecodeCborPrefix(both, &consumed, small).status().code(), StatusCode::kOutOfRange)
      << "the limit applies to the whole input";
}

}  // namespace
}  // namespace atfill::atproto
