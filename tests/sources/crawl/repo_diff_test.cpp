// ReadRepoDiff (sources/crawl/repo_diff.hpp): a getRepo?since answer (the blocks of the new repo
// that the old one did not have) applied to the stored records of the old repo gives exactly the
// creates, updates and deletes between them.
#include "sources/crawl/repo_diff.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "atproto/car.hpp"
#include "atproto/crypto.hpp"
#include "atproto/json.hpp"
#include "atproto/repo.hpp"
#include "base/bytes.hpp"

namespace atfill::sources {
namespace {

constexpr const char* kDid = "did:plc:abcdefghijklmnopqrstuvwx";
const std::vector<std::string> kCollections = {"app.bsky.feed.like", "app.bsky.feed.post"};

// A repo as its records: MST key -> record JSON.
using Records = std::map<std::string, std::string>;

std::string Json(const std::string& collection, const std::string& text) {
  return "{\"$type\":\"" + collection + "\",\"text\":\"" + text + "\"}";
}

atproto::WrittenRepo Write(const Records& records, const std::string& rev,
                           const atproto::PrivateKey& key) {
  atproto::RepoWriter writer;
  for (const auto& [k, json] : records) {
    const size_t slash = k.find('/');
    EXPECT_TRUE(writer.PutJson(k.substr(0, slash), k.substr(slash + 1), json).ok()) << k;
  }
  auto written = writer.Write(kDid, rev, key);
  EXPECT_TRUE(written.ok()) << written.status().ToString();
  return std::move(written).value();
}

// The CAR a PDS answers getRepo?since=<old rev> with: the new commit, and the new repo's blocks
// that the old repo did not hold.
std::string SinceCar(const atproto::WrittenRepo& before, const atproto::WrittenRepo& after) {
  std::set<atproto::Cid> old;
  auto r = atproto::CarReader::Open(before.car);
  EXPECT_TRUE(r.ok());
  atproto::CarBlock b;
  while (*r->Next(&b)) old.insert(b.cid);
  auto n = atproto::CarReader::Open(after.car);
  EXPECT_TRUE(n.ok());
  atproto::CarWriter w(n->roots());
  while (*n->Next(&b)) {
    if (!old.count(b.cid)) {
      EXPECT_TRUE(w.Add(b.cid, b.data).ok());
    }
  }
  return std::string(AsChars(w.bytes()));
}

// The stored rows of a repo: its records with their CIDs.
std::vector<pipeline::StoredRecord> Stored(const atproto::WrittenRepo& repo) {
  std::vector<pipeline::StoredRecord> out;
  auto reader = atproto::RepoReader::Open(ByteView(repo.car));
  EXPECT_TRUE(reader.ok());
  EXPECT_TRUE(reader
                  ->ForEachRecord(
                      [&](const atproto::RepoRecord& r) {
                        out.push_back({std::string(r.collection), std::string(r.rkey),
                                       r.cid.ToString(), repo.commit.rev});
                        return Status::OK();
                      },
                      nullptr)
                  .ok());
  return out;
}

using Change = std::tuple<std::string, std::string, std::string>;  // op, key, cid ("" for deletes)

std::set<Change> Changes(const RepoDiff& diff) {
  std::set<Change> out;
  for (const pipeline::RecordEvent& e : diff.events) {
    out.insert({std::string(pipeline::OperationName(e.operation)), e.collection + "/" + e.rkey,
                e.operation == pipeline::Operation::kDelete ? "" : e.cid.ToString()});
  }
  return out;
}

std::map<std::string, std::string> Cids(const atproto::WrittenRepo& repo) {
  std::map<std::string, std::string> out;
  for (const pipeline::StoredRecord& s : Stored(repo)) out[s.collection + "/" + s.rkey] = s.cid;
  return out;
}

// What changed from `before` to `after`, as ReadRepoDiff should name it.
std::set<Change> Expected(const atproto::WrittenRepo& before, const atproto::WrittenRepo& after) {
  const auto old_cids = Cids(before), new_cids = Cids(after);
  std::set<Change> out;
  for (const auto& [k, cid] : new_cids) {
    auto it = old_cids.find(k);
    if (it == old_cids.end()) {
      out.insert({"create", k, cid});
    } else if (it->second != cid) {
      out.insert({"update", k, cid});
    }
  }
  for (const auto& [k, cid] : old_cids) {
    if (!new_cids.count(k)) out.insert({"delete", k, ""});
  }
  return out;
}

// What only one side holds, for a readable failure; "" when equal.
std::string Diff(const std::set<Change>& got, const std::set<Change>& want) {
  std::string out;
  for (const Change& c : got) {
    if (!want.count(c)) out += "unexpected " + std::get<0>(c) + " " + std::get<1>(c) + "\n";
  }
  for (const Change& c : want) {
    if (!got.count(c)) out += "missing " + std::get<0>(c) + " " + std::get<1>(c) + "\n";
  }
  return out;
}

atproto::PrivateKey Key() {
  auto key = atproto::PrivateKey::Generate(atproto::KeyType::kP256);
  EXPECT_TRUE(key.ok());
  return std::move(key).value();
}

TEST(RepoDiffTest, SinceAnswerGivesExactlyTheCreatesUpdatesAndDeletes) {
  const atproto::PrivateKey key = Key();
  const std::string pub = key.public_key().ToMultibase();
  int needs_full = 0;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    Records records;
    for (int i = 0; i < 400; ++i) {
      const std::string& c = kCollections[i % 2];
      records[c + "/r" + std::to_string(100000 + i)] = Json(c, "v" + std::to_string(i));
    }
    const atproto::WrittenRepo before = Write(records, "3kaaaaaaaaa22", key);
    // 0.5% to 7% of each kind of change.
    const int changes = 2 + static_cast<int>(seed % 10) * 3;
    std::vector<std::string> keys;
    for (const auto& [k, v] : records) keys.push_back(k);
    std::shuffle(keys.begin(), keys.end(), rng);
    for (int i = 0; i < changes; ++i) records.erase(keys[i]);
    for (int i = changes; i < 2 * changes; ++i) {
      records[keys[i]] = Json(keys[i].substr(0, keys[i].find('/')), "changed" + keys[i]);
    }
    for (int i = 0; i < changes; ++i) {
      const std::string& c = kCollections[i % 2];
      records[c + "/n" + std::to_string(rng() % 1000000)] = Json(c, "new" + std::to_string(i));
    }
    const atproto::WrittenRepo after = Write(records, "3kaaaaaaaab22", key);
    const std::string car = SinceCar(before, after);
    ASSERT_LT(car.size(), after.car.size());

    RepoFailure failure = RepoFailure::kBadRepo;
    auto diff = ReadRepoDiff(kDid, pub, car, Stored(before), {}, {}, &failure);
    ASSERT_TRUE(diff.ok()) << diff.status().ToString();
    EXPECT_EQ(failure, RepoFailure::kNone);
    EXPECT_FALSE(diff->unchanged);
    EXPECT_TRUE(diff->errors.empty());
    // Whatever the answer tells, it never deletes a key the new repo holds nor writes a wrong CID.
    const std::set<Change> truth = Expected(before, after);
    for (const Change& c : Changes(*diff)) EXPECT_EQ(truth.count(c), 1u) << std::get<1>(c);
    if (diff->needs_full) {
      // A subtree unchanged since REV that moved: the caller fetches the whole repo.
      ++needs_full;
      continue;
    }
    EXPECT_EQ(diff->rev, "3kaaaaaaaab22");
    EXPECT_EQ(diff->commit_cid, after.commit_cid.ToString());
    EXPECT_EQ(Diff(Changes(*diff), Expected(before, after)), "");
    for (const pipeline::RecordEvent& e : diff->events) {
      EXPECT_EQ(e.rev, "3kaaaaaaaab22");
      EXPECT_EQ(e.did, kDid);
      if (e.operation != pipeline::Operation::kDelete) {
        auto body_cid = atproto::CidOfRecord(e.body);
        ASSERT_TRUE(body_cid.ok()) << e.body;
        EXPECT_EQ(*body_cid, e.cid) << e.body;
      }
    }

    // One collection only: the other's changes are left out.
    auto posts = ReadRepoDiff(kDid, pub, car, Stored(before), {"app.bsky.feed.post"}, {});
    ASSERT_TRUE(posts.ok()) << posts.status().ToString();
    std::set<Change> want_posts;
    for (const Change& c : Expected(before, after)) {
      if (std::get<1>(c).starts_with("app.bsky.feed.post/")) want_posts.insert(c);
    }
    EXPECT_EQ(Diff(Changes(*posts), want_posts), "");

    // A PDS that ignores since sends the whole repo: the same changes.
    auto whole = ReadRepoDiff(kDid, pub, std::string(AsChars(after.car)), Stored(before), {}, {});
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    EXPECT_EQ(Diff(Changes(*whole), Expected(before, after)), "");
  }
  // The answer alone settles all but 2 of these 40 (deletes on both sides of a deleted key next to
  // an unchanged subtree whose place it joined: those ask for the whole repo).
  EXPECT_LE(needs_full, 2);
  EXPECT_GE(needs_full, 1);
}

TEST(RepoDiffTest, HeaderOnlyAnswerIsUnchanged) {
  const atproto::PrivateKey key = Key();
  Records records = {{"app.bsky.feed.post/a", Json("app.bsky.feed.post", "x")}};
  const atproto::WrittenRepo repo = Write(records, "3kaaaaaaaaa22", key);
  atproto::CarWriter w(std::vector<atproto::Cid>{repo.commit_cid});
  auto diff = ReadRepoDiff(kDid, key.public_key().ToMultibase(), std::string(AsChars(w.bytes())),
                           Stored(repo), {}, {});
  ASSERT_TRUE(diff.ok()) << diff.status().ToString();
  EXPECT_TRUE(diff->unchanged);
  EXPECT_TRUE(diff->events.empty());
}

TEST(RepoDiffTest, ANewKeyWhoseRecordIsNotSentAsksForTheWholeRepo) {
  const atproto::PrivateKey key = Key();
  Records records;
  for (int i = 0; i < 50; ++i) {
    records["app.bsky.feed.post/r" + std::to_string(i)] = Json("app.bsky.feed.post", "same");
  }
  // Every record has the same bytes, so the new key's block is one the old repo already had.
  records.erase("app.bsky.feed.post/r7");
  const atproto::WrittenRepo before = Write(records, "3kaaaaaaaaa22", key);
  records["app.bsky.feed.post/r7"] = Json("app.bsky.feed.post", "same");
  const atproto::WrittenRepo after = Write(records, "3kaaaaaaaab22", key);
  auto diff = ReadRepoDiff(kDid, key.public_key().ToMultibase(), SinceCar(before, after),
                           Stored(before), {}, {});
  ASSERT_TRUE(diff.ok()) << diff.status().ToString();
  EXPECT_TRUE(diff->needs_full);
  EXPECT_TRUE(Changes(*diff).empty());
}

TEST(RepoDiffTest, SignedWithAnotherKeyFails) {
  const atproto::PrivateKey key = Key();
  const atproto::PrivateKey other = Key();
  Records records = {{"app.bsky.feed.post/a", Json("app.bsky.feed.post", "x")}};
  const atproto::WrittenRepo before = Write(records, "3kaaaaaaaaa22", key);
  records["app.bsky.feed.post/b"] = Json("app.bsky.feed.post", "y");
  const atproto::WrittenRepo after = Write(records, "3kaaaaaaaab22", key);
  RepoFailure failure = RepoFailure::kNone;
  auto diff = ReadRepoDiff(kDid, other.public_key().ToMultibase(), SinceCar(before, after),
                           Stored(before), {}, {}, &failure);
  EXPECT_FALSE(diff.ok());
  EXPECT_EQ(failure, RepoFailure::kBadSignature);
  EXPECT_NE(diff.status().message().find(kDid), std::string::npos) << diff.status().ToString();
}

}  // namespace
}  // namespace atfill::sources
