// `.jss` segments as getSegment serves them or as they lie on disk: header, footer (block index,
// DID blooms, collection index) and blocks. The header checksum would stop almost every mutation
// at the door, so each input is read twice: as it is, and with its checksum recomputed, which
// must open exactly when its footer parses. Whatever opens is walked block by block, and every
// part that has an encoder must re-encode to the bytes it was read from.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "sources/archive/jss.hpp"
#include "tests/fuzz/fuzz_util.hpp"
#include "tests/fuzz/jss_checks.hpp"

namespace {

using atfill::fuzz::Check;
namespace jss = atfill::jss;

// Largest block body read (the reader's default is 1 GiB, too slow for fuzzing).
constexpr uint64_t kBlockCap = uint64_t{8} << 20;

void Walk(const jss::SegmentReader& reader) {
  const jss::Footer& footer = reader.footer();
  Check(footer.blocks.size() == reader.header().block_count, "one index entry per block");
  Check(footer.block_blooms.size() == footer.blocks.size(), "one bloom per block");
  Check(footer.masks.size() == footer.blocks.size(), "one collection mask per block");
  const std::vector<std::string> patterns = {"app.bsky.feed.*", "app.bsky.graph.follow"};
  for (size_t id : footer.CollectionIds(patterns)) {
    Check(id < footer.collections.size(), "collection ids are in the table");
  }
  (void)footer.CollectionId(jss::kSentinelAccount);
  for (size_t b = 0; b < footer.blocks.size(); ++b) {
    for (size_t id = 0; id < footer.collections.size() && id < 64; ++id) {
      (void)footer.BlockHasCollection(b, id);
    }
    auto block = reader.ReadBlock(b, kBlockCap);
    if (!block.ok()) continue;
    Check(block->size() == footer.blocks[b].event_count, "a block holds the rows its entry says");
    atfill::fuzz::CheckBlock(*block);
    for (size_t i = 0; i < block->size() && i < 64; ++i) {
      const jss::Row row = block->row(i);
      (void)footer.did_bloom.MayContain(row.did);
      (void)footer.block_blooms[b].MayContain(row.did);
    }
  }
}

// The parts of a footer that re-serialize: its blooms.
void CheckFooterBytes(const jss::Header& h, const jss::Footer& f, atfill::ByteView footer) {
  const auto region = [&](uint64_t from, uint64_t to) {
    return std::string(reinterpret_cast<const char*>(footer.data()) + (from - h.footer_offset),
                       to - from);
  };
  const std::string did_bloom = region(h.did_bloom_offset, h.block_did_bloom_offset);
  if (!did_bloom.empty()) Check(f.did_bloom.Serialize() == did_bloom, "DID bloom re-serializes");
  const std::string blooms = region(h.block_did_bloom_offset, h.collection_index_offset);
  std::string again = blooms.substr(0, 8);
  for (const jss::Bloom& bloom : f.block_blooms) bloom.AppendTo(&again);
  Check(again == blooms, "per-block blooms re-serialize");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  if (auto reader = jss::SegmentReader::OpenBytes(bytes); reader.ok()) Walk(*reader);

  auto header = jss::ParseHeader(atfill::ByteView(data, size), size);
  if (!header.ok()) return 0;
  Check(jss::SerializeHeader(*header).compare(0, 98, bytes, 0, 98) == 0,
        "the header's fields re-serialize to its bytes");
  const atfill::ByteView footer(data + header->footer_offset, size - header->footer_offset);
  auto parsed = jss::ParseFooter(*header, footer);
  if (parsed.ok()) CheckFooterBytes(*header, *parsed, footer);

  std::string patched = bytes;
  const uint64_t sum = jss::SegmentChecksum(atfill::AsBytes(patched), footer);
  if (sum == 0) return 0;  // 0 means "not sealed"
  std::memcpy(patched.data() + 4, &sum, sizeof(sum));
  auto reader = jss::SegmentReader::OpenBytes(std::move(patched));
  Check(reader.ok() == parsed.ok(), "a segment with a good checksum opens iff its footer parses");
  if (reader.ok()) Walk(*reader);
  return 0;
}
