#include "atproto/car.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "atproto/cbor.hpp"
#include "atproto/value.hpp"
#include "base/sha256.hpp"

namespace atfill::atproto {
namespace {

std::string At(uint64_t offset) { return " at byte " + std::to_string(offset); }

std::string Errno(const std::string& what, const std::string& name) {
  return what + " " + name + ": " + std::strerror(errno);
}

// The longest varint ReadVarint accepts.
constexpr size_t kMaxVarintBytes = 9;

// Reads the length varint at the front of `in` (which starts at `offset`); callers hand in every
// byte that can follow, so a short varint is a truncated file.
Result<uint64_t> ReadLength(ByteView in, uint64_t offset, const char* what, size_t* consumed) {
  auto length = ReadVarint(in, consumed);
  if (!length.ok()) {
    const Status& st = length.status();
    return Status(st.code(), std::string(what) + " length" + At(offset) + ": " + st.message());
  }
  return *length;
}

// Parses the header's DAG-CBOR (which starts at `offset`).
Status ParseHeader(ByteView header, uint64_t offset, const CarLimits& limits,
                   std::vector<Cid>* roots) {
  CborLimits cbor_limits;
  cbor_limits.max_bytes = limits.max_header_bytes;
  cbor_limits.max_items = std::max<size_t>(limits.max_roots, 16);
  cbor_limits.max_depth = 8;
  auto decoded = DecodeCbor(header, cbor_limits);
  if (!decoded.ok()) {
    return decoded.status().WithContext("CAR header" + At(offset));
  }
  const Value& value = *decoded;
  if (value.kind() != Value::Kind::kMap) {
    return Status::Invalid("CAR header" + At(offset) + " is not a map");
  }
  const Value* version = value.Find("version");
  if (version == nullptr || version->kind() != Value::Kind::kInt) {
    return Status::Invalid("CAR header" + At(offset) + " has no integer version");
  }
  if (version->as_int() == 2) {
    return Status::Unsupported("CAR" + At(offset) + " is CARv2; only CARv1 is supported");
  }
  if (version->as_int() != 1) {
    return Status::Invalid("CAR header" + At(offset) + " has version " +
                           std::to_string(version->as_int()) + ", expected 1");
  }
  const Value* root_list = value.Find("roots");
  if (root_list == nullptr || root_list->kind() != Value::Kind::kArray) {
    return Status::Invalid("CAR header" + At(offset) + " has no roots array");
  }
  if (root_list->as_array().size() > limits.max_roots) {
    return Status::OutOfRange("CAR header" + At(offset) + " lists " +
                              std::to_string(root_list->as_array().size()) + " roots, more than " +
                              std::to_string(limits.max_roots));
  }
  roots->clear();
  for (const Value& root : root_list->as_array()) {
    if (root.kind() != Value::Kind::kLink) {
      return Status::Invalid("CAR header" + At(offset) + " has a root that is not a CID link");
    }
    roots->push_back(root.as_link());
  }
  return Status::OK();
}

// Parses a section body (CID + block bytes, without the length varint). `offset` is the section's
// offset; `body_offset` where `body` starts.
Status ParseSection(ByteView body, uint64_t offset, uint64_t body_offset, const CarLimits& limits,
                    CarBlock* block) {
  size_t cid_size = 0;
  auto cid = Cid::ReadBinaryPrefix(body, &cid_size);
  if (!cid.ok()) {
    return cid.status().WithContext("CAR section" + At(offset) + ": bad CID" + At(body_offset));
  }
  if (cid_size > body.size()) {
    return Status::Internal("CID reader consumed past its input" + At(body_offset));
  }
  const ByteView data = body.subspan(cid_size);
  if (limits.verify_hashes) {
    const Sha256Digest digest = Sha256(data);
    const ByteView want = cid->digest();
    if (!std::equal(digest.begin(), digest.end(), want.begin(), want.end())) {
      return Status::Corrupt("CAR block " + cid->ToString() + " (section" + At(offset) +
                             ") does not match its CID: SHA-256 mismatch");
    }
  }
  block->cid = *cid;
  block->data = data;
  block->offset = offset;
  return Status::OK();
}

Status CheckSectionLength(uint64_t length, uint64_t offset, const CarLimits& limits) {
  if (length == 0) return Status::Invalid("CAR section" + At(offset) + " has length zero");
  if (length > limits.max_section_bytes) {
    return Status::OutOfRange("CAR section" + At(offset) + " declares " + std::to_string(length) +
                              " bytes, more than the limit of " +
                              std::to_string(limits.max_section_bytes));
  }
  return Status::OK();
}

Status CheckHeaderLength(uint64_t length, const CarLimits& limits) {
  if (length == 0) return Status::Invalid("CAR header at byte 0 has length zero");
  if (length > limits.max_header_bytes) {
    return Status::OutOfRange("CAR header at byte 0 declares " + std::to_string(length) +
                              " bytes, more than the limit of " +
                              std::to_string(limits.max_header_bytes));
  }
  return Status::OK();
}

Status WriteAll(int fd, const uint8_t* data, size_t size, const std::string& name) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(Errno("cannot write", name));
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return Status::OK();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// CarReader

Result<CarReader> CarReader::Open(ByteView data, const CarLimits& limits) {
  CarReader reader(data, limits);
  if (data.empty()) return Status::Corrupt("CAR is empty: no header at byte 0");
  size_t varint_size = 0;
  ATFILL_ASSIGN_OR_RETURN(uint64_t length, ReadLength(data, 0, "CAR header", &varint_size));
  ATFILL_RETURN_IF_ERROR(CheckHeaderLength(length, limits));
  if (length > data.size() - varint_size) {
    return Status::Corrupt("CAR header at byte 0 declares " + std::to_string(length) +
                           " bytes but only " + std::to_string(data.size() - varint_size) +
                           " follow");
  }
  ATFILL_RETURN_IF_ERROR(
      ParseHeader(data.subspan(varint_size, length), varint_size, limits, &reader.roots_));
  reader.pos_ = varint_size + length;
  return reader;
}

Result<bool> CarReader::Next(CarBlock* block) {
  if (pos_ == data_.size()) return false;
  const ByteView rest = data_.subspan(pos_);
  size_t varint_size = 0;
  ATFILL_ASSIGN_OR_RETURN(uint64_t length, ReadLength(rest, pos_, "CAR section", &varint_size));
  ATFILL_RETURN_IF_ERROR(CheckSectionLength(length, pos_, limits_));
  if (length > rest.size() - varint_size) {
    return Status::Corrupt("CAR section" + At(pos_) + " declares " + std::to_string(length) +
                           " bytes but only " + std::to_string(rest.size() - varint_size) +
                           " remain");
  }
  ATFILL_RETURN_IF_ERROR(
      ParseSection(rest.subspan(varint_size, length), pos_, pos_ + varint_size, limits_, block));
  pos_ += varint_size + length;
  return true;
}

// ---------------------------------------------------------------------------------------------
// CarFileReader

CarFileReader::CarFileReader(int fd, std::string name, const CarLimits& limits, size_t chunk_bytes)
    : fd_(fd), name_(std::move(name)), limits_(limits), chunk_bytes_(chunk_bytes) {}

CarFileReader::CarFileReader(CarFileReader&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      name_(std::move(other.name_)),
      limits_(other.limits_),
      chunk_bytes_(other.chunk_bytes_),
      roots_(std::move(other.roots_)),
      buf_(std::move(other.buf_)),
      begin_(other.begin_),
      end_(other.end_),
      eof_(other.eof_),
      file_pos_(other.file_pos_) {}

CarFileReader& CarFileReader::operator=(CarFileReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    name_ = std::move(other.name_);
    limits_ = other.limits_;
    chunk_bytes_ = other.chunk_bytes_;
    roots_ = std::move(other.roots_);
    buf_ = std::move(other.buf_);
    begin_ = other.begin_;
    end_ = other.end_;
    eof_ = other.eof_;
    file_pos_ = other.file_pos_;
  }
  return *this;
}

CarFileReader::~CarFileReader() {
  if (fd_ >= 0) ::close(fd_);
}

Result<CarFileReader> CarFileReader::Open(const std::filesystem::path& path,
                                          const CarLimits& limits, size_t chunk_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError(Errno("cannot open", path.string()));
  CarFileReader reader(fd, path.string(), limits, std::max<size_t>(chunk_bytes, 64));

  ATFILL_RETURN_IF_ERROR(reader.Fill(kMaxVarintBytes));
  if (reader.Available().empty()) {
    return Status::Corrupt("CAR file " + reader.name_ + " is empty: no header at byte 0");
  }
  size_t varint_size = 0;
  ATFILL_ASSIGN_OR_RETURN(uint64_t length,
                          ReadLength(reader.Available(), 0, "CAR header", &varint_size));
  ATFILL_RETURN_IF_ERROR(CheckHeaderLength(length, limits));
  ATFILL_RETURN_IF_ERROR(reader.Fill(varint_size + length));
  const ByteView avail = reader.Available();
  if (length > avail.size() - varint_size) {
    return Status::Corrupt("CAR header at byte 0 declares " + std::to_string(length) +
                           " bytes but the file ends after " +
                           std::to_string(avail.size() - varint_size));
  }
  ATFILL_RETURN_IF_ERROR(
      ParseHeader(avail.subspan(varint_size, length), varint_size, limits, &reader.roots_));
  reader.Consume(varint_size + length);
  return reader;
}

void CarFileReader::Consume(size_t n) {
  begin_ += n;
  file_pos_ += n;
}

Status CarFileReader::Fill(size_t n) {
  if (end_ - begin_ >= n || eof_) return Status::OK();
  // Slide the unread tail to the front, then grow to hold `n` (bounded by the section limit the
  // caller checked) or a chunk, whichever is larger.
  if (begin_ > 0) {
    std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  const size_t want = std::max(n, chunk_bytes_);
  if (buf_.size() < want) buf_.resize(want);
  while (end_ < n && !eof_) {
    const ssize_t got = ::read(fd_, buf_.data() + end_, buf_.size() - end_);
    if (got < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(Errno("cannot read", name_) + At(file_pos_ + end_));
    }
    if (got == 0) {
      eof_ = true;
    } else {
      end_ += static_cast<size_t>(got);
    }
  }
  return Status::OK();
}

Result<bool> CarFileReader::Next(CarBlock* block) {
  ATFILL_RETURN_IF_ERROR(Fill(kMaxVarintBytes));
  if (Available().empty()) return false;
  size_t varint_size = 0;
  ATFILL_ASSIGN_OR_RETURN(uint64_t length,
                          ReadLength(Available(), file_pos_, "CAR section", &varint_size));
  ATFILL_RETURN_IF_ERROR(CheckSectionLength(length, file_pos_, limits_));
  ATFILL_RETURN_IF_ERROR(Fill(varint_size + length));
  const ByteView avail = Available();
  if (length > avail.size() - varint_size) {
    return Status::Corrupt("CAR section" + At(file_pos_) + " declares " + std::to_string(length) +
                           " bytes but the file ends after " +
                           std::to_string(avail.size() - varint_size));
  }
  ATFILL_RETURN_IF_ERROR(ParseSection(avail.subspan(varint_size, length), file_pos_,
                                      file_pos_ + varint_size, limits_, block));
  Consume(varint_size + length);
  return true;
}

// ---------------------------------------------------------------------------------------------
// CarWriter

namespace {
constexpr size_t kWriterFlushBytes = 1 << 20;
}  // namespace

CarWriter::CarWriter(std::span<const Cid> roots) { AppendHeader(roots); }

CarWriter::CarWriter(CarWriter&& other) noexcept
    : buf_(std::move(other.buf_)),
      fd_(std::exchange(other.fd_, -1)),
      name_(std::move(other.name_)) {}

CarWriter& CarWriter::operator=(CarWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    buf_ = std::move(other.buf_);
    fd_ = std::exchange(other.fd_, -1);
    name_ = std::move(other.name_);
  }
  return *this;
}

CarWriter::~CarWriter() {
  // An unfinished file writer loses its buffered tail; Finish reports write errors.
  if (fd_ >= 0) ::close(fd_);
}

Result<CarWriter> CarWriter::CreateFile(const std::filesystem::path& path,
                                        std::span<const Cid> roots) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError(Errno("cannot create", path.string()));
  CarWriter writer;
  writer.fd_ = fd;
  writer.name_ = path.string();
  writer.AppendHeader(roots);
  return writer;
}

void CarWriter::AppendHeader(std::span<const Cid> roots) {
  Value::Array links;
  links.reserve(roots.size());
  for (const Cid& root : roots) links.push_back(Value::Link(root));
  Value::Map header;
  header.emplace_back("roots", Value::MakeArray(std::move(links)));
  header.emplace_back("version", Value::Int(1));
  const Bytes encoded = EncodeCbor(Value::MakeMap(std::move(header)));
  AppendVarint(encoded.size(), &buf_);
  buf_.insert(buf_.end(), encoded.begin(), encoded.end());
}

Status CarWriter::Add(const Cid& cid, ByteView data) {
  const ByteView binary = cid.binary();
  AppendVarint(binary.size() + data.size(), &buf_);
  buf_.insert(buf_.end(), binary.begin(), binary.end());
  buf_.insert(buf_.end(), data.begin(), data.end());
  return FlushIfLarge();
}

Result<Cid> CarWriter::AddBlock(ByteView data, Cid::Codec codec) {
  const Cid cid = Cid::Compute(codec, data);
  ATFILL_RETURN_IF_ERROR(Add(cid, data));
  return cid;
}

Status CarWriter::FlushIfLarge() {
  if (fd_ < 0 || buf_.size() < kWriterFlushBytes) return Status::OK();
  return Flush();
}

Status CarWriter::Flush() {
  if (fd_ < 0) return Status::OK();
  ATFILL_RETURN_IF_ERROR(WriteAll(fd_, buf_.data(), buf_.size(), name_));
  buf_.clear();
  return Status::OK();
}

Status CarWriter::Finish() {
  if (fd_ < 0) return Status::OK();
  Status st = Flush();
  if (::close(fd_) != 0 && st.ok()) st = Status::IoError(Errno("cannot close", name_));
  fd_ = -1;
  return st;
}

// ---------------------------------------------------------------------------------------------
// BlockStore

void BlockStore::Put(const Cid& cid, Bytes data) {
  if (map_.contains(cid)) return;
  owned_.push_back(std::move(data));
  map_.emplace(cid, ByteView(owned_.back()));
}

Cid BlockStore::PutBlock(ByteView data) {
  const Cid cid = Cid::Compute(Cid::Codec::kDagCbor, data);
  Put(cid, Bytes(data.begin(), data.end()));
  return cid;
}

Result<size_t> LoadCarBlocks(CarReader* reader, BlockStore* store) {
  size_t count = 0;
  CarBlock block;
  while (true) {
    ATFILL_ASSIGN_OR_RETURN(bool more, reader->Next(&block));
    if (!more) return count;
    store->PutView(block.cid, block.data);
    ++count;
  }
}

}  // namespace atfill::atproto
