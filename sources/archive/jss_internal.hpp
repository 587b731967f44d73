// What the .jss codec's files share: little-endian loads and stores, the per-thread zstd
// contexts, whole-file reads and writes, and the limits a file is held to. Not for use outside
// sources/ (jss.cpp, jss_format.cpp, jss_bloom.cpp).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "sources/archive/jss.hpp"

namespace atfill::jss {

static_assert(std::endian::native == std::endian::little, "the .jss codec assumes little-endian");

constexpr char kMagic[4] = {'j', 's', 's', '0'};
constexpr size_t kCollectionIndexHeaderSize = 16;
// Largest collection-index body accepted from a file (bytes).
constexpr uint64_t kMaxCollectionIndexBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxBodyBytes = std::numeric_limits<uint32_t>::max();

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

template <typename T>
void Put(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out->append(buf, sizeof(T));
}

template <typename T>
void AppendColumn(std::string* out, const std::vector<T>& column) {
  out->append(reinterpret_cast<const char*>(column.data()), column.size() * sizeof(T));
}

inline std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

inline std::string Errno(std::string_view what, const std::string& path) {
  return std::string(what) + " " + path + ": " + std::strerror(errno);
}

// ---- zstd contexts, one of each per thread ----

inline ZSTD_DCtx* ThreadDCtx() {
  struct Holder {
    ZSTD_DCtx* ctx = ZSTD_createDCtx();
    ~Holder() { ZSTD_freeDCtx(ctx); }
  };
  thread_local Holder holder;
  return holder.ctx;
}

inline ZSTD_CCtx* ThreadCCtx() {
  struct Holder {
    ZSTD_CCtx* ctx = ZSTD_createCCtx();
    ~Holder() { ZSTD_freeCCtx(ctx); }
  };
  thread_local Holder holder;
  return holder.ctx;
}

inline Status ZstdError(size_t code, size_t frame_size) {
  if (ZSTD_getErrorCode(code) == ZSTD_error_checksum_wrong) {
    return Status::Corrupt("zstd frame of " + std::to_string(frame_size) +
                           " bytes: content checksum mismatch");
  }
  return Status::Corrupt("bad zstd frame of " + std::to_string(frame_size) +
                         " bytes: " + ZSTD_getErrorName(code));
}

inline Status SizeMismatch(size_t frame_size, std::string_view got, uint64_t expected) {
  return Status::Corrupt("zstd frame of " + std::to_string(frame_size) + " bytes decompresses to " +
                         std::string(got) + " bytes, block index says " + std::to_string(expected) +
                         " (size mismatch)");
}

inline Status OverCap(size_t frame_size, std::string_view got, uint64_t cap) {
  return Status::OutOfRange("zstd frame of " + std::to_string(frame_size) +
                            " bytes decompresses to " + std::string(got) +
                            " bytes, over the cap of " + std::to_string(cap));
}

// ---- block bodies ----

// Rows appended column by column; Finish() lays them out as a §4.4 body.
class BlockBuilder {
 public:
  // Bytes one row adds to a body.
  static uint64_t RowBytes(const Row& r) {
    return 34 + r.collection.size() + r.did.size() + r.rkey.size() + r.rev.size() +
           r.payload.size();
  }

  void Add(const Row& r) {
    seq_.push_back(r.seq);
    witnessed_.push_back(r.witnessed_at);
    indexed_.push_back(r.indexed_at);
    kind_.push_back(static_cast<uint8_t>(r.kind));
    collection_len_.push_back(static_cast<uint8_t>(r.collection.size()));
    did_len_.push_back(static_cast<uint16_t>(r.did.size()));
    rkey_len_.push_back(static_cast<uint8_t>(r.rkey.size()));
    rev_len_.push_back(static_cast<uint8_t>(r.rev.size()));
    payload_len_.push_back(static_cast<uint32_t>(r.payload.size()));
    collections_.append(r.collection);
    dids_.append(r.did);
    rkeys_.append(r.rkey);
    revs_.append(r.rev);
    payloads_.append(AsChars(r.payload));
    body_size_ += RowBytes(r);
  }

  size_t rows() const { return seq_.size(); }
  uint64_t body_size() const { return body_size_; }

  std::string Finish() {
    std::string out;
    out.reserve(body_size_);
    Put<uint32_t>(&out, static_cast<uint32_t>(seq_.size()));
    AppendColumn(&out, seq_);
    AppendColumn(&out, witnessed_);
    AppendColumn(&out, indexed_);
    AppendColumn(&out, kind_);
    AppendColumn(&out, collection_len_);
    AppendColumn(&out, did_len_);
    AppendColumn(&out, rkey_len_);
    AppendColumn(&out, rev_len_);
    AppendColumn(&out, payload_len_);
    out += collections_;
    out += dids_;
    out += rkeys_;
    out += revs_;
    out += payloads_;
    *this = BlockBuilder();
    return out;
  }

 private:
  std::vector<uint64_t> seq_;
  std::vector<int64_t> witnessed_, indexed_;
  std::vector<uint8_t> kind_, collection_len_;
  std::vector<uint16_t> did_len_;
  std::vector<uint8_t> rkey_len_, rev_len_;
  std::vector<uint32_t> payload_len_;
  std::string collections_, dids_, rkeys_, revs_, payloads_;
  uint64_t body_size_ = 4;
};

// ---- files ----

inline Status WriteAll(int fd, const void* data, size_t size, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(Errno("writing", path));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::OK();
}

// Reads exactly `size` bytes at `offset`; a short file is Corrupt ("truncated").
inline Status PreadAll(int fd, void* data, size_t size, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(Errno("reading", path));
    }
    if (n == 0) {
      return Status::Corrupt(path + ": file ends at byte " + std::to_string(offset) +
                             ", before the bytes its index names (truncated)");
    }
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Close();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { Close(); }
  int get() const { return fd_; }
  int Close() {
    const int rc = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return rc;
  }

 private:
  int fd_ = -1;
};

struct DidHashHasher {
  size_t operator()(const DidHash& h) const { return static_cast<size_t>(h.low ^ h.high); }
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};

}  // namespace atfill::jss
