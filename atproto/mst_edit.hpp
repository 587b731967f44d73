// Editing an MST of which only some nodes are at hand: the partial trees a firehose commit carries
// (atproto sync 1.1), where a consumer inverts the commit's operations on the new tree to reach
// the previous root, and any tree held in a BlockStore. Nodes are read from the store only when an
// edit reaches them, and a node an edit needs but the store lacks is an error naming it, so the
// caller learns that the blocks do not cover the edit. The resulting root is canonical: the same
// key set gives the same root CID whatever the order of the edits.
#pragma once

#include <memory>
#include <optional>
#include <string_view>

#include "atproto/car.hpp"
#include "atproto/cid.hpp"
#include "base/status.hpp"

namespace atfill::atproto {

// Not thread-safe; movable. The BlockStore must outlive the editor and is only read.
class MstEditor {
 public:
  // Opens the tree at `root`. The root node must be in `blocks` (NotFound otherwise); Invalid
  // when it is malformed, or is a non-empty root without entries (not canonical).
  static Result<MstEditor> Open(const BlockStore* blocks, const Cid& root);
  // An empty tree.
  explicit MstEditor(const BlockStore* blocks);
  MstEditor(MstEditor&&) noexcept;
  MstEditor& operator=(MstEditor&&) noexcept;
  ~MstEditor();

  // The value under `key`, or nullopt. Errors: NotFound (a node on the key's path is not in the
  // store), Invalid (a malformed node, or a node whose keys are not of its layer's height).
  Result<std::optional<Cid>> Get(std::string_view key);
  // Inserts `key` (a valid MST key) or replaces its value. Reads the nodes on the key's path.
  Status Put(std::string_view key, const Cid& value);
  // Removes `key`: NotFound naming the key when it is absent. Reads the nodes on the key's path
  // and the subtrees on either side of it down their facing edges.
  Status Delete(std::string_view key);

  // The root CID of the tree as edited (the empty-node CID for an empty tree). When `out` is set,
  // it receives the block of every node changed since Open (untouched nodes keep their CIDs and
  // are not copied).
  Result<Cid> Root(BlockStore* out = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace atfill::atproto
