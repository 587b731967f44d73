// SHA-256 through OpenSSL's EVP interface.
#pragma once

#include <array>
#include <cstdint>

#include "base/bytes.hpp"

namespace atfill {

using Sha256Digest = std::array<uint8_t, 32>;

// Thread-safe; reuses one digest context per thread, so the hot path does not allocate.
Sha256Digest Sha256(ByteView data);

}  // namespace atfill
