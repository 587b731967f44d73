#include "atproto/car.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "atproto/cbor.hpp"
#include "atproto/value.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::atproto {
namespace {

constexpr const char* kRepoCar = "protocols/jetstream/data/internal/corpus/testdata/repo.car";

// A scratch file removed at the end of the test.
class TempFile {
 public:
  explicit TempFile(const std::string& stem) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ =
        std::filesystem::temp_directory_path() /
        ("atfill_car_" + std::string(info->name()) + "_" + stem + "_" + std::to_string(::getpid()));
  }
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  void Write(ByteView data) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data.data()),
              static_cast<std::streamsize>(data.size()));
  }

 private:
  std::filesystem::path path_;
};

Bytes CborOf(const Value& v) { return EncodeCbor(v); }

Bytes SampleBlock(int i) {
  Value::Map m;
  m.emplace_back("$type", Value::String("app.example.thing"));
  m.emplace_back("n", Value::Int(i));
  m.emplace_back("text", Value::String(std::string(static_cast<size_t>(i) * 37 % 500, 'x')));
  return CborOf(Value::MakeMap(std::move(m)));
}

Bytes HeaderOnly(const Value& header) {
  Bytes out;
  const Bytes h = CborOf(header);
  AppendVarint(h.size(), &out);
  out.insert(out.end(), h.begin(), h.end());
  return out;
}

Bytes ValidHeader() {
  const Cid root = Cid::Compute(Cid::Codec::kDagCbor, SampleBlock(0));
  Value::Map m;
  m.emplace_back("roots", Value::MakeArray({Value::Link(root)}));
  m.emplace_back("version", Value::Int(1));
  return HeaderOnly(Value::MakeMap(std::move(m)));
}

struct Parsed {
  Status status;
  std::vector<Cid> roots;
  std::vector<std::pair<Cid, Bytes>> blocks;
  std::vector<uint64_t> offsets;
};

Parsed ParseMemory(ByteView data, const CarLimits& limits = {}) {
  Parsed p;
  auto reader = CarReader::Open(data, limits);
  if (!reader.ok()) {
    p.status = reader.status();
    return p;
  }
  p.roots = reader->roots();
  CarBlock block;
  while (true) {
    auto more = reader->Next(&block);
    if (!more.ok()) {
      p.status = more.status();
      return p;
    }
    if (!*more) break;
    p.blocks.emplace_back(block.cid, Bytes(block.data.begin(), block.data.end()));
    p.offsets.push_back(block.offset);
  }
  EXPECT_EQ(reader->offset(), data.size());
  return p;
}

Parsed ParseFile(const std::filesystem::path& path, size_t chunk, const CarLimits& limits = {}) {
  Parsed p;
  auto reader = CarFileReader::Open(path, limits, chunk);
  if (!reader.ok()) {
    p.status = reader.status();
    return p;
  }
  p.roots = reader->roots();
  CarBlock block;
  while (true) {
    auto more = reader->Next(&block);
    if (!more.ok()) {
      p.status = more.status();
      return p;
    }
    if (!*more) break;
    p.blocks.emplace_back(block.cid, Bytes(block.data.begin(), block.data.end()));
    p.offsets.push_back(block.offset);
  }
  return p;
}

// Expects both readers to fail on `data` with `code` and a message naming "byte <offset>".
void ExpectError(const Bytes& data, StatusCode code, uint64_t offset, const std::string& needle) {
  SCOPED_TRACE(needle);
  const Parsed mem = ParseMemory(data);
  ASSERT_FALSE(mem.status.ok());
  EXPECT_EQ(mem.status.code(), code) << mem.status.ToString();
  EXPECT_NE(mem.status.message().find("byte " + std::to_string(offset)), std::string::npos)
      << mem.status.ToString();
  EXPECT_NE(mem.status.message().find(needle), std::string::npos) << mem.status.ToString();

  TempFile file("err");
  file.Write(data);
  for (size_t chunk : {size_t{64}, CarFileReader::kDefaultChunkBytes}) {
    const Parsed f = ParseFile(file.path(), chunk);
    ASSERT_FALSE(f.status.ok());
    EXPECT_EQ(f.status.code(), code) << f.status.ToString();
    EXPECT_NE(f.status.message().find("byte " + std::to_string(offset)), std::string::npos)
        << f.status.ToString();
  }
}

TEST(CarWriter, RoundTripInMemoryHandsOutViews) {
  std::vector<Bytes> blocks;
  for (int i = 0; i < 20; ++i) blocks.push_back(SampleBlock(i));
  const Cid root = Cid::Compute(Cid::Codec::kDagCbor, blocks[0]);
  const Cid roots[] = {root};
  CarWriter writer(roots);
  std::vector<Cid> cids;
  for (const Bytes& b : blocks) {
    auto cid = writer.AddBlock(b);
    ASSERT_TRUE(cid.ok()) << cid.status().ToString();
    cids.push_back(*cid);
  }
  const Cid raw = *writer.AddBlock(AsBytes("raw bytes"), Cid::Codec::kRaw);
  ASSERT_TRUE(writer.Finish().ok());
  const Bytes car = writer.TakeBytes();

  auto reader = CarReader::Open(car);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  ASSERT_EQ(reader->roots().size(), 1u);
  EXPECT_EQ(reader->roots()[0], root);
  CarBlock block;
  uint64_t last_offset = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto more = reader->Next(&block);
    ASSERT_TRUE(more.ok()) << more.status().ToString();
    ASSERT_TRUE(*more);
    EXPECT_EQ(block.cid, cids[i]);
    EXPECT_EQ(Bytes(block.data.begin(), block.data.end()), blocks[i]);
    // A view into the caller's buffer, not a copy.
    EXPECT_GE(block.data.data(), car.data());
    EXPECT_LE(block.data.data() + block.data.size(), car.data() + car.size());
    EXPECT_GT(block.offset, last_offset);
    last_offset = block.offset;
  }
  auto more = reader->Next(&block);
  ASSERT_TRUE(more.ok() && *more);
  EXPECT_EQ(block.cid, raw);
  EXPECT_EQ(block.cid.codec(), Cid::Codec::kRaw);
  more = reader->Next(&block);
  ASSERT_TRUE(more.ok());
  EXPECT_FALSE(*more);
  EXPECT_EQ(reader->offset(), car.size());
}

TEST(CarWriter, FileWriterAndChunkedFileReaderAgreeWithMemory) {
  std::vector<Bytes> blocks;
  for (int i = 0; i < 200; ++i) blocks.push_back(SampleBlock(i));
  std::vector<Cid> roots = {Cid::Compute(Cid::Codec::kDagCbor, blocks[3]),
                            Cid::Compute(Cid::Codec::kDagCbor, blocks[7])};
  TempFile file("car");
  CarWriter mem_writer(roots);
  {
    auto writer = CarWriter::CreateFile(file.path(), roots);
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    for (const Bytes& b : blocks) {
      ASSERT_TRUE(writer->AddBlock(b).ok());
      ASSERT_TRUE(mem_writer.AddBlock(b).ok());
    }
    ASSERT_TRUE(writer->Finish().ok());
    ASSERT_TRUE(writer->Finish().ok());  // idempotent
  }
  const std::string on_disk = testing::ReadFileOrDie(file.path());
  ASSERT_EQ(Bytes(on_disk.begin(), on_disk.end()), mem_writer.bytes());

  const Parsed mem = ParseMemory(mem_writer.bytes());
  ASSERT_TRUE(mem.status.ok()) << mem.status.ToString();
  ASSERT_EQ(mem.blocks.size(), blocks.size());
  EXPECT_EQ(mem.roots, roots);
  for (size_t chunk : {size_t{64}, size_t{100}, size_t{4096}, CarFileReader::kDefaultChunkBytes}) {
    SCOPED_TRACE(chunk);
    const Parsed f = ParseFile(file.path(), chunk);
    ASSERT_TRUE(f.status.ok()) << f.status.ToString();
    EXPECT_EQ(f.roots, mem.roots);
    EXPECT_EQ(f.blocks, mem.blocks);
    EXPECT_EQ(f.offsets, mem.offsets);
  }
}

TEST(CarWriter, EmptyRootsAndNoBlocks) {
  CarWriter writer(std::span<const Cid>{});
  const Parsed p = ParseMemory(writer.bytes());
  ASSERT_TRUE(p.status.ok()) << p.status.ToString();
  EXPECT_TRUE(p.roots.empty());
  EXPECT_TRUE(p.blocks.empty());
}

TEST(CarReader, MalformedHeaders) {
  ExpectError({}, StatusCode::kCorrupt, 0, "empty");
  ExpectError({0x80}, StatusCode::kCorrupt, 0, "truncated");
  ExpectError({0x80, 0x80}, StatusCode::kCorrupt, 0, "header length");
  ExpectError({0x00}, StatusCode::kInvalid, 0, "length zero");
  ExpectError({0x10, 0xa2, 0x65}, StatusCode::kCorrupt, 0, "declares 16 bytes");
  {
    Bytes huge;
    AppendVarint(uint64_t{1} << 40, &huge);
    ExpectError(huge, StatusCode::kOutOfRange, 0, "more than the limit");
  }
  // Non-minimal varint.
  ExpectError({0x81, 0x00}, StatusCode::kInvalid, 0, "minimal");
  ExpectError(HeaderOnly(Value::MakeArray({Value::Int(1)})), StatusCode::kInvalid, 1, "not a map");
  {
    Value::Map m;
    m.emplace_back("roots", Value::MakeArray());
    ExpectError(HeaderOnly(Value::MakeMap(m)), StatusCode::kInvalid, 1, "version");
    m.emplace_back("version", Value::Int(3));
    ExpectError(HeaderOnly(Value::MakeMap(m)), StatusCode::kInvalid, 1, "version 3");
  }
  {
    Value::Map m;
    m.emplace_back("version", Value::Int(2));
    ExpectError(HeaderOnly(Value::MakeMap(m)), StatusCode::kUnsupported, 1, "CARv2");
  }
  {
    Value::Map m;
    m.emplace_back("version", Value::Int(1));
    ExpectError(HeaderOnly(Value::MakeMap(m)), StatusCode::kInvalid, 1, "roots");
    m.emplace_back("roots", Value::MakeArray({Value::String("bafy")}));
    ExpectError(HeaderOnly(Value::MakeMap(m)), StatusCode::kInvalid, 1, "not a CID link");
  }
  {
    // Header bytes that are not DAG-CBOR at all (a float).
    Bytes bad = {0x09, 0xfb, 0, 0, 0, 0, 0, 0, 0, 0};
    const Parsed p = ParseMemory(bad);
    ASSERT_FALSE(p.status.ok());
    EXPECT_NE(p.status.message().find("CAR header at byte 1"), std::string::npos)
        << p.status.ToString();
  }
}

TEST(CarReader, MalformedSections) {
  const Bytes header = ValidHeader();
  const uint64_t at = header.size();
  auto with = [&](std::initializer_list<uint8_t> tail) {
    Bytes out = header;
    out.insert(out.end(), tail.begin(), tail.end());
    return out;
  };
  ExpectError(with({0x80}), StatusCode::kCorrupt, at, "truncated");
  ExpectError(with({0x00}), StatusCode::kInvalid, at, "length zero");
  ExpectError(with({0x0a, 0x01, 0x71}), StatusCode::kCorrupt, at, "declares 10 bytes");
  {
    Bytes huge = header;
    AppendVarint(uint64_t{1} << 62, &huge);
    ExpectError(huge, StatusCode::kOutOfRange, at, "more than the limit");
  }
  {
    // A CID of another version.
    Bytes bad = header;
    bad.push_back(40);
    bad.push_back(0x02);
    bad.insert(bad.end(), 39, 0x11);
    ExpectError(bad, StatusCode::kUnsupported, at, "bad CID");
  }
  {
    // A CIDv0 (multihash only).
    Bytes bad = header;
    bad.push_back(40);
    bad.push_back(0x12);
    bad.push_back(0x20);
    bad.insert(bad.end(), 38, 0x11);
    const Parsed p = ParseMemory(bad);
    ASSERT_FALSE(p.status.ok());
    EXPECT_NE(p.status.message().find("byte " + std::to_string(at)), std::string::npos);
  }
  {
    // A section shorter than a CID.
    Bytes bad = header;
    bad.push_back(5);
    bad.insert(bad.end(), {0x01, 0x71, 0x12, 0x20, 0x00});
    const Parsed p = ParseMemory(bad);
    ASSERT_FALSE(p.status.ok());
    EXPECT_NE(p.status.message().find("byte " + std::to_string(at)), std::string::npos)
        << p.status.ToString();
  }
  {
    // Hash mismatch: the CID of one block in front of another's bytes.
    const Bytes a = SampleBlock(1);
    const Bytes b = SampleBlock(2);
    const Cid cid_a = Cid::Compute(Cid::Codec::kDagCbor, a);
    Bytes bad = header;
    AppendVarint(Cid::kBinarySize + b.size(), &bad);
    bad.insert(bad.end(), cid_a.binary().begin(), cid_a.binary().end());
    bad.insert(bad.end(), b.begin(), b.end());
    ExpectError(bad, StatusCode::kCorrupt, at, cid_a.ToString());
    ExpectError(bad, StatusCode::kCorrupt, at, "SHA-256 mismatch");

    // Unchecked when asked.
    CarLimits unchecked;
    unchecked.verify_hashes = false;
    const Parsed p = ParseMemory(bad, unchecked);
    ASSERT_TRUE(p.status.ok()) << p.status.ToString();
    ASSERT_EQ(p.blocks.size(), 1u);
    EXPECT_EQ(p.blocks[0].first, cid_a);
  }
  {
    // A good section followed by a bad one: the error names the second section's offset.
    const Bytes a = SampleBlock(1);
    const Cid cid_a = Cid::Compute(Cid::Codec::kDagCbor, a);
    Bytes data = header;
    AppendVarint(Cid::kBinarySize + a.size(), &data);
    data.insert(data.end(), cid_a.binary().begin(), cid_a.binary().end());
    data.insert(data.end(), a.begin(), a.end());
    const uint64_t second = data.size();
    data.push_back(0x00);
    ExpectError(data, StatusCode::kInvalid, second, "length zero");
  }
}

TEST(CarReader, SectionLimit) {
  const Bytes big(100000, 0x42);
  CarWriter writer(std::span<const Cid>{});
  ASSERT_TRUE(writer.AddBlock(big, Cid::Codec::kRaw).ok());
  CarLimits small;
  small.max_section_bytes = 50000;
  const Parsed p = ParseMemory(writer.bytes(), small);
  ASSERT_FALSE(p.status.ok());
  EXPECT_EQ(p.status.code(), StatusCode::kOutOfRange);
  const Parsed ok = ParseMemory(writer.bytes());
  EXPECT_TRUE(ok.status.ok()) << ok.status.ToString();
}

TEST(CarFileReader, MissingFileIsIoError) {
  auto reader = CarFileReader::Open("/nonexistent/atfill/none.car");
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), StatusCode::kIoError);
}

TEST(CarRealData, RepoCarEveryBlockVerifies) {
  ATFILL_SHARED_PATH(path, kRepoCar);
  const std::string text = testing::ReadFileOrDie(path);
  const Bytes car(text.begin(), text.end());
  const Parsed p = ParseMemory(car);
  ASSERT_TRUE(p.status.ok()) << p.status.ToString();
  ASSERT_EQ(p.roots.size(), 1u);
  ASSERT_GT(p.blocks.size(), 0u);
  std::set<Cid> cids;
  for (const auto& [cid, data] : p.blocks) {
    EXPECT_EQ(Cid::Compute(cid.codec(), data), cid);
    cids.insert(cid);
  }
  EXPECT_TRUE(cids.contains(p.roots[0]));

  for (size_t chunk : {size_t{64}, size_t{1000}, CarFileReader::kDefaultChunkBytes}) {
    const Parsed f = ParseFile(path, chunk);
    ASSERT_TRUE(f.status.ok()) << f.status.ToString();
    EXPECT_EQ(f.blocks, p.blocks);
    EXPECT_EQ(f.offsets, p.offsets);
  }
}

TEST(CarRealData, EveryTruncationFailsOrEndsAtASectionBoundary) {
  ATFILL_SHARED_PATH(path, kRepoCar);
  const std::string text = testing::ReadFileOrDie(path);
  const Bytes car(text.begin(), text.end());
  const Parsed full = ParseMemory(car);
  ASSERT_TRUE(full.status.ok());
  const std::set<uint64_t> boundaries(full.offsets.begin(), full.offsets.end());
  size_t errors = 0;
  size_t clean = 0;
  for (size_t cut = 0; cut < car.size(); ++cut) {
    // A copy of exactly `cut` bytes, so ASan sees any read past the end.
    const Bytes truncated(car.begin(), car.begin() + static_cast<std::ptrdiff_t>(cut));
    const Parsed p = ParseMemory(truncated);
    if (p.status.ok()) {
      ++clean;
      EXPECT_TRUE(boundaries.contains(cut)) << "clean end at byte " << cut;
      EXPECT_LT(p.blocks.size(), full.blocks.size());
    } else {
      ++errors;
      EXPECT_NE(p.status.message().find("byte"), std::string::npos) << p.status.ToString();
    }
  }
  EXPECT_GT(errors, 0u);
  EXPECT_EQ(clean, boundaries.size());

  // The chunked file reader on a sample of the same truncations.
  TempFile file("trunc");
  for (size_t cut = 0; cut < car.size(); cut += 97) {
    file.Write(ByteView(car).first(cut));
    const Parsed mem = ParseMemory(ByteView(car).first(cut));
    const Parsed f = ParseFile(file.path(), 64);
    EXPECT_EQ(f.status.ok(), mem.status.ok()) << cut;
    EXPECT_EQ(f.status.code(), mem.status.code()) << cut;
  }
}

TEST(CarRealData, EveryByteFlipIsDetected) {
  ATFILL_SHARED_PATH(path, kRepoCar);
  const std::string text = testing::ReadFileOrDie(path);
  const Bytes car(text.begin(), text.end());
  const Parsed full = ParseMemory(car);
  ASSERT_TRUE(full.status.ok());
  size_t errors = 0;
  for (size_t i = 0; i < car.size(); ++i) {
    for (uint8_t mask : {uint8_t{0xff}, uint8_t{0x01}, uint8_t{0x80}}) {
      Bytes flipped = car;
      flipped[i] ^= mask;
      const Parsed p = ParseMemory(flipped);
      if (!p.status.ok()) {
        ++errors;
        continue;
      }
      // Accepted only if what it says differs (e.g. a flipped root CID in the header).
      EXPECT_TRUE(p.roots != full.roots || p.blocks != full.blocks)
          << "flip of byte " << i << " went unnoticed";
    }
  }
  EXPECT_GT(errors, car.size());
}

TEST(BlockStore, ViewsOwnedBytesAndFirstWins) {
  BlockStore store;
  const Bytes a = SampleBlock(1);
  const Cid cid_a = Cid::Compute(Cid::Codec::kDagCbor, a);
  store.PutView(cid_a, a);
  ASSERT_TRUE(store.Get(cid_a).has_value());
  EXPECT_EQ(store.Get(cid_a)->data(), a.data());
  store.Put(cid_a, Bytes{1, 2, 3});  // already present: ignored
  EXPECT_EQ(store.Get(cid_a)->size(), a.size());

  const Cid cid_b = store.PutBlock(SampleBlock(2));
  EXPECT_EQ(cid_b, Cid::Compute(Cid::Codec::kDagCbor, SampleBlock(2)));
  for (int i = 3; i < 100; ++i) store.PutBlock(SampleBlock(i));  // owned blocks stay put
  ASSERT_TRUE(store.Get(cid_b).has_value());
  EXPECT_EQ(Bytes(store.Get(cid_b)->begin(), store.Get(cid_b)->end()), SampleBlock(2));
  EXPECT_EQ(store.size(), 99u);
  EXPECT_FALSE(store.Get(Cid::Compute(Cid::Codec::kRaw, AsBytes("absent"))).has_value());
  size_t visited = 0;
  store.ForEach([&](const Cid&, ByteView) { ++visited; });
  EXPECT_EQ(visited, store.size());
}

}  // namespace
}  // namespace atfill::atproto
