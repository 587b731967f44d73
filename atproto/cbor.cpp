#include "atproto/cbor.hpp"
#include "base/encoding.hpp"
#include "base/json_writer.hpp"
#include "base/strings.hpp"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

namespace atfill::atproto {
namespace {

enum Major : uint8_t {
  kUnsigned = 0,
  kNegative = 1,
  kByteString = 2,
  kTextString = 3,
  kArray = 4,
  kMap = 5,
  kTag = 6,
  kSimple = 7,
};

constexpr uint64_t kCidTag = 42;
constexpr uint64_t kInt64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

const char* MajorName(uint8_t major) {
  static constexpr const char* kNames[] = {"an unsigned integer",
                                           "a negative integer",
                                           "a byte string",
                                           "a text string",
                                           "an array",
                                           "a map",
                                           "a tag",
                                           "a simple value or float"};
  return kNames[major & 7];
}

// Keys and most strings are short ASCII: a word-at-a-time check is cheaper for them than the
// dispatch into simdjson's vectorised validator, which takes everything else.
bool IsValidUtf8(const char* p, size_t n) {
  constexpr size_t kShort = 64;
  if (n <= kShort) {
    uint64_t bits = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      bits |= word;
    }
    for (; i < n; ++i) bits |= static_cast<uint8_t>(p[i]);
    if ((bits & 0x8080808080808080ULL) == 0) return true;
  }
  return simdjson::validate_utf8(p, n);
}

// The reading and every check of strict DAG-CBOR, shared by the decoder (which builds a Value)
// and the JSON transcoder (which writes atproto JSON straight from the bytes): both accept and
// refuse exactly the same inputs, with the same errors.
class Reader {
 public:
  Reader(ByteView data, const CborLimits& limits) : data_(data), limits_(limits) {}

 protected:
  Status CheckSize() {
    if (data_.size() > limits_.max_bytes) {
      return Status::OutOfRange("DAG-CBOR input of " + std::to_string(data_.size()) +
                                " bytes exceeds the limit of " + std::to_string(limits_.max_bytes));
    }
    return Status::OK();
  }

  Status CheckEnd() {
    if (pos_ != data_.size()) {
      Fail(pos_, StatusCode::kInvalid,
           std::to_string(data_.size() - pos_) + " trailing bytes after the data item");
      return std::move(error_);
    }
    return Status::OK();
  }

  bool Fail(size_t at, StatusCode code, std::string_view what) {
    error_ = Status(code, "at byte " + std::to_string(at) + ": " + std::string(what));
    return false;
  }

  bool AtSimple() const { return pos_ < data_.size() && (data_[pos_] >> 5) == kSimple; }

  // Reads the head of a major type other than 7 (see ReadSimple); the argument must be
  // minimal, and indefinite lengths and reserved values fail.
  bool ReadHead(uint8_t* major, uint64_t* arg) {
    const size_t start = pos_;
    if (pos_ >= data_.size()) return Fail(start, StatusCode::kCorrupt, "input is truncated");
    const uint8_t initial = data_[pos_++];
    *major = initial >> 5;
    const uint8_t info = initial & 0x1f;
    if (info < 24) {
      *arg = info;
      return true;
    }
    if (info == 31) {
      return Fail(start, StatusCode::kInvalid,
                  std::string("indefinite-length ") + MajorName(*major) + " is not allowed");
    }
    if (info > 27) {
      return Fail(start, StatusCode::kInvalid,
                  "reserved additional information " + std::to_string(info));
    }
    const size_t width = size_t{1} << (info - 24);
    if (data_.size() - pos_ < width) {
      return Fail(start, StatusCode::kCorrupt, "input is truncated inside a head");
    }
    uint64_t v = 0;
    for (size_t i = 0; i < width; ++i) v = (v << 8) | data_[pos_ + i];
    pos_ += width;
    static constexpr uint64_t kMinForWidth[] = {24, 0x100, 0x10000, 0x100000000};
    if (v < kMinForWidth[info - 24]) {
      return Fail(start, StatusCode::kInvalid,
                  std::string("non-minimal encoding of the head of ") + MajorName(*major));
    }
    *arg = v;
    return true;
  }

  // The length of a string, array or map must fit the limits and the bytes that remain.
  bool CheckLength(size_t at, uint64_t length, size_t min_item_bytes, const char* what) {
    if (length > limits_.max_items) {
      return Fail(at, StatusCode::kOutOfRange,
                  std::string(what) + " of " + std::to_string(length) + " exceeds the limit of " +
                      std::to_string(limits_.max_items));
    }
    if (length > (data_.size() - pos_) / min_item_bytes) {
      return Fail(
          at, StatusCode::kCorrupt,
          std::string(what) + " of " + std::to_string(length) + " runs past the end of the input");
    }
    return true;
  }

  bool ReadText(size_t at, uint64_t length, std::string_view* out) {
    if (!CheckLength(at, length, 1, "text string length")) return false;
    const char* p = reinterpret_cast<const char*>(data_.data() + pos_);
    if (!IsValidUtf8(p, length)) {
      return Fail(at, StatusCode::kInvalid, "text string is not valid UTF-8");
    }
    *out = std::string_view(p, length);
    pos_ += length;
    return true;
  }

  // An integer of major type 0 or 1, which must fit int64.
  bool ToInt(size_t start, uint8_t major, uint64_t arg, int64_t* out) {
    if (major == kUnsigned) {
      if (arg > kInt64Max) {
        return Fail(start, StatusCode::kOutOfRange,
                    "integer " + std::to_string(arg) + " is outside the signed 64-bit range");
      }
      *out = static_cast<int64_t>(arg);
      return true;
    }
    if (arg > kInt64Max) {
      return Fail(
          start, StatusCode::kOutOfRange,
          "integer -" +
              (arg == UINT64_MAX ? std::string("18446744073709551616") : std::to_string(arg + 1)) +
              " is outside the signed 64-bit range");
    }
    *out = -1 - static_cast<int64_t>(arg);
    return true;
  }

  bool ReadBytes(size_t start, uint64_t length, ByteView* out) {
    if (!CheckLength(start, length, 1, "byte string length")) return false;
    *out = data_.subspan(pos_, length);
    pos_ += length;
    return true;
  }

  bool CheckNesting(size_t start, size_t depth) {
    if (depth + 1 > limits_.max_depth) {
      return Fail(start, StatusCode::kOutOfRange,
                  "nesting exceeds the depth limit of " + std::to_string(limits_.max_depth));
    }
    return true;
  }

  // false, true or null (0, 1, 2) at pos_, whose major type is 7; anything else fails.
  bool ReadSimple(int* which) {
    const size_t start = pos_;
    const uint8_t info = data_[pos_] & 0x1f;
    switch (info) {
      case 20:
      case 21:
      case 22:
        ++pos_;
        *which = info - 20;
        return true;
      case 23:
        return Fail(start, StatusCode::kInvalid, "undefined is not allowed in DAG-CBOR");
      case 25:
      case 26:
      case 27:
        return Fail(start, StatusCode::kInvalid,
                    "floating-point numbers are not allowed in atproto data");
      case 31:
        return Fail(start, StatusCode::kInvalid,
                    "unexpected break (0xff) outside an indefinite-length item");
      default:
        if (info > 27) {
          return Fail(start, StatusCode::kInvalid,
                      "reserved additional information " + std::to_string(info));
        }
        return Fail(start, StatusCode::kInvalid,
                    "simple values other than false, true and null are not allowed");
    }
  }

  // The head of a map of `count` entries (already read at `start`).
  bool CheckMap(size_t start, uint64_t count, size_t depth) {
    if (!CheckNesting(start, depth)) return false;
    // Each entry needs at least a one-byte key and a one-byte value.
    return CheckLength(start, count, 2, "map length");
  }

  // Entry i's key, which must be a text string after *previous in canonical order.
  bool ReadKey(uint64_t i, std::string_view* previous, std::string_view* key) {
    const size_t key_at = pos_;
    uint8_t major = 0;
    uint64_t length = 0;
    if (pos_ < data_.size() && (data_[pos_] >> 5) != kTextString) {
      return Fail(key_at, StatusCode::kInvalid,
                  std::string("map key must be a text string, not ") + MajorName(data_[pos_] >> 5));
    }
    if (!ReadHead(&major, &length)) return false;
    if (!ReadText(key_at, length, key)) return false;
    if (i > 0 && !CborKeyLess(*previous, *key)) {
      if (*previous == *key) {
        return Fail(key_at, StatusCode::kInvalid, "duplicate map key " + QuoteForMessage(*key));
      }
      return Fail(key_at, StatusCode::kInvalid,
                  "map keys out of order: " + QuoteForMessage(*key) + " after " +
                      QuoteForMessage(*previous));
    }
    *previous = *key;
    return true;
  }

  // The CID a tag (already read at `start`) links to: only tag 42 over a 0x00-prefixed CID.
  bool ReadLink(size_t start, uint64_t tag, Cid* out) {
    if (tag != kCidTag) {
      return Fail(start, StatusCode::kInvalid,
                  "tag " + std::to_string(tag) + " is not allowed (only tag 42, a CID link)");
    }
    const size_t bytes_at = pos_;
    if (pos_ < data_.size() && (data_[pos_] >> 5) != kByteString) {
      return Fail(
          bytes_at, StatusCode::kInvalid,
          std::string("tag 42 must wrap a byte string, not ") + MajorName(data_[pos_] >> 5));
    }
    uint8_t major = 0;
    uint64_t length = 0;
    if (!ReadHead(&major, &length)) return false;
    if (!CheckLength(bytes_at, length, 1, "CID byte string length")) return false;
    if (length == 0 || data_[pos_] != 0x00) {
      return Fail(bytes_at, StatusCode::kInvalid,
                  "CID link must start with the 0x00 identity-multibase prefix");
    }
    auto cid = Cid::FromBinary(data_.subspan(pos_ + 1, length - 1));
    if (!cid.ok()) {
      const Status& st = cid.status();
      return Fail(bytes_at, st.code(), "CID link: " + st.message());
    }
    pos_ += length;
    *out = *cid;
    return true;
  }

  // One data item, every check made: a scalar's value, or an array's or map's length (its items
  // are the caller's to read, keys with ReadKey).
  struct Item {
    Value::Kind kind = Value::Kind::kNull;
    bool boolean = false;
    int64_t integer = 0;
    ByteView bytes;
    std::string_view text;
    Cid link;
    uint64_t count = 0;
  };
  bool ReadItem(size_t depth, Item* item) {
    const size_t start = pos_;
    if (AtSimple()) {
      int which = 0;
      if (!ReadSimple(&which)) return false;
      item->kind = which == 2 ? Value::Kind::kNull : Value::Kind::kBool;
      item->boolean = which == 1;
      return true;
    }
    uint8_t major = 0;
    uint64_t arg = 0;
    if (!ReadHead(&major, &arg)) return false;
    item->count = arg;
    switch (major) {
      case kUnsigned:
      case kNegative:
        item->kind = Value::Kind::kInt;
        return ToInt(start, major, arg, &item->integer);
      case kByteString:
        item->kind = Value::Kind::kBytes;
        return ReadBytes(start, arg, &item->bytes);
      case kTextString:
        item->kind = Value::Kind::kString;
        return ReadText(start, arg, &item->text);
      case kArray:
        item->kind = Value::Kind::kArray;
        return CheckNesting(start, depth) && CheckLength(start, arg, 1, "array length");
      case kMap:
        item->kind = Value::Kind::kMap;
        return CheckMap(start, arg, depth);
      case kTag:
        item->kind = Value::Kind::kLink;
        return ReadLink(start, arg, &item->link);
      default:
        return Fail(start, StatusCode::kInternal, "unreachable major type");
    }
  }

  ByteView data_;
  const CborLimits& limits_;
  size_t pos_ = 0;
  Status error_;
};

class Decoder : public Reader {
 public:
  using Reader::Reader;

  Status DecodeAll(Value* out) {
    ATFILL_RETURN_IF_ERROR(CheckSize());
    if (!Decode(out, 0)) return std::move(error_);
    return CheckEnd();
  }

  Status DecodeFirst(Value* out, size_t* consumed) {
    ATFILL_RETURN_IF_ERROR(CheckSize());
    if (!Decode(out, 0)) return std::move(error_);
    *consumed = pos_;
    return Status::OK();
  }

 private:
  bool Decode(Value* out, size_t depth) {
    Item item;
    if (!ReadItem(depth, &item)) return false;
    switch (item.kind) {
      case Value::Kind::kNull:
        *out = Value::Null();
        return true;
      case Value::Kind::kBool:
        *out = Value::Bool(item.boolean);
        return true;
      case Value::Kind::kInt:
        *out = Value::Int(item.integer);
        return true;
      case Value::Kind::kBytes:
        *out = Value::BytesValue(Bytes(item.bytes.begin(), item.bytes.end()));
        return true;
      case Value::Kind::kString:
        *out = Value::String(std::string(item.text));
        return true;
      case Value::Kind::kLink:
        *out = Value::Link(item.link);
        return true;
      case Value::Kind::kArray: {
        Value::Array items(item.count);
        for (Value& v : items) {
          if (!Decode(&v, depth + 1)) return false;
        }
        *out = Value::MakeArray(std::move(items));
        return true;
      }
      case Value::Kind::kMap: {
        Value::Map map;
        map.reserve(item.count);
        std::string_view previous;
        for (uint64_t i = 0; i < item.count; ++i) {
          std::string_view key;
          if (!ReadKey(i, &previous, &key)) return false;
          map.emplace_back(std::string(key), Value());
          if (!Decode(&map.back().second, depth + 1)) return false;
        }
        *out = Value::MakeMap(std::move(map));
        return true;
      }
    }
    return Fail(pos_, StatusCode::kInternal, "unreachable value kind");
  }
};

// Writes atproto JSON as it reads: exactly what AppendJson(DecodeCbor(data)) would write, with no
// Value in between (no allocation per node).
class JsonTranscoder : public Reader {
 public:
  JsonTranscoder(ByteView data, const CborLimits& limits, std::string* out, CborTopField* field)
      : Reader(data, limits), out_(out), field_(field) {}

  Status TranscodeAll() {
    ATFILL_RETURN_IF_ERROR(CheckSize());
    if (field_ != nullptr) field_->found = false;
    if (!Emit(0, nullptr)) return std::move(error_);
    return CheckEnd();
  }

 private:
  // Writes the next item; *text (when given) gets its text when it is a string.
  bool Emit(size_t depth, std::string_view* text) {
    Item item;
    if (!ReadItem(depth, &item)) return false;
    switch (item.kind) {
      case Value::Kind::kNull:
        out_->append("null");
        return true;
      case Value::Kind::kBool:
        out_->append(item.boolean ? "true" : "false");
        return true;
      case Value::Kind::kInt: {
        char buf[24];
        const auto result = std::to_chars(buf, buf + sizeof(buf), item.integer);
        out_->append(buf, result.ptr);
        return true;
      }
      case Value::Kind::kBytes:
        out_->append("{\"$bytes\":\"");
        out_->append(Base64Encode(item.bytes, Base64Alphabet::kStandard, /*pad=*/false));
        out_->append("\"}");
        return true;
      case Value::Kind::kString:
        AppendJsonString(item.text, out_);
        if (text != nullptr) *text = item.text;
        return true;
      case Value::Kind::kLink:
        out_->append("{\"$link\":\"");
        out_->append(item.link.ToString());
        out_->append("\"}");
        return true;
      case Value::Kind::kArray:
        out_->push_back('[');
        for (uint64_t i = 0; i < item.count; ++i) {
          if (i > 0) out_->push_back(',');
          if (!Emit(depth + 1, nullptr)) return false;
        }
        out_->push_back(']');
        return true;
      case Value::Kind::kMap: {
        out_->push_back('{');
        std::string_view previous;
        for (uint64_t i = 0; i < item.count; ++i) {
          std::string_view key;
          if (!ReadKey(i, &previous, &key)) return false;
          if (i > 0) out_->push_back(',');
          AppendJsonString(key, out_);
          out_->push_back(':');
          const bool capture = depth == 0 && field_ != nullptr && key == field_->key;
          std::string_view value;
          if (!Emit(depth + 1, capture ? &value : nullptr)) return false;
          if (capture && value.data() != nullptr) {
            field_->value.assign(value);
            field_->found = true;
          }
        }
        out_->push_back('}');
        return true;
      }
    }
    return Fail(pos_, StatusCode::kInternal, "unreachable value kind");
  }

  std::string* out_;
  CborTopField* field_;
};

}  // namespace

void AppendCborHead(uint8_t major, uint64_t v, Bytes* out) {
  const uint8_t m = static_cast<uint8_t>(major << 5);
  if (v < 24) {
    out->push_back(m | static_cast<uint8_t>(v));
    return;
  }
  size_t width;
  uint8_t info;
  if (v <= 0xff) {
    width = 1;
    info = 24;
  } else if (v <= 0xffff) {
    width = 2;
    info = 25;
  } else if (v <= 0xffffffff) {
    width = 4;
    info = 26;
  } else {
    width = 8;
    info = 27;
  }
  uint8_t buf[9];
  buf[0] = m | info;
  for (size_t i = 0; i < width; ++i) buf[1 + i] = static_cast<uint8_t>(v >> (8 * (width - 1 - i)));
  out->insert(out->end(), buf, buf + 1 + width);
}

namespace {

void AppendText(std::string_view s, Bytes* out) {
  AppendCborHead(kTextString, s.size(), out);
  out->insert(out->end(), s.begin(), s.end());
}

void Encode(const Value& value, Bytes* out) {
  switch (value.kind()) {
    case Value::Kind::kNull:
      out->push_back(0xf6);
      break;
    case Value::Kind::kBool:
      out->push_back(value.as_bool() ? 0xf5 : 0xf4);
      break;
    case Value::Kind::kInt: {
      const int64_t i = value.as_int();
      if (i >= 0) {
        AppendCborHead(kUnsigned, static_cast<uint64_t>(i), out);
      } else {
        AppendCborHead(kNegative, static_cast<uint64_t>(-1 - i), out);
      }
      break;
    }
    case Value::Kind::kString:
      AppendText(value.as_string(), out);
      break;
    case Value::Kind::kBytes: {
      const Bytes& b = value.as_bytes();
      AppendCborHead(kByteString, b.size(), out);
      out->insert(out->end(), b.begin(), b.end());
      break;
    }
    case Value::Kind::kLink: {
      const ByteView cid = value.as_link().binary();
      AppendCborHead(kTag, kCidTag, out);
      AppendCborHead(kByteString, cid.size() + 1, out);
      out->push_back(0x00);
      out->insert(out->end(), cid.begin(), cid.end());
      break;
    }
    case Value::Kind::kArray: {
      const Value::Array& items = value.as_array();
      AppendCborHead(kArray, items.size(), out);
      for (const Value& item : items) Encode(item, out);
      break;
    }
    case Value::Kind::kMap: {
      const Value::Map& map = value.as_map();
      AppendCborHead(kMap, map.size(), out);
      const auto less = [](const auto& a, const auto& b) { return CborKeyLess(a.first, b.first); };
      if (std::is_sorted(map.begin(), map.end(), less)) {
        for (const auto& [k, v] : map) {
          AppendText(k, out);
          Encode(v, out);
        }
        break;
      }
      std::vector<const Value::Map::value_type*> order;
      order.reserve(map.size());
      for (const auto& entry : map) order.push_back(&entry);
      std::stable_sort(order.begin(), order.end(),
                       [&](const auto* a, const auto* b) { return less(*a, *b); });
      for (const auto* entry : order) {
        AppendText(entry->first, out);
        Encode(entry->second, out);
      }
      break;
    }
  }
}

}  // namespace

Result<Value> DecodeCbor(ByteView data, const CborLimits& limits) {
  Value value;
  Decoder decoder(data, limits);
  ATFILL_RETURN_IF_ERROR(decoder.DecodeAll(&value));
  return value;
}

Result<Value> DecodeCborPrefix(ByteView data, size_t* consumed, const CborLimits& limits) {
  Value value;
  Decoder decoder(data, limits);
  ATFILL_RETURN_IF_ERROR(decoder.DecodeFirst(&value, consumed));
  return value;
}

Status CborToJson(ByteView data, std::string* out, CborTopField* field, const CborLimits& limits) {
  if (out->capacity() - out->size() < data.size() + data.size() / 4 + 64) {
    out->reserve(out->size() + data.size() + data.size() / 4 + 64);
  }
  JsonTranscoder transcoder(data, limits, out, field);
  return transcoder.TranscodeAll();
}

Status CborRecordToJson(ByteView block, std::string* json, std::string* created_at) {
  static constexpr std::string_view kNotAMap = "the record is not a DAG-CBOR map";
  if (block.empty() || (block[0] >> 5) != kMap) return Status::Invalid(std::string(kNotAMap));
  CborTopField created{.key = "createdAt", .value = {}, .found = false};
  if (Status st = CborToJson(block, json, &created); !st.ok()) {
    return Status(st.code(), std::string(kNotAMap) + ": " + st.message());
  }
  if (created.found) *created_at = std::move(created.value);
  return Status::OK();
}

void EncodeCbor(const Value& value, Bytes* out) { Encode(value, out); }

Bytes EncodeCbor(const Value& value) {
  Bytes out;
  Encode(value, &out);
  return out;
}

}  // namespace atfill::atproto
