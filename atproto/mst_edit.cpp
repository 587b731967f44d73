#include "atproto/mst_edit.hpp"

#include <algorithm>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "atproto/mst.hpp"

namespace atfill::atproto {
namespace {

// A subtree: null when empty; a stub (not loaded) until an edit reaches it; then its node. Nodes
// live in their editor's pool (an edit makes a few dozen and the editor lives for one commit), so
// a subtree is a plain pointer and moving one costs nothing.
struct Node;
using NodePtr = Node*;

struct Node {
  struct Entry {
    std::string key;
    Cid value;
    NodePtr tree = nullptr;  // keys after `key`, before the next entry
  };
  // Set while the node is as stored (a stub, or loaded and untouched).
  std::optional<Cid> cid;
  bool loaded = false;
  NodePtr left = nullptr;
  std::vector<Entry> entries;

  bool Empty() const { return entries.empty() && left == nullptr; }
  // The first entry at or after `key`.
  size_t LowerBound(std::string_view key) const {
    return static_cast<size_t>(
        std::lower_bound(entries.begin(), entries.end(), key,
                         [](const Entry& e, std::string_view k) { return e.key < k; }) -
        entries.begin());
  }
  // The subtree just before entry i (i == entries.size(): the last one).
  NodePtr& ChildBefore(size_t i) { return i == 0 ? left : entries[i - 1].tree; }
};

std::string Quote(std::string_view key) { return "\"" + std::string(key) + "\""; }

}  // namespace

// Every recursion below goes one layer down per call and stops at layer 0 (a node there has no
// subtrees, and a layer below 0 is refused), and layers are key heights (0..128, mst.cpp): no edit
// recurses deeper than 129 calls, whatever the blocks hold.
struct MstEditor::Impl {
  const BlockStore* blocks;
  std::deque<Node> pool;   // every node of this editor; deque: growing it moves none
  NodePtr root = nullptr;  // null: the empty tree
  int layer = -1;
  // Encode's buffers, reused from node to node (a node is encoded after its subtrees).
  std::vector<MstEntryView> views;
  Bytes block;

  NodePtr Stub(const std::optional<Cid>& cid) {
    if (!cid) return nullptr;
    Node& node = pool.emplace_back();
    node.cid = *cid;
    return &node;
  }
  NodePtr Fresh() {
    Node& node = pool.emplace_back();
    node.loaded = true;
    return &node;
  }

  // Loads a stub in place and checks that its keys sit at `layer`.
  Status Ensure(Node* node, int layer) {
    if (node->loaded) return Status::OK();
    // Built only for an error: a CID's text costs more than a small node's decoding.
    auto where = [node] { return "MST node " + node->cid->ToString(); };
    const std::optional<ByteView> data = blocks->Get(*node->cid);
    if (!data) return Status::NotFound(where() + " is not in the blocks at hand");
    auto decoded = DecodeMstNode(*data);
    if (!decoded.ok()) return decoded.status().WithContext(where());
    if (layer < 0) return Status::Invalid(where() + " sits below layer 0");
    for (const MstNode::Entry& e : decoded->entries) {
      if (MstKeyHeight(e.key) != layer) {
        return Status::Invalid(where() + " at layer " + std::to_string(layer) + " holds key " +
                               Quote(e.key) + " of another height");
      }
    }
    const bool has_subtree =
        decoded->left || std::any_of(decoded->entries.begin(), decoded->entries.end(),
                                     [](const MstNode::Entry& e) { return e.tree.has_value(); });
    if (layer == 0 && has_subtree) return Status::Invalid(where() + " at layer 0 has a subtree");
    if (decoded->entries.empty() && !decoded->left) {
      return Status::Invalid(where() + " is an empty subtree node");
    }
    node->left = Stub(decoded->left);
    node->entries.reserve(decoded->entries.size());
    for (MstNode::Entry& e : decoded->entries) {
      node->entries.push_back({std::move(e.key), e.value, Stub(e.tree)});
    }
    node->loaded = true;
    return Status::OK();
  }

  // Splits the subtree `node` at `layer` around `key` (which it must not hold) into the keys
  // before it and the keys after it, both at `layer`.
  Status Split(NodePtr node, int layer, std::string_view key, NodePtr* before, NodePtr* after) {
    if (!node) {
      *before = nullptr;
      *after = nullptr;
      return Status::OK();
    }
    ATFILL_RETURN_IF_ERROR(Ensure(node, layer));
    const size_t i = node->LowerBound(key);
    if (i < node->entries.size() && node->entries[i].key == key) {
      return Status::Invalid("MST key " + Quote(key) + " found below its own layer");
    }
    NodePtr child_before = nullptr, child_after = nullptr;
    ATFILL_RETURN_IF_ERROR(
        Split(node->ChildBefore(i), layer - 1, key, &child_before, &child_after));
    NodePtr right = Fresh();
    right->left = child_after;
    right->entries.assign(std::make_move_iterator(node->entries.begin() + i),
                          std::make_move_iterator(node->entries.end()));
    node->entries.resize(i);
    node->ChildBefore(i) = child_before;
    node->cid.reset();
    *before = node->Empty() ? nullptr : node;
    *after = right->Empty() ? nullptr : right;
    return Status::OK();
  }

  Status Insert(NodePtr* slot, int layer, std::string_view key, int height, const Cid& value) {
    if (!*slot) *slot = Fresh();
    Node* node = *slot;
    ATFILL_RETURN_IF_ERROR(Ensure(node, layer));
    node->cid.reset();
    const size_t i = node->LowerBound(key);
    const bool here = i < node->entries.size() && node->entries[i].key == key;
    if (height < layer) {
      if (here) return Status::Invalid("MST key " + Quote(key) + " found above its own layer");
      return Insert(&node->ChildBefore(i), layer - 1, key, height, value);
    }
    if (here) {
      node->entries[i].value = value;
      return Status::OK();
    }
    NodePtr before = nullptr, after = nullptr;
    ATFILL_RETURN_IF_ERROR(Split(node->ChildBefore(i), layer - 1, key, &before, &after));
    node->ChildBefore(i) = before;
    node->entries.insert(node->entries.begin() + static_cast<std::ptrdiff_t>(i),
                         Node::Entry{std::string(key), value, after});
    return Status::OK();
  }

  // Joins two subtrees at `layer`, every key of `a` before every key of `b`.
  Result<NodePtr> Merge(NodePtr a, NodePtr b, int layer) {
    if (!a) return b;
    if (!b) return a;
    ATFILL_RETURN_IF_ERROR(Ensure(a, layer));
    ATFILL_RETURN_IF_ERROR(Ensure(b, layer));
    NodePtr& last = a->ChildBefore(a->entries.size());
    ATFILL_ASSIGN_OR_RETURN(last, Merge(last, b->left, layer - 1));
    for (Node::Entry& e : b->entries) a->entries.push_back(std::move(e));
    a->cid.reset();
    return a;
  }

  Status Remove(NodePtr* slot, int layer, std::string_view key) {
    if (!*slot || layer < 0) return Status::NotFound("MST key " + Quote(key) + " is absent");
    Node* node = *slot;
    ATFILL_RETURN_IF_ERROR(Ensure(node, layer));
    const size_t i = node->LowerBound(key);
    if (i < node->entries.size() && node->entries[i].key == key) {
      ATFILL_ASSIGN_OR_RETURN(NodePtr merged,
                              Merge(node->ChildBefore(i), node->entries[i].tree, layer - 1));
      node->entries.erase(node->entries.begin() + static_cast<std::ptrdiff_t>(i));
      node->ChildBefore(i) = merged;
    } else {
      ATFILL_RETURN_IF_ERROR(Remove(&node->ChildBefore(i), layer - 1, key));
    }
    node->cid.reset();
    if (node->Empty()) *slot = nullptr;
    return Status::OK();
  }

  Result<Cid> Encode(Node* node, BlockStore* out) {
    if (node->cid) return *node->cid;
    // The subtrees first: each then holds its CID, which this node's block links to.
    if (node->left) ATFILL_RETURN_IF_ERROR(Encode(node->left, out).status());
    for (Node::Entry& e : node->entries) {
      if (e.tree) ATFILL_RETURN_IF_ERROR(Encode(e.tree, out).status());
    }
    auto cid_of = [](const Node* n) { return n ? n->cid : std::nullopt; };
    views.clear();
    for (const Node::Entry& e : node->entries) views.push_back({e.key, e.value, cid_of(e.tree)});
    EncodeMstNodeTo(cid_of(node->left), views, &block);
    const Cid cid = Cid::Compute(Cid::Codec::kDagCbor, block);
    if (out != nullptr) out->Put(cid, block);
    node->cid = cid;
    return cid;
  }
};

MstEditor::MstEditor(const BlockStore* blocks) : impl_(std::make_unique<Impl>()) {
  impl_->blocks = blocks;
}
MstEditor::MstEditor(MstEditor&&) noexcept = default;
MstEditor& MstEditor::operator=(MstEditor&&) noexcept = default;
MstEditor::~MstEditor() = default;

Result<MstEditor> MstEditor::Open(const BlockStore* blocks, const Cid& root) {
  MstEditor editor(blocks);
  const std::string where = "MST root " + root.ToString();
  const std::optional<ByteView> data = blocks->Get(root);
  if (!data) return Status::NotFound(where + " is not in the blocks at hand");
  auto node = DecodeMstNode(*data);
  if (!node.ok()) return node.status().WithContext(where);
  if (node->entries.empty()) {
    if (node->left) return Status::Invalid(where + " has no entries but a subtree");
    return editor;
  }
  Impl& impl = *editor.impl_;
  impl.layer = MstKeyHeight(node->entries.front().key);
  impl.root = impl.Stub(root);
  ATFILL_RETURN_IF_ERROR(impl.Ensure(impl.root, impl.layer));
  return editor;
}

Result<std::optional<Cid>> MstEditor::Get(std::string_view key) {
  Node* node = impl_->root;
  for (int layer = impl_->layer; node != nullptr && layer >= 0; --layer) {
    ATFILL_RETURN_IF_ERROR(impl_->Ensure(node, layer));
    const size_t i = node->LowerBound(key);
    if (i < node->entries.size() && node->entries[i].key == key) {
      return std::optional<Cid>(node->entries[i].value);
    }
    node = node->ChildBefore(i);
  }
  return std::optional<Cid>();
}

Status MstEditor::Put(std::string_view key, const Cid& value) {
  ATFILL_RETURN_IF_ERROR(ValidateMstKey(key));
  Impl& impl = *impl_;
  const int height = MstKeyHeight(key);
  if (height > impl.layer) {
    // The key goes above the current root: the tree splits around it and each half is lifted to
    // the layer just below it through nodes holding only a left subtree.
    NodePtr before = nullptr, after = nullptr;
    ATFILL_RETURN_IF_ERROR(impl.Split(impl.root, impl.layer, key, &before, &after));
    for (int layer = std::max(impl.layer, 0); layer < height - 1 && impl.layer >= 0; ++layer) {
      for (NodePtr* half : {&before, &after}) {
        if (!*half) continue;
        NodePtr lifted = impl.Fresh();
        lifted->left = *half;
        *half = lifted;
      }
    }
    impl.root = impl.Fresh();
    impl.root->left = before;
    impl.root->entries.push_back({std::string(key), value, after});
    impl.layer = height;
    return Status::OK();
  }
  return impl.Insert(&impl.root, impl.layer, key, height, value);
}

Status MstEditor::Delete(std::string_view key) {
  Impl& impl = *impl_;
  ATFILL_RETURN_IF_ERROR(impl.Remove(&impl.root, impl.layer, key));
  // A root left without entries gives way to its only subtree, down to a root that has keys.
  while (impl.root) {
    ATFILL_RETURN_IF_ERROR(impl.Ensure(impl.root, impl.layer));
    if (!impl.root->entries.empty()) break;
    impl.root = impl.root->left;
    --impl.layer;
  }
  if (!impl.root) impl.layer = -1;
  return Status::OK();
}

Result<Cid> MstEditor::Root(BlockStore* out) {
  if (!impl_->root) {
    const Bytes block = EncodeMstNode(MstNode{});
    const Cid cid = Cid::Compute(Cid::Codec::kDagCbor, block);
    if (out != nullptr) out->Put(cid, block);
    return cid;
  }
  return impl_->Encode(impl_->root, out);
}

}  // namespace atfill::atproto
