// The .jss format: the header, rows and blocks (their columns and zstd frames), the footer and
// its indexes, and segment names (sources/archive/jss.hpp).
#include "sources/archive/jss_internal.hpp"

namespace atfill::jss {

std::string_view SentinelFor(Kind kind) {
  switch (kind) {
    case Kind::kAccount:
      return kSentinelAccount;
    case Kind::kIdentity:
      return kSentinelIdentity;
    case Kind::kSync:
      return kSentinelSync;
    default:
      return {};
  }
}

// ---- header ----

Result<Header> ParseHeader(ByteView bytes, uint64_t file_size) {
  if (file_size < kHeaderSize) {
    return Status::Corrupt("file is " + std::to_string(file_size) +
                           " bytes, shorter than the 256-byte header (truncated)");
  }
  if (bytes.size() < kHeaderSize) {
    return Status::Corrupt("header is " + std::to_string(bytes.size()) + " bytes, want 256");
  }
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kMagic, 4) != 0) {
    return Status::Invalid("not a .jss segment: magic is not \"jss0\"");
  }
  Header h;
  h.checksum = Load<uint64_t>(p + 4);
  if (h.checksum == 0) {
    return Status::Invalid("segment is not sealed (checksum 0: an active segment)");
  }
  h.version = Load<uint16_t>(p + 12);
  if (h.version != kFormatVersion) {
    return Status::Unsupported("segment format version " + std::to_string(h.version) +
                               " (this reader knows 1)");
  }
  h.block_count = Load<uint32_t>(p + 14);
  h.event_count = Load<uint32_t>(p + 18);
  h.unique_did_count = Load<uint32_t>(p + 22);
  h.min_seq = Load<uint64_t>(p + 26);
  h.max_seq = Load<uint64_t>(p + 34);
  h.min_witnessed_at = Load<int64_t>(p + 42);
  h.max_witnessed_at = Load<int64_t>(p + 50);
  h.footer_offset = Load<uint64_t>(p + 58);
  h.did_bloom_offset = Load<uint64_t>(p + 66);
  h.block_did_bloom_offset = Load<uint64_t>(p + 74);
  h.collection_index_offset = Load<uint64_t>(p + 82);
  h.block_index_offset = Load<uint64_t>(p + 90);
  if (h.footer_offset < kHeaderSize) {
    return Status::Corrupt("footer_offset " + std::to_string(h.footer_offset) +
                           " is inside the 256-byte header");
  }
  if (h.block_index_offset != h.footer_offset) {
    return Status::Corrupt("block_index_offset " + std::to_string(h.block_index_offset) +
                           " differs from footer_offset " + std::to_string(h.footer_offset));
  }
  if (!(h.footer_offset <= h.did_bloom_offset && h.did_bloom_offset <= h.block_did_bloom_offset &&
        h.block_did_bloom_offset <= h.collection_index_offset)) {
    return Status::Corrupt("footer section offsets out of order (footer " +
                           std::to_string(h.footer_offset) + ", did bloom " +
                           std::to_string(h.did_bloom_offset) + ", block blooms " +
                           std::to_string(h.block_did_bloom_offset) + ", collection index " +
                           std::to_string(h.collection_index_offset) + ")");
  }
  if (h.collection_index_offset > file_size) {
    return Status::Corrupt("file is " + std::to_string(file_size) +
                           " bytes but its footer reaches byte " +
                           std::to_string(h.collection_index_offset) + " (truncated)");
  }
  return h;
}

std::string SerializeHeader(const Header& h) {
  std::string out(kHeaderSize, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  std::memcpy(p, kMagic, 4);
  Store<uint64_t>(p + 4, h.checksum);
  Store<uint16_t>(p + 12, h.version);
  Store<uint32_t>(p + 14, h.block_count);
  Store<uint32_t>(p + 18, h.event_count);
  Store<uint32_t>(p + 22, h.unique_did_count);
  Store<uint64_t>(p + 26, h.min_seq);
  Store<uint64_t>(p + 34, h.max_seq);
  Store<int64_t>(p + 42, h.min_witnessed_at);
  Store<int64_t>(p + 50, h.max_witnessed_at);
  Store<uint64_t>(p + 58, h.footer_offset);
  Store<uint64_t>(p + 66, h.did_bloom_offset);
  Store<uint64_t>(p + 74, h.block_did_bloom_offset);
  Store<uint64_t>(p + 82, h.collection_index_offset);
  Store<uint64_t>(p + 90, h.block_index_offset);
  return out;
}

uint64_t SegmentChecksum(ByteView header, ByteView footer) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, header.data() + 12, kHeaderSize - 12);
  XXH3_64bits_update(&state, footer.data(), footer.size());
  return XXH3_64bits_digest(&state);
}

// ---- rows and blocks ----

Status ValidateRow(const Row& row) {
  const auto kind = static_cast<uint8_t>(row.kind);
  if (kind < 1 || kind > 7) {
    return Status::Invalid("row seq " + std::to_string(row.seq) + ": kind " + std::to_string(kind) +
                           " is outside 1..7");
  }
  auto too_long = [&](const char* field, size_t size, size_t max) {
    return Status::Invalid("row seq " + std::to_string(row.seq) + ": " + field + " is " +
                           std::to_string(size) + " bytes, over the format's " +
                           std::to_string(max));
  };
  if (row.collection.size() > 255) return too_long("collection", row.collection.size(), 255);
  if (row.did.size() > 65535) return too_long("did", row.did.size(), 65535);
  if (row.rkey.size() > 255) return too_long("rkey", row.rkey.size(), 255);
  if (row.rev.size() > 255) return too_long("rev", row.rev.size(), 255);
  if (row.payload.size() > kMaxBodyBytes) {
    return too_long("payload", row.payload.size(), kMaxBodyBytes);
  }
  return Status::OK();
}

Result<Block> Block::Parse(std::string body) {
  const uint64_t size = body.size();
  if (size < 4) {
    return Status::Corrupt("block body is " + std::to_string(size) +
                           " bytes, shorter than its 4-byte row count");
  }
  if (size > kMaxBodyBytes) {
    return Status::OutOfRange("block body is " + std::to_string(size) + " bytes, over 4 GiB - 1");
  }
  const auto* p = reinterpret_cast<const uint8_t*>(body.data());
  const uint32_t n = Load<uint32_t>(p);
  if (n > kMaxBlockRows) {
    return Status::Corrupt("block body claims " + std::to_string(n) + " rows, over the limit of " +
                           std::to_string(kMaxBlockRows));
  }
  const uint64_t fixed = 4 + uint64_t{34} * n;
  if (size < fixed) {
    return Status::Corrupt("block body of " + std::to_string(n) + " rows is " +
                           std::to_string(size) + " bytes, shorter than its " +
                           std::to_string(fixed) + "-byte columns");
  }
  const uint8_t* kinds = p + 4 + 24 * size_t{n};
  for (uint32_t i = 0; i < n; ++i) {
    if (kinds[i] < 1 || kinds[i] > 7) {
      return Status::Corrupt("block row " + std::to_string(i) + " has kind " +
                             std::to_string(kinds[i]) + ", outside 1..7");
    }
  }
  Block b;
  b.starts_.resize(size_t{5} * n);
  uint32_t* starts = b.starts_.data();
  uint64_t off = fixed;
  // Blob starts are prefix sums of each length column, column after column; a sum past the body
  // is caught by the final size check (the u64 sum cannot overflow: n * 2^32 < 2^51).
  const uint8_t* collection_len = p + 4 + 25 * size_t{n};
  for (uint32_t i = 0; i < n; ++i) {
    starts[5 * i] = static_cast<uint32_t>(off);
    off += collection_len[i];
  }
  const uint8_t* did_len = p + 4 + 26 * size_t{n};
  for (uint32_t i = 0; i < n; ++i) {
    starts[5 * i + 1] = static_cast<uint32_t>(off);
    off += Load<uint16_t>(did_len + 2 * i);
  }
  const uint8_t* rkey_len = p + 4 + 28 * size_t{n};
  for (uint32_t i = 0; i < n; ++i) {
    starts[5 * i + 2] = static_cast<uint32_t>(off);
    off += rkey_len[i];
  }
  const uint8_t* rev_len = p + 4 + 29 * size_t{n};
  for (uint32_t i = 0; i < n; ++i) {
    starts[5 * i + 3] = static_cast<uint32_t>(off);
    off += rev_len[i];
  }
  const uint8_t* payload_len = p + 4 + 30 * size_t{n};
  for (uint32_t i = 0; i < n; ++i) {
    starts[5 * i + 4] = static_cast<uint32_t>(off);
    off += Load<uint32_t>(payload_len + 4 * i);
  }
  if (off != size) {
    return Status::Corrupt("block body of " + std::to_string(n) + " rows is " +
                           std::to_string(size) + " bytes but its columns describe " +
                           std::to_string(off) +
                           (off > size ? " (truncated)" : " (trailing bytes)"));
  }
  b.n_ = n;
  b.body_ = std::move(body);
  return b;
}

Row Block::row(size_t i) const {
  const auto* p = reinterpret_cast<const uint8_t*>(body_.data());
  const size_t n = n_;
  const uint32_t* s = starts_.data() + 5 * i;
  const char* d = body_.data();
  Row r;
  r.seq = Load<uint64_t>(p + 4 + 8 * i);
  r.witnessed_at = Load<int64_t>(p + 4 + 8 * n + 8 * i);
  r.indexed_at = Load<int64_t>(p + 4 + 16 * n + 8 * i);
  r.kind = static_cast<Kind>(p[4 + 24 * n + i]);
  r.collection = {d + s[0], p[4 + 25 * n + i]};
  r.did = {d + s[1], Load<uint16_t>(p + 4 + 26 * n + 2 * i)};
  r.rkey = {d + s[2], p[4 + 28 * n + i]};
  r.rev = {d + s[3], p[4 + 29 * n + i]};
  r.payload = {p + s[4], Load<uint32_t>(p + 4 + 30 * n + 4 * i)};
  return r;
}

Result<std::string> DecompressFrame(ByteView frame, uint32_t expected_size, uint64_t cap) {
  const size_t size = frame.size();
  if (size == 0) return Status::Corrupt("bad zstd frame: 0 bytes");
  const size_t frame_size = ZSTD_findFrameCompressedSize(frame.data(), size);
  if (ZSTD_isError(frame_size)) return ZstdError(frame_size, size);
  if (frame_size != size) {
    return Status::Corrupt("bad zstd frame: " + std::to_string(size - frame_size) +
                           " bytes follow the " + std::to_string(frame_size) + "-byte frame");
  }
  ZSTD_DCtx* ctx = ThreadDCtx();
  if (ctx == nullptr)
    return Status::ResourceExhausted("cannot create a zstd decompression context");
  ZSTD_DCtx_reset(ctx, ZSTD_reset_session_only);

  const unsigned long long content = ZSTD_getFrameContentSize(frame.data(), size);
  if (content == ZSTD_CONTENTSIZE_ERROR) {
    return Status::Corrupt("bad zstd frame of " + std::to_string(size) + " bytes: bad header");
  }
  const bool known = content != ZSTD_CONTENTSIZE_UNKNOWN || expected_size != 0;
  const uint64_t want = content != ZSTD_CONTENTSIZE_UNKNOWN ? content : expected_size;
  if (known) {
    if (want > cap) return OverCap(size, std::to_string(want), cap);
    if (expected_size != 0 && want != expected_size) {
      return SizeMismatch(size, std::to_string(want), expected_size);
    }
    // Every block of a frame yields at most 128 KiB and takes at least 4 bytes (an RLE block): a
    // size beyond that is refused before a buffer is allocated for it, or a few hundred bytes
    // could make the reader allocate up to `cap`.
    constexpr uint64_t kZstdBlockMax = uint64_t{128} << 10;
    if (const uint64_t most = (uint64_t{size} / 4 + 1) * kZstdBlockMax; want > most) {
      return Status::Corrupt("zstd frame of " + std::to_string(size) + " bytes cannot hold the " +
                             std::to_string(want) + " bytes its size says (at most " +
                             std::to_string(most) + ")");
    }
  }
  // One streaming decode whether the size is known or not: libzstd's one-shot decoder and its
  // streaming one disagree on some malformed frames (a compressed block of size 0 passes the
  // latter), and a frame must decode alike either way. The buffer reaches one byte past the
  // bound (the known size, or the cap), to see a frame that holds more.
  const uint64_t bound = known ? want : cap;
  const uint64_t limit = bound < std::numeric_limits<uint64_t>::max() ? bound + 1 : bound;
  const auto over = [&] {
    return known ? SizeMismatch(size, "more than " + std::to_string(want), want)
                 : OverCap(size, "more than " + std::to_string(cap), cap);
  };
  std::string out;
  out.resize(static_cast<size_t>(
      known ? limit : std::min<uint64_t>(limit, std::max<uint64_t>(4 * size, 1 << 16))));
  ZSTD_inBuffer in{frame.data(), size, 0};
  size_t pos = 0;
  for (;;) {
    ZSTD_outBuffer ob{out.data() + pos, out.size() - pos, 0};
    const size_t r = ZSTD_decompressStream(ctx, &ob, &in);
    if (ZSTD_isError(r)) return ZstdError(r, size);
    pos += ob.pos;
    if (pos > bound) return over();
    if (r == 0) break;
    if (pos == out.size()) {
      if (out.size() >= limit) return over();
      out.resize(static_cast<size_t>(std::min<uint64_t>(limit, 2 * uint64_t{out.size()})));
    } else if (in.pos == in.size) {
      return Status::Corrupt("bad zstd frame of " + std::to_string(size) + " bytes: truncated");
    }
  }
  out.resize(pos);
  if (known && pos != want) return SizeMismatch(size, std::to_string(pos), want);
  return out;
}

std::string SerializeBlockBody(std::span<const Row> rows) {
  BlockBuilder builder;
  for (const Row& r : rows) {
    if (!ValidateRow(r).ok()) return {};
    if (builder.body_size() + BlockBuilder::RowBytes(r) > kMaxBodyBytes) return {};
    builder.Add(r);
  }
  return builder.Finish();
}

std::string CompressFrame(std::string_view body, int zstd_level) {
  ZSTD_CCtx* ctx = ThreadCCtx();
  if (ctx == nullptr) return {};
  ZSTD_CCtx_reset(ctx, ZSTD_reset_session_and_parameters);
  if (ZSTD_isError(ZSTD_CCtx_setParameter(ctx, ZSTD_c_compressionLevel, zstd_level)) ||
      ZSTD_isError(ZSTD_CCtx_setParameter(ctx, ZSTD_c_checksumFlag, 1)) ||
      ZSTD_isError(ZSTD_CCtx_setParameter(ctx, ZSTD_c_contentSizeFlag, 1))) {
    return {};
  }
  std::string out(ZSTD_compressBound(body.size()), '\0');
  const size_t r = ZSTD_compress2(ctx, out.data(), out.size(), body.data(), body.size());
  if (ZSTD_isError(r)) return {};
  out.resize(r);
  return out;
}

std::string EncodeBlockBody(std::span<const Row> rows) {
  const std::string body = SerializeBlockBody(rows);
  if (body.empty()) return {};
  return CompressFrame(body);
}

// ---- footer ----

bool Footer::BlockHasCollection(size_t block, size_t id) const {
  if (block >= masks.size() || id >= collections.size()) return false;
  const std::string& mask = masks[block];
  if (id / 8 >= mask.size()) return false;
  return (static_cast<uint8_t>(mask[id / 8]) >> (id % 8) & 1) != 0;
}

std::vector<size_t> Footer::CollectionIds(std::span<const std::string> patterns) const {
  std::vector<size_t> ids;
  for (size_t id = 0; id < collections.size(); ++id) {
    const std::string_view name = collections[id].name;
    if (name.starts_with('$')) continue;
    for (const std::string& pattern : patterns) {
      const bool match =
          pattern.ends_with(".*")
              ? name.starts_with(std::string_view(pattern).substr(0, pattern.size() - 1))
              : name == pattern;
      if (match) {
        ids.push_back(id);
        break;
      }
    }
  }
  return ids;
}

std::optional<size_t> Footer::CollectionId(std::string_view name) const {
  for (size_t id = 0; id < collections.size(); ++id) {
    if (collections[id].name == name) return id;
  }
  return std::nullopt;
}

Result<Footer> ParseFooter(const Header& h, ByteView footer) {
  const uint64_t base = h.footer_offset;
  if (h.collection_index_offset - base > footer.size()) {
    return Status::Corrupt(
        "footer is " + std::to_string(footer.size()) + " bytes but its collection index starts " +
        std::to_string(h.collection_index_offset - base) + " bytes in (truncated)");
  }
  auto region = [&](uint64_t from, uint64_t to) {
    return footer.subspan(static_cast<size_t>(from - base), static_cast<size_t>(to - from));
  };
  Footer f;

  // 1. Block index.
  const ByteView index = region(h.block_index_offset, h.did_bloom_offset);
  if (index.size() != uint64_t{h.block_count} * kBlockIndexEntrySize) {
    return Status::Corrupt("block index is " + std::to_string(index.size()) + " bytes, want " +
                           std::to_string(h.block_count) + " x 52");
  }
  f.blocks.resize(h.block_count);
  uint64_t prev_end = kHeaderSize;
  for (uint32_t i = 0; i < h.block_count; ++i) {
    const uint8_t* e = index.data() + i * kBlockIndexEntrySize;
    BlockInfo& b = f.blocks[i];
    b.offset = Load<uint64_t>(e);
    b.compressed_size = Load<uint32_t>(e + 8);
    b.uncompressed_size = Load<uint32_t>(e + 12);
    b.event_count = Load<uint32_t>(e + 16);
    b.min_seq = Load<uint64_t>(e + 20);
    b.max_seq = Load<uint64_t>(e + 28);
    b.min_witnessed_at = Load<int64_t>(e + 36);
    b.max_witnessed_at = Load<int64_t>(e + 44);
    const std::string which = "block index entry " + std::to_string(i);
    if (b.offset < prev_end || b.offset > h.footer_offset ||
        uint64_t{b.compressed_size} + 8 > h.footer_offset - b.offset) {
      return Status::Corrupt(which + ": frame at " + std::to_string(b.offset) + " of " +
                             std::to_string(b.compressed_size) + " bytes is outside [" +
                             std::to_string(prev_end) + ", " + std::to_string(h.footer_offset) +
                             ")");
    }
    if (b.max_seq < b.min_seq) {
      return Status::Corrupt(which + ": max_seq " + std::to_string(b.max_seq) + " < min_seq " +
                             std::to_string(b.min_seq));
    }
    if (b.event_count > kMaxBlockRows) {
      return Status::Corrupt(which + ": " + std::to_string(b.event_count) + " rows, over " +
                             std::to_string(kMaxBlockRows));
    }
    prev_end = b.offset + 8 + b.compressed_size;
  }

  // 2. Segment DID bloom (a zero-length region leaves a filter that filters nothing).
  const ByteView did_bloom = region(h.did_bloom_offset, h.block_did_bloom_offset);
  if (!did_bloom.empty()) {
    auto bloom = Bloom::Parse(did_bloom);
    if (!bloom.ok()) return bloom.status().WithContext("segment DID bloom");
    f.did_bloom = std::move(bloom).value();
  }

  // 3. Per-block DID blooms.
  const ByteView blooms = region(h.block_did_bloom_offset, h.collection_index_offset);
  if (blooms.size() < 8) {
    return Status::Corrupt("per-block bloom region is " + std::to_string(blooms.size()) +
                           " bytes, shorter than its 8-byte header");
  }
  const uint32_t bloom_count = Load<uint32_t>(blooms.data());
  const uint32_t bloom_size = Load<uint32_t>(blooms.data() + 4);
  if (bloom_count != h.block_count) {
    return Status::Corrupt("per-block bloom region holds " + std::to_string(bloom_count) +
                           " filters for " + std::to_string(h.block_count) + " blocks");
  }
  if (blooms.size() != 8 + uint64_t{bloom_count} * bloom_size) {
    return Status::Corrupt("per-block bloom region is " + std::to_string(blooms.size()) +
                           " bytes, want 8 + " + std::to_string(bloom_count) + " x " +
                           std::to_string(bloom_size));
  }
  f.block_blooms.reserve(bloom_count);
  for (uint32_t i = 0; i < bloom_count; ++i) {
    auto bloom = Bloom::Parse(blooms.subspan(8 + size_t{i} * bloom_size, bloom_size));
    if (!bloom.ok()) return bloom.status().WithContext("block " + std::to_string(i) + " DID bloom");
    f.block_blooms.push_back(std::move(bloom).value());
  }

  // 4. Collection block index: to EOF.
  const ByteView ci = footer.subspan(static_cast<size_t>(h.collection_index_offset - base));
  if (ci.size() < kCollectionIndexHeaderSize) {
    return Status::Corrupt("collection index is " + std::to_string(ci.size()) +
                           " bytes, shorter than its 16-byte header (truncated)");
  }
  const uint32_t collection_count = Load<uint32_t>(ci.data());
  const uint32_t ci_blocks = Load<uint32_t>(ci.data() + 4);
  const uint32_t bitmask_len = Load<uint32_t>(ci.data() + 8);
  const uint32_t body_size = Load<uint32_t>(ci.data() + 12);
  if (ci_blocks != h.block_count) {
    return Status::Corrupt("collection index covers " + std::to_string(ci_blocks) +
                           " blocks, header says " + std::to_string(h.block_count));
  }
  if (bitmask_len != (uint64_t{collection_count} + 7) / 8) {
    return Status::Corrupt("collection index bitmask_len " + std::to_string(bitmask_len) +
                           " does not fit " + std::to_string(collection_count) + " collections");
  }
  auto body =
      DecompressFrame(ci.subspan(kCollectionIndexHeaderSize), body_size, kMaxCollectionIndexBytes);
  if (!body.ok()) return body.status().WithContext("collection index");
  if (body->size() != body_size) {
    return Status::Corrupt("collection index decompresses to " + std::to_string(body->size()) +
                           " bytes, header says " + std::to_string(body_size));
  }
  const auto* p = reinterpret_cast<const uint8_t*>(body->data());
  const size_t end = body->size();
  size_t off = 0;
  f.collections.reserve(std::min<size_t>(collection_count, end / 5));
  for (uint32_t i = 0; i < collection_count; ++i) {
    if (end - off < 5 || end - off - 5 < p[off]) {
      return Status::Corrupt("collection index entry " + std::to_string(i) + " is truncated");
    }
    const size_t len = p[off];
    Collection c;
    c.count = Load<uint32_t>(p + off + 1);
    c.name.assign(reinterpret_cast<const char*>(p + off + 5), len);
    f.collections.push_back(std::move(c));
    off += 5 + len;
  }
  if (end - off != uint64_t{ci_blocks} * bitmask_len) {
    return Status::Corrupt("collection index has " + std::to_string(end - off) +
                           " bytes of block masks, want " + std::to_string(ci_blocks) + " x " +
                           std::to_string(bitmask_len));
  }
  const unsigned spare_bits = collection_count % 8;
  const uint8_t spare_mask = spare_bits == 0 ? 0 : static_cast<uint8_t>(0xFF << spare_bits);
  f.masks.reserve(ci_blocks);
  for (uint32_t b = 0; b < ci_blocks; ++b) {
    const char* m = body->data() + off + size_t{b} * bitmask_len;
    if (bitmask_len > 0 && (static_cast<uint8_t>(m[bitmask_len - 1]) & spare_mask) != 0) {
      return Status::Corrupt("collection mask of block " + std::to_string(b) +
                             " sets an id past the " + std::to_string(collection_count) +
                             "-entry table");
    }
    f.masks.emplace_back(m, bitmask_len);
  }
  return f;
}

// ---- names ----

std::string SegmentName(uint64_t index) {
  static constexpr char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string digits;
  do {
    digits.push_back(kDigits[index % 36]);
    index /= 36;
  } while (index > 0);
  while (digits.size() < 10) digits.push_back('0');
  std::reverse(digits.begin(), digits.end());
  return "seg_" + digits + ".jss";
}

Result<uint64_t> ParseSegmentName(std::string_view name) {
  auto bad = [&](const char* why) {
    return Status::Invalid("segment name \"" + std::string(name) + "\": " + why);
  };
  if (!name.starts_with("seg_") || !name.ends_with(".jss")) {
    return bad("want seg_<base-36 index>.jss");
  }
  const std::string_view digits = name.substr(4, name.size() - 8);
  if (digits.size() < 10) return bad("the index has fewer than 10 digits");
  if (digits.size() > 10 && digits[0] == '0') return bad("the index has extra leading zeros");
  uint64_t value = 0;
  for (const char c : digits) {
    unsigned d;
    if (c >= '0' && c <= '9') {
      d = static_cast<unsigned>(c - '0');
    } else if (c >= 'a' && c <= 'z') {
      d = static_cast<unsigned>(c - 'a') + 10;
    } else {
      return bad("the index is not lowercase base 36");
    }
    if (value > (std::numeric_limits<uint64_t>::max() - d) / 36) return bad("the index overflows");
    value = value * 36 + d;
  }
  return value;
}

}  // namespace atfill::jss
