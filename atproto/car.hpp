// CAR v1 (Content Addressable aRchive): a varint-prefixed DAG-CBOR header {version: 1, roots:
// [CID links]} followed by sections of varint length + binary CID + block bytes. Readers check
// every block's SHA-256 against its CID; every malformed input is an error naming the byte offset.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "atproto/cid.hpp"
#include "base/bytes.hpp"
#include "base/status.hpp"

namespace atfill::atproto {

struct CarLimits {
  // Largest header (after its length varint), in bytes.
  size_t max_header_bytes = 64 * 1024;
  // Largest section (CID + block, after its length varint), in bytes. atproto blocks stay far
  // below this; it bounds what a reader allocates or hands out.
  size_t max_section_bytes = 8 * 1024 * 1024;
  // Most roots accepted in the header.
  size_t max_roots = 1024;
  // Check each block's SHA-256 against its CID (a mismatch is Corrupt).
  bool verify_hashes = true;
};

// One block. `data` is a view: into the caller's buffer (CarReader) or into the reader's internal
// buffer, valid until the next call (CarFileReader).
struct CarBlock {
  Cid cid;
  ByteView data;
  // Byte offset of the section (its length varint) from the start of the CAR.
  uint64_t offset = 0;
};

// Streams the blocks of a CAR held in memory. Hands out views into `data`, which must outlive the
// reader; copies nothing. Blocks come in file order (no order is assumed). Not thread-safe;
// movable and copyable (a copy reads on independently).
class CarReader {
 public:
  // Parses the header. Errors: Corrupt (truncated), Invalid (malformed, version other than 1),
  // Unsupported (CARv2), OutOfRange (a length past the limits).
  static Result<CarReader> Open(ByteView data, const CarLimits& limits = {});

  const std::vector<Cid>& roots() const { return roots_; }
  // Reads the next section into *block. Returns false at a clean end (the data ends exactly after
  // a section). After an error the reader stays at the failing section.
  Result<bool> Next(CarBlock* block);
  // Bytes consumed so far (the offset of the next section).
  uint64_t offset() const { return pos_; }

 private:
  CarReader(ByteView data, const CarLimits& limits) : data_(data), limits_(limits) {}
  ByteView data_;
  CarLimits limits_;
  std::vector<Cid> roots_;
  size_t pos_ = 0;
};

// Streams the blocks of a CAR file, reading it in chunks: memory stays near one chunk plus the
// largest section whatever the file size. Same checks and errors as CarReader, plus IoError.
// Not thread-safe; movable.
class CarFileReader {
 public:
  static constexpr size_t kDefaultChunkBytes = 1 << 20;

  static Result<CarFileReader> Open(const std::filesystem::path& path, const CarLimits& limits = {},
                                    size_t chunk_bytes = kDefaultChunkBytes);

  const std::vector<Cid>& roots() const { return roots_; }
  // As CarReader::Next; block->data stays valid until the next call or the reader's destruction.
  Result<bool> Next(CarBlock* block);
  uint64_t offset() const { return file_pos_; }

  CarFileReader(CarFileReader&& other) noexcept;
  CarFileReader& operator=(CarFileReader&& other) noexcept;
  CarFileReader(const CarFileReader&) = delete;
  CarFileReader& operator=(const CarFileReader&) = delete;
  ~CarFileReader();

 private:
  CarFileReader(int fd, std::string name, const CarLimits& limits, size_t chunk_bytes);
  // Makes at least `n` unread bytes available unless the file ends first.
  Status Fill(size_t n);
  ByteView Available() const { return {buf_.data() + begin_, end_ - begin_}; }
  void Consume(size_t n);

  int fd_ = -1;
  std::string name_;
  CarLimits limits_;
  size_t chunk_bytes_;
  std::vector<Cid> roots_;
  Bytes buf_;
  size_t begin_ = 0;
  size_t end_ = 0;
  bool eof_ = false;
  uint64_t file_pos_ = 0;  // offset of buf_[begin_] in the file
};

// Writes a CAR v1: the header at construction, then one section per Add. Writes to memory, or to a
// file (buffered; call Finish to flush and close). Not thread-safe.
class CarWriter {
 public:
  // In memory.
  explicit CarWriter(std::span<const Cid> roots);
  // To a new file (truncated if it exists).
  static Result<CarWriter> CreateFile(const std::filesystem::path& path,
                                      std::span<const Cid> roots);

  // Appends a section. The caller vouches that `cid` matches `data`.
  Status Add(const Cid& cid, ByteView data);
  // Hashes `data`, appends it, returns its CID.
  Result<Cid> AddBlock(ByteView data, Cid::Codec codec = Cid::Codec::kDagCbor);
  // Flushes and closes a file writer; nothing for a memory writer. Idempotent.
  Status Finish();

  // Memory writers: the CAR written so far.
  const Bytes& bytes() const { return buf_; }
  Bytes TakeBytes() { return std::move(buf_); }

  CarWriter(CarWriter&& other) noexcept;
  CarWriter& operator=(CarWriter&& other) noexcept;
  CarWriter(const CarWriter&) = delete;
  CarWriter& operator=(const CarWriter&) = delete;
  ~CarWriter();

 private:
  CarWriter() = default;
  void AppendHeader(std::span<const Cid> roots);
  Status FlushIfLarge();
  Status Flush();

  Bytes buf_;
  int fd_ = -1;
  std::string name_;
};

// Blocks by CID. Holds views the caller keeps alive (PutView) or bytes it owns (Put); lookups never
// copy. A CID put twice keeps its first bytes. Reads are thread-safe; writes are not.
class BlockStore {
 public:
  void PutView(const Cid& cid, ByteView data) { map_.try_emplace(cid, data); }
  void Put(const Cid& cid, Bytes data);
  // Hashes `data` (dag-cbor), stores a copy, returns its CID.
  Cid PutBlock(ByteView data);

  std::optional<ByteView> Get(const Cid& cid) const {
    auto it = map_.find(cid);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  bool Contains(const Cid& cid) const { return map_.contains(cid); }
  size_t size() const { return map_.size(); }

  // Visits every block (in no particular order).
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [cid, data] : map_) fn(cid, data);
  }

 private:
  std::unordered_map<Cid, ByteView> map_;
  std::deque<Bytes> owned_;
};

// Reads every remaining block of `reader` into `store` as views (the CAR bytes must outlive the
// store). Returns the number of sections read (duplicates included).
Result<size_t> LoadCarBlocks(CarReader* reader, BlockStore* store);

}  // namespace atfill::atproto
