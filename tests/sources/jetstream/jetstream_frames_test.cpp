// Jetstream frame decoding (v1 events, v2 subscribeEvents messages) and zstd dictionary
// decompression, against the real corpora in ../shared/protocols/jetstream/data: the production
// v1 lines, the relay frames they were made from, and both real dictionaries.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <simdjson.h>
#include <zstd.h>

#include <map>
#include <random>
#include <set>

#include "atproto/car.hpp"
#include "atproto/cbor.hpp"
#include "atproto/json.hpp"
#include "atproto/syntax.hpp"
#include "base/encoding.hpp"
#include "base/json_writer.hpp"
#include "sources/files/event_file.hpp"
#include "sources/jetstream/jetstream_frames.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::sources {
namespace {

using pipeline::AccountEvent;
using pipeline::Operation;
using pipeline::RecordEvent;
using ::testing::HasSubstr;

constexpr const char* kCorpusDir = "protocols/jetstream/data/internal/corpus/testdata";
constexpr const char* kGoldenV1 =
    "protocols/jetstream/data/internal/subscribe/testdata/golden_v1.jsonl";
constexpr const char* kLegacyDict =
    "protocols/jetstream/data/internal/subscribe/dictionaries/legacy_subscribe.zdict";
constexpr const char* kV2Dict =
    "protocols/jetstream/data/internal/subscribe/dictionaries/subscribe_events_20260811.zdict";
constexpr std::string_view kPrefix = "network.bsky.jetstream.subscribeEvents#";
const char* kDid = "did:plc:ewvi7nxzyoun6zhxrhs64oiz";

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    if (nl > start) lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

// The `record` object's exact text in a v1 line, found without a JSON parser: v1 writes "record"
// then "cid" last in the commit object.
std::string RecordSlice(const std::string& line) {
  const size_t start = line.find("\"record\":");
  const size_t end = line.rfind(",\"cid\":\"");
  if (start == std::string::npos || end == std::string::npos || end < start) return "";
  return line.substr(start + 9, end - start - 9);
}

// Decodes with v1 and checks success.
JetstreamFrame V1(std::string_view text) {
  JetstreamFrame frame;
  std::string kind;
  Status s = DecodeJetstreamV1(text, &frame, &kind);
  EXPECT_TRUE(s.ok()) << text << ": " << kind << " " << s.ToString();
  return frame;
}

JetstreamFrame V2(std::string_view text) {
  JetstreamFrame frame;
  std::string kind;
  Status s = DecodeJetstreamV2(text, &frame, &kind);
  EXPECT_TRUE(s.ok()) << text << ": " << kind << " " << s.ToString();
  return frame;
}

// The error kind DecodeJetstreamV2 gives `text` ("ok" when it decodes).
std::string V2Kind(std::string_view text, Status* status = nullptr) {
  JetstreamFrame frame;
  std::string kind;
  Status s = DecodeJetstreamV2(text, &frame, &kind);
  if (status != nullptr) *status = s;
  return s.ok() ? "ok" : kind;
}

// A v2 commit payload with the given fields replaced or removed (value "" removes it). Fields
// are written in the order given, `record` raw.
std::string V2Frame(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string out = R"({"$type":"message","payload":{)";
  bool first = true;
  for (const auto& [key, value] : fields) {
    if (value.empty()) continue;
    if (!first) out += ",";
    first = false;
    out += "\"" + key + "\":" + value;
  }
  return out + "}}";
}

std::vector<std::pair<std::string, std::string>> CommitFields() {
  return {{"$type", "\"network.bsky.jetstream.subscribeEvents#commit\""},
          {"cid", "\"bafyreie5cvv4h45feadgeuwhbcutmh6t2ceseocckahdoe6uat64zmz454\""},
          {"collection", "\"app.bsky.feed.post\""},
          {"did", std::string("\"") + kDid + "\""},
          {"operation", "\"create\""},
          {"record",
           R"({"$type":"app.bsky.feed.post","createdAt":"2024-01-01T00:00:00Z","text":"hi"})"},
          {"rev", "\"3l2222222222a\""},
          {"rkey", "\"3l2222222222b\""},
          {"seq", "7"},
          {"time", "\"2023-11-14T22:13:20.000001Z\""}};
}

std::string Replace(std::vector<std::pair<std::string, std::string>> fields, const std::string& key,
                    const std::string& value) {
  for (auto& [k, v] : fields) {
    if (k == key) v = value;
  }
  return V2Frame(fields);
}

// The v2 frame Jetstream would send for a decoded v1 event, at `seq` (the record JSON inserted
// verbatim).
std::string ToV2(const JetstreamFrame& v1, uint64_t seq) {
  JsonWriter w;
  w.BeginObject().Key("$type").String("message").Key("payload").BeginObject();
  const std::string time = atproto::Datetime::FromUnixMicros(v1.time_us)->str();
  if (const auto* r = std::get_if<RecordEvent>(&v1.payload)) {
    w.Key("$type").String(std::string(kPrefix) + "commit");
    if (r->operation != Operation::kDelete) w.Key("cid").String(r->cid.ToString());
    w.Key("collection").String(r->collection).Key("did").String(r->did);
    w.Key("operation").String(pipeline::OperationName(r->operation));
    if (r->operation != Operation::kDelete) w.Key("record").Raw(r->body);
    w.Key("rev").String(r->rev).Key("rkey").String(r->rkey);
  } else if (const auto* a = std::get_if<AccountEvent>(&v1.payload)) {
    w.Key("$type").String(std::string(kPrefix) + "account");
    w.Key("account").BeginObject().Key("active").Bool(a->active).Key("did").String(a->did);
    w.Key("seq").Int(a->seq).Key("time").String("2026-07-04T14:38:07.877Z").EndObject();
    w.Key("did").String(a->did);
  } else if (const auto* i = std::get_if<IdentityChange>(&v1.payload)) {
    w.Key("$type").String(std::string(kPrefix) + "identity").Key("did").String(i->did);
    w.Key("identity").BeginObject().Key("did").String(i->did);
    if (!i->handle.empty()) w.Key("handle").String(i->handle);
    w.Key("seq").Int(i->upstream_seq).Key("time").String("2026-07-04T14:38:07.877Z").EndObject();
  }
  w.Key("seq").Uint(seq).Key("time").String(time).EndObject().EndObject();
  return w.Take();
}

std::string Compress(std::string_view text, const ZstdDictionary* dict, int level = 1) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  const size_t n =
      dict == nullptr
          ? ZSTD_compressCCtx(cctx, out.data(), out.size(), text.data(), text.size(), level)
          : ZSTD_compress_usingDict(cctx, out.data(), out.size(), text.data(), text.size(),
                                    dict->bytes().data(), dict->bytes().size(), level);
  ZSTD_freeCCtx(cctx);
  EXPECT_FALSE(ZSTD_isError(n)) << ZSTD_getErrorName(n);
  out.resize(ZSTD_isError(n) ? 0 : n);
  return out;
}

// Compresses with explicit frame parameters: no content size in the header, and/or a checksum.
std::string CompressWith(std::string_view text, bool content_size, bool checksum) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, content_size ? 1 : 0);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, checksum ? 1 : 0);
  const size_t n = ZSTD_compress2(cctx, out.data(), out.size(), text.data(), text.size());
  ZSTD_freeCCtx(cctx);
  EXPECT_FALSE(ZSTD_isError(n)) << ZSTD_getErrorName(n);
  out.resize(ZSTD_isError(n) ? 0 : n);
  return out;
}

std::shared_ptr<const ZstdDictionary> LoadDict(const std::filesystem::path& path) {
  const std::string bytes = testing::ReadFileOrDie(path);
  auto dict = ZstdDictionary::Load(AsBytes(bytes));
  EXPECT_TRUE(dict.ok()) << dict.status().ToString();
  return dict.ok() ? *dict : nullptr;
}

ZstdFrameDecoder MakeDecoder(std::shared_ptr<const ZstdDictionary> dict,
                             size_t cap = ZstdFrameDecoder::kDefaultMaxOutput) {
  auto decoder = ZstdFrameDecoder::Create(std::move(dict), cap);
  EXPECT_TRUE(decoder.ok()) << decoder.status().ToString();
  return std::move(*decoder);
}

// --- v1 ---

struct KindCounts {
  int creates = 0, updates = 0, deletes = 0, identity = 0, account = 0;
};

// Decodes every line, checks each record's body is its exact slice of the line and hashes to
// its CID, and counts kinds.
KindCounts CheckV1Lines(const std::vector<std::string>& lines) {
  KindCounts counts;
  for (const auto& line : lines) {
    JetstreamFrame frame = V1(line);
    EXPECT_EQ(frame.seq, 0u) << "production v1 sends no cursor";
    EXPECT_GT(frame.time_us, 1'700'000'000'000'000) << line;
    EXPECT_FALSE(frame.advances_cursor());
    if (const auto* r = std::get_if<RecordEvent>(&frame.payload)) {
      EXPECT_EQ(r->position, static_cast<uint64_t>(frame.time_us));
      EXPECT_EQ(r->origin, pipeline::Origin::kLive);
      if (r->operation == Operation::kDelete) {
        ++counts.deletes;
        EXPECT_TRUE(r->body.empty());
        EXPECT_FALSE(r->cid.valid());
        continue;
      }
      ++(r->operation == Operation::kCreate ? counts.creates : counts.updates);
      EXPECT_EQ(r->body, RecordSlice(line)) << "the body is not the record's exact bytes";
      auto cid = atproto::CidOfRecord(r->body);
      EXPECT_TRUE(cid.ok()) << r->Uri() << ": " << cid.status().ToString();
      if (cid.ok()) {
        EXPECT_EQ(*cid, r->cid) << r->Uri();
      }
      if (r->body.find("\"createdAt\":\"") != std::string::npos) {
        EXPECT_FALSE(r->created_at.empty()) << r->Uri();
        EXPECT_THAT(r->body, HasSubstr("\"createdAt\":\"" + r->created_at + "\""));
      }
    } else if (std::holds_alternative<AccountEvent>(frame.payload)) {
      ++counts.account;
    } else if (std::holds_alternative<IdentityChange>(frame.payload)) {
      ++counts.identity;
    } else {
      ADD_FAILURE() << "unexpected kind " << FrameKindName(frame.kind());
    }
  }
  return counts;
}

int64_t ManifestInt(simdjson::dom::element manifest, const char* key) {
  int64_t v = -1;
  EXPECT_EQ(manifest[key].get_int64().get(v), simdjson::SUCCESS) << key;
  return v;
}

TEST(JetstreamFramesTest, TheProductionV1CorpusDecodesWithTheManifestsCounts) {
  ATFILL_SHARED_PATH(dir, kCorpusDir);
  const auto lines = Lines(testing::ReadFileOrDie(dir / "expected_v1.jsonl"));
  simdjson::dom::parser parser;
  simdjson::dom::element manifest;
  ASSERT_EQ(parser.load((dir / "manifest.json").string()).get(manifest), simdjson::SUCCESS);
  ASSERT_EQ(static_cast<int64_t>(lines.size()), ManifestInt(manifest, "v1_events"));
  const KindCounts counts = CheckV1Lines(lines);
  // SOURCE.md: 144 creates, 2 updates, 4 deletes, 1 identity, 1 account; so says the manifest.
  EXPECT_EQ(counts.creates, 144);
  EXPECT_EQ(counts.updates, 2);
  EXPECT_EQ(counts.deletes, 4);
  EXPECT_EQ(counts.identity, 1);
  EXPECT_EQ(counts.account, 1);
  EXPECT_EQ(counts.creates, ManifestInt(manifest, "creates"));
  EXPECT_EQ(counts.updates, ManifestInt(manifest, "updates"));
  EXPECT_EQ(counts.deletes, ManifestInt(manifest, "deletes"));
  EXPECT_EQ(counts.identity, ManifestInt(manifest, "identity"));
  EXPECT_EQ(counts.account, ManifestInt(manifest, "account"));
}

TEST(JetstreamFramesTest, TheGoldenV1LinesDecodeAndEveryRecordVerifies) {
  ATFILL_SHARED_PATH(path, kGoldenV1);
  const auto lines = Lines(testing::ReadFileOrDie(path));
  ASSERT_EQ(lines.size(), 10u);
  // The README's table: 5 creates, 2 updates, 1 delete, 1 identity, 1 account (active).
  const KindCounts counts = CheckV1Lines(lines);
  EXPECT_EQ(counts.creates, 5);
  EXPECT_EQ(counts.updates, 2);
  EXPECT_EQ(counts.deletes, 1);
  EXPECT_EQ(counts.identity, 1);
  EXPECT_EQ(counts.account, 1);
  JetstreamFrame account = V1(lines[8]);
  const auto* a = std::get_if<AccountEvent>(&account.payload);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(a->active);
  EXPECT_EQ(a->status, pipeline::AccountStatus::kActive);
  EXPECT_EQ(a->seq, 30340180351);
  EXPECT_EQ(a->time_us, 1779719010272410);
  EXPECT_EQ(a->did, "did:plc:g4ut2w5755qxi3fe7mfs72p4");
  JetstreamFrame identity = V1(lines[7]);
  const auto* i = std::get_if<IdentityChange>(&identity.payload);
  ASSERT_NE(i, nullptr);
  EXPECT_EQ(i->upstream_seq, 30340180350);
  EXPECT_FALSE(identity.TakeEvent().has_value());
  JetstreamFrame del = V1(lines[5]);
  const auto* d = std::get_if<RecordEvent>(&del.payload);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->collection, "org.hypercerts.claim.activity");
  EXPECT_EQ(d->operation, Operation::kDelete);
}

TEST(JetstreamFramesTest, V1CursorIsTheSeqAndIdentityCarriesItsHandle) {
  const std::string commit =
      std::string(R"({"did":")") + kDid +
      R"(","time_us":1700000000000001,"cursor":42,"kind":"commit","commit":{"rev":"3l2222222222a","operation":"delete","collection":"app.bsky.feed.post","rkey":"a"}})";
  JetstreamFrame frame = V1(commit);
  EXPECT_EQ(frame.seq, 42u);
  EXPECT_EQ(frame.time_us, 1700000000000001);
  EXPECT_TRUE(frame.advances_cursor());
  auto event = frame.TakeEvent();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(pipeline::PositionOf(*event), 42u);

  const std::string identity =
      std::string(R"({"did":")") + kDid +
      R"(","time_us":5,"cursor":43,"kind":"identity","identity":{"did":")" + kDid +
      R"(","handle":"alice.test","seq":99,"time":"2024-01-01T00:00:00Z"}})";
  frame = V1(identity);
  EXPECT_EQ(frame.kind(), FrameKind::kIdentity);
  EXPECT_EQ(frame.seq, 43u);
  EXPECT_TRUE(frame.advances_cursor());
  const auto* i = std::get_if<IdentityChange>(&frame.payload);
  ASSERT_NE(i, nullptr);
  EXPECT_EQ(i->handle, "alice.test");
  EXPECT_EQ(i->upstream_seq, 99);
  EXPECT_EQ(i->did, kDid);

  // event_file's wrapper positions by line number and skips identity events.
  pipeline::Event e;
  std::string kind;
  auto r = ParseJetstreamLine(commit, pipeline::Origin::kReplay, 7, &e, &kind);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(*r);
  EXPECT_EQ(pipeline::PositionOf(e), 7u);
  EXPECT_EQ(std::get<RecordEvent>(e).origin, pipeline::Origin::kReplay);
  r = ParseJetstreamLine(identity, pipeline::Origin::kReplay, 8, &e, &kind);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
}

TEST(JetstreamFramesTest, V1ErrorsNameTheEvent) {
  JetstreamFrame frame;
  std::string kind;
  Status s = DecodeJetstreamV1(
      R"({"did":"did:plc:x","time_us":5,"cursor":77,"kind":"commit","commit":{"rev":"3l2222222222a","operation":"create","collection":"app.bsky.feed.post","rkey":"a","record":{"$type":"a.b.c"},"cid":"nope"}})",
      &frame, &kind);
  EXPECT_EQ(kind, "invalid_cid");
  EXPECT_THAT(s.message(), HasSubstr("cursor 77"));
  s = DecodeJetstreamV1(R"({"did":"did:plc:x","time_us":5,"kind":"sync"})", &frame, &kind);
  EXPECT_EQ(kind, "unknown_kind");
  EXPECT_THAT(s.message(), HasSubstr("time_us 5"));
  s = DecodeJetstreamV1(R"({"did":"did:plc:x","time_us":"5","kind":"commit"})", &frame, &kind);
  EXPECT_EQ(kind, "bad_event");
  EXPECT_THAT(s.message(), HasSubstr("time_us"));
}

// --- the relay frames behind the v1 corpus ---

// End offset of the CBOR data item starting at `pos`; npos when it is malformed or truncated.
size_t CborItemEnd(ByteView d, size_t pos, int depth = 0) {
  constexpr size_t npos = std::string::npos;
  if (pos >= d.size() || depth > 64) return npos;
  const uint8_t ib = d[pos++];
  const int major = ib >> 5, info = ib & 31;
  uint64_t arg = info;
  if (info >= 24 && info <= 27) {
    const size_t n = size_t{1} << (info - 24);
    if (d.size() - pos < n) return npos;
    arg = 0;
    for (size_t i = 0; i < n; ++i) arg = arg << 8 | d[pos++];
  } else if (info > 27) {
    return npos;
  }
  switch (major) {
    case 2:
    case 3:
      return arg > d.size() - pos ? npos : pos + arg;
    case 4:
    case 5:
      for (uint64_t i = 0; i < arg * (major == 5 ? 2 : 1); ++i) {
        pos = CborItemEnd(d, pos, depth + 1);
        if (pos == npos) return npos;
      }
      return pos;
    case 6:
      return CborItemEnd(d, pos, depth + 1);
    default:
      return pos;
  }
}

std::string Str(const atproto::Value* v) {
  return v != nullptr && v->kind() == atproto::Value::Kind::kString ? v->as_string() : "";
}

TEST(JetstreamFramesTest, TheRelayFramesMatchTheV1CorpusOneToOne) {
  ATFILL_SHARED_PATH(dir, kCorpusDir);
  // The file is one plain zstd frame (no dictionary) of [u32 LE length][relay frame]...
  const std::string packed = testing::ReadFileOrDie(dir / "frames.bin.zst");
  ZstdFrameDecoder decoder = MakeDecoder(nullptr, 64u << 20);
  std::string raw;
  std::string kind;
  ASSERT_TRUE(decoder.Decompress(AsBytes(packed), &raw, &kind).ok()) << kind;
  ASSERT_GE(raw.capacity(), raw.size() + kJsonPadding);

  // The v1 events to match, by (did, rev, collection, rkey, operation) and (kind, did, seq).
  std::map<std::string, JetstreamFrame> v1;
  for (const auto& line : Lines(testing::ReadFileOrDie(dir / "expected_v1.jsonl"))) {
    JetstreamFrame frame = V1(line);
    std::string key;
    if (const auto* r = std::get_if<RecordEvent>(&frame.payload)) {
      key = r->did + " " + r->rev + " " + r->collection + "/" + r->rkey + " " +
            std::string(pipeline::OperationName(r->operation));
    } else if (const auto* a = std::get_if<AccountEvent>(&frame.payload)) {
      key = "#account " + a->did + " " + std::to_string(a->seq);
    } else if (const auto* i = std::get_if<IdentityChange>(&frame.payload)) {
      key = "#identity " + i->did + " " + std::to_string(i->upstream_seq);
    }
    ASSERT_TRUE(v1.emplace(key, std::move(frame)).second) << "two v1 events for " << key;
  }
  ASSERT_EQ(v1.size(), 152u);

  const ByteView bytes = AsBytes(raw);
  size_t pos = 0;
  int frames = 0, commits = 0, records_verified = 0;
  int64_t expected_seq = 31527015322;
  std::set<std::string> matched;
  while (pos < bytes.size()) {
    ASSERT_LE(4u, bytes.size() - pos);
    const uint32_t len = bytes[pos] | bytes[pos + 1] << 8 | bytes[pos + 2] << 16 |
                         static_cast<uint32_t>(bytes[pos + 3]) << 24;
    pos += 4;
    ASSERT_LE(len, bytes.size() - pos) << "frame " << frames << " is truncated";
    const ByteView frame = bytes.subspan(pos, len);
    pos += len;
    ++frames;
    const size_t header_end = CborItemEnd(frame, 0);
    ASSERT_NE(header_end, std::string::npos) << "frame " << frames;
    auto header = atproto::DecodeCbor(frame.first(header_end));
    ASSERT_TRUE(header.ok()) << header.status().ToString();
    atproto::CborLimits limits;
    limits.max_bytes = 8u << 20;
    auto body = atproto::DecodeCbor(frame.subspan(header_end), limits);
    ASSERT_TRUE(body.ok()) << "frame " << frames << ": " << body.status().ToString();
    ASSERT_EQ(header->Find("op")->as_int(), 1);
    const std::string type = Str(header->Find("t"));
    const int64_t seq = body->Find("seq")->as_int();
    EXPECT_EQ(seq, expected_seq++) << "the window is contiguous";
    if (type == "#identity" || type == "#account") {
      const std::string key = type + " " + Str(body->Find("did")) + " " + std::to_string(seq);
      ASSERT_TRUE(v1.contains(key)) << key;
      matched.insert(key);
      continue;
    }
    ASSERT_EQ(type, "#commit");
    ++commits;
    const std::string did = Str(body->Find("repo"));
    const std::string rev = Str(body->Find("rev"));
    const Bytes& car = body->Find("blocks")->as_bytes();
    auto reader = atproto::CarReader::Open(car);  // checks every block against its CID
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    atproto::BlockStore blocks;
    ASSERT_TRUE(atproto::LoadCarBlocks(&*reader, &blocks).ok());
    for (const auto& op : body->Find("ops")->as_array()) {
      const std::string key =
          did + " " + rev + " " + Str(op.Find("path")) + " " + Str(op.Find("action"));
      ASSERT_TRUE(v1.contains(key)) << "no v1 event for relay op " << key;
      ASSERT_TRUE(matched.insert(key).second) << key;
      const auto& r = std::get<RecordEvent>(v1.at(key).payload);
      if (r.operation == Operation::kDelete) continue;
      const atproto::Cid& cid = op.Find("cid")->as_link();
      EXPECT_EQ(r.cid, cid) << key;
      EXPECT_TRUE(blocks.Contains(cid)) << "the relay frame carries the record block";
      auto computed = atproto::CidOfRecord(r.body);
      ASSERT_TRUE(computed.ok()) << computed.status().ToString();
      EXPECT_EQ(*computed, cid) << "v1 JSON re-encodes to the relay's record bytes: " << key;
      ++records_verified;
    }
  }
  simdjson::dom::parser parser;
  simdjson::dom::element manifest;
  ASSERT_EQ(parser.load((dir / "manifest.json").string()).get(manifest), simdjson::SUCCESS);
  EXPECT_EQ(frames, ManifestInt(manifest, "frames"));
  EXPECT_EQ(commits, ManifestInt(manifest, "commit_frames"));
  EXPECT_EQ(expected_seq - 1, ManifestInt(manifest, "seq_last"));
  EXPECT_EQ(matched.size(), v1.size()) << "every v1 event comes from one relay event";
  EXPECT_EQ(records_verified, 146);
}

// --- v2 ---

TEST(JetstreamFramesTest, TheCorpusAsV2FramesDecodesToTheSameEvents) {
  ATFILL_SHARED_PATH(dir, kCorpusDir);
  uint64_t seq = 1000;
  int records = 0;
  for (const auto& line : Lines(testing::ReadFileOrDie(dir / "expected_v1.jsonl"))) {
    JetstreamFrame v1 = V1(line);
    const std::string text = ToV2(v1, ++seq);
    JetstreamFrame v2 = V2(text);
    ASSERT_EQ(v2.kind(), v1.kind()) << text;
    EXPECT_EQ(v2.seq, seq);
    EXPECT_TRUE(v2.advances_cursor());
    EXPECT_EQ(v2.time_us, v1.time_us) << "the RFC 3339 time keeps every microsecond";
    if (const auto* r2 = std::get_if<RecordEvent>(&v2.payload)) {
      const auto& r1 = std::get<RecordEvent>(v1.payload);
      EXPECT_EQ(r2->did, r1.did);
      EXPECT_EQ(r2->collection, r1.collection);
      EXPECT_EQ(r2->rkey, r1.rkey);
      EXPECT_EQ(r2->operation, r1.operation);
      EXPECT_EQ(r2->cid, r1.cid);
      EXPECT_EQ(r2->rev, r1.rev);
      EXPECT_EQ(r2->body, r1.body) << "byte-exact record";
      EXPECT_EQ(r2->created_at, r1.created_at);
      EXPECT_EQ(r2->position, seq);
      EXPECT_EQ(r2->origin, pipeline::Origin::kLive);
      ++records;
    } else if (const auto* a2 = std::get_if<AccountEvent>(&v2.payload)) {
      const auto& a1 = std::get<AccountEvent>(v1.payload);
      EXPECT_EQ(a2->did, a1.did);
      EXPECT_EQ(a2->active, a1.active);
      EXPECT_EQ(a2->seq, a1.seq);
      EXPECT_EQ(a2->position, seq);
    } else {
      const auto& i2 = std::get<IdentityChange>(v2.payload);
      EXPECT_EQ(i2.did, std::get<IdentityChange>(v1.payload).did);
      EXPECT_EQ(i2.upstream_seq, std::get<IdentityChange>(v1.payload).upstream_seq);
    }
  }
  EXPECT_EQ(records, 150);
}

TEST(JetstreamFramesTest, KeyOrderDoesNotMatterAndBodiesAreExactSlices) {
  auto fields = CommitFields();
  // Spaces inside the record are kept; the one after it is not part of it.
  const std::string record =
      R"({ "$type" : "app.bsky.feed.post", "nested": {"createdAt": "no"}, "createdAt" : "2024-01-01T00:00:00Z" })";
  for (auto& [k, v] : fields) {
    if (k == "record") v = record + "  ";
  }
  JetstreamFrame forward = V2(V2Frame(fields));
  std::reverse(fields.begin(), fields.end());
  JetstreamFrame backward = V2(V2Frame(fields));
  for (const auto* frame : {&forward, &backward}) {
    const auto* r = std::get_if<RecordEvent>(&frame->payload);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->body, record);
    EXPECT_EQ(r->created_at, "2024-01-01T00:00:00Z") << "the top-level createdAt, not a nested one";
    EXPECT_EQ(r->did, kDid);
    EXPECT_EQ(r->rkey, "3l2222222222b");
    EXPECT_EQ(r->rev, "3l2222222222a");
    EXPECT_EQ(frame->seq, 7u);
    EXPECT_EQ(frame->time_us, 1700000000000001);
  }
  // A record without a top-level createdAt (or a non-string one) leaves created_at empty.
  JetstreamFrame plain =
      V2(Replace(CommitFields(), "record", R"({"$type":"a.b.c","createdAt":5})"));
  EXPECT_EQ(std::get<RecordEvent>(plain.payload).created_at, "");
  EXPECT_EQ(std::get<RecordEvent>(plain.payload).body, R"({"$type":"a.b.c","createdAt":5})");
}

TEST(JetstreamFramesTest, InPlaceAndCopiedTextsDecodeTheSame) {
  const std::string text = V2Frame(CommitFields());
  std::string padded = text;
  padded.reserve(text.size() + kJsonPadding);
  JetstreamFrame in_place;
  std::string kind;
  ASSERT_TRUE(
      DecodeJetstreamV2(padded, padded.capacity(), pipeline::Origin::kReplay, &in_place, &kind)
          .ok());
  JetstreamFrame copied = V2(text);
  const auto& a = std::get<RecordEvent>(in_place.payload);
  const auto& b = std::get<RecordEvent>(copied.payload);
  EXPECT_EQ(a.body, b.body);
  EXPECT_EQ(a.origin, pipeline::Origin::kReplay);
  EXPECT_EQ(b.origin, pipeline::Origin::kLive);
}

TEST(JetstreamFramesTest, AccountIdentityAndSyncPayloads) {
  JetstreamFrame account = V2(
      std::string(
          R"({"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#account","account":{"active":false,"did":")") +
      kDid + R"(","seq":55,"status":"deleted","time":"2024-01-01T00:00:00Z"},"did":")" + kDid +
      R"(","seq":9,"time":"2024-01-01T00:00:00.500000Z"}})");
  ASSERT_EQ(account.kind(), FrameKind::kAccount);
  EXPECT_EQ(account.seq, 9u);
  auto event = account.TakeEvent();
  ASSERT_TRUE(event.has_value());
  const auto& a = std::get<AccountEvent>(*event);
  EXPECT_FALSE(a.active);
  EXPECT_EQ(a.status, pipeline::AccountStatus::kDeleted);
  EXPECT_EQ(a.seq, 55);
  EXPECT_EQ(a.time_us, 1704067200500000);
  EXPECT_EQ(a.position, 9u);

  JetstreamFrame identity = V2(
      std::string(
          R"({"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#identity","did":")") +
      kDid + R"(","identity":{"did":")" + kDid +
      R"(","handle":"bob.test","seq":56,"time":"2024-01-01T00:00:00Z"},"seq":10,"time":"2024-01-01T00:00:00.000000Z"}})");
  ASSERT_EQ(identity.kind(), FrameKind::kIdentity);
  EXPECT_EQ(identity.seq, 10u);
  EXPECT_TRUE(identity.advances_cursor()) << "identity changes nothing but moves the cursor";
  EXPECT_EQ(std::get<IdentityChange>(identity.payload).handle, "bob.test");
  EXPECT_EQ(std::get<IdentityChange>(identity.payload).upstream_seq, 56);
  EXPECT_FALSE(identity.TakeEvent().has_value());

  // #sync with a real CAR as its blocks, base64 without padding.
  ATFILL_SHARED_PATH(dir, kCorpusDir);
  const std::string car = testing::ReadFileOrDie(dir / "repo.car");
  const std::string b64 = Base64Encode(AsBytes(car), Base64Alphabet::kStandard, false);
  ASSERT_NE(b64.back(), '=');
  JetstreamFrame sync = V2(
      std::string(
          R"({"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#sync","did":")") +
      kDid + R"(","seq":11,"sync":{"blocks":{"$bytes":")" + b64 + R"("},"did":")" + kDid +
      R"(","rev":"3migo7fijwi2k","seq":57,"time":"2024-01-01T00:00:00Z"},"time":"2024-01-01T00:00:00.000000Z"}})");
  ASSERT_EQ(sync.kind(), FrameKind::kSync);
  EXPECT_TRUE(sync.advances_cursor());
  const auto& s = std::get<SyncMarker>(sync.payload);
  EXPECT_EQ(s.did, kDid);
  EXPECT_EQ(s.rev, "3migo7fijwi2k");
  EXPECT_EQ(s.upstream_seq, 57);
  EXPECT_EQ(AsChars(s.blocks), car);
  EXPECT_TRUE(atproto::CarReader::Open(s.blocks).ok());
}

TEST(JetstreamFramesTest, InfoFramesCarryNoSeq) {
  // Even a seq field in an #info payload is not a resume position.
  JetstreamFrame info = V2(
      R"({"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#info","message":"cursor clamped to seq 5","name":"OutdatedCursor","seq":99}})");
  ASSERT_EQ(info.kind(), FrameKind::kInfo);
  EXPECT_EQ(info.seq, 0u);
  EXPECT_FALSE(info.advances_cursor());
  EXPECT_EQ(std::get<StreamInfo>(info.payload).name, "OutdatedCursor");
  EXPECT_EQ(std::get<StreamInfo>(info.payload).message, "cursor clamped to seq 5");
  EXPECT_FALSE(info.TakeEvent().has_value());
  EXPECT_EQ(
      V2Kind(
          R"({"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#info"}})"),
      "missing_field");
}

TEST(JetstreamFramesTest, ErrorFramesSurfaceNameAndMessage) {
  JetstreamFrame error =
      V2(R"({"$type":"error","error":"InternalError","message":"stream read failed; reconnect"})");
  ASSERT_EQ(error.kind(), FrameKind::kError);
  EXPECT_EQ(error.seq, 0u);
  EXPECT_FALSE(error.advances_cursor());
  EXPECT_EQ(std::get<StreamError>(error.payload).name, "InternalError");
  EXPECT_EQ(std::get<StreamError>(error.payload).message, "stream read failed; reconnect");
  JetstreamFrame bare = V2(R"({"$type":"error","error":"ConsumerTooSlow"})");
  EXPECT_EQ(std::get<StreamError>(bare.payload).name, "ConsumerTooSlow");
  EXPECT_EQ(std::get<StreamError>(bare.payload).message, "");
  EXPECT_EQ(V2Kind(R"({"$type":"error","message":"x"})"), "missing_field");
  EXPECT_EQ(V2Kind(R"({"$type":"error","error":5})"), "bad_frame");
}

TEST(JetstreamFramesTest, MalformedV2FramesGiveTheirKind) {
  const auto c = CommitFields();
  const std::string sync_prefix =
      std::string(
          R"({"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#sync","did":")") +
      kDid + R"(","seq":3,"time":"2024-01-01T00:00:00.000000Z","sync":)";
  struct Case {
    std::string text, kind;
  };
  const std::vector<Case> cases = {
      {V2Frame(c), "ok"},
      {R"({"payload":{}})", "bad_frame"},
      {R"({"$type":5})", "bad_frame"},
      {R"({"$type":"wobble"})", "unknown_type"},
      {R"({"$type":"message"})", "bad_frame"},
      {R"({"$type":"message","payload":[]})", "bad_frame"},
      {R"({"$type":"message","payload":{"seq":1}})", "bad_frame"},
      {Replace(c, "$type", "\"network.bsky.jetstream.subscribeEvents#wobble\""), "unknown_type"},
      {Replace(c, "$type", "\"app.bsky.feed.post\""), "unknown_type"},
      {Replace(c, "seq", ""), "missing_field"},
      {Replace(c, "seq", "0"), "bad_seq"},
      {Replace(c, "seq", "-1"), "bad_frame"},
      {Replace(c, "seq", "\"7\""), "bad_frame"},
      {Replace(c, "time", ""), "missing_field"},
      {Replace(c, "time", "\"yesterday\""), "bad_time"},
      {Replace(c, "did", ""), "missing_field"},
      {Replace(c, "did", "\"alice\""), "invalid_did"},
      {Replace(c, "cid", "\"bafynope\""), "invalid_cid"},
      {Replace(c, "cid", ""), "missing_field"},
      {Replace(c, "cid", "7"), "bad_frame"},
      {Replace(c, "record", ""), "missing_field"},
      {Replace(c, "record", "\"text\""), "bad_frame"},
      {Replace(c, "rev", ""), "missing_field"},
      {Replace(c, "rev", "\"nope\""), "invalid_rev"},
      {Replace(c, "operation", "\"upsert\""), "unknown_operation"},
      {Replace(c, "collection", "\"app\""), "invalid_collection"},
      {Replace(c, "rkey", "\"..\""), "invalid_rkey"},
      {sync_prefix + R"({"blocks":{"$bytes":"!!!!"}}}})", "bad_base64"},
      {sync_prefix + R"({"blocks":{"$bytes":"AAE"}}}})", "ok"},
      {sync_prefix + R"({"blocks":"AAE"}}})", "bad_frame"},
      {sync_prefix + R"({"blocks":{"$bytes":"AAE","x":1}}}})", "bad_frame"},
      {sync_prefix + R"({"rev":"nope"}}})", "invalid_rev"},
      {R"({"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#account","did":"did:plc:x","seq":3,"time":"2024-01-01T00:00:00Z"}})",
       "missing_field"},
      {R"({"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#account","account":{"active":"yes"},"did":"did:plc:x","seq":3,"time":"2024-01-01T00:00:00Z"}})",
       "bad_frame"},
      {"[]", "bad_json"},
      {"", "bad_json"},
      {V2Frame(c) + "x", "bad_json"},
      {V2Frame(c) + "{}", "bad_json"},
      {"{\"$type\":\"message\",\"payload\":{\"did\":\"\xff\"}}", "bad_json"},
  };
  for (const auto& k : cases) {
    Status s;
    EXPECT_EQ(V2Kind(k.text, &s), k.kind) << k.text << "\n" << s.ToString();
  }
  // Errors found after the seq was read name it; earlier ones name the frame's size and offset.
  Status s;
  ASSERT_EQ(V2Kind(Replace(c, "cid", "\"bafynope\""), &s), "invalid_cid");
  EXPECT_THAT(s.message(), HasSubstr("frame seq 7"));
  ASSERT_EQ(V2Kind(Replace(c, "seq", "\"7\""), &s), "bad_frame");
  EXPECT_THAT(s.message(), HasSubstr("field 'seq' at byte"));
  const std::string bad_utf8 = "{\"$type\":\"message\",\"payload\":{\"did\":\"\xff\"}}";
  ASSERT_EQ(V2Kind(bad_utf8, &s), "bad_json");
  EXPECT_THAT(s.message(), HasSubstr("frame of " + std::to_string(bad_utf8.size()) + " bytes"));
}

// Found by fuzz_jetstream_v1: On Demand only matched the brackets of the record's nested values
// (and of every field no decoder reads), so a stray byte inside one passed and the record went on
// as JSON that is not.
TEST(JetstreamFramesTest, BrokenJsonInsideARecordIsBadJson) {
  const auto c = CommitFields();
  const std::vector<std::string> broken = {
      R"({"$type":"a.b.c","reply":{"parent":{"uri":"at://x"%}}})",
      R"({"$type":"a.b.c","langs":["en",]})",
      R"({"$type":"a.b.c","n":01})",
      R"({"$type":"a.b.c","n":1.})",
      R"({"$type":"a.b.c","t":trux})",
      R"({"$type":"a.b.c","x":nul})",
      R"({"$type":"a.b.c","s":"\q"})",
      R"({"$type":"a.b.c","o":{"k" 1}})",
  };
  for (const std::string& record : broken) {
    Status s;
    EXPECT_EQ(V2Kind(Replace(CommitFields(), "record", record), &s), "bad_json") << record << "\n"
                                                                                 << s.ToString();
    const std::string v1 =
        std::string(R"({"did":")") + kDid +
        R"(","time_us":5,"kind":"commit","commit":{"rev":"3l2222222222a","operation":"create","collection":"app.bsky.feed.post","rkey":"a","cid":"bafyreie5cvv4h45feadgeuwhbcutmh6t2ceseocckahdoe6uat64zmz454","record":)" +
        record + "}}";
    JetstreamFrame frame;
    std::string kind;
    EXPECT_FALSE(DecodeJetstreamV1(v1, &frame, &kind).ok()) << v1;
    EXPECT_EQ(kind, "bad_json") << v1;
  }
  // The same in fields no decoder reads: the envelope, the payload, the wrapped event, $bytes.
  for (
      const std::string& frame :
      {V2Frame(c).substr(0, 1) + R"("x":[%],)" + V2Frame(c).substr(1),
       [] {
         auto fields = CommitFields();
         fields.emplace_back("extra", "tru");
         return V2Frame(fields);
       }(),
       std::string(
           R"({"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#identity","did":")") +
           kDid +
           R"(","identity":{"did":nul,"handle":"bob.test"},"seq":10,"time":"2024-01-01T00:00:00Z"}})"}) {
    Status s;
    EXPECT_EQ(V2Kind(frame, &s), "bad_json") << frame << "\n" << s.ToString();
  }
  for (const char* extra : {R"("x":[%])", R"("identity":{"did":01})"}) {
    const std::string v1 =
        std::string(R"({"did":")") + kDid + R"(","time_us":5,"kind":"identity",)" + extra + "}";
    JetstreamFrame frame;
    std::string kind;
    EXPECT_FALSE(DecodeJetstreamV1(v1, &frame, &kind).ok()) << v1;
    EXPECT_EQ(kind, "bad_json") << v1;
  }
  // Valid values of every type still pass, nested createdAt strings included.
  const std::string good =
      R"({"$type":"a.b.c","a":[1,-0.5e+3,true,false,null,"\u00e9",{}],"o":{"createdAt":"x"},"createdAt":"2024-01-01T00:00:00Z"})";
  EXPECT_EQ(V2Kind(Replace(CommitFields(), "record", good)), "ok");
}

TEST(JetstreamFramesTest, EveryTruncationOfAFrameIsBadJson) {
  const std::string text = V2Frame(CommitFields());
  for (size_t n = 0; n < text.size(); ++n) {
    Status s;
    EXPECT_EQ(V2Kind(text.substr(0, n), &s), "bad_json") << n << ": " << s.ToString();
  }
}

TEST(JetstreamFramesTest, DamagedFramesAreErrorsNeverCrashes) {
  const std::set<std::string> kinds = {
      "ok",          "bad_json",           "bad_frame",         "unknown_type", "missing_field",
      "bad_seq",     "bad_time",           "invalid_did",       "invalid_rkey", "invalid_rev",
      "invalid_cid", "invalid_collection", "unknown_operation", "bad_base64"};
  const std::string base = V2Frame(CommitFields());
  std::mt19937 rng(12345);
  int errors = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string text = base;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % text.size();
      switch (rng() % 3) {
        case 0:
          text[at] = static_cast<char>(rng() % 256);
          break;
        case 1:
          text.erase(at, 1);
          break;
        default:
          text.insert(at, 1, "{}[]\",:0\\"[rng() % 9]);
      }
    }
    const std::string kind = V2Kind(text);
    EXPECT_TRUE(kinds.contains(kind)) << kind << ": " << text;
    errors += kind != "ok";
  }
  EXPECT_GT(errors, 2500);
}

// --- zstd ---

TEST(JetstreamFramesTest, BothRealDictionariesLoadWithTheirIds) {
  ATFILL_SHARED_PATH(legacy_path, kLegacyDict);
  ATFILL_SHARED_PATH(v2_path, kV2Dict);
  auto legacy = LoadDict(legacy_path);
  auto v2 = LoadDict(v2_path);
  ASSERT_TRUE(legacy && v2);
  EXPECT_EQ(legacy->id(), 1612007021u);
  EXPECT_EQ(v2->id(), 20260811u);
  EXPECT_EQ(legacy->bytes().size(), 112640u);
  EXPECT_EQ(v2->bytes().size(), 65536u);
}

TEST(JetstreamFramesTest, BadDictionariesAreRefused) {
  ATFILL_SHARED_PATH(v2_path, kV2Dict);
  const std::string good = testing::ReadFileOrDie(v2_path);
  auto refused = [](std::string bytes, std::string_view why) {
    auto d = ZstdDictionary::Load(AsBytes(bytes));
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), StatusCode::kInvalid);
    EXPECT_THAT(d.status().message(), HasSubstr(std::string(why)));
  };
  refused(good.substr(0, 7), "too short");
  std::string bad_magic = good;
  bad_magic[0] = 0x38;
  refused(bad_magic, "magic 0xEC30A437");
  std::string zero_id = good;
  zero_id.replace(4, 4, std::string(4, '\0'));
  refused(zero_id, "ID 0");
  // Right magic and ID, then bytes that are not entropy tables.
  refused(good.substr(0, 8) + std::string(200, '\xff'), "refused its entropy tables");
}

TEST(JetstreamFramesTest, DictionaryFramesRoundTripExactly) {
  ATFILL_SHARED_PATH(legacy_path, kLegacyDict);
  ATFILL_SHARED_PATH(v2_path, kV2Dict);
  ATFILL_SHARED_PATH(dir, kCorpusDir);
  auto legacy = LoadDict(legacy_path);
  auto v2 = LoadDict(v2_path);
  ASSERT_TRUE(legacy && v2);
  ZstdFrameDecoder v1_decoder = MakeDecoder(legacy);
  ZstdFrameDecoder v2_decoder = MakeDecoder(v2);
  std::string out, kind;
  size_t compressed = 0, plain = 0;
  uint64_t seq = 0;
  for (const auto& line : Lines(testing::ReadFileOrDie(dir / "expected_v1.jsonl"))) {
    // v1: the line itself, compressed with the legacy dictionary.
    const std::string z1 = Compress(line, legacy.get());
    ASSERT_EQ(ZSTD_getDictID_fromFrame(z1.data(), z1.size()), 1612007021u);
    ASSERT_TRUE(v1_decoder.Decompress(AsBytes(z1), &out, &kind).ok()) << kind;
    ASSERT_EQ(out, line);
    JetstreamFrame f1;
    ASSERT_TRUE(DecodeJetstreamV1(out, out.capacity(), pipeline::Origin::kLive, &f1, &kind).ok());
    // v2: the same event as a v2 frame, compressed with the v2 dictionary at "fastest".
    const std::string text = ToV2(f1, ++seq);
    const std::string z2 = Compress(text, v2.get(), 1);
    ASSERT_TRUE(v2_decoder.Decompress(AsBytes(z2), &out, &kind).ok()) << kind;
    ASSERT_EQ(out, text);
    ASSERT_GE(out.capacity(), out.size() + kJsonPadding);
    JetstreamFrame f2;
    ASSERT_TRUE(DecodeJetstreamV2(out, out.capacity(), pipeline::Origin::kLive, &f2, &kind).ok());
    EXPECT_EQ(f2.seq, seq);
    compressed += z2.size();
    plain += text.size();
  }
  // The dictionary is what makes small frames compress.
  EXPECT_LT(compressed * 2, plain);
}

TEST(JetstreamFramesTest, WrongDictionaryIsNamed) {
  ATFILL_SHARED_PATH(legacy_path, kLegacyDict);
  ATFILL_SHARED_PATH(v2_path, kV2Dict);
  auto legacy = LoadDict(legacy_path);
  auto v2 = LoadDict(v2_path);
  ASSERT_TRUE(legacy && v2);
  const std::string text = V2Frame(CommitFields());
  const std::string z = Compress(text, legacy.get());
  std::string out, kind;
  ZstdFrameDecoder v2_decoder = MakeDecoder(v2);
  Status s = v2_decoder.Decompress(AsBytes(z), &out, &kind);
  EXPECT_EQ(kind, "wrong_dictionary");
  EXPECT_EQ(s.code(), StatusCode::kInvalid);
  EXPECT_THAT(s.message(), HasSubstr("dictionary 1612007021"));
  EXPECT_THAT(s.message(), HasSubstr("dictionary 20260811"));
  ZstdFrameDecoder plain = MakeDecoder(nullptr);
  kind.clear();
  s = plain.Decompress(AsBytes(z), &out, &kind);
  EXPECT_EQ(kind, "wrong_dictionary");
  EXPECT_THAT(s.message(), HasSubstr("has none"));
  // A frame made without a dictionary decodes with or without one.
  const std::string z0 = Compress(text, nullptr);
  ASSERT_TRUE(v2_decoder.Decompress(AsBytes(z0), &out, &kind).ok());
  EXPECT_EQ(out, text);
}

TEST(JetstreamFramesTest, CorruptFramesAreBadZstd) {
  const std::string text = V2Frame(CommitFields()) + std::string(300, ' ');
  ZstdFrameDecoder decoder = MakeDecoder(nullptr);
  std::string out, kind;
  auto fails = [&](const std::string& frame, std::string_view why) {
    kind.clear();
    Status s = decoder.Decompress(AsBytes(frame), &out, &kind);
    EXPECT_EQ(kind, "bad_zstd") << why << ": " << s.ToString();
    EXPECT_EQ(s.code(), StatusCode::kCorrupt);
    EXPECT_THAT(s.message(), HasSubstr(std::string(why)));
  };
  const std::string z = CompressWith(text, true, true);
  fails("", "zstd frame magic");
  fails(std::string("\x28\xB5\x2F\xFD", 4), "not a complete frame");
  fails(text, "zstd frame magic");
  fails(z.substr(0, z.size() - 1), "not a complete frame");
  fails(z + z, "bytes after its end");
  std::string damaged = z;
  damaged[damaged.size() - 1] ^= 0x5a;  // the content checksum
  fails(damaged, "checksum");
  // The same without a content size in the header takes the streaming path.
  const std::string streamed = CompressWith(text, false, true);
  ASSERT_EQ(ZSTD_getFrameContentSize(streamed.data(), streamed.size()), ZSTD_CONTENTSIZE_UNKNOWN);
  ASSERT_TRUE(decoder.Decompress(AsBytes(streamed), &out, &kind).ok());
  EXPECT_EQ(out, text);
  damaged = streamed;
  damaged[damaged.size() - 1] ^= 0x5a;
  fails(damaged, "checksum");
  fails(streamed.substr(0, streamed.size() - 2), "not a complete frame");
  // Random damage anywhere: an error or (without a checksum to catch it) some output, never a
  // crash, and never more than the cap.
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string frame = (i % 2 == 0) ? z : streamed;
    frame[rng() % frame.size()] = static_cast<char>(rng() % 256);
    Status s = decoder.Decompress(AsBytes(frame), &out, &kind);
    if (s.ok()) {
      EXPECT_LE(out.size(), decoder.max_output());
    }
  }
}

TEST(JetstreamFramesTest, TheSizeCapIsEnforcedAndNamed) {
  const std::string text(5000, 'a');
  std::string out, kind;
  for (bool content_size : {true, false}) {
    const std::string z = CompressWith(text, content_size, false);
    ZstdFrameDecoder small = MakeDecoder(nullptr, 4999);
    Status s = small.Decompress(AsBytes(z), &out, &kind);
    EXPECT_EQ(kind, "frame_too_large") << content_size;
    EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
    EXPECT_THAT(s.message(), HasSubstr("cap of 4999 bytes"));
    ZstdFrameDecoder exact = MakeDecoder(nullptr, 5000);
    ASSERT_TRUE(exact.Decompress(AsBytes(z), &out, &kind).ok()) << content_size;
    EXPECT_EQ(out, text);
  }
  EXPECT_FALSE(ZstdFrameDecoder::Create(nullptr, 0).ok());
}

}  // namespace
}  // namespace atfill::sources
