// The full syntax check of a JSON value read with simdjson On Demand. On Demand only matches the
// brackets of a value it skips, so a stray byte, a bad literal or a malformed number inside a
// value no field reads would otherwise pass; every decoder of JSON from the network (Jetstream
// frames, listRecords pages, repo listings) checks the values it does not read with this.
#pragma once

#include <simdjson.h>

#include <cstddef>
#include <string_view>

namespace atfill::atproto {

// What a parsed JSON value is, for a message: "an array", "an object", "a number", "a string",
// "a boolean" or "null".
const char* JsonTypeName(simdjson::dom::element e);

// The RFC 8259 number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
bool IsJsonNumber(std::string_view s);

// Visits every token of `value`, which sits at nesting `depth` (0 = a document's root), and
// returns the first syntax error. An object or array at `max_depth` or deeper sets *too_deep and
// ends the visit without an error: the caller decides whether that is one (the rest is then
// skipped by the caller's iterator).
simdjson::error_code CheckJsonValue(simdjson::ondemand::value value, size_t depth, size_t max_depth,
                                    bool* too_deep);

// The fields of a record object in one pass: every value's syntax checked (CheckJsonValue, the
// fields at nesting 1) and the top-level createdAt, when it is a string, into *created_at. Nesting
// at `max_depth` or deeper sets *too_deep and ends the pass without an error, as CheckJsonValue.
simdjson::error_code CheckRecordObject(simdjson::ondemand::object record, size_t max_depth,
                                       std::string_view* created_at, bool* too_deep);

}  // namespace atfill::atproto
