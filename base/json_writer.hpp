// A small streaming JSON writer for machine-readable output (--json, APIs). Not a parser.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace atfill {

// Writes compact JSON into a string. The caller keeps Begin/End calls balanced; commas are
// inserted automatically.
class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  // Inside an object: the next value's key.
  JsonWriter& Key(std::string_view key);
  JsonWriter& String(std::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Uint(uint64_t value);
  // Non-finite values are written as null.
  JsonWriter& Double(double value);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();
  // Pre-serialised JSON, inserted as a value unchanged.
  JsonWriter& Raw(std::string_view json);

  const std::string& str() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  void Separate();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

// How AppendJsonString escapes beyond what RFC 8259 requires.
enum class JsonEscape : uint8_t {
  kMinimal,  // quotes, backslashes and control characters only
  // As Go's encoding/json writes strings (Jetstream's frames): also <, > and & as \u003c,
  // \u003e, \u0026, and U+2028/U+2029 as \u2028/\u2029.
  kGo,
};

// Appends `s` as a JSON string literal (quotes included); non-ASCII stays UTF-8.
void AppendJsonString(std::string_view s, std::string* out,
                      JsonEscape escape = JsonEscape::kMinimal);

}  // namespace atfill
