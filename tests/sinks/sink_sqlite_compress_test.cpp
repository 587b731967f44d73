// The SQLite sink's compressed bodies (schema version 3) and the binary CIDs beside them
// (version 4): every body and CID reads back byte for byte through the view, the reader and the
// loadable extension; a collection's dictionary commits with the first rows that need it or not at
// all (a failed batch, a SIGKILL); compressed and text rows mix across reopens and `compress`
// settings; version 2 and 3 databases migrate without rewriting a row.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "sinks/sqlite_reader.hpp"
#include "sinks/sqlite_sink.hpp"
#include "tests/common/process.hpp"
#include "tests/common/raw_sqlite.hpp"
#include "tests/common/sink_conformance.hpp"
#include "tests/common/sqlite_fixtures.hpp"

namespace atfill::sinks {
namespace {

using pipeline::Event;
using testing::MakeCreate;
using testing::RawDb;

constexpr const char* kAlice = "did:plc:alice2ixhq5mvvcy4ygqtfp";
constexpr const char* kLike = "app.bsky.feed.like";
constexpr const char* kPost = "app.bsky.feed.post";
constexpr size_t kSamples = 20;

std::string RandomText(std::mt19937_64& rng, size_t n, std::string_view alphabet) {
  std::string out(n, ' ');
  for (char& c : out) c = alphabet[rng() % alphabet.size()];
  return out;
}

// A like as the network writes it: its subject's CID and URI are random to a compressor.
std::string LikeBody(uint64_t seed) {
  std::mt19937_64 rng(seed);
  constexpr std::string_view kBase32 = "abcdefghijklmnopqrstuvwxyz234567";
  return R"({"$type":"app.bsky.feed.like","createdAt":"2024-0)" + std::to_string(1 + seed % 9) +
         "-1" + std::to_string(seed % 10) + "T0" + std::to_string(seed % 10) +
         R"(:12:34.567Z","subject":{"cid":"bafyrei)" + RandomText(rng, 52, kBase32) +
         R"(","uri":"at://did:plc:)" + RandomText(rng, 24, kBase32) + R"(/app.bsky.feed.post/3k)" +
         RandomText(rng, 11, kBase32) + R"("}})";
}

std::string Rkey(const std::string& prefix, size_t i) {
  std::string n = std::to_string(i);
  return prefix + std::string(6 - std::min<size_t>(6, n.size()), '0') + n;
}

// `n` likes with record keys prefix000000...; their bodies are LikeBody(seed + i).
std::vector<Event> Likes(const std::string& prefix, size_t n, uint64_t seed) {
  std::vector<Event> batch;
  for (size_t i = 0; i < n; ++i) {
    batch.push_back(MakeCreate(kAlice, kLike, Rkey(prefix, i), LikeBody(seed + i)));
  }
  return batch;
}

class SqliteCompressTest : public ::testing::Test {
 protected:
  SqliteCompressTest() {
    options_.path = Path();
    options_.compress = true;
    options_.dictionary_samples = kSamples;
  }
  std::string Path() const { return (dir_.path() / "atfill.db").string(); }
  std::unique_ptr<pipeline::Sink> MustOpen() {
    auto sink = OpenSqliteSink(options_);
    EXPECT_TRUE(sink.ok()) << sink.status().ToString();
    return sink.ok() ? std::move(sink).value() : nullptr;
  }
  void MustWrite(pipeline::Sink& sink, const std::vector<Event>& batch) {
    auto stats = sink.Write(batch);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    for (const Event& e : batch) {
      const auto& r = std::get<pipeline::RecordEvent>(e);
      want_[r.Uri()] = r.body;
    }
  }
  // Every record through the reader (the view, atfill_json) equals the body written.
  void ExpectAllExact() {
    auto rows = ReadAllRecords(Path());
    ASSERT_TRUE(rows.ok()) << rows.status().ToString();
    std::map<std::string, std::string> got;
    for (const RecordRow& r : *rows) got[r.uri] = r.record;
    ASSERT_EQ(got.size(), want_.size());
    for (const auto& [uri, body] : want_) {
      ASSERT_EQ(got[uri].size(), body.size()) << uri;
      EXPECT_TRUE(got[uri] == body) << uri;
    }
  }
  // How the rows of a collection are stored: "text" or "blob", in record key order.
  std::vector<std::string> Storage(const std::string& collection) {
    return RawDb(Path()).Column(
        "SELECT typeof(r.record) FROM atfill_record_rows r JOIN atfill_collections c ON c.id = "
        "r.collection_id WHERE c.nsid = '" +
        collection + "' ORDER BY r.rkey");
  }
  std::vector<std::string> Dictionaries() {
    return RawDb(Path()).Column(
        "SELECT d.id || ' ' || c.nsid || ' ' || d.samples FROM atfill_dicts d JOIN "
        "atfill_collections c ON c.id = d.collection_id ORDER BY d.id");
  }
  // Whether the view reads through atfill_json and atfill_cid (fails the test if through one only).
  bool ViewDecodes() {
    auto calls = [&](const char* function) {
      return RawDb(Path())
                 .Column(
                     "SELECT count(*) FROM sqlite_schema WHERE name = 'atfill_records' AND "
                     "instr(sql, '" +
                     std::string(function) + "(')")
                 .at(0) == "1";
    };
    const bool json = calls("atfill_json");
    EXPECT_EQ(calls("atfill_cid"), json);
    return json;
  }
  // Every row's CID is stored as its body is: text beside text, 36 binary bytes beside a zstd
  // frame; and the view gives each row the CID of its body, as text.
  void ExpectCidsFollowBodies() {
    RawDb db(Path());
    EXPECT_EQ(db.Column("SELECT count(*) FROM atfill_record_rows WHERE NOT ((typeof(record) = "
                        "'text' AND typeof(cid) = 'text') OR (typeof(record) = 'blob' AND "
                        "typeof(cid) = 'blob' AND length(cid) = 36))"),
              std::vector<std::string>{"0"});
    const std::vector<std::string> uris = db.Column("SELECT uri FROM atfill_records ORDER BY uri");
    const std::vector<std::string> cids = db.Column("SELECT cid FROM atfill_records ORDER BY uri");
    ASSERT_EQ(uris.size(), want_.size());
    ASSERT_EQ(cids.size(), uris.size());
    for (size_t i = 0; i < uris.size(); ++i) {
      EXPECT_EQ(cids[i], testing::CidOf(want_[uris[i]])) << uris[i];
    }
  }

  testing::TempDir dir_;
  SqliteSinkOptions options_;
  std::map<std::string, std::string> want_;  // uri -> body
};

std::vector<std::string> Repeat(const std::string& value, size_t n) {
  return std::vector<std::string>(n, value);
}

// A collection's first kSamples - 1 bodies stay text; the kSamples-th trains its dictionary and
// is stored compressed, as are the ones after; odd bodies (unicode, escapes, whitespace, tiny and
// large ones) read back exactly, stored compressed or, when a frame would not be smaller, as text.
TEST_F(SqliteCompressTest, EveryBodyReadsBackExactly) {
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  MustWrite(*sink, Likes("a", 60, 1));
  std::vector<std::string> want_storage = Repeat("text", kSamples - 1);
  for (const std::string& s : Repeat("blob", 60 - kSamples + 1)) want_storage.push_back(s);
  EXPECT_EQ(Storage(kLike), want_storage);
  EXPECT_EQ(Dictionaries(), std::vector<std::string>{"1 app.bsky.feed.like 20"});
  EXPECT_TRUE(ViewDecodes());

  std::mt19937_64 rng(7);
  std::vector<std::string> odd = {
      "{}",
      R"({"text":"héllo wörld 日本語 🎉 Ωμέγα","langs":["ja","el"]})",
      R"({"text":"escapes \u0000 \ud83d\ude00 \" \\ \/ \n\t"})",
      " { \"b\" : 1 ,\n \"a\" : [ 1 , 2 , { \"c\" : null } ] } ",
      R"({"text":")" + RandomText(rng, 300 << 10, "abcdefghijklmnopqrstuvwxyz ") + "\"}",
      R"({"text":")" + std::string(3 << 20, 'z') + "\"}",
      "x",
  };
  std::vector<Event> posts;
  for (size_t i = 0; i < kSamples; ++i) {
    posts.push_back(MakeCreate(kAlice, kPost, Rkey("p", i),
                               R"({"$type":"app.bsky.feed.post","text":"post number )" +
                                   std::to_string(i * 7919) + R"(","createdAt":"2024-01-01"})"));
  }
  for (size_t i = 0; i < odd.size(); ++i) {
    posts.push_back(MakeCreate(kAlice, kPost, Rkey("q", i), odd[i]));
  }
  MustWrite(*sink, posts);
  ExpectAllExact();
  ExpectCidsFollowBodies();
  // "{}" and "x" are smaller as text than as a frame; the large bodies compress.
  const std::vector<std::string> storage = Storage(kPost);
  ASSERT_EQ(storage.size(), kSamples + odd.size());
  EXPECT_EQ(storage[kSamples], "text");
  EXPECT_EQ(storage[kSamples + 4], "blob");
  EXPECT_EQ(storage[kSamples + 5], "blob");
  EXPECT_EQ(storage[kSamples + 6], "text");
  // SQL through the view sees the text: JSON functions, lengths, comparisons.
  RawDb db(Path());
  const std::string like = LikeBody(60);
  const size_t uri_at = like.find("at://did:plc:");
  EXPECT_EQ(db.Column("SELECT json_extract(record, '$.subject.uri') FROM atfill_records WHERE "
                      "rkey = 'a000059'"),
            std::vector<std::string>{like.substr(uri_at, like.find('"', uri_at) - uri_at)});
  EXPECT_EQ(db.Column("SELECT json_extract(record, '$.text') FROM atfill_records WHERE rkey = "
                      "'q000001'"),
            std::vector<std::string>{"héllo wörld 日本語 🎉 Ωμέγα"});
  EXPECT_EQ(db.Column("SELECT length(record) FROM atfill_records WHERE rkey = 'q000005'"),
            std::vector<std::string>{std::to_string((3 << 20) + 11)});
  // The record reader the stages use gives the same text.
  auto read = SqliteRecordReader(Path());
  const std::string uri = "at://" + std::string(kAlice) + "/" + kLike + "/a000042";
  auto one = read(uri);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  ASSERT_TRUE(one->has_value());
  EXPECT_EQ(**one, want_[uri]);
  // Compressed rows take less room than their text.
  EXPECT_LT(std::stoll(db.Column("SELECT sum(length(record)) FROM atfill_record_rows WHERE "
                                 "typeof(record) = 'blob' AND rkey LIKE 'a%'")
                           .at(0)),
            std::stoll(db.Column("SELECT sum(length(record)) FROM atfill_records WHERE rkey "
                                 ">= 'a000019' AND rkey LIKE 'a%'")
                           .at(0)) /
                2);
}

// Updates replace a compressed body with a compressed body of the new text; reopening with
// compress off stores text beside the compressed rows, and on again uses the stored dictionary.
TEST_F(SqliteCompressTest, CompressedAndTextRowsMixAcrossReopens) {
  {
    auto sink = MustOpen();
    ASSERT_NE(sink, nullptr);
    MustWrite(*sink, Likes("a", 30, 100));
    std::vector<Event> updates;
    for (size_t i = 25; i < 30; ++i) {
      updates.push_back(testing::MakeUpdate(kAlice, kLike, Rkey("a", i), LikeBody(1000 + i)));
    }
    MustWrite(*sink, updates);
  }
  options_.compress = false;
  {
    auto sink = MustOpen();
    ASSERT_NE(sink, nullptr);
    MustWrite(*sink, Likes("b", 10, 200));
  }
  options_.compress = true;
  {
    auto sink = MustOpen();
    ASSERT_NE(sink, nullptr);
    MustWrite(*sink, Likes("c", 5, 300));
  }
  std::vector<std::string> want = Repeat("text", kSamples - 1);
  for (const auto& part :
       {Repeat("blob", 30 - kSamples + 1), Repeat("text", 10), Repeat("blob", 5)}) {
    want.insert(want.end(), part.begin(), part.end());
  }
  EXPECT_EQ(Storage(kLike), want);
  EXPECT_EQ(Dictionaries(), std::vector<std::string>{"1 app.bsky.feed.like 20"});
  ExpectAllExact();
  ExpectCidsFollowBodies();
}

// The rev guard reads a binary CID as the CID it is: the same body again is unchanged (its newer
// rev raised in place), another body an update, an older rev stale, a delete removes the row; the
// reader's listing of a repo (what verify compares with a PDS) gives the CIDs as text.
TEST_F(SqliteCompressTest, TheGuardAndTheReaderReadBinaryCids) {
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  MustWrite(*sink, Likes("a", 30, 1));
  ASSERT_EQ(
      RawDb(Path()).Column("SELECT typeof(cid) FROM atfill_record_rows WHERE rkey = 'a000025'"),
      std::vector<std::string>{"blob"});
  const std::string same = LikeBody(1 + 25);
  const std::string other = LikeBody(5000);
  auto again = sink->Write(
      std::vector<Event>{MakeCreate(kAlice, kLike, Rkey("a", 25), same, "3kzzzzzzzzz2a")});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->unchanged, 1u);
  EXPECT_EQ(again->updated, 0u);
  EXPECT_EQ(RawDb(Path()).Column("SELECT rev FROM atfill_record_rows WHERE rkey = 'a000025'"),
            std::vector<std::string>{"3kzzzzzzzzz2a"});
  auto older = sink->Write(std::vector<Event>{
      testing::MakeUpdate(kAlice, kLike, Rkey("a", 25), other, "3kaaaaaaaaa2a")});
  ASSERT_TRUE(older.ok()) << older.status().ToString();
  EXPECT_EQ(older->stale, 1u);
  MustWrite(*sink, {testing::MakeUpdate(kAlice, kLike, Rkey("a", 26), other, "3kzzzzzzzzz2a")});
  auto deleted = sink->Write(std::vector<Event>{testing::MakeDelete(kAlice, kLike, Rkey("a", 27))});
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_EQ(deleted->deleted, 1u);
  want_.erase("at://" + std::string(kAlice) + "/" + kLike + "/" + Rkey("a", 27));
  ExpectAllExact();
  ExpectCidsFollowBodies();

  auto reader = SqliteReader::Open(Path());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto repo = (*reader)->RepoRecords(kAlice);
  ASSERT_TRUE(repo.ok()) << repo.status().ToString();
  ASSERT_EQ(repo->size(), 29u);
  for (const RepoRecordKey& k : *repo) {
    EXPECT_EQ(k.cid,
              testing::CidOf(want_["at://" + std::string(kAlice) + "/" + kLike + "/" + k.rkey]))
        << k.rkey;
  }
}

// A database whose sink never compressed keeps the view any SQLite program reads.
TEST_F(SqliteCompressTest, CompressOffKeepsAViewWithoutTheFunction) {
  options_.compress = false;
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  MustWrite(*sink, Likes("a", 50, 1));
  EXPECT_EQ(Storage(kLike), Repeat("text", 50));
  EXPECT_TRUE(Dictionaries().empty());
  EXPECT_FALSE(ViewDecodes());
  RawDb plain(Path(), false);
  EXPECT_EQ(plain.Column("SELECT record FROM atfill_records WHERE rkey = 'a000003'"),
            std::vector<std::string>{LikeBody(4)});
}

// The batch that trains a dictionary fails (an invalid event after the training row): the
// dictionary goes with it, and the sink does not go on compressing with it.
TEST_F(SqliteCompressTest, AFailedBatchTakesItsDictionaryWithIt) {
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  std::vector<Event> batch = Likes("a", 25, 1);
  batch.push_back(MakeCreate(kAlice, kLike, "", LikeBody(99)));
  auto failed = sink->Write(batch);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kInvalid) << failed.status().ToString();
  EXPECT_TRUE(Dictionaries().empty());
  EXPECT_FALSE(ViewDecodes());
  EXPECT_EQ(RawDb(Path()).Column("SELECT count(*) FROM atfill_record_rows"),
            std::vector<std::string>{"0"});
  MustWrite(*sink, Likes("b", 10, 500));
  MustWrite(*sink, Likes("c", 30, 600));
  EXPECT_EQ(Dictionaries().size(), 1u);
  EXPECT_EQ(
      RawDb(Path()).Column("SELECT count(*) FROM atfill_record_rows WHERE typeof(record) = 'blob'"),
      std::vector<std::string>{std::to_string(40 - kSamples + 1)});
  ExpectAllExact();
}

// SIGKILL at any moment, the training batch's included, never leaves a row naming a dictionary
// that is not committed: every row reads back, and a sink opened again goes on.
TEST_F(SqliteCompressTest, SigkillNeverLeavesARowWithoutItsDictionary) {
  for (int commits : {1, 2, 3, 4, 6}) {
    SCOPED_TRACE("killed after " + std::to_string(commits) + " commits");
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(Path() + suffix);
    // Batch b holds likes k<b>-000000...k<b>-000006, of bodies LikeBody(b * 7 + i).
    testing::KillSinkWriterAfter(
        options_, [](size_t b) { return Likes("k" + std::to_string(b) + "-", 7, b * 7); },
        [](size_t) { return true; }, commits);
    if (HasFatalFailure()) return;
    auto rows = ReadAllRecords(Path());
    ASSERT_TRUE(rows.ok()) << rows.status().ToString();
    ASSERT_GE(rows->size(), static_cast<size_t>(commits) * 7);
    for (const RecordRow& r : *rows) {
      // k<batch>-<i>: the body of LikeBody(batch * 7 + i).
      const size_t dash = r.rkey.find('-');
      const uint64_t seed =
          std::stoull(r.rkey.substr(1, dash - 1)) * 7 + std::stoull(r.rkey.substr(dash + 1));
      ASSERT_EQ(r.record, LikeBody(seed)) << r.uri;
    }
    EXPECT_LE(Dictionaries().size(), 1u);
    auto sink = MustOpen();
    ASSERT_NE(sink, nullptr);
    want_.clear();
    for (const RecordRow& r : *rows) want_[r.uri] = r.record;
    MustWrite(*sink, Likes("z", 30, 10'000));
    sink.reset();
    ExpectAllExact();
    EXPECT_EQ(Dictionaries().size(), 1u);
  }
}

// A database written at version 2 migrates to 3 without rewriting a row: its rows stay text, its
// view stays readable without atfill's function until the first dictionary, and its collections
// get dictionaries from the bodies written after.
TEST_F(SqliteCompressTest, MigratesAVersion2DatabaseWithoutRewritingRows) {
  {
    RawDb db(Path(), false);
    ASSERT_EQ(db.Exec("PRAGMA journal_mode = WAL"), SQLITE_OK);
    ASSERT_EQ(db.Exec(testing::FrozenSchemaV2() + "INSERT INTO atfill_dids(id, did) VALUES (1, '" +
                      kAlice + "'); INSERT INTO atfill_collections(id, nsid) VALUES (4, '" + kLike +
                      "')"),
              SQLITE_OK)
        << sqlite3_errmsg(db.get());
    for (size_t i = 0; i < 30; ++i) {
      const std::string body = LikeBody(i);
      want_["at://" + std::string(kAlice) + "/" + kLike + "/" + Rkey("old", i)] = body;
      ASSERT_EQ(db.Exec("INSERT INTO atfill_record_rows(did_id, collection_id, rkey, cid, rev, "
                        "indexed_at, created_at, record) VALUES (1, 4, '" +
                        Rkey("old", i) + "', '" + testing::CidOf(body) +
                        "', '3kaaaaaaaaa2a', 1796029200123456, NULL, '" + body + "')"),
                SQLITE_OK)
          << sqlite3_errmsg(db.get());
    }
  }
  const std::string all_rows =
      "SELECT id || ' ' || cid || ' ' || typeof(record) || ' ' || record FROM atfill_record_rows "
      "ORDER BY id";
  const std::vector<std::string> before = RawDb(Path(), false).Column(all_rows);
  ASSERT_EQ(before.size(), 30u);
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  {
    RawDb plain(Path(), false);
    EXPECT_EQ(plain.Column("SELECT version FROM atfill_schema_version"),
              std::vector<std::string>{std::to_string(kSqliteSchemaVersion)});
    EXPECT_EQ(plain.Column(all_rows), before);
    EXPECT_EQ(plain.Column("SELECT count(*) FROM atfill_records"), std::vector<std::string>{"30"});
    EXPECT_EQ(plain.Column("SELECT record FROM atfill_records WHERE rkey = 'old000002'"),
              std::vector<std::string>{LikeBody(2)});
  }
  EXPECT_FALSE(ViewDecodes());
  ExpectAllExact();
  MustWrite(*sink, Likes("new", 25, 1000));
  EXPECT_TRUE(ViewDecodes());
  EXPECT_EQ(Dictionaries(), std::vector<std::string>{"1 app.bsky.feed.like 20"});
  EXPECT_EQ(RawDb(Path()).Column(all_rows + " LIMIT 30"), before);
  ExpectAllExact();
  // Without atfill's function no query on the view prepares, whichever columns it names (SQLite
  // resolves the whole view; docs/queries.md says so); the tables still read.
  RawDb plain(Path(), false);
  for (const char* query :
       {"SELECT record FROM atfill_records", "SELECT collection, count(*) FROM atfill_records"}) {
    sqlite3_stmt* s = nullptr;
    EXPECT_NE(sqlite3_prepare_v2(plain.get(), query, -1, &s, nullptr), SQLITE_OK) << query;
    EXPECT_NE(std::string(sqlite3_errmsg(plain.get())).find("no such function: atfill_json"),
              std::string::npos)
        << sqlite3_errmsg(plain.get());
    sqlite3_finalize(s);
  }
  EXPECT_EQ(plain.Column("SELECT count(*) FROM atfill_record_rows"),
            std::vector<std::string>{"55"});
}

// atfill_json names what it cannot read.
TEST_F(SqliteCompressTest, AtfillJsonRejectsBlobsItCannotRead) {
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  MustWrite(*sink, Likes("a", 25, 1));
  RawDb db(Path());
  auto error_of = [&](const std::string& sql) {
    sqlite3_stmt* s = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db.get(), sql.c_str(), -1, &s, nullptr), SQLITE_OK) << sql;
    const int rc = sqlite3_step(s);
    std::string message = rc == SQLITE_ERROR ? sqlite3_errmsg(db.get()) : "no error";
    sqlite3_finalize(s);
    return message;
  };
  EXPECT_EQ(error_of("SELECT atfill_json(x'00112233')"),
            "atfill_json: the record is a blob but not a zstd frame that atfill wrote");
  // A frame of dictionary 1 with its id changed to 9 (the frame header's dictionary id byte:
  // after the 4-byte magic number and the frame header descriptor).
  const std::string frame_hex =
      db.Column("SELECT hex(record) FROM atfill_record_rows WHERE typeof(record) = 'blob' LIMIT 1")
          .at(0);
  ASSERT_EQ(frame_hex.substr(10, 2), "01") << frame_hex;
  std::string other = frame_hex;
  other.replace(10, 2, "09");
  EXPECT_EQ(error_of("SELECT atfill_json(x'" + other + "')"),
            "atfill_json: the record names dictionary 9, which atfill_dicts does not hold");
  EXPECT_EQ(db.Column("SELECT atfill_json('plain text') || atfill_json(NULL) IS NULL"),
            std::vector<std::string>{"1"});
  EXPECT_EQ(db.Column("SELECT atfill_json('{\"a\":1}')"), std::vector<std::string>{"{\"a\":1}"});
  // atfill_cid: text as it is, a binary CIDv1 as its text, any other blob an error.
  const std::string cid = testing::CidOf(LikeBody(1));
  EXPECT_EQ(db.Column("SELECT atfill_cid('" + cid + "') || atfill_cid(NULL) IS NULL"),
            std::vector<std::string>{"1"});
  EXPECT_EQ(db.Column("SELECT atfill_cid('" + cid + "')"), std::vector<std::string>{cid});
  const std::string binary_hex =
      db.Column("SELECT hex(cid) FROM atfill_record_rows WHERE typeof(cid) = 'blob' LIMIT 1").at(0);
  ASSERT_EQ(binary_hex.size(), 72u) << binary_hex;
  EXPECT_EQ(db.Column("SELECT atfill_cid(x'" + binary_hex +
                      "') = cid FROM atfill_records WHERE "
                      "rkey = (SELECT rkey FROM atfill_record_rows WHERE hex(cid) = '" +
                      binary_hex + "')"),
            std::vector<std::string>{"1"});
  for (const std::string& bad :
       {std::string("x'0171'"), "x'00" + binary_hex.substr(2) + "'", "x'" + binary_hex + "00'"}) {
    const std::string error = error_of("SELECT atfill_cid(" + bad + ")");
    EXPECT_TRUE(error.starts_with("atfill_cid: the cid is a blob but not a binary CID: ")) << error;
  }
  EXPECT_EQ(error_of("SELECT atfill_cid(x'" + binary_hex + "00')"),
            "atfill_cid: the cid is a blob but not a binary CID: CID has 1 trailing bytes after "
            "the digest");
}

// A version 3 database whose view already decodes, with compressed rows whose CIDs are text (as
// version 3 wrote them): it migrates to version 4 without rewriting a row; the view then reads
// both CID forms, and the rows written after store theirs binary.
TEST_F(SqliteCompressTest, MigratesAVersion3DatabaseWithoutRewritingRows) {
  {
    auto sink = MustOpen();
    ASSERT_NE(sink, nullptr);
    MustWrite(*sink, Likes("old", 30, 1));
  }
  {
    // Back to what version 3 wrote: text CIDs, the view through atfill_json only, no lexicons
    // view (version 5).
    RawDb db(Path());
    ASSERT_EQ(db.Exec("UPDATE atfill_record_rows SET cid = atfill_cid(cid); DROP VIEW "
                      "atfill_lexicons; DROP VIEW atfill_records; CREATE VIEW atfill_records(uri, "
                      "did, collection, rkey, "
                      "record, cid, rev, indexed_at, created_at) AS SELECT 'at://' || d.did || "
                      "'/' || c.nsid || '/' || r.rkey, d.did, c.nsid, r.rkey, "
                      "atfill_json(r.record), r.cid, r.rev, strftime('%Y-%m-%dT%H:%M:%S', "
                      "r.indexed_at / 1000000, 'unixepoch') || printf('.%06dZ', r.indexed_at % "
                      "1000000), r.created_at FROM atfill_record_rows r JOIN atfill_dids d ON "
                      "d.id = r.did_id JOIN atfill_collections c ON c.id = r.collection_id; "
                      "UPDATE atfill_schema_version SET version = 3"),
              SQLITE_OK)
        << sqlite3_errmsg(db.get());
  }
  const std::string all_rows =
      "SELECT id || ' ' || typeof(cid) || ' ' || cid || ' ' || typeof(record) FROM "
      "atfill_record_rows ORDER BY id";
  const std::vector<std::string> before = RawDb(Path(), false).Column(all_rows);
  ASSERT_EQ(before.size(), 30u);
  EXPECT_EQ(RawDb(Path()).Column("SELECT count(*) FROM atfill_record_rows WHERE typeof(cid) = "
                                 "'text' AND typeof(record) = 'blob'"),
            std::vector<std::string>{std::to_string(30 - kSamples + 1)});
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  EXPECT_EQ(RawDb(Path(), false).Column("SELECT version FROM atfill_schema_version"),
            std::vector<std::string>{std::to_string(kSqliteSchemaVersion)});
  EXPECT_TRUE(ViewDecodes());
  EXPECT_EQ(RawDb(Path(), false).Column(all_rows), before);
  // The same body again over a text CID is unchanged.
  auto again =
      sink->Write(std::vector<Event>{MakeCreate(kAlice, kLike, Rkey("old", 29), LikeBody(1 + 29))});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->unchanged, 1u);
  MustWrite(*sink, Likes("new", 10, 1000));
  EXPECT_EQ(RawDb(Path()).Column("SELECT DISTINCT typeof(cid) FROM atfill_record_rows WHERE rkey "
                                 "LIKE 'new%'"),
            std::vector<std::string>{"blob"});
  ExpectAllExact();
  RawDb db(Path());
  for (const auto& [uri, body] : want_) {
    EXPECT_EQ(db.Column("SELECT cid FROM atfill_records WHERE uri = '" + uri + "'"),
              std::vector<std::string>{testing::CidOf(body)})
        << uri;
  }
}

// The loadable extension gives a program that knows nothing of atfill the same text: a plain
// connection that loads it, and the sqlite3 shell.
TEST_F(SqliteCompressTest, TheLoadableExtensionReadsTheView) {
  auto sink = MustOpen();
  ASSERT_NE(sink, nullptr);
  MustWrite(*sink, Likes("a", 40, 1));
  ASSERT_EQ(Storage(kLike).back(), "blob");
  const std::string query = "SELECT record FROM atfill_records WHERE rkey = 'a000039'";
  {
    RawDb plain(Path(), false);
    ASSERT_EQ(sqlite3_db_config(plain.get(), SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 1, nullptr),
              SQLITE_OK);
    char* error = nullptr;
    ASSERT_EQ(sqlite3_load_extension(plain.get(), ATFILL_SQLITE_EXT, nullptr, &error), SQLITE_OK)
        << (error != nullptr ? error : "");
    sqlite3_free(error);
    EXPECT_EQ(plain.Column(query), std::vector<std::string>{LikeBody(40)});
    EXPECT_EQ(plain.Column("SELECT count(*) FROM atfill_records WHERE json_extract(record, "
                           "'$.$type') = 'app.bsky.feed.like'"),
              std::vector<std::string>{"40"});
  }
  // The shell, as a user runs it (the path without its suffix, as docs/queries.md shows it).
  std::string shell;
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/bin"}) {
    if (std::filesystem::exists(std::string(dir) + "/sqlite3")) {
      shell = std::string(dir) + "/sqlite3";
      break;
    }
  }
  ASSERT_FALSE(shell.empty()) << "the sqlite3 shell is not installed (tools/setup installs it)";
  std::string ext = ATFILL_SQLITE_EXT;
  ext = ext.substr(0, ext.rfind('.'));
  testing::TempDir out;
  auto result = testing::RunProcess({shell, Path(), ".load " + ext, query}, out.path());
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, LikeBody(40) + "\n") << result.err;
  // README's query.
  result = testing::RunProcess(
      {shell, Path(), ".load " + ext, "SELECT collection, count(*) FROM atfill_records GROUP BY 1"},
      out.path());
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "app.bsky.feed.like|40\n") << result.err;
}

}  // namespace
}  // namespace atfill::sinks
