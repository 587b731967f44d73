// JSON -> DAG-CBOR: the direct encoder and the Value path must agree on every input, and what
// they produce must decode.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "atproto/cbor.hpp"
#include "atproto/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  atfill::Bytes direct;
  const atfill::Status st = atfill::atproto::JsonToCbor(text, &direct);
  auto value = atfill::atproto::JsonToValue(text);
  if (st.ok() != value.ok()) std::abort();
  if (!st.ok()) return 0;
  if (atfill::atproto::EncodeCbor(*value) != direct) std::abort();
  auto decoded = atfill::atproto::DecodeCbor(direct);
  if (!decoded.ok() || !(*decoded == *value)) std::abort();
  return 0;
}
