// Strict DAG-CBOR as atproto uses it: map keys are strings in length-then-bytewise order, no
// duplicates; minimal-length heads; tag 42 only (CID with a 0x00 prefix); no floats, undefined,
// indefinite lengths, or other simple values; valid UTF-8 strings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
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

// Appends the head of major type `major` (0-7) with argument `v`, in its minimal length.
void AppendCborHead(uint8_t major, uint64_t v, Bytes* out);

// A forward-only reader of DAG-CBOR items for the fast paths that read one known shape without
// building a Value (an MST node, a firehose frame's head). It answers only true or false and
// checks only what its caller asks: a caller that gets false decodes the input with DecodeCbor,
// which says what is wrong. Lengths are definite and heads of major types 0-6 minimal, so an item
// is skipped by its head alone, or by walking its children for arrays, maps and tags.
class CborReader {
 public:
  explicit CborReader(ByteView bytes) : b_(bytes) {}

  size_t pos() const { return pos_; }
  bool AtEnd() const { return pos_ == b_.size(); }

  // The next head: false at the end, for an indefinite length or a reserved value, and for a
  // non-minimal argument.
  bool Head(uint8_t* major, uint64_t* arg) {
    if (pos_ >= b_.size()) return false;
    const uint8_t initial = b_[pos_++];
    *major = initial >> 5;
    const uint8_t info = initial & 0x1f;
    if (info < 24) {
      *arg = info;
      return true;
    }
    if (info > 27) return false;
    const size_t n = size_t{1} << (info - 24);
    if (b_.size() - pos_ < n) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v = (v << 8) | b_[pos_++];
    static constexpr uint64_t kFloor[] = {24, 0x100, 0x10000, 0x100000000};
    if (*major != 7 && v < kFloor[info - 24]) return false;
    *arg = v;
    return true;
  }
  // The next head, which must be of major type `major`.
  bool HeadOf(uint8_t major, uint64_t* arg) {
    uint8_t m = 0;
    return Head(&m, arg) && m == major;
  }
  bool Text(std::string_view* out) {
    uint64_t n = 0;
    if (!HeadOf(3, &n) || b_.size() - pos_ < n) return false;
    *out = std::string_view(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  // A map key spelled `name` (shorter than 24 bytes).
  bool Key(std::string_view name) {
    if (b_.size() - pos_ < 1 + name.size() || b_[pos_] != (0x60 | name.size()) ||
        std::memcmp(b_.data() + pos_ + 1, name.data(), name.size()) != 0) {
      return false;
    }
    pos_ += 1 + name.size();
    return true;
  }
  bool Bytes(ByteView* out) {
    uint64_t n = 0;
    if (!HeadOf(2, &n) || b_.size() - pos_ < n) return false;
    *out = b_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  // A CID link: tag 42, then a byte string of 0x00 and the binary CID.
  bool Link(Cid* out) {
    if (b_.size() - pos_ < 2 || b_[pos_] != 0xd8 || b_[pos_ + 1] != 42) return false;
    pos_ += 2;
    ByteView bytes;
    if (!Bytes(&bytes) || bytes.empty() || bytes[0] != 0x00) return false;
    auto cid = Cid::FromBinary(bytes.subspan(1));
    if (!cid.ok()) return false;
    *out = *cid;
    return true;
  }
  bool NullOrLink(std::optional<Cid>* out) {
    if (pos_ < b_.size() && b_[pos_] == 0xf6) {
      ++pos_;
      out->reset();
      return true;
    }
    Cid cid;
    if (!Link(&cid)) return false;
    *out = cid;
    return true;
  }
  // Steps over the next item, whatever it is; false when it is cut short or nests deeper than
  // 64.
  bool Skip(int depth = 0) {
    uint8_t major = 0;
    uint64_t n = 0;
    if (depth > 64 || !Head(&major, &n)) return false;
    switch (major) {
      case 0:
      case 1:
      case 7:  // integers, simple values and floats: the head is the item
        return true;
      case 2:
      case 3:
        if (b_.size() - pos_ < n) return false;
        pos_ += n;
        return true;
      case 4:
      case 5: {
        const uint64_t items = major == 5 ? n * 2 : n;
        if (items > b_.size() - pos_) return false;  // each item takes a byte at least
        for (uint64_t i = 0; i < items; ++i) {
          if (!Skip(depth + 1)) return false;
        }
        return true;
      }
      default:  // a tag (42: a CID) and its item
        return Skip(depth + 1);
    }
  }

 private:
  ByteView b_;
  size_t pos_ = 0;
};

}  // namespace atfill::atproto
