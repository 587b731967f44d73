#include "atproto/mst.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "atproto/cbor.hpp"
#include "atproto/value.hpp"
#include "base/sha256.hpp"

namespace atfill::atproto {
namespace {

// SHA-256 has 256 bits, so heights run 0..128 and a walk descends at most 129 nodes.
constexpr int kMaxHeight = 128;
constexpr int kMaxDepth = kMaxHeight + 1;

// Every key of every node read is checked, so by table rather than by ranges.
constexpr std::array<bool, 256> kKeyChars = [] {
  std::array<bool, 256> t{};
  for (int c = 0; c < 256; ++c) {
    t[c] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == '_' || c == ':' || c == '~';
  }
  return t;
}();
bool IsKeyChar(char c) { return kKeyChars[static_cast<uint8_t>(c)]; }

std::string Quote(std::string_view key) {
  constexpr size_t kShown = 80;
  std::string out = "\"";
  out.append(key.substr(0, kShown));
  if (key.size() > kShown) out.append("...");
  out.push_back('"');
  return out;
}

Result<std::optional<Cid>> NullableLink(const Value& value, std::string_view field) {
  if (value.is_null()) return std::optional<Cid>();
  if (value.kind() != Value::Kind::kLink) {
    return Status::Invalid("field '" + std::string(field) + "' is neither a CID link nor null");
  }
  return std::optional<Cid>(value.as_link());
}

Status DecodeEntry(const Value& value, size_t index, const std::string& prev, MstNode::Entry* out) {
  const std::string where = "entry " + std::to_string(index);
  if (value.kind() != Value::Kind::kMap) return Status::Invalid(where + " is not a map");
  const Value* k = nullptr;
  const Value* p = nullptr;
  const Value* t = nullptr;
  const Value* v = nullptr;
  for (const auto& [name, field] : value.as_map()) {
    if (name == "k") {
      k = &field;
    } else if (name == "p") {
      p = &field;
    } else if (name == "t") {
      t = &field;
    } else if (name == "v") {
      v = &field;
    } else {
      return Status::Invalid(where + " has an unexpected field " + Quote(name));
    }
  }
  if (k == nullptr || p == nullptr || t == nullptr || v == nullptr) {
    return Status::Invalid(where + " lacks one of the fields k, p, t, v");
  }
  if (k->kind() != Value::Kind::kBytes) return Status::Invalid(where + ": 'k' is not bytes");
  if (p->kind() != Value::Kind::kInt) return Status::Invalid(where + ": 'p' is not an integer");
  if (v->kind() != Value::Kind::kLink) return Status::Invalid(where + ": 'v' is not a CID link");
  const int64_t prefix = p->as_int();
  if (index == 0 && prefix != 0) {
    return Status::Invalid(where + ": the first entry has prefix length " + std::to_string(prefix));
  }
  if (prefix < 0 || static_cast<uint64_t>(prefix) > prev.size()) {
    return Status::Invalid(where + ": prefix length " + std::to_string(prefix) +
                           " exceeds the previous key's " + std::to_string(prev.size()) + " bytes");
  }
  const Bytes& suffix = k->as_bytes();
  if (static_cast<size_t>(prefix) + suffix.size() > kMaxMstKeyBytes) {
    return Status::Invalid(where + ": key longer than " + std::to_string(kMaxMstKeyBytes) +
                           " bytes");
  }
  out->key.assign(prev, 0, static_cast<size_t>(prefix));
  out->key.append(AsChars(suffix));
  if (index > 0) {
    if (out->key <= prev) {
      return Status::Invalid(where + ": key " + Quote(out->key) + " does not sort after " +
                             Quote(prev));
    }
    if (MstCommonPrefixLength(prev, out->key) != static_cast<size_t>(prefix)) {
      return Status::Invalid(where + ": prefix length " + std::to_string(prefix) +
                             " is not the common prefix of " + Quote(prev) + " and " +
                             Quote(out->key));
    }
  }
  ATFILL_RETURN_IF_ERROR(ValidateMstKey(out->key).WithContext(where));
  out->value = v->as_link();
  auto tree = NullableLink(*t, "t");
  if (!tree.ok()) return tree.status().WithContext(where);
  out->tree = *tree;
  return Status::OK();
}

// The one shape a canonical MST node has, read without building a DAG-CBOR value tree: a map of
// "e" (an array of maps of "k" bytes, "p" unsigned, "t" null or link, "v" link) and "l" (null or
// link), every head minimal. False for anything else, and for a node the full decoder refuses:
// the caller then decodes it the general way, which says what is wrong. What it accepts decodes
// to the same node both ways (MstNodeDecodersAgree in tests/atproto/mst_test.cpp).
bool DecodeCanonicalNode(ByteView block, MstNode* node) {
  if (block.size() > CborLimits{}.max_bytes) return false;
  CborReader r(block);
  uint64_t n = 0;
  if (!r.HeadOf(5, &n) || n != 2 || !r.Key("e") || !r.HeadOf(4, &n) || n > block.size())
    return false;
  node->entries.resize(n);
  std::string_view prev;
  for (size_t i = 0; i < node->entries.size(); ++i) {
    MstNode::Entry& e = node->entries[i];
    uint64_t fields = 0, prefix = 0;
    ByteView suffix;
    if (!r.HeadOf(5, &fields) || fields != 4 || !r.Key("k") || !r.Bytes(&suffix) || !r.Key("p") ||
        !r.HeadOf(0, &prefix) || !r.Key("t") || !r.NullOrLink(&e.tree) || !r.Key("v") ||
        !r.Link(&e.value)) {
      return false;
    }
    if ((i == 0 && prefix != 0) || prefix > prev.size() ||
        prefix + suffix.size() > kMaxMstKeyBytes) {
      return false;
    }
    e.key.reserve(prefix + suffix.size());
    e.key.assign(prev.substr(0, prefix));
    e.key.append(AsChars(suffix));
    if (i > 0 && (e.key <= prev || MstCommonPrefixLength(prev, e.key) != prefix)) return false;
    if (!ValidateMstKey(e.key).ok()) return false;
    prev = e.key;
  }
  return r.Key("l") && r.NullOrLink(&node->left) && r.AtEnd();
}

void AppendKey(char name, Bytes* out) {
  out->push_back(0x61);
  out->push_back(static_cast<uint8_t>(name));
}

void AppendLink(const Cid& cid, Bytes* out) {
  out->push_back(0xd8);
  out->push_back(42);
  const ByteView binary = cid.binary();
  AppendCborHead(2, binary.size() + 1, out);
  out->push_back(0x00);
  out->insert(out->end(), binary.begin(), binary.end());
}

class Loader {
 public:
  explicit Loader(const BlockStore& blocks) : blocks_(blocks) {}

  Result<MstNode> Load(const Cid& cid) const {
    const std::optional<ByteView> data = blocks_.Get(cid);
    if (!data) return Status::NotFound("MST node " + cid.ToString() + " is missing");
    auto node = DecodeMstNode(*data);
    if (!node.ok()) return node.status().WithContext("MST node " + cid.ToString());
    return node;
  }

 private:
  const BlockStore& blocks_;
};

class Walker {
 public:
  Walker(const BlockStore& blocks, const MstVisitor& visit) : loader_(blocks), visit_(visit) {}

  // `layer` is the layer the parent expects, or -1 for the root.
  Status Walk(const Cid& cid, int layer) {
    ATFILL_ASSIGN_OR_RETURN(MstNode node, loader_.Load(cid));
    const std::string where = "MST node " + cid.ToString();
    int node_layer = layer;
    if (node.entries.empty()) {
      if (layer < 0) {
        if (node.left) {
          return Status::Invalid(where + " is a root with no entries but a subtree");
        }
        return Status::OK();
      }
      if (!node.left) return Status::Invalid(where + " is an empty subtree node");
    } else {
      node_layer = MstKeyHeight(node.entries.front().key);
      if (layer >= 0 && node_layer != layer) {
        return Status::Invalid(where + " sits at layer " + std::to_string(layer) +
                               " but holds key " + Quote(node.entries.front().key) + " of height " +
                               std::to_string(node_layer));
      }
      for (const MstNode::Entry& entry : node.entries) {
        const int height = MstKeyHeight(entry.key);
        if (height != node_layer) {
          return Status::Invalid(where + " at layer " + std::to_string(node_layer) + " holds key " +
                                 Quote(entry.key) + " of height " + std::to_string(height));
        }
      }
    }
    const bool has_subtree =
        node.left.has_value() ||
        std::any_of(node.entries.begin(), node.entries.end(),
                    [](const MstNode::Entry& e) { return e.tree.has_value(); });
    if (node_layer == 0 && has_subtree) {
      return Status::Invalid(where + " at layer 0 has a subtree");
    }
    if (node.left) ATFILL_RETURN_IF_ERROR(Walk(*node.left, node_layer - 1));
    for (const MstNode::Entry& entry : node.entries) {
      if (have_last_ && entry.key <= last_key_) {
        return Status::Invalid(where + ": key " + Quote(entry.key) + " does not sort after " +
                               Quote(last_key_));
      }
      last_key_ = entry.key;
      have_last_ = true;
      ATFILL_RETURN_IF_ERROR(visit_(entry.key, entry.value));
      if (entry.tree) ATFILL_RETURN_IF_ERROR(Walk(*entry.tree, node_layer - 1));
    }
    return Status::OK();
  }

 private:
  Loader loader_;
  const MstVisitor& visit_;
  std::string last_key_;
  bool have_last_ = false;
};

class Builder {
 public:
  Builder(std::span<const MstEntry> entries, std::vector<int> heights,
          std::vector<std::pair<Cid, Bytes>>* nodes)
      : entries_(entries), heights_(std::move(heights)), nodes_(nodes) {}

  // Builds the node at `layer` for entries [lo, hi), all of height <= layer, and its subtrees.
  Cid Build(size_t lo, size_t hi, int layer) {
    MstNode node;
    size_t run = lo;
    auto attach = [&](size_t end) {
      std::optional<Cid> sub;
      if (run < end) sub = Build(run, end, layer - 1);
      if (node.entries.empty()) {
        node.left = sub;
      } else {
        node.entries.back().tree = sub;
      }
    };
    for (size_t i = lo; i < hi; ++i) {
      if (heights_[i] != layer) continue;
      attach(i);
      node.entries.push_back({entries_[i].key, entries_[i].value, std::nullopt});
      run = i + 1;
    }
    attach(hi);
    Bytes block = EncodeMstNode(node);
    const Cid cid = Cid::Compute(Cid::Codec::kDagCbor, block);
    nodes_->emplace_back(cid, std::move(block));
    return cid;
  }

 private:
  std::span<const MstEntry> entries_;
  std::vector<int> heights_;
  std::vector<std::pair<Cid, Bytes>>* nodes_;
};

// Walks one tree item by item in key order (a subtree, an entry, a subtree, ...), able to step
// over a subtree without reading it: DiffMst's two sides.
class DiffCursor {
 public:
  struct Item {
    bool subtree = false;
    int layer = 0;   // the subtree's layer
    const Cid* cid;  // the subtree's CID, or the entry's value
    const std::string* key = nullptr;
  };

  explicit DiffCursor(const BlockStore& blocks) : loader_(blocks) {}

  Status Open(const Cid& root) {
    ATFILL_ASSIGN_OR_RETURN(MstNode node, loader_.Load(root));
    // A canonical root holds keys; one without (an empty tree) is of no layer.
    const int layer = node.entries.empty() ? kMaxHeight + 1 : MstKeyHeight(node.entries[0].key);
    stack_.push_back({std::move(node), layer, 0});
    Settle();
    return Status::OK();
  }
  bool done() const { return stack_.empty(); }
  Item current() const {
    const Frame& f = stack_.back();
    if (f.pos % 2 == 0) {
      const std::optional<Cid>& t = f.pos == 0 ? f.node.left : f.node.entries[f.pos / 2 - 1].tree;
      return {true, f.layer - 1, &*t, nullptr};
    }
    const MstNode::Entry& e = f.node.entries[f.pos / 2];
    return {false, f.layer, &e.value, &e.key};
  }
  // Past the current item (a subtree unread).
  void Step() {
    ++stack_.back().pos;
    Settle();
  }
  // Into the current item, a subtree.
  Status Descend() {
    const Item item = current();
    if (item.layer < 0 || stack_.size() > static_cast<size_t>(kMaxDepth)) {
      return Status::Invalid("MST node " + item.cid->ToString() + " sits below layer 0");
    }
    ATFILL_ASSIGN_OR_RETURN(MstNode node, loader_.Load(*item.cid));
    ++stack_.back().pos;
    stack_.push_back({std::move(node), item.layer, 0});
    Settle();
    return Status::OK();
  }

 private:
  struct Frame {
    MstNode node;
    int layer;
    size_t pos;  // 0: the left subtree; 2i+1: entry i; 2i+2: entry i's subtree
  };
  // Moves to the next item that exists: over absent subtrees, out of finished nodes.
  void Settle() {
    while (!stack_.empty()) {
      Frame& f = stack_.back();
      if (f.pos >= 1 + 2 * f.node.entries.size()) {
        stack_.pop_back();
        continue;
      }
      if (f.pos % 2 == 0 && !(f.pos == 0 ? f.node.left : f.node.entries[f.pos / 2 - 1].tree)) {
        ++f.pos;
        continue;
      }
      return;
    }
  }

  Loader loader_;
  std::vector<Frame> stack_;
};

}  // namespace

int MstKeyHeight(std::string_view key) {
  const Sha256Digest digest = Sha256(AsBytes(key));
  int height = 0;
  for (const uint8_t byte : digest) {
    if (byte == 0) {
      height += 4;
      continue;
    }
    if (byte < 0x40) ++height;
    if (byte < 0x10) ++height;
    if (byte < 0x04) ++height;
    break;
  }
  return height;
}

size_t MstCommonPrefixLength(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

Status ValidateMstKey(std::string_view key) {
  if (key.size() > kMaxMstKeyBytes) {
    return Status::Invalid("MST key " + Quote(key) + " is longer than " +
                           std::to_string(kMaxMstKeyBytes) + " bytes");
  }
  const size_t slash = key.find('/');
  if (slash == std::string_view::npos || key.find('/', slash + 1) != std::string_view::npos) {
    return Status::Invalid("MST key " + Quote(key) + " is not of the form collection/rkey");
  }
  if (slash == 0 || slash + 1 == key.size()) {
    return Status::Invalid("MST key " + Quote(key) + " has an empty collection or rkey");
  }
  for (size_t i = 0; i < key.size(); ++i) {
    if (i != slash && !IsKeyChar(key[i])) {
      return Status::Invalid("MST key " + Quote(key) + " has a disallowed character at index " +
                             std::to_string(i));
    }
  }
  return Status::OK();
}

Result<MstNode> DecodeMstNode(ByteView block) {
  MstNode fast;
  if (DecodeCanonicalNode(block, &fast)) return fast;
  return DecodeMstNodeValue(block);
}

Result<MstNode> DecodeMstNodeValue(ByteView block) {
  ATFILL_ASSIGN_OR_RETURN(Value value, DecodeCbor(block));
  if (value.kind() != Value::Kind::kMap) return Status::Invalid("MST node is not a map");
  const Value* e = nullptr;
  const Value* l = nullptr;
  for (const auto& [name, field] : value.as_map()) {
    if (name == "e") {
      e = &field;
    } else if (name == "l") {
      l = &field;
    } else {
      return Status::Invalid("MST node has an unexpected field " + Quote(name));
    }
  }
  if (e == nullptr || l == nullptr) return Status::Invalid("MST node lacks field 'e' or 'l'");
  if (e->kind() != Value::Kind::kArray)
    return Status::Invalid("MST node field 'e' is not an array");
  MstNode node;
  ATFILL_ASSIGN_OR_RETURN(node.left, NullableLink(*l, "l"));
  const Value::Array& entries = e->as_array();
  node.entries.resize(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    static const std::string kNoKey;
    const std::string& prev = i == 0 ? kNoKey : node.entries[i - 1].key;
    ATFILL_RETURN_IF_ERROR(DecodeEntry(entries[i], i, prev, &node.entries[i]));
  }
  return node;
}

namespace {

// Canonical DAG-CBOR written directly: map keys in canonical order ("e" < "l"; "k" < "p" < "t" <
// "v"), minimal heads, links as tag 42 over 0x00 and the binary CID. `Entry` has key, value and
// tree (MstNode::Entry, MstEntryView).
template <typename Entry>
void AppendNode(const std::optional<Cid>& left, std::span<const Entry> entries, Bytes* out) {
  out->reserve(out->size() + 8 + entries.size() * 96);
  AppendCborHead(5, 2, out);
  AppendKey('e', out);
  AppendCborHead(4, entries.size(), out);
  std::string_view prev;
  for (const Entry& entry : entries) {
    const std::string_view key = entry.key;
    const size_t prefix = MstCommonPrefixLength(prev, key);
    const ByteView suffix = AsBytes(key).subspan(prefix);
    AppendCborHead(5, 4, out);
    AppendKey('k', out);
    AppendCborHead(2, suffix.size(), out);
    out->insert(out->end(), suffix.begin(), suffix.end());
    AppendKey('p', out);
    AppendCborHead(0, prefix, out);
    AppendKey('t', out);
    if (entry.tree) {
      AppendLink(*entry.tree, out);
    } else {
      out->push_back(0xf6);
    }
    AppendKey('v', out);
    AppendLink(entry.value, out);
    prev = key;
  }
  AppendKey('l', out);
  if (left) {
    AppendLink(*left, out);
  } else {
    out->push_back(0xf6);
  }
}

}  // namespace

Bytes EncodeMstNode(const MstNode& node) {
  Bytes out;
  AppendNode(node.left, std::span<const MstNode::Entry>(node.entries), &out);
  return out;
}

void EncodeMstNodeTo(const std::optional<Cid>& left, std::span<const MstEntryView> entries,
                     Bytes* out) {
  out->clear();
  AppendNode(left, entries, out);
}

Status WalkMst(const BlockStore& blocks, const Cid& root, const MstVisitor& visit) {
  Walker walker(blocks, visit);
  return walker.Walk(root, -1);
}

Result<std::optional<Cid>> MstGet(const BlockStore& blocks, const Cid& root, std::string_view key) {
  const Loader loader(blocks);
  std::optional<Cid> cur = root;
  for (int depth = 0; cur; ++depth) {
    if (depth > kMaxDepth) {
      return Status::Invalid("MST at " + root.ToString() + " is deeper than " +
                             std::to_string(kMaxDepth) + " nodes");
    }
    ATFILL_ASSIGN_OR_RETURN(MstNode node, loader.Load(*cur));
    const auto it =
        std::lower_bound(node.entries.begin(), node.entries.end(), key,
                         [](const MstNode::Entry& e, std::string_view k) { return e.key < k; });
    if (it != node.entries.end() && it->key == key) return std::optional<Cid>(it->value);
    cur = it == node.entries.begin() ? node.left : std::prev(it)->tree;
  }
  return std::optional<Cid>();
}

Result<Cid> BuildMst(std::span<const MstEntry> entries, std::vector<std::pair<Cid, Bytes>>* nodes) {
  std::vector<int> heights;
  heights.reserve(entries.size());
  int top = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    ATFILL_RETURN_IF_ERROR(ValidateMstKey(entries[i].key));
    if (i > 0 && entries[i].key <= entries[i - 1].key) {
      return Status::Invalid("MST entries are not strictly increasing: " + Quote(entries[i].key) +
                             " after " + Quote(entries[i - 1].key));
    }
    heights.push_back(MstKeyHeight(entries[i].key));
    top = std::max(top, heights.back());
  }
  const size_t first_new = nodes->size();
  Builder builder(entries, std::move(heights), nodes);
  const Cid root = builder.Build(0, entries.size(), top);
  // Children were emitted before their parents; flip so that parents (and the root) come first.
  std::reverse(nodes->begin() + static_cast<std::ptrdiff_t>(first_new), nodes->end());
  return root;
}

Result<Cid> BuildMst(std::span<const MstEntry> entries, BlockStore* out) {
  std::vector<std::pair<Cid, Bytes>> nodes;
  ATFILL_ASSIGN_OR_RETURN(Cid root, BuildMst(entries, &nodes));
  for (auto& [cid, bytes] : nodes) out->Put(cid, std::move(bytes));
  return root;
}

Status DiffMst(const BlockStore& before_blocks, const Cid& before, const BlockStore& after_blocks,
               const Cid& after, const MstDiffVisitor& visit) {
  DiffCursor a(before_blocks);
  DiffCursor b(after_blocks);
  ATFILL_RETURN_IF_ERROR(a.Open(before));
  ATFILL_RETURN_IF_ERROR(b.Open(after));
  MstChange change;
  while (!a.done() || !b.done()) {
    if (a.done() || b.done()) {
      // One side is through: the rest of the other is all creates (or all deletes).
      DiffCursor& rest = a.done() ? b : a;
      const DiffCursor::Item item = rest.current();
      if (item.subtree) {
        ATFILL_RETURN_IF_ERROR(rest.Descend());
        continue;
      }
      change.key = *item.key;
      change.before = a.done() ? std::nullopt : std::optional<Cid>(*item.cid);
      change.after = a.done() ? std::optional<Cid>(*item.cid) : std::nullopt;
      ATFILL_RETURN_IF_ERROR(visit(change));
      rest.Step();
      continue;
    }
    const DiffCursor::Item x = a.current();
    const DiffCursor::Item y = b.current();
    if (x.subtree && y.subtree && *x.cid == *y.cid) {
      // The same subtree on both sides: the same keys, and every key before it already compared.
      a.Step();
      b.Step();
      continue;
    }
    // Open the higher subtree first, so that two subtrees meet at one layer where they can be
    // compared by CID; a subtree facing an entry is opened to compare keys.
    if (x.subtree && (!y.subtree || x.layer >= y.layer)) {
      ATFILL_RETURN_IF_ERROR(a.Descend());
      continue;
    }
    if (y.subtree) {
      ATFILL_RETURN_IF_ERROR(b.Descend());
      continue;
    }
    const int order = x.key->compare(*y.key);
    if (order == 0) {
      if (*x.cid != *y.cid) ATFILL_RETURN_IF_ERROR(visit({*x.key, *x.cid, *y.cid}));
      a.Step();
      b.Step();
    } else if (order < 0) {
      ATFILL_RETURN_IF_ERROR(visit({*x.key, *x.cid, std::nullopt}));
      a.Step();
    } else {
      ATFILL_RETURN_IF_ERROR(visit({*y.key, std::nullopt, *y.cid}));
      b.Step();
    }
  }
  return Status::OK();
}

Status MstCoveringProof(const BlockStore& blocks, const Cid& root, std::string_view key,
                        std::vector<Cid>* proof) {
  const Loader loader(blocks);
  auto add = [proof](const Cid& cid) {
    if (std::find(proof->begin(), proof->end(), cid) == proof->end()) proof->push_back(cid);
  };
  // Follows the right-most (or left-most) spine of a subtree down to the bottom.
  auto spine = [&](std::optional<Cid> cur, bool rightmost) -> Status {
    for (int depth = 0; cur; ++depth) {
      if (depth > kMaxDepth) return Status::Invalid("MST spine deeper than the height limit");
      ATFILL_ASSIGN_OR_RETURN(MstNode node, loader.Load(*cur));
      add(*cur);
      cur = rightmost && !node.entries.empty() ? node.entries.back().tree : node.left;
    }
    return Status::OK();
  };
  std::optional<Cid> cur = root;
  for (int depth = 0; cur; ++depth) {
    if (depth > kMaxDepth) return Status::Invalid("MST path deeper than the height limit");
    ATFILL_ASSIGN_OR_RETURN(MstNode node, loader.Load(*cur));
    add(*cur);
    const auto it =
        std::lower_bound(node.entries.begin(), node.entries.end(), key,
                         [](const MstNode::Entry& e, std::string_view k) { return e.key < k; });
    const std::optional<Cid> left_of = it == node.entries.begin() ? node.left : std::prev(it)->tree;
    if (it != node.entries.end() && it->key == key) {
      ATFILL_RETURN_IF_ERROR(spine(left_of, /*rightmost=*/true));
      return spine(it->tree, /*rightmost=*/false);
    }
    cur = left_of;
  }
  return Status::OK();
}

}  // namespace atfill::atproto
