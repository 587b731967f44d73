#include "atproto/repo.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "atproto/cbor.hpp"
#include "atproto/mst.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::atproto {
namespace {

constexpr const char* kTestdata = "protocols/jetstream/data/internal/corpus/testdata/";

struct Walked {
  Status status;
  std::vector<std::pair<std::string, Cid>> records;  // path, cid
  std::vector<Bytes> bodies;
  std::vector<RecordError> errors;
};

Walked WalkAll(const RepoReader& reader) {
  Walked w;
  w.status = reader.ForEachRecord(
      [&](const RepoRecord& r) {
        w.records.emplace_back(std::string(r.collection) + "/" + std::string(r.rkey), r.cid);
        w.bodies.emplace_back(r.cbor.begin(), r.cbor.end());
        return Status::OK();
      },
      &w.errors);
  return w;
}

Value Post(const std::string& text, int i) {
  Value::Map m;
  m.emplace_back("$type", Value::String("app.bsky.feed.post"));
  m.emplace_back("text", Value::String(text));
  m.emplace_back("n", Value::Int(i));
  m.emplace_back("createdAt", Value::String("2024-01-02T03:04:05.000Z"));
  return Value::MakeMap(std::move(m));
}

// Re-packs the blocks of `car` under `root`, leaving out `skip` and adding `extra`.
Bytes Repack(ByteView car, const Cid& root, const std::set<Cid>& skip,
             const std::vector<std::pair<Cid, Bytes>>& extra = {}) {
  const Cid roots[] = {root};
  CarWriter writer(roots);
  for (const auto& [cid, bytes] : extra) EXPECT_TRUE(writer.Add(cid, bytes).ok());
  auto reader = CarReader::Open(car);
  EXPECT_TRUE(reader.ok());
  CarBlock block;
  while (*reader->Next(&block)) {
    if (!skip.contains(block.cid)) {
      EXPECT_TRUE(writer.Add(block.cid, block.data).ok());
    }
  }
  return writer.TakeBytes();
}

std::map<std::string, std::string> ReadCommitFile(const std::filesystem::path& path) {
  std::map<std::string, std::string> out;
  std::istringstream in(testing::ReadFileOrDie(path));
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(": ");
    if (colon != std::string::npos) out[line.substr(0, colon)] = line.substr(colon + 2);
  }
  return out;
}

TEST(RepoRealData, RepoCarYieldsTheExpectedRecordsAndCommit) {
  ATFILL_SHARED_PATH(car_path, std::string(kTestdata) + "repo.car");
  ATFILL_SHARED_PATH(records_path, std::string(kTestdata) + "car_expected_records.tsv");
  ATFILL_SHARED_PATH(commit_path, std::string(kTestdata) + "car_expected_commit.txt");

  auto reader = RepoReader::OpenFile(car_path);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();

  const auto expected_commit = ReadCommitFile(commit_path);
  ASSERT_EQ(expected_commit.size(), 5u);
  const Commit& commit = reader->commit();
  EXPECT_EQ(std::to_string(commit.version), expected_commit.at("ATProto Repo Spec Version"));
  EXPECT_EQ(commit.did, expected_commit.at("DID"));
  EXPECT_EQ(commit.data.ToString(), expected_commit.at("Data CID"));
  EXPECT_EQ(expected_commit.at("Prev CID"), "<nil>");
  EXPECT_FALSE(commit.prev.has_value());
  EXPECT_EQ(commit.rev, expected_commit.at("Revision"));
  EXPECT_EQ(commit.sig.size(), 64u);
  // The signed bytes are the commit block minus its sig field.
  EXPECT_EQ(Bytes(reader->unsigned_commit().begin(), reader->unsigned_commit().end()),
            EncodeUnsignedCommit(commit));
  EXPECT_EQ(EncodeSignedCommit(commit), Bytes(reader->blocks().Get(reader->commit_cid())->begin(),
                                              reader->blocks().Get(reader->commit_cid())->end()));

  std::vector<std::pair<std::string, std::string>> expected;
  {
    std::istringstream in(testing::ReadFileOrDie(records_path));
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      const size_t tab = line.find('\t');
      ASSERT_NE(tab, std::string::npos) << line;
      expected.emplace_back(line.substr(0, tab), line.substr(tab + 1));
    }
  }
  ASSERT_GT(expected.size(), 0u);
  std::sort(expected.begin(), expected.end());  // byte order, as the MST walks

  const Walked w = WalkAll(*reader);
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  EXPECT_TRUE(w.errors.empty());
  std::vector<std::pair<std::string, std::string>> got;
  for (const auto& [path, cid] : w.records) got.emplace_back(path, cid.ToString());
  EXPECT_EQ(got, expected);

  // Every record: its bytes hash to its CID, and it converts to JSON with a $type.
  size_t json_count = 0;
  Status st = reader->ForEachRecord(
      [&](const RepoRecord& r) {
        EXPECT_EQ(Cid::Compute(Cid::Codec::kDagCbor, r.cbor), r.cid);
        auto json = r.ToJson();
        EXPECT_TRUE(json.ok()) << json.status().ToString();
        if (json.ok()) {
          EXPECT_NE(json->find("\"$type\""), std::string::npos) << *json;
          ++json_count;
        }
        return Status::OK();
      },
      nullptr);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(json_count, expected.size());

  // Strict record validation finds nothing wrong in real data.
  RepoReadOptions strict;
  strict.validate_records = true;
  auto strict_reader = RepoReader::OpenFile(car_path, strict);
  ASSERT_TRUE(strict_reader.ok());
  const Walked strict_walk = WalkAll(*strict_reader);
  EXPECT_TRUE(strict_walk.status.ok());
  EXPECT_TRUE(strict_walk.errors.empty());
  EXPECT_EQ(strict_walk.records.size(), expected.size());
}

// Truncated and bit-flipped copies of repo.car: always an error or a visibly different result,
// never a crash (this test is meant to run under ASan).
TEST(RepoRealData, DamagedCopiesNeverPassAsTheOriginal) {
  ATFILL_SHARED_PATH(car_path, std::string(kTestdata) + "repo.car");
  const std::string text = testing::ReadFileOrDie(car_path);
  const Bytes car(text.begin(), text.end());
  auto original = RepoReader::Open(ByteView(car));
  ASSERT_TRUE(original.ok());
  const Walked want = WalkAll(*original);
  ASSERT_TRUE(want.status.ok());
  ASSERT_GT(want.records.size(), 0u);

  auto same_as_original = [&](const Bytes& damaged) {
    auto reader = RepoReader::Open(ByteView(damaged));
    if (!reader.ok()) {
      EXPECT_FALSE(reader.status().message().empty());
      return false;
    }
    const Walked w = WalkAll(*reader);
    return w.status.ok() && w.errors.empty() && w.records == want.records &&
           w.bodies == want.bodies && reader->commit_cid() == original->commit_cid();
  };

  size_t cases = 0;
  for (size_t cut = 0; cut < car.size(); ++cut) {
    const Bytes truncated(car.begin(), car.begin() + static_cast<std::ptrdiff_t>(cut));
    EXPECT_FALSE(same_as_original(truncated)) << "truncated at " << cut;
    ++cases;
  }
  for (size_t i = 0; i < car.size(); ++i) {
    for (uint8_t mask : {uint8_t{0xff}, uint8_t{0x04}}) {
      Bytes flipped = car;
      flipped[i] ^= mask;
      EXPECT_FALSE(same_as_original(flipped)) << "flip at " << i;
      ++cases;
    }
  }
  EXPECT_EQ(cases, car.size() * 3);
}

class RepoRoundTrip : public ::testing::TestWithParam<KeyType> {};

TEST_P(RepoRoundTrip, WriterOutputReadsBackAndVerifies) {
  auto key = PrivateKey::Generate(GetParam());
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  auto other = PrivateKey::Generate(GetParam());
  ASSERT_TRUE(other.ok());

  RepoWriter writer;
  std::map<std::string, Cid> want;
  for (int i = 0; i < 300; ++i) {
    const std::string rkey =
        "3k" + std::string(1, static_cast<char>('a' + i % 26)) + std::to_string(100000 + i * 37);
    auto cid = writer.Put("app.bsky.feed.post", rkey, Post("post number " + std::to_string(i), i));
    ASSERT_TRUE(cid.ok()) << cid.status().ToString();
    want["app.bsky.feed.post/" + rkey] = *cid;
  }
  auto like = writer.PutJson(
      "app.bsky.feed.like", "3kabc",
      R"({"$type":"app.bsky.feed.like","subject":{"uri":"at://did:plc:abc/app.bsky.feed.post/3k","cid":"bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"},"createdAt":"2024-01-01T00:00:00Z"})");
  ASSERT_TRUE(like.ok()) << like.status().ToString();
  want["app.bsky.feed.like/3kabc"] = *like;
  auto profile = writer.Put("app.bsky.actor.profile", "self", Post("profile", -1));
  ASSERT_TRUE(profile.ok());
  want["app.bsky.actor.profile/self"] = *profile;
  EXPECT_EQ(writer.size(), want.size());

  auto repo = writer.Write("did:plc:testrepowriter1234", "3kabcdefghij2", *key);
  ASSERT_TRUE(repo.ok()) << repo.status().ToString();
  EXPECT_EQ(repo->commit.version, 3);
  EXPECT_EQ(repo->commit.rev, "3kabcdefghij2");

  auto reader = RepoReader::Open(ByteView(repo->car));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(reader->commit_cid(), repo->commit_cid);
  EXPECT_EQ(reader->commit().did, "did:plc:testrepowriter1234");
  EXPECT_EQ(reader->commit().data, repo->commit.data);
  const Walked w = WalkAll(*reader);
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  EXPECT_TRUE(w.errors.empty());
  ASSERT_EQ(w.records.size(), want.size());
  size_t i = 0;
  for (const auto& [path, cid] : want) {
    EXPECT_EQ(w.records[i].first, path);
    EXPECT_EQ(w.records[i].second, cid);
    ++i;
  }

  // Signature: right key verifies, another key does not.
  EXPECT_TRUE(reader->VerifySignature(key->public_key()).ok());
  const Status wrong = reader->VerifySignature(other->public_key());
  EXPECT_FALSE(wrong.ok());
  EXPECT_NE(wrong.message().find(repo->commit_cid.ToString()), std::string::npos);

  // A tampered commit (another rev, same signature) no longer verifies with the right key.
  Commit tampered = repo->commit;
  tampered.rev = "3kabcdefghij3";
  const Bytes tampered_block = EncodeSignedCommit(tampered);
  const Cid tampered_cid = Cid::Compute(Cid::Codec::kDagCbor, tampered_block);
  const Bytes tampered_car =
      Repack(repo->car, tampered_cid, {repo->commit_cid}, {{tampered_cid, tampered_block}});
  auto tampered_reader = RepoReader::Open(ByteView(tampered_car));
  ASSERT_TRUE(tampered_reader.ok()) << tampered_reader.status().ToString();
  EXPECT_EQ(tampered_reader->commit().rev, "3kabcdefghij3");
  EXPECT_FALSE(tampered_reader->VerifySignature(key->public_key()).ok());
  // ... and so does a flipped signature byte.
  Commit bad_sig = repo->commit;
  bad_sig.sig[10] ^= 0x01;
  const Bytes bad_sig_block = EncodeSignedCommit(bad_sig);
  const Cid bad_sig_cid = Cid::Compute(Cid::Codec::kDagCbor, bad_sig_block);
  auto bad_sig_reader = RepoReader::Open(
      Repack(repo->car, bad_sig_cid, {repo->commit_cid}, {{bad_sig_cid, bad_sig_block}}));
  ASSERT_TRUE(bad_sig_reader.ok());
  EXPECT_FALSE(bad_sig_reader->VerifySignature(key->public_key()).ok());

  // The writer is deterministic up to the signature: same records, same MST root.
  auto again = writer.Write("did:plc:testrepowriter1234", "3kabcdefghij2", *other);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->commit.data, repo->commit.data);
}

INSTANTIATE_TEST_SUITE_P(Keys, RepoRoundTrip,
                         ::testing::Values(KeyType::kSecp256k1, KeyType::kP256));

TEST(RepoReader, OwnedBufferAndFileAgree) {
  auto key = PrivateKey::Generate(KeyType::kP256);
  ASSERT_TRUE(key.ok());
  RepoWriter writer;
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(writer.Put("app.bsky.feed.post", "r" + std::to_string(i), Post("x", i)).ok());
  }
  auto repo = writer.Write("did:web:example.com", "3kabcdefghij2", *key);
  ASSERT_TRUE(repo.ok());
  const Walked from_view = WalkAll(*RepoReader::Open(ByteView(repo->car)));

  // The owning overload survives moving the reader around.
  auto owned = RepoReader::Open(Bytes(repo->car));
  ASSERT_TRUE(owned.ok());
  RepoReader moved = std::move(owned).value();
  const Walked from_owned = WalkAll(moved);
  EXPECT_EQ(from_owned.records, from_view.records);
  EXPECT_EQ(from_owned.bodies, from_view.bodies);
  EXPECT_EQ(from_view.records.size(), 40u);

  const auto path = std::filesystem::temp_directory_path() /
                    ("atfill_repo_test_" +
                     std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + ".car");
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(repo->car.data()),
              static_cast<std::streamsize>(repo->car.size()));
  }
  auto from_file = RepoReader::OpenFile(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_EQ(WalkAll(*from_file).records, from_view.records);

  auto missing = RepoReader::OpenFile("/nonexistent/atfill/repo.car");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);
}

TEST(RepoReader, BlockOrderDoesNotMatter) {
  auto key = PrivateKey::Generate(KeyType::kSecp256k1);
  ASSERT_TRUE(key.ok());
  RepoWriter writer;
  for (int i = 0; i < 60; ++i) {
    ASSERT_TRUE(writer.Put("app.bsky.feed.post", "r" + std::to_string(i), Post("x", i)).ok());
  }
  auto repo = writer.Write("did:plc:abcdefghijklmnopqrstuvwx", "3kabcdefghij2", *key);
  ASSERT_TRUE(repo.ok());
  std::vector<std::pair<Cid, Bytes>> blocks;
  auto car_reader = CarReader::Open(repo->car);
  ASSERT_TRUE(car_reader.ok());
  CarBlock block;
  while (*car_reader->Next(&block))
    blocks.emplace_back(block.cid, Bytes(block.data.begin(), block.data.end()));
  ASSERT_GT(blocks.size(), 60u);
  std::reverse(blocks.begin(), blocks.end());  // records first, commit last
  const Cid roots[] = {repo->commit_cid};
  CarWriter reversed(roots);
  for (const auto& [cid, bytes] : blocks) ASSERT_TRUE(reversed.Add(cid, bytes).ok());

  auto a = RepoReader::Open(ByteView(repo->car));
  auto b = RepoReader::Open(reversed.bytes());
  ASSERT_TRUE(a.ok() && b.ok());
  const Walked wa = WalkAll(*a);
  const Walked wb = WalkAll(*b);
  ASSERT_TRUE(wb.status.ok()) << wb.status.ToString();
  EXPECT_EQ(wb.records.size(), 60u);
  EXPECT_EQ(wa.records, wb.records);
  EXPECT_EQ(wa.bodies, wb.bodies);
  EXPECT_TRUE(b->VerifySignature(key->public_key()).ok());
}

TEST(RepoReader, MissingRecordBlocksAreReportedPerRecord) {
  auto key = PrivateKey::Generate(KeyType::kSecp256k1);
  ASSERT_TRUE(key.ok());
  RepoWriter writer;
  std::vector<Cid> cids;
  for (int i = 0; i < 30; ++i) {
    cids.push_back(*writer.Put("app.bsky.feed.post", "r" + std::to_string(100 + i), Post("p", i)));
  }
  auto repo = writer.Write("did:plc:abcdefghijklmnopqrstuvwx", "3kabcdefghij2", *key);
  ASSERT_TRUE(repo.ok());
  const Bytes car = Repack(repo->car, repo->commit_cid, {cids[5], cids[17]});

  auto reader = RepoReader::Open(ByteView(car));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const Walked w = WalkAll(*reader);
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  EXPECT_EQ(w.records.size(), 28u);
  ASSERT_EQ(w.errors.size(), 2u);
  EXPECT_EQ(w.errors[0].path, "app.bsky.feed.post/r105");
  EXPECT_EQ(w.errors[0].cid, cids[5]);
  EXPECT_EQ(w.errors[0].status.code(), StatusCode::kNotFound);
  EXPECT_NE(w.errors[0].status.message().find(cids[5].ToString()), std::string::npos);
  EXPECT_EQ(w.errors[1].path, "app.bsky.feed.post/r117");

  // Without an error list the first missing record ends the walk.
  size_t seen = 0;
  const Status st = reader->ForEachRecord(
      [&](const RepoRecord&) {
        ++seen;
        return Status::OK();
      },
      nullptr);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(seen, 5u);

  // A missing MST node fails the walk and names the node.
  const Bytes no_root = Repack(repo->car, repo->commit_cid, {repo->commit.data});
  auto broken = RepoReader::Open(ByteView(no_root));
  ASSERT_TRUE(broken.ok());
  const Walked bw = WalkAll(*broken);
  EXPECT_EQ(bw.status.code(), StatusCode::kNotFound);
  EXPECT_NE(bw.status.message().find(repo->commit.data.ToString()), std::string::npos);

  // A missing commit block fails Open.
  const Bytes no_commit = Repack(repo->car, repo->commit_cid, {repo->commit_cid});
  auto no_commit_reader = RepoReader::Open(ByteView(no_commit));
  ASSERT_FALSE(no_commit_reader.ok());
  EXPECT_EQ(no_commit_reader.status().code(), StatusCode::kNotFound);
}

TEST(RepoReader, ValidateRecordsFlagsUndecodableRecords) {
  auto key = PrivateKey::Generate(KeyType::kP256);
  ASSERT_TRUE(key.ok());
  // Built by hand: the writer refuses such records.
  BlockStore records;
  const Cid good = records.PutBlock(EncodeCbor(Post("ok", 1)));
  const Cid not_map = records.PutBlock(EncodeCbor(Value::Int(5)));
  Value::Map no_type_map;
  no_type_map.emplace_back("text", Value::String("no type"));
  const Cid no_type = records.PutBlock(EncodeCbor(Value::MakeMap(no_type_map)));
  const Bytes garbage = {0xff, 0x00};
  const Cid not_cbor = records.PutBlock(garbage);
  std::vector<MstEntry> entries = {{"app.bsky.feed.post/a", good},
                                   {"app.bsky.feed.post/b", not_map},
                                   {"app.bsky.feed.post/c", no_type},
                                   {"app.bsky.feed.post/d", not_cbor}};
  std::vector<std::pair<Cid, Bytes>> nodes;
  auto data = BuildMst(entries, &nodes);
  ASSERT_TRUE(data.ok());
  Commit commit;
  commit.did = "did:plc:abcdefghijklmnopqrstuvwx";
  commit.data = *data;
  commit.rev = "3kabcdefghij2";
  auto commit_block = SignCommit(&commit, *key);
  ASSERT_TRUE(commit_block.ok());
  const Cid commit_cid = Cid::Compute(Cid::Codec::kDagCbor, *commit_block);
  const Cid roots[] = {commit_cid};
  CarWriter car(roots);
  ASSERT_TRUE(car.Add(commit_cid, *commit_block).ok());
  for (const auto& [cid, bytes] : nodes) ASSERT_TRUE(car.Add(cid, bytes).ok());
  records.ForEach([&](const Cid& cid, ByteView bytes) { ASSERT_TRUE(car.Add(cid, bytes).ok()); });

  auto lax = RepoReader::Open(car.bytes());
  ASSERT_TRUE(lax.ok()) << lax.status().ToString();
  EXPECT_TRUE(lax->VerifySignature(key->public_key()).ok());
  const Walked lw = WalkAll(*lax);
  EXPECT_TRUE(lw.status.ok());
  EXPECT_EQ(lw.records.size(), 4u);

  RepoReadOptions strict;
  strict.validate_records = true;
  auto checked = RepoReader::Open(car.bytes(), strict);
  ASSERT_TRUE(checked.ok());
  const Walked cw = WalkAll(*checked);
  EXPECT_TRUE(cw.status.ok());
  ASSERT_EQ(cw.records.size(), 1u);
  EXPECT_EQ(cw.records[0].first, "app.bsky.feed.post/a");
  ASSERT_EQ(cw.errors.size(), 3u);
  EXPECT_EQ(cw.errors[0].path, "app.bsky.feed.post/b");
  EXPECT_EQ(cw.errors[1].path, "app.bsky.feed.post/c");
  EXPECT_EQ(cw.errors[2].path, "app.bsky.feed.post/d");
  for (const RecordError& e : cw.errors) EXPECT_FALSE(e.status.ok());
}

Bytes CommitBlock(const std::vector<std::pair<std::string, Value>>& fields) {
  return EncodeCbor(Value::MakeMap(Value::Map(fields.begin(), fields.end())));
}

TEST(Commit, DecodeChecksFields) {
  const Cid data = Cid::Compute(Cid::Codec::kDagCbor, AsBytes("data"));
  auto base = [&] {
    return std::vector<std::pair<std::string, Value>>{
        {"did", Value::String("did:plc:abcdefghijklmnopqrstuvwx")},
        {"version", Value::Int(3)},
        {"data", Value::Link(data)},
        {"rev", Value::String("3kabcdefghij2")},
        {"prev", Value::Null()},
        {"sig", Value::BytesValue(Bytes(64, 7))},
    };
  };
  auto with = [&](const std::string& name, std::optional<Value> value) {
    auto fields = base();
    std::erase_if(fields, [&](const auto& f) { return f.first == name; });
    if (value) fields.emplace_back(name, *value);
    return CommitBlock(fields);
  };

  Bytes unsigned_bytes;
  auto ok = DecodeCommit(CommitBlock(base()), &unsigned_bytes);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->data, data);
  EXPECT_EQ(unsigned_bytes, EncodeUnsignedCommit(*ok));

  EXPECT_EQ(DecodeCommit(with("version", Value::Int(4))).status().code(), StatusCode::kUnsupported);
  EXPECT_FALSE(DecodeCommit(with("version", std::nullopt)).ok());
  EXPECT_FALSE(DecodeCommit(with("sig", std::nullopt)).ok());
  EXPECT_FALSE(DecodeCommit(with("sig", Value::String("x"))).ok());
  EXPECT_FALSE(DecodeCommit(with("did", Value::String("not a did"))).ok());
  EXPECT_FALSE(DecodeCommit(with("did", std::nullopt)).ok());
  EXPECT_FALSE(DecodeCommit(with("data", Value::Null())).ok());
  EXPECT_FALSE(DecodeCommit(with("rev", Value::String("nottid"))).ok());
  EXPECT_FALSE(DecodeCommit(with("rev", std::nullopt)).ok());
  EXPECT_FALSE(DecodeCommit(with("prev", Value::Int(1))).ok());
  EXPECT_FALSE(DecodeCommit(EncodeCbor(Value::MakeArray())).ok());
  EXPECT_FALSE(DecodeCommit(Bytes{0xa1}).ok());

  // prev may be absent or a link.
  EXPECT_TRUE(DecodeCommit(with("prev", std::nullopt)).ok());
  auto linked = DecodeCommit(with("prev", Value::Link(data)));
  ASSERT_TRUE(linked.ok());
  EXPECT_EQ(linked->prev, data);

  // Version 2 without a rev is accepted.
  {
    auto fields = base();
    std::erase_if(fields, [](const auto& f) { return f.first == "rev" || f.first == "version"; });
    fields.emplace_back("version", Value::Int(2));
    auto v2 = DecodeCommit(CommitBlock(fields));
    ASSERT_TRUE(v2.ok()) << v2.status().ToString();
    EXPECT_EQ(v2->version, 2);
    EXPECT_TRUE(v2->rev.empty());
  }

  // Unknown fields stay in the signed bytes.
  {
    auto fields = base();
    fields.emplace_back("extra", Value::String("kept"));
    Bytes signed_part;
    auto extra = DecodeCommit(CommitBlock(fields), &signed_part);
    ASSERT_TRUE(extra.ok());
    auto value = DecodeCbor(signed_part);
    ASSERT_TRUE(value.ok());
    EXPECT_NE(value->Find("extra"), nullptr);
    EXPECT_EQ(value->Find("sig"), nullptr);
  }
}

TEST(RepoWriter, RejectsBadPathsAndRecords) {
  RepoWriter writer;
  EXPECT_FALSE(writer.Put("not an nsid", "abc", Post("x", 1)).ok());
  EXPECT_FALSE(writer.Put("app.bsky.feed.post", "..", Post("x", 1)).ok());
  EXPECT_FALSE(writer.Put("app.bsky.feed.post", "a/b", Post("x", 1)).ok());
  EXPECT_FALSE(writer.Put("app.bsky.feed.post", "abc", Value::Int(1)).ok());
  Value::Map no_type;
  no_type.emplace_back("text", Value::String("x"));
  EXPECT_FALSE(writer.Put("app.bsky.feed.post", "abc", Value::MakeMap(no_type)).ok());
  EXPECT_FALSE(writer.PutJson("app.bsky.feed.post", "abc", "{not json").ok());
  EXPECT_EQ(writer.size(), 0u);

  auto first = writer.Put("app.bsky.feed.post", "abc", Post("x", 1));
  auto second = writer.Put("app.bsky.feed.post", "abc", Post("y", 2));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(*first, *second);
  EXPECT_EQ(writer.size(), 1u);  // replaced
  EXPECT_EQ(writer.Delete("app.bsky.feed.post", "nope").code(), StatusCode::kNotFound);
  EXPECT_TRUE(writer.Delete("app.bsky.feed.post", "abc").ok());
  EXPECT_EQ(writer.size(), 0u);

  auto key = PrivateKey::Generate(KeyType::kP256);
  ASSERT_TRUE(key.ok());
  EXPECT_FALSE(writer.Write("nodid", "3kabcdefghij2", *key).ok());
  EXPECT_FALSE(writer.Write("did:plc:abc", "notatid", *key).ok());
  // An empty repository is fine: the empty MST.
  auto empty = writer.Write("did:plc:abc", "3kabcdefghij2", *key);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(empty->commit.data.ToString(),
            "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm");
  auto reader = RepoReader::Open(ByteView(empty->car));
  ASSERT_TRUE(reader.ok());
  EXPECT_TRUE(WalkAll(*reader).records.empty());
}

}  // namespace
}  // namespace atfill::atproto
