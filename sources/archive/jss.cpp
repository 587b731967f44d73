// Reading and writing .jss segments (sources/archive/jss.hpp): SegmentReader over a file or bytes,
// SegmentWriter appending rows into blocks and sealing the footer.
#include "sources/archive/jss_internal.hpp"

namespace atfill::jss {

// ---- reader ----

struct SegmentReader::Impl {
  std::string path;
  Fd fd;              // the file, or -1 when reading `bytes`
  std::string bytes;  // the whole segment (OpenBytes)
  Header header;
  Footer footer;
};

SegmentReader::SegmentReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SegmentReader::SegmentReader(SegmentReader&&) noexcept = default;
SegmentReader& SegmentReader::operator=(SegmentReader&&) noexcept = default;
SegmentReader::~SegmentReader() = default;

namespace {

// Validates the header and footer of a segment whose first 256 bytes are `head` and whose bytes
// from the footer offset on are produced by `read_footer`.
template <typename ReadFooter>
Status LoadSegment(ByteView head, uint64_t file_size, const std::string& name,
                   ReadFooter read_footer, Header* header, Footer* footer) {
  auto h = ParseHeader(head, file_size);
  if (!h.ok()) return h.status().WithContext(name);
  std::string tail;
  ATFILL_RETURN_IF_ERROR(read_footer(*h, &tail));
  const ByteView footer_bytes = AsBytes(tail);
  const uint64_t sum = SegmentChecksum(head, footer_bytes);
  if (sum != h->checksum) {
    return Status::Corrupt(name + ": checksum mismatch (header says " + Hex64(h->checksum) +
                           ", header and footer hash to " + Hex64(sum) + ")");
  }
  auto f = ParseFooter(*h, footer_bytes);
  if (!f.ok()) return f.status().WithContext(name);
  *header = *h;
  *footer = std::move(f).value();
  return Status::OK();
}

}  // namespace

Result<SegmentReader> SegmentReader::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->fd = Fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (impl->fd.get() < 0) return Status::IoError(Errno("cannot open", path));
  struct stat st {};
  if (::fstat(impl->fd.get(), &st) != 0) return Status::IoError(Errno("cannot stat", path));
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < kHeaderSize) {
    return Status::Corrupt(path + ": file is " + std::to_string(file_size) +
                           " bytes, shorter than the 256-byte header (truncated)");
  }
  uint8_t head[kHeaderSize];
  ATFILL_RETURN_IF_ERROR(PreadAll(impl->fd.get(), head, kHeaderSize, 0, path));
  const int fd = impl->fd.get();
  auto read_footer = [&](const Header& h, std::string* out) {
    out->resize(file_size - h.footer_offset);
    return PreadAll(fd, out->data(), out->size(), h.footer_offset, path);
  };
  ATFILL_RETURN_IF_ERROR(LoadSegment(ByteView(head, kHeaderSize), file_size, path, read_footer,
                                     &impl->header, &impl->footer));
  return SegmentReader(std::move(impl));
}

Result<SegmentReader> SegmentReader::OpenBytes(std::string bytes, std::string name) {
  auto impl = std::make_unique<Impl>();
  impl->path = std::move(name);
  impl->bytes = std::move(bytes);
  const ByteView all = AsBytes(impl->bytes);
  if (all.size() < kHeaderSize) {
    return Status::Corrupt(impl->path + ": segment is " + std::to_string(all.size()) +
                           " bytes, shorter than the 256-byte header (truncated)");
  }
  auto read_footer = [&](const Header& h, std::string* out) {
    out->assign(impl->bytes, static_cast<size_t>(h.footer_offset));
    return Status::OK();
  };
  ATFILL_RETURN_IF_ERROR(LoadSegment(all.first(kHeaderSize), all.size(), impl->path, read_footer,
                                     &impl->header, &impl->footer));
  return SegmentReader(std::move(impl));
}

const Header& SegmentReader::header() const { return impl_->header; }
const Footer& SegmentReader::footer() const { return impl_->footer; }
const std::string& SegmentReader::path() const { return impl_->path; }

Result<std::string> SegmentReader::ReadFrame(size_t block) const {
  const auto& blocks = impl_->footer.blocks;
  if (block >= blocks.size()) {
    return Status::NotFound(impl_->path + ": block " + std::to_string(block) + " of " +
                            std::to_string(blocks.size()));
  }
  const BlockInfo& b = blocks[block];
  std::string frame(b.compressed_size, '\0');
  uint64_t prefix = 0;
  if (impl_->fd.get() >= 0) {
    ATFILL_RETURN_IF_ERROR(PreadAll(impl_->fd.get(), &prefix, 8, b.offset, impl_->path));
    ATFILL_RETURN_IF_ERROR(
        PreadAll(impl_->fd.get(), frame.data(), frame.size(), b.offset + 8, impl_->path));
  } else {
    // ParseFooter checked the frame lies inside the block region.
    std::memcpy(&prefix, impl_->bytes.data() + b.offset, 8);
    std::memcpy(frame.data(), impl_->bytes.data() + b.offset + 8, frame.size());
  }
  if (prefix != b.compressed_size) {
    return Status::Corrupt(impl_->path + ": block " + std::to_string(block) + " length prefix is " +
                           std::to_string(prefix) + ", block index says " +
                           std::to_string(b.compressed_size));
  }
  return frame;
}

Result<Block> SegmentReader::ReadBlock(size_t block, uint64_t cap) const {
  auto frame = ReadFrame(block);
  if (!frame.ok()) return frame.status();
  const BlockInfo& b = impl_->footer.blocks[block];
  const std::string where = impl_->path + ": block " + std::to_string(block);
  auto body = DecompressFrame(AsBytes(*frame), b.uncompressed_size, cap);
  if (!body.ok()) return body.status().WithContext(where);
  auto parsed = Block::Parse(std::move(body).value());
  if (!parsed.ok()) return parsed.status().WithContext(where);
  if (parsed->size() != b.event_count) {
    return Status::Corrupt(where + " holds " + std::to_string(parsed->size()) +
                           " rows, block index says " + std::to_string(b.event_count));
  }
  return parsed;
}

// ---- writer ----

Status SegmentWriterOptions::Validate() const {
  if (rows_per_block < 1 || rows_per_block > kMaxBlockRows) {
    return Status::Invalid("rows_per_block " + std::to_string(rows_per_block) + " is outside 1.." +
                           std::to_string(kMaxBlockRows));
  }
  if (zstd_level < ZSTD_minCLevel() || zstd_level > ZSTD_maxCLevel()) {
    return Status::Invalid("zstd_level " + std::to_string(zstd_level) + " is outside " +
                           std::to_string(ZSTD_minCLevel()) + ".." +
                           std::to_string(ZSTD_maxCLevel()));
  }
  if (max_block_bytes < 1024 || max_block_bytes > kMaxBodyBytes) {
    return Status::Invalid("max_block_bytes " + std::to_string(max_block_bytes) +
                           " is outside 1 KiB..4 GiB - 1");
  }
  return Status::OK();
}

struct SegmentWriter::Impl {
  std::string path;
  std::string tmp_path;
  SegmentWriterOptions options;
  Fd fd;
  bool sealed = false;
  Status error;  // the first I/O error; every later call returns it
  uint64_t rows = 0;
  uint64_t bytes_written = 0;

  // The block being filled.
  BlockBuilder pending;
  BlockInfo pending_info;
  std::unordered_set<DidHash, DidHashHasher> pending_dids;
  std::vector<uint32_t> pending_collections;

  // Written blocks.
  std::vector<BlockInfo> blocks;
  std::vector<std::vector<DidHash>> block_dids;
  std::vector<std::vector<uint32_t>> block_collections;

  // The whole segment.
  std::unordered_set<DidHash, DidHashHasher> dids;
  std::vector<Collection> collections;
  std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>> collection_ids;
  std::vector<uint64_t> marked_in_block;  // per collection id: 1 + the block that last set it
  uint64_t last_seq = 0;
  int64_t min_witnessed_at = 0, max_witnessed_at = 0;

  ~Impl() {
    if (!sealed && fd.get() >= 0) {
      fd.Close();
      ::unlink(tmp_path.c_str());
    }
  }

  // Remembers the first error; returns `status` unchanged.
  Status Track(Status status) {
    if (!status.ok() && error.ok()) error = status;
    return status;
  }

  void MarkCollection(std::string_view name, bool count) {
    auto it = collection_ids.find(name);
    uint32_t id;
    if (it == collection_ids.end()) {
      id = static_cast<uint32_t>(collections.size());
      collections.push_back({std::string(name), 0});
      collection_ids.emplace(std::string(name), id);
      marked_in_block.push_back(0);
    } else {
      id = it->second;
    }
    if (count) ++collections[id].count;
    if (marked_in_block[id] != blocks.size() + 1) {
      marked_in_block[id] = blocks.size() + 1;
      pending_collections.push_back(id);
    }
  }

  Status FlushBlock() {
    if (pending.rows() == 0) return Status::OK();
    const uint32_t n = static_cast<uint32_t>(pending.rows());
    const std::string body = pending.Finish();
    const std::string frame = CompressFrame(body, options.zstd_level);
    if (frame.empty() || frame.size() > kMaxBodyBytes) {
      return Track(
          Status::Internal(tmp_path + ": cannot compress block " + std::to_string(blocks.size())));
    }
    const uint64_t prefix = frame.size();
    ATFILL_RETURN_IF_ERROR(Track(WriteAll(fd.get(), &prefix, 8, tmp_path)));
    ATFILL_RETURN_IF_ERROR(Track(WriteAll(fd.get(), frame.data(), frame.size(), tmp_path)));
    pending_info.offset = bytes_written;
    pending_info.compressed_size = static_cast<uint32_t>(frame.size());
    pending_info.uncompressed_size = static_cast<uint32_t>(body.size());
    pending_info.event_count = n;
    bytes_written += 8 + frame.size();
    blocks.push_back(pending_info);
    block_dids.emplace_back(pending_dids.begin(), pending_dids.end());
    pending_dids.clear();
    block_collections.push_back(std::move(pending_collections));
    pending_collections.clear();
    pending_info = BlockInfo();
    return Status::OK();
  }

  std::string BuildFooter(Header* h) {
    std::string footer;
    h->footer_offset = h->block_index_offset = bytes_written;
    for (const BlockInfo& b : blocks) {
      Put<uint64_t>(&footer, b.offset);
      Put<uint32_t>(&footer, b.compressed_size);
      Put<uint32_t>(&footer, b.uncompressed_size);
      Put<uint32_t>(&footer, b.event_count);
      Put<uint64_t>(&footer, b.min_seq);
      Put<uint64_t>(&footer, b.max_seq);
      Put<int64_t>(&footer, b.min_witnessed_at);
      Put<int64_t>(&footer, b.max_witnessed_at);
    }

    h->did_bloom_offset = bytes_written + footer.size();
    Bloom segment_bloom = Bloom::ForCount(std::max<uint64_t>(1, dids.size()));
    for (const DidHash& d : dids) segment_bloom.Add(d);
    segment_bloom.AppendTo(&footer);

    h->block_did_bloom_offset = bytes_written + footer.size();
    size_t widest = 1;
    for (const auto& d : block_dids) widest = std::max(widest, d.size());
    const Bloom::Params params = Bloom::SizeFor(widest);
    Put<uint32_t>(&footer, static_cast<uint32_t>(blocks.size()));
    Put<uint32_t>(&footer, blocks.empty()
                               ? 0
                               : static_cast<uint32_t>(Bloom::SerializedSize(params.num_blocks)));
    for (const auto& block : block_dids) {
      Bloom bloom = std::move(Bloom::Make(params.num_blocks, params.k)).value();
      for (const DidHash& d : block) bloom.Add(d);
      bloom.AppendTo(&footer);
    }

    h->collection_index_offset = bytes_written + footer.size();
    const size_t bitmask_len = (collections.size() + 7) / 8;
    std::string body;
    for (const Collection& c : collections) {
      body.push_back(static_cast<char>(c.name.size()));
      Put<uint32_t>(&body, c.count);
      body += c.name;
    }
    for (const auto& ids : block_collections) {
      std::string mask(bitmask_len, '\0');
      for (uint32_t id : ids) mask[id / 8] = static_cast<char>(mask[id / 8] | (1 << (id % 8)));
      body += mask;
    }
    Put<uint32_t>(&footer, static_cast<uint32_t>(collections.size()));
    Put<uint32_t>(&footer, static_cast<uint32_t>(blocks.size()));
    Put<uint32_t>(&footer, static_cast<uint32_t>(bitmask_len));
    Put<uint32_t>(&footer, static_cast<uint32_t>(body.size()));
    footer += CompressFrame(body, options.zstd_level);

    h->version = kFormatVersion;
    h->block_count = static_cast<uint32_t>(blocks.size());
    h->event_count = static_cast<uint32_t>(rows);
    h->unique_did_count = static_cast<uint32_t>(dids.size());
    if (!blocks.empty()) {
      h->min_seq = blocks.front().min_seq;
      h->max_seq = blocks.back().max_seq;
      h->min_witnessed_at = min_witnessed_at;
      h->max_witnessed_at = max_witnessed_at;
    }
    return footer;
  }
};

SegmentWriter::SegmentWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SegmentWriter::SegmentWriter(SegmentWriter&&) noexcept = default;
SegmentWriter& SegmentWriter::operator=(SegmentWriter&&) noexcept = default;
SegmentWriter::~SegmentWriter() = default;

Result<SegmentWriter> SegmentWriter::Create(const std::string& path, SegmentWriterOptions options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->tmp_path = path + ".tmp";
  impl->options = options;
  impl->fd = Fd(::open(impl->tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (impl->fd.get() < 0) return Status::IoError(Errno("cannot create", impl->tmp_path));
  std::string head(kHeaderSize, '\0');
  std::memcpy(head.data(), kMagic, 4);
  ATFILL_RETURN_IF_ERROR(WriteAll(impl->fd.get(), head.data(), head.size(), impl->tmp_path));
  impl->bytes_written = kHeaderSize;
  return SegmentWriter(std::move(impl));
}

Status SegmentWriter::Append(const Row& row) {
  Impl& w = *impl_;
  if (w.sealed) return Status::Invalid(w.path + ": segment already sealed");
  if (!w.error.ok()) return w.error;
  ATFILL_RETURN_IF_ERROR(ValidateRow(row));
  if (w.rows > 0 && row.seq <= w.last_seq) {
    return Status::Invalid(w.path + ": row seq " + std::to_string(row.seq) +
                           " does not follow seq " + std::to_string(w.last_seq));
  }
  if (row.collection.starts_with('$')) {
    return Status::Invalid(w.path + ": row seq " + std::to_string(row.seq) + ": collection \"" +
                           std::string(row.collection) + "\" is reserved for sentinels");
  }
  if (w.rows >= std::numeric_limits<uint32_t>::max()) {
    return Status::OutOfRange(w.path + ": a segment holds at most 2^32 - 1 rows");
  }
  const uint64_t row_bytes = BlockBuilder::RowBytes(row);
  if (4 + row_bytes > kMaxBodyBytes) {
    return Status::OutOfRange(w.path + ": row seq " + std::to_string(row.seq) + " is " +
                              std::to_string(row_bytes) + " bytes, too large for a block");
  }
  if (w.pending.rows() > 0 && w.pending.body_size() + row_bytes > w.options.max_block_bytes) {
    ATFILL_RETURN_IF_ERROR(w.FlushBlock());
  }

  BlockInfo& b = w.pending_info;
  if (w.pending.rows() == 0) {
    b.min_seq = row.seq;
    b.min_witnessed_at = b.max_witnessed_at = row.witnessed_at;
  }
  b.max_seq = row.seq;
  b.min_witnessed_at = std::min(b.min_witnessed_at, row.witnessed_at);
  b.max_witnessed_at = std::max(b.max_witnessed_at, row.witnessed_at);
  if (w.rows == 0) w.min_witnessed_at = w.max_witnessed_at = row.witnessed_at;
  w.min_witnessed_at = std::min(w.min_witnessed_at, row.witnessed_at);
  w.max_witnessed_at = std::max(w.max_witnessed_at, row.witnessed_at);

  if (!row.did.empty()) {
    const DidHash h = HashDid(row.did);
    w.pending_dids.insert(h);
    w.dids.insert(h);
  }
  // The real collection is interned before the sentinel (§4.5).
  if (!row.collection.empty()) w.MarkCollection(row.collection, true);
  if (const std::string_view s = SentinelFor(row.kind); !s.empty()) w.MarkCollection(s, false);

  w.pending.Add(row);
  w.last_seq = row.seq;
  ++w.rows;
  if (w.pending.rows() >= w.options.rows_per_block) return w.FlushBlock();
  return Status::OK();
}

Status SegmentWriter::Seal() {
  Impl& w = *impl_;
  if (w.sealed) return Status::Invalid(w.path + ": segment already sealed");
  if (!w.error.ok()) return w.error;
  ATFILL_RETURN_IF_ERROR(w.FlushBlock());
  Header h;
  const std::string footer = w.BuildFooter(&h);
  h.checksum = SegmentChecksum(AsBytes(SerializeHeader(h)), AsBytes(footer));
  // A zero checksum would mark the file active; XXH3 gives it with probability 2^-64.
  if (h.checksum == 0) return w.Track(Status::Internal(w.tmp_path + ": checksum is 0"));
  const std::string head = SerializeHeader(h);
  ATFILL_RETURN_IF_ERROR(w.Track(WriteAll(w.fd.get(), footer.data(), footer.size(), w.tmp_path)));
  if (::pwrite(w.fd.get(), head.data(), head.size(), 0) != static_cast<ssize_t>(head.size())) {
    return w.Track(Status::IoError(Errno("writing the header of", w.tmp_path)));
  }
  if (::fsync(w.fd.get()) != 0) return w.Track(Status::IoError(Errno("fsync", w.tmp_path)));
  if (w.fd.Close() != 0) return w.Track(Status::IoError(Errno("closing", w.tmp_path)));
  if (::rename(w.tmp_path.c_str(), w.path.c_str()) != 0) {
    const Status st = Status::IoError(Errno("renaming to " + w.path + ":", w.tmp_path));
    ::unlink(w.tmp_path.c_str());
    return w.Track(st);
  }
  w.sealed = true;
  w.bytes_written += footer.size();
  // Make the rename durable.
  std::string dir = std::filesystem::path(w.path).parent_path().string();
  if (dir.empty()) dir = ".";
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0 || ::fsync(dfd.get()) != 0) {
    return Status::IoError(Errno("fsync of the directory", dir));
  }
  return Status::OK();
}

uint64_t SegmentWriter::rows() const { return impl_->rows; }
uint64_t SegmentWriter::bytes_written() const { return impl_->bytes_written; }

}  // namespace atfill::jss
