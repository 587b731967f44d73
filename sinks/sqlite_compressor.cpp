#include "sinks/sqlite_compressor.hpp"

#include <zdict.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "base/clock.hpp"
#include "sinks/sqlite_schema.hpp"

namespace atfill::sinks::sqlite {
namespace {

// A job that writes very many collections keeps at most this many dictionaries loaded (a level 1
// CDict of a 16 KiB dictionary is about 80 KB); past it, it drops them and loads again the ones
// it writes.
constexpr size_t kMaxLoadedDictionaries = 512;

// Where a zstd dictionary keeps its id (RFC 8878, "Dictionary Format": 4 bytes of magic number,
// then the id, little-endian). Frames made with the dictionary name that id.
constexpr size_t kDictionaryIdOffset = 4;

}  // namespace

Compressor::Compressor(sqlite3* db, CompressorOptions options)
    : db_(db), options_(options), cctx_(ZSTD_createCCtx()) {}

Compressor::~Compressor() {
  for (auto& [id, c] : collections_) ZSTD_freeCDict(c.cdict);
  ZSTD_freeCCtx(cctx_);
}

Result<std::unique_ptr<Compressor>> Compressor::Open(sqlite3* db, CompressorOptions options) {
  std::unique_ptr<Compressor> c(new Compressor(db, options));
  if (c->cctx_ == nullptr) return Status::ResourceExhausted("cannot allocate a zstd context");
  ATFILL_ASSIGN_OR_RETURN(c->find_, Prepare(db,
                                            "SELECT id, dict FROM atfill_dicts WHERE "
                                            "collection_id = ?1 ORDER BY id DESC LIMIT 1",
                                            true));
  ATFILL_ASSIGN_OR_RETURN(c->next_id_,
                          Prepare(db, "SELECT ifnull(max(id), 0) + 1 FROM atfill_dicts", true));
  ATFILL_ASSIGN_OR_RETURN(c->insert_, Prepare(db,
                                              "INSERT INTO atfill_dicts(id, collection_id, dict, "
                                              "samples, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                                              true));
  return c;
}

void Compressor::Forget(Collection& c) {
  ZSTD_freeCDict(c.cdict);
  c = Collection{};
}

void Compressor::RolledBack() {
  for (int64_t id : created_) {
    for (auto& [collection_id, c] : collections_) {
      if (c.dictionary_id == id) Forget(c);
    }
  }
  created_.clear();
}

Status Compressor::LookUp(int64_t collection_id, Collection& c) {
  sqlite3_stmt* s = find_.get();
  ResetOnExit reset(s);
  sqlite3_bind_int64(s, 1, collection_id);
  const int rc = sqlite3_step(s);
  c.looked_up = true;
  if (rc == SQLITE_DONE) return Status::OK();
  if (rc != SQLITE_ROW) return ErrorStatus(db_, rc, "reading atfill_dicts");
  ZSTD_CDict* cdict = ZSTD_createCDict(
      sqlite3_column_blob(s, 1), static_cast<size_t>(sqlite3_column_bytes(s, 1)), options_.level);
  if (cdict == nullptr) {
    return Status::Corrupt("atfill_dicts: dictionary " +
                           std::to_string(sqlite3_column_int64(s, 0)) + " is not a zstd one");
  }
  size_t loaded = 0;
  for (const auto& [id, other] : collections_) loaded += other.cdict != nullptr ? 1 : 0;
  if (loaded >= kMaxLoadedDictionaries) {
    for (auto& [id, other] : collections_) {
      if (other.cdict != nullptr) Forget(other);
    }
  }
  c.cdict = cdict;
  c.dictionary_id = sqlite3_column_int64(s, 0);
  for (const std::string& sample : c.samples) sample_bytes_ -= sample.size();
  c.samples.clear();
  c.samples.shrink_to_fit();
  return Status::OK();
}

Status Compressor::Train(int64_t collection_id, Collection& c) {
  std::string joined;
  std::vector<size_t> sizes;
  sizes.reserve(c.samples.size());
  for (std::string& sample : c.samples) {
    joined += sample;
    sizes.push_back(sample.size());
    sample_bytes_ -= sample.size();
  }
  c.samples.clear();
  c.samples.shrink_to_fit();
  std::string dict(options_.dictionary_bytes, '\0');
  const size_t size = ZDICT_trainFromBuffer(dict.data(), dict.size(), joined.data(), sizes.data(),
                                            static_cast<unsigned>(sizes.size()));
  if (ZDICT_isError(size) || size <= kDictionaryIdOffset + 4) {
    // Too few bytes, or bodies too alike to learn from: the collection stays text for this sink.
    c.gave_up = true;
    return Status::OK();
  }
  dict.resize(size);
  int64_t id = 0;
  {
    sqlite3_stmt* s = next_id_.get();
    ResetOnExit reset(s);
    const int rc = sqlite3_step(s);
    if (rc != SQLITE_ROW) return ErrorStatus(db_, rc, "numbering a dictionary");
    id = sqlite3_column_int64(s, 0);
  }
  if (id <= 0 || id > UINT32_MAX) return Status::OutOfRange("atfill_dicts has no id left");
  for (size_t i = 0; i < 4; ++i) {
    dict[kDictionaryIdOffset + i] =
        static_cast<char>((static_cast<uint64_t>(id) >> (8 * i)) & 0xff);
  }
  {
    sqlite3_stmt* s = insert_.get();
    ResetOnExit reset(s);
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_int64(s, 2, collection_id);
    sqlite3_bind_blob(s, 3, dict.data(), static_cast<int>(dict.size()), SQLITE_STATIC);
    sqlite3_bind_int64(s, 4, static_cast<int64_t>(sizes.size()));
    sqlite3_bind_int64(s, 5, SystemNowUs());
    const int rc = sqlite3_step(s);
    if (rc != SQLITE_DONE) return ErrorStatus(db_, rc, "storing a dictionary");
  }
  created_.push_back(id);
  // The first compressed row of the database switches the view to decompressing.
  ATFILL_RETURN_IF_ERROR(UseDecodingView(db_));
  c.cdict = ZSTD_createCDict(dict.data(), dict.size(), options_.level);
  if (c.cdict == nullptr) return Status::ResourceExhausted("cannot load a zstd dictionary");
  c.dictionary_id = id;
  return Status::OK();
}

Result<EncodedBody> Compressor::Encode(int64_t collection_id, std::string_view body) {
  Collection& c = collections_[collection_id];
  if (!c.looked_up) ATFILL_RETURN_IF_ERROR(LookUp(collection_id, c));
  if (c.cdict == nullptr && !c.gave_up) {
    if (sample_bytes_ + body.size() > options_.max_sample_bytes) {
      for (auto& [id, other] : collections_) {
        other.samples.clear();
        other.samples.shrink_to_fit();
      }
      sample_bytes_ = 0;
    }
    c.samples.emplace_back(body);
    sample_bytes_ += body.size();
    if (c.samples.size() >= options_.train_samples) {
      // Another sink on the file may have stored one meanwhile (this transaction holds the
      // write lock, so what it reads now is the latest).
      ATFILL_RETURN_IF_ERROR(LookUp(collection_id, c));
      if (c.cdict == nullptr) ATFILL_RETURN_IF_ERROR(Train(collection_id, c));
    }
  }
  if (c.cdict == nullptr) return EncodedBody{body, false};
  out_.resize(ZSTD_compressBound(body.size()));
  const size_t n =
      ZSTD_compress_usingCDict(cctx_, out_.data(), out_.size(), body.data(), body.size(), c.cdict);
  if (ZSTD_isError(n)) {
    return Status::Internal(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  }
  if (n >= body.size()) return EncodedBody{body, false};
  return EncodedBody{std::string_view(out_.data(), n), true};
}

}  // namespace atfill::sinks::sqlite
