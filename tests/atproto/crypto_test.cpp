#include "atproto/crypto.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/obj_mac.h>
#include <simdjson.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/encoding.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::atproto {
namespace {

using ::testing::HasSubstr;

constexpr std::string_view kK256Did = "did:key:zQ3shqwJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwc";
constexpr std::string_view kP256Did = "did:key:zDnaembgSGUhZULN2Caob4HLJPaxBh92N7rtH21TErzqf8HQo";

template <auto Fn>
struct Free {
  template <typename T>
  void operator()(T* p) const {
    Fn(p);
  }
};
using BnPtr = std::unique_ptr<BIGNUM, Free<BN_free>>;
using GroupPtr = std::unique_ptr<EC_GROUP, Free<EC_GROUP_free>>;
using PointPtr = std::unique_ptr<EC_POINT, Free<EC_POINT_free>>;

// The curve arithmetic the tests check results against, independent of crypto.cpp's tables.
GroupPtr GroupOf(KeyType type) {
  return GroupPtr(EC_GROUP_new_by_curve_name(type == KeyType::kSecp256k1 ? NID_secp256k1
                                                                         : NID_X9_62_prime256v1));
}

bool IsLowS(KeyType type, ByteView signature) {
  GroupPtr group = GroupOf(type);
  BnPtr half(BN_new());
  BnPtr s(BN_bin2bn(signature.data() + 32, 32, nullptr));
  if (!group || !half || !s || BN_rshift1(half.get(), EC_GROUP_get0_order(group.get())) != 1) {
    ADD_FAILURE() << "OpenSSL setup failed";
    return false;
  }
  return BN_cmp(s.get(), half.get()) <= 0;
}

// (r, n - s): the other, equally valid-in-maths encoding of the same signature.
Bytes FlipS(KeyType type, ByteView signature) {
  GroupPtr group = GroupOf(type);
  BnPtr s(BN_bin2bn(signature.data() + 32, 32, nullptr));
  BnPtr flipped(BN_new());
  Bytes out(signature.begin(), signature.begin() + 32);
  out.resize(64);
  if (!group || !s || !flipped ||
      BN_sub(flipped.get(), EC_GROUP_get0_order(group.get()), s.get()) != 1 ||
      BN_bn2binpad(flipped.get(), out.data() + 32, 32) != 32) {
    ADD_FAILURE() << "OpenSSL arithmetic failed";
  }
  return out;
}

Bytes Uncompress(KeyType type, ByteView compressed) {
  GroupPtr group = GroupOf(type);
  PointPtr point(EC_POINT_new(group.get()));
  Bytes out(65);
  if (!point ||
      EC_POINT_oct2point(group.get(), point.get(), compressed.data(), compressed.size(), nullptr) !=
          1 ||
      EC_POINT_point2oct(group.get(), point.get(), POINT_CONVERSION_UNCOMPRESSED, out.data(),
                         out.size(), nullptr) != out.size()) {
    ADD_FAILURE() << "cannot uncompress point";
  }
  return out;
}

Bytes Prefixed(uint64_t codec, ByteView point) {
  Bytes bytes;
  AppendVarint(codec, &bytes);
  bytes.insert(bytes.end(), point.begin(), point.end());
  return bytes;
}

std::string DidKeyOf(ByteView bytes) { return "did:key:z" + Base58BtcEncode(bytes); }

Bytes MustBase64(std::string_view text) {
  auto bytes = Base64Decode(text);
  EXPECT_TRUE(bytes.ok()) << text << ": " << bytes.status().ToString();
  return bytes.ok() ? *bytes : Bytes{};
}

std::string_view GetString(simdjson::dom::element obj, const char* field) {
  std::string_view out;
  EXPECT_EQ(obj[field].get(out), simdjson::SUCCESS) << "missing string field " << field;
  return out;
}

// --- Interop fixtures ---------------------------------------------------------------------------

TEST(CryptoInteropTest, SignatureFixtures) {
  ATFILL_SHARED_PATH(path, "vectors/interop/crypto/signature-fixtures.json");
  simdjson::dom::parser parser;
  simdjson::dom::array cases;
  ASSERT_EQ(parser.load(path.string()).get(cases), simdjson::SUCCESS);

  int valid = 0, invalid = 0, high_s = 0, der = 0;
  for (simdjson::dom::element c : cases) {
    const std::string_view comment = GetString(c, "comment");
    SCOPED_TRACE(std::string(comment));
    const std::string_view algorithm = GetString(c, "algorithm");
    const std::string_view suite = GetString(c, "didDocSuite");
    const std::string_view did = GetString(c, "publicKeyDid");
    const std::string_view multibase = GetString(c, "publicKeyMultibase");
    const Bytes message = MustBase64(GetString(c, "messageBase64"));
    const Bytes signature = MustBase64(GetString(c, "signatureBase64"));
    bool expect_valid = false;
    ASSERT_EQ(c["validSignature"].get(expect_valid), simdjson::SUCCESS);

    KeyType type;
    if (algorithm == "ES256K") {
      type = KeyType::kSecp256k1;
      EXPECT_EQ(suite, "EcdsaSecp256k1VerificationKey2019");
    } else {
      ASSERT_EQ(algorithm, "ES256");
      type = KeyType::kP256;
      EXPECT_EQ(suite, "EcdsaSecp256r1VerificationKey2019");
    }

    auto from_did = PublicKey::FromDidKey(did);
    ASSERT_TRUE(from_did.ok()) << from_did.status().ToString();
    EXPECT_EQ(from_did->type(), type);
    EXPECT_EQ(from_did->ToDidKey(), did);
    // The fixture's publicKeyMultibase is the legacy DID-document form: a bare point, curve
    // named by the document's suite.
    auto from_multibase = PublicKey::FromMultibase(multibase, type);
    ASSERT_TRUE(from_multibase.ok()) << from_multibase.status().ToString();
    EXPECT_EQ(from_multibase->ToDidKey(), did);
    EXPECT_FALSE(PublicKey::FromMultibase(multibase).ok()) << "bare point taken as prefixed key";

    const Status by_did = from_did->Verify(message, signature);
    const Status by_multibase = from_multibase->Verify(message, signature);
    EXPECT_EQ(by_did.ok(), expect_valid) << by_did.ToString();
    EXPECT_EQ(by_multibase.ok(), expect_valid) << by_multibase.ToString();
    (expect_valid ? valid : invalid)++;

    simdjson::dom::array tags;
    ASSERT_EQ(c["tags"].get(tags), simdjson::SUCCESS);
    for (simdjson::dom::element tag_el : tags) {
      std::string_view tag;
      ASSERT_EQ(tag_el.get(tag), simdjson::SUCCESS);
      if (tag == "high-s") {
        ++high_s;
        EXPECT_THAT(by_did.message(), HasSubstr("high-S"));
        // Rejected only for being high-S: the low-S twin of the same signature verifies.
        ASSERT_EQ(signature.size(), 64u);
        EXPECT_TRUE(from_did->Verify(message, FlipS(type, signature)).ok());
      } else if (tag == "der-encoded") {
        ++der;
        EXPECT_NE(signature.size(), 64u);
        EXPECT_THAT(by_did.message(), HasSubstr("DER"));
      } else {
        ADD_FAILURE() << "unhandled fixture tag " << tag << "; read its comment and test it";
      }
    }
  }
  EXPECT_GT(valid, 0);
  EXPECT_GT(invalid, 0);
  EXPECT_GT(high_s, 0);
  EXPECT_GT(der, 0);
}

void CheckW3cDidKeys(const char* file, KeyType type, const char* private_field) {
  ATFILL_SHARED_PATH(path, std::string("vectors/interop/crypto/") + file);
  simdjson::dom::parser parser;
  simdjson::dom::array cases;
  ASSERT_EQ(parser.load(path.string()).get(cases), simdjson::SUCCESS);
  int count = 0;
  for (simdjson::dom::element c : cases) {
    const std::string_view did = GetString(c, "publicDidKey");
    SCOPED_TRACE(std::string(did));
    const std::string_view encoded = GetString(c, private_field);
    auto scalar = std::string_view(private_field).ends_with("Hex") ? HexDecode(encoded)
                                                                   : Base58BtcDecode(encoded);
    ASSERT_TRUE(scalar.ok()) << scalar.status().ToString();

    auto private_key = PrivateKey::FromBytes(type, *scalar);
    ASSERT_TRUE(private_key.ok()) << private_key.status().ToString();
    EXPECT_EQ(private_key->type(), type);
    EXPECT_EQ(private_key->scalar(), *scalar);
    EXPECT_EQ(private_key->public_key().ToDidKey(), did);

    auto parsed = PublicKey::FromDidKey(did);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(parsed->type(), type);
    EXPECT_EQ(parsed->ToDidKey(), did);
    EXPECT_EQ(parsed->compressed_point(), private_key->public_key().compressed_point());
    EXPECT_EQ("did:key:" + parsed->ToMultibase(), did);

    auto signature = private_key->Sign(AsBytes("w3c vector"));
    ASSERT_TRUE(signature.ok()) << signature.status().ToString();
    EXPECT_TRUE(parsed->Verify(AsBytes("w3c vector"), *signature).ok());
    ++count;
  }
  EXPECT_GT(count, 0);
}

TEST(CryptoInteropTest, W3cDidKeyK256) {
  CheckW3cDidKeys("w3c_didkey_K256.json", KeyType::kSecp256k1, "privateKeyBytesHex");
}

TEST(CryptoInteropTest, W3cDidKeyP256) {
  CheckW3cDidKeys("w3c_didkey_P256.json", KeyType::kP256, "privateKeyBytesBase58");
}

// --- Sign and verify ----------------------------------------------------------------------------

class CryptoCurveTest : public ::testing::TestWithParam<KeyType> {};

TEST_P(CryptoCurveTest, SignVerifyRoundTrip) {
  auto key = PrivateKey::Generate(GetParam());
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_EQ(key->type(), GetParam());
  EXPECT_EQ(key->scalar().size(), 32u);
  const PublicKey public_key = key->public_key();
  EXPECT_EQ(public_key.type(), GetParam());
  EXPECT_EQ(public_key.compressed_point().size(), 33u);

  for (std::string_view message : {"", "hello", "a longer message with more bytes in it"}) {
    auto signature = key->Sign(AsBytes(message));
    ASSERT_TRUE(signature.ok()) << signature.status().ToString();
    ASSERT_EQ(signature->size(), 64u);
    EXPECT_TRUE(public_key.Verify(AsBytes(message), *signature).ok()) << message;
  }

  // The key survives a round trip through its scalar and through its did:key.
  auto reimported = PrivateKey::FromBytes(GetParam(), key->scalar());
  ASSERT_TRUE(reimported.ok());
  EXPECT_EQ(reimported->public_key().ToDidKey(), public_key.ToDidKey());
  auto reparsed = PublicKey::FromDidKey(public_key.ToDidKey());
  ASSERT_TRUE(reparsed.ok()) << reparsed.status().ToString();
  auto signature = reimported->Sign(AsBytes("x"));
  ASSERT_TRUE(signature.ok());
  EXPECT_TRUE(reparsed->Verify(AsBytes("x"), *signature).ok());
}

TEST_P(CryptoCurveTest, SignaturesAreLowSAndHighSTwinIsRejected) {
  auto key = PrivateKey::Generate(GetParam());
  ASSERT_TRUE(key.ok());
  const PublicKey public_key = key->public_key();
  // ECDSA nonces are random, so about half of the raw signatures are high-S: 64 of them all
  // coming out low-S only happens when Sign normalises.
  for (int i = 0; i < 64; ++i) {
    const std::string message = "message " + std::to_string(i);
    auto signature = key->Sign(AsBytes(message));
    ASSERT_TRUE(signature.ok());
    EXPECT_TRUE(IsLowS(GetParam(), *signature)) << i;
    const Status twin = public_key.Verify(AsBytes(message), FlipS(GetParam(), *signature));
    EXPECT_FALSE(twin.ok());
    EXPECT_THAT(twin.message(), HasSubstr("high-S"));
  }
}

TEST_P(CryptoCurveTest, TamperedMessageOrSignatureFails) {
  auto key = PrivateKey::Generate(GetParam());
  ASSERT_TRUE(key.ok());
  auto signature = key->Sign(AsBytes("original"));
  ASSERT_TRUE(signature.ok());
  const PublicKey public_key = key->public_key();
  ASSERT_TRUE(public_key.Verify(AsBytes("original"), *signature).ok());

  const Status tampered = public_key.Verify(AsBytes("originaL"), *signature);
  EXPECT_EQ(tampered.code(), StatusCode::kInvalid);
  EXPECT_THAT(tampered.message(), HasSubstr("does not match"));

  Bytes bad_r = *signature;
  bad_r[5] ^= 0x01;
  EXPECT_FALSE(public_key.Verify(AsBytes("original"), bad_r).ok());
}

TEST_P(CryptoCurveTest, WrongKeyFails) {
  auto key = PrivateKey::Generate(GetParam());
  auto other = PrivateKey::Generate(GetParam());
  auto other_curve =
      PrivateKey::Generate(GetParam() == KeyType::kP256 ? KeyType::kSecp256k1 : KeyType::kP256);
  ASSERT_TRUE(key.ok() && other.ok() && other_curve.ok());
  auto signature = key->Sign(AsBytes("payload"));
  ASSERT_TRUE(signature.ok());
  EXPECT_TRUE(key->public_key().Verify(AsBytes("payload"), *signature).ok());
  EXPECT_FALSE(other->public_key().Verify(AsBytes("payload"), *signature).ok());
  EXPECT_FALSE(other_curve->public_key().Verify(AsBytes("payload"), *signature).ok());
}

TEST_P(CryptoCurveTest, OutOfRangeSignatureScalars) {
  auto key = PrivateKey::Generate(GetParam());
  ASSERT_TRUE(key.ok());
  auto signature = key->Sign(AsBytes("m"));
  ASSERT_TRUE(signature.ok());
  const PublicKey public_key = key->public_key();

  Bytes zero_r = *signature;
  std::fill(zero_r.begin(), zero_r.begin() + 32, 0);
  EXPECT_THAT(public_key.Verify(AsBytes("m"), zero_r).message(), HasSubstr("signature r"));
  Bytes zero_s = *signature;
  std::fill(zero_s.begin() + 32, zero_s.end(), 0);
  EXPECT_THAT(public_key.Verify(AsBytes("m"), zero_s).message(), HasSubstr("signature s"));
  Bytes max_s = *signature;
  std::fill(max_s.begin() + 32, max_s.end(), 0xff);
  EXPECT_THAT(public_key.Verify(AsBytes("m"), max_s).message(), HasSubstr("signature s"));

  const Status short_sig = public_key.Verify(AsBytes("m"), ByteView(*signature).first(63));
  EXPECT_EQ(short_sig.code(), StatusCode::kInvalid);
  EXPECT_THAT(short_sig.message(), HasSubstr("63 bytes"));
  EXPECT_FALSE(public_key.Verify(AsBytes("m"), {}).ok());
}

TEST_P(CryptoCurveTest, UncompressedAndLegacyFormsParseToTheSameKey) {
  auto key = PrivateKey::Generate(GetParam());
  ASSERT_TRUE(key.ok());
  const PublicKey public_key = key->public_key();
  const Bytes uncompressed = Uncompress(GetParam(), public_key.compressed_point());
  const uint64_t codec = GetParam() == KeyType::kP256 ? 0x1200 : 0xe7;

  auto from_sec1 = PublicKey::FromSec1(GetParam(), uncompressed);
  ASSERT_TRUE(from_sec1.ok()) << from_sec1.status().ToString();
  EXPECT_EQ(from_sec1->ToDidKey(), public_key.ToDidKey());

  auto from_did = PublicKey::FromDidKey(DidKeyOf(Prefixed(codec, uncompressed)));
  ASSERT_TRUE(from_did.ok()) << from_did.status().ToString();
  EXPECT_EQ(from_did->ToDidKey(), public_key.ToDidKey());

  auto legacy = PublicKey::FromMultibase("z" + Base58BtcEncode(uncompressed), GetParam());
  ASSERT_TRUE(legacy.ok()) << legacy.status().ToString();
  EXPECT_EQ(legacy->ToDidKey(), public_key.ToDidKey());

  // The legacy overload also takes the modern form, as long as the curve agrees.
  auto modern = PublicKey::FromMultibase(public_key.ToMultibase(), GetParam());
  ASSERT_TRUE(modern.ok()) << modern.status().ToString();
  EXPECT_EQ(modern->ToDidKey(), public_key.ToDidKey());
  const KeyType other = GetParam() == KeyType::kP256 ? KeyType::kSecp256k1 : KeyType::kP256;
  const auto mismatch = PublicKey::FromMultibase(public_key.ToMultibase(), other);
  EXPECT_FALSE(mismatch.ok());
  EXPECT_THAT(mismatch.status().message(), HasSubstr("declares"));

  auto signature = key->Sign(AsBytes("forms"));
  ASSERT_TRUE(signature.ok());
  EXPECT_TRUE(from_sec1->Verify(AsBytes("forms"), *signature).ok());
  EXPECT_TRUE(legacy->Verify(AsBytes("forms"), *signature).ok());
}

TEST_P(CryptoCurveTest, CopiesAndMovesShareTheKey) {
  auto key = PrivateKey::Generate(GetParam());
  ASSERT_TRUE(key.ok());
  PrivateKey copy = *key;
  PrivateKey moved = std::move(copy);
  auto signature = moved.Sign(AsBytes("copy"));
  ASSERT_TRUE(signature.ok());
  PublicKey public_key = key->public_key();
  PublicKey public_copy = public_key;
  PublicKey public_moved = std::move(public_copy);
  EXPECT_TRUE(public_moved.Verify(AsBytes("copy"), *signature).ok());
  public_copy = public_moved;
  EXPECT_TRUE(public_copy.Verify(AsBytes("copy"), *signature).ok());
}

TEST_P(CryptoCurveTest, ConcurrentVerifyOnOneKey) {
  auto key = PrivateKey::Generate(GetParam());
  ASSERT_TRUE(key.ok());
  auto signature = key->Sign(AsBytes("shared"));
  ASSERT_TRUE(signature.ok());
  const PublicKey public_key = key->public_key();
  std::atomic<int> good{0}, bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        public_key.Verify(AsBytes("shared"), *signature).ok() ? ++good : ++bad;
        // A failing verify must not disturb the others.
        if (public_key.Verify(AsBytes("other"), *signature).ok()) ++bad;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(good.load(), 200);
  EXPECT_EQ(bad.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Curves, CryptoCurveTest,
                         ::testing::Values(KeyType::kSecp256k1, KeyType::kP256),
                         [](const auto& info) {
                           return info.param == KeyType::kP256 ? "P256" : "K256";
                         });

// --- Malformed input ----------------------------------------------------------------------------

void ExpectDidKeyError(std::string_view did, std::string_view needle) {
  auto key = PublicKey::FromDidKey(did);
  ASSERT_FALSE(key.ok()) << did;
  EXPECT_NE(key.status().code(), StatusCode::kInternal);
  EXPECT_THAT(key.status().message(), HasSubstr(needle)) << did;
}

TEST(CryptoMalformedTest, DidKeyPrefix) {
  ExpectDidKeyError("", "must start with \"did:key:\"");
  ExpectDidKeyError("did:web:example.com", "must start with \"did:key:\"");
  ExpectDidKeyError("DID:KEY:zQ3shqwJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwc",
                    "must start with \"did:key:\"");
  ExpectDidKeyError("zQ3shqwJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwc",
                    "must start with \"did:key:\"");
  ExpectDidKeyError("did:key:", "multibase key is empty");
  ExpectDidKeyError("did:key:uQ3shqwJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwc", "prefix 'u'");
}

TEST(CryptoMalformedTest, DidKeyBadBase58) {
  // '0', 'O', 'I' and 'l' are not in the base58btc alphabet.
  ExpectDidKeyError("did:key:zQ3sh0wJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwc",
                    "offset 5 (counting from the 'z')");
  ExpectDidKeyError("did:key:zQ3shqwJEJyMBsBXCWyCBpUBMqxcon9oHB7mCvx4sSpMdLJwl",
                    "offset 48 (counting from the 'z')");
  ExpectDidKeyError("did:key:zQ3shqwJEJyMBsBX CWyCBpU", "base58btc alphabet");
  ExpectDidKeyError("did:key:z" + std::string(500, 'Q'), "longer than any supported key");
}

TEST(CryptoMalformedTest, DidKeyUnknownMulticodec) {
  Bytes point(33, 0x11);
  point[0] = 0x02;
  // ed25519-pub (0xed) is a real multicodec, just not an atproto signing key.
  auto key = PublicKey::FromDidKey(DidKeyOf(Prefixed(0xed, point)));
  ASSERT_FALSE(key.ok());
  EXPECT_EQ(key.status().code(), StatusCode::kUnsupported);
  EXPECT_THAT(key.status().message(), HasSubstr("unknown key multicodec 0xed"));
  ExpectDidKeyError(DidKeyOf(Prefixed(0x1201, point)), "unknown key multicodec 0x1201");
  ExpectDidKeyError(DidKeyOf(Bytes{0x80}), "multicodec prefix");
  ExpectDidKeyError("did:key:z", "multicodec prefix");
}

TEST(CryptoMalformedTest, DidKeyWrongPointLength) {
  auto valid = PublicKey::FromDidKey(kK256Did);
  ASSERT_TRUE(valid.ok());
  const Bytes& point = valid->compressed_point();
  ExpectDidKeyError(DidKeyOf(Prefixed(0xe7, ByteView(point).first(32))),
                    "secp256k1 public key is 32 bytes, expected 33");
  Bytes longer = point;
  longer.push_back(0);
  ExpectDidKeyError(DidKeyOf(Prefixed(0x1200, longer)), "p256 public key is 34 bytes");
  ExpectDidKeyError(DidKeyOf(Prefixed(0xe7, {})), "is 0 bytes");
}

TEST(CryptoMalformedTest, DidKeyBadPoint) {
  auto valid = PublicKey::FromDidKey(kP256Did);
  ASSERT_TRUE(valid.ok());
  Bytes bad_tag = valid->compressed_point();
  bad_tag[0] = 0x04;
  ExpectDidKeyError(DidKeyOf(Prefixed(0x1200, bad_tag)), "must start with 0x02 or 0x03");

  Bytes off_curve = Uncompress(KeyType::kP256, valid->compressed_point());
  off_curve[64] ^= 0x01;
  ExpectDidKeyError(DidKeyOf(Prefixed(0x1200, off_curve)), "not a point on the curve");
  Bytes bad_uncompressed_tag = off_curve;
  bad_uncompressed_tag[0] = 0x06;
  ExpectDidKeyError(DidKeyOf(Prefixed(0x1200, bad_uncompressed_tag)), "must start with 0x04");

  // About half of all x have no matching y; take the first small one so that a compressed point
  // which cannot be decompressed is refused.
  bool found = false;
  for (uint8_t x = 1; x < 64 && !found; ++x) {
    Bytes point(33, 0);
    point[0] = 0x02;
    point[32] = x;
    if (PublicKey::FromSec1(KeyType::kSecp256k1, point).ok()) continue;
    found = true;
    ExpectDidKeyError(DidKeyOf(Prefixed(0xe7, point)), "not a point on the curve");
  }
  EXPECT_TRUE(found);
}

TEST(CryptoMalformedTest, LegacyMultibase) {
  EXPECT_THAT(PublicKey::FromMultibase("", KeyType::kP256).status().message(), HasSubstr("empty"));
  Bytes short_point(20, 0x02);
  EXPECT_THAT(PublicKey::FromMultibase("z" + Base58BtcEncode(short_point), KeyType::kP256)
                  .status()
                  .message(),
              HasSubstr("p256 public key is 20 bytes"));
}

TEST(CryptoMalformedTest, PrivateKeyScalar) {
  const auto too_short = PrivateKey::FromBytes(KeyType::kSecp256k1, Bytes(31, 1));
  EXPECT_THAT(too_short.status().message(), HasSubstr("is 31 bytes, expected 32"));
  const auto zero = PrivateKey::FromBytes(KeyType::kP256, Bytes(32, 0));
  EXPECT_THAT(zero.status().message(), HasSubstr("zero or not below the curve order"));
  const auto too_big = PrivateKey::FromBytes(KeyType::kSecp256k1, Bytes(32, 0xff));
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalid);
  EXPECT_THAT(too_big.status().message(), HasSubstr("not below the curve order"));
}

}  // namespace
}  // namespace atfill::atproto
