// What compressing record bodies would save: reads the record table of an atfill SQLite database
// and compresses each body alone with zstd, without a dictionary and with one dictionary per
// collection trained on that collection's first bodies (ZDICT_trainFromBuffer), checking that
// every body decompresses to its exact text. Prints, per collection and in all, the average body
// and compressed sizes, and the CPU per record of compressing and decompressing.
//
//   build/bench/compress_estimate DATABASE [SAMPLES=2000] [DICT_BYTES=32768] [LEVEL=3] [PREFIX=0]
//
// PREFIX > 0 compresses only each body's first PREFIX bytes (the dictionaries are still trained on
// whole bodies): with a small PREFIX the CPU per record is what a frame costs whatever its size.
//
// A database to read: ATFILL_SCALE_DIR=/tmp/scale ATFILL_SCALE_ROWS=300000
// ATFILL_SCALE_WINDOW=300000 build/bench/scale_bench --benchmark_filter=Interleaved keeps
// /tmp/scale/interleaved.db.
#include <sqlite3.h>
#include <zdict.h>
#include <zstd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Totals {
  long long rows = 0, raw = 0, with_dict = 0, plain = 0;
  double compress_s = 0, decompress_s = 0, train_s = 0;
};

// One collection's bodies, in row order.
std::vector<std::string> Bodies(sqlite3* db, int64_t collection_id) {
  std::vector<std::string> out;
  sqlite3_stmt* s = nullptr;
  sqlite3_prepare_v2(db,
                     "SELECT record FROM atfill_record_rows WHERE collection_id = ?1 ORDER BY id",
                     -1, &s, nullptr);
  sqlite3_bind_int64(s, 1, collection_id);
  while (sqlite3_step(s) == SQLITE_ROW) {
    out.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(s, 0)),
                     static_cast<size_t>(sqlite3_column_bytes(s, 0)));
  }
  sqlite3_finalize(s);
  return out;
}

bool Measure(const std::string& nsid, const std::vector<std::string>& bodies, size_t samples,
             size_t dict_cap, int level, size_t prefix, Totals* all) {
  std::string joined;
  std::vector<size_t> sizes;
  for (size_t i = 0; i < bodies.size() && i < samples; ++i) {
    joined += bodies[i];
    sizes.push_back(bodies[i].size());
  }
  std::vector<char> dict(dict_cap);
  const double t0 = Now();
  size_t dict_size = ZDICT_trainFromBuffer(dict.data(), dict.size(), joined.data(), sizes.data(),
                                           static_cast<unsigned>(sizes.size()));
  all->train_s += Now() - t0;
  if (ZDICT_isError(dict_size)) {
    std::fprintf(stderr, "%s: no dictionary (%s, %zu samples)\n", nsid.c_str(),
                 ZDICT_getErrorName(dict_size), sizes.size());
    dict_size = 0;
  }
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  ZSTD_CDict* cdict = dict_size > 0 ? ZSTD_createCDict(dict.data(), dict_size, level) : nullptr;
  ZSTD_DDict* ddict = dict_size > 0 ? ZSTD_createDDict(dict.data(), dict_size) : nullptr;
  Totals t;
  std::vector<char> out, back;
  bool ok = true;
  for (const std::string& whole : bodies) {
    const std::string_view b =
        prefix > 0 ? std::string_view(whole).substr(0, prefix) : std::string_view(whole);
    out.resize(ZSTD_compressBound(b.size()));
    back.resize(b.size() + 1);
    const size_t plain = ZSTD_compressCCtx(cctx, out.data(), out.size(), b.data(), b.size(), level);
    const double c0 = Now();
    const size_t z = cdict != nullptr ? ZSTD_compress_usingCDict(cctx, out.data(), out.size(),
                                                                 b.data(), b.size(), cdict)
                                      : plain;
    t.compress_s += Now() - c0;
    if (cdict != nullptr) {
      const double d0 = Now();
      const size_t n =
          ZSTD_decompress_usingDDict(dctx, back.data(), back.size(), out.data(), z, ddict);
      t.decompress_s += Now() - d0;
      if (n != b.size() || std::memcmp(back.data(), b.data(), n) != 0) ok = false;
    }
    t.rows += 1;
    t.raw += static_cast<long long>(b.size());
    t.with_dict += static_cast<long long>(std::min(z, b.size()));
    t.plain += static_cast<long long>(std::min(plain, b.size()));
  }
  ZSTD_freeCDict(cdict);
  ZSTD_freeDDict(ddict);
  ZSTD_freeCCtx(cctx);
  ZSTD_freeDCtx(dctx);
  const double n = static_cast<double>(std::max<long long>(t.rows, 1));
  std::printf("%-26s rows %8lld  body %6.1f  no dictionary %6.1f  dictionary (%zu B) %6.1f\n",
              nsid.c_str(), t.rows, static_cast<double>(t.raw) / n,
              static_cast<double>(t.plain) / n, dict_size, static_cast<double>(t.with_dict) / n);
  all->rows += t.rows;
  all->raw += t.raw;
  all->plain += t.plain;
  all->with_dict += t.with_dict;
  all->compress_s += t.compress_s;
  all->decompress_s += t.decompress_s;
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DATABASE [SAMPLES] [DICT_BYTES] [LEVEL] [PREFIX]\n", argv[0]);
    return 2;
  }
  const size_t samples = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 2000;
  const size_t dict_cap = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 32768;
  const int level = argc > 4 ? std::atoi(argv[4]) : 3;
  const size_t prefix = argc > 5 ? std::strtoul(argv[5], nullptr, 10) : 0;
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(argv[1], &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    std::fprintf(stderr, "cannot open %s\n", argv[1]);
    return 1;
  }
  std::vector<std::pair<int64_t, std::string>> collections;
  {
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(db, "SELECT id, nsid FROM atfill_collections ORDER BY id", -1, &s, nullptr);
    while (sqlite3_step(s) == SQLITE_ROW) {
      collections.emplace_back(sqlite3_column_int64(s, 0),
                               reinterpret_cast<const char*>(sqlite3_column_text(s, 1)));
    }
    sqlite3_finalize(s);
  }
  Totals all;
  bool ok = true;
  for (const auto& [id, nsid] : collections) {
    ok = Measure(nsid, Bodies(db, id), samples, dict_cap, level, prefix, &all) && ok;
  }
  sqlite3_close(db);
  const double n = static_cast<double>(std::max<long long>(all.rows, 1));
  std::printf("all: rows %lld  body %.1f  no dictionary %.1f  dictionary %.1f bytes\n", all.rows,
              static_cast<double>(all.raw) / n, static_cast<double>(all.plain) / n,
              static_cast<double>(all.with_dict) / n);
  std::printf("compress %.2f us/record, decompress %.2f us/record, training %.2f s in all\n",
              all.compress_s * 1e6 / n, all.decompress_s * 1e6 / n, all.train_s);
  if (!ok) std::printf("A BODY DID NOT ROUND-TRIP\n");
  return ok ? 0 : 1;
}
