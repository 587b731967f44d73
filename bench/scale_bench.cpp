// The SQLite sink as its table grows: create events from 1,000,000 accounts interleaved as a live
// stream or an archive delivers them (each event from an account drawn at random, record keys TIDs
// of the event's time, so increasing with time), written into ONE database in a backlog's batches
// (50,000 events per Write, as the live consumer and `atfill ingest` hand them to the sink while
// they catch up: [live] and [files] batch_records), reported per window of rows. The events go to
// the sink directly: the engine's parse, CID check and guard cost the same at every table size, so
// leaving them out shows the part that grows.
//
// Benchmarks, in this order:
//  * BM_RepoOrder: the reference, in a database of its own: a window of rows in repo order
//    (10,000 accounts one after another, each with record keys from all of its history) into an
//    empty table.
//  * BM_RepoRaw/bulk:B: the raw bound of BM_RepoOrder, in the same run: the same rows in the same
//    order and batches, written by a bare prepared-statement loop (one row per INSERT, or
//    ATFILL_SCALE_RAW_PER_INSERT, one transaction per batch, accounts interned beforehand) into the
//    sink's schema: B=0 its final layout, B=1 the bulk-load layout, whose indexes are built at the
//    end (timed with the loop). Counters: sink_over_raw (BM_RepoOrder's events/s over this one's).
//  * BM_Interleaved/window:N: rows (N-1)*window .. N*window of the growing table. Counters per
//    window: items_per_second (events/s over the Write calls), cpu_s (process CPU during them,
//    every thread), cpu_us_per_event, peak_rss_mb (VmHWM, reset at the start of the window),
//    disk_bytes_per_record (database + WAL file / rows so far), db_bytes_per_record (database
//    file only), read_bytes_per_event and written_bytes_per_event (what the process read from
//    and wrote to the storage layer during the window, /proc/self/io: reads the page cache served
//    are not counted), vs_repo (events/s / BM_RepoOrder's). Run it in a memory limit smaller
//    than the table (bench/memory_limited) to see the table outgrow its page cache.
//  * BM_Query/<name>: the queries users run, on the final table (warm cache, LIMIT 20), through
//    the atfill_records view.
//  * With ATFILL_SCALE_PG set, the same stream into the PostgreSQL sink:
//    BM_PgInterleaved/window:N (the counters of BM_Interleaved, with server_cpu_s, the CPU of
//    the server's processes during the window when the server runs on this machine,
//    server_read_bytes_per_event and server_written_bytes_per_event from their /proc/<pid>/io,
//    and cpu_us_per_event counting client and server; bytes per record are the record table's and
//    its indexes' as PostgreSQL counts them) and BM_PgQuery/<name> (the same queries through the
//    view, as prepared statements with every value a parameter).
//
// Environment:
//   ATFILL_SCALE_ROWS         rows to write (default 1,000,000)
//   ATFILL_SCALE_WINDOW       rows per reported window (default 1,000,000)
//   ATFILL_SCALE_ACCOUNTS     accounts of the stream (default 1,000,000)
//   ATFILL_SCALE_REPO_ROWS    rows of the repo-order reference (default: one window)
//   ATFILL_SCALE_REPO_ACCOUNTS  accounts of the repo-order reference, 100 records each, then
//                             the same accounts again (default 10,000)
//   ATFILL_SCALE_MAX_SECONDS  stop after the window in which the Write calls passed this many
//                             seconds in all (default 0: no limit)
//   ATFILL_SCALE_DIR          folder for the databases, kept afterwards (default: a scratch
//                             folder removed at exit)
//   ATFILL_SCALE_SETUP_SQL    a file of SQL run on each new database before the sink opens it: to
//                             measure another layout with the same sink (it must leave the schema
//                             at the sink's version, atfill_schema_version included)
//   ATFILL_SCALE_CACHE_MB     the sink's page cache (default: SqliteSinkOptions' default)
//   ATFILL_SCALE_WAL_MB       the sink's WAL size that starts a checkpoint (default:
//                             SqliteSinkOptions' default)
//   ATFILL_SCALE_PAGE_SIZE    the page size of the new databases, bytes (default: the sink's)
//   ATFILL_SCALE_BATCH        events per sink batch (default 50,000: [live] and [files]
//                             batch_records; [engine]'s default is 5,000)
//   ATFILL_SCALE_REPO_BATCH   events per sink batch of the repo-order runs (default:
//                             ATFILL_SCALE_BATCH; a crawl commits [crawl] batch_records, 50,000)
//   ATFILL_SCALE_CHECKPOINT   inline: the sinks checkpoint inside their COMMIT instead of on
//                             their checkpoint thread
//   ATFILL_BENCH_SQLITE_COMPRESS  1: the sinks compress bodies, 0: text (unset: the sink's
//                             default, text)
//   ATFILL_SCALE_BULK         1: BM_RepoOrder's sink loads with bulk_load (a fresh backfill's
//                             layout, indexes built when the sink closes, timed with the writes)
//   ATFILL_SCALE_PG           a libpq connection string: run the PostgreSQL benchmarks there, in
//                             schema ATFILL_SCALE_PG_SCHEMA (default atfill_scale_bench), dropped
//                             and created anew at the start and kept afterwards (to EXPLAIN)
//   ATFILL_SCALE_PG_SETUP_SQL a file of SQL run in that new schema (it is the search_path) before
//                             the sink opens it: another layout with the same sink
//   ATFILL_SCALE_PG_KEEP      1: keep the schema and its rows instead, the setup file unused (a
//                             table an earlier run made, grown by bench/scale_pg_append.sql,
//                             say); the stream goes on from the event after as many as the table
//                             holds rows, so its record keys are new (but for a few: the events
//                             that updated a profile made no row), and ATFILL_SCALE_ROWS more
//                             rows are written, rows_total counting those already there
//
//   ATFILL_SCALE_PG="host=127.0.0.1 port=15470 user=postgres dbname=postgres"
//     build/bench/scale_bench --benchmark_filter=Pg             (the variable set for the run)

//   build/bench/scale_bench                                (Release build)
//   ATFILL_SCALE_ROWS=10000000 build/bench/scale_bench
#include "bench/scale_bench.hpp"

#include <sqlite3.h>

namespace atfill::scale {
namespace {

void BM_RepoOrder(benchmark::State& state) {
  const uint64_t rows = Cfg().repo_rows;
  for (auto _ : state) {
    const fs::path path = Dir() / "repo_order.db";
    auto sink = NewDatabase(path, Cfg().bulk);
    if (!sink.ok()) return state.SkipWithError(sink.status().ToString().c_str());
    Stream stream(RepoAccounts(), /*repo_order=*/true, 7);
    Span span;
    if (Status st = WriteRows(sink->get(), &stream, rows, &span, Cfg().repo_batch); !st.ok()) {
      return state.SkipWithError(st.ToString().c_str());
    }
    // A bulk load builds its indexes when the sink closes: part of the load's time.
    const double cpu0 = bench::ProcessCpuSeconds();
    const auto t0 = std::chrono::steady_clock::now();
    sink->reset();
    const double close_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    span.cpu += bench::ProcessCpuSeconds() - cpu0;
    span.seconds += close_s;
    state.counters["close_s"] = close_s;
    state.counters["db_bytes_per_record"] =
        static_cast<double>(FileSize(path)) / static_cast<double>(rows);
    state.SetIterationTime(span.seconds);
    RepoRate() = static_cast<double>(rows) / span.seconds;
    state.counters["cpu_s"] = span.cpu;
    state.counters["cpu_us_per_event"] = span.cpu * 1e6 / static_cast<double>(rows);
    state.counters["avg_body_bytes"] =
        static_cast<double>(span.body_bytes) / static_cast<double>(rows);
    for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(path.string() + suffix);
  }
  state.SetItemsProcessed(static_cast<int64_t>(rows * state.iterations()));
  state.SetLabel(Cfg().bulk ? "repo order, empty table, bulk load" : "repo order, empty table");
}

void BM_RepoRaw(benchmark::State& state) {
  const bool bulk = state.range(0) != 0;
  const uint64_t rows = Cfg().repo_rows;
  for (auto _ : state) {
    const fs::path path = Dir() / "repo_raw.db";
    // The sink creates the schema (in the bulk layout when asked) and, closing, builds a bulk
    // load's indexes; the loop writes between on a connection of its own.
    auto sink = NewDatabase(path, bulk);
    if (!sink.ok()) return state.SkipWithError(sink.status().ToString().c_str());
    sqlite3* db = nullptr;
    sqlite3_open(path.c_str(), &db);
    const sinks::SqliteSinkOptions defaults;
    const int64_t cache =
        Cfg().cache_mb > 0 ? static_cast<int64_t>(Cfg().cache_mb) << 20 : defaults.cache_bytes;
    const std::string pragmas = "PRAGMA synchronous = NORMAL; PRAGMA cache_size = -" +
                                std::to_string(cache / 1024) + "; PRAGMA wal_autocheckpoint = " +
                                std::to_string(defaults.wal_autocheckpoint_bytes / Cfg().page_size);
    sqlite3_exec(db, pragmas.c_str(), nullptr, nullptr, nullptr);
    sqlite3_stmt* did_insert = nullptr;
    sqlite3_prepare_v2(db, "INSERT INTO atfill_dids(id, did) VALUES (?1, ?2)", -1, &did_insert,
                       nullptr);
    sqlite3_stmt* coll_insert = nullptr;
    sqlite3_prepare_v2(db, "INSERT INTO atfill_collections(id, nsid) VALUES (?1, ?2)", -1,
                       &coll_insert, nullptr);
    sqlite3_stmt* s = nullptr;
    // The stream repeats a few keys (profiles' "self"): kept as the sink keeps the first.
    const std::string insert =
        bench::RecordInsertSql(1) + " ON CONFLICT (collection_id, rkey, did_id) DO NOTHING";
    sqlite3_prepare_v2(db, insert.c_str(), -1, &s, nullptr);
    // ATFILL_SCALE_RAW_PER_INSERT rows per INSERT (default 1): the sink inserts 32.
    const size_t per_insert =
        std::max<uint64_t>(1, bench::EnvUint("ATFILL_SCALE_RAW_PER_INSERT", 1));
    sqlite3_stmt* multi = nullptr;
    const std::string multi_sql = bench::RecordInsertSql(per_insert) +
                                  " ON CONFLICT (collection_id, rkey, did_id) DO NOTHING";
    sqlite3_prepare_v2(db, multi_sql.c_str(), -1, &multi, nullptr);
    std::unordered_map<std::string, int64_t> dids, collections;
    Stream stream(RepoAccounts(), /*repo_order=*/true, 7);
    std::vector<Event> batch;
    std::vector<std::pair<int64_t, int64_t>> ids;
    std::vector<std::string> cids;
    auto bind = [&](sqlite3_stmt* st, int first, size_t i) {
      const auto& e = std::get<RecordEvent>(batch[i]);
      sqlite3_bind_int64(st, first + 1, ids[i].first);
      sqlite3_bind_int64(st, first + 2, ids[i].second);
      sqlite3_bind_text(st, first + 3, e.rkey.data(), static_cast<int>(e.rkey.size()),
                        SQLITE_STATIC);
      sqlite3_bind_text(st, first + 4, cids[i].data(), static_cast<int>(cids[i].size()),
                        SQLITE_STATIC);
      sqlite3_bind_text(st, first + 5, e.rev.data(), static_cast<int>(e.rev.size()), SQLITE_STATIC);
      sqlite3_bind_int64(st, first + 6, kStreamStartUs);
      sqlite3_bind_text(st, first + 7, e.created_at.data(), static_cast<int>(e.created_at.size()),
                        SQLITE_STATIC);
      sqlite3_bind_text(st, first + 8, e.body.data(), static_cast<int>(e.body.size()),
                        SQLITE_STATIC);
    };
    uint64_t body_bytes = 0;
    double seconds = 0;
    const double cpu0 = bench::ProcessCpuSeconds();
    double untimed_cpu = 0;
    for (uint64_t done = 0; done < rows;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(Cfg().repo_batch, rows - done));
      const double g0 = bench::ProcessCpuSeconds();
      stream.Fill(n, &batch, &body_bytes);
      ids.clear();
      cids.clear();
      sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
      for (const Event& ev : batch) {
        const auto& e = std::get<RecordEvent>(ev);
        auto d = dids.emplace(e.did, static_cast<int64_t>(dids.size()) + 1);
        if (d.second) {
          sqlite3_bind_int64(did_insert, 1, d.first->second);
          sqlite3_bind_text(did_insert, 2, e.did.data(), static_cast<int>(e.did.size()),
                            SQLITE_STATIC);
          sqlite3_step(did_insert);
          sqlite3_reset(did_insert);
        }
        auto c = collections.emplace(e.collection, static_cast<int64_t>(collections.size()) + 1);
        if (c.second) {
          sqlite3_bind_int64(coll_insert, 1, c.first->second);
          sqlite3_bind_text(coll_insert, 2, e.collection.data(),
                            static_cast<int>(e.collection.size()), SQLITE_STATIC);
          sqlite3_step(coll_insert);
          sqlite3_reset(coll_insert);
        }
        ids.emplace_back(d.first->second, c.first->second);
        cids.push_back(e.cid.ToString());
      }
      sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
      untimed_cpu += bench::ProcessCpuSeconds() - g0;
      const auto t0 = std::chrono::steady_clock::now();
      sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
      size_t i = 0;
      for (; per_insert > 1 && i + per_insert <= n; i += per_insert) {
        for (size_t k = 0; k < per_insert; ++k) bind(multi, static_cast<int>(k) * 8, i + k);
        if (sqlite3_step(multi) != SQLITE_DONE) {
          state.SkipWithError(sqlite3_errmsg(db));
          break;
        }
        sqlite3_reset(multi);
      }
      for (; i < n; ++i) {
        bind(s, 0, i);
        if (sqlite3_step(s) != SQLITE_DONE) {
          state.SkipWithError(sqlite3_errmsg(db));
          break;
        }
        sqlite3_reset(s);
      }
      sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      done += n;
    }
    sqlite3_finalize(s);
    sqlite3_finalize(multi);
    sqlite3_finalize(did_insert);
    sqlite3_finalize(coll_insert);
    sqlite3_close(db);
    const auto t0 = std::chrono::steady_clock::now();
    sink->reset();
    const double close_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    seconds += close_s;
    const double cpu = bench::ProcessCpuSeconds() - cpu0 - untimed_cpu;
    state.SetIterationTime(seconds);
    state.counters["close_s"] = close_s;
    state.counters["cpu_us_per_event"] = cpu * 1e6 / static_cast<double>(rows);
    const double rate = static_cast<double>(rows) / seconds;
    if (RepoRate() > 0) state.counters["sink_over_raw"] = RepoRate() / rate;
    for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(path.string() + suffix);
  }
  state.SetItemsProcessed(static_cast<int64_t>(rows * state.iterations()));
  state.SetLabel(bulk ? "repo order, bare loop, bulk layout" : "repo order, bare loop");
}

// The growing table, shared by the windows.
struct Growing {
  fs::path path;
  std::unique_ptr<pipeline::Sink> sink;
  std::unique_ptr<Stream> stream;
  uint64_t rows = 0;
  double seconds = 0;  // Write time of every window so far
  bool stopped = false;
};

Growing& Table() {
  static Growing g;
  return g;
}

void BM_Interleaved(benchmark::State& state) {
  Growing& g = Table();
  if (g.stopped) return state.SkipWithError("stopped (ATFILL_SCALE_MAX_SECONDS or an error)");
  if (g.sink == nullptr) {
    g.path = Dir() / "interleaved.db";
    auto sink = NewDatabase(g.path);
    if (!sink.ok()) {
      g.stopped = true;
      return state.SkipWithError(sink.status().ToString().c_str());
    }
    g.sink = std::move(*sink);
    g.stream = std::make_unique<Stream>(Cfg().accounts, /*repo_order=*/false, 11);
  }
  const uint64_t rows = std::min(Cfg().window, Cfg().rows - g.rows);
  for (auto _ : state) {
    bench::ResetPeakRss();
    Span span;
    const bench::IoBytes io0 = bench::ProcessIo("/proc/self");
    Status st = WriteRows(g.sink.get(), g.stream.get(), rows, &span);
    const bench::IoBytes io1 = bench::ProcessIo("/proc/self");
    if (!st.ok()) {
      g.stopped = true;
      return state.SkipWithError(st.ToString().c_str());
    }
    g.rows += rows;
    g.seconds += span.seconds;
    state.SetIterationTime(span.seconds);
    const double rate = static_cast<double>(rows) / span.seconds;
    state.counters["read_bytes_per_event"] = (io1.read - io0.read) / static_cast<double>(rows);
    state.counters["written_bytes_per_event"] =
        (io1.written - io0.written) / static_cast<double>(rows);
    const double db = static_cast<double>(FileSize(g.path));
    const double wal = static_cast<double>(FileSize(g.path.string() + "-wal"));
    state.counters["rows_total"] = static_cast<double>(g.rows);
    state.counters["cpu_s"] = span.cpu;
    state.counters["cpu_us_per_event"] = span.cpu * 1e6 / static_cast<double>(rows);
    state.counters["peak_rss_mb"] = static_cast<double>(bench::StatusKb("VmHWM")) / 1024.0;
    state.counters["disk_bytes_per_record"] = (db + wal) / static_cast<double>(g.rows);
    state.counters["db_bytes_per_record"] = db / static_cast<double>(g.rows);
    state.counters["avg_body_bytes"] =
        static_cast<double>(span.body_bytes) / static_cast<double>(rows);
    if (RepoRate() > 0) state.counters["vs_repo"] = rate / RepoRate();
  }
  state.SetItemsProcessed(static_cast<int64_t>(rows * state.iterations()));
  if (Cfg().max_seconds > 0 && g.seconds >= Cfg().max_seconds) g.stopped = true;
}

// The queries users run, as raw SQL users write them against the view; ?1 is bound to a value
// that exists in the table.
struct Query {
  const char* name;
  const char* sql;
};
constexpr std::array<Query, 4> kQueries = {{
    {"collection_newest",
     "SELECT uri, cid, created_at, record FROM atfill_records WHERE collection = "
     "'app.bsky.feed.post' ORDER BY created_at DESC LIMIT 20"},
    {"did", "SELECT uri, cid, record FROM atfill_records WHERE did = ?1 LIMIT 20"},
    {"did_collection",
     "SELECT uri, cid, record FROM atfill_records WHERE did = ?1 AND collection = "
     "'app.bsky.feed.like' LIMIT 20"},
    {"uri",
     "SELECT uri, cid, record FROM atfill_records WHERE did = ?1 AND collection = "
     "'app.bsky.feed.like' AND rkey = ?2"},
}};

void BM_Query(benchmark::State& state) {
  const Query& q = kQueries[static_cast<size_t>(state.range(0))];
  Growing& g = Table();
  g.sink.reset();  // the writes are over; the queries read what was committed
  if (g.path.empty()) return state.SkipWithError("no table was written");
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(g.path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    return state.SkipWithError("open failed");
  }
  // The view's record column calls atfill_json once the table holds compressed rows.
  if (sinks::RegisterSqliteFunctions(db) != SQLITE_OK) {
    sqlite3_close(db);
    return state.SkipWithError("registering atfill_json failed");
  }
  sqlite3_exec(db, "PRAGMA cache_size = -65536", nullptr, nullptr, nullptr);
  // A DID and a like key of it that exist: the last like written.
  std::string did, rkey;
  {
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(db,
                       "SELECT d.did, r.rkey FROM atfill_record_rows r JOIN atfill_dids d ON "
                       "d.id = r.did_id WHERE r.id = (SELECT max(r.id) FROM atfill_record_rows "
                       "r JOIN atfill_collections c ON c.id = r.collection_id WHERE c.nsid = "
                       "'app.bsky.feed.like')",
                       -1, &s, nullptr);
    if (sqlite3_step(s) == SQLITE_ROW) {
      did = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
      rkey = reinterpret_cast<const char*>(sqlite3_column_text(s, 1));
    }
    sqlite3_finalize(s);
  }
  sqlite3_stmt* s = nullptr;
  if (sqlite3_prepare_v2(db, q.sql, -1, &s, nullptr) != SQLITE_OK) {
    state.SkipWithError(sqlite3_errmsg(db));
    sqlite3_close(db);
    return;
  }
  sqlite3_bind_text(s, 1, did.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 2, rkey.c_str(), -1, SQLITE_TRANSIENT);
  int64_t returned = 0;
  for (auto _ : state) {
    while (sqlite3_step(s) == SQLITE_ROW) ++returned;
    sqlite3_reset(s);
  }
  state.counters["rows_returned"] =
      static_cast<double>(returned) / static_cast<double>(state.iterations());
  state.counters["table_rows"] = static_cast<double>(g.rows);
  state.SetLabel(q.name);
  sqlite3_finalize(s);
  sqlite3_close(db);
}

}  // namespace
}  // namespace atfill::scale

int main(int argc, char** argv) {
  using atfill::scale::Cfg;
  benchmark::RegisterBenchmark("BM_RepoOrder", atfill::scale::BM_RepoOrder)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("BM_RepoRaw", atfill::scale::BM_RepoRaw)
      ->ArgName("bulk")
      ->Arg(0)
      ->Arg(1)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kSecond);
  // One benchmark per window of the growing table, then one per query on the final table.
  const uint64_t windows = (Cfg().rows + Cfg().window - 1) / Cfg().window;
  auto register_table = [windows](const std::string& name, auto write, const auto& queries,
                                  const std::string& query_name, auto query) {
    for (uint64_t w = 1; w <= windows; ++w) {
      benchmark::RegisterBenchmark((name + "/window:" + std::to_string(w)).c_str(), write)
          ->Iterations(1)
          ->UseManualTime()
          ->Unit(benchmark::kSecond);
    }
    for (size_t q = 0; q < queries.size(); ++q) {
      benchmark::RegisterBenchmark((query_name + "/" + queries[q].name).c_str(), query)
          ->Arg(static_cast<int64_t>(q))
          ->Unit(benchmark::kMicrosecond);
    }
  };
  register_table("BM_Interleaved", atfill::scale::BM_Interleaved, atfill::scale::kQueries,
                 "BM_Query", atfill::scale::BM_Query);
  if (atfill::scale::PgConninfo() != nullptr) {
    register_table("BM_PgInterleaved", atfill::scale::BM_PgInterleaved, atfill::scale::kPgQueries,
                   "BM_PgQuery", atfill::scale::BM_PgQuery);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
