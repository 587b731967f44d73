// The compiled form of lexicon documents, shared by the schema compiler (lexicon_schema.cpp) and
// the record validator (lexicon_validate.cpp). Not part of the library's interface.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "atproto/syntax.hpp"
#include "base/status.hpp"

namespace atfill::atproto::lexicon_internal {

enum class Type : uint8_t {
  // field types
  kBoolean,
  kInteger,
  kString,
  kBytes,
  kCidLink,
  kBlob,
  kUnknown,
  kArray,
  kObject,
  kRef,
  kUnion,
  // definitions only
  kToken,
  kRecord,
  kQuery,
  kProcedure,
  kSubscription,
  kPermissionSet,
  kParams,
};

std::string_view TypeName(Type type);

enum class RecordKey : uint8_t { kAny, kTid, kNsid, kLiteral, kRecordKey };

struct Node;

struct Property {
  std::string name;
  const Node* node = nullptr;
  bool required = false;
  bool nullable = false;
};

// One schema. Bounds are -1 when absent.
struct Node {
  Type type = Type::kUnknown;

  // string / bytes / array: lengths (bytes of UTF-8, bytes, items); string: graphemes
  int64_t min_length = -1;
  int64_t max_length = -1;
  int64_t min_graphemes = -1;
  int64_t max_graphemes = -1;
  bool has_format = false;
  SyntaxKind format = SyntaxKind::kDid;
  std::vector<std::string> enum_strings;
  bool has_enum = false;
  bool has_const = false;
  std::string const_string;
  bool const_bool = false;

  // integer
  bool has_minimum = false;
  bool has_maximum = false;
  int64_t minimum = 0;
  int64_t maximum = 0;
  std::vector<int64_t> enum_ints;
  int64_t const_int = 0;

  // array
  const Node* items = nullptr;

  // object (and params)
  std::vector<Property> properties;
  size_t required_count = 0;
  // A field name's property by PropertySlot(name): index + 1, 0 for none, kSlotShared where two
  // properties share the slot (those are found by a scan).
  static constexpr uint8_t kSlotShared = 255;
  std::array<uint8_t, 64> property_slots{};

  // ref: the target's full name ("nsid#name", main as plain "nsid"), resolved when built
  std::string ref;
  const Node* target = nullptr;

  // union: members by full name, resolved when built (nullptr: not in the catalog)
  std::vector<std::string> refs;
  std::vector<const Node*> targets;
  bool closed = false;

  // blob
  std::vector<std::string> accept;
  int64_t max_size = -1;

  // definitions: "nsid#name", or "nsid" for main
  std::string full_name;

  // record
  RecordKey key = RecordKey::kAny;
  std::string key_literal;
  const Node* record = nullptr;  // its object
};

inline size_t PropertySlot(std::string_view name) {
  if (name.empty()) return 0;
  return (name.size() * 31 + static_cast<unsigned char>(name.front()) * 7 +
          static_cast<unsigned char>(name.back())) &
         63;
}

// Maps by name that a string_view can look up.
struct NameHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using NameMap = std::unordered_map<std::string, const Node*, NameHash, std::equal_to<>>;

// Every compiled document of a catalog. Nodes live in a deque, so pointers to them stay valid.
struct Store {
  std::deque<Node> nodes;
  // Definitions by full name ("nsid#name"; main also as plain "nsid").
  NameMap defs;
  // Record definitions by NSID.
  NameMap records;
  // Nodes whose refs are resolved when the catalog is built.
  std::vector<Node*> ref_nodes;
  std::vector<std::string> unresolved;
  size_t documents = 0;
};

// Compiles one document into *store (refs unresolved). Invalid names the path and the reason.
Status CompileDocument(std::string_view json, Store* store, std::string* nsid);
// Resolves every ref of *store, listing the ones it cannot in store->unresolved.
void ResolveRefs(Store* store);

}  // namespace atfill::atproto::lexicon_internal
