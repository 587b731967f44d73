// atproto signing keys: secp256k1 (ES256K) and NIST P-256 (ES256), as did:key strings or
// multibase public keys; ECDSA over SHA-256 with 64-byte compact (r||s) low-S signatures.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "base/bytes.hpp"
#include "base/status.hpp"

namespace atfill::atproto {

enum class KeyType { kSecp256k1, kP256 };

class PublicKey {
 public:
  // "did:key:z..." with the multicodec prefix secp256k1-pub (0xe7) or p256-pub (0x1200) and a
  // compressed point (uncompressed points are accepted too).
  static Result<PublicKey> FromDidKey(std::string_view did_key);
  // A DID document's `publicKeyMultibase`: "z..." multibase with the multicodec prefix (the
  // modern form). Legacy documents without a prefix need `legacy_type`: the overload taking it
  // accepts a bare SEC1 point (compressed or uncompressed) of that type, or a modern prefixed key
  // whose type must equal `legacy_type`.
  static Result<PublicKey> FromMultibase(std::string_view multibase);
  static Result<PublicKey> FromMultibase(std::string_view multibase, KeyType legacy_type);
  // SEC1 point bytes (compressed or uncompressed).
  static Result<PublicKey> FromSec1(KeyType type, ByteView point);

  KeyType type() const;
  // "did:key:z..." with the compressed point.
  std::string ToDidKey() const;
  // The same key as a modern `publicKeyMultibase`: ToDidKey() without "did:key:".
  std::string ToMultibase() const;
  // The 33-byte compressed SEC1 point, whatever form the key was parsed from.
  const Bytes& compressed_point() const;

  // OK when `signature` (64 bytes r||s, low-S) is a valid signature of SHA-256(message).
  // A high-S signature is Invalid even if mathematically valid. Thread-safe.
  Status Verify(ByteView message, ByteView signature) const;

  PublicKey(PublicKey&&) noexcept;
  PublicKey& operator=(PublicKey&&) noexcept;
  PublicKey(const PublicKey&);
  PublicKey& operator=(const PublicKey&);
  ~PublicKey();

 private:
  struct Impl;
  explicit PublicKey(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

class PrivateKey {
 public:
  static Result<PrivateKey> Generate(KeyType type);
  // 32-byte big-endian scalar.
  static Result<PrivateKey> FromBytes(KeyType type, ByteView scalar);

  KeyType type() const;
  PublicKey public_key() const;
  Bytes scalar() const;
  // 64-byte r||s signature of SHA-256(message), normalised to low-S. Thread-safe.
  Result<Bytes> Sign(ByteView message) const;

  PrivateKey(PrivateKey&&) noexcept;
  PrivateKey& operator=(PrivateKey&&) noexcept;
  PrivateKey(const PrivateKey&);
  PrivateKey& operator=(const PrivateKey&);
  ~PrivateKey();

 private:
  struct Impl;
  explicit PrivateKey(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

}  // namespace atfill::atproto
