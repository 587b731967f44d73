// Internal to sinks/: the SQLite sink's compression of record bodies (schema version 3).
//
// A collection's bodies are stored as their JSON text until the sink has seen `train_samples` of
// them; it then trains a zstd dictionary on those bodies (ZDICT_trainFromBuffer), stores it in
// atfill_dicts inside the batch's transaction, and from that row on stores each body as a zstd
// frame made with that dictionary (one whose frame header names the dictionary's id), or as
// text when the frame would not be smaller. The dictionary commits with the first rows that
// need it, or not at all. Rows of a collection written before (and every row of a version 2
// database) stay text; atfill_json (sqlite_functions.hpp) reads both.
#pragma once

#include <sqlite3.h>
#include <zstd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.hpp"
#include "sinks/sqlite_util.hpp"

namespace atfill::sinks::sqlite {

struct CompressorOptions {
  // Bodies of a collection a dictionary is trained on (and the sink has to see first).
  size_t train_samples = 1000;
  // Largest dictionary, bytes.
  size_t dictionary_bytes = 16 << 10;
  // zstd level: 1 compresses as small as 3 with these dictionaries, faster, and its dictionary
  // state is a fifth of the size (docs/performance.md).
  int level = 1;
  // Bodies buffered for training, in all collections at once, bytes; past it the buffers start
  // again empty, so memory stays bounded however many collections a job sees.
  size_t max_sample_bytes = 64 << 20;
};

// What to store in the record column.
struct EncodedBody {
  std::string_view bytes;   // valid until the next Encode
  bool compressed = false;  // a blob (zstd frame) when true, else the JSON text
};

// Not thread-safe: the sink's thread only. Every call runs inside the sink's open write
// transaction.
class Compressor {
 public:
  // Prepares its statements on `db` (a version 3 database).
  static Result<std::unique_ptr<Compressor>> Open(sqlite3* db, CompressorOptions options);
  ~Compressor();
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;

  // The value to store for `body` in a row of `collection_id`; may train and store the
  // collection's dictionary first (in the open transaction).
  Result<EncodedBody> Encode(int64_t collection_id, std::string_view body);
  // The open transaction committed: the dictionaries it stored are there to stay.
  void Committed() { created_.clear(); }
  // The open transaction was rolled back: forgets the dictionaries it stored.
  void RolledBack();

 private:
  struct Collection {
    ZSTD_CDict* cdict = nullptr;
    int64_t dictionary_id = 0;
    bool looked_up = false;  // atfill_dicts was read for it
    bool gave_up = false;    // training failed (bodies too few or too alike): stays text
    std::vector<std::string> samples;
  };

  Compressor(sqlite3* db, CompressorOptions options);
  // Loads the newest stored dictionary of the collection, if any.
  Status LookUp(int64_t collection_id, Collection& c);
  // Trains, stores and loads a dictionary from c.samples.
  Status Train(int64_t collection_id, Collection& c);
  void Forget(Collection& c);

  sqlite3* db_;
  CompressorOptions options_;
  Stmt find_, next_id_, insert_;
  ZSTD_CCtx* cctx_;
  std::unordered_map<int64_t, Collection> collections_;
  size_t sample_bytes_ = 0;
  std::vector<int64_t> created_;  // dictionaries stored by the open transaction
  std::string out_;
};

}  // namespace atfill::sinks::sqlite
