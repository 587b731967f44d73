// atproto JSON <-> data model. `$link` objects are CIDs, `$bytes` objects are bytes (standard
// base64, padding optional on input), `{"$type":"blob",...}` objects are checked blobs.
// Whole-number JSON numbers (123, 123.0, 1e2) are integers; any other number is an error. Strings
// are never normalised.
#pragma once

#include <string>
#include <string_view>

#include "atproto/cid.hpp"
#include "atproto/value.hpp"
#include "base/bytes.hpp"
#include "base/status.hpp"

namespace atfill::atproto {

// Parses one JSON document into the data model.
Result<Value> JsonToValue(std::string_view json);

// Serialises as atproto JSON (compact, keys in the map's order).
std::string ValueToJson(const Value& value);
void ValueToJson(const Value& value, std::string* out);

// Encodes JSON directly as DAG-CBOR without building a Value (the hot path).
Status JsonToCbor(std::string_view json, Bytes* out);

// CID (dag-cbor, sha2-256) of any data-model JSON document.
Result<Cid> CidOfJson(std::string_view json);

// CID of a record: like CidOfJson, but the document must be an object with a non-empty string
// `$type` (a record as a PDS or Jetstream serves it).
Result<Cid> CidOfRecord(std::string_view json);

}  // namespace atfill::atproto
