#include <gtest/gtest.h>

#include "base/bloom_filter.hpp"
#include "base/bytes.hpp"
#include "base/encoding.hpp"
#include "base/json_writer.hpp"
#include "base/sha256.hpp"
#include "base/status.hpp"

namespace atfill {
namespace {

TEST(StatusTest, OkAndErrors) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.ToString(), "OK");
  Status bad = Status::Invalid("bad rkey");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), StatusCode::kInvalid);
  EXPECT_EQ(bad.ToString(), "Invalid: bad rkey");
  EXPECT_EQ(bad.WithContext("line 3").message(), "line 3: bad rkey");
  Status copy = bad;
  EXPECT_EQ(copy.message(), "bad rkey");
}

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::Invalid("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  ATFILL_ASSIGN_OR_RETURN(int h, Half(x));
  return Half(h);
}

TEST(StatusTest, ResultPropagates) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().message(), "odd");
  Result<int> from_ok_status{Status::OK()};
  EXPECT_EQ(from_ok_status.status().code(), StatusCode::kInternal);
}

TEST(VarintTest, RoundTripAndStrictness) {
  for (uint64_t v : {0ull, 1ull, 127ull, 128ull, 300ull, 0x1200ull, (1ull << 63) - 1}) {
    Bytes b;
    AppendVarint(v, &b);
    size_t used = 0;
    auto r = ReadVarint(b, &used);
    ASSERT_TRUE(r.ok()) << v;
    EXPECT_EQ(*r, v);
    EXPECT_EQ(used, b.size());
  }
  size_t used = 0;
  const Bytes non_minimal = {0x80, 0x00};
  EXPECT_FALSE(ReadVarint(non_minimal, &used).ok());
  const Bytes truncated = {0x80};
  EXPECT_EQ(ReadVarint(truncated, &used).status().code(), StatusCode::kCorrupt);
}

TEST(EncodingTest, Base32) {
  EXPECT_EQ(Base32LowerEncode(AsBytes("foobar")), "mzxw6ytboi");
  EXPECT_EQ(AsChars(*Base32LowerDecode("mzxw6ytboi")), "foobar");
  EXPECT_FALSE(Base32LowerDecode("MZXW").ok());
  EXPECT_FALSE(Base32LowerDecode("mzxw6ytboj").ok());  // non-zero trailing bits
}

TEST(EncodingTest, Base58) {
  EXPECT_EQ(Base58BtcEncode(AsBytes("hello world")), "StV1DL6CwTryKyV");
  const Bytes zeros = {0, 0, 1};
  EXPECT_EQ(Base58BtcEncode(zeros), "112");
  EXPECT_EQ(*Base58BtcDecode("112"), zeros);
  EXPECT_EQ(AsChars(*Base58BtcDecode("StV1DL6CwTryKyV")), "hello world");
  EXPECT_FALSE(Base58BtcDecode("0OIl").ok());
}

TEST(EncodingTest, Base64) {
  EXPECT_EQ(Base64Encode(AsBytes("fo")), "Zm8=");
  EXPECT_EQ(Base64Encode(AsBytes("fo"), Base64Alphabet::kStandard, false), "Zm8");
  EXPECT_EQ(AsChars(*Base64Decode("Zm8=")), "fo");
  EXPECT_EQ(AsChars(*Base64Decode("Zm8")), "fo");
  EXPECT_EQ(AsChars(*Base64Decode("Zm9v")), "foo");
  EXPECT_FALSE(Base64Decode("Zm9").ok());   // trailing bits set
  EXPECT_FALSE(Base64Decode("Z").ok());     // impossible length
  EXPECT_FALSE(Base64Decode("Zm-_").ok());  // URL alphabet in standard
  EXPECT_TRUE(Base64Decode("Zm-_", Base64Alphabet::kUrl).ok());
}

TEST(EncodingTest, Hex) {
  const Bytes b = {0x00, 0xab, 0xff};
  EXPECT_EQ(HexEncode(b), "00abff");
  EXPECT_EQ(*HexDecode("00ABff"), b);
  EXPECT_FALSE(HexDecode("0g").ok());
}

TEST(Sha256Test, KnownDigest) {
  EXPECT_EQ(HexEncode(Sha256(AsBytes("abc"))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace atfill

namespace atfill {
namespace {

TEST(JsonWriterTest, NestedWithEscapes) {
  JsonWriter w;
  w.BeginObject().Key("a").Int(-1).Key("s").String("q\"\n\x01").Key("l").BeginArray();
  w.Uint(1).Bool(true).Null().Double(0.5).EndArray().Key("o").BeginObject().EndObject();
  w.EndObject();
  EXPECT_EQ(w.str(), "{\"a\":-1,\"s\":\"q\\\"\\n\\u0001\",\"l\":[1,true,null,0.5],\"o\":{}}");
}

}  // namespace
}  // namespace atfill

namespace atfill {
namespace {

TEST(BloomFilterTest, NoFalseNegativesAndFewFalsePositives) {
  BloomFilter bloom(10000);
  for (int i = 0; i < 10000; ++i)
    bloom.Add("at://did:plc:x/app.bsky.feed.post/" + std::to_string(i));
  for (int i = 0; i < 10000; ++i) {
    ASSERT_TRUE(bloom.MayContain("at://did:plc:x/app.bsky.feed.post/" + std::to_string(i)));
  }
  int false_positives = 0;
  for (int i = 10000; i < 110000; ++i) {
    false_positives += bloom.MayContain("at://did:plc:x/app.bsky.feed.post/" + std::to_string(i));
  }
  EXPECT_LT(false_positives, 3000);  // ~1% expected; 3% leaves room
}

}  // namespace
}  // namespace atfill

namespace atfill {
namespace {

TEST(JsonEscapeTest, GoStyleEscapesHtmlCharactersAndLineSeparators) {
  const std::string text = "a<b>&\"\\\n\x01\xe2\x80\xa8\xe2\x80\xa9\xe2\x80\xa7é";
  std::string minimal, go;
  AppendJsonString(text, &minimal);
  AppendJsonString(text, &go, JsonEscape::kGo);
  EXPECT_EQ(minimal, "\"a<b>&\\\"\\\\\\n\\u0001\xe2\x80\xa8\xe2\x80\xa9\xe2\x80\xa7é\"");
  EXPECT_EQ(go, "\"a\\u003cb\\u003e\\u0026\\\"\\\\\\n\\u0001\\u2028\\u2029\xe2\x80\xa7é\"");
}

}  // namespace
}  // namespace atfill
