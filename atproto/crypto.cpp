// ECDSA for atproto through OpenSSL 3. Keys are built with EVP_PKEY_fromdata and used through
// EVP_PKEY_sign/verify; the only lower-level calls are EC_GROUP/EC_POINT/ECDSA_SIG helpers that
// OpenSSL 3 does not deprecate, so no deprecation suppression is needed.
//
// secp256k1 keys are parsed, derived, signed with and verified with libsecp256k1 instead:
// OpenSSL has no optimised code for that curve (an order of magnitude slower to verify than its
// own P-256; bench/repo_bench BM_CommitKey and docs/performance.md have the figures), and nearly
// every atproto repo is signed with it, so a getRepo crawl spent most of its CPU there.
// libsecp256k1's verification accepts only low-S signatures, atproto's rule, which the checks
// before it report by name anyway.
#include "atproto/crypto.hpp"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/obj_mac.h>
#include <openssl/param_build.h>
#include <openssl/rand.h>
#include <secp256k1.h>

#include <array>
#include <cstdio>
#include <utility>

#include "base/encoding.hpp"
#include "base/sha256.hpp"

namespace atfill::atproto {
namespace {

constexpr size_t kScalarSize = 32;
constexpr size_t kSignatureSize = 2 * kScalarSize;
constexpr size_t kCompressedSize = 1 + kScalarSize;
constexpr size_t kUncompressedSize = 1 + 2 * kScalarSize;
constexpr uint64_t kSecp256k1PubCodec = 0xe7;
constexpr uint64_t kP256PubCodec = 0x1200;
constexpr std::string_view kDidKeyPrefix = "did:key:";
constexpr std::string_view kBase58Alphabet =
    "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";
// The longest valid key text is a 2-byte multicodec plus an uncompressed point (67 bytes, 92
// base58 digits); base58 decoding is quadratic, so anything much longer is refused unread.
constexpr size_t kMaxMultibaseChars = 128;

template <auto Fn>
struct Free {
  template <typename T>
  void operator()(T* p) const {
    Fn(p);
  }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, Free<EVP_PKEY_free>>;
using PkeyCtxPtr = std::unique_ptr<EVP_PKEY_CTX, Free<EVP_PKEY_CTX_free>>;
using BnPtr = std::unique_ptr<BIGNUM, Free<BN_free>>;
using SecretBnPtr = std::unique_ptr<BIGNUM, Free<BN_clear_free>>;
using BnCtxPtr = std::unique_ptr<BN_CTX, Free<BN_CTX_free>>;
using GroupPtr = std::unique_ptr<EC_GROUP, Free<EC_GROUP_free>>;
using PointPtr = std::unique_ptr<EC_POINT, Free<EC_POINT_clear_free>>;
using EcdsaSigPtr = std::unique_ptr<ECDSA_SIG, Free<ECDSA_SIG_free>>;
using ParamBldPtr = std::unique_ptr<OSSL_PARAM_BLD, Free<OSSL_PARAM_BLD_free>>;
using ParamPtr = std::unique_ptr<OSSL_PARAM, Free<OSSL_PARAM_free>>;

// Takes the oldest queued OpenSSL error and empties the queue, so one failure never leaks into the
// next call's diagnosis on this thread.
std::string TakeOpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no OpenSSL error detail";
  std::array<char, 256> buf{};
  ERR_error_string_n(code, buf.data(), buf.size());
  return buf.data();
}

std::string Hex(uint64_t value) {
  std::array<char, 24> buf{};
  std::snprintf(buf.data(), buf.size(), "0x%llx", static_cast<unsigned long long>(value));
  return buf.data();
}

// Quotes untrusted text for an error message, bounded so a huge input cannot bloat the log.
std::string Quote(std::string_view text) {
  constexpr size_t kMax = 64;
  std::string out = "\"";
  out += text.substr(0, kMax);
  if (text.size() > kMax) out += "...";
  out += "\"";
  return out;
}

struct Curve {
  KeyType type;
  std::string_view name;      // as atproto writes it, for messages
  const char* openssl_group;  // OSSL_PKEY_PARAM_GROUP_NAME value
  uint64_t multicodec;
  GroupPtr group;
  BnPtr order;
  BnPtr half_order;  // floor(order / 2): the largest S a low-S signature may carry
};

std::unique_ptr<Curve> MakeCurve(KeyType type, std::string_view name, const char* openssl_group,
                                 int nid, uint64_t multicodec) {
  auto curve = std::make_unique<Curve>();
  curve->type = type;
  curve->name = name;
  curve->openssl_group = openssl_group;
  curve->multicodec = multicodec;
  curve->group.reset(EC_GROUP_new_by_curve_name(nid));
  if (!curve->group) return nullptr;
  curve->order.reset(BN_dup(EC_GROUP_get0_order(curve->group.get())));
  curve->half_order.reset(BN_new());
  if (!curve->order || !curve->half_order ||
      BN_rshift1(curve->half_order.get(), curve->order.get()) != 1) {
    return nullptr;
  }
  return curve;
}

// The curve tables are built once and only read afterwards, so sharing them across threads is
// safe. A null entry means this OpenSSL build lacks the curve.
Result<const Curve*> CurveOf(KeyType type) {
  static const std::unique_ptr<Curve> k256 =
      MakeCurve(KeyType::kSecp256k1, "secp256k1", "secp256k1", NID_secp256k1, kSecp256k1PubCodec);
  static const std::unique_ptr<Curve> p256 =
      MakeCurve(KeyType::kP256, "p256", "prime256v1", NID_X9_62_prime256v1, kP256PubCodec);
  const Curve* curve = nullptr;
  switch (type) {
    case KeyType::kSecp256k1:
      curve = k256.get();
      break;
    case KeyType::kP256:
      curve = p256.get();
      break;
  }
  if (curve == nullptr) {
    ERR_clear_error();
    return Status::Internal("OpenSSL cannot set up the elliptic curve for this key type");
  }
  return curve;
}

Bytes CompressPoint(ByteView point) {
  if (point.size() == kCompressedSize) return Bytes(point.begin(), point.end());
  Bytes out;
  out.reserve(kCompressedSize);
  out.push_back(static_cast<uint8_t>(0x02 | (point[kUncompressedSize - 1] & 1)));
  out.insert(out.end(), point.begin() + 1, point.begin() + 1 + kScalarSize);
  return out;
}

Result<Bytes> DecodeMultibase(std::string_view text) {
  if (text.empty()) return Status::Invalid("multibase key is empty");
  if (text.front() != 'z') {
    return Status::Invalid("multibase key must use base58btc (prefix 'z'), got prefix '" +
                           std::string(1, text.front()) + "'");
  }
  if (text.size() > kMaxMultibaseChars) {
    return Status::Invalid("multibase key is " + std::to_string(text.size()) +
                           " characters, longer than any supported key (" +
                           std::to_string(kMaxMultibaseChars) + ")");
  }
  const size_t bad = text.find_first_not_of(kBase58Alphabet, 1);
  if (bad != std::string_view::npos) {
    return Status::Invalid(
        "multibase key has a character outside the base58btc alphabet at offset " +
        std::to_string(bad) + " (counting from the 'z')");
  }
  auto bytes = Base58BtcDecode(text.substr(1));
  if (!bytes.ok()) return bytes.status().WithContext("multibase key");
  return bytes;
}

Result<PublicKey> FromMulticodecKey(ByteView bytes) {
  size_t consumed = 0;
  auto codec = ReadVarint(bytes, &consumed);
  if (!codec.ok()) return codec.status().WithContext("multicodec prefix of key");
  KeyType type;
  if (*codec == kSecp256k1PubCodec) {
    type = KeyType::kSecp256k1;
  } else if (*codec == kP256PubCodec) {
    type = KeyType::kP256;
  } else {
    return Status::Unsupported("unknown key multicodec " + Hex(*codec) +
                               "; expected secp256k1-pub (0xe7) or p256-pub (0x1200)");
  }
  return PublicKey::FromSec1(type, bytes.subspan(consumed));
}

PkeyPtr PkeyFromParams(const OSSL_PARAM* params, int selection) {
  PkeyCtxPtr ctx(EVP_PKEY_CTX_new_from_name(nullptr, "EC", nullptr));
  EVP_PKEY* raw = nullptr;
  if (!ctx || EVP_PKEY_fromdata_init(ctx.get()) != 1 ||
      EVP_PKEY_fromdata(ctx.get(), &raw, selection, const_cast<OSSL_PARAM*>(params)) != 1) {
    return nullptr;
  }
  return PkeyPtr(raw);
}

// libsecp256k1's context for key derivation and signing (verification and parsing use its
// static context). Randomised once, at creation, against side channels; used read-only after
// that, so it is shared by every thread.
const secp256k1_context* K256SigningContext() {
  static const secp256k1_context* ctx = [] {
    secp256k1_context* c = secp256k1_context_create(SECP256K1_CONTEXT_NONE);
    std::array<unsigned char, 32> seed{};
    if (c != nullptr && RAND_bytes(seed.data(), static_cast<int>(seed.size())) == 1 &&
        secp256k1_context_randomize(c, seed.data()) != 1) {
      // Cannot fail for a context made with SECP256K1_CONTEXT_NONE; unrandomised, it still
      // signs correctly.
    }
    OPENSSL_cleanse(seed.data(), seed.size());
    return c;
  }();
  return ctx;
}

}  // namespace

struct PublicKey::Impl {
  const Curve* curve;
  Bytes compressed;
  PkeyPtr pkey;             // P-256
  secp256k1_pubkey k256{};  // secp256k1
};

struct PrivateKey::Impl {
  Impl(const Curve* c, Bytes s, PkeyPtr k, PublicKey p)
      : curve(c), scalar(std::move(s)), pkey(std::move(k)), public_key(std::move(p)) {}
  ~Impl() { OPENSSL_cleanse(scalar.data(), scalar.size()); }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  const Curve* curve;
  Bytes scalar;
  PkeyPtr pkey;
  PublicKey public_key;
};

// ---------------------------------------------------------------------------------------------
// PublicKey

PublicKey::PublicKey(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
PublicKey::PublicKey(PublicKey&&) noexcept = default;
PublicKey& PublicKey::operator=(PublicKey&&) noexcept = default;
PublicKey::PublicKey(const PublicKey&) = default;
PublicKey& PublicKey::operator=(const PublicKey&) = default;
PublicKey::~PublicKey() = default;

Result<PublicKey> PublicKey::FromDidKey(std::string_view did_key) {
  if (!did_key.starts_with(kDidKeyPrefix)) {
    return Status::Invalid("did:key must start with \"did:key:\", got " + Quote(did_key));
  }
  auto key = FromMultibase(did_key.substr(kDidKeyPrefix.size()));
  if (!key.ok()) return key.status().WithContext("did:key " + Quote(did_key));
  return key;
}

Result<PublicKey> PublicKey::FromMultibase(std::string_view multibase) {
  ATFILL_ASSIGN_OR_RETURN(Bytes bytes, DecodeMultibase(multibase));
  return FromMulticodecKey(bytes);
}

Result<PublicKey> PublicKey::FromMultibase(std::string_view multibase, KeyType legacy_type) {
  ATFILL_ASSIGN_OR_RETURN(Bytes bytes, DecodeMultibase(multibase));
  // A SEC1 point starts with 0x02, 0x03 or 0x04 and neither multicodec prefix does (0xe7, 0x80),
  // so the first byte tells the legacy bare point from the modern prefixed form.
  if (!bytes.empty() && (bytes[0] == 0x02 || bytes[0] == 0x03 || bytes[0] == 0x04)) {
    return FromSec1(legacy_type, bytes);
  }
  ATFILL_ASSIGN_OR_RETURN(PublicKey key, FromMulticodecKey(bytes));
  if (key.type() != legacy_type) {
    ATFILL_ASSIGN_OR_RETURN(const Curve* want, CurveOf(legacy_type));
    return Status::Invalid("multibase key is " + std::string(key.impl_->curve->name) +
                           " but the document declares " + std::string(want->name));
  }
  return key;
}

Result<PublicKey> PublicKey::FromSec1(KeyType type, ByteView point) {
  ATFILL_ASSIGN_OR_RETURN(const Curve* curve, CurveOf(type));
  const std::string what = std::string(curve->name) + " public key";
  if (point.size() == kCompressedSize) {
    if (point[0] != 0x02 && point[0] != 0x03) {
      return Status::Invalid(what + ": a 33-byte compressed point must start with 0x02 or 0x03, " +
                             "got " + Hex(point[0]) + " at offset 0");
    }
  } else if (point.size() == kUncompressedSize) {
    if (point[0] != 0x04) {
      return Status::Invalid(what + ": a 65-byte uncompressed point must start with 0x04, got " +
                             Hex(point[0]) + " at offset 0");
    }
  } else {
    return Status::Invalid(what + " is " + std::to_string(point.size()) +
                           " bytes, expected 33 (compressed) or 65 (uncompressed)");
  }
  if (type == KeyType::kSecp256k1) {
    // libsecp256k1 decompresses the point and refuses one that is not on the curve. Its static
    // context serves parsing and verification (neither needs precomputed tables or secrets).
    auto impl = std::make_shared<Impl>(Impl{curve, CompressPoint(point), nullptr, {}});
    if (secp256k1_ec_pubkey_parse(secp256k1_context_static, &impl->k256, point.data(),
                                  point.size()) != 1) {
      return Status::Invalid(what + " is not a point on the curve");
    }
    return PublicKey(std::move(impl));
  }
  const std::array<OSSL_PARAM, 3> params = {
      OSSL_PARAM_construct_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME,
                                       const_cast<char*>(curve->openssl_group), 0),
      OSSL_PARAM_construct_octet_string(OSSL_PKEY_PARAM_PUB_KEY, const_cast<uint8_t*>(point.data()),
                                        point.size()),
      OSSL_PARAM_construct_end(),
  };
  // OpenSSL decompresses the point and refuses one that is not on the curve.
  PkeyPtr pkey = PkeyFromParams(params.data(), EVP_PKEY_PUBLIC_KEY);
  if (!pkey) {
    return Status::Invalid(what + " is not a point on the curve (" + TakeOpenSslError() + ")");
  }
  return PublicKey(
      std::make_shared<const Impl>(Impl{curve, CompressPoint(point), std::move(pkey), {}}));
}

KeyType PublicKey::type() const { return impl_->curve->type; }

const Bytes& PublicKey::compressed_point() const { return impl_->compressed; }

std::string PublicKey::ToMultibase() const {
  Bytes bytes;
  AppendVarint(impl_->curve->multicodec, &bytes);
  bytes.insert(bytes.end(), impl_->compressed.begin(), impl_->compressed.end());
  // Built by append: g++ 12's -Wrestrict misfires on `"z" + std::string&&` in Release builds.
  std::string out = "z";
  out += Base58BtcEncode(bytes);
  return out;
}

std::string PublicKey::ToDidKey() const { return std::string(kDidKeyPrefix) + ToMultibase(); }

Status PublicKey::Verify(ByteView message, ByteView signature) const {
  if (signature.size() != kSignatureSize) {
    return Status::Invalid("signature is " + std::to_string(signature.size()) +
                           " bytes, expected 64 (compact r||s; DER signatures are not accepted)");
  }
  const Curve& curve = *impl_->curve;
  BnPtr r(BN_bin2bn(signature.data(), kScalarSize, nullptr));
  BnPtr s(BN_bin2bn(signature.data() + kScalarSize, kScalarSize, nullptr));
  if (!r || !s) return Status::Internal("signature: " + TakeOpenSslError());
  if (BN_is_zero(r.get()) || BN_cmp(r.get(), curve.order.get()) >= 0) {
    return Status::Invalid("signature r (bytes 0-31) is zero or not below the curve order");
  }
  if (BN_is_zero(s.get()) || BN_cmp(s.get(), curve.order.get()) >= 0) {
    return Status::Invalid("signature s (bytes 32-63) is zero or not below the curve order");
  }
  // Both (r, s) and (r, n - s) verify mathematically; atproto accepts only the low one so that a
  // signature cannot be altered into a second valid encoding.
  if (BN_cmp(s.get(), curve.half_order.get()) > 0) {
    return Status::Invalid("signature is high-S (s > n/2); atproto requires low-S signatures");
  }

  if (curve.type == KeyType::kSecp256k1) {
    secp256k1_ecdsa_signature sig;
    if (secp256k1_ecdsa_signature_parse_compact(secp256k1_context_static, &sig, signature.data()) !=
        1) {
      return Status::Invalid("signature r or s is not below the curve order");
    }
    const Sha256Digest digest = Sha256(message);
    if (secp256k1_ecdsa_verify(secp256k1_context_static, &sig, digest.data(), &impl_->k256) == 1) {
      return Status::OK();
    }
    return Status::Invalid("signature does not match the message and " + std::string(curve.name) +
                           " key");
  }

  // EVP verifies DER, so the compact form is re-encoded.
  EcdsaSigPtr sig(ECDSA_SIG_new());
  if (!sig || ECDSA_SIG_set0(sig.get(), r.get(), s.get()) != 1) {
    return Status::Internal("signature: " + TakeOpenSslError());
  }
  r.release();
  s.release();
  std::array<uint8_t, 80> der{};
  const int der_len = i2d_ECDSA_SIG(sig.get(), nullptr);
  if (der_len <= 0 || static_cast<size_t>(der_len) > der.size()) {
    return Status::Internal("signature: cannot DER-encode (" + TakeOpenSslError() + ")");
  }
  uint8_t* der_out = der.data();
  i2d_ECDSA_SIG(sig.get(), &der_out);

  const Sha256Digest digest = Sha256(message);
  // A context per call: EVP_PKEY_CTX is not shareable across threads, the EVP_PKEY is.
  PkeyCtxPtr ctx(EVP_PKEY_CTX_new_from_pkey(nullptr, impl_->pkey.get(), nullptr));
  if (!ctx || EVP_PKEY_verify_init(ctx.get()) != 1) {
    return Status::Internal("signature verify setup: " + TakeOpenSslError());
  }
  const int rc = EVP_PKEY_verify(ctx.get(), der.data(), static_cast<size_t>(der_len), digest.data(),
                                 digest.size());
  if (rc == 1) return Status::OK();
  const std::string detail = TakeOpenSslError();
  if (rc == 0) {
    return Status::Invalid("signature does not match the message and " + std::string(curve.name) +
                           " key");
  }
  return Status::Internal("signature verify failed in OpenSSL: " + detail);
}

// ---------------------------------------------------------------------------------------------
// PrivateKey

PrivateKey::PrivateKey(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
PrivateKey::PrivateKey(PrivateKey&&) noexcept = default;
PrivateKey& PrivateKey::operator=(PrivateKey&&) noexcept = default;
PrivateKey::PrivateKey(const PrivateKey&) = default;
PrivateKey& PrivateKey::operator=(const PrivateKey&) = default;
PrivateKey::~PrivateKey() = default;

Result<PrivateKey> PrivateKey::Generate(KeyType type) {
  ATFILL_ASSIGN_OR_RETURN(const Curve* curve, CurveOf(type));
  PkeyPtr generated(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", curve->openssl_group));
  BIGNUM* raw_d = nullptr;
  if (!generated || EVP_PKEY_get_bn_param(generated.get(), OSSL_PKEY_PARAM_PRIV_KEY, &raw_d) != 1) {
    return Status::Internal("generating a " + std::string(curve->name) +
                            " key: " + TakeOpenSslError());
  }
  SecretBnPtr d(raw_d);
  std::array<uint8_t, kScalarSize> scalar{};
  if (BN_bn2binpad(d.get(), scalar.data(), scalar.size()) != static_cast<int>(scalar.size())) {
    return Status::Internal("generating a key: " + TakeOpenSslError());
  }
  // One construction path for generated and imported keys keeps the public point derivation and
  // validation identical.
  auto key = FromBytes(type, scalar);
  OPENSSL_cleanse(scalar.data(), scalar.size());
  return key;
}

Result<PrivateKey> PrivateKey::FromBytes(KeyType type, ByteView scalar) {
  ATFILL_ASSIGN_OR_RETURN(const Curve* curve, CurveOf(type));
  const std::string what = std::string(curve->name) + " private key";
  if (scalar.size() != kScalarSize) {
    return Status::Invalid(what + " is " + std::to_string(scalar.size()) + " bytes, expected 32");
  }
  SecretBnPtr d(BN_secure_new());
  if (!d || BN_bin2bn(scalar.data(), static_cast<int>(scalar.size()), d.get()) == nullptr) {
    return Status::Internal(what + ": " + TakeOpenSslError());
  }
  BN_set_flags(d.get(), BN_FLG_CONSTTIME);
  if (BN_is_zero(d.get()) || BN_cmp(d.get(), curve->order.get()) >= 0) {
    return Status::Invalid(what + " is zero or not below the curve order");
  }

  if (type == KeyType::kSecp256k1) {
    // libsecp256k1 derives the point and signs, much faster than OpenSSL (see the top).
    const secp256k1_context* ctx = K256SigningContext();
    secp256k1_pubkey pub;
    std::array<uint8_t, kCompressedSize> point{};
    size_t point_len = point.size();
    if (ctx == nullptr || secp256k1_ec_pubkey_create(ctx, &pub, scalar.data()) != 1 ||
        secp256k1_ec_pubkey_serialize(secp256k1_context_static, point.data(), &point_len, &pub,
                                      SECP256K1_EC_COMPRESSED) != 1) {
      return Status::Internal(what + ": deriving the public point failed");
    }
    ATFILL_ASSIGN_OR_RETURN(PublicKey public_key, PublicKey::FromSec1(type, point));
    return PrivateKey(std::make_shared<const Impl>(curve, Bytes(scalar.begin(), scalar.end()),
                                                   nullptr, std::move(public_key)));
  }

  // OpenSSL 3.0 does not derive the public point when a key is imported from its scalar alone.
  BnCtxPtr bn_ctx(BN_CTX_new());
  PointPtr q(EC_POINT_new(curve->group.get()));
  std::array<uint8_t, kCompressedSize> point{};
  if (!bn_ctx || !q ||
      EC_POINT_mul(curve->group.get(), q.get(), d.get(), nullptr, nullptr, bn_ctx.get()) != 1 ||
      EC_POINT_point2oct(curve->group.get(), q.get(), POINT_CONVERSION_COMPRESSED, point.data(),
                         point.size(), bn_ctx.get()) != point.size()) {
    return Status::Internal(what + ": deriving the public point: " + TakeOpenSslError());
  }
  ATFILL_ASSIGN_OR_RETURN(PublicKey public_key, PublicKey::FromSec1(type, point));

  ParamBldPtr bld(OSSL_PARAM_BLD_new());
  if (!bld ||
      OSSL_PARAM_BLD_push_utf8_string(bld.get(), OSSL_PKEY_PARAM_GROUP_NAME, curve->openssl_group,
                                      0) != 1 ||
      OSSL_PARAM_BLD_push_BN(bld.get(), OSSL_PKEY_PARAM_PRIV_KEY, d.get()) != 1 ||
      OSSL_PARAM_BLD_push_octet_string(bld.get(), OSSL_PKEY_PARAM_PUB_KEY, point.data(),
                                       point.size()) != 1) {
    return Status::Internal(what + ": " + TakeOpenSslError());
  }
  ParamPtr params(OSSL_PARAM_BLD_to_param(bld.get()));
  PkeyPtr pkey = params ? PkeyFromParams(params.get(), EVP_PKEY_KEYPAIR) : nullptr;
  if (!pkey) return Status::Internal(what + ": importing into OpenSSL: " + TakeOpenSslError());
  return PrivateKey(std::make_shared<const Impl>(curve, Bytes(scalar.begin(), scalar.end()),
                                                 std::move(pkey), std::move(public_key)));
}

KeyType PrivateKey::type() const { return impl_->curve->type; }

PublicKey PrivateKey::public_key() const { return impl_->public_key; }

Bytes PrivateKey::scalar() const { return impl_->scalar; }

Result<Bytes> PrivateKey::Sign(ByteView message) const {
  const Curve& curve = *impl_->curve;
  const Sha256Digest digest = Sha256(message);
  if (curve.type == KeyType::kSecp256k1) {
    // RFC 6979 nonces; libsecp256k1 always produces the low-S form.
    const secp256k1_context* k256 = K256SigningContext();
    secp256k1_ecdsa_signature sig;
    Bytes out(kSignatureSize);
    if (k256 == nullptr ||
        secp256k1_ecdsa_sign(k256, &sig, digest.data(), impl_->scalar.data(), nullptr, nullptr) !=
            1 ||
        secp256k1_ecdsa_signature_serialize_compact(secp256k1_context_static, out.data(), &sig) !=
            1) {
      return Status::Internal("signing with a secp256k1 key failed");
    }
    return out;
  }
  PkeyCtxPtr ctx(EVP_PKEY_CTX_new_from_pkey(nullptr, impl_->pkey.get(), nullptr));
  size_t der_len = 0;
  if (!ctx || EVP_PKEY_sign_init(ctx.get()) != 1 ||
      EVP_PKEY_sign(ctx.get(), nullptr, &der_len, digest.data(), digest.size()) != 1) {
    return Status::Internal("signing setup: " + TakeOpenSslError());
  }
  Bytes der(der_len);
  if (EVP_PKEY_sign(ctx.get(), der.data(), &der_len, digest.data(), digest.size()) != 1) {
    return Status::Internal("signing: " + TakeOpenSslError());
  }
  const uint8_t* der_in = der.data();
  EcdsaSigPtr sig(d2i_ECDSA_SIG(nullptr, &der_in, static_cast<long>(der_len)));
  if (!sig) return Status::Internal("signing: OpenSSL produced bad DER: " + TakeOpenSslError());
  const BIGNUM* r = nullptr;
  const BIGNUM* s = nullptr;
  ECDSA_SIG_get0(sig.get(), &r, &s);
  BnPtr negated;
  if (BN_cmp(s, curve.half_order.get()) > 0) {
    negated.reset(BN_new());
    if (!negated || BN_sub(negated.get(), curve.order.get(), s) != 1) {
      return Status::Internal("signing: normalising to low-S: " + TakeOpenSslError());
    }
    s = negated.get();
  }
  Bytes out(kSignatureSize);
  if (BN_bn2binpad(r, out.data(), kScalarSize) != static_cast<int>(kScalarSize) ||
      BN_bn2binpad(s, out.data() + kScalarSize, kScalarSize) != static_cast<int>(kScalarSize)) {
    return Status::Internal("signing: encoding r||s: " + TakeOpenSslError());
  }
  return out;
}

}  // namespace atfill::atproto
