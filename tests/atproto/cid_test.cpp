#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <unordered_set>

#include "atproto/cid.hpp"
#include "base/encoding.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::atproto {
namespace {

constexpr std::string_view kDagCborCid =
    "bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a";
constexpr std::string_view kRawCid = "bafkreiccldh766hwcnuxnf2wh6jgzepf2nlu2lvcllt63eww5p6chi4ity";

TEST(CidTest, ParseFormatRoundTrip) {
  for (std::string_view text : {kDagCborCid, kRawCid}) {
    auto cid = Cid::Parse(text);
    ASSERT_TRUE(cid.ok()) << cid.status().ToString();
    EXPECT_TRUE(cid->valid());
    EXPECT_EQ(cid->ToString(), text);
    EXPECT_EQ(cid->binary().size(), Cid::kBinarySize);
    auto again = Cid::FromBinary(cid->binary());
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *cid);
  }
  EXPECT_EQ(Cid::Parse(kDagCborCid)->codec(), Cid::Codec::kDagCbor);
  EXPECT_EQ(Cid::Parse(kRawCid)->codec(), Cid::Codec::kRaw);
}

TEST(CidTest, ComputeMatchesKnownCid) {
  // The empty byte string: sha2-256 e3b0c442..., as a raw CID.
  const Cid raw = Cid::Compute(Cid::Codec::kRaw, {});
  EXPECT_EQ(raw.ToString(), "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku");
  EXPECT_EQ(HexEncode(raw.digest()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const Cid cbor = Cid::Compute(Cid::Codec::kDagCbor, {});
  EXPECT_EQ(cbor.codec(), Cid::Codec::kDagCbor);
  EXPECT_NE(cbor, raw);
  EXPECT_EQ(cbor.digest()[0], raw.digest()[0]);
}

TEST(CidTest, PlaceholderIsInvalid) {
  Cid none;
  EXPECT_FALSE(none.valid());
  EXPECT_EQ(none.ToString(), "");
  EXPECT_NE(none, *Cid::Parse(kRawCid));
}

TEST(CidTest, HashAndOrder) {
  std::unordered_set<Cid> set;
  set.insert(*Cid::Parse(kDagCborCid));
  set.insert(*Cid::Parse(kRawCid));
  set.insert(*Cid::Parse(kRawCid));
  EXPECT_EQ(set.size(), 2u);
  // Ordered by binary form: raw (0x55) before dag-cbor (0x71).
  EXPECT_LT(*Cid::Parse(kRawCid), *Cid::Parse(kDagCborCid));
}

void ExpectParseError(std::string_view text, StatusCode code, std::string_view fragment) {
  auto cid = Cid::Parse(text);
  ASSERT_FALSE(cid.ok()) << "accepted: " << text;
  EXPECT_EQ(cid.status().code(), code) << text << ": " << cid.status().ToString();
  EXPECT_NE(cid.status().message().find(fragment), std::string::npos)
      << text << ": " << cid.status().message();
}

TEST(CidTest, ParseErrorsNameTheReason) {
  ExpectParseError("", StatusCode::kInvalid, "empty");
  ExpectParseError("QmbWqxBEKC3P8tqsKc98xmWNzrzDtRLMiMPL8wBuTGsMnR", StatusCode::kUnsupported,
                   "CIDv0");
  ExpectParseError("zdj7WWeQ43G6JJvLWQWZpyHuAMq6uYWRjkBXFad11vE2LHhQ7", StatusCode::kUnsupported,
                   "base58btc");
  ExpectParseError("f017012202c5f688262e0ece8569aa6f94d60aad55ca8d9d83734e4a7430d0cff6588ec2b",
                   StatusCode::kUnsupported, "base16");
  ExpectParseError("mBcDxtdWx0aWhhc2g+", StatusCode::kUnsupported, "base64");
  ExpectParseError("BAFYREIDFAYVFUWQA7QLNOPDJIQRXZS6BLMOEU4RUJCJTNCI5BELUDIRZ2A",
                   StatusCode::kUnsupported, "base32upper");
  ExpectParseError(".", StatusCode::kInvalid, "multibase prefix 'b'");
  ExpectParseError(" bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a",
                   StatusCode::kInvalid, "multibase prefix 'b'");
  // dag-pb (0x70), the IPFS default.
  ExpectParseError("bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi",
                   StatusCode::kUnsupported, "dag-pb");
  ExpectParseError("bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2",
                   StatusCode::kInvalid, "base32");
  ExpectParseError("bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a ",
                   StatusCode::kInvalid, "base32");
  ExpectParseError("bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz",
                   StatusCode::kCorrupt, "truncated");
}

TEST(CidTest, BinaryErrors) {
  const Cid good = *Cid::Parse(kDagCborCid);
  Bytes bin(good.binary().begin(), good.binary().end());
  size_t consumed = 0;

  Bytes longer = bin;
  longer.push_back(0x00);
  ASSERT_TRUE(Cid::ReadBinaryPrefix(longer, &consumed).ok());
  EXPECT_EQ(consumed, Cid::kBinarySize);
  auto trailing = Cid::FromBinary(longer);
  ASSERT_FALSE(trailing.ok());
  EXPECT_NE(trailing.status().message().find("trailing"), std::string::npos);

  auto with = [&](size_t index, uint8_t byte) {
    Bytes b = bin;
    b[index] = byte;
    return Cid::FromBinary(b).status();
  };
  EXPECT_EQ(with(0, 0x02).code(), StatusCode::kUnsupported);  // version 2
  EXPECT_EQ(with(1, 0x70).code(), StatusCode::kUnsupported);  // dag-pb
  Status blake3 = with(2, 0x1e);
  EXPECT_EQ(blake3.code(), StatusCode::kUnsupported);
  EXPECT_NE(blake3.message().find("blake3"), std::string::npos) << blake3.message();
  EXPECT_EQ(with(3, 0x40).code(), StatusCode::kInvalid);  // digest length 64
  Bytes non_minimal = bin;  // version 1 as the two-byte varint 0x81 0x00
  non_minimal.insert(non_minimal.begin() + 1, 0x00);
  non_minimal[0] = 0x81;
  Status varint = Cid::FromBinary(non_minimal).status();
  EXPECT_EQ(varint.code(), StatusCode::kInvalid);
  EXPECT_NE(varint.message().find("CID version"), std::string::npos) << varint.message();

  Bytes v0 = {0x12, 0x20};
  v0.resize(34, 0xab);
  EXPECT_EQ(Cid::FromBinary(v0).status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(Cid::FromBinary(ByteView(bin).first(20)).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(Cid::FromBinary({}).status().code(), StatusCode::kCorrupt);
}

// Every line of the interop invalid-CID file must be refused. The valid file holds CIDs of codecs
// and bases that atproto data never links to (dag-pb, base58btc, ...): any atproto-shaped one
// must parse, the others must be refused as Unsupported, never as malformed.
TEST(CidTest, InteropSyntaxFiles) {
  ATFILL_SHARED_PATH(invalid_path, "vectors/interop/syntax/cid_syntax_invalid.txt");
  ATFILL_SHARED_PATH(valid_path, "vectors/interop/syntax/cid_syntax_valid.txt");
  size_t invalid = 0;
  std::ifstream in(invalid_path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    ++invalid;
    EXPECT_FALSE(Cid::Parse(line).ok()) << "accepted invalid CID: [" << line << "]";
  }
  EXPECT_GT(invalid, 5u);

  size_t valid = 0;
  size_t atproto_shaped = 0;
  std::ifstream vin(valid_path);
  for (std::string line; std::getline(vin, line);) {
    if (line.empty() || line[0] == '#') continue;
    ++valid;
    auto cid = Cid::Parse(line);
    if (line.starts_with("bafyrei") || line.starts_with("bafkrei")) {
      ++atproto_shaped;
      ASSERT_TRUE(cid.ok()) << line << ": " << cid.status().ToString();
      EXPECT_EQ(cid->ToString(), line);
    } else {
      // Valid CIDs of other shapes are refused as Unsupported, never as garbage.
      ASSERT_FALSE(cid.ok()) << line;
      EXPECT_EQ(cid.status().code(), StatusCode::kUnsupported)
          << line << ": " << cid.status().ToString();
    }
  }
  EXPECT_GT(valid, 5u);
  EXPECT_LT(atproto_shaped, valid);
}

}  // namespace
}  // namespace atfill::atproto
