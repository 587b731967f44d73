// The atproto Merkle Search Tree (repository spec): a key's height is the number of leading zero
// 2-bit pairs of SHA-256(key) (fanout 4); a node at layer L holds the keys of height L in order,
// with subtrees (layer L-1) between them. Node block: DAG-CBOR {l: link|null, e: [{p: prefix
// length shared with the previous key of the node, k: key suffix bytes, v: value link, t: subtree
// link|null}]}. The tree shape depends only on the key set, so the root CID is canonical.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "atproto/car.hpp"
#include "atproto/cid.hpp"
#include "base/bytes.hpp"
#include "base/status.hpp"

namespace atfill::atproto {

// Longest MST key accepted, in bytes.
inline constexpr size_t kMaxMstKeyBytes = 1024;

// Leading zero 2-bit pairs of SHA-256(key): 0..128.
int MstKeyHeight(std::string_view key);

// Length of the common prefix of `a` and `b`, in bytes.
size_t MstCommonPrefixLength(std::string_view a, std::string_view b);

// A repo path as an MST key: "<collection>/<rkey>", exactly one '/', both parts non-empty, only
// A-Za-z0-9 and . - _ : ~, at most kMaxMstKeyBytes. Invalid otherwise (the message names the key).
Status ValidateMstKey(std::string_view key);

// One node with its keys expanded (no prefix compression).
struct MstNode {
  struct Entry {
    std::string key;
    Cid value;
    std::optional<Cid> tree;  // keys after `key` and before the next entry
  };
  std::optional<Cid> left;  // keys before the first entry
  std::vector<Entry> entries;
};

// Decodes a node block and checks its shape (fields, types, prefix lengths, canonical prefix
// compression, strictly increasing valid keys). Heights are the walker's job.
Result<MstNode> DecodeMstNode(ByteView block);
// The same through the general DAG-CBOR decoder (a value tree): what DecodeMstNode falls back to
// for a block that is not a canonical node, so that its error names the problem; tests check
// the fast path against it.
Result<MstNode> DecodeMstNodeValue(ByteView block);
// Canonical DAG-CBOR of a node (keys prefix-compressed against the previous entry).
Bytes EncodeMstNode(const MstNode& node);
// An entry as EncodeMstNodeTo reads it, its key viewed (an editor's node keeps its own keys).
struct MstEntryView {
  std::string_view key;
  Cid value;
  std::optional<Cid> tree;
};
// The same encoding into `out`, which is cleared first and keeps its capacity: an editor that
// only hashes its nodes reuses one buffer.
void EncodeMstNodeTo(const std::optional<Cid>& left, std::span<const MstEntryView> entries,
                     Bytes* out);

// Called once per key in key order; a non-OK return stops the walk and is returned. `key` is valid
// only during the call.
using MstVisitor = std::function<Status(std::string_view key, const Cid& value)>;

// Walks the tree at `root` in key order. Checks the structure on the way: node shape, keys
// strictly increasing across the whole tree, every key of a node at the node's layer, subtrees one
// layer down, no empty subtree nodes, no layer below 0. A missing node is NotFound naming its CID;
// a bad node is Invalid naming its CID. Thread-safe with respect to `blocks`.
Status WalkMst(const BlockStore& blocks, const Cid& root, const MstVisitor& visit);

// The value stored under `key`, or nullopt. Reads only the nodes on the key's path.
Result<std::optional<Cid>> MstGet(const BlockStore& blocks, const Cid& root, std::string_view key);

struct MstEntry {
  std::string key;
  Cid value;
};

// Builds the canonical tree of `entries` (strictly increasing valid keys; Invalid otherwise) and
// puts every node block into `out`. Returns the root CID (the empty-node CID for no entries).
Result<Cid> BuildMst(std::span<const MstEntry> entries, BlockStore* out);
// As above; node blocks are appended to `nodes` parents first, the root first of all.
Result<Cid> BuildMst(std::span<const MstEntry> entries, std::vector<std::pair<Cid, Bytes>>* nodes);

// A key whose value differs between two trees: absent before (a create), absent after (a
// delete), or both set and different (an update).
struct MstChange {
  std::string key;
  std::optional<Cid> before;
  std::optional<Cid> after;
};
// Called once per change in key order; a non-OK return stops the diff and is returned.
using MstDiffVisitor = std::function<Status(const MstChange& change)>;

// Calls `visit` for every key whose value differs between the tree at `before` (its nodes in
// `before_blocks`) and the tree at `after` (in `after_blocks`; both may be one store). Subtrees
// with the same CID on both sides are skipped unread, so mostly the nodes that differ are read. A
// node the diff needs but the store lacks is NotFound naming it; a malformed one is Invalid.
// Thread-safe with respect to the stores.
Status DiffMst(const BlockStore& before_blocks, const Cid& before, const BlockStore& after_blocks,
               const Cid& after, const MstDiffVisitor& visit);

// Adds to `proof` the node CIDs of the tree at `root` that a consumer needs to invert a write of
// `key` (the covering proof a firehose commit carries, atproto sync 1.1): the nodes on the path to
// the key's position, plus, when the key is present, the right-most spine of the subtree just left
// of it and the left-most spine of the subtree just right of it, down to the bottom. Duplicates
// are not added twice.
Status MstCoveringProof(const BlockStore& blocks, const Cid& root, std::string_view key,
                        std::vector<Cid>* proof);

}  // namespace atfill::atproto
