// The atproto data model: null, boolean, 64-bit signed integer, string, bytes, CID link,
// array and map with string keys. DAG-CBOR and atproto JSON are its two encodings.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "atproto/cid.hpp"
#include "base/bytes.hpp"

namespace atfill::atproto {

class Value {
 public:
  enum class Kind : uint8_t { kNull, kBool, kInt, kString, kBytes, kLink, kArray, kMap };
  using Array = std::vector<Value>;
  // Entries in DAG-CBOR key order (shorter key first, then bytewise) once Canonicalize() ran or
  // when produced by the decoders; builders may append in any order and then canonicalize.
  using Map = std::vector<std::pair<std::string, Value>>;

  Value() = default;  // null
  static Value Null() { return Value(); }
  static Value Bool(bool b) { return Value(Storage(b)); }
  static Value Int(int64_t i) { return Value(Storage(i)); }
  static Value String(std::string s) { return Value(Storage(std::move(s))); }
  static Value BytesValue(Bytes b) { return Value(Storage(std::move(b))); }
  static Value Link(Cid c) { return Value(Storage(c)); }
  static Value MakeArray(Array a = {}) { return Value(Storage(std::move(a))); }
  static Value MakeMap(Map m = {}) { return Value(Storage(std::move(m))); }

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_null() const { return kind() == Kind::kNull; }
  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const Bytes& as_bytes() const { return std::get<Bytes>(v_); }
  Bytes& as_bytes() { return std::get<Bytes>(v_); }
  const Cid& as_link() const { return std::get<Cid>(v_); }
  const Array& as_array() const { return std::get<Array>(v_); }
  Array& as_array() { return std::get<Array>(v_); }
  const Map& as_map() const { return std::get<Map>(v_); }
  Map& as_map() { return std::get<Map>(v_); }

  // Map lookup (linear; maps are small); nullptr when absent or not a map.
  const Value* Find(std::string_view key) const;
  // Sorts every map, recursively, into DAG-CBOR key order.
  void Canonicalize();

  friend bool operator==(const Value&, const Value&) = default;

 private:
  using Storage = std::variant<std::monostate, bool, int64_t, std::string, Bytes, Cid, Array, Map>;
  explicit Value(Storage v) : v_(std::move(v)) {}
  Storage v_;
};

// DAG-CBOR map key order: shorter first, then bytewise.
inline bool CborKeyLess(std::string_view a, std::string_view b) {
  return a.size() != b.size() ? a.size() < b.size() : a < b;
}

}  // namespace atfill::atproto
