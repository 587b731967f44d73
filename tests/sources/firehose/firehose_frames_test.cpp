// Relay firehose frames: decoding, and sync 1.1 verification of every #commit of a real relay
// capture (../shared/protocols/jetstream/data/internal/corpus/testdata: 150 contiguous frames
// whose commits indigo verified, with the DID documents of their repos), then tampered copies of
// those commits refused with their reason.
#include "sources/firehose/firehose_frames.hpp"

#include <gtest/gtest.h>
#include <simdjson.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "atproto/cbor.hpp"
#include "atproto/json.hpp"
#include "atproto/lexicon.hpp"
#include "atproto/mst.hpp"
#include "atproto/tid.hpp"
#include "atproto/value.hpp"
#include "sources/crawl/resolver.hpp"
#include "sources/jetstream/jetstream_frames.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::sources {
namespace {

using atproto::Cid;
using atproto::Value;

constexpr const char* kCorpusDir = "protocols/jetstream/data/internal/corpus/testdata";

std::string Unzstd(const std::string& packed) {
  auto decoder = ZstdFrameDecoder::Create(nullptr, 64u << 20);
  EXPECT_TRUE(decoder.ok());
  std::string out, kind;
  EXPECT_TRUE(decoder->Decompress(AsBytes(packed), &out, &kind).ok()) << kind;
  return out;
}

// The relay capture: its frames, and each commit DID's signing key from its document.
struct Corpus {
  std::vector<Bytes> frames;
  std::map<std::string, atproto::PublicKey> keys;
  simdjson::dom::parser parser;
  simdjson::dom::element manifest;
};

void LoadCorpus(const std::filesystem::path& dir, Corpus* corpus) {
  const std::string raw = Unzstd(testing::ReadFileOrDie(dir / "frames.bin.zst"));
  const ByteView bytes = AsBytes(raw);
  for (size_t pos = 0; pos + 4 <= bytes.size();) {
    const uint32_t len = bytes[pos] | bytes[pos + 1] << 8 | bytes[pos + 2] << 16 |
                         static_cast<uint32_t>(bytes[pos + 3]) << 24;
    pos += 4;
    ASSERT_LE(len, bytes.size() - pos);
    corpus->frames.emplace_back(bytes.begin() + pos, bytes.begin() + pos + len);
    pos += len;
  }
  const std::string docs = Unzstd(testing::ReadFileOrDie(dir / "did_docs.json.zst"));
  simdjson::dom::parser parser;
  simdjson::dom::object object;
  ASSERT_EQ(parser.parse(docs).get(object), simdjson::SUCCESS);
  for (auto [did, doc] : object) {
    const ResolveOutcome out = ParseDidDocument(did, simdjson::minify(doc), ResolverOptions{}, 0);
    ASSERT_TRUE(out.ok()) << did << ": " << out.message;
    auto key = atproto::PublicKey::FromMultibase(out.doc->signing_key);
    ASSERT_TRUE(key.ok()) << did << ": " << key.status().ToString();
    corpus->keys.emplace(std::string(did), *key);
  }
  ASSERT_EQ(corpus->parser.load((dir / "manifest.json").string()).get(corpus->manifest),
            simdjson::SUCCESS);
}

int64_t ManifestInt(const Corpus& corpus, const char* key) {
  int64_t v = -1;
  EXPECT_EQ(corpus.manifest[key].get(v), simdjson::SUCCESS) << key;
  return v;
}

FirehoseFrame Decode(ByteView bytes) {
  FirehoseFrame frame;
  std::string kind;
  Status s = DecodeFirehoseFrame(bytes, &frame, &kind);
  EXPECT_TRUE(s.ok()) << kind << ": " << s.ToString();
  return frame;
}

// The error kind verifying `commit` gives ("ok" when it verifies), and its sentence.
std::string VerifyKind(const FirehoseCommit& commit, const atproto::PublicKey& key,
                       std::string* message = nullptr) {
  VerifiedCommit verified;
  std::string kind;
  Status s = VerifyFirehoseCommit(commit, key, &verified, &kind);
  if (message != nullptr) *message = s.ToString();
  if (s.ok()) return "ok";
  EXPECT_FALSE(kind.empty()) << s.ToString();
  return kind;
}

TEST(FirehoseFramesTest, EveryCommitOfTheRelayCaptureVerifies) {
  ATFILL_SHARED_PATH(dir, kCorpusDir);
  Corpus corpus;
  LoadCorpus(dir, &corpus);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(static_cast<int64_t>(corpus.frames.size()), ManifestInt(corpus, "frames"));
  std::map<FirehoseKind, int> kinds;
  std::map<pipeline::Operation, int> operations;
  int64_t expected_seq = ManifestInt(corpus, "seq_first");
  for (const Bytes& bytes : corpus.frames) {
    FirehoseFrame frame = Decode(bytes);
    ++kinds[frame.kind()];
    EXPECT_EQ(frame.seq(), expected_seq++);
    EXPECT_FALSE(frame.did().empty());
    const auto* commit = std::get_if<FirehoseCommit>(&frame.payload);
    if (commit == nullptr) continue;
    ASSERT_TRUE(corpus.keys.contains(commit->repo)) << commit->repo;
    VerifiedCommit verified;
    std::string kind;
    Status s = VerifyFirehoseCommit(*commit, corpus.keys.at(commit->repo), &verified, &kind);
    ASSERT_TRUE(s.ok()) << kind << ": " << s.ToString();
    EXPECT_EQ(verified.commit.did, commit->repo);
    std::vector<pipeline::Event> events;
    ASSERT_TRUE(
        FirehoseCommitEvents(*commit, verified, pipeline::Origin::kLive, &events, &kind).ok());
    ASSERT_EQ(events.size(), commit->ops.size());
    for (const pipeline::Event& event : events) {
      const auto& r = std::get<pipeline::RecordEvent>(event);
      ++operations[r.operation];
      EXPECT_EQ(r.rev, commit->rev);
      EXPECT_EQ(r.position, static_cast<uint64_t>(commit->seq));
      if (r.operation == pipeline::Operation::kDelete) {
        EXPECT_TRUE(r.body.empty());
        continue;
      }
      // The JSON made from the block encodes back to the record's CID.
      auto cid = atproto::CidOfRecord(r.body);
      ASSERT_TRUE(cid.ok()) << r.Uri() << ": " << cid.status().ToString();
      EXPECT_EQ(*cid, r.cid) << r.Uri();
    }
  }
  EXPECT_EQ(kinds[FirehoseKind::kCommit], ManifestInt(corpus, "commit_frames"));
  EXPECT_EQ(kinds[FirehoseKind::kIdentity], ManifestInt(corpus, "identity"));
  EXPECT_EQ(kinds[FirehoseKind::kAccount], ManifestInt(corpus, "account"));
  EXPECT_EQ(operations[pipeline::Operation::kCreate], ManifestInt(corpus, "creates"));
  EXPECT_EQ(operations[pipeline::Operation::kUpdate], ManifestInt(corpus, "updates"));
  EXPECT_EQ(operations[pipeline::Operation::kDelete], ManifestInt(corpus, "deletes"));
}

// The capture's records (production bytes from the relay) against the atproto lexicons: every
// record of a collection they describe passes, its key included.
TEST(FirehoseFramesTest, TheCapturesRecordsMatchTheAtprotoLexicons) {
  ATFILL_SHARED_PATH(dir, kCorpusDir);
  ATFILL_SHARED_PATH(lexicons, "lexicons");
  Corpus corpus;
  LoadCorpus(dir, &corpus);
  ASSERT_FALSE(HasFatalFailure());
  atproto::LexiconCatalog::Builder builder;
  ASSERT_TRUE(builder.AddPath(lexicons).ok());
  auto catalog = builder.Build();
  ASSERT_TRUE(catalog.ok());
  std::map<std::string, int> known;
  int unknown = 0;
  for (const Bytes& bytes : corpus.frames) {
    FirehoseFrame frame = Decode(bytes);
    const auto* commit = std::get_if<FirehoseCommit>(&frame.payload);
    if (commit == nullptr) continue;
    VerifiedCommit verified;
    std::string kind;
    ASSERT_TRUE(VerifyFirehoseCommit(*commit, corpus.keys.at(commit->repo), &verified, &kind).ok());
    std::vector<pipeline::Event> events;
    ASSERT_TRUE(
        FirehoseCommitEvents(*commit, verified, pipeline::Origin::kLive, &events, &kind).ok());
    for (const pipeline::Event& event : events) {
      const auto& r = std::get<pipeline::RecordEvent>(event);
      if (r.operation == pipeline::Operation::kDelete) continue;
      const atproto::LexiconVerdict v = catalog->ValidateJson(r.collection, r.rkey, r.body);
      if (v.outcome == atproto::LexiconVerdict::Outcome::kUnknown) {
        ++unknown;
        continue;
      }
      ++known[r.collection];
      EXPECT_TRUE(v.valid()) << r.Uri() << ": " << v.Describe() << "\n" << r.body;
    }
  }
  int total = 0;
  for (const auto& [collection, n] : known) total += n;
  EXPECT_GT(total, 100) << "the capture's records of the atproto collections";
  EXPECT_GE(known.size(), 5u);
  std::cout << total << " records validated in " << known.size() << " collections, " << unknown
            << " of collections without a lexicon\n";
}

// Rewrites the CAR of `commit`: `edit` may change, drop or add blocks (by CID) and the roots.
void RewriteBlocks(FirehoseCommit* commit,
                   const std::function<void(std::vector<std::pair<Cid, Bytes>>*)>& edit) {
  auto reader = atproto::CarReader::Open(commit->blocks);
  ASSERT_TRUE(reader.ok());
  std::vector<std::pair<Cid, Bytes>> blocks;
  atproto::CarBlock block;
  while (*reader->Next(&block))
    blocks.emplace_back(block.cid, Bytes(block.data.begin(), block.data.end()));
  edit(&blocks);
  atproto::CarWriter writer(std::vector<Cid>{commit->commit});
  for (const auto& [cid, data] : blocks) ASSERT_TRUE(writer.Add(cid, data).ok());
  commit->blocks = writer.TakeBytes();
}

// A commit of the capture with a create (the first one), and its key.
struct Sample {
  FirehoseCommit commit;
  atproto::PublicKey key;
};

std::optional<Sample> FindCommit(const Corpus& corpus,
                                 const std::function<bool(const FirehoseCommit&)>& want) {
  for (const Bytes& bytes : corpus.frames) {
    FirehoseFrame frame = Decode(bytes);
    if (auto* c = std::get_if<FirehoseCommit>(&frame.payload); c != nullptr && want(*c)) {
      const atproto::PublicKey key = corpus.keys.at(c->repo);
      return Sample{std::move(*c), key};
    }
  }
  return std::nullopt;
}

TEST(FirehoseFramesTest, TamperedCommitsAreRefusedWithTheirReason) {
  ATFILL_SHARED_PATH(dir, kCorpusDir);
  Corpus corpus;
  LoadCorpus(dir, &corpus);
  ASSERT_FALSE(HasFatalFailure());
  auto sample = FindCommit(corpus, [](const FirehoseCommit& c) {
    return c.ops.size() == 1 && c.ops[0].action == FirehoseAction::kCreate;
  });
  ASSERT_TRUE(sample.has_value());
  const FirehoseCommit& good = sample->commit;
  const atproto::PublicKey& key = sample->key;
  ASSERT_EQ(VerifyKind(good, key), "ok");
  std::string message;

  {  // A flipped signature byte, the commit block re-hashed so that only the signature is wrong.
    FirehoseCommit c = good;
    RewriteBlocks(&c, [&](std::vector<std::pair<Cid, Bytes>>* blocks) {
      for (auto& [cid, data] : *blocks) {
        if (cid != c.commit) continue;
        auto commit = atproto::DecodeCommit(data);
        ASSERT_TRUE(commit.ok());
        commit->sig[10] ^= 0x01;
        data = atproto::EncodeSignedCommit(*commit);
        cid = Cid::Compute(Cid::Codec::kDagCbor, data);
        c.commit = cid;
      }
    });
    EXPECT_EQ(VerifyKind(c, key, &message), "bad_signature") << message;
    EXPECT_NE(message.find(good.repo), std::string::npos) << message;
  }
  {  // Another account's key.
    const atproto::PublicKey* other = nullptr;
    for (const auto& [did, k] : corpus.keys) {
      if (did != good.repo) other = &k;
    }
    ASSERT_NE(other, nullptr);
    EXPECT_EQ(VerifyKind(good, *other, &message), "bad_signature") << message;
  }
  {  // The record block's bytes changed under its CID.
    FirehoseCommit c = good;
    RewriteBlocks(&c, [&](std::vector<std::pair<Cid, Bytes>>* blocks) {
      for (auto& [cid, data] : *blocks) {
        if (cid == *c.ops[0].cid) data.back() ^= 0x01;
      }
    });
    EXPECT_EQ(VerifyKind(c, key, &message), "bad_car") << message;
  }
  {  // Another record (a valid block with its own CID) in place of the one the tree holds.
    FirehoseCommit c = good;
    const Bytes other = atproto::EncodeCbor(Value::MakeMap(
        {{"$type", Value::String("app.bsky.feed.post")}, {"text", Value::String("forged")}}));
    const Cid other_cid = Cid::Compute(Cid::Codec::kDagCbor, other);
    RewriteBlocks(&c, [&](std::vector<std::pair<Cid, Bytes>>* blocks) {
      blocks->emplace_back(other_cid, other);
    });
    c.ops[0].cid = other_cid;
    EXPECT_EQ(VerifyKind(c, key, &message), "op_mismatch") << message;
    EXPECT_NE(message.find(c.ops[0].path), std::string::npos) << message;
  }
  {  // The record block missing.
    FirehoseCommit c = good;
    RewriteBlocks(&c, [&](std::vector<std::pair<Cid, Bytes>>* blocks) {
      std::erase_if(*blocks, [&](const auto& b) { return b.first == *c.ops[0].cid; });
    });
    EXPECT_EQ(VerifyKind(c, key, &message), "missing_record") << message;
  }
  {  // An op whose inversion does not reach prevData: the create left out, or another prevData.
    FirehoseCommit c = good;
    c.ops.clear();
    EXPECT_EQ(VerifyKind(c, key, &message), "inversion_mismatch") << message;
    FirehoseCommit d = good;
    d.prev_data = d.commit;
    EXPECT_EQ(VerifyKind(d, key, &message), "inversion_mismatch") << message;
    FirehoseCommit e = good;
    e.prev_data.reset();
    EXPECT_EQ(VerifyKind(e, key, &message), "no_prev_data") << message;
  }
  {  // An MST node the inversion needs is missing.
    FirehoseCommit c = good;
    RewriteBlocks(&c, [&](std::vector<std::pair<Cid, Bytes>>* blocks) {
      auto commit =
          atproto::DecodeCommit(std::find_if(blocks->begin(), blocks->end(), [&](const auto& b) {
                                  return b.first == c.commit;
                                })->second);
      ASSERT_TRUE(commit.ok());
      std::erase_if(*blocks, [&](const auto& b) { return b.first == commit->data; });
    });
    EXPECT_EQ(VerifyKind(c, key, &message), "incomplete_proof") << message;
  }
  {  // The sync 1.1 op rules, and the flags.
    FirehoseCommit c = good;
    c.ops[0].prev = c.commit;
    EXPECT_EQ(VerifyKind(c, key), "bad_op");
    c = good;
    c.ops.push_back(c.ops[0]);
    EXPECT_EQ(VerifyKind(c, key), "bad_op");
    c = good;
    c.ops[0].action = FirehoseAction::kUpdate;
    EXPECT_EQ(VerifyKind(c, key), "bad_op") << "an update without prev";
    c = good;
    c.too_big = true;
    EXPECT_EQ(VerifyKind(c, key), "too_big");
    c = good;
    c.rev = "3zzzzzzzzzzzz";
    EXPECT_EQ(VerifyKind(c, key), "bad_commit");
    c = good;
    c.commit = *c.prev_data;
    EXPECT_EQ(VerifyKind(c, key), "no_commit_block");
    c = good;
    c.blocks.resize(c.blocks.size() / 2);
    EXPECT_EQ(VerifyKind(c, key), "bad_car");
  }
}

TEST(FirehoseFramesTest, DeletesAndUpdatesOfTheCaptureInvertToo) {
  ATFILL_SHARED_PATH(dir, kCorpusDir);
  Corpus corpus;
  LoadCorpus(dir, &corpus);
  ASSERT_FALSE(HasFatalFailure());
  for (FirehoseAction action : {FirehoseAction::kDelete, FirehoseAction::kUpdate}) {
    auto sample = FindCommit(corpus, [&](const FirehoseCommit& c) {
      return std::any_of(c.ops.begin(), c.ops.end(),
                         [&](const FirehoseOp& op) { return op.action == action; });
    });
    ASSERT_TRUE(sample.has_value());
    EXPECT_EQ(VerifyKind(sample->commit, sample->key), "ok");
    // Restoring another value than the one the op replaced misses prevData.
    FirehoseCommit c = sample->commit;
    for (FirehoseOp& op : c.ops) {
      if (op.action == action) op.prev = c.commit;
    }
    EXPECT_EQ(VerifyKind(c, sample->key), "inversion_mismatch");
  }
}

Bytes Frame(const Value& header, const Value& body) {
  Bytes out = atproto::EncodeCbor(header);
  atproto::EncodeCbor(body, &out);
  return out;
}

Value Header(int64_t op, const char* t = nullptr) {
  Value::Map m{{"op", Value::Int(op)}};
  if (t != nullptr) m.emplace_back("t", Value::String(t));
  Value v = Value::MakeMap(std::move(m));
  v.Canonicalize();
  return v;
}

std::string DecodeKind(ByteView bytes, Status* status = nullptr) {
  FirehoseFrame frame;
  std::string kind;
  Status s = DecodeFirehoseFrame(bytes, &frame, &kind);
  if (status != nullptr) *status = s;
  return s.ok() ? "ok" : kind;
}

TEST(FirehoseFramesTest, OtherFramesAndMalformedOnes) {
  Value account = Value::MakeMap({{"seq", Value::Int(5)},
                                  {"did", Value::String("did:plc:abcdefghijklmnopqrstuvwx")},
                                  {"time", Value::String("2024-01-01T00:00:00Z")},
                                  {"active", Value::Bool(false)},
                                  {"status", Value::String("takendown")}});
  account.Canonicalize();
  FirehoseFrame a = Decode(Frame(Header(1, "#account"), account));
  ASSERT_EQ(a.kind(), FirehoseKind::kAccount);
  EXPECT_EQ(a.seq(), 5);
  EXPECT_FALSE(std::get<FirehoseAccount>(a.payload).active);
  EXPECT_EQ(std::get<FirehoseAccount>(a.payload).status, "takendown");

  Value error = Value::MakeMap({{"error", Value::String("FutureCursor")}});
  FirehoseFrame e = Decode(Frame(Header(-1), error));
  ASSERT_EQ(e.kind(), FirehoseKind::kError);
  EXPECT_EQ(std::get<FirehoseError>(e.payload).name, "FutureCursor");
  EXPECT_EQ(e.seq(), 0);

  Value info = Value::MakeMap({{"name", Value::String("OutdatedCursor")}});
  EXPECT_EQ(Decode(Frame(Header(1, "#info"), info)).kind(), FirehoseKind::kInfo);

  Status s;
  EXPECT_EQ(DecodeKind(Frame(Header(1, "#labels"), info), &s), "unknown_type");
  EXPECT_NE(s.message().find("#labels"), std::string::npos);
  EXPECT_EQ(DecodeKind(Frame(Header(2, "#info"), info)), "bad_header");
  EXPECT_EQ(DecodeKind(Frame(Header(1), info)), "bad_header");
  EXPECT_EQ(DecodeKind(Frame(Header(1, "#account"), info), &s), "missing_field");
  EXPECT_NE(s.message().find("'seq'"), std::string::npos) << s.ToString();

  Value bad_seq = account;
  for (auto& [k, v] : bad_seq.as_map()) {
    if (k == "seq") v = Value::Int(0);
  }
  EXPECT_EQ(DecodeKind(Frame(Header(1, "#account"), bad_seq)), "bad_seq");
  Value bad_did = account;
  for (auto& [k, v] : bad_did.as_map()) {
    if (k == "did") v = Value::String("not a did");
  }
  EXPECT_EQ(DecodeKind(Frame(Header(1, "#account"), bad_did)), "invalid_did");
  Value bad_type = account;
  for (auto& [k, v] : bad_type.as_map()) {
    if (k == "active") v = Value::String("no");
  }
  EXPECT_EQ(DecodeKind(Frame(Header(1, "#account"), bad_type), &s), "bad_frame");
  EXPECT_NE(s.message().find("seq 5 of did:plc:abcdefghijklmnopqrstuvwx"), std::string::npos)
      << "the error names the frame: " << s.ToString();

  // Every truncation of a good frame, and trailing bytes, are errors.
  const Bytes good = Frame(Header(1, "#account"), account);
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_EQ(DecodeKind(ByteView(good).first(n)), "bad_cbor") << n;
  }
  Bytes trailing = good;
  trailing.push_back(0);
  EXPECT_EQ(DecodeKind(trailing), "bad_cbor");
}

// The head a reader routes by (PeekFirehoseFrame) is the decoded frame's, for every frame of the
// relay capture (real production bytes) and every kind; frames it does not route (info, error,
// unknown types) and malformed ones give no head, and no cut or flipped frame crashes it.
TEST(FirehoseFramesTest, TheHeadReadWithoutDecodingIsTheDecodedFramesHead) {
  ATFILL_SHARED_PATH(dir, kCorpusDir);
  Corpus corpus;
  LoadCorpus(dir, &corpus);
  ASSERT_FALSE(HasFatalFailure());
  size_t commits = 0;
  for (const Bytes& bytes : corpus.frames) {
    FirehoseFrame frame = Decode(bytes);
    FirehoseHead head;
    const bool routed = frame.kind() < FirehoseKind::kInfo;
    ASSERT_EQ(PeekFirehoseFrame(bytes, &head), routed);
    if (!routed) continue;
    EXPECT_EQ(head.kind, frame.kind());
    EXPECT_EQ(head.seq, frame.seq());
    EXPECT_EQ(head.did, frame.did());
    if (frame.kind() == FirehoseKind::kCommit) {
      EXPECT_EQ(head.time, std::get<FirehoseCommit>(frame.payload).time);
      ++commits;
    }
  }
  EXPECT_GT(commits, 0u);

  Value account = Value::MakeMap({{"seq", Value::Int(5)},
                                  {"did", Value::String("did:plc:abcdefghijklmnopqrstuvwx")},
                                  {"time", Value::String("2024-01-01T00:00:00Z")},
                                  {"active", Value::Bool(false)}});
  account.Canonicalize();
  FirehoseHead head;
  ASSERT_TRUE(PeekFirehoseFrame(Frame(Header(1, "#account"), account), &head));
  EXPECT_EQ(head.kind, FirehoseKind::kAccount);
  EXPECT_EQ(head.seq, 5);
  EXPECT_EQ(head.did, "did:plc:abcdefghijklmnopqrstuvwx");
  EXPECT_EQ(head.time, "2024-01-01T00:00:00Z");
  Value info = Value::MakeMap({{"name", Value::String("OutdatedCursor")}});
  EXPECT_FALSE(PeekFirehoseFrame(Frame(Header(1, "#info"), info), &head));
  EXPECT_FALSE(PeekFirehoseFrame(Frame(Header(-1), info), &head));
  EXPECT_FALSE(PeekFirehoseFrame(Frame(Header(1, "#labels"), account), &head));
  EXPECT_FALSE(PeekFirehoseFrame(Frame(Header(1, "#account"), info), &head));  // no seq, no did
  const Bytes good = Frame(Header(1, "#account"), account);
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(PeekFirehoseFrame(ByteView(good).first(n), &head)) << n;
  }
  Bytes trailing = good;
  trailing.push_back(0);
  EXPECT_FALSE(PeekFirehoseFrame(trailing, &head));
  const Bytes& frame = corpus.frames.front();
  for (size_t i = 0; i < frame.size(); i += 3) {
    Bytes copy = frame;
    copy[i] ^= 0x20;
    (void)PeekFirehoseFrame(copy, &head);
  }
}

TEST(FirehoseFramesTest, CorpusFramesCutOrFlippedAreErrorsNeverCrashes) {
  ATFILL_SHARED_PATH(dir, kCorpusDir);
  Corpus corpus;
  LoadCorpus(dir, &corpus);
  ASSERT_FALSE(HasFatalFailure());
  const Bytes& frame = corpus.frames.front();
  for (size_t n = 0; n < frame.size(); n += 7) {
    EXPECT_NE(DecodeKind(ByteView(frame).first(n)), "ok") << n;
  }
  // A flipped byte either breaks the decoding or the verification, or lands where neither looks
  // (a record's text): never a crash.
  int refused = 0;
  for (size_t i = 0; i < frame.size(); i += 3) {
    Bytes copy = frame;
    copy[i] ^= 0x20;
    FirehoseFrame decoded;
    std::string kind;
    if (!DecodeFirehoseFrame(copy, &decoded, &kind).ok()) {
      ++refused;
      continue;
    }
    if (auto* c = std::get_if<FirehoseCommit>(&decoded.payload); c != nullptr) {
      auto key = corpus.keys.find(c->repo);
      if (key == corpus.keys.end() || VerifyKind(*c, key->second) != "ok") ++refused;
    }
  }
  EXPECT_GT(refused, static_cast<int>(frame.size() / 3 * 9 / 10));
}

Bytes Record(int n) {
  Value v = Value::MakeMap({{"$type", Value::String("app.bsky.feed.post")},
                            {"text", Value::String("post " + std::to_string(n))}});
  v.Canonicalize();
  return atproto::EncodeCbor(v);
}

// Commits of many writes each (creates, updates and deletes mixed), built as a PDS would send
// them, go through the wire encoding and verify; without any one of their proof's nodes (when a
// write needs it) or with a write left out, they are refused.
TEST(FirehoseFramesTest, BuiltMultiWriteCommitsRoundTripAndVerify) {
  auto key = atproto::PrivateKey::FromBytes(atproto::KeyType::kSecp256k1, Bytes(32, 0x21));
  ASSERT_TRUE(key.ok());
  const atproto::PublicKey public_key = key->public_key();
  std::mt19937 rng(21);
  std::map<std::string, Bytes> records;
  for (int i = 0; i < 300; ++i) records["app.bsky.feed.post/p" + std::to_string(i)] = Record(i);
  std::string since;
  int counter = 1000;
  std::map<FirehoseAction, int> actions;
  int needed = 0, spared = 0;
  for (int n = 0; n < 40; ++n) {
    std::vector<RepoWrite> writes;
    std::set<std::string> touched;
    const int count = 1 + static_cast<int>(rng() % 8);
    for (int w = 0; w < count; ++w) {
      const std::string path = "app.bsky.feed.post/p" + std::to_string(rng() % 400);
      if (!touched.insert(path).second) continue;
      const bool present = records.contains(path);
      const FirehoseAction action = !present         ? FirehoseAction::kCreate
                                    : rng() % 2 == 0 ? FirehoseAction::kUpdate
                                                     : FirehoseAction::kDelete;
      ++actions[action];
      writes.push_back(
          {action, path, action == FirehoseAction::kDelete ? Bytes() : Record(++counter)});
    }
    const std::string rev = atproto::Tid::FromParts(1'700'000'000'000'000 + n, 0)->str();
    auto built = BuildFirehoseCommit("did:plc:abcdefghijklmnopqrstuvwx", rev, since, &records,
                                     writes, *key, 500 + n);
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    since = rev;
    FirehoseFrame frame = Decode(EncodeFirehoseFrame(FirehoseFrame{*built}));
    ASSERT_EQ(frame.kind(), FirehoseKind::kCommit);
    const FirehoseCommit& got = std::get<FirehoseCommit>(frame.payload);
    EXPECT_EQ(got.seq, 500 + n);
    EXPECT_EQ(got.since, built->since);
    EXPECT_EQ(got.prev_data, built->prev_data);
    EXPECT_EQ(got.blocks, built->blocks);
    ASSERT_EQ(got.ops.size(), writes.size());
    std::string message;
    ASSERT_EQ(VerifyKind(got, public_key, &message), "ok") << message;
    if (writes.size() > 1) {
      FirehoseCommit short_one = got;
      short_one.ops.pop_back();
      EXPECT_EQ(VerifyKind(short_one, public_key), "inversion_mismatch");
    }
    // Each node of the CAR but the commit: dropped, the inversion cannot be done, or (a spine it
    // did not read) still verifies.
    auto reader = atproto::CarReader::Open(got.blocks);
    ASSERT_TRUE(reader.ok());
    atproto::CarBlock block;
    std::vector<Cid> nodes;
    while (*reader->Next(&block)) {
      if (block.cid != got.commit && atproto::DecodeMstNode(block.data).ok())
        nodes.push_back(block.cid);
    }
    for (const Cid& node : nodes) {
      FirehoseCommit dropped = got;
      RewriteBlocks(&dropped, [&](std::vector<std::pair<Cid, Bytes>>* blocks) {
        std::erase_if(*blocks, [&](const auto& b) { return b.first == node; });
      });
      const std::string kind = VerifyKind(dropped, public_key);
      EXPECT_TRUE(kind == "incomplete_proof" || kind == "ok") << kind;
      ++(kind == "ok" ? spared : needed);
    }
  }
  EXPECT_GT(actions[FirehoseAction::kCreate], 20);
  EXPECT_GT(actions[FirehoseAction::kUpdate], 20);
  EXPECT_GT(actions[FirehoseAction::kDelete], 20);
  EXPECT_GT(needed, 5 * spared) << "nearly every proof node is needed";

  // A write that does not fit the repo is refused.
  std::vector<RepoWrite> bad{{FirehoseAction::kUpdate, "app.bsky.feed.post/none", Record(1)}};
  EXPECT_EQ(
      BuildFirehoseCommit("did:plc:abcdefghijklmnopqrstuvwx", since, "", &records, bad, *key, 1)
          .status()
          .code(),
      StatusCode::kInvalid);
}

// A repo's first commit (no since) may come without prevData, as a PDS sends it when the repo is
// created: its ops inverted must then leave the empty tree. A later commit without prevData is
// still refused.
TEST(FirehoseFramesTest, AFirstCommitWithoutPrevDataInvertsOntoTheEmptyTree) {
  auto key = atproto::PrivateKey::FromBytes(atproto::KeyType::kSecp256k1, Bytes(32, 0x22));
  ASSERT_TRUE(key.ok());
  const atproto::PublicKey public_key = key->public_key();
  std::map<std::string, Bytes> records;
  const std::string rev = atproto::Tid::FromParts(1'700'000'000'000'000, 0)->str();
  auto first = BuildFirehoseCommit("did:plc:abcdefghijklmnopqrstuvwx", rev, "", &records,
                                   {{FirehoseAction::kCreate, "app.bsky.feed.post/a", Record(1)},
                                    {FirehoseAction::kCreate, "app.bsky.feed.post/b", Record(2)}},
                                   *key, 1);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  FirehoseCommit genesis = *first;
  genesis.prev_data.reset();
  std::string message;
  EXPECT_EQ(VerifyKind(genesis, public_key, &message), "ok") << message;
  // One create left out: the tree it inverts to still holds a record.
  FirehoseCommit short_one = genesis;
  short_one.ops.pop_back();
  EXPECT_EQ(VerifyKind(short_one, public_key, &message), "inversion_mismatch") << message;
  // A commit that follows another names the tree it follows.
  const std::string rev2 = atproto::Tid::FromParts(1'700'000'000'000'001, 0)->str();
  auto second =
      BuildFirehoseCommit("did:plc:abcdefghijklmnopqrstuvwx", rev2, rev, &records,
                          {{FirehoseAction::kCreate, "app.bsky.feed.post/c", Record(3)}}, *key, 2);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(VerifyKind(*second, public_key, &message), "ok") << message;
  FirehoseCommit unlinked = *second;
  unlinked.prev_data.reset();
  EXPECT_EQ(VerifyKind(unlinked, public_key, &message), "no_prev_data") << message;
}

TEST(FirehoseFramesTest, EveryFrameKindRoundTripsThroughTheWireEncoding) {
  FirehoseAccount account{7, "did:plc:abcdefghijklmnopqrstuvwx", false, "deleted",
                          "2024-01-01T00:00:00Z"};
  FirehoseFrame a = Decode(EncodeFirehoseFrame(FirehoseFrame{account}));
  EXPECT_EQ(std::get<FirehoseAccount>(a.payload).status, "deleted");
  EXPECT_FALSE(std::get<FirehoseAccount>(a.payload).active);
  FirehoseIdentity identity{8, "did:plc:abcdefghijklmnopqrstuvwx", "alice.test",
                            "2024-01-01T00:00:00Z"};
  EXPECT_EQ(std::get<FirehoseIdentity>(Decode(EncodeFirehoseFrame(FirehoseFrame{identity})).payload)
                .handle,
            "alice.test");
  FirehoseSync sync{9, "did:plc:abcdefghijklmnopqrstuvwx", "3l2222222222a", Bytes{1, 2},
                    "2024-01-01T00:00:00Z"};
  EXPECT_EQ(std::get<FirehoseSync>(Decode(EncodeFirehoseFrame(FirehoseFrame{sync})).payload).blocks,
            (Bytes{1, 2}));
  FirehoseError error{"ConsumerTooSlow", "slow"};
  EXPECT_EQ(
      std::get<FirehoseError>(Decode(EncodeFirehoseFrame(FirehoseFrame{error})).payload).message,
      "slow");
  FirehoseInfo info{"OutdatedCursor", ""};
  EXPECT_EQ(Decode(EncodeFirehoseFrame(FirehoseFrame{info})).kind(), FirehoseKind::kInfo);
}

}  // namespace
}  // namespace atfill::sources
