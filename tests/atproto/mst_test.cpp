#include "atproto/mst.hpp"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "atproto/cbor.hpp"
#include "atproto/value.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::atproto {
namespace {

Cid ValueCid(int i) {
  return Cid::Compute(Cid::Codec::kDagCbor, AsBytes("record " + std::to_string(i)));
}

Cid ParseCid(std::string_view text) {
  auto cid = Cid::Parse(text);
  EXPECT_TRUE(cid.ok()) << text << ": " << cid.status().ToString();
  return cid.ok() ? *cid : Cid();
}

// Walks the tree into a list, or returns the walk's error.
Result<std::vector<MstEntry>> Collect(const BlockStore& blocks, const Cid& root) {
  std::vector<MstEntry> out;
  ATFILL_RETURN_IF_ERROR(WalkMst(blocks, root, [&](std::string_view key, const Cid& value) {
    out.push_back({std::string(key), value});
    return Status::OK();
  }));
  return out;
}

// The `n`th key "com.example.record/k<i>" (in i order) whose height is `height`.
std::string KeyOfHeight(int height, int n = 0) {
  for (int i = 0;; ++i) {
    std::string key = "com.example.record/k" + std::to_string(i);
    if (MstKeyHeight(key) == height && n-- == 0) return key;
  }
}

std::vector<MstEntry> Entries(std::vector<std::string> keys) {
  std::sort(keys.begin(), keys.end());
  std::vector<MstEntry> out;
  for (size_t i = 0; i < keys.size(); ++i) out.push_back({keys[i], ValueCid(static_cast<int>(i))});
  return out;
}

Cid Put(BlockStore* store, const MstNode& node) { return store->PutBlock(EncodeMstNode(node)); }

Status WalkStatus(const BlockStore& blocks, const Cid& root) {
  return WalkMst(blocks, root, [](std::string_view, const Cid&) { return Status::OK(); });
}

TEST(MstVectors, KeyHeights) {
  ATFILL_SHARED_PATH(path, "vectors/interop/mst/key_heights.json");
  simdjson::dom::parser parser;
  const simdjson::dom::element doc = parser.load(path.string());
  size_t count = 0;
  for (simdjson::dom::element item : doc.get_array()) {
    const std::string_view key = item["key"].get_string();
    const int64_t height = item["height"].get_int64();
    EXPECT_EQ(MstKeyHeight(key), height) << key;
    ++count;
  }
  EXPECT_GT(count, 0u);
}

TEST(MstVectors, CommonPrefix) {
  ATFILL_SHARED_PATH(path, "vectors/interop/mst/common_prefix.json");
  simdjson::dom::parser parser;
  const simdjson::dom::element doc = parser.load(path.string());
  size_t count = 0;
  for (simdjson::dom::element item : doc.get_array()) {
    const std::string_view left = item["left"].get_string();
    const std::string_view right = item["right"].get_string();
    const uint64_t len = item["len"].get_uint64();
    EXPECT_EQ(MstCommonPrefixLength(left, right), len) << left << " | " << right;
    ++count;
  }
  EXPECT_GT(count, 0u);
}

std::vector<std::string> ExampleKeys(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> keys;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) keys.push_back(line);
  }
  return keys;
}

TEST(MstVectors, ExampleKeysCarryTheirHeight) {
  ATFILL_SHARED_PATH(path, "vectors/interop/mst/example_keys.txt");
  const std::vector<std::string> keys = ExampleKeys(path);
  ASSERT_GT(keys.size(), 0u);
  for (const std::string& key : keys) {
    ASSERT_GE(key.size(), 2u);
    EXPECT_EQ(MstKeyHeight(key), key[1] - '0') << key;
    EXPECT_TRUE(ValidateMstKey(key).ok()) << key;
  }
}

TEST(MstVectors, ExampleKeysRoundTrip) {
  ATFILL_SHARED_PATH(path, "vectors/interop/mst/example_keys.txt");
  const std::vector<MstEntry> entries = Entries(ExampleKeys(path));
  ASSERT_GT(entries.size(), 0u);
  BlockStore store;
  auto root = BuildMst(entries, &store);
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  auto walked = Collect(store, *root);
  ASSERT_TRUE(walked.ok()) << walked.status().ToString();
  ASSERT_EQ(walked->size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ((*walked)[i].key, entries[i].key);
    EXPECT_EQ((*walked)[i].value, entries[i].value);
    auto got = MstGet(store, *root, entries[i].key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(got->has_value()) << entries[i].key;
    EXPECT_EQ(**got, entries[i].value);
  }
  auto absent = MstGet(store, *root, "Z9/000000");
  ASSERT_TRUE(absent.ok());
  EXPECT_FALSE(absent->has_value());
}

TEST(MstVectors, CommitProofFixtures) {
  ATFILL_SHARED_PATH(path, "vectors/interop/firehose/commit-proof-fixtures.json");
  simdjson::dom::parser parser;
  const simdjson::dom::element doc = parser.load(path.string());
  size_t count = 0;
  for (simdjson::dom::element fixture : doc.get_array()) {
    const std::string comment(std::string_view(fixture["comment"].get_string()));
    SCOPED_TRACE(comment);
    const Cid leaf = ParseCid(fixture["leafValue"].get_string());
    auto strings = [&](const char* field) {
      std::vector<std::string> out;
      for (simdjson::dom::element e : fixture[field].get_array()) {
        out.emplace_back(std::string_view(e.get_string()));
      }
      return out;
    };
    const std::vector<std::string> keys = strings("keys");
    const std::vector<std::string> adds = strings("adds");
    const std::vector<std::string> dels = strings("dels");
    ASSERT_FALSE(keys.empty());
    ASSERT_FALSE(adds.empty() && dels.empty());

    std::set<std::string> key_set(keys.begin(), keys.end());
    auto build = [&](const std::set<std::string>& set, BlockStore* store) {
      std::vector<MstEntry> entries;
      for (const std::string& k : set) entries.push_back({k, leaf});
      return BuildMst(entries, store);
    };
    BlockStore before_store;
    auto before = build(key_set, &before_store);
    ASSERT_TRUE(before.ok()) << before.status().ToString();
    EXPECT_EQ(before->ToString(), std::string_view(fixture["rootBeforeCommit"].get_string()));

    for (const std::string& k : adds) key_set.insert(k);
    for (const std::string& k : dels) key_set.erase(k);
    BlockStore after_store;
    auto after = build(key_set, &after_store);
    ASSERT_TRUE(after.ok()) << after.status().ToString();
    EXPECT_EQ(after->ToString(), std::string_view(fixture["rootAfterCommit"].get_string()));

    // The after tree holds exactly the new key set.
    auto walked = Collect(after_store, *after);
    ASSERT_TRUE(walked.ok()) << walked.status().ToString();
    std::set<std::string> walked_keys;
    for (const MstEntry& e : *walked) walked_keys.insert(e.key);
    EXPECT_EQ(walked_keys, key_set);
    for (const std::string& k : dels) {
      auto got = MstGet(after_store, *after, k);
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(got->has_value(), key_set.contains(k)) << k;
    }

    // blocksInProof: the nodes of the new tree a consumer needs to invert every operation.
    std::vector<Cid> proof;
    for (const std::string& k : adds)
      ASSERT_TRUE(MstCoveringProof(after_store, *after, k, &proof).ok());
    for (const std::string& k : dels)
      ASSERT_TRUE(MstCoveringProof(after_store, *after, k, &proof).ok());
    std::set<std::string> got;
    for (const Cid& cid : proof) got.insert(cid.ToString());
    EXPECT_EQ(got.size(), proof.size());  // no duplicates
    std::set<std::string> want;
    for (simdjson::dom::element e : fixture["blocksInProof"].get_array()) {
      want.emplace(std::string_view(e.get_string()));
    }
    EXPECT_EQ(got, want);
    ++count;
  }
  EXPECT_GT(count, 0u);
}

TEST(MstBuild, EmptyTreeHasTheKnownRoot) {
  BlockStore store;
  auto root = BuildMst({}, &store);
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->ToString(), "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm");
  auto walked = Collect(store, *root);
  ASSERT_TRUE(walked.ok()) << walked.status().ToString();
  EXPECT_TRUE(walked->empty());
}

TEST(MstBuild, LargeTreeRoundTripAndParentsFirst) {
  std::vector<std::string> keys;
  for (int i = 0; i < 3000; ++i) {
    keys.push_back((i % 3 == 0 ? "app.bsky.feed.like/" : "app.bsky.feed.post/") +
                   std::to_string(1000000 + i * 7919 % 100000));
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  const std::vector<MstEntry> entries = Entries(keys);
  std::vector<std::pair<Cid, Bytes>> nodes;
  auto root = BuildMst(entries, &nodes);
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  ASSERT_FALSE(nodes.empty());
  EXPECT_EQ(nodes.front().first, *root);
  // Every node appears after the node that links to it.
  std::map<Cid, size_t> position;
  for (size_t i = 0; i < nodes.size(); ++i) position[nodes[i].first] = i;
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto node = DecodeMstNode(nodes[i].second);
    ASSERT_TRUE(node.ok()) << node.status().ToString();
    std::vector<Cid> children;
    if (node->left) children.push_back(*node->left);
    for (const auto& e : node->entries) {
      if (e.tree) children.push_back(*e.tree);
    }
    for (const Cid& child : children) {
      ASSERT_TRUE(position.contains(child));
      EXPECT_GT(position[child], i);
    }
  }
  BlockStore store;
  for (auto& [cid, bytes] : nodes) store.Put(cid, bytes);
  auto walked = Collect(store, *root);
  ASSERT_TRUE(walked.ok()) << walked.status().ToString();
  ASSERT_EQ(walked->size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ((*walked)[i].key, entries[i].key);
    EXPECT_EQ((*walked)[i].value, entries[i].value);
  }
  // Same keys, same root (canonical).
  BlockStore again;
  EXPECT_EQ(*BuildMst(entries, &again), *root);
}

TEST(MstBuild, RejectsBadInput) {
  BlockStore store;
  std::vector<MstEntry> unsorted = {{"a.b.c/2", ValueCid(1)}, {"a.b.c/1", ValueCid(2)}};
  EXPECT_EQ(BuildMst(unsorted, &store).status().code(), StatusCode::kInvalid);
  std::vector<MstEntry> dup = {{"a.b.c/1", ValueCid(1)}, {"a.b.c/1", ValueCid(2)}};
  EXPECT_EQ(BuildMst(dup, &store).status().code(), StatusCode::kInvalid);
  std::vector<MstEntry> bad = {{"no-slash", ValueCid(1)}};
  EXPECT_EQ(BuildMst(bad, &store).status().code(), StatusCode::kInvalid);
}

TEST(MstKey, Validation) {
  for (const char* good :
       {"app.bsky.feed.post/3jui7kd2z2y2e", "a/b", "A0/374913", "com.example/a.b-c_d:e~f"}) {
    EXPECT_TRUE(ValidateMstKey(good).ok()) << good;
  }
  for (const char* bad :
       {"", "/", "a/", "/b", "ab", "a/b/c", "a b/c", "a/c d", "a/\xc3\xa9", "a/b\n", "a/b#"}) {
    EXPECT_FALSE(ValidateMstKey(bad).ok()) << bad;
  }
  EXPECT_TRUE(ValidateMstKey("a/" + std::string(1022, 'x')).ok());
  EXPECT_FALSE(ValidateMstKey("a/" + std::string(1023, 'x')).ok());
}

TEST(MstNodeCodec, RoundTripAndPrefixCompression) {
  MstNode node;
  node.left = ValueCid(100);
  node.entries.push_back({"com.example.record/abc", ValueCid(1), std::nullopt});
  node.entries.push_back({"com.example.record/abd", ValueCid(2), ValueCid(3)});
  node.entries.push_back({"com.example.zzz/x", ValueCid(4), std::nullopt});
  const Bytes bytes = EncodeMstNode(node);
  auto value = DecodeCbor(bytes);
  ASSERT_TRUE(value.ok());
  const Value::Array& e = value->Find("e")->as_array();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].Find("p")->as_int(), 0);
  EXPECT_EQ(e[1].Find("p")->as_int(), 21);
  EXPECT_EQ(AsChars(e[1].Find("k")->as_bytes()), "d");
  EXPECT_EQ(e[2].Find("p")->as_int(), 12);
  auto decoded = DecodeMstNode(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->left, node.left);
  ASSERT_EQ(decoded->entries.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(decoded->entries[i].key, node.entries[i].key);
    EXPECT_EQ(decoded->entries[i].value, node.entries[i].value);
    EXPECT_EQ(decoded->entries[i].tree, node.entries[i].tree);
  }
}

// A node map built by hand, for shapes EncodeMstNode never makes.
Bytes RawNode(Value::Array entries, Value left = Value::Null(),
              std::optional<std::pair<std::string, Value>> extra = std::nullopt) {
  Value::Map m;
  m.emplace_back("e", Value::MakeArray(std::move(entries)));
  m.emplace_back("l", std::move(left));
  if (extra) m.push_back(*extra);
  return EncodeCbor(Value::MakeMap(std::move(m)));
}

Value RawEntry(int64_t p, std::string_view k, Value t = Value::Null(),
               Value v = Value::Link(ValueCid(0))) {
  Value::Map m;
  m.emplace_back("k", Value::BytesValue(Bytes(AsBytes(k).begin(), AsBytes(k).end())));
  m.emplace_back("p", Value::Int(p));
  m.emplace_back("t", std::move(t));
  m.emplace_back("v", std::move(v));
  return Value::MakeMap(std::move(m));
}

void ExpectNodeInvalid(const Bytes& bytes, const std::string& needle) {
  auto node = DecodeMstNode(bytes);
  ASSERT_FALSE(node.ok()) << needle;
  EXPECT_EQ(node.status().code(), StatusCode::kInvalid) << node.status().ToString();
  EXPECT_NE(node.status().message().find(needle), std::string::npos) << node.status().ToString();
}

TEST(MstNodeCodec, RejectsMalformedNodes) {
  ExpectNodeInvalid(EncodeCbor(Value::MakeArray()), "not a map");
  {
    Value::Map m;
    m.emplace_back("e", Value::MakeArray());
    ExpectNodeInvalid(EncodeCbor(Value::MakeMap(m)), "lacks");
  }
  ExpectNodeInvalid(RawNode({}, Value::Null(), std::make_pair("x", Value::Int(1))), "unexpected");
  ExpectNodeInvalid(RawNode({}, Value::Int(3)), "'l'");
  ExpectNodeInvalid(RawNode({RawEntry(1, "a/b")}), "first entry");
  ExpectNodeInvalid(RawNode({RawEntry(0, "a/b"), RawEntry(5, "c")}), "exceeds");
  ExpectNodeInvalid(RawNode({RawEntry(-1, "a/b")}), "prefix length");
  // Not maximal: "a/b" then p=0 "a/c" shares 2 bytes.
  ExpectNodeInvalid(RawNode({RawEntry(0, "a/b"), RawEntry(0, "a/c")}), "not the common prefix");
  ExpectNodeInvalid(RawNode({RawEntry(0, "a/c"), RawEntry(2, "b")}), "does not sort after");
  ExpectNodeInvalid(RawNode({RawEntry(0, "a/b"), RawEntry(3, "")}), "does not sort after");
  ExpectNodeInvalid(RawNode({RawEntry(0, "nokey")}), "collection/rkey");
  ExpectNodeInvalid(RawNode({RawEntry(0, "a/b", Value::Int(1))}), "'t'");
  ExpectNodeInvalid(RawNode({RawEntry(0, "a/b", Value::Null(), Value::Null())}), "'v'");
  ExpectNodeInvalid(RawNode({Value::Int(4)}), "not a map");
  {
    Value::Map m;
    m.emplace_back("k", Value::BytesValue({'a', '/', 'b'}));
    m.emplace_back("p", Value::Int(0));
    m.emplace_back("v", Value::Link(ValueCid(0)));
    ExpectNodeInvalid(RawNode({Value::MakeMap(m)}), "lacks");
  }
  // Not DAG-CBOR at all.
  EXPECT_FALSE(DecodeMstNode(Bytes{0xff}).ok());
}

// The node codec written directly agrees with the general DAG-CBOR codec: the encoding is the one
// EncodeCbor gives the node's value, and DecodeMstNode's fast path decodes what it accepts to the
// node DecodeMstNodeValue gives, and leaves the rest to it (same error). Nodes of a large tree,
// then every truncation and many single-byte changes of some of them.
TEST(MstNodeCodec, MstNodeDecodersAgree) {
  auto reference_encoding = [](const MstNode& node) {
    Value::Array entries;
    std::string_view prev;
    for (const MstNode::Entry& entry : node.entries) {
      const size_t prefix = MstCommonPrefixLength(prev, entry.key);
      const ByteView suffix = AsBytes(entry.key).subspan(prefix);
      Value::Map fields;
      fields.emplace_back("k", Value::BytesValue(Bytes(suffix.begin(), suffix.end())));
      fields.emplace_back("p", Value::Int(static_cast<int64_t>(prefix)));
      fields.emplace_back("t", entry.tree ? Value::Link(*entry.tree) : Value::Null());
      fields.emplace_back("v", Value::Link(entry.value));
      entries.push_back(Value::MakeMap(std::move(fields)));
      prev = entry.key;
    }
    Value::Map fields;
    fields.emplace_back("e", Value::MakeArray(std::move(entries)));
    fields.emplace_back("l", node.left ? Value::Link(*node.left) : Value::Null());
    return EncodeCbor(Value::MakeMap(std::move(fields)));
  };
  auto same = [](const Result<MstNode>& a, const Result<MstNode>& b) {
    if (a.ok() != b.ok()) return false;
    if (!a.ok()) return a.status().ToString() == b.status().ToString();
    if (a->left != b->left || a->entries.size() != b->entries.size()) return false;
    for (size_t i = 0; i < a->entries.size(); ++i) {
      const auto& x = a->entries[i];
      const auto& y = b->entries[i];
      if (x.key != y.key || x.value != y.value || x.tree != y.tree) return false;
    }
    return true;
  };
  std::vector<std::string> keys;
  for (int i = 0; i < 2000; ++i) {
    keys.push_back((i % 4 == 0 ? "app.bsky.graph.follow/" : "app.bsky.feed.like/") +
                   std::to_string(3000000 + i * 7919 % 1000000));
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<std::pair<Cid, Bytes>> nodes;
  ASSERT_TRUE(BuildMst(Entries(keys), &nodes).ok());
  ASSERT_GT(nodes.size(), 10u);
  size_t mutated = 0, refused = 0;
  for (size_t n = 0; n < nodes.size(); ++n) {
    const Bytes& bytes = nodes[n].second;
    auto node = DecodeMstNode(bytes);
    ASSERT_TRUE(node.ok()) << node.status().ToString();
    ASSERT_TRUE(same(node, DecodeMstNodeValue(bytes)));
    EXPECT_EQ(EncodeMstNode(*node), reference_encoding(*node));
    EXPECT_EQ(EncodeMstNode(*node), bytes);
    if (n % 5 != 0) continue;
    for (size_t cut = 0; cut < bytes.size(); ++cut) {
      const Bytes part(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
      ASSERT_TRUE(same(DecodeMstNode(part), DecodeMstNodeValue(part))) << cut;
    }
    for (size_t i = 0; i < bytes.size(); ++i) {
      for (uint8_t flip : {0x01, 0x20, 0x80}) {
        Bytes copy = bytes;
        copy[i] ^= flip;
        const auto fast = DecodeMstNode(copy);
        ASSERT_TRUE(same(fast, DecodeMstNodeValue(copy))) << "byte " << i << " ^ " << int(flip);
        ++mutated;
        if (!fast.ok()) ++refused;
      }
    }
  }
  EXPECT_GT(mutated, 1000u);
  EXPECT_GT(refused, 0u);
  EXPECT_LT(refused, mutated);  // some changes land in a key or a CID's digest and still decode
}

TEST(MstWalk, MissingNodesAreNamed) {
  BlockStore empty;
  const Cid root = ValueCid(77);
  Status st = WalkStatus(empty, root);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find(root.ToString()), std::string::npos) << st.ToString();

  // A tree with one child node dropped.
  std::vector<std::string> keys;
  for (int i = 0; i < 200; ++i) keys.push_back("app.bsky.feed.post/" + std::to_string(10000 + i));
  std::vector<std::pair<Cid, Bytes>> nodes;
  const Cid full_root = *BuildMst(Entries(keys), &nodes);
  ASSERT_GT(nodes.size(), 2u);
  const Cid dropped = nodes.back().first;
  BlockStore partial;
  for (size_t i = 0; i + 1 < nodes.size(); ++i) partial.Put(nodes[i].first, nodes[i].second);
  size_t seen = 0;
  st = WalkMst(partial, full_root, [&](std::string_view, const Cid&) {
    ++seen;
    return Status::OK();
  });
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find(dropped.ToString()), std::string::npos) << st.ToString();
  EXPECT_LT(seen, keys.size());
}

TEST(MstWalk, VisitorErrorStopsTheWalk) {
  BlockStore store;
  std::vector<std::string> keys;
  for (int i = 0; i < 50; ++i) keys.push_back("a.b.c/" + std::to_string(100 + i));
  const Cid root = *BuildMst(Entries(keys), &store);
  size_t seen = 0;
  Status st = WalkMst(store, root, [&](std::string_view, const Cid&) {
    return ++seen == 10 ? Status::Cancelled("enough") : Status::OK();
  });
  EXPECT_EQ(st.code(), StatusCode::kCancelled);
  EXPECT_EQ(seen, 10u);
}

TEST(MstWalk, RejectsBadStructure) {
  const std::string h0a = KeyOfHeight(0, 0);
  const std::string h0b = KeyOfHeight(0, 1);
  const std::string h1 = KeyOfHeight(1, 0);
  const std::string h2 = KeyOfHeight(2, 0);
  const Cid v = ValueCid(1);
  {
    // Keys of different heights in one node.
    BlockStore store;
    MstNode node;
    std::vector<std::string> both = {h0a, h1};
    std::sort(both.begin(), both.end());
    for (const auto& k : both) node.entries.push_back({k, v, std::nullopt});
    const Status st = WalkStatus(store, Put(&store, node));
    EXPECT_EQ(st.code(), StatusCode::kInvalid);
    EXPECT_NE(st.message().find("of height"), std::string::npos) << st.ToString();
  }
  {
    // A child two layers down instead of one.
    BlockStore store;
    MstNode leaf;
    leaf.entries.push_back({h0a, v, std::nullopt});
    MstNode root;
    root.left = h0a < h2 ? std::optional<Cid>(Put(&store, leaf)) : std::nullopt;
    root.entries.push_back(
        {h2, v, h0a < h2 ? std::nullopt : std::optional<Cid>(Put(&store, leaf))});
    const Status st = WalkStatus(store, Put(&store, root));
    EXPECT_EQ(st.code(), StatusCode::kInvalid);
    EXPECT_NE(st.message().find("sits at layer 1"), std::string::npos) << st.ToString();
  }
  {
    // A layer-0 node with a subtree.
    BlockStore store;
    MstNode child;
    child.entries.push_back({h0b, v, std::nullopt});
    MstNode root;
    root.entries.push_back({h0a, v, Put(&store, child)});
    const Status st = WalkStatus(store, Put(&store, root));
    EXPECT_EQ(st.code(), StatusCode::kInvalid);
    EXPECT_NE(st.message().find("layer 0 has a subtree"), std::string::npos) << st.ToString();
  }
  {
    // An empty subtree node.
    BlockStore store;
    MstNode empty;
    MstNode root;
    root.entries.push_back({h1, v, Put(&store, empty)});
    const Status st = WalkStatus(store, Put(&store, root));
    EXPECT_EQ(st.code(), StatusCode::kInvalid);
    EXPECT_NE(st.message().find("empty subtree"), std::string::npos) << st.ToString();
  }
  {
    // An untrimmed root: no entries, only a subtree.
    BlockStore store;
    MstNode leaf;
    leaf.entries.push_back({h0a, v, std::nullopt});
    MstNode root;
    root.left = Put(&store, leaf);
    const Status st = WalkStatus(store, Put(&store, root));
    EXPECT_EQ(st.code(), StatusCode::kInvalid);
    EXPECT_NE(st.message().find("root with no entries"), std::string::npos) << st.ToString();
  }
  {
    // Keys out of order across nodes: the left subtree holds a key greater than its parent's.
    BlockStore store;
    const std::string small_h1 = KeyOfHeight(1, 0);
    std::string big_h0;
    for (int j = 0; big_h0.empty(); ++j) {
      if (KeyOfHeight(0, j) > small_h1) big_h0 = KeyOfHeight(0, j);
    }
    MstNode leaf;
    leaf.entries.push_back({big_h0, v, std::nullopt});
    MstNode root;
    root.left = Put(&store, leaf);
    root.entries.push_back({small_h1, v, std::nullopt});
    const Status st = WalkStatus(store, Put(&store, root));
    EXPECT_EQ(st.code(), StatusCode::kInvalid);
    EXPECT_NE(st.message().find("does not sort after"), std::string::npos) << st.ToString();
  }
  {
    // A node that is not a valid node names its CID.
    BlockStore store;
    const Cid bad = store.PutBlock(EncodeCbor(Value::Int(5)));
    const Status st = WalkStatus(store, bad);
    EXPECT_EQ(st.code(), StatusCode::kInvalid);
    EXPECT_NE(st.message().find(bad.ToString()), std::string::npos) << st.ToString();
  }
}

TEST(MstProof, AbsentKeyCoversItsPath) {
  std::vector<std::string> keys;
  for (int i = 0; i < 300; ++i) keys.push_back("app.bsky.feed.post/" + std::to_string(10000 + i));
  BlockStore store;
  const Cid root = *BuildMst(Entries(keys), &store);
  std::vector<Cid> proof;
  ASSERT_TRUE(MstCoveringProof(store, root, "app.bsky.feed.post/10150x", &proof).ok());
  ASSERT_FALSE(proof.empty());
  EXPECT_EQ(proof.front(), root);
  // The proof alone is enough to show the key is absent.
  BlockStore only_proof;
  for (const Cid& cid : proof) only_proof.PutView(cid, *store.Get(cid));
  auto got = MstGet(only_proof, root, "app.bsky.feed.post/10150x");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE(got->has_value());
  // A present key: the proof shows its value.
  proof.clear();
  ASSERT_TRUE(MstCoveringProof(store, root, keys[150], &proof).ok());
  BlockStore present;
  for (const Cid& cid : proof) present.PutView(cid, *store.Get(cid));
  got = MstGet(present, root, keys[150]);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(got->has_value());
}

}  // namespace
}  // namespace atfill::atproto
