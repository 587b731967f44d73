// DAG-CBOR decode: never crashes, and strictness means whatever decodes re-encodes to the
// identical bytes (there is exactly one valid encoding of each value).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "atproto/cbor.hpp"
#include "atproto/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const atfill::ByteView in(data, size);
  auto value = atfill::atproto::DecodeCbor(in);
  // The transcoder accepts and refuses exactly what the decoder does, and writes the same JSON.
  std::string json;
  const atfill::Status transcoded = atfill::atproto::CborToJson(in, &json);
  if (transcoded.ToString() != (value.ok() ? atfill::Status::OK() : value.status()).ToString()) {
    std::abort();
  }
  if (!value.ok()) return 0;
  if (json != atfill::atproto::ValueToJson(*value)) std::abort();
  const atfill::Bytes again = atfill::atproto::EncodeCbor(*value);
  if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  // The JSON form is only exercised: CBOR maps may use "$link"/"$bytes" keys that JSON reads as
  // typed values, so equality is not a property here.
  (void)atfill::atproto::JsonToValue(atfill::atproto::ValueToJson(*value));
  return 0;
}
