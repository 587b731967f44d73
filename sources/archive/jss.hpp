// Jetstream v2 `.jss` segment files (SPEC.md in ../shared/protocols/jetstream, §4): the 256-byte
// header, zstd block frames holding columnar block bodies, and the footer (block index, DID
// blooms, collection index). A reader for sealed segments (files on disk or bytes fetched with
// getSegment / getBlock) and a writer that produces sealed segments.
//
// Errors name the input and the reason: Invalid for bytes that are not a segment (bad magic, an
// unsealed file), Unsupported for another format version, Corrupt for self-inconsistent or
// truncated bytes (offsets, sizes, checksums, zstd), OutOfRange for a size over a caller's cap,
// IoError for the operating system.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/bytes.hpp"
#include "base/status.hpp"
#include "sources/archive/jss_bloom.hpp"

namespace atfill::jss {

// The segment `kind` byte. Commit-shaped: create, update, delete, create-resync. Markers:
// identity, account, sync.
enum class Kind : uint8_t {
  kCreate = 1,
  kUpdate = 2,
  kDelete = 3,
  kIdentity = 4,
  kAccount = 5,
  kSync = 6,
  kCreateResync = 7
};

// Collection-index sentinels for blocks holding marker rows; invalid NSIDs, so no client
// collection can name them.
inline constexpr std::string_view kSentinelAccount = "$account";
inline constexpr std::string_view kSentinelIdentity = "$identity";
inline constexpr std::string_view kSentinelSync = "$sync";
// The sentinel a marker kind sets in its block's collection mask; empty for other kinds.
std::string_view SentinelFor(Kind kind);

inline constexpr size_t kHeaderSize = 256;
inline constexpr uint16_t kFormatVersion = 1;
inline constexpr size_t kBlockIndexEntrySize = 52;
// Block bodies with more rows are rejected (reader limit of the reference implementation).
inline constexpr uint32_t kMaxBlockRows = 262144;

struct Header {
  uint64_t checksum = 0;
  uint16_t version = 0;
  uint32_t block_count = 0, event_count = 0, unique_did_count = 0;
  uint64_t min_seq = 0, max_seq = 0;
  int64_t min_witnessed_at = 0, max_witnessed_at = 0;  // unix µs
  uint64_t footer_offset = 0, did_bloom_offset = 0, block_did_bloom_offset = 0,
           collection_index_offset = 0, block_index_offset = 0;
  bool sealed() const { return checksum != 0; }
};

// Parses and validates the 256 header bytes (at least kHeaderSize; only those are read) of a
// file of `file_size` bytes: magic, sealed, version 1, and the offset order of §4.2. A file too
// short for its offsets is Corrupt with "truncated" in the message.
Result<Header> ParseHeader(ByteView bytes, uint64_t file_size);
// The 256 header bytes of `header` (checksum field included as given).
std::string SerializeHeader(const Header& header);
// XXH3-64 over header bytes [12, 256) followed by `footer` (file bytes [footer_offset, EOF)):
// the value a sealed header stores. `header` must hold at least kHeaderSize bytes.
uint64_t SegmentChecksum(ByteView header, ByteView footer);

struct BlockInfo {
  uint64_t offset = 0;  // of the block's 8-byte length prefix; the frame follows it
  uint32_t compressed_size = 0, uncompressed_size = 0, event_count = 0;
  uint64_t min_seq = 0, max_seq = 0;
  int64_t min_witnessed_at = 0, max_witnessed_at = 0;
};

// One decoded row; views point into the Block that produced it (or, for rows given to the
// writer, into the caller's buffers).
struct Row {
  uint64_t seq = 0;
  int64_t witnessed_at = 0, indexed_at = 0;  // unix µs; indexed_at 0 = unset
  Kind kind = Kind::kCreate;
  std::string_view collection, did, rkey, rev;
  ByteView payload;
};

// Ok when `row` fits the block format: kind 1..7, collection/rkey/rev at most 255 bytes, did at
// most 65535, payload at most 4 GiB - 1.
Status ValidateRow(const Row& row);

// A decompressed, validated block body (§4.4). Owns its bytes; the views in a Row point into
// them and stay valid while that Block object lives and is neither moved from nor assigned to.
class Block {
 public:
  Block() = default;
  // Validates the whole body: n <= kMaxBlockRows, kinds 1..7, the body ends exactly after the
  // payload blob.
  static Result<Block> Parse(std::string body);
  size_t size() const { return n_; }
  // O(1): offsets precomputed in Parse. i < size().
  Row row(size_t i) const;
  const std::string& body() const { return body_; }

 private:
  std::string body_;
  size_t n_ = 0;
  // Per row, the starts of its collection, did, rkey, rev and payload slices in body_.
  std::vector<uint32_t> starts_;
};

// Decompresses one block frame (what getBlock returns; no length prefix). `expected_size` = the
// block index's uncompressed_size, or 0 when unknown; `cap` = largest body accepted. The input
// must be exactly one zstd frame. Errors name the reason (bad zstd, checksum mismatch, over cap,
// size mismatch). Thread-safe (a decompression context per thread).
Result<std::string> DecompressFrame(ByteView frame, uint32_t expected_size, uint64_t cap);

// The uncompressed block body of `rows` (§4.4); empty when a row fails ValidateRow or the body
// would exceed 4 GiB - 1.
std::string SerializeBlockBody(std::span<const Row> rows);
// One zstd frame of `body` with the content checksum and content size set.
std::string CompressFrame(std::string_view body, int zstd_level = 3);
// Encodes rows into a block body and compresses it into one zstd frame (content checksum on):
// the bytes getBlock serves. Empty when SerializeBlockBody is.
std::string EncodeBlockBody(std::span<const Row> rows);

struct Collection {
  std::string name;
  uint32_t count = 0;  // rows with this collection in the segment (0 for sentinels)
};

// The parsed footer of a sealed segment.
struct Footer {
  std::vector<BlockInfo> blocks;
  Bloom did_bloom;                      // a default (filters nothing) when the region is empty
  std::vector<Bloom> block_blooms;      // one per block (empty when block_count == 0)
  std::vector<Collection> collections;  // table order = collection id (includes sentinels)
  std::vector<std::string> masks;       // one bitmask_len-byte string per block
  bool BlockHasCollection(size_t block, size_t id) const;
  // Ids of `patterns` (exact NSIDs or "prefix.*", which matches names starting "prefix.") in the
  // table, ascending; markers' sentinels are NOT included.
  std::vector<size_t> CollectionIds(std::span<const std::string> patterns) const;
  // The id of exactly `name` (sentinels included), if present.
  std::optional<size_t> CollectionId(std::string_view name) const;
};

// Parses `footer` = file bytes [header.footer_offset, EOF) of a segment whose header is
// `header` (already validated by ParseHeader). Does not verify the checksum.
Result<Footer> ParseFooter(const Header& header, ByteView footer);

// A sealed segment (a file read with pread, or bytes in memory). Open validates the header, the
// checksum and the footer; blocks are read on demand. Const methods are thread-safe.
class SegmentReader {
 public:
  // Reads and validates header and footer; verifies the header checksum (XXH3_64 over
  // header[12,256) ++ file[footer_offset,EOF)).
  static Result<SegmentReader> Open(const std::string& path);
  // The same over a whole segment held in memory (e.g. a getSegment body); `name` is used in
  // messages.
  static Result<SegmentReader> OpenBytes(std::string bytes, std::string name = "segment bytes");
  SegmentReader(SegmentReader&&) noexcept;
  SegmentReader& operator=(SegmentReader&&) noexcept;
  ~SegmentReader();

  const Header& header() const;
  const Footer& footer() const;
  // The file path, or the name given to OpenBytes.
  const std::string& path() const;
  // The raw zstd frame of block i (no prefix); checks the 8-byte length prefix equals
  // compressed_size.
  Result<std::string> ReadFrame(size_t block) const;
  // ReadFrame + DecompressFrame + Block::Parse.
  Result<Block> ReadBlock(size_t block, uint64_t cap = 1ull << 30) const;

 private:
  struct Impl;
  explicit SegmentReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct SegmentWriterOptions {
  // Rows per block before it is compressed and written (1..kMaxBlockRows).
  uint32_t rows_per_block = 4096;
  // zstd compression level of block frames and the collection index.
  int zstd_level = 3;
  // A block is written early rather than let its uncompressed body grow past this (bytes);
  // 1 KiB..4 GiB - 1.
  uint64_t max_block_bytes = uint64_t{256} << 20;
  Status Validate() const;
};

// Writes one sealed segment: "jss0" + 252 zero bytes, then blocks as rows arrive, then on Seal()
// the footer (block index, segment bloom sized for max(1, unique DIDs), per-block blooms all
// sized for max(1, largest per-block unique DID count), collection index with sentinels), then
// the header and its checksum. Writes to path + ".tmp", fsyncs, renames to path. Not
// thread-safe. A writer destroyed before Seal() removes its .tmp file.
class SegmentWriter {
 public:
  static Result<SegmentWriter> Create(const std::string& path, SegmentWriterOptions options = {});
  SegmentWriter(SegmentWriter&&) noexcept;
  SegmentWriter& operator=(SegmentWriter&&) noexcept;
  ~SegmentWriter();

  // Copies the row. Rows must have strictly increasing seq and pass ValidateRow. After an I/O
  // error every later call returns that error.
  Status Append(const Row& row);
  // Writes the last block and the footer and publishes the file; the writer is then done.
  Status Seal();
  // Rows appended so far.
  uint64_t rows() const;
  // Bytes written to the file so far (header, written blocks, and the footer once sealed).
  uint64_t bytes_written() const;

 private:
  struct Impl;
  explicit SegmentWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Segment names: "seg_" + index in lowercase base-36 zero-padded to 10 chars + ".jss".
std::string SegmentName(uint64_t index);
// The index of a canonical segment name (as SegmentName writes it); Invalid otherwise.
Result<uint64_t> ParseSegmentName(std::string_view name);

}  // namespace atfill::jss
