#include "base/sha256.hpp"

#include <openssl/evp.h>

#include <cstdlib>
#include <memory>

namespace atfill {
namespace {

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

const EVP_MD* Sha256Md() {
  // Fetched once: EVP_sha256() would look the implementation up on every Init.
  static EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
}

}  // namespace

Sha256Digest Sha256(ByteView data) {
  thread_local std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
  Sha256Digest out{};
  unsigned int len = 0;
  // A failure here means OpenSSL itself is broken (no SHA-256 provider); nothing can go on.
  if (!ctx || EVP_DigestInit_ex2(ctx.get(), Sha256Md(), nullptr) != 1 ||
      EVP_DigestUpdate(ctx.get(), data.data(), data.size()) != 1 ||
      EVP_DigestFinal_ex(ctx.get(), out.data(), &len) != 1 || len != out.size()) {
    std::abort();
  }
  return out;
}

}  // namespace atfill
