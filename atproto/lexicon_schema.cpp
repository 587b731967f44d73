// Lexicon documents: checked against the Lexicon language and compiled into nodes
// (lexicon_internal.hpp), and the catalog's Builder.
#include <simdjson.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <system_error>

#include "atproto/json_check.hpp"
#include "atproto/lexicon.hpp"
#include "atproto/lexicon_internal.hpp"

namespace atfill::atproto {
namespace lexicon_internal {
namespace {

namespace dom = simdjson::dom;

struct TypeEntry {
  std::string_view name;
  Type type;
};
constexpr TypeEntry kTypes[] = {
    {"boolean", Type::kBoolean},
    {"integer", Type::kInteger},
    {"string", Type::kString},
    {"bytes", Type::kBytes},
    {"cid-link", Type::kCidLink},
    {"blob", Type::kBlob},
    {"unknown", Type::kUnknown},
    {"array", Type::kArray},
    {"object", Type::kObject},
    {"ref", Type::kRef},
    {"union", Type::kUnion},
    {"token", Type::kToken},
    {"record", Type::kRecord},
    {"query", Type::kQuery},
    {"procedure", Type::kProcedure},
    {"subscription", Type::kSubscription},
    {"permission-set", Type::kPermissionSet},
    {"params", Type::kParams},
};

// Which types a schema may have where it stands.
enum class Place : uint8_t {
  kDefinition,  // a top-level def other than main
  kMain,        // the main def
  kField,       // an object's property, an array's items
  kParamField,  // a params property
  kBody,        // the schema of an input, output or message
  kParameters,  // an endpoint's parameters
};

struct FormatEntry {
  std::string_view name;
  SyntaxKind kind;
};
constexpr FormatEntry kFormats[] = {
    {"at-identifier", SyntaxKind::kAtIdentifier},
    {"at-uri", SyntaxKind::kAtUri},
    {"cid", SyntaxKind::kCid},
    {"datetime", SyntaxKind::kDatetime},
    {"did", SyntaxKind::kDid},
    {"handle", SyntaxKind::kHandle},
    {"nsid", SyntaxKind::kNsid},
    {"tid", SyntaxKind::kTid},
    {"record-key", SyntaxKind::kRecordKey},
    {"uri", SyntaxKind::kUri},
    {"language", SyntaxKind::kLanguage},
};

bool Allowed(Type t, Place place) {
  switch (place) {
    case Place::kMain:
      if (t == Type::kRecord || t == Type::kQuery || t == Type::kProcedure ||
          t == Type::kSubscription || t == Type::kPermissionSet)
        return true;
      [[fallthrough]];
    case Place::kDefinition:
      // Primary types only as main; refs, unions and unknown only inside another schema.
      return t == Type::kObject || t == Type::kArray || t == Type::kToken || t == Type::kString ||
             t == Type::kInteger || t == Type::kBoolean || t == Type::kBytes ||
             t == Type::kCidLink || t == Type::kBlob;
    case Place::kField:
      return t <= Type::kUnion;
    case Place::kParamField:
      return t == Type::kBoolean || t == Type::kInteger || t == Type::kString ||
             t == Type::kUnknown || t == Type::kArray;
    case Place::kBody:
      return t == Type::kObject || t == Type::kRef || t == Type::kUnion;
    case Place::kParameters:
      return t == Type::kParams;
  }
  return false;
}

class Compiler {
 public:
  Compiler(Store* store, std::string nsid) : store_(store), nsid_(std::move(nsid)) {}

  Status Definition(std::string_view name, dom::element def) {
    path_ = "defs." + std::string(name);
    const Place place = name == "main" ? Place::kMain : Place::kDefinition;
    Node* node = nullptr;
    ATFILL_RETURN_IF_ERROR(Schema(def, place, &node));
    node->full_name = name == "main" ? nsid_ : nsid_ + "#" + std::string(name);
    store_->defs[nsid_ + "#" + std::string(name)] = node;
    if (name == "main") store_->defs[nsid_] = node;
    if (node->type == Type::kRecord) store_->records[nsid_] = node;
    return Status::OK();
  }

 private:
  Status Fail(std::string_view reason) const {
    return Status::Invalid(nsid_ + ": " + path_ + ": " + std::string(reason));
  }

  // Descends into `segment` for the life of the guard.
  class Descend {
   public:
    Descend(Compiler* c, std::string_view segment) : c_(c), size_(c->path_.size()) {
      c_->path_ += '.';
      c_->path_ += segment;
    }
    ~Descend() { c_->path_.resize(size_); }
    Descend(const Descend&) = delete;
    Descend& operator=(const Descend&) = delete;

   private:
    Compiler* c_;
    size_t size_;
  };

  Status ReadNonNegative(dom::object o, std::string_view key, int64_t* out) {
    dom::element v;
    if (o[key].get(v) != simdjson::SUCCESS) return Status::OK();
    int64_t i = 0;
    if (v.get_int64().get(i) != simdjson::SUCCESS || i < 0) {
      Descend d(this, key);
      return Fail("must be a non-negative integer");
    }
    *out = i;
    return Status::OK();
  }

  Status ReadInteger(dom::object o, std::string_view key, bool* has, int64_t* out) {
    dom::element v;
    if (o[key].get(v) != simdjson::SUCCESS) return Status::OK();
    if (v.get_int64().get(*out) != simdjson::SUCCESS) {
      Descend d(this, key);
      return Fail(std::string("must be an integer, not ") + std::string(JsonTypeName(v)));
    }
    *has = true;
    return Status::OK();
  }

  Status ReadString(dom::object o, std::string_view key, bool* has, std::string* out) {
    dom::element v;
    if (o[key].get(v) != simdjson::SUCCESS) return Status::OK();
    std::string_view s;
    if (v.get_string().get(s) != simdjson::SUCCESS) {
      Descend d(this, key);
      return Fail(std::string("must be a string, not ") + std::string(JsonTypeName(v)));
    }
    *out = std::string(s);
    if (has != nullptr) *has = true;
    return Status::OK();
  }

  Status ReadStrings(dom::object o, std::string_view key, bool* has,
                     std::vector<std::string>* out) {
    dom::element v;
    if (o[key].get(v) != simdjson::SUCCESS) return Status::OK();
    Descend d(this, key);
    dom::array a;
    if (v.get_array().get(a) != simdjson::SUCCESS) return Fail("must be an array of strings");
    for (dom::element item : a) {
      std::string_view s;
      if (item.get_string().get(s) != simdjson::SUCCESS) {
        return Fail("must be an array of strings");
      }
      out->emplace_back(s);
    }
    if (has != nullptr) *has = true;
    return Status::OK();
  }

  Status CheckBounds(std::string_view what, int64_t min, int64_t max) {
    if (min >= 0 && max >= 0 && min > max) {
      return Fail("min" + std::string(what) + " is above max" + std::string(what));
    }
    return Status::OK();
  }

  // A reference as written ("#name", "nsid", "nsid#name") into its full name: main as the plain
  // NSID.
  Status RefName(std::string_view written, std::string* out) {
    if (written.empty()) return Fail("a ref must not be empty");
    std::string_view nsid = written;
    std::string_view name;
    if (const size_t hash = written.find('#'); hash != std::string_view::npos) {
      nsid = written.substr(0, hash);
      name = written.substr(hash + 1);
      if (name.empty()) return Fail("ref '" + std::string(written) + "' has an empty name");
    }
    if (!nsid.empty()) {
      if (Status s = ValidateNsid(nsid); !s.ok()) {
        return Fail("ref '" + std::string(written) + "': " + s.message());
      }
    }
    std::string full(nsid.empty() ? std::string_view(nsid_) : nsid);
    if (!name.empty() && name != "main") {
      full += '#';
      full += name;
    }
    *out = std::move(full);
    return Status::OK();
  }

  Status Schema(dom::element e, Place place, Node** out) {
    dom::object o;
    if (e.get_object().get(o) != simdjson::SUCCESS) {
      return Fail(std::string("a schema must be an object, not ") + std::string(JsonTypeName(e)));
    }
    std::string_view type_name;
    dom::element type_value;
    if (o["type"].get(type_value) != simdjson::SUCCESS) return Fail("has no type");
    if (type_value.get_string().get(type_name) != simdjson::SUCCESS) {
      return Fail("type must be a string");
    }
    const TypeEntry* entry = std::find_if(std::begin(kTypes), std::end(kTypes),
                                          [&](const TypeEntry& t) { return t.name == type_name; });
    if (entry == std::end(kTypes)) {
      return Fail("unknown type '" + std::string(type_name) + "'");
    }
    if (!Allowed(entry->type, place)) {
      std::string where = place == Place::kDefinition ? "as a definition other than main"
                          : place == Place::kMain     ? "as a definition"
                          : place == Place::kBody     ? "as a body schema"
                                                      : "here";
      return Fail("type " + std::string(type_name) + " is not allowed " + where);
    }
    Node& node = store_->nodes.emplace_back();
    node.type = entry->type;
    *out = &node;
    switch (node.type) {
      case Type::kBoolean: {
        dom::element v;
        if (o["const"].get(v) == simdjson::SUCCESS) {
          if (v.get_bool().get(node.const_bool) != simdjson::SUCCESS) {
            return Fail("const must be a boolean");
          }
          node.has_const = true;
        }
        if (o["default"].get(v) == simdjson::SUCCESS && !v.is_bool()) {
          return Fail("default must be a boolean");
        }
        return Status::OK();
      }
      case Type::kInteger: {
        ATFILL_RETURN_IF_ERROR(ReadInteger(o, "minimum", &node.has_minimum, &node.minimum));
        ATFILL_RETURN_IF_ERROR(ReadInteger(o, "maximum", &node.has_maximum, &node.maximum));
        if (node.has_minimum && node.has_maximum && node.minimum > node.maximum) {
          return Fail("minimum is above maximum");
        }
        ATFILL_RETURN_IF_ERROR(ReadInteger(o, "const", &node.has_const, &node.const_int));
        bool has_default = false;
        int64_t ignored = 0;
        ATFILL_RETURN_IF_ERROR(ReadInteger(o, "default", &has_default, &ignored));
        dom::element v;
        if (o["enum"].get(v) == simdjson::SUCCESS) {
          Descend d(this, "enum");
          dom::array a;
          if (v.get_array().get(a) != simdjson::SUCCESS) return Fail("must be an array");
          for (dom::element item : a) {
            int64_t i = 0;
            if (item.get_int64().get(i) != simdjson::SUCCESS) {
              return Fail("must be an array of integers");
            }
            node.enum_ints.push_back(i);
          }
          node.has_enum = true;
        }
        return Status::OK();
      }
      case Type::kString: {
        ATFILL_RETURN_IF_ERROR(ReadNonNegative(o, "minLength", &node.min_length));
        ATFILL_RETURN_IF_ERROR(ReadNonNegative(o, "maxLength", &node.max_length));
        ATFILL_RETURN_IF_ERROR(ReadNonNegative(o, "minGraphemes", &node.min_graphemes));
        ATFILL_RETURN_IF_ERROR(ReadNonNegative(o, "maxGraphemes", &node.max_graphemes));
        ATFILL_RETURN_IF_ERROR(CheckBounds("Length", node.min_length, node.max_length));
        ATFILL_RETURN_IF_ERROR(CheckBounds("Graphemes", node.min_graphemes, node.max_graphemes));
        std::string format;
        bool has_format = false;
        ATFILL_RETURN_IF_ERROR(ReadString(o, "format", &has_format, &format));
        if (has_format) {
          const FormatEntry* f =
              std::find_if(std::begin(kFormats), std::end(kFormats),
                           [&](const FormatEntry& e) { return e.name == format; });
          if (f == std::end(kFormats)) {
            Descend d(this, "format");
            return Fail("unknown string format '" + format + "'");
          }
          node.has_format = true;
          node.format = f->kind;
        }
        ATFILL_RETURN_IF_ERROR(ReadStrings(o, "enum", &node.has_enum, &node.enum_strings));
        std::vector<std::string> known;
        ATFILL_RETURN_IF_ERROR(ReadStrings(o, "knownValues", nullptr, &known));
        ATFILL_RETURN_IF_ERROR(ReadString(o, "const", &node.has_const, &node.const_string));
        std::string ignored;
        ATFILL_RETURN_IF_ERROR(ReadString(o, "default", nullptr, &ignored));
        return Status::OK();
      }
      case Type::kBytes:
        ATFILL_RETURN_IF_ERROR(ReadNonNegative(o, "minLength", &node.min_length));
        ATFILL_RETURN_IF_ERROR(ReadNonNegative(o, "maxLength", &node.max_length));
        return CheckBounds("Length", node.min_length, node.max_length);
      case Type::kCidLink:
      case Type::kUnknown:
      case Type::kToken:
        return Status::OK();
      case Type::kBlob:
        ATFILL_RETURN_IF_ERROR(ReadStrings(o, "accept", nullptr, &node.accept));
        return ReadNonNegative(o, "maxSize", &node.max_size);
      case Type::kArray: {
        ATFILL_RETURN_IF_ERROR(ReadNonNegative(o, "minLength", &node.min_length));
        ATFILL_RETURN_IF_ERROR(ReadNonNegative(o, "maxLength", &node.max_length));
        ATFILL_RETURN_IF_ERROR(CheckBounds("Length", node.min_length, node.max_length));
        dom::element items;
        if (o["items"].get(items) != simdjson::SUCCESS) return Fail("an array needs items");
        Descend d(this, "items");
        Node* item = nullptr;
        ATFILL_RETURN_IF_ERROR(
            Schema(items, place == Place::kParamField ? Place::kParamField : Place::kField, &item));
        node.items = item;
        return Status::OK();
      }
      case Type::kObject:
        return Object(o, &node, Place::kField);
      case Type::kParams:
        return Object(o, &node, Place::kParamField);
      case Type::kRef: {
        std::string written;
        bool has = false;
        ATFILL_RETURN_IF_ERROR(ReadString(o, "ref", &has, &written));
        if (!has) return Fail("a ref needs ref");
        ATFILL_RETURN_IF_ERROR(RefName(written, &node.ref));
        store_->ref_nodes.push_back(&node);
        return Status::OK();
      }
      case Type::kUnion: {
        std::vector<std::string> written;
        bool has = false;
        ATFILL_RETURN_IF_ERROR(ReadStrings(o, "refs", &has, &written));
        if (!has) return Fail("a union needs refs");
        for (const std::string& w : written) {
          std::string full;
          ATFILL_RETURN_IF_ERROR(RefName(w, &full));
          node.refs.push_back(std::move(full));
        }
        dom::element closed;
        if (o["closed"].get(closed) == simdjson::SUCCESS &&
            closed.get_bool().get(node.closed) != simdjson::SUCCESS) {
          return Fail("closed must be a boolean");
        }
        store_->ref_nodes.push_back(&node);
        return Status::OK();
      }
      case Type::kRecord: {
        std::string key = "any";
        ATFILL_RETURN_IF_ERROR(ReadString(o, "key", nullptr, &key));
        if (key == "tid") {
          node.key = RecordKey::kTid;
        } else if (key == "nsid") {
          node.key = RecordKey::kNsid;
        } else if (key == "any") {
          node.key = RecordKey::kAny;
        } else if (key == "record-key") {
          node.key = RecordKey::kRecordKey;
        } else if (key.starts_with("literal:") && ValidateRecordKey(key.substr(8)).ok()) {
          node.key = RecordKey::kLiteral;
          node.key_literal = key.substr(8);
        } else {
          Descend d(this, "key");
          return Fail("unknown record key type '" + key + "'");
        }
        dom::element record;
        if (o["record"].get(record) != simdjson::SUCCESS) return Fail("a record needs record");
        Descend d(this, "record");
        dom::object ro;
        std::string_view rt;
        if (record.get_object().get(ro) != simdjson::SUCCESS ||
            ro["type"].get_string().get(rt) != simdjson::SUCCESS || rt != "object") {
          return Fail("must be a schema of type object");
        }
        Node& object = store_->nodes.emplace_back();
        object.type = Type::kObject;
        node.record = &object;
        return Object(ro, &object, Place::kField);
      }
      case Type::kQuery:
      case Type::kProcedure:
      case Type::kSubscription:
        return Endpoint(o, node.type);
      case Type::kPermissionSet:
        return Permissions(o);
    }
    return Status::OK();
  }

  Status Object(dom::object o, Node* node, Place field_place) {
    dom::element props;
    if (o["properties"].get(props) == simdjson::SUCCESS) {
      Descend d(this, "properties");
      dom::object po;
      if (props.get_object().get(po) != simdjson::SUCCESS) return Fail("must be an object");
      for (auto [key, value] : po) {
        Descend dk(this, key);
        Node* child = nullptr;
        ATFILL_RETURN_IF_ERROR(Schema(value, field_place, &child));
        node->properties.push_back({std::string(key), child, false, false});
      }
    }
    std::vector<std::string> required;
    std::vector<std::string> nullable;
    ATFILL_RETURN_IF_ERROR(ReadStrings(o, "required", nullptr, &required));
    ATFILL_RETURN_IF_ERROR(ReadStrings(o, "nullable", nullptr, &nullable));
    auto find = [&](const std::string& name) -> Property* {
      for (Property& p : node->properties) {
        if (p.name == name) return &p;
      }
      return nullptr;
    };
    for (const std::string& r : required) {
      Property* p = find(r);
      if (p == nullptr) return Fail("required field '" + r + "' is not among the properties");
      if (!p->required) ++node->required_count;
      p->required = true;
    }
    for (const std::string& n : nullable) {
      Property* p = find(n);
      if (p == nullptr) return Fail("nullable field '" + n + "' is not among the properties");
      p->nullable = true;
    }
    for (size_t i = 0; i < node->properties.size(); ++i) {
      uint8_t& slot = node->property_slots[PropertySlot(node->properties[i].name)];
      slot = (slot == 0 && i + 1 < Node::kSlotShared) ? static_cast<uint8_t>(i + 1)
                                                      : Node::kSlotShared;
    }
    return Status::OK();
  }

  // An input, output or message: an optional schema (object, ref or union).
  Status Body(dom::object o, std::string_view key, bool needs_encoding) {
    dom::element body;
    if (o[key].get(body) != simdjson::SUCCESS) return Status::OK();
    Descend d(this, key);
    dom::object bo;
    if (body.get_object().get(bo) != simdjson::SUCCESS) return Fail("must be an object");
    if (needs_encoding) {
      std::string encoding;
      bool has = false;
      ATFILL_RETURN_IF_ERROR(ReadString(bo, "encoding", &has, &encoding));
      if (!has) return Fail("needs an encoding");
    }
    dom::element schema;
    if (bo["schema"].get(schema) != simdjson::SUCCESS) return Status::OK();
    Descend ds(this, "schema");
    Node* ignored = nullptr;
    return Schema(schema, Place::kBody, &ignored);
  }

  Status Endpoint(dom::object o, Type type) {
    dom::element params;
    if (o["parameters"].get(params) == simdjson::SUCCESS) {
      Descend d(this, "parameters");
      dom::object po;
      std::string_view pt;
      if (params.get_object().get(po) != simdjson::SUCCESS ||
          po["type"].get_string().get(pt) != simdjson::SUCCESS || pt != "params") {
        return Fail("must be a schema of type params");
      }
      Node* ignored = nullptr;
      ATFILL_RETURN_IF_ERROR(Schema(params, Place::kParameters, &ignored));
    }
    if (type == Type::kSubscription) return Body(o, "message", /*needs_encoding=*/false);
    if (type == Type::kProcedure) ATFILL_RETURN_IF_ERROR(Body(o, "input", true));
    ATFILL_RETURN_IF_ERROR(Body(o, "output", true));
    dom::element errors;
    if (o["errors"].get(errors) == simdjson::SUCCESS) {
      Descend d(this, "errors");
      dom::array a;
      if (errors.get_array().get(a) != simdjson::SUCCESS) return Fail("must be an array");
      for (dom::element e : a) {
        std::string_view name;
        if (e["name"].get_string().get(name) != simdjson::SUCCESS || name.empty()) {
          return Fail("each error needs a name");
        }
      }
    }
    return Status::OK();
  }

  Status Permissions(dom::object o) {
    dom::element perms;
    if (o["permissions"].get(perms) != simdjson::SUCCESS) {
      return Fail("a permission-set needs permissions");
    }
    Descend d(this, "permissions");
    dom::array a;
    if (perms.get_array().get(a) != simdjson::SUCCESS) return Fail("must be an array");
    size_t i = 0;
    for (dom::element p : a) {
      Descend di(this, std::to_string(i++));
      std::string_view type;
      std::string_view resource;
      if (p["type"].get_string().get(type) != simdjson::SUCCESS || type != "permission") {
        return Fail("type must be \"permission\"");
      }
      if (p["resource"].get_string().get(resource) != simdjson::SUCCESS || resource.empty()) {
        return Fail("a permission needs a resource");
      }
    }
    return Status::OK();
  }

  Store* store_;
  std::string nsid_;
  std::string path_;
};

}  // namespace

std::string_view TypeName(Type type) {
  for (const TypeEntry& t : kTypes) {
    if (t.type == type) return t.name;
  }
  return "?";
}

Status CompileDocument(std::string_view json, Store* store, std::string* nsid_out) {
  thread_local dom::parser parser;
  dom::element doc;
  if (auto err = parser.parse(json.data(), json.size()).get(doc); err != simdjson::SUCCESS) {
    return Status::Invalid(std::string("not JSON: ") + simdjson::error_message(err));
  }
  dom::object o;
  if (doc.get_object().get(o) != simdjson::SUCCESS) {
    return Status::Invalid("a lexicon document must be a JSON object");
  }
  int64_t version = 0;
  if (o["lexicon"].get_int64().get(version) != simdjson::SUCCESS || version != 1) {
    return Status::Invalid("lexicon must be the integer 1");
  }
  std::string_view id;
  if (o["id"].get_string().get(id) != simdjson::SUCCESS) {
    return Status::Invalid("id must be a string (the lexicon's NSID)");
  }
  if (Status s = ValidateNsid(id); !s.ok()) {
    return Status::Invalid("id '" + std::string(id) + "' is not an NSID: " + s.message());
  }
  const std::string nsid(id);
  dom::object defs;
  if (o["defs"].get_object().get(defs) != simdjson::SUCCESS) {
    return Status::Invalid(nsid + ": defs must be an object");
  }
  Compiler compiler(store, nsid);
  for (auto [name, def] : defs) {
    if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '-';
        })) {
      return Status::Invalid(nsid + ": defs: '" + std::string(name) + "' is not a valid def name");
    }
    ATFILL_RETURN_IF_ERROR(compiler.Definition(name, def));
  }
  ++store->documents;
  if (nsid_out != nullptr) *nsid_out = nsid;
  return Status::OK();
}

void ResolveRefs(Store* store) {
  store->unresolved.clear();
  auto find = [&](const std::string& name) -> const Node* {
    auto it = store->defs.find(name);
    if (it != store->defs.end()) return it->second;
    store->unresolved.push_back(name);
    return nullptr;
  };
  for (Node* n : store->ref_nodes) {
    if (n->type == Type::kRef) {
      n->target = find(n->ref);
    } else {
      n->targets.clear();
      for (const std::string& r : n->refs) n->targets.push_back(find(r));
    }
  }
  std::sort(store->unresolved.begin(), store->unresolved.end());
  store->unresolved.erase(std::unique(store->unresolved.begin(), store->unresolved.end()),
                          store->unresolved.end());
}

}  // namespace lexicon_internal

// --- The catalog's builder ---

Status CheckLexiconDocument(std::string_view json, std::string* nsid) {
  lexicon_internal::Store scratch;
  return lexicon_internal::CompileDocument(json, &scratch, nsid);
}

Status LexiconCatalog::Builder::Add(std::string_view json, std::string_view origin,
                                    std::string* nsid_out) {
  std::string nsid;
  if (Status s = CheckLexiconDocument(json, &nsid); !s.ok()) {
    return origin.empty() ? s : s.WithContext(origin);
  }
  docs_.insert_or_assign(nsid, std::string(json));
  if (nsid_out != nullptr) *nsid_out = std::move(nsid);
  return Status::OK();
}

Status LexiconCatalog::Builder::AddPath(const std::filesystem::path& path) {
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  if (std::filesystem::is_directory(path, ec)) {
    for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_regular_file() && it->path().extension() == ".json") files.push_back(it->path());
    }
    if (ec) return Status::IoError(path.string() + ": " + ec.message());
    std::sort(files.begin(), files.end());
  } else if (std::filesystem::is_regular_file(path, ec)) {
    files.push_back(path);
  } else {
    return Status::NotFound(path.string() + ": no such lexicon file or directory");
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) return Status::IoError(f.string() + ": cannot read");
    ATFILL_RETURN_IF_ERROR(Add(text.str(), f.string()));
  }
  return Status::OK();
}

bool LexiconCatalog::Builder::Remove(std::string_view nsid) {
  auto it = docs_.find(nsid);
  if (it == docs_.end()) return false;
  docs_.erase(it);
  return true;
}

bool LexiconCatalog::Builder::Contains(std::string_view nsid) const {
  return docs_.find(nsid) != docs_.end();
}

Result<LexiconCatalog> LexiconCatalog::Builder::Build() const {
  LexiconCatalog catalog;
  for (const auto& [nsid, json] : docs_) {
    if (Status s = lexicon_internal::CompileDocument(json, catalog.store_.get(), nullptr);
        !s.ok()) {
      return Status::Internal("lexicon " + nsid + " no longer compiles: " + s.message());
    }
  }
  lexicon_internal::ResolveRefs(catalog.store_.get());
  return catalog;
}

}  // namespace atfill::atproto
