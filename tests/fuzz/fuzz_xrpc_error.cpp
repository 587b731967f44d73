// XRPC error bodies ({"error":NAME,"message":TEXT}), read from every failed answer a PDS, relay,
// PLC directory or archive gives (net::ParseXrpcError). Never fails; what it reads is a string
// the body really holds, and finality depends only on the status and the name.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "net/xrpc_error.hpp"
#include "tests/fuzz/fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using atfill::fuzz::Check;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const atfill::net::XrpcError e = atfill::net::ParseXrpcError(body);
  if (!e.error.empty() || !e.message.empty()) {
    Check(atfill::fuzz::IsJson(body), "an error body that is read is valid JSON");
  }
  for (int status : {200, 400, 401, 404, 408, 429, 500, 502}) {
    const bool final = atfill::net::IsFinalXrpcError(status, e);
    if (status < 400 || status >= 500 || status == 408 || status == 429) {
      Check(!final, "only a 4xx other than 408/429 is final");
    }
  }
  return 0;
}
