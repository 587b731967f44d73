// MstEditor: edits on whole and partial trees end at the root BuildMst gives for the same keys,
// and the interop commit-proof fixtures invert on their proof blocks alone.
#include "atproto/mst_edit.hpp"

#include <gtest/gtest.h>
#include <simdjson.h>

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

}  // namespace
}  // namespace atfill::atproto
