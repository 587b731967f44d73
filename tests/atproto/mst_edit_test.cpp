// MstEditor: edits on whole and partial trees end at the root BuildMst gives for the same keys,
// and the interop commit-proof fixtures invert on their proof blocks alone.
#include "atproto/mst_edit.hpp"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "atproto/mst.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::atproto {
namespace {

Cid ValueCid(int i) {
  return Cid::Compute(Cid::Codec::kDagCbor, AsBytes("value " + std::to_string(i)));
}

Cid Build(const std::map<std::string, Cid>& keys, BlockStore* store) {
  std::vector<MstEntry> entries;
  for (const auto& [k, v] : keys) entries.push_back({k, v});
  auto root = BuildMst(entries, store);
  EXPECT_TRUE(root.ok()) << root.status().ToString();
  return *root;
}

Cid RootOf(MstEditor* editor, BlockStore* out = nullptr) {
  auto root = editor->Root(out);
  EXPECT_TRUE(root.ok()) << root.status().ToString();
  return *root;
}

TEST(MstEditor, RandomEditsReachTheCanonicalRoot) {
  std::mt19937 rng(21);
  for (int round = 0; round < 40; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::map<std::string, Cid> keys;
    const int n = static_cast<int>(rng() % 300);
    for (int i = 0; i < n; ++i) {
      keys["app.bsky.feed.post/k" + std::to_string(rng() % 1000)] = ValueCid(i);
    }
    BlockStore store;
    const Cid start = Build(keys, &store);
    auto editor = MstEditor::Open(&store, start);
    ASSERT_TRUE(editor.ok()) << editor.status().ToString();
    EXPECT_EQ(RootOf(&*editor), start) << "an untouched tree keeps its root";
    for (int op = 0; op < 60; ++op) {
      const std::string key = "app.bsky.feed.post/k" + std::to_string(rng() % 1000);
      if (rng() % 2 == 0 && keys.contains(key)) {
        ASSERT_TRUE(editor->Delete(key).ok()) << key;
        keys.erase(key);
      } else {
        const Cid value = ValueCid(1000 + op);
        ASSERT_TRUE(editor->Put(key, value).ok()) << key;
        keys[key] = value;
      }
      auto got = editor->Get(key);
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(got->has_value(), keys.contains(key));
    }
    BlockStore expected_store;
    const Cid expected = Build(keys, &expected_store);
    BlockStore written;
    EXPECT_EQ(RootOf(&*editor, &written), expected);
    // The changed nodes it wrote, with the untouched ones, make a whole tree of those keys.
    store.ForEach([&](const Cid& cid, ByteView data) { written.PutView(cid, data); });
    size_t walked = 0;
    ASSERT_TRUE(WalkMst(written, expected, [&](std::string_view k, const Cid& v) {
                  EXPECT_EQ(keys.at(std::string(k)), v);
                  ++walked;
                  return Status::OK();
                }).ok());
    EXPECT_EQ(walked, keys.size());
  }
}

TEST(MstEditor, AnEmptyTreeGrowsAndShrinksBackToTheEmptyRoot) {
  BlockStore store;
  MstEditor editor(&store);
  const Cid empty = RootOf(&editor);
  EXPECT_EQ(empty, Build({}, &store));
  std::map<std::string, Cid> keys;
  for (int i = 0; i < 200; ++i) {
    const std::string key = "com.example.record/" + std::to_string(i * 7919 % 1000);
    keys[key] = ValueCid(i);
    ASSERT_TRUE(editor.Put(key, ValueCid(i)).ok());
  }
  EXPECT_EQ(RootOf(&editor), Build(keys, &store));
  for (const auto& [key, value] : keys) ASSERT_TRUE(editor.Delete(key).ok()) << key;
  EXPECT_EQ(RootOf(&editor), empty);
}

TEST(MstEditor, MissingKeysAndNodesAreNamed) {
  std::map<std::string, Cid> keys;
  for (int i = 0; i < 500; ++i) keys["com.example.record/" + std::to_string(i)] = ValueCid(i);
  BlockStore full;
  const Cid root = Build(keys, &full);
  auto editor = MstEditor::Open(&full, root);
  ASSERT_TRUE(editor.ok());
  Status absent = editor->Delete("com.example.record/nope");
  EXPECT_EQ(absent.code(), StatusCode::kNotFound);
  EXPECT_NE(absent.message().find("com.example.record/nope"), std::string::npos)
      << absent.ToString();
  EXPECT_EQ(editor->Put("not a key", ValueCid(1)).code(), StatusCode::kInvalid);

  // Only the root node at hand: an edit below it names the node it lacks.
  BlockStore root_only;
  root_only.PutView(root, *full.Get(root));
  auto partial = MstEditor::Open(&root_only, root);
  ASSERT_TRUE(partial.ok());
  Status missing = partial->Delete("com.example.record/250");
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("is not in the blocks at hand"), std::string::npos)
      << missing.ToString();
  BlockStore nothing;
  EXPECT_EQ(MstEditor::Open(&nothing, root).status().code(), StatusCode::kNotFound);
}

// The interop fixtures: a commit's adds and deletes inverted on the new tree's proof blocks alone
// give the tree before the commit; without one of those blocks it fails (or, for a spine it does
// not read, still gives the same root), never a wrong root.
TEST(MstEditor, CommitProofFixturesInvertOnTheirProofBlocks) {
  ATFILL_SHARED_PATH(path, "vectors/interop/firehose/commit-proof-fixtures.json");
  simdjson::dom::parser parser;
  const simdjson::dom::element doc = parser.load(path.string());
  size_t count = 0, needed = 0, spared = 0;
  for (simdjson::dom::element fixture : doc.get_array()) {
    SCOPED_TRACE(std::string(std::string_view(fixture["comment"].get_string())));
    const Cid leaf = *Cid::Parse(std::string_view(fixture["leafValue"].get_string()));
    auto strings = [&](const char* field) {
      std::vector<std::string> out;
      for (simdjson::dom::element e : fixture[field].get_array()) {
        out.emplace_back(std::string_view(e.get_string()));
      }
      return out;
    };
    std::map<std::string, Cid> keys;
    for (const std::string& k : strings("keys")) keys[k] = leaf;
    for (const std::string& k : strings("adds")) keys[k] = leaf;
    for (const std::string& k : strings("dels")) keys.erase(k);
    BlockStore after;
    const Cid after_root = Build(keys, &after);
    ASSERT_EQ(after_root.ToString(), std::string_view(fixture["rootAfterCommit"].get_string()));
    std::vector<Cid> proof;
    for (simdjson::dom::element e : fixture["blocksInProof"].get_array()) {
      proof.push_back(*Cid::Parse(std::string_view(e.get_string())));
    }
    auto invert = [&](const BlockStore& blocks) -> Result<Cid> {
      ATFILL_ASSIGN_OR_RETURN(MstEditor editor, MstEditor::Open(&blocks, after_root));
      for (const std::string& k : strings("adds")) ATFILL_RETURN_IF_ERROR(editor.Delete(k));
      for (const std::string& k : strings("dels")) ATFILL_RETURN_IF_ERROR(editor.Put(k, leaf));
      return editor.Root();
    };
    BlockStore partial;
    for (const Cid& cid : proof) partial.PutView(cid, *after.Get(cid));
    auto before = invert(partial);
    ASSERT_TRUE(before.ok()) << before.status().ToString();
    EXPECT_EQ(before->ToString(), std::string_view(fixture["rootBeforeCommit"].get_string()));
    for (size_t skip = 0; skip < proof.size(); ++skip) {
      BlockStore short_one;
      for (size_t i = 0; i < proof.size(); ++i) {
        if (i != skip) short_one.PutView(proof[i], *after.Get(proof[i]));
      }
      // The proof holds both spines beside a key; a merge with an empty side reads only one.
      auto got = invert(short_one);
      if (got.ok()) {
        EXPECT_EQ(*got, *before) << "without " << proof[skip].ToString();
        ++spared;
      } else {
        EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().ToString();
        ++needed;
      }
    }
    ++count;
  }
  EXPECT_GT(count, 0u);
  EXPECT_GT(needed, 5 * spared) << "nearly every proof block is needed";
}

// DiffMst between random trees gives exactly the map difference, and reads only what differs:
// the tree after a few edits diffs against the tree before from a store holding the before tree
// and only the nodes the edits wrote.
TEST(MstDiff, RandomTreesDiffAsTheirKeyMaps) {
  std::mt19937 rng(7);
  for (int round = 0; round < 30; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::map<std::string, Cid> before;
    const int n = static_cast<int>(rng() % 400);
    for (int i = 0; i < n; ++i) {
      before["app.bsky.feed.like/k" + std::to_string(rng() % 2000)] = ValueCid(i);
    }
    BlockStore before_store;
    const Cid before_root = Build(before, &before_store);
    std::map<std::string, Cid> after = before;
    auto editor = MstEditor::Open(&before_store, before_root);
    ASSERT_TRUE(editor.ok());
    const int edits = round % 3 == 0 ? 200 : 1 + static_cast<int>(rng() % 5);
    for (int e = 0; e < edits; ++e) {
      const std::string key = "app.bsky.feed.like/k" + std::to_string(rng() % 2000);
      if (after.contains(key) && rng() % 2 == 0) {
        after.erase(key);
        ASSERT_TRUE(editor->Delete(key).ok());
      } else {
        after[key] = ValueCid(5000 + e);
        ASSERT_TRUE(editor->Put(key, after[key]).ok());
      }
    }
    BlockStore written;  // only the nodes the edits changed, then the before tree beside them
    const Cid after_root = RootOf(&*editor, &written);
    before_store.ForEach([&](const Cid& cid, ByteView data) { written.PutView(cid, data); });
    std::vector<MstChange> want;
    for (const auto& [k, v] : before) {
      auto it = after.find(k);
      if (it == after.end()) want.push_back({k, v, std::nullopt});
      if (it != after.end() && it->second != v) want.push_back({k, v, it->second});
    }
    for (const auto& [k, v] : after) {
      if (!before.contains(k)) want.push_back({k, std::nullopt, v});
    }
    std::sort(want.begin(), want.end(),
              [](const MstChange& x, const MstChange& y) { return x.key < y.key; });
    std::vector<MstChange> got;
    ASSERT_TRUE(DiffMst(before_store, before_root, written, after_root, [&](const MstChange& c) {
                  got.push_back(c);
                  return Status::OK();
                }).ok());
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].key, want[i].key);
      EXPECT_EQ(got[i].before, want[i].before) << got[i].key;
      EXPECT_EQ(got[i].after, want[i].after) << got[i].key;
    }
    // And the other way round: the creates become deletes.
    size_t reversed = 0;
    ASSERT_TRUE(DiffMst(written, after_root, before_store, before_root, [&](const MstChange& c) {
                  EXPECT_EQ(c.before, want[reversed].after);
                  EXPECT_EQ(c.after, want[reversed].before);
                  ++reversed;
                  return Status::OK();
                }).ok());
    EXPECT_EQ(reversed, want.size());
  }
}

TEST(MstDiff, IdenticalSubtreesAreNotRead) {
  std::map<std::string, Cid> keys;
  for (int i = 0; i < 2000; ++i) keys["com.example.record/" + std::to_string(i)] = ValueCid(i);
  BlockStore full;
  const Cid root = Build(keys, &full);
  // The same tree: not even the root's children are needed.
  BlockStore root_only;
  root_only.PutView(root, *full.Get(root));
  int changes = 0;
  EXPECT_TRUE(DiffMst(root_only, root, root_only, root, [&](const MstChange&) {
                ++changes;
                return Status::OK();
              }).ok());
  EXPECT_EQ(changes, 0);
  // One key changed: the diff reads the two paths to it and nothing else.
  auto editor = MstEditor::Open(&full, root);
  ASSERT_TRUE(editor.ok());
  ASSERT_TRUE(editor->Put("com.example.record/1234", ValueCid(99999)).ok());
  BlockStore written;
  const Cid changed = RootOf(&*editor, &written);
  std::vector<Cid> paths;
  ASSERT_TRUE(MstCoveringProof(full, root, "com.example.record/1234", &paths).ok());
  BlockStore path_only = written;
  for (const Cid& cid : paths) path_only.PutView(cid, *full.Get(cid));
  std::vector<MstChange> got;
  Status s = DiffMst(path_only, root, path_only, changed, [&](const MstChange& c) {
    got.push_back(c);
    return Status::OK();
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].key, "com.example.record/1234");
  EXPECT_EQ(got[0].after, ValueCid(99999));
  EXPECT_EQ(
      DiffMst(root_only, root, root_only, changed, [](const MstChange&) { return Status::OK(); })
          .code(),
      StatusCode::kNotFound);
}

}  // namespace
}  // namespace atfill::atproto
