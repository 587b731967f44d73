// Records against compiled lexicons (lexicon_internal.hpp). The walk allocates nothing while a
// record is valid: a failure records its reason and, unwinding, the path segments to it.
#include <simdjson.h>
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "atproto/cid.hpp"
#include "atproto/json_check.hpp"
#include "atproto/lexicon.hpp"
#include "atproto/lexicon_internal.hpp"
#include "atproto/tid.hpp"
#include "base/strings.hpp"

namespace atfill::atproto {
namespace {

namespace dom = simdjson::dom;
using lexicon_internal::Node;
using lexicon_internal::Property;
using lexicon_internal::RecordKey;
using lexicon_internal::Type;

// JsonTypeName, with the data model's own objects told apart: bytes, a link, a blob.
std::string_view Got(dom::element e) {
  if (e.type() == dom::element_type::OBJECT) {
    dom::object o = e.get_object().value_unsafe();
    if (o.size() == 1) {
      const std::string_view key = (*o.begin()).key;
      if (key == "$bytes") return "bytes";
      if (key == "$link") return "a cid-link";
    }
    std::string_view type;
    if (o["$type"].get_string().get(type) == simdjson::SUCCESS && type == "blob") return "a blob";
    return "an object";
  }
  // An integer is the data model's; another number is none of its values.
  if (e.type() == dom::element_type::INT64 || e.type() == dom::element_type::UINT64) {
    return "an integer";
  }
  return JsonTypeName(e);
}

std::string Expected(std::string_view what, dom::element got) {
  return "expected " + std::string(what) + ", got " + std::string(Got(got));
}

// The data model's integers: JSON numbers with a whole value in the int64 range ("1e2" and
// "3.0" are integers, as atproto/json.hpp reads them).
bool AsInteger(dom::element e, int64_t* out) {
  switch (e.type()) {
    case dom::element_type::INT64:
      *out = e.get_int64().value_unsafe();
      return true;
    case dom::element_type::DOUBLE: {
      const double d = e.get_double().value_unsafe();
      if (std::trunc(d) != d || d < -9.2233720368547758e18 || d >= 9.2233720368547758e18) {
        return false;
      }
      *out = static_cast<int64_t>(d);
      return true;
    }
    default:
      return false;
  }
}

// The decoded length of base64 text (standard or URL alphabet, padding optional); -1 when it is
// not base64.
int64_t Base64Length(std::string_view s) {
  size_t n = s.size();
  while (n > 0 && s[n - 1] == '=') --n;
  if (s.size() - n > 2) return -1;
  for (size_t i = 0; i < n; ++i) {
    const char c = s[i];
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '+' || c == '/' || c == '-' || c == '_';
    if (!ok) return -1;
  }
  if (n % 4 == 1) return -1;
  return static_cast<int64_t>(n / 4 * 3 + (n % 4 == 0 ? 0 : n % 4 - 1));
}

bool MimeAccepted(std::string_view mime, const std::vector<std::string>& accept) {
  if (accept.empty()) return true;
  for (const std::string& pattern : accept) {
    if (pattern == "*/*" || pattern == mime) return true;
    if (pattern.size() >= 2 && pattern.ends_with("/*") &&
        mime.starts_with(std::string_view(pattern).substr(0, pattern.size() - 1))) {
      return true;
    }
  }
  return false;
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) {
    if (!out.empty()) out += ", ";
    out += s;
  }
  return out;
}

// A union member's $type: "nsid#main" names the same definition as "nsid".
std::string_view MemberName(std::string_view type) {
  if (type.ends_with("#main")) type.remove_suffix(5);
  return type;
}

class Validator {
 public:
  struct Segment {
    std::string_view key;
    size_t index = 0;
    bool is_index = false;
  };

  bool Value(const Node& n, dom::element v) {
    switch (n.type) {
      case Type::kBoolean:
        return Boolean(n, v);
      case Type::kInteger:
        return Integer(n, v);
      case Type::kString:
        return String(n, v);
      case Type::kBytes:
        return BytesValue(n, v);
      case Type::kCidLink:
        return Link(v);
      case Type::kBlob:
        return Blob(n, v);
      case Type::kUnknown:
        return Unknown(v);
      case Type::kArray:
        return Array(n, v);
      case Type::kObject:
      case Type::kParams:
        return Object(n, v);
      case Type::kRef:
        if (n.target == nullptr) return Fail("ref " + n.ref + " is not in the catalog");
        return Value(*n.target, v);
      case Type::kUnion:
        return Union(n, v);
      case Type::kToken: {
        std::string_view s;
        if (v.get_string().get(s) != simdjson::SUCCESS) return Fail(Expected("a token", v));
        if (s != n.full_name) {
          return Fail("expected the token " + n.full_name + ", got " + QuoteForMessage(s));
        }
        return true;
      }
      case Type::kRecord:
        return Object(*n.record, v);
      case Type::kQuery:
      case Type::kProcedure:
      case Type::kSubscription:
      case Type::kPermissionSet:
        return Fail("a " + std::string(lexicon_internal::TypeName(n.type)) +
                    " definition does not describe data");
    }
    return Fail("unhandled schema type");
  }

  bool Object(const Node& n, dom::element v) {
    dom::object o;
    if (v.get_object().get(o) != simdjson::SUCCESS) return Fail(Expected("an object", v));
    if (o.size() == 1) {  // {"$bytes": ...} and {"$link": ...} are bytes and links, not objects
      const std::string_view only = (*o.begin()).key;
      if (only == "$bytes" || only == "$link") return Fail(Expected("an object", v));
    }
    const std::vector<Property>& props = n.properties;
    // Which properties are present; objects with more than 64 (none in the atproto lexicons)
    // count their required fields in a vector.
    uint64_t seen = 0;
    std::vector<bool> seen_many;
    if (props.size() > 64) seen_many.resize(props.size());
    for (auto field : o) {
      const std::string_view key = field.key;
      const size_t i = Find(n, key);
      if (i == props.size()) continue;  // a field the schema does not name
      if (props.size() > 64) {
        seen_many[i] = true;
      } else {
        seen |= uint64_t{1} << i;
      }
      const Property& p = props[i];
      if (field.value.is_null()) {
        if (p.nullable) continue;
        return Push(key, Fail("must not be null"));
      }
      if (!Value(*p.node, field.value)) return Push(key);
    }
    if (n.required_count > 0) {
      for (size_t i = 0; i < props.size(); ++i) {
        if (!props[i].required) continue;
        const bool present = props.size() > 64 ? seen_many[i] : ((seen >> i) & 1) != 0;
        if (!present) return Push(props[i].name, Fail("required field is missing"));
      }
    }
    return true;
  }

  bool Fail(std::string reason) {
    reason_ = std::move(reason);
    return false;
  }

  // The index of `key`'s property in n.properties; their count when the schema does not name it.
  static size_t Find(const Node& n, std::string_view key) {
    const std::vector<Property>& props = n.properties;
    const auto equal = [&](size_t i) {
      const std::string& name = props[i].name;
      return name.size() == key.size() && std::memcmp(name.data(), key.data(), key.size()) == 0;
    };
    const uint8_t slot = n.property_slots[lexicon_internal::PropertySlot(key)];
    if (slot == 0) return props.size();
    if (slot != Node::kSlotShared) return equal(slot - 1u) ? slot - 1u : props.size();
    for (size_t i = 0; i < props.size(); ++i) {
      if (equal(i)) return i;
    }
    return props.size();
  }

  std::string Path() const {
    std::string out;
    for (auto it = path_.rbegin(); it != path_.rend(); ++it) {
      if (it->is_index) {
        out += '[';
        out += std::to_string(it->index);
        out += ']';
      } else {
        if (!out.empty()) out += '.';
        out += it->key;
      }
    }
    return out;
  }

  std::string TakeReason() { return std::move(reason_); }

 private:
  bool Push(std::string_view key, bool result = false) {
    path_.push_back({key, 0, false});
    return result;
  }
  bool PushIndex(size_t index) {
    path_.push_back({{}, index, true});
    return false;
  }

  bool Boolean(const Node& n, dom::element v) {
    bool b = false;
    if (v.get_bool().get(b) != simdjson::SUCCESS) return Fail(Expected("a boolean", v));
    if (n.has_const && b != n.const_bool) {
      return Fail(std::string("must be ") + (n.const_bool ? "true" : "false"));
    }
    return true;
  }

  bool Integer(const Node& n, dom::element v) {
    int64_t i = 0;
    if (!AsInteger(v, &i)) {
      if (v.is_number()) return Fail("expected an integer, got a number that is not one");
      return Fail(Expected("an integer", v));
    }
    if (n.has_const && i != n.const_int) {
      return Fail("must be " + std::to_string(n.const_int) + ", not " + std::to_string(i));
    }
    if (n.has_enum && std::find(n.enum_ints.begin(), n.enum_ints.end(), i) == n.enum_ints.end()) {
      return Fail(std::to_string(i) + " is not one of the allowed values");
    }
    if (n.has_minimum && i < n.minimum) {
      return Fail(std::to_string(i) + " is below the minimum " + std::to_string(n.minimum));
    }
    if (n.has_maximum && i > n.maximum) {
      return Fail(std::to_string(i) + " is above the maximum " + std::to_string(n.maximum));
    }
    return true;
  }

  bool String(const Node& n, dom::element v) {
    std::string_view s;
    if (v.get_string().get(s) != simdjson::SUCCESS) return Fail(Expected("a string", v));
    const auto bytes = static_cast<int64_t>(s.size());
    if (n.max_length >= 0 && bytes > n.max_length) {
      return Fail("string is longer than " + std::to_string(n.max_length) + " bytes (" +
                  std::to_string(bytes) + ")");
    }
    if (n.min_length >= 0 && bytes < n.min_length) {
      return Fail("string is shorter than " + std::to_string(n.min_length) + " bytes (" +
                  std::to_string(bytes) + ")");
    }
    // A string has at most as many graphemes as bytes: most need no count.
    if ((n.max_graphemes >= 0 && bytes > n.max_graphemes) || n.min_graphemes > 0) {
      const auto graphemes = static_cast<int64_t>(CountGraphemes(s));
      if (n.max_graphemes >= 0 && graphemes > n.max_graphemes) {
        return Fail("string is longer than " + std::to_string(n.max_graphemes) + " graphemes (" +
                    std::to_string(graphemes) + ")");
      }
      if (graphemes < n.min_graphemes) {
        return Fail("string is shorter than " + std::to_string(n.min_graphemes) + " graphemes (" +
                    std::to_string(graphemes) + ")");
      }
    }
    if (n.has_const && s != n.const_string) {
      return Fail("must be " + QuoteForMessage(n.const_string) + ", not " + QuoteForMessage(s));
    }
    if (n.has_enum &&
        std::find(n.enum_strings.begin(), n.enum_strings.end(), s) == n.enum_strings.end()) {
      return Fail(QuoteForMessage(s) + " is not one of the allowed values");
    }
    if (n.has_format) {
      if (Status st = ValidateSyntax(n.format, s); !st.ok()) {
        return Fail("not a valid " + std::string(SyntaxKindName(n.format)) + ": " + st.message());
      }
    }
    return true;
  }

  // {"$bytes": base64} or {"$link": cid}: the only field's string, or false.
  static bool Special(dom::element v, std::string_view key, std::string_view* text) {
    dom::object o;
    if (v.get_object().get(o) != simdjson::SUCCESS || o.size() != 1) return false;
    const auto field = *o.begin();
    return field.key == key && field.value.get_string().get(*text) == simdjson::SUCCESS;
  }

  bool BytesValue(const Node& n, dom::element v) {
    std::string_view text;
    if (!Special(v, "$bytes", &text)) return Fail(Expected("bytes ({\"$bytes\": base64})", v));
    const int64_t length = Base64Length(text);
    if (length < 0) return Fail("$bytes is not base64");
    if (n.max_length >= 0 && length > n.max_length) {
      return Fail("bytes are longer than " + std::to_string(n.max_length) + " (" +
                  std::to_string(length) + ")");
    }
    if (n.min_length >= 0 && length < n.min_length) {
      return Fail("bytes are shorter than " + std::to_string(n.min_length) + " (" +
                  std::to_string(length) + ")");
    }
    return true;
  }

  bool Link(dom::element v) {
    std::string_view text;
    if (!Special(v, "$link", &text)) return Fail(Expected("a cid-link ({\"$link\": cid})", v));
    if (auto cid = Cid::Parse(text); !cid.ok()) return Fail("$link: " + cid.status().message());
    return true;
  }

  bool Blob(const Node& n, dom::element v) {
    dom::object o;
    if (v.get_object().get(o) != simdjson::SUCCESS) return Fail(Expected("a blob", v));
    std::string_view mime;
    dom::element type;
    if (o["$type"].get(type) == simdjson::SUCCESS) {
      std::string_view t;
      if (type.get_string().get(t) != simdjson::SUCCESS || t != "blob") {
        return Fail(Expected("a blob", v));
      }
      dom::element ref;
      int64_t size = -1;
      if (o["ref"].get(ref) != simdjson::SUCCESS) return Fail("blob has no ref");
      if (!Link(ref)) return Push("ref");
      if (o["mimeType"].get_string().get(mime) != simdjson::SUCCESS || mime.empty()) {
        return Fail("blob mimeType must be a non-empty string");
      }
      dom::element size_value;
      if (o["size"].get(size_value) != simdjson::SUCCESS || !AsInteger(size_value, &size) ||
          size < 0) {
        return Fail("blob size must be a non-negative integer");
      }
      if (n.max_size >= 0 && size > n.max_size) {
        return Fail("blob is larger than " + std::to_string(n.max_size) + " bytes (" +
                    std::to_string(size) + ")");
      }
    } else {
      // The legacy form early records carry: {"cid": "...", "mimeType": "..."}, no size.
      std::string_view cid;
      if (o["cid"].get_string().get(cid) != simdjson::SUCCESS ||
          o["mimeType"].get_string().get(mime) != simdjson::SUCCESS) {
        return Fail(Expected("a blob", v));
      }
      if (auto parsed = Cid::Parse(cid); !parsed.ok()) {
        return Fail("legacy blob cid: " + parsed.status().message());
      }
    }
    if (!MimeAccepted(mime, n.accept)) {
      return Fail("blob type " + QuoteForMessage(mime) + " is not accepted (" + Join(n.accept) +
                  ")");
    }
    return true;
  }

  bool Unknown(dom::element v) {
    const std::string_view got = Got(v);
    if (got != "an object") return Fail(Expected("an object", v));
    return true;
  }

  bool Array(const Node& n, dom::element v) {
    dom::array a;
    if (v.get_array().get(a) != simdjson::SUCCESS) return Fail(Expected("an array", v));
    const auto size = static_cast<int64_t>(a.size());
    if (n.max_length >= 0 && size > n.max_length) {
      return Fail("array has more than " + std::to_string(n.max_length) + " items (" +
                  std::to_string(size) + ")");
    }
    if (n.min_length >= 0 && size < n.min_length) {
      return Fail("array has fewer than " + std::to_string(n.min_length) + " items (" +
                  std::to_string(size) + ")");
    }
    size_t i = 0;
    for (dom::element item : a) {
      if (!Value(*n.items, item)) return PushIndex(i);
      ++i;
    }
    return true;
  }

  bool Union(const Node& n, dom::element v) {
    dom::object o;
    if (v.get_object().get(o) != simdjson::SUCCESS) {
      return Fail(Expected("an object with a $type (a union)", v));
    }
    std::string_view type;
    if (o["$type"].get_string().get(type) != simdjson::SUCCESS) {
      if (Got(v) != "an object") return Fail(Expected("an object with a $type (a union)", v));
      return Fail("a union member needs a $type");
    }
    if (type == "blob") return Fail(Expected("an object with a $type (a union)", v));
    type = MemberName(type);
    for (size_t i = 0; i < n.refs.size(); ++i) {
      if (n.refs[i] != type) continue;
      if (n.targets[i] == nullptr) return Fail("ref " + n.refs[i] + " is not in the catalog");
      return Value(*n.targets[i], v);
    }
    if (n.closed) {
      return Fail(QuoteForMessage(type) + " is not one of the union's types (" + Join(n.refs) +
                  ")");
    }
    return true;  // an open union: types it does not list pass
  }

  std::vector<Segment> path_;
  std::string reason_;
};

Status CheckRecordKey(const Node& record, std::string_view rkey) {
  switch (record.key) {
    case RecordKey::kAny:
    case RecordKey::kRecordKey:
      return ValidateRecordKey(rkey);
    case RecordKey::kTid:
      return ValidateTid(rkey);
    case RecordKey::kNsid:
      return ValidateNsid(rkey);
    case RecordKey::kLiteral:
      if (rkey == record.key_literal) return Status::OK();
      return Status::Invalid("must be " + QuoteForMessage(record.key_literal));
  }
  return Status::OK();
}

}  // namespace

size_t CountGraphemes(std::string_view text) {
  // ASCII: one grapheme a byte, except that CR LF is one.
  size_t i = 0;
  size_t crlf = 0;
  for (; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) break;
    if (c == '\n' && i > 0 && text[i - 1] == '\r') ++crlf;
  }
  if (i == text.size()) return text.size() - crlf;
  size_t count = 0;
  utf8proc_int32_t state = 0;
  utf8proc_int32_t previous = -1;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  auto left = static_cast<utf8proc_ssize_t>(text.size());
  while (left > 0) {
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0) {  // not UTF-8: a byte is a grapheme
      n = 1;
      cp = 0xFFFD;
      state = 0;
      previous = -1;
    }
    if (previous < 0 || utf8proc_grapheme_break_stateful(previous, cp, &state)) ++count;
    previous = cp;
    p += n;
    left -= n;
  }
  return count;
}

std::string LexiconVerdict::Describe() const {
  if (path.empty()) return reason;
  return path + ": " + reason;
}

LexiconCatalog::LexiconCatalog() : store_(std::make_unique<lexicon_internal::Store>()) {}
LexiconCatalog::~LexiconCatalog() = default;
LexiconCatalog::LexiconCatalog(LexiconCatalog&&) noexcept = default;
LexiconCatalog& LexiconCatalog::operator=(LexiconCatalog&&) noexcept = default;

LexiconVerdict LexiconCatalog::Validate(std::string_view collection, std::string_view rkey,
                                        const dom::element& record) const {
  LexiconVerdict verdict;
  auto it = store_->records.find(collection);
  if (it == store_->records.end()) {
    verdict.outcome = LexiconVerdict::Outcome::kUnknown;
    return verdict;
  }
  const Node& def = *it->second;
  auto invalid = [&](std::string path, std::string reason) {
    verdict.outcome = LexiconVerdict::Outcome::kInvalid;
    verdict.path = std::move(path);
    verdict.reason = std::move(reason);
    return verdict;
  };
  if (!rkey.empty()) {
    if (Status s = CheckRecordKey(def, rkey); !s.ok()) {
      return invalid({}, "record key " + QuoteForMessage(rkey) + ": " + s.message());
    }
  }
  dom::object o;
  if (record.get_object().get(o) != simdjson::SUCCESS) {
    return invalid({}, Expected("a record object", record));
  }
  std::string_view type;
  if (o["$type"].get_string().get(type) != simdjson::SUCCESS) {
    return invalid("$type", "a record needs a $type");
  }
  if (MemberName(type) != collection) {
    return invalid("$type",
                   QuoteForMessage(type) + " is not the collection " + std::string(collection));
  }
  Validator v;
  if (!v.Object(*def.record, record)) return invalid(v.Path(), v.TakeReason());
  return verdict;
}

LexiconVerdict LexiconCatalog::ValidateJson(std::string_view collection, std::string_view rkey,
                                            std::string_view json) const {
  thread_local dom::parser parser;
  dom::element doc;
  if (auto err = parser.parse(json.data(), json.size()).get(doc); err != simdjson::SUCCESS) {
    LexiconVerdict verdict;
    verdict.outcome = LexiconVerdict::Outcome::kInvalid;
    verdict.reason = std::string("not JSON: ") + simdjson::error_message(err);
    return verdict;
  }
  return Validate(collection, rkey, doc);
}

bool LexiconCatalog::HasRecord(std::string_view nsid) const {
  return store_->records.find(nsid) != store_->records.end();
}

std::vector<std::string> LexiconCatalog::RecordTypes() const {
  std::vector<std::string> out;
  for (const auto& [nsid, node] : store_->records) out.push_back(nsid);
  std::sort(out.begin(), out.end());
  return out;
}

size_t LexiconCatalog::size() const { return store_->documents; }

const std::vector<std::string>& LexiconCatalog::unresolved() const { return store_->unresolved; }

}  // namespace atfill::atproto
