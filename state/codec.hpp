// Encodings shared by the typed state layers: order-preserving key parts and a versioned
// tag-length-value record format. Internal to state/.
//
// Record format: one version byte, then fields. A field is varint(tag) varint(length) payload;
// tags are non-zero; integers are varints inside their payload; a reader skips tags it does not
// know, so fields can be added without a version bump. Decoding never trusts a length: anything
// malformed is Corrupt with the byte offset.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/status.hpp"

namespace atfill::state::codec {

// Big-endian, so byte order equals numeric order.
void AppendBe64(std::string* out, uint64_t value);
// Signed values map to unsigned with the sign bit flipped, so byte order equals numeric order.
void AppendOrderedI64(std::string* out, int64_t value);
// Reads 8 bytes at `pos`; false when fewer remain.
bool ReadBe64(std::string_view in, size_t pos, uint64_t* value);
int64_t OrderedToI64(uint64_t ordered);

// `prefix` followed by the big-endian `id`.
std::string KeyWithId(std::string_view prefix, uint64_t id);

void AppendVarint64(std::string* out, uint64_t value);
// Reads an LEB128 varint of at most 10 bytes at `*pos`, advancing it; false when truncated or
// longer than 64 bits.
bool ReadVarint64(std::string_view in, size_t* pos, uint64_t* value);

class RecordWriter {
 public:
  explicit RecordWriter(uint8_t version) { out_.push_back(static_cast<char>(version)); }
  void Uint(uint32_t tag, uint64_t value);
  void Int(uint32_t tag, int64_t value);  // zigzag
  void Bool(uint32_t tag, bool value) { Uint(tag, value ? 1 : 0); }
  void Str(uint32_t tag, std::string_view value);
  // A (key, value) pair as one field: varint(key length) key value.
  void StrPair(uint32_t tag, std::string_view key, std::string_view value);
  void StrUint(uint32_t tag, std::string_view key, uint64_t value);
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// One field handed to the visitor of ReadRecord. Its accessors return Corrupt naming the record,
// the tag and the field's byte offset.
class Field {
 public:
  Field(std::string_view what, uint64_t tag, std::string_view payload, size_t offset)
      : what_(what), tag_(tag), payload_(payload), offset_(offset) {}
  uint64_t tag() const { return tag_; }
  std::string_view payload() const { return payload_; }
  Result<uint64_t> Uint() const;
  Result<uint32_t> Uint32() const;
  Result<int64_t> Int() const;
  Result<bool> Bool() const;
  std::string Str() const { return std::string(payload_); }
  Status StrPair(std::string* key, std::string* value) const;
  Status StrUint(std::string* key, uint64_t* value) const;
  Status Error(std::string_view problem) const;

 private:
  std::string_view what_;
  uint64_t tag_;
  std::string_view payload_;
  size_t offset_;
};

// Checks the version byte (`version` exactly) and calls `fn` for each field in order; the first
// error stops the walk. `what` names the record in messages ("job 7 record").
Status ReadRecord(std::string_view bytes, uint8_t version, std::string_view what,
                  const std::function<Status(const Field&)>& fn);

}  // namespace atfill::state::codec
