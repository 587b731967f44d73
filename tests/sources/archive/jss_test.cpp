// Jetstream v2 .jss segments: the gloom DID bloom, block bodies and frames, the reader against
// the upstream fixtures in ../shared/protocols/jetstream/data, the writer by round trip, and the
// ways a damaged segment is refused.
#include <gtest/gtest.h>
#include <zstd.h>

#include <algorithm>
#include <boost/crc.hpp>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "atproto/cid.hpp"
#include "sources/archive/jss.hpp"
#include "sources/archive/jss_bloom.hpp"
#include "tests/common/process.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::jss {
namespace {

constexpr uint64_t kCap = 1ull << 30;
constexpr const char* kSeal = "protocols/jetstream/data/segment/testdata/golden_seal.bin";
constexpr const char* kBlock = "protocols/jetstream/data/segment/testdata/golden_block.bin";
constexpr const char* kLegacy =
    "protocols/jetstream/data/segment/testdata/legacy_fixed4096_blooms.jss";
constexpr const char* kCorpus =
    "protocols/jetstream/data/internal/corpus/testdata/golden_corpus_segment.jss";
constexpr const char* kCorpusCids =
    "protocols/jetstream/data/internal/corpus/testdata/car_expected_records.tsv";

ByteView B(std::string_view s) { return AsBytes(s); }

// A row that owns its bytes, for comparing rows across blocks and files.
struct OwnedRow {
  uint64_t seq = 0;
  int64_t witnessed_at = 0, indexed_at = 0;
  Kind kind = Kind::kCreate;
  std::string collection, did, rkey, rev, payload;
  friend bool operator==(const OwnedRow&, const OwnedRow&) = default;
};

void PrintTo(const OwnedRow& r, std::ostream* os) {
  *os << "{seq " << r.seq << ", witnessed " << r.witnessed_at << ", indexed " << r.indexed_at
      << ", kind " << static_cast<int>(r.kind) << ", " << r.collection << ", " << r.did << ", "
      << r.rkey << ", " << r.rev << ", payload " << r.payload.size() << " bytes}";
}

OwnedRow Own(const Row& r) {
  return {r.seq,
          r.witnessed_at,
          r.indexed_at,
          r.kind,
          std::string(r.collection),
          std::string(r.did),
          std::string(r.rkey),
          std::string(r.rev),
          std::string(AsChars(r.payload))};
}

Row View(const OwnedRow& r) {
  Row v;
  v.seq = r.seq;
  v.witnessed_at = r.witnessed_at;
  v.indexed_at = r.indexed_at;
  v.kind = r.kind;
  v.collection = r.collection;
  v.did = r.did;
  v.rkey = r.rkey;
  v.rev = r.rev;
  v.payload = B(r.payload);
  return v;
}

std::vector<OwnedRow> RowsOf(const Block& block) {
  std::vector<OwnedRow> out;
  for (size_t i = 0; i < block.size(); ++i) out.push_back(Own(block.row(i)));
  return out;
}

// Every row of a segment, block after block; per-block row lists in *blocks when given.
std::vector<OwnedRow> AllRows(const SegmentReader& reader,
                              std::vector<std::vector<OwnedRow>>* blocks = nullptr) {
  std::vector<OwnedRow> out;
  for (size_t b = 0; b < reader.footer().blocks.size(); ++b) {
    auto block = reader.ReadBlock(b);
    EXPECT_TRUE(block.ok()) << block.status().ToString();
    if (!block.ok()) return out;
    auto rows = RowsOf(*block);
    out.insert(out.end(), rows.begin(), rows.end());
    if (blocks != nullptr) blocks->push_back(std::move(rows));
  }
  return out;
}

std::vector<Row> Views(const std::vector<OwnedRow>& rows) {
  std::vector<Row> out;
  for (const auto& r : rows) out.push_back(View(r));
  return out;
}

// The bytes [from, to) of a segment file.
std::string Slice(const std::string& file, uint64_t from, uint64_t to) {
  return file.substr(from, to - from);
}

std::string WithByte(std::string s, size_t at, uint8_t xor_mask) {
  s[at] = static_cast<char>(s[at] ^ xor_mask);
  return s;
}

uint32_t Crc32c(std::string_view s) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(s.data(), s.size());
  return crc.checksum();
}

// Replaces the CRC trailer of a serialized bloom with the right one for its other bytes.
std::string Recrc(std::string s) {
  const uint32_t crc = Crc32c(std::string_view(s).substr(0, s.size() - 4));
  std::memcpy(s.data() + s.size() - 4, &crc, 4);
  return s;
}

bool Contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

// The expected collection table (names in id order) and per-block id sets of rows written in
// blocks, by §4.5: first-seen order, the real collection before its row's sentinel.
struct ExpectedIndex {
  std::vector<std::string> names;
  std::map<std::string, uint32_t> counts;
  std::vector<std::set<size_t>> block_ids;
};

ExpectedIndex Expect(const std::vector<std::vector<OwnedRow>>& blocks) {
  ExpectedIndex e;
  auto id_of = [&](const std::string& name) {
    auto it = std::find(e.names.begin(), e.names.end(), name);
    if (it != e.names.end()) return static_cast<size_t>(it - e.names.begin());
    e.names.push_back(name);
    return e.names.size() - 1;
  };
  for (const auto& rows : blocks) {
    std::set<size_t> ids;
    for (const auto& r : rows) {
      if (!r.collection.empty()) {
        ids.insert(id_of(r.collection));
        ++e.counts[r.collection];
      }
      std::string sentinel;
      if (r.kind == Kind::kAccount) sentinel = "$account";
      if (r.kind == Kind::kIdentity) sentinel = "$identity";
      if (r.kind == Kind::kSync) sentinel = "$sync";
      if (!sentinel.empty()) {
        ids.insert(id_of(sentinel));
        e.counts[sentinel] += 0;
      }
    }
    e.block_ids.push_back(std::move(ids));
  }
  return e;
}

// Checks a footer's collection index against rows read from (or written to) its blocks.
void CheckCollectionIndex(const Footer& footer, const std::vector<std::vector<OwnedRow>>& blocks) {
  const ExpectedIndex e = Expect(blocks);
  ASSERT_EQ(footer.collections.size(), e.names.size());
  ASSERT_EQ(footer.masks.size(), blocks.size());
  for (size_t id = 0; id < e.names.size(); ++id) {
    EXPECT_EQ(footer.collections[id].name, e.names[id]) << "id " << id;
    EXPECT_EQ(footer.collections[id].count, e.counts.at(e.names[id])) << e.names[id];
  }
  for (size_t b = 0; b < blocks.size(); ++b) {
    EXPECT_EQ(footer.masks[b].size(), (e.names.size() + 7) / 8);
    for (size_t id = 0; id < e.names.size(); ++id) {
      EXPECT_EQ(footer.BlockHasCollection(b, id), e.block_ids[b].count(id) == 1)
          << "block " << b << " collection " << e.names[id];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Bloom

TEST(JssBloomTest, SpecTestVector) {
  const DidHash h = HashDid("did:plc:a");
  EXPECT_EQ(h.high, 0x9ce5f5ae4dd56a8aull);
  EXPECT_EQ(h.low, 0x2ee65a72042fee25ull);
  EXPECT_EQ(static_cast<uint32_t>(h.low) ^ static_cast<uint32_t>(h.low >> 32), 717861975u);
  const std::vector<uint16_t> want = {6,   23,  24,  45,  65,  102, 117, 168,
                                      171, 235, 272, 294, 369, 399, 457};
  EXPECT_EQ(Bloom::BitPositions(h, 15), want);
  EXPECT_EQ(Bloom::BlockOf(h, 131), 80u);
  EXPECT_EQ(Bloom::BlockOf(h, 1), 0u);

  // Adding it to a one-block k=15 filter sets exactly those bits.
  auto bloom = Bloom::Make(1, 15);
  ASSERT_TRUE(bloom.ok());
  EXPECT_FALSE(bloom->MayContain("did:plc:a"));
  bloom->Add("did:plc:a");
  EXPECT_EQ(bloom->count(), 1u);
  std::vector<uint16_t> set;
  for (uint16_t pos = 0; pos < 512; ++pos) {
    if (bloom->words()[pos / 64] >> (pos % 64) & 1) set.push_back(pos);
  }
  EXPECT_EQ(set, want);
  EXPECT_TRUE(bloom->MayContain("did:plc:a"));
  EXPECT_TRUE(bloom->MayContain(h));
  EXPECT_FALSE(bloom->MayContain("did:plc:b"));

  // With 131 blocks the bits land in block 80 only.
  auto wide = Bloom::Make(131, 15);
  ASSERT_TRUE(wide.ok());
  wide->Add(h);
  for (size_t w = 0; w < wide->words().size(); ++w) {
    EXPECT_EQ(wide->words()[w], w / 8 == 80 ? bloom->words()[w % 8] : 0) << "word " << w;
  }
}

TEST(JssBloomTest, Sizing) {
  using P = Bloom::Params;
  EXPECT_EQ(Bloom::SizeFor(0), (P{1, 15}));
  EXPECT_EQ(Bloom::SizeFor(1), (P{1, 15}));
  EXPECT_EQ(Bloom::SizeFor(2), (P{1, 15}));
  EXPECT_EQ(Bloom::SizeFor(3), (P{1, 15}));
  EXPECT_EQ(Bloom::SizeFor(8), (P{1, 15}));
  EXPECT_EQ(Bloom::SizeFor(16), (P{1, 11}));
  EXPECT_EQ(Bloom::SizeFor(4096), (P{131, 9}));
  const Bloom b = Bloom::ForCount(4096);
  EXPECT_EQ(b.num_blocks(), 131u);
  EXPECT_EQ(b.k(), 9u);
  EXPECT_EQ(b.serialized_size(), 8409u);
  EXPECT_EQ(b.Serialize().size(), 8409u);
  // The chosen size meets the 0.1% target that the first estimate (116 blocks) misses.
  EXPECT_LE(Bloom::EstimateFalsePositiveRate(131, 9, 4096), 0.001);
  EXPECT_GT(Bloom::EstimateFalsePositiveRate(116, 9, 4096), 0.001);
}

TEST(JssBloomTest, SerializeParseAndCrc) {
  Bloom bloom = Bloom::ForCount(100);
  for (int i = 0; i < 100; ++i) bloom.Add("did:plc:user" + std::to_string(i));
  const std::string bytes = bloom.Serialize();
  ASSERT_EQ(bytes.size(), Bloom::SerializedSize(bloom.num_blocks()));
  EXPECT_EQ(bytes[0], 1);
  auto parsed = Bloom::Parse(B(bytes));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(*parsed, bloom);
  EXPECT_EQ(parsed->count(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(parsed->MayContain("did:plc:user" + std::to_string(i)));
  int false_positives = 0;
  for (int i = 0; i < 10000; ++i)
    false_positives += parsed->MayContain("did:web:x" + std::to_string(i));
  EXPECT_LT(false_positives, 50);  // target 0.1%: ~10 expected

  // One flipped byte anywhere (prefix, words, trailer) fails the CRC.
  for (size_t at : {size_t{0}, size_t{3}, size_t{30}, bytes.size() - 10, bytes.size() - 1}) {
    auto bad = Bloom::Parse(B(WithByte(bytes, at, 0x40)));
    ASSERT_FALSE(bad.ok()) << "byte " << at;
    EXPECT_EQ(bad.status().code(), StatusCode::kCorrupt);
    EXPECT_TRUE(Contains(bad.status().message(), "CRC")) << bad.status().ToString();
  }
  // Short or long input, even with a valid CRC.
  EXPECT_FALSE(Bloom::Parse(B(bytes.substr(0, 24))).ok());
  EXPECT_FALSE(Bloom::Parse(B(Recrc(bytes.substr(0, bytes.size() - 64)))).ok());
  EXPECT_FALSE(Bloom::Parse(B(Recrc(bytes + std::string(64, '\0')))).ok());
  // Another version or k, with a valid CRC.
  auto v2 = Bloom::Parse(B(Recrc(WithByte(bytes, 0, 0x03))));
  EXPECT_EQ(v2.status().code(), StatusCode::kUnsupported);
  std::string k18 = bytes;
  k18[1] = 18;
  EXPECT_EQ(Bloom::Parse(B(Recrc(k18))).status().code(), StatusCode::kUnsupported);
  EXPECT_FALSE(Bloom::Make(1, 2).ok());
  EXPECT_FALSE(Bloom::Make(0, 9).ok());
  // A filter with no blocks filters nothing.
  EXPECT_TRUE(Bloom().MayContain("did:plc:anything"));
}

// ---------------------------------------------------------------------------------------------
// Block bodies and frames

TEST(JssBlockTest, GoldenBlock) {
  ATFILL_SHARED_PATH(path, kBlock);
  const std::string frame = testing::ReadFileOrDie(path);
  ASSERT_EQ(frame.size(), 206u);
  auto body = DecompressFrame(B(frame), 0, kCap);
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  EXPECT_EQ(body->size(), 285u);
  const std::string body_copy = *body;
  auto block = Block::Parse(std::move(*body));
  ASSERT_TRUE(block.ok()) << block.status().ToString();
  ASSERT_EQ(block->size(), 3u);
  const std::vector<OwnedRow> want = {
      {1, 1700000000000000, 0, Kind::kCreate, "app.bsky.feed.post",
       "did:plc:abcdefghijklmnopqrstuvwx", "3l3qo2vuowo2b", "3l3qo2vutsw2b",
       std::string("\xA1\x65hello\x05", 8)},
      {2, 1700000001000000, 1700000000500000, Kind::kIdentity, "", "did:web:example.com", "", "",
       ""},
      {3, 1700000002000000, 0, Kind::kDelete, "app.bsky.feed.like",
       "did:plc:zzzzzzzzzzzzzzzzzzzzzzzz", "3l3qo2vuowo2c", "3l3qo2vutsw2c", ""},
  };
  EXPECT_EQ(RowsOf(*block), want);

  // The body layout is deterministic: re-encoding the rows gives the same bytes.
  EXPECT_EQ(SerializeBlockBody(Views(want)), body_copy);
  // And our own frame of them decodes to the same rows.
  const std::string ours = EncodeBlockBody(Views(want));
  ASSERT_FALSE(ours.empty());
  auto again = DecompressFrame(B(ours), 285, kCap);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, body_copy);

  // The expected size and the cap are enforced.
  EXPECT_TRUE(DecompressFrame(B(frame), 285, kCap).ok());
  auto mismatch = DecompressFrame(B(frame), 284, kCap);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_TRUE(Contains(mismatch.status().message(), "size mismatch"))
      << mismatch.status().ToString();
  auto over = DecompressFrame(B(frame), 0, 284);
  EXPECT_EQ(over.status().code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(DecompressFrame(B(frame), 0, 285).ok());
  // Not exactly one frame.
  EXPECT_FALSE(DecompressFrame(B(frame + "x"), 0, kCap).ok());
  EXPECT_FALSE(DecompressFrame(B(frame.substr(0, frame.size() - 1)), 0, kCap).ok());
  EXPECT_FALSE(DecompressFrame(B(frame + frame), 0, kCap).ok());
}

TEST(JssBlockTest, UpstreamNegativeCases) {
  auto bad = Block::Parse(std::string("\xFF\xFF\xFF\xFF\x00", 5));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorrupt);
  auto empty = Block::Parse(std::string(4, '\0'));
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(empty->size(), 0u);
  auto magic = DecompressFrame(B(std::string("\x28\xB5\x2F\xFD", 4)), 0, kCap);
  ASSERT_FALSE(magic.ok());
  EXPECT_EQ(magic.status().code(), StatusCode::kCorrupt);
  EXPECT_FALSE(DecompressFrame(B(""), 0, kCap).ok());
}

TEST(JssBlockTest, BodyValidation) {
  const std::vector<OwnedRow> rows = {
      {10, 5, 0, Kind::kCreate, "a.b.c", "did:plc:x", "r1", "v1", "payload"},
      {11, 6, 7, Kind::kAccount, "", "did:plc:y", "", "", "acct"},
  };
  const std::string body = SerializeBlockBody(Views(rows));
  ASSERT_EQ(body.size(), 4 + 34 * 2 + 5 + 9 + 9 + 2 + 2 + 7 + 4);
  auto ok = Block::Parse(body);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(RowsOf(*ok), rows);

  // A byte short, a byte over.
  auto shorter = Block::Parse(body.substr(0, body.size() - 1));
  ASSERT_FALSE(shorter.ok());
  EXPECT_TRUE(Contains(shorter.status().message(), "truncated")) << shorter.status().ToString();
  auto longer = Block::Parse(body + "x");
  ASSERT_FALSE(longer.ok());
  EXPECT_TRUE(Contains(longer.status().message(), "trailing")) << longer.status().ToString();
  // Shorter than the fixed columns, or than the row count.
  EXPECT_FALSE(Block::Parse(body.substr(0, 40)).ok());
  EXPECT_FALSE(Block::Parse(std::string(3, '\0')).ok());
  // Kinds 0 and 8 (the kind column starts at 4 + 24n).
  std::string kind0 = body;
  kind0[4 + 24 * 2] = 0;
  EXPECT_FALSE(Block::Parse(kind0).ok());
  std::string kind8 = body;
  kind8[4 + 24 * 2 + 1] = 8;
  EXPECT_FALSE(Block::Parse(kind8).ok());
  std::string kind7 = body;
  kind7[4 + 24 * 2 + 1] = 7;
  EXPECT_TRUE(Block::Parse(kind7).ok());
  // 262,144 rows is the limit.
  std::string too_many(4, '\0');
  const uint32_t n = kMaxBlockRows + 1;
  std::memcpy(too_many.data(), &n, 4);
  EXPECT_FALSE(Block::Parse(too_many).ok());

  // Rows the format cannot hold.
  OwnedRow long_rkey = rows[0];
  long_rkey.rkey.assign(256, 'k');
  EXPECT_FALSE(ValidateRow(View(long_rkey)).ok());
  EXPECT_TRUE(SerializeBlockBody(Views({long_rkey})).empty());
  OwnedRow bad_kind = rows[0];
  bad_kind.kind = static_cast<Kind>(0);
  EXPECT_FALSE(ValidateRow(View(bad_kind)).ok());
  EXPECT_TRUE(ValidateRow(View(rows[1])).ok());
}

TEST(JssBlockTest, FramesWithoutContentSize) {
  // A 1 MiB body streamed into a frame that does not record its size, as the Go encoder may.
  std::string body;
  std::mt19937 rng(7);
  for (int i = 0; i < (1 << 20); ++i) body.push_back(static_cast<char>('a' + rng() % 4));
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
  std::string frame(ZSTD_compressBound(body.size()), '\0');
  ZSTD_outBuffer out{frame.data(), frame.size(), 0};
  ZSTD_inBuffer in{body.data(), body.size(), 0};
  ASSERT_EQ(ZSTD_compressStream2(cctx, &out, &in, ZSTD_e_end), 0u);
  ZSTD_freeCCtx(cctx);
  frame.resize(out.pos);
  ASSERT_EQ(ZSTD_getFrameContentSize(frame.data(), frame.size()), ZSTD_CONTENTSIZE_UNKNOWN);

  auto unknown = DecompressFrame(B(frame), 0, kCap);
  ASSERT_TRUE(unknown.ok()) << unknown.status().ToString();
  EXPECT_EQ(*unknown, body);
  auto exact = DecompressFrame(B(frame), static_cast<uint32_t>(body.size()), kCap);
  ASSERT_TRUE(exact.ok()) << exact.status().ToString();
  EXPECT_EQ(*exact, body);
  EXPECT_TRUE(DecompressFrame(B(frame), 0, body.size()).ok());
  EXPECT_EQ(DecompressFrame(B(frame), 0, body.size() - 1).status().code(), StatusCode::kOutOfRange);
  EXPECT_FALSE(DecompressFrame(B(frame), static_cast<uint32_t>(body.size() + 1), kCap).ok());
  auto smaller = DecompressFrame(B(frame), static_cast<uint32_t>(body.size() - 1), kCap);
  ASSERT_FALSE(smaller.ok());
  EXPECT_TRUE(Contains(smaller.status().message(), "size mismatch")) << smaller.status().ToString();

  // The content checksum (the frame's last 4 bytes) is verified.
  auto sum = DecompressFrame(B(WithByte(frame, frame.size() - 2, 0x01)), 0, kCap);
  ASSERT_FALSE(sum.ok());
  EXPECT_TRUE(Contains(sum.status().message(), "checksum")) << sum.status().ToString();
  auto sum_sized = DecompressFrame(B(WithByte(frame, frame.size() - 2, 0x01)),
                                   static_cast<uint32_t>(body.size()), kCap);
  ASSERT_FALSE(sum_sized.ok());
  EXPECT_TRUE(Contains(sum_sized.status().message(), "checksum")) << sum_sized.status().ToString();
}

// Found by fuzz_jss_segment: a collection index of a few hundred bytes whose header and zstd
// frame both said ~1 GB made ParseFooter allocate that much before zstd found the lie.
// Found by fuzz_jss_block: a frame without a content size decompressed when its size was
// unknown must decompress alike when the index states that size.
TEST(JssBlockTest, AFrameDecompressesAlikeWithItsSizeKnown) {
  const unsigned char raw[] = {0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x00, 0x18, 0x00, 0x00,
                               0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x01, 0x00, 0x00};
  const ByteView frame(raw, sizeof raw);
  auto unknown = DecompressFrame(frame, 0, uint64_t{8} << 20);
  ASSERT_TRUE(unknown.ok()) << unknown.status().ToString();
  ASSERT_FALSE(unknown->empty());
  auto known = DecompressFrame(frame, static_cast<uint32_t>(unknown->size()), uint64_t{8} << 20);
  ASSERT_TRUE(known.ok()) << known.status().ToString() << " (" << unknown->size() << " bytes)";
  EXPECT_EQ(*known, *unknown);
}

TEST(JssBlockTest, ASizeNoFrameOfItsLengthCanHoldIsCorruptBeforeAllocating) {
  const std::string body(1000, 'a');
  const std::string frame = CompressFrame(body);
  ASSERT_FALSE(frame.empty());
  // The index claims 900 MB for a frame whose header has no size: refused, not allocated.
  std::string unsized = frame;
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
  unsized.resize(ZSTD_compressBound(body.size()));
  ZSTD_outBuffer out{unsized.data(), unsized.size(), 0};
  ZSTD_inBuffer in{body.data(), body.size(), 0};
  ASSERT_EQ(ZSTD_compressStream2(cctx, &out, &in, ZSTD_e_end), 0u);
  ZSTD_freeCCtx(cctx);
  unsized.resize(out.pos);
  auto lie = DecompressFrame(B(unsized), 900'000'000, uint64_t{1} << 30);
  ASSERT_FALSE(lie.ok());
  EXPECT_EQ(lie.status().code(), StatusCode::kCorrupt);
  EXPECT_TRUE(Contains(lie.status().message(), "cannot hold")) << lie.status().ToString();
  // The same frame with its true size, and the sized frame, still decompress.
  auto truth = DecompressFrame(B(unsized), 1000, uint64_t{1} << 30);
  ASSERT_TRUE(truth.ok()) << truth.status().ToString();
  EXPECT_EQ(*truth, body);
  auto sized = DecompressFrame(B(frame), 1000, uint64_t{1} << 30);
  ASSERT_TRUE(sized.ok()) << sized.status().ToString();
  // A highly compressible body (one RLE block per 128 KiB) is within the bound.
  const std::string zeros(size_t{4} << 20, '\0');
  const std::string small = CompressFrame(zeros, 19);
  auto big = DecompressFrame(B(small), static_cast<uint32_t>(zeros.size()), uint64_t{1} << 30);
  ASSERT_TRUE(big.ok()) << big.status().ToString() << " (frame of " << small.size() << " bytes)";
}

// ---------------------------------------------------------------------------------------------
// The reader against the upstream fixtures

TEST(JssReaderTest, GoldenSeal) {
  ATFILL_SHARED_PATH(path, kSeal);
  auto reader = SegmentReader::Open(path.string());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(reader->path(), path.string());
  const Header& h = reader->header();
  EXPECT_EQ(h.checksum, 0x03aa49bb5c88b97cull);
  EXPECT_TRUE(h.sealed());
  EXPECT_EQ(h.version, 1);
  EXPECT_EQ(h.block_count, 1u);
  EXPECT_EQ(h.event_count, 2u);
  EXPECT_EQ(h.unique_did_count, 2u);
  EXPECT_EQ(h.min_seq, 1u);
  EXPECT_EQ(h.max_seq, 2u);
  EXPECT_EQ(h.min_witnessed_at, 100);
  EXPECT_EQ(h.max_witnessed_at, 200);
  EXPECT_EQ(h.footer_offset, 369u);
  EXPECT_EQ(h.block_index_offset, 369u);
  EXPECT_EQ(h.did_bloom_offset, 421u);
  EXPECT_EQ(h.block_did_bloom_offset, 510u);
  EXPECT_EQ(h.collection_index_offset, 607u);

  const Footer& f = reader->footer();
  ASSERT_EQ(f.blocks.size(), 1u);
  EXPECT_EQ(f.blocks[0].offset, 256u);
  EXPECT_EQ(f.blocks[0].compressed_size, 369u - 256 - 8);
  EXPECT_EQ(f.blocks[0].event_count, 2u);
  EXPECT_EQ(f.blocks[0].min_seq, 1u);
  EXPECT_EQ(f.blocks[0].max_seq, 2u);
  EXPECT_EQ(f.blocks[0].min_witnessed_at, 100);
  EXPECT_EQ(f.blocks[0].max_witnessed_at, 200);

  auto block = reader->ReadBlock(0);
  ASSERT_TRUE(block.ok()) << block.status().ToString();
  const std::vector<OwnedRow> want = {
      {1, 100, 0, Kind::kCreate, "app.bsky.feed.post", "did:plc:a", "k1", "v1", "p1"},
      {2, 200, 250, Kind::kCreate, "app.bsky.feed.like", "did:plc:b", "k2", "v2", "p2"},
  };
  EXPECT_EQ(RowsOf(*block), want);
  EXPECT_EQ(block->body().size(), f.blocks[0].uncompressed_size);
  EXPECT_EQ(SerializeBlockBody(Views(want)), block->body());

  ASSERT_EQ(f.collections.size(), 2u);
  EXPECT_EQ(f.collections[0].name, "app.bsky.feed.post");
  EXPECT_EQ(f.collections[1].name, "app.bsky.feed.like");
  EXPECT_EQ(f.collections[0].count, 1u);
  EXPECT_EQ(f.collections[1].count, 1u);
  ASSERT_EQ(f.masks.size(), 1u);
  EXPECT_EQ(f.masks[0], "\x03");
  EXPECT_TRUE(f.BlockHasCollection(0, 0));
  EXPECT_TRUE(f.BlockHasCollection(0, 1));
  EXPECT_FALSE(f.BlockHasCollection(0, 2));
  EXPECT_FALSE(f.BlockHasCollection(1, 0));
  EXPECT_EQ(f.CollectionIds(std::vector<std::string>{"app.bsky.feed.like"}),
            std::vector<size_t>{1});
  EXPECT_EQ(f.CollectionIds(std::vector<std::string>{"app.bsky.feed.*"}),
            (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(f.CollectionIds(std::vector<std::string>{"app.bsky.graph.*"}).empty());
  EXPECT_EQ(f.CollectionId("app.bsky.feed.like"), 1u);
  EXPECT_FALSE(f.CollectionId("$account").has_value());

  ASSERT_EQ(f.block_blooms.size(), 1u);
  for (const Bloom* bloom : {&f.did_bloom, &f.block_blooms[0]}) {
    EXPECT_EQ(bloom->k(), 15u);
    EXPECT_EQ(bloom->num_blocks(), 1u);
    EXPECT_EQ(bloom->count(), 2u);
    EXPECT_EQ(bloom->serialized_size(), 89u);
    EXPECT_TRUE(bloom->MayContain("did:plc:a"));
    EXPECT_TRUE(bloom->MayContain("did:plc:b"));
    EXPECT_FALSE(bloom->MayContain("did:plc:c"));
  }
  // Our filter of the same DIDs is the fixture's, byte for byte.
  const std::string file = testing::ReadFileOrDie(path);
  Bloom ours = Bloom::ForCount(2);
  ours.Add("did:plc:a");
  ours.Add("did:plc:b");
  EXPECT_EQ(ours.Serialize(), Slice(file, 421, 510));
  EXPECT_EQ(ours.Serialize(), Slice(file, 518, 607));
  EXPECT_EQ(SegmentChecksum(B(file), B(std::string_view(file).substr(369))), h.checksum);

  // The same bytes from memory.
  auto mem = SegmentReader::OpenBytes(file, "golden_seal");
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  EXPECT_EQ(mem->header().checksum, h.checksum);
  auto mem_block = mem->ReadBlock(0);
  ASSERT_TRUE(mem_block.ok()) << mem_block.status().ToString();
  EXPECT_EQ(RowsOf(*mem_block), want);
  auto frame = mem->ReadFrame(0);
  ASSERT_TRUE(frame.ok());
  EXPECT_EQ(*frame, Slice(file, 264, 369));
  EXPECT_EQ(mem->ReadFrame(1).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(reader->ReadBlock(1).ok());
}

TEST(JssReaderTest, GoldenCorpusSegment) {
  ATFILL_SHARED_PATH(path, kCorpus);
  ATFILL_SHARED_PATH(cids_path, kCorpusCids);
  auto reader = SegmentReader::Open(path.string());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const Header& h = reader->header();
  EXPECT_EQ(h.checksum, 0x8ac51e3e2c8fb641ull);
  EXPECT_EQ(h.event_count, 23u);
  EXPECT_EQ(h.block_count, 3u);
  EXPECT_EQ(h.unique_did_count, 1u);
  EXPECT_EQ(h.min_seq, 1u);
  EXPECT_EQ(h.max_seq, 23u);
  EXPECT_EQ(h.min_witnessed_at, 1750000000000001);
  EXPECT_EQ(h.max_witnessed_at, 1750000000000023);
  const Footer& f = reader->footer();
  ASSERT_EQ(f.blocks.size(), 3u);
  EXPECT_EQ(f.blocks[0].event_count, 8u);
  EXPECT_EQ(f.blocks[1].event_count, 8u);
  EXPECT_EQ(f.blocks[2].event_count, 7u);

  // collection/rkey -> CID as `goat repo ls` printed them.
  std::map<std::string, std::string> cids;
  std::istringstream tsv(testing::ReadFileOrDie(cids_path));
  for (std::string line; std::getline(tsv, line);) {
    if (line.empty()) continue;
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    cids[line.substr(0, tab)] = line.substr(tab + 1);
  }
  ASSERT_EQ(cids.size(), 23u);

  std::vector<std::vector<OwnedRow>> blocks;
  const std::vector<OwnedRow> rows = AllRows(*reader, &blocks);
  ASSERT_EQ(rows.size(), 23u);
  std::set<std::string> seen;
  for (size_t i = 0; i < rows.size(); ++i) {
    const OwnedRow& r = rows[i];
    EXPECT_EQ(r.seq, i + 1);
    EXPECT_EQ(r.witnessed_at, 1750000000000000 + static_cast<int64_t>(i + 1));
    EXPECT_EQ(r.indexed_at, 0);
    EXPECT_EQ(r.kind, Kind::kCreate);
    EXPECT_EQ(r.did, "did:plc:53iucmf5ldftgqyf2ac7hmhd");
    EXPECT_EQ(r.rev, "3migo7fijwi2k");
    const std::string key = r.collection + "/" + r.rkey;
    seen.insert(key);
    ASSERT_TRUE(cids.count(key)) << key;
    EXPECT_EQ(atproto::Cid::Compute(atproto::Cid::Codec::kDagCbor, B(r.payload)).ToString(),
              cids[key])
        << key;
  }
  EXPECT_EQ(seen.size(), 23u);

  const std::vector<std::string> names = {"app.bsky.actor.profile", "app.bsky.feed.like",
                                          "app.bsky.feed.post", "app.bsky.feed.repost",
                                          "app.bsky.graph.follow"};
  ASSERT_EQ(f.collections.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(f.collections[i].name, names[i]);
  CheckCollectionIndex(f, blocks);
  EXPECT_EQ(f.CollectionIds(std::vector<std::string>{"app.bsky.feed.*", "app.bsky.graph.follow"}),
            (std::vector<size_t>{1, 2, 3, 4}));

  const std::string file = testing::ReadFileOrDie(path);
  Bloom one = Bloom::ForCount(1);
  one.Add("did:plc:53iucmf5ldftgqyf2ac7hmhd");
  EXPECT_EQ(one.Serialize(), Slice(file, h.did_bloom_offset, h.block_did_bloom_offset));
  ASSERT_EQ(f.block_blooms.size(), 3u);
  for (const Bloom& b : f.block_blooms) EXPECT_EQ(b, one);
}

TEST(JssReaderTest, LegacyFixed4096Blooms) {
  ATFILL_SHARED_PATH(path, kLegacy);
  auto reader = SegmentReader::Open(path.string());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const Header& h = reader->header();
  EXPECT_EQ(h.checksum, 0x90990e50dd911597ull);
  EXPECT_EQ(h.block_count, 2u);
  EXPECT_EQ(h.event_count, 12u);
  EXPECT_EQ(h.unique_did_count, 3u);
  const Footer& f = reader->footer();
  ASSERT_EQ(f.block_blooms.size(), 2u);
  EXPECT_EQ(h.collection_index_offset - h.block_did_bloom_offset, 8u + 2 * 8409);

  std::vector<std::vector<OwnedRow>> blocks;
  const std::vector<OwnedRow> rows = AllRows(*reader, &blocks);
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0].size(), 6u);
  EXPECT_EQ(blocks[1].size(), 6u);
  const std::vector<std::set<std::string>> want_dids = {
      {"did:plc:legacy-b0-u0", "did:plc:legacy-b0-u1"}, {"did:plc:legacy-b1-u0"}};
  const std::string file = testing::ReadFileOrDie(path);
  for (size_t b = 0; b < 2; ++b) {
    const Bloom& bloom = f.block_blooms[b];
    EXPECT_EQ(bloom.k(), 9u);
    EXPECT_EQ(bloom.num_blocks(), 131u);
    EXPECT_EQ(bloom.serialized_size(), 8409u);
    std::set<std::string> dids;
    for (const OwnedRow& r : blocks[b]) {
      dids.insert(r.did);
      EXPECT_TRUE(bloom.MayContain(r.did)) << r.did;
      EXPECT_TRUE(f.did_bloom.MayContain(r.did)) << r.did;
    }
    EXPECT_EQ(dids, want_dids[b]);
    // A 4096-sized filter of the block's DIDs is the fixture's, byte for byte.
    Bloom ours = Bloom::ForCount(4096);
    for (const std::string& d : dids) ours.Add(d);
    const uint64_t at = h.block_did_bloom_offset + 8 + b * 8409;
    EXPECT_EQ(ours.Serialize(), Slice(file, at, at + 8409)) << "block " << b;
  }
  EXPECT_FALSE(f.block_blooms[1].MayContain("did:plc:legacy-b0-u0"));
  CheckCollectionIndex(f, blocks);
}

// ---------------------------------------------------------------------------------------------
// Damaged segments

class JssDamageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::filesystem::path path =
        testing::SharedDir() / "protocols/jetstream/data/segment/testdata/golden_seal.bin";
    if (!std::filesystem::exists(path)) {
      if (testing::SharedRequired()) FAIL() << "missing " << path;
      GTEST_SKIP() << "third-party data missing: " << path;
    }
    seal_ = testing::ReadFileOrDie(path);
    ASSERT_EQ(seal_.size(), 672u);
  }

  static Status OpenStatus(const std::string& bytes) {
    return SegmentReader::OpenBytes(bytes, "damaged").status();
  }

  std::string seal_;
};

TEST_F(JssDamageTest, FlippedFooterOrHeaderByteFailsTheChecksum) {
  ASSERT_TRUE(OpenStatus(seal_).ok());
  // Block index, segment bloom, per-block bloom, collection index, and a covered header field.
  for (size_t at :
       {size_t{380}, size_t{450}, size_t{560}, size_t{620}, size_t{671}, size_t{20}, size_t{200}}) {
    const Status st = OpenStatus(WithByte(seal_, at, 0x01));
    ASSERT_FALSE(st.ok()) << "byte " << at;
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
    EXPECT_TRUE(Contains(st.message(), "checksum mismatch"))
        << "byte " << at << ": " << st.ToString();
  }
}

TEST_F(JssDamageTest, BlockRegionIsCoveredByZstdNotTheHeaderChecksum) {
  // Inside the frame's compressed data: the segment opens, the block does not decode.
  auto reader = SegmentReader::OpenBytes(WithByte(seal_, 300, 0x01), "damaged");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_FALSE(reader->ReadBlock(0).ok());
  // The length prefix disagrees with the block index.
  auto prefix = SegmentReader::OpenBytes(WithByte(seal_, 256, 0x01), "damaged");
  ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
  auto frame = prefix->ReadFrame(0);
  ASSERT_FALSE(frame.ok());
  EXPECT_TRUE(Contains(frame.status().message(), "length prefix")) << frame.status().ToString();
}

TEST_F(JssDamageTest, ActiveSegmentIsRefused) {
  std::string active = seal_;
  std::memset(active.data() + 4, 0, 8);
  const Status st = OpenStatus(active);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.message(), "not sealed")) << st.ToString();
  // A freshly created active file: magic and zeros, then blocks.
  std::string fresh = "jss0" + std::string(252, '\0') + seal_.substr(256, 369 - 256);
  EXPECT_TRUE(Contains(OpenStatus(fresh).message(), "not sealed"));
  auto parsed = ParseHeader(B(fresh), fresh.size());
  ASSERT_FALSE(parsed.ok());
  EXPECT_TRUE(Contains(parsed.status().message(), "not sealed"));
}

TEST_F(JssDamageTest, TruncatedFileIsRefused) {
  testing::TempDir dir;
  for (size_t size :
       {size_t{0}, size_t{100}, size_t{255}, size_t{300}, size_t{500}, size_t{600}, size_t{671}}) {
    const auto path = dir / ("cut" + std::to_string(size) + ".jss");
    testing::WriteFile(path, seal_.substr(0, size));
    auto reader = SegmentReader::Open(path.string());
    ASSERT_FALSE(reader.ok()) << "size " << size;
    EXPECT_EQ(reader.status().code(), StatusCode::kCorrupt) << reader.status().ToString();
    // Below 607 bytes the header's offsets run past the end; above, the collection index is cut
    // short and its zstd frame (or the checksum over it) fails.
    if (size < 607) {
      EXPECT_TRUE(Contains(reader.status().message(), "truncated")) << reader.status().ToString();
    }
    EXPECT_TRUE(Contains(reader.status().message(), path.string())) << reader.status().ToString();
  }
  EXPECT_EQ(SegmentReader::Open((dir / "missing.jss").string()).status().code(),
            StatusCode::kIoError);
}

TEST_F(JssDamageTest, HeaderValidation) {
  EXPECT_EQ(OpenStatus(WithByte(seal_, 0, 0x20)).code(), StatusCode::kInvalid);  // magic
  // Version 2 (refused before the checksum is looked at).
  EXPECT_EQ(OpenStatus(WithByte(seal_, 12, 0x03)).code(), StatusCode::kUnsupported);
  auto header = ParseHeader(B(seal_), seal_.size());
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(SerializeHeader(*header), seal_.substr(0, 256));
  // Offsets: inside the header, out of order, block index apart from the footer, past the end.
  auto with = [&](auto mutate) {
    Header h = *header;
    mutate(h);
    return ParseHeader(B(SerializeHeader(h)), seal_.size()).status();
  };
  EXPECT_FALSE(with([](Header& h) { h.footer_offset = h.block_index_offset = 100; }).ok());
  EXPECT_FALSE(with([](Header& h) { h.did_bloom_offset = 368; }).ok());
  EXPECT_FALSE(with([](Header& h) { h.block_did_bloom_offset = 420; }).ok());
  EXPECT_FALSE(with([](Header& h) { h.collection_index_offset = 509; }).ok());
  EXPECT_FALSE(with([](Header& h) { h.block_index_offset = 370; }).ok());
  EXPECT_FALSE(with([](Header& h) { h.collection_index_offset = 673; }).ok());
  EXPECT_TRUE(with([](Header&) {}).ok());
  EXPECT_FALSE(ParseHeader(B(seal_.substr(0, 200)), 672).ok());
}

TEST_F(JssDamageTest, FooterValidation) {
  auto header = ParseHeader(B(seal_), seal_.size());
  ASSERT_TRUE(header.ok());
  const std::string footer = seal_.substr(369);
  ASSERT_TRUE(ParseFooter(*header, B(footer)).ok());
  // The footer checks do not rely on the checksum: each damage is caught by name.
  auto status_with = [&](size_t at, uint8_t mask) {
    return ParseFooter(*header, B(WithByte(footer, at - 369, mask))).status();
  };
  EXPECT_FALSE(status_with(369, 0x80).ok());  // block offset past the footer
  EXPECT_FALSE(status_with(378, 0x10).ok());  // compressed_size
  EXPECT_FALSE(status_with(397, 0x02).ok());  // max_seq 0 < min_seq 1
  EXPECT_FALSE(status_with(450, 0x01).ok());  // segment bloom CRC
  EXPECT_FALSE(status_with(510, 0x01).ok());  // bloom region count
  EXPECT_FALSE(status_with(514, 0x01).ok());  // bloom size
  EXPECT_FALSE(status_with(560, 0x01).ok());  // block bloom CRC
  EXPECT_FALSE(status_with(607, 0x01).ok());  // collection count
  EXPECT_FALSE(status_with(611, 0x01).ok());  // collection block count
  EXPECT_FALSE(status_with(619, 0x01).ok());  // uncompressed size
  EXPECT_FALSE(status_with(660, 0x01).ok());  // collection frame
  EXPECT_FALSE(ParseFooter(*header, B(footer.substr(0, 250))).ok());
}

// ---------------------------------------------------------------------------------------------
// The writer

const std::vector<std::string> kCollections = {
    "app.bsky.feed.post",    "app.bsky.feed.like",         "app.bsky.feed.repost",
    "app.bsky.graph.follow", "app.bsky.graph.block",       "app.bsky.actor.profile",
    "app.bsky.graph.list",   "app.bsky.graph.listitem",    "chat.bsky.actor.declaration",
    "com.whtwnd.blog.entry", "fyi.unravel.frontpage.post", "app.bsky.feed.threadgate"};

// `count` rows of every kind over `dids` DIDs, seeded.
std::vector<OwnedRow> MixedRows(size_t count, size_t dids, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<OwnedRow> rows;
  uint64_t seq = 1000;
  int64_t witnessed = 1750000000000000;
  static const char kAlphabet[] = "234567abcdefghijklmnopqrstuvwxyz";
  auto tid = [&] {
    std::string s;
    for (int i = 0; i < 13; ++i) s.push_back(kAlphabet[rng() % 32]);
    return s;
  };
  for (size_t i = 0; i < count; ++i) {
    OwnedRow r;
    seq += 1 + rng() % 3;
    witnessed += rng() % 2000;
    r.seq = seq;
    r.witnessed_at = witnessed;
    r.indexed_at = rng() % 5 == 0 ? witnessed - 77 : 0;
    const uint32_t pick = rng() % 100;
    r.kind = pick < 55   ? Kind::kCreate
             : pick < 65 ? Kind::kUpdate
             : pick < 80 ? Kind::kDelete
             : pick < 85 ? Kind::kIdentity
             : pick < 90 ? Kind::kAccount
             : pick < 93 ? Kind::kSync
                         : Kind::kCreateResync;
    r.did = "did:plc:user" + std::to_string(rng() % dids);
    if (i % 997 == 500) r.did.clear();  // rows with no DID count for no DID
    const bool commit = r.kind == Kind::kCreate || r.kind == Kind::kUpdate ||
                        r.kind == Kind::kDelete || r.kind == Kind::kCreateResync;
    if (commit) {
      // Skewed so some collections are rare and absent from some blocks.
      const size_t c = std::min<size_t>(rng() % 12, rng() % 12);
      r.collection = kCollections[c];
      r.rkey = tid();
      r.rev = tid();
    } else if (r.kind == Kind::kSync) {
      r.rev = tid();
    }
    if (r.kind != Kind::kDelete) {
      const size_t n = rng() % 300;
      for (size_t j = 0; j < n; ++j) r.payload.push_back(static_cast<char>(rng()));
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

// Writes rows to a sealed segment at `path` and checks the writer's counters.
void WriteSegment(const std::filesystem::path& path, const std::vector<OwnedRow>& rows,
                  SegmentWriterOptions options) {
  auto writer = SegmentWriter::Create(path.string(), options);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  EXPECT_EQ(writer->bytes_written(), kHeaderSize);
  for (const OwnedRow& r : rows) {
    const Status st = writer->Append(View(r));
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  EXPECT_EQ(writer->rows(), rows.size());
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::exists(path.string() + ".tmp"));
  const Status sealed = writer->Seal();
  ASSERT_TRUE(sealed.ok()) << sealed.ToString();
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));
  EXPECT_EQ(writer->bytes_written(), std::filesystem::file_size(path));
  EXPECT_FALSE(writer->Append(View(rows.empty() ? OwnedRow{} : rows.back())).ok());
  EXPECT_FALSE(writer->Seal().ok());
}

TEST(JssWriterTest, RoundTripMixedKinds) {
  testing::TempDir dir;
  const auto path = dir / SegmentName(7);
  const std::vector<OwnedRow> rows = MixedRows(10000, 400, 11);
  SegmentWriterOptions options;
  options.rows_per_block = 1000;
  WriteSegment(path, rows, options);

  auto reader = SegmentReader::Open(path.string());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const Header& h = reader->header();
  const Footer& f = reader->footer();
  std::set<std::string> dids;
  for (const auto& r : rows) {
    if (!r.did.empty()) dids.insert(r.did);
  }
  int64_t min_w = rows[0].witnessed_at, max_w = rows[0].witnessed_at;
  for (const auto& r : rows) {
    min_w = std::min(min_w, r.witnessed_at);
    max_w = std::max(max_w, r.witnessed_at);
  }
  EXPECT_EQ(h.version, 1);
  EXPECT_EQ(h.event_count, 10000u);
  EXPECT_EQ(h.block_count, 10u);
  EXPECT_EQ(h.unique_did_count, dids.size());
  EXPECT_EQ(h.min_seq, rows.front().seq);
  EXPECT_EQ(h.max_seq, rows.back().seq);
  EXPECT_EQ(h.min_witnessed_at, min_w);
  EXPECT_EQ(h.max_witnessed_at, max_w);
  EXPECT_EQ(h.did_bloom_offset - h.block_index_offset, 10u * kBlockIndexEntrySize);
  const std::string file = testing::ReadFileOrDie(path);
  EXPECT_EQ(file.substr(0, 4), "jss0");
  EXPECT_EQ(file.substr(98, 158), std::string(158, '\0'));
  EXPECT_EQ(SegmentChecksum(B(file), B(std::string_view(file).substr(h.footer_offset))),
            h.checksum);

  std::vector<std::vector<OwnedRow>> blocks;
  const std::vector<OwnedRow> back = AllRows(*reader, &blocks);
  ASSERT_EQ(back.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(back[i], rows[i]) << "row " << i;

  // Block index: contiguous frames from byte 256, 1000 rows each, envelopes of their rows.
  uint64_t offset = kHeaderSize;
  size_t widest = 0;
  for (size_t b = 0; b < 10; ++b) {
    const BlockInfo& info = f.blocks[b];
    EXPECT_EQ(info.offset, offset);
    offset += 8 + info.compressed_size;
    EXPECT_EQ(info.event_count, 1000u);
    EXPECT_EQ(info.min_seq, rows[b * 1000].seq);
    EXPECT_EQ(info.max_seq, rows[b * 1000 + 999].seq);
    EXPECT_EQ(info.min_witnessed_at, rows[b * 1000].witnessed_at);
    EXPECT_EQ(info.max_witnessed_at, rows[b * 1000 + 999].witnessed_at);
    EXPECT_EQ(info.uncompressed_size, SerializeBlockBody(Views(blocks[b])).size());
    std::set<std::string> block_dids;
    for (const auto& r : blocks[b]) {
      if (r.did.empty()) continue;
      block_dids.insert(r.did);
      EXPECT_TRUE(f.block_blooms[b].MayContain(r.did)) << "block " << b << " " << r.did;
      EXPECT_TRUE(f.did_bloom.MayContain(r.did)) << r.did;
    }
    EXPECT_EQ(f.block_blooms[b].count(), block_dids.size());
    widest = std::max(widest, block_dids.size());
  }
  EXPECT_EQ(offset, h.footer_offset);

  // Blooms sized by the rule: the segment's for its DIDs, every block's for the widest block.
  const Bloom::Params seg = Bloom::SizeFor(dids.size());
  EXPECT_EQ(f.did_bloom.num_blocks(), seg.num_blocks);
  EXPECT_EQ(f.did_bloom.k(), seg.k);
  EXPECT_EQ(f.did_bloom.count(), dids.size());
  const Bloom::Params per_block = Bloom::SizeFor(widest);
  for (const Bloom& b : f.block_blooms) {
    EXPECT_EQ(b.num_blocks(), per_block.num_blocks);
    EXPECT_EQ(b.k(), per_block.k);
  }
  int false_positives = 0;
  for (int i = 0; i < 10000; ++i)
    false_positives += f.did_bloom.MayContain("did:web:n" + std::to_string(i));
  EXPECT_LT(false_positives, 50);

  // Collection index: every block's mask has exactly its rows' collections plus sentinels.
  CheckCollectionIndex(f, blocks);
  ASSERT_TRUE(f.CollectionId("$account").has_value());
  ASSERT_TRUE(f.CollectionId("$identity").has_value());
  ASSERT_TRUE(f.CollectionId("$sync").has_value());
  const std::vector<size_t> feed = f.CollectionIds(std::vector<std::string>{"app.bsky.feed.*"});
  std::vector<size_t> want_feed;
  for (size_t id = 0; id < f.collections.size(); ++id) {
    if (f.collections[id].name.starts_with("app.bsky.feed.")) want_feed.push_back(id);
  }
  EXPECT_EQ(want_feed.size(), 4u);
  EXPECT_EQ(feed, want_feed);
  EXPECT_TRUE(f.CollectionIds(std::vector<std::string>{"$account", "$sync"}).empty());
}

TEST(JssWriterTest, RewritesTheFixtures) {
  struct Case {
    const char* path;
    uint32_t rows_per_block;
    bool same_block_blooms;  // the legacy file's per-block blooms are sized for 4096
  };
  for (const Case& c : {Case{kSeal, 4096, true}, Case{kCorpus, 8, true}, Case{kLegacy, 6, false}}) {
    SCOPED_TRACE(c.path);
    ATFILL_SHARED_PATH(path, c.path);
    auto original = SegmentReader::Open(path.string());
    ASSERT_TRUE(original.ok()) << original.status().ToString();
    std::vector<std::vector<OwnedRow>> blocks;
    const std::vector<OwnedRow> rows = AllRows(*original, &blocks);

    testing::TempDir dir;
    const auto out = dir / "rewritten.jss";
    SegmentWriterOptions options;
    options.rows_per_block = c.rows_per_block;
    WriteSegment(out, rows, options);
    auto copy = SegmentReader::Open(out.string());
    ASSERT_TRUE(copy.ok()) << copy.status().ToString();
    std::vector<std::vector<OwnedRow>> copy_blocks;
    EXPECT_EQ(AllRows(*copy, &copy_blocks), rows);
    EXPECT_EQ(copy_blocks, blocks);

    const Header& a = original->header();
    const Header& b = copy->header();
    EXPECT_EQ(b.block_count, a.block_count);
    EXPECT_EQ(b.event_count, a.event_count);
    EXPECT_EQ(b.unique_did_count, a.unique_did_count);
    EXPECT_EQ(b.min_seq, a.min_seq);
    EXPECT_EQ(b.max_seq, a.max_seq);
    EXPECT_EQ(b.min_witnessed_at, a.min_witnessed_at);
    EXPECT_EQ(b.max_witnessed_at, a.max_witnessed_at);
    const Footer& fa = original->footer();
    const Footer& fb = copy->footer();
    ASSERT_EQ(fb.collections.size(), fa.collections.size());
    for (size_t i = 0; i < fa.collections.size(); ++i) {
      EXPECT_EQ(fb.collections[i].name, fa.collections[i].name);
      EXPECT_EQ(fb.collections[i].count, fa.collections[i].count);
    }
    EXPECT_EQ(fb.masks, fa.masks);
    for (size_t i = 0; i < fa.blocks.size(); ++i) {
      EXPECT_EQ(fb.blocks[i].uncompressed_size, fa.blocks[i].uncompressed_size);
      EXPECT_EQ(fb.blocks[i].event_count, fa.blocks[i].event_count);
      EXPECT_EQ(fb.blocks[i].min_seq, fa.blocks[i].min_seq);
      EXPECT_EQ(fb.blocks[i].max_witnessed_at, fa.blocks[i].max_witnessed_at);
    }
    // Blooms are deterministic, so ours equal the Go writer's.
    EXPECT_EQ(fb.did_bloom, fa.did_bloom);
    if (c.same_block_blooms) {
      EXPECT_EQ(fb.block_blooms, fa.block_blooms);
    }
  }
}

TEST(JssWriterTest, EmptySegment) {
  testing::TempDir dir;
  const auto path = dir / "empty.jss";
  WriteSegment(path, {}, {});
  auto reader = SegmentReader::Open(path.string());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(reader->header().block_count, 0u);
  EXPECT_EQ(reader->header().event_count, 0u);
  EXPECT_EQ(reader->header().collection_index_offset - reader->header().block_did_bloom_offset, 8u);
  EXPECT_TRUE(reader->footer().block_blooms.empty());
  EXPECT_TRUE(reader->footer().collections.empty());
  EXPECT_EQ(reader->footer().did_bloom.num_blocks(), 1u);
  EXPECT_FALSE(reader->ReadBlock(0).ok());
}

TEST(JssWriterTest, RefusesBadRowsAndCleansUp) {
  testing::TempDir dir;
  const auto path = dir / "bad.jss";
  {
    auto writer = SegmentWriter::Create(path.string());
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    OwnedRow r{5, 1, 0, Kind::kCreate, "a.b.c", "did:plc:x", "k", "v", "p"};
    ASSERT_TRUE(writer->Append(View(r)).ok());
    EXPECT_FALSE(writer->Append(View(r)).ok());  // same seq
    r.seq = 4;
    EXPECT_FALSE(writer->Append(View(r)).ok());  // lower seq
    r.seq = 6;
    r.collection = "$account";
    EXPECT_FALSE(writer->Append(View(r)).ok());  // a sentinel name
    r.collection = "a.b.c";
    r.kind = static_cast<Kind>(9);
    EXPECT_FALSE(writer->Append(View(r)).ok());
    r.kind = Kind::kCreate;
    r.rev.assign(300, 'v');
    EXPECT_FALSE(writer->Append(View(r)).ok());
    r.rev = "v";
    EXPECT_TRUE(writer->Append(View(r)).ok());
    EXPECT_EQ(writer->rows(), 2u);
    // Moved, then dropped unsealed: nothing is left behind.
    SegmentWriter moved = std::move(*writer);
    EXPECT_EQ(moved.rows(), 2u);
    EXPECT_TRUE(std::filesystem::exists(path.string() + ".tmp"));
  }
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));
  EXPECT_FALSE(std::filesystem::exists(path));

  SegmentWriterOptions bad;
  bad.rows_per_block = 0;
  EXPECT_FALSE(SegmentWriter::Create(path.string(), bad).ok());
  bad.rows_per_block = kMaxBlockRows + 1;
  EXPECT_FALSE(SegmentWriter::Create(path.string(), bad).ok());
  EXPECT_FALSE(SegmentWriter::Create((dir / "no/such/dir/x.jss").string()).ok());
}

TEST(JssWriterTest, LargeRowsEndABlockEarly) {
  testing::TempDir dir;
  const auto path = dir / "big.jss";
  SegmentWriterOptions options;
  options.max_block_bytes = 64 * 1024;
  std::vector<OwnedRow> rows;
  for (uint64_t i = 1; i <= 10; ++i) {
    rows.push_back({i, 1, 0, Kind::kCreate, "a.b.c", "did:plc:x", "k", "v",
                    std::string(20000, static_cast<char>('a' + i))});
  }
  WriteSegment(path, rows, options);
  auto reader = SegmentReader::Open(path.string());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  // Three 20 KB rows fit under 64 KiB; the fourth would not.
  ASSERT_EQ(reader->footer().blocks.size(), 4u);
  for (const BlockInfo& b : reader->footer().blocks) EXPECT_LE(b.uncompressed_size, 64u * 1024);
  EXPECT_EQ(AllRows(*reader), rows);
}

TEST(JssNameTest, SegmentNames) {
  EXPECT_EQ(SegmentName(0), "seg_0000000000.jss");
  EXPECT_EQ(SegmentName(35), "seg_000000000z.jss");
  EXPECT_EQ(SegmentName(36), "seg_0000000010.jss");
  EXPECT_EQ(SegmentName(1295), "seg_00000000zz.jss");
  for (uint64_t i : {uint64_t{0}, uint64_t{1}, uint64_t{12345678}, uint64_t{3656158440062975},
                     uint64_t{3656158440062976}, ~uint64_t{0}}) {
    auto back = ParseSegmentName(SegmentName(i));
    ASSERT_TRUE(back.ok()) << SegmentName(i) << ": " << back.status().ToString();
    EXPECT_EQ(*back, i);
  }
  EXPECT_EQ(SegmentName(3656158440062976), "seg_10000000000.jss");
  for (const char* bad :
       {"seg_000000000Z.jss", "seg_123.jss", "seg_0000000000.jsx", "seg_00000000000.jss",
        "xseg_0000000000.jss", "seg_00000-0000.jss", "seg_zzzzzzzzzzzzzz.jss", ""}) {
    EXPECT_FALSE(ParseSegmentName(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace atfill::jss
