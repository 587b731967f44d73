#include "atproto/json.hpp"

#include "base/json_writer.hpp"
#include "base/strings.hpp"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "atproto/cbor.hpp"
#include "atproto/json_check.hpp"
#include "base/encoding.hpp"

namespace atfill::atproto {
namespace {

namespace dom = simdjson::dom;

constexpr uint8_t kMajorUnsigned = 0;
constexpr uint8_t kMajorNegative = 1;
constexpr uint8_t kMajorBytes = 2;
constexpr uint8_t kMajorText = 3;
constexpr uint8_t kMajorArray = 4;
constexpr uint8_t kMajorMap = 5;
constexpr uint8_t kFalse = 0xf4;
constexpr uint8_t kTrue = 0xf5;
constexpr uint8_t kNull = 0xf6;
// Tag 42 (0xd8 0x2a), a 37-byte byte string (0x58 0x25), the identity-multibase prefix 0x00.
constexpr uint8_t kLinkPrefix[] = {0xd8, 0x2a, 0x58, 0x25, 0x00};

// Appends DAG-CBOR to a Bytes through a raw cursor: one bounds check per write, and the vector is
// resized only when a generous first guess (the JSON size) runs out.
class CborWriter {
 public:
  CborWriter(Bytes* out, size_t hint) : out_(out), base_(out->size()) {
    out_->resize(base_ + hint);
    p_ = out_->data() + base_;
    end_ = out_->data() + out_->size();
  }

  void Head(uint8_t major, uint64_t v) {
    Ensure(9);
    if (v < 24) {
      *p_++ = static_cast<uint8_t>(major << 5) | static_cast<uint8_t>(v);
    } else {
      LongHead(major, v);
    }
  }
  void Byte(uint8_t b) {
    Ensure(1);
    *p_++ = b;
  }
  void Raw(const void* data, size_t n) {
    if (n == 0) return;  // an empty Bytes may have no buffer, and memcpy takes no null
    Ensure(n);
    std::memcpy(p_, data, n);
    p_ += n;
  }
  void Text(std::string_view s) {
    Ensure(9 + s.size());
    if (s.size() < 24) {
      *p_++ = static_cast<uint8_t>(kMajorText << 5) | static_cast<uint8_t>(s.size());
    } else {
      LongHead(kMajorText, s.size());
    }
    std::memcpy(p_, s.data(), s.size());
    p_ += s.size();
  }
  void Int(int64_t i) {
    if (i >= 0) {
      Head(kMajorUnsigned, static_cast<uint64_t>(i));
    } else {
      Head(kMajorNegative, static_cast<uint64_t>(-1 - i));
    }
  }
  void Link(const Cid& cid) {
    Raw(kLinkPrefix, sizeof(kLinkPrefix));
    Raw(cid.binary().data(), Cid::kBinarySize);
  }

  void Finish() { out_->resize(static_cast<size_t>(p_ - out_->data())); }
  void Abandon() { out_->resize(base_); }

 private:
  void Ensure(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) [[unlikely]]
      Grow(n);
  }
  // A head with a 1, 2, 4 or 8-byte argument; room for 9 bytes is already ensured.
  void LongHead(uint8_t major, uint64_t v) {
    const uint8_t m = static_cast<uint8_t>(major << 5);
    size_t width;
    if (v <= 0xff) {
      *p_ = m | 24;
      width = 1;
    } else if (v <= 0xffff) {
      *p_ = m | 25;
      width = 2;
    } else if (v <= 0xffffffff) {
      *p_ = m | 26;
      width = 4;
    } else {
      *p_ = m | 27;
      width = 8;
    }
    for (size_t i = 0; i < width; ++i) p_[1 + i] = static_cast<uint8_t>(v >> (8 * (width - 1 - i)));
    p_ += 1 + width;
  }
  [[gnu::noinline]] void Grow(size_t n) {
    const size_t used = static_cast<size_t>(p_ - out_->data());
    out_->resize(std::max(out_->size() * 2, used + n));
    p_ = out_->data() + used;
    end_ = out_->data() + out_->size();
  }

  Bytes* out_;
  size_t base_;
  uint8_t* p_;
  uint8_t* end_;
};

struct Entry {
  std::string_view key;
  dom::element value;
};

// Per-thread parse state: the simdjson parser and padded input copy keep their capacity across
// calls, and the entry stack holds every open object's fields while they are sorted.
struct ThreadState {
  dom::parser parser;
  std::unique_ptr<char[]> padded;
  size_t padded_capacity = 0;
  std::vector<Entry> entries;
  std::string exact;
  Bytes scratch;
};

ThreadState& State() {
  thread_local ThreadState state;
  return state;
}

// Insertion sort: objects are small, and JSON writers often emit keys nearly in order.
void SortEntries(Entry* first, size_t n) {
  for (size_t i = 1; i < n; ++i) {
    Entry e = first[i];
    size_t j = i;
    while (j > 0 && CborKeyLess(e.key, first[j - 1].key)) {
      first[j] = first[j - 1];
      --j;
    }
    first[j] = e;
  }
}

// Exact value of a JSON number token when it is a whole number in the int64 range. Doubles round,
// so "1.0000000000000000001" or "9007199254740993.0" must be judged from the digits themselves.
Status ExactInteger(std::string_view token, int64_t* out) {
  const auto invalid = [&] {
    return Status::Invalid(QuoteForMessage(token) + " is not a valid JSON number");
  };
  size_t i = 0;
  const size_t n = token.size();
  const bool negative = n > 0 && token[0] == '-';
  if (negative) ++i;
  const auto is_digit = [&](size_t k) { return k < n && token[k] >= '0' && token[k] <= '9'; };
  if (!is_digit(i)) return invalid();
  const size_t int_begin = i;
  if (token[i] == '0') {
    ++i;
    if (is_digit(i)) return invalid();
  } else {
    while (is_digit(i)) ++i;
  }
  const size_t int_end = i;
  size_t frac_begin = i;
  size_t frac_end = i;
  if (i < n && token[i] == '.') {
    ++i;
    frac_begin = i;
    if (!is_digit(i)) return invalid();
    while (is_digit(i)) ++i;
    frac_end = i;
  }
  int64_t exponent = 0;
  if (i < n && (token[i] == 'e' || token[i] == 'E')) {
    ++i;
    bool exp_negative = false;
    if (i < n && (token[i] == '+' || token[i] == '-')) exp_negative = token[i++] == '-';
    if (!is_digit(i)) return invalid();
    // Saturates: past a billion the answer (too large, or not whole) no longer changes.
    constexpr int64_t kCap = 1'000'000'000;
    while (is_digit(i)) {
      exponent = std::min<int64_t>(kCap, exponent * 10 + (token[i] - '0'));
      ++i;
    }
    if (exp_negative) exponent = -exponent;
  }
  if (i != n) return invalid();

  std::string digits;
  digits.append(token.substr(int_begin, int_end - int_begin));
  digits.append(token.substr(frac_begin, frac_end - frac_begin));
  int64_t exp10 = exponent - static_cast<int64_t>(frac_end - frac_begin);
  const size_t lead = digits.find_first_not_of('0');
  if (lead == std::string::npos) {
    *out = 0;
    return Status::OK();
  }
  digits.erase(0, lead);
  while (digits.back() == '0') {
    digits.pop_back();
    ++exp10;
  }
  if (exp10 < 0) {
    return Status::Invalid("number " + QuoteForMessage(token) +
                           " is not an integer (atproto data has no floating-point numbers)");
  }
  const auto out_of_range = [&] {
    return Status::OutOfRange("number " + QuoteForMessage(token) +
                              " is outside the signed 64-bit integer range");
  };
  if (static_cast<int64_t>(digits.size()) + exp10 > 19) return out_of_range();
  // At most 19 digits: below 10^19, which fits a uint64.
  uint64_t magnitude = 0;
  for (char d : digits) magnitude = magnitude * 10 + static_cast<uint64_t>(d - '0');
  for (int64_t k = 0; k < exp10; ++k) magnitude *= 10;
  constexpr uint64_t kMaxPositive = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (magnitude > kMaxPositive + (negative ? 1 : 0)) return out_of_range();
  *out = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
  return Status::OK();
}

bool IsNumberChar(char c) {
  return (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.' || c == 'e' || c == 'E';
}

// Copies `json` with every number token replaced by its exact integer, or fails on the first
// number that is not a whole int64. Runs only when simdjson met a number it had to treat as a
// double, which atproto records never contain.
Status RewriteNumbers(std::string_view json, std::string* out) {
  out->clear();
  out->reserve(json.size());
  const size_t n = json.size();
  size_t i = 0;
  while (i < n) {
    const char c = json[i];
    if (c == '"') {
      size_t j = i + 1;
      while (j < n && json[j] != '"') j += json[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, n);
      out->append(json.data() + i, j - i);
      i = j;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t j = i + 1;
      while (j < n && IsNumberChar(json[j])) ++j;
      int64_t value = 0;
      ATFILL_RETURN_IF_ERROR(ExactInteger(json.substr(i, j - i), &value));
      char buf[24];
      const auto result = std::to_chars(buf, buf + sizeof(buf), value);
      out->append(buf, result.ptr);
      i = j;
    } else {
      out->push_back(c);
      ++i;
    }
  }
  return Status::OK();
}

enum class TopLevel { kAny, kObject, kRecord };

// Walks simdjson's DOM and writes DAG-CBOR as it goes: each object's fields are gathered on the
// entry stack, sorted into DAG-CBOR key order, checked against the atproto JSON conventions, and
// written; no Value is built. The JSON path is recorded only on failure, while unwinding.
class JsonEncoder {
 public:
  JsonEncoder(std::vector<Entry>* entries, CborWriter* writer, TopLevel top)
      : entries_(*entries), w_(*writer), top_(top) {}

  bool Encode(dom::element root) {
    if (top_ != TopLevel::kAny && root.type() != dom::element_type::OBJECT) {
      return Fail(StatusCode::kInvalid,
                  std::string("the top level must be a JSON object, not ") + JsonTypeName(root));
    }
    return Element(root, 0);
  }

  // True when a number simdjson parsed as a double was met: the caller retries exactly.
  bool needs_exact() const { return needs_exact_; }

  Status TakeError() {
    if (path_.empty()) return std::move(error_);
    std::string where = "at ";
    for (auto it = path_.rbegin(); it != path_.rend(); ++it) {
      where += '/';
      where += *it;
    }
    return error_.WithContext(where);
  }

 private:
  bool Fail(StatusCode code, std::string message) {
    error_ = Status(code, std::move(message));
    return false;
  }
  // JSON Pointer segments (RFC 6901), innermost first.
  void AddPath(std::string_view key) {
    std::string seg;
    for (char c : key) {
      if (c == '~') {
        seg += "~0";
      } else if (c == '/') {
        seg += "~1";
      } else {
        seg += c;
      }
    }
    path_.push_back(std::move(seg));
  }
  void AddPath(size_t index) { path_.push_back(std::to_string(index)); }

  bool Number(dom::element e, int64_t* out) {
    switch (e.type()) {
      case dom::element_type::INT64:
        *out = e.get_int64().value_unsafe();
        return true;
      case dom::element_type::UINT64:
        return Fail(StatusCode::kOutOfRange, "number " +
                                                 std::to_string(e.get_uint64().value_unsafe()) +
                                                 " is outside the signed 64-bit integer range");
      default:
        needs_exact_ = true;
        return Fail(StatusCode::kInternal, "number needs exact parsing");
    }
  }

  bool Element(dom::element e, size_t depth) {
    switch (e.type()) {
      case dom::element_type::OBJECT:
        return Object(e.get_object().value_unsafe(), depth);
      case dom::element_type::ARRAY:
        return Array(e.get_array().value_unsafe(), depth);
      case dom::element_type::STRING:
        w_.Text(e.get_string().value_unsafe());
        return true;
      case dom::element_type::INT64:
      case dom::element_type::UINT64:
      case dom::element_type::DOUBLE: {
        int64_t i = 0;
        if (!Number(e, &i)) return false;
        w_.Int(i);
        return true;
      }
      case dom::element_type::BOOL:
        w_.Byte(e.get_bool().value_unsafe() ? kTrue : kFalse);
        return true;
      case dom::element_type::NULL_VALUE:
        w_.Byte(kNull);
        return true;
    }
    return Fail(StatusCode::kInternal, "unknown simdjson element type");
  }

  bool CheckDepth(size_t depth) {
    if (depth + 1 > kJsonMaxDepth) {
      return Fail(StatusCode::kOutOfRange,
                  "nesting exceeds the depth limit of " + std::to_string(kJsonMaxDepth));
    }
    return true;
  }

  bool Array(dom::array array, size_t depth) {
    if (!CheckDepth(depth)) return false;
    w_.Head(kMajorArray, array.size());
    size_t index = 0;
    for (dom::element item : array) {
      if (!Element(item, depth + 1)) {
        AddPath(index);
        return false;
      }
      ++index;
    }
    return true;
  }

  bool Object(dom::object object, size_t depth) {
    const size_t base = entries_.size();
    for (dom::key_value_pair field : object) entries_.push_back({field.key, field.value});
    const size_t n = entries_.size() - base;
    SortEntries(entries_.data() + base, n);
    int link = -1;
    int bytes = -1;
    int type = -1;
    for (size_t i = 0; i < n; ++i) {
      const std::string_view key = entries_[base + i].key;
      if (i > 0 && key == entries_[base + i - 1].key) {
        return Fail(StatusCode::kInvalid, "duplicate key " + QuoteForMessage(key));
      }
      if (!key.empty() && key[0] == '$') {
        if (key == "$link") {
          link = static_cast<int>(i);
        } else if (key == "$bytes") {
          bytes = static_cast<int>(i);
        } else if (key == "$type") {
          type = static_cast<int>(i);
        }
      }
    }
    if (link >= 0 || bytes >= 0) {
      if (depth == 0 && top_ != TopLevel::kAny) {
        return Fail(StatusCode::kInvalid, std::string("the top level must be a map, not a ") +
                                              (link >= 0 ? "$link" : "$bytes") + " object");
      }
      return TypedScalar(base, n, link >= 0);
    }
    if (type >= 0) {
      const dom::element t = entries_[base + static_cast<size_t>(type)].value;
      if (t.type() != dom::element_type::STRING) {
        AddPath("$type");
        return Fail(StatusCode::kInvalid,
                    std::string("$type must be a string, not ") + JsonTypeName(t));
      }
      const std::string_view name = t.get_string().value_unsafe();
      if (name.empty()) {
        AddPath("$type");
        return Fail(StatusCode::kInvalid, "$type must not be empty");
      }
      if (name == "blob" && !CheckBlob(base, n)) return false;
    } else if (depth == 0 && top_ == TopLevel::kRecord) {
      return Fail(StatusCode::kInvalid, "a record must have a $type");
    }
    if (!CheckDepth(depth)) return false;
    w_.Head(kMajorMap, n);
    // Indices, not pointers: nested objects push onto the same vector and may move it.
    for (size_t i = 0; i < n; ++i) {
      const Entry entry = entries_[base + i];
      w_.Text(entry.key);
      if (!Element(entry.value, depth + 1)) {
        AddPath(entry.key);
        return false;
      }
    }
    entries_.resize(base);
    return true;
  }

  // {"$link": "<cid>"} or {"$bytes": "<base64>"}: a CID link or a byte string, nothing else.
  bool TypedScalar(size_t base, size_t n, bool is_link) {
    const char* name = is_link ? "$link" : "$bytes";
    if (n != 1) {
      return Fail(StatusCode::kInvalid,
                  std::string("an object with ") + name + " must have no other fields");
    }
    const dom::element v = entries_[base].value;
    if (v.type() != dom::element_type::STRING) {
      return Fail(StatusCode::kInvalid,
                  std::string(name) + " must be a string, not " + JsonTypeName(v));
    }
    const std::string_view text = v.get_string().value_unsafe();
    if (is_link) {
      if (text.data() == blob_ref_text_) {
        w_.Link(blob_ref_);
      } else {
        auto cid = Cid::Parse(text);
        if (!cid.ok()) return Fail(cid.status().code(), "$link: " + cid.status().message());
        w_.Link(*cid);
      }
    } else {
      auto decoded = Base64Decode(text, Base64Alphabet::kStandard);
      if (!decoded.ok()) return Fail(StatusCode::kInvalid, "$bytes: " + decoded.status().message());
      w_.Head(kMajorBytes, decoded->size());
      w_.Raw(decoded->data(), decoded->size());
    }
    entries_.resize(base);
    return true;
  }

  // {"$type": "blob", "ref": {"$link": <raw CID>}, "mimeType": <non-empty string>,
  //  "size": <integer >= 0>}, and no other field.
  bool CheckBlob(size_t base, size_t n) {
    bool has_ref = false;
    bool has_mime = false;
    bool has_size = false;
    for (size_t i = 0; i < n; ++i) {
      const Entry entry = entries_[base + i];
      const std::string_view key = entry.key;
      const dom::element v = entry.value;
      if (key == "$type") continue;
      if (key == "ref") {
        has_ref = true;
        if (!CheckBlobRef(v)) {
          AddPath(key);
          return false;
        }
      } else if (key == "mimeType") {
        has_mime = true;
        if (v.type() != dom::element_type::STRING || v.get_string().value_unsafe().empty()) {
          AddPath(key);
          return Fail(StatusCode::kInvalid, "blob mimeType must be a non-empty string");
        }
      } else if (key == "size") {
        has_size = true;
        const dom::element_type t = v.type();
        if (t != dom::element_type::INT64 && t != dom::element_type::UINT64 &&
            t != dom::element_type::DOUBLE) {
          AddPath(key);
          return Fail(StatusCode::kInvalid,
                      std::string("blob size must be an integer, not ") + JsonTypeName(v));
        }
        int64_t size = 0;
        if (!Number(v, &size)) {
          AddPath(key);
          return false;
        }
        if (size < 0) {
          AddPath(key);
          return Fail(StatusCode::kInvalid, "blob size must not be negative");
        }
      } else {
        return Fail(StatusCode::kInvalid, "blob has an unexpected field " + QuoteForMessage(key));
      }
    }
    if (!has_ref) return Fail(StatusCode::kInvalid, "blob is missing \"ref\"");
    if (!has_mime) return Fail(StatusCode::kInvalid, "blob is missing \"mimeType\"");
    if (!has_size) return Fail(StatusCode::kInvalid, "blob is missing \"size\"");
    return true;
  }

  bool CheckBlobRef(dom::element v) {
    if (v.type() != dom::element_type::OBJECT) {
      return Fail(StatusCode::kInvalid,
                  std::string("blob ref must be a $link object, not ") + JsonTypeName(v));
    }
    const dom::object ref = v.get_object().value_unsafe();
    auto begin = ref.begin();
    if (ref.size() != 1 || (*begin).key != "$link") {
      return Fail(StatusCode::kInvalid, "blob ref must be an object with only $link");
    }
    const dom::element link = (*begin).value;
    if (link.type() != dom::element_type::STRING) {
      return Fail(StatusCode::kInvalid,
                  std::string("$link must be a string, not ") + JsonTypeName(link));
    }
    const std::string_view text = link.get_string().value_unsafe();
    auto cid = Cid::Parse(text);
    if (!cid.ok()) return Fail(cid.status().code(), "$link: " + cid.status().message());
    if (cid->codec() != Cid::Codec::kRaw) {
      return Fail(StatusCode::kInvalid, "blob ref must be a CID with the raw codec (0x55)");
    }
    // The ref is encoded right after this check: remember it rather than parse it twice.
    blob_ref_text_ = text.data();
    blob_ref_ = *cid;
    return true;
  }

  std::vector<Entry>& entries_;
  CborWriter& w_;
  const TopLevel top_;
  bool needs_exact_ = false;
  // The last blob ref checked, identified by where simdjson keeps its text.
  const char* blob_ref_text_ = nullptr;
  Cid blob_ref_;
  Status error_;
  std::vector<std::string> path_;
};

// One parse and encode. On the first pass, sets *needs_exact when a number must be judged from
// its digits; on the exact pass every number is already a plain integer.
Status EncodeOnce(ThreadState& state, std::string_view json, Bytes* out, TopLevel top,
                  bool exact_pass, bool* needs_exact, ParsedRecordVisitor* visitor) {
  const size_t need = json.size() + simdjson::SIMDJSON_PADDING;
  if (state.padded_capacity < need) {
    const size_t capacity = std::max(need, state.padded_capacity * 2);
    // Zeroed once, so the padding simdjson may read is never uninitialised memory.
    state.padded = std::make_unique<char[]>(capacity);
    state.padded_capacity = capacity;
  }
  std::memcpy(state.padded.get(), json.data(), json.size());
  auto parsed = state.parser.parse(state.padded.get(), json.size(), false);
  if (parsed.error() != simdjson::SUCCESS) {
    const simdjson::error_code code = parsed.error();
    if (!exact_pass && (code == simdjson::NUMBER_ERROR || code == simdjson::NUMBER_OUT_OF_RANGE)) {
      *needs_exact = true;
    }
    if (code == simdjson::DEPTH_ERROR) {
      return Status::OutOfRange("invalid JSON: nesting exceeds the depth limit of " +
                                std::to_string(kJsonMaxDepth));
    }
    if (code == simdjson::CAPACITY) return Status::OutOfRange("JSON document is too large");
    return Status::Invalid(std::string("invalid JSON: ") + simdjson::error_message(code));
  }
  state.entries.clear();
  CborWriter writer(out, json.size() + 16);
  JsonEncoder encoder(&state.entries, &writer, top);
  if (!encoder.Encode(parsed.value_unsafe())) {
    writer.Abandon();
    *needs_exact = encoder.needs_exact();
    return encoder.TakeError();
  }
  writer.Finish();
  if (visitor != nullptr) visitor->Visit(parsed.value_unsafe());
  return Status::OK();
}

Status Encode(std::string_view json, Bytes* out, TopLevel top,
              ParsedRecordVisitor* visitor = nullptr) {
  ThreadState& state = State();
  bool needs_exact = false;
  Status st = EncodeOnce(state, json, out, top, /*exact_pass=*/false, &needs_exact, visitor);
  if (!needs_exact) return st;
  // A number simdjson could not hold exactly: decide from its digits, then encode the copy in
  // which every number is a plain integer.
  ATFILL_RETURN_IF_ERROR(RewriteNumbers(json, &state.exact));
  needs_exact = false;
  st = EncodeOnce(state, state.exact, out, top, /*exact_pass=*/true, &needs_exact, visitor);
  if (needs_exact) return Status::Internal("a number stayed inexact after exact rewriting");
  return st;
}

Result<Value> ToValue(std::string_view json, TopLevel top) {
  Bytes& cbor = State().scratch;
  cbor.clear();
  ATFILL_RETURN_IF_ERROR(Encode(json, &cbor, top));
  CborLimits limits;
  limits.max_bytes = std::numeric_limits<size_t>::max();
  limits.max_depth = kJsonMaxDepth;
  limits.max_items = std::numeric_limits<size_t>::max();
  return DecodeCbor(cbor, limits);
}

Result<Cid> CidOf(std::string_view json, TopLevel top, ParsedRecordVisitor* visitor = nullptr) {
  Bytes& cbor = State().scratch;
  cbor.clear();
  ATFILL_RETURN_IF_ERROR(Encode(json, &cbor, top, visitor));
  return Cid::Compute(Cid::Codec::kDagCbor, cbor);
}

void AppendString(std::string_view s, std::string* out) { AppendJsonString(s, out); }

void AppendJson(const Value& value, std::string* out) {
  switch (value.kind()) {
    case Value::Kind::kNull:
      out->append("null");
      break;
    case Value::Kind::kBool:
      out->append(value.as_bool() ? "true" : "false");
      break;
    case Value::Kind::kInt: {
      char buf[24];
      const auto result = std::to_chars(buf, buf + sizeof(buf), value.as_int());
      out->append(buf, result.ptr);
      break;
    }
    case Value::Kind::kString:
      AppendString(value.as_string(), out);
      break;
    case Value::Kind::kBytes:
      out->append("{\"$bytes\":\"");
      out->append(Base64Encode(value.as_bytes(), Base64Alphabet::kStandard, /*pad=*/false));
      out->append("\"}");
      break;
    case Value::Kind::kLink:
      out->append("{\"$link\":\"");
      out->append(value.as_link().ToString());
      out->append("\"}");
      break;
    case Value::Kind::kArray: {
      out->push_back('[');
      bool first = true;
      for (const Value& item : value.as_array()) {
        if (!first) out->push_back(',');
        first = false;
        AppendJson(item, out);
      }
      out->push_back(']');
      break;
    }
    case Value::Kind::kMap: {
      out->push_back('{');
      bool first = true;
      for (const auto& [key, item] : value.as_map()) {
        if (!first) out->push_back(',');
        first = false;
        AppendString(key, out);
        out->push_back(':');
        AppendJson(item, out);
      }
      out->push_back('}');
      break;
    }
  }
}

}  // namespace

Result<Value> JsonToValue(std::string_view json) { return ToValue(json, TopLevel::kAny); }

Result<Value> JsonObjectToValue(std::string_view json) { return ToValue(json, TopLevel::kObject); }

std::string ValueToJson(const Value& value) {
  std::string out;
  AppendJson(value, &out);
  return out;
}

void ValueToJson(const Value& value, std::string* out) { AppendJson(value, out); }

Status JsonToCbor(std::string_view json, Bytes* out) { return Encode(json, out, TopLevel::kAny); }

Result<Cid> CidOfJson(std::string_view json) { return CidOf(json, TopLevel::kAny); }

Result<Cid> CidOfRecord(std::string_view json) { return CidOf(json, TopLevel::kRecord); }

Result<Cid> CidOfRecord(std::string_view json, ParsedRecordVisitor* visitor) {
  return CidOf(json, TopLevel::kRecord, visitor);
}

}  // namespace atfill::atproto
