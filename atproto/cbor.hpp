// Strict DAG-CBOR as atproto uses it: map keys are strings in length-then-bytewise order, no
// duplicates; minimal-length heads; tag 42 only (CID with a 0x00 prefix); no floats, undefined,
// indefinite lengths, or other simple values; valid UTF-8 strings.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "atproto/value.hpp"
#include "base/bytes.hpp"
#include "base/status.hpp"

namespace atfill::atproto {

struct CborLimits {
  // Largest input accepted, in bytes.
  size_t max_bytes = 2 * 1024 * 1024;
  // Deepest nesting of arrays and maps.
  size_t max_depth = 128;
  // Largest declared array/map length or string/bytes length (guards allocations).
  size_t max_items = 1 << 20;
};

// Decodes exactly one data item spanning all of `data`. Errors name the byte offset ("at byte 17:
// map keys out of order: ..."): Invalid for a rule broken, Corrupt for truncated input, OutOfRange
// for a limit or an integer outside int64, Unsupported for a CID atproto does not use. Only the
// CBOR rules are checked here: atproto JSON conventions ($type, blob shape) are json.hpp's.
Result<Value> DecodeCbor(ByteView data, const CborLimits& limits = {});

// Decodes the one data item at the start of `data` and sets *consumed to its length in bytes;
// what follows it is left unread (a firehose frame is two items back to back). The same rules
// and errors as DecodeCbor; limits.max_bytes applies to all of `data`.
Result<Value> DecodeCborPrefix(ByteView data, size_t* consumed, const CborLimits& limits = {});

// A field of the top-level map that CborToJson also hands back (records' "createdAt").
struct CborTopField {
  std::string_view key;
  std::string value;   // the field's text, when found
  bool found = false;  // the top level is a map with `key` holding a text string
};

// Appends to *out the atproto JSON of the one data item spanning `data` (CID links as
// {"$link": ...}, bytes as {"$bytes": ...}): exactly ValueToJson(DecodeCbor(data)), accepting and
// refusing the same inputs with the same errors, without building the Value. On error, *out may
// hold a partial document. `field`, when given, captures that top-level text field.
Status CborToJson(ByteView data, std::string* out, CborTopField* field = nullptr,
                  const CborLimits& limits = {});

// A record block (a DAG-CBOR map) as atproto JSON appended to *json, and its top-level
// "createdAt" text in *created_at (left as it is when there is none): CborToJson for the replay
// source and the fetcher. Invalid "the record is not a DAG-CBOR map" when the block is another
// item; when it is not DAG-CBOR at all, that text, ": " and CborToJson's error (with its code).
Status CborRecordToJson(ByteView block, std::string* json, std::string* created_at);

// Appends the encoding of `value` to *out (maps are written in canonical order whatever their
// stored order). A map must not hold the same key twice: that has no DAG-CBOR encoding, and the
// encoder writes both entries.
void EncodeCbor(const Value& value, Bytes* out);
Bytes EncodeCbor(const Value& value);

}  // namespace atfill::atproto
