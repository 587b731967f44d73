// atproto JSON <-> data model. `$link` objects are CIDs, `$bytes` objects are bytes (standard
// base64, padding optional on input, written without padding), `{"$type":"blob",...}` objects are
// checked blobs. Whole-number JSON numbers (123, 123.0, 1e2, -0) are integers, judged from their
// digits and kept exactly over the whole int64 range; any other number (0.5, 1e-3, 2^63) is an
// error. Strings are never normalised.
//
// Rules every reader below applies, at any depth (errors name the JSON Pointer of the offender):
//   - the input is one UTF-8 JSON document; duplicate keys in an object are an error;
//   - an object with "$link" or "$bytes" has no other field, and its value is a string holding a
//     CID (cid.hpp) or base64 bytes;
//   - an object with "$type" has a non-empty string there;
//   - "$type": "blob" objects have exactly "ref" (a $link to a raw-codec CID), "mimeType" (a
//     non-empty string) and "size" (an integer >= 0); legacy {"cid", "mimeType"} blobs are plain
//     maps;
//   - arrays and objects nest at most kJsonMaxDepth deep ($link and $bytes objects not counted).
// All functions are thread-safe: each thread reuses its own parser and buffers, which keep the
// size of the largest document that thread has read.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "atproto/cid.hpp"
#include "atproto/value.hpp"
#include "base/bytes.hpp"
#include "base/status.hpp"

namespace simdjson::dom {
class element;
}  // namespace simdjson::dom

namespace atfill::atproto {

inline constexpr size_t kJsonMaxDepth = 128;

// Parses one JSON document (any data-model value) into the data model.
Result<Value> JsonToValue(std::string_view json);
// Like JsonToValue, but the top level must be an object, as atproto data always is.
Result<Value> JsonObjectToValue(std::string_view json);

// Serialises as atproto JSON (compact, keys in the map's order, non-ASCII written as UTF-8).
// The second form appends to *out. A map whose keys are "$link"/"$bytes" serialises to JSON that
// reads back as a link or bytes: DAG-CBOR allows such maps, atproto JSON cannot tell them apart.
std::string ValueToJson(const Value& value);
void ValueToJson(const Value& value, std::string* out);

// Encodes JSON directly as DAG-CBOR without building a Value (the hot path); appends to *out,
// which is left as it was on error.
Status JsonToCbor(std::string_view json, Bytes* out);

// CID (dag-cbor, sha2-256) of any data-model JSON document.
Result<Cid> CidOfJson(std::string_view json);

// CID of a record: like CidOfJson, but the document must be an object with a non-empty string
// `$type` (a record as a PDS or Jetstream serves it).
Result<Cid> CidOfRecord(std::string_view json);

// Sees a record's parsed document while CidOfRecord holds it, so that a caller checking more of
// the record (lexicon validation) does not parse it again. The element lives only for the call.
class ParsedRecordVisitor {
 public:
  virtual void Visit(const simdjson::dom::element& record) = 0;

 protected:
  ~ParsedRecordVisitor() = default;
};
// CidOfRecord, calling `visitor` (when not null) once the record encoded without error.
Result<Cid> CidOfRecord(std::string_view json, ParsedRecordVisitor* visitor);

}  // namespace atfill::atproto
