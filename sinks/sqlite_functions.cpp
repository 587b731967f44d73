// Compiled twice: into atfill_sinks, calling SQLite directly, and with ATFILL_SQLITE_EXTENSION
// into the loadable extension (atfill_sqlite_ext), whose calls go through the routines the
// loading program hands it (sqlite3ext.h), so one source serves both.
#ifdef ATFILL_SQLITE_EXTENSION
#include <sqlite3ext.h>
SQLITE_EXTENSION_INIT1
#else
#include <sqlite3.h>
#endif

#include <zstd.h>

#include <string>
#include <unordered_map>

#include "atproto/cid.hpp"
#include "sinks/sqlite_functions.hpp"

namespace atfill::sinks {
namespace {

// A connection that reads rows of very many collections keeps at most this many dictionaries;
// past it, it drops them all and loads again the ones rows name (a DDict is about 60 KB).
constexpr size_t kMaxLoadedDictionaries = 512;

// One connection's decompression state: its context and the dictionaries it has loaded, by the
// id the frames name. Dictionaries are never changed once committed (rows name them by id), so
// what is loaded stays right.
class Decoder {
 public:
  Decoder() : dctx_(ZSTD_createDCtx()) {}
  ~Decoder() {
    Clear();
    ZSTD_freeDCtx(dctx_);
  }
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  ZSTD_DCtx* dctx() const { return dctx_; }

  // Dictionary `id` of atfill_dicts, read on `db` the first time; null with *error set when the
  // database does not hold it.
  const ZSTD_DDict* Dictionary(sqlite3* db, unsigned id, std::string* error) {
    if (auto it = loaded_.find(id); it != loaded_.end()) return it->second;
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db, "SELECT dict FROM atfill_dicts WHERE id = ?1", -1, &s, nullptr) !=
        SQLITE_OK) {
      *error = std::string("cannot read atfill_dicts: ") + sqlite3_errmsg(db);
      sqlite3_finalize(s);
      return nullptr;
    }
    sqlite3_bind_int64(s, 1, id);
    ZSTD_DDict* ddict = nullptr;
    const int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
      ddict = ZSTD_createDDict(sqlite3_column_blob(s, 0),
                               static_cast<size_t>(sqlite3_column_bytes(s, 0)));
      if (ddict == nullptr) *error = "dictionary " + std::to_string(id) + " is not a zstd one";
    } else if (rc == SQLITE_DONE) {
      *error = "the record names dictionary " + std::to_string(id) +
               ", which atfill_dicts does not hold";
    } else {
      *error = std::string("cannot read atfill_dicts: ") + sqlite3_errmsg(db);
    }
    sqlite3_finalize(s);
    if (ddict == nullptr) return nullptr;
    if (loaded_.size() >= kMaxLoadedDictionaries) Clear();
    loaded_.emplace(id, ddict);
    return ddict;
  }

 private:
  void Clear() {
    for (auto& [id, ddict] : loaded_) ZSTD_freeDDict(ddict);
    loaded_.clear();
  }

  ZSTD_DCtx* dctx_;
  std::unordered_map<unsigned, ZSTD_DDict*> loaded_;
};

void Fail(sqlite3_context* ctx, const std::string& why) {
  const std::string message = "atfill_json: " + why;
  sqlite3_result_error(ctx, message.c_str(), -1);
}

void AtfillJson(sqlite3_context* ctx, int /*argc*/, sqlite3_value** argv) {
  sqlite3_value* value = argv[0];
  if (sqlite3_value_type(value) != SQLITE_BLOB) {
    sqlite3_result_value(ctx, value);  // stored as text: the JSON itself
    return;
  }
  const void* frame = sqlite3_value_blob(value);
  const auto frame_size = static_cast<size_t>(sqlite3_value_bytes(value));
  const unsigned long long size = ZSTD_getFrameContentSize(frame, frame_size);
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) {
    return Fail(ctx, "the record is a blob but not a zstd frame that atfill wrote");
  }
  sqlite3* db = sqlite3_context_db_handle(ctx);
  if (size > static_cast<unsigned long long>(sqlite3_limit(db, SQLITE_LIMIT_LENGTH, -1))) {
    sqlite3_result_error_toobig(ctx);
    return;
  }
  const unsigned id = ZSTD_getDictID_fromFrame(frame, frame_size);
  if (id == 0) return Fail(ctx, "the record's zstd frame names no dictionary");
  auto* decoder = static_cast<Decoder*>(sqlite3_user_data(ctx));
  std::string error;
  const ZSTD_DDict* ddict = decoder->Dictionary(db, id, &error);
  if (ddict == nullptr) return Fail(ctx, error);
  char* text = static_cast<char*>(sqlite3_malloc64(size + 1));
  if (text == nullptr) {
    sqlite3_result_error_nomem(ctx);
    return;
  }
  const size_t got =
      ZSTD_decompress_usingDDict(decoder->dctx(), text, size, frame, frame_size, ddict);
  if (ZSTD_isError(got) || got != size) {
    sqlite3_free(text);
    return Fail(ctx, std::string("the record's zstd frame does not decompress: ") +
                         (ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short"));
  }
  sqlite3_result_text64(ctx, text, size, sqlite3_free, SQLITE_UTF8);
}

void AtfillCid(sqlite3_context* ctx, int /*argc*/, sqlite3_value** argv) {
  sqlite3_value* value = argv[0];
  if (sqlite3_value_type(value) != SQLITE_BLOB) {
    sqlite3_result_value(ctx, value);  // stored as text: the CID's text itself
    return;
  }
  const auto* bytes = static_cast<const uint8_t*>(sqlite3_value_blob(value));
  auto cid =
      atproto::Cid::FromBinary(ByteView(bytes, static_cast<size_t>(sqlite3_value_bytes(value))));
  if (!cid.ok()) {
    const std::string message =
        "atfill_cid: the cid is a blob but not a binary CID: " + cid.status().message();
    sqlite3_result_error(ctx, message.c_str(), -1);
    return;
  }
  const std::string text = cid->ToString();
  sqlite3_result_text(ctx, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
}

void DestroyDecoder(void* decoder) { delete static_cast<Decoder*>(decoder); }

}  // namespace

int RegisterSqliteFunctions(sqlite3* db) {
  // Deterministic (a committed dictionary never changes) and innocuous (no side effects), so
  // the view may call them also where the schema is not trusted (PRAGMA trusted_schema = OFF).
  constexpr int kFlags = SQLITE_UTF8 | SQLITE_DETERMINISTIC | SQLITE_INNOCUOUS;
  const int rc = sqlite3_create_function_v2(db, "atfill_json", 1, kFlags, new Decoder(), AtfillJson,
                                            nullptr, nullptr, DestroyDecoder);
  if (rc != SQLITE_OK) return rc;
  return sqlite3_create_function_v2(db, "atfill_cid", 1, kFlags, nullptr, AtfillCid, nullptr,
                                    nullptr, nullptr);
}

}  // namespace atfill::sinks

#ifdef ATFILL_SQLITE_EXTENSION
// The entry point SQLite derives from the file name libatfill_sqlite_ext.so.
extern "C" __attribute__((visibility("default"))) int sqlite3_atfillsqliteext_init(
    sqlite3* db, char** error, const sqlite3_api_routines* api) {
  SQLITE_EXTENSION_INIT2(api);
  const int rc = atfill::sinks::RegisterSqliteFunctions(db);
  if (rc != SQLITE_OK) {
    *error = sqlite3_mprintf("atfill: cannot register atfill_json and atfill_cid: %s",
                             sqlite3_errstr(rc));
  }
  return rc;
}
#endif
