// scale_bench's PostgreSQL benchmarks: the same stream into the PostgreSQL sink, window by
// window, and the users' queries through its view (ATFILL_SCALE_PG; see scale_bench.cpp).
#include <libpq-fe.h>

#include "bench/scale_bench.hpp"
#include "sinks/postgres_sink.hpp"

namespace atfill::scale {

const char* PgConninfo() {
  const char* c = std::getenv("ATFILL_SCALE_PG");
  return c != nullptr && *c != '\0' ? c : nullptr;
}

std::string PgSchema() {
  const char* s = std::getenv("ATFILL_SCALE_PG_SCHEMA");
  return s != nullptr && *s != '\0' ? s : "atfill_scale_bench";
}

struct PgConnCloser {
  void operator()(PGconn* c) const { PQfinish(c); }
};
using PgConn = std::unique_ptr<PGconn, PgConnCloser>;

PgConn PgConnect() {
  PgConn c(PQconnectdb(PgConninfo()));
  if (PQstatus(c.get()) != CONNECTION_OK) return nullptr;
  PQsetNoticeProcessor(
      c.get(), [](void*, const char*) {}, nullptr);
  return c;
}

// Runs statements that return no rows; the server's message on failure.
Status PgExec(PGconn* c, const std::string& sql) {
  PGresult* r = PQexec(c, sql.c_str());
  const ExecStatusType st = PQresultStatus(r);
  std::string message = PQresultErrorMessage(r);
  PQclear(r);
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) return Status::IoError(message);
  return Status::OK();
}

// The first cell of a query, "" on failure or no rows.
std::string PgValue(PGconn* c, const std::string& sql) {
  PGresult* r = PQexec(c, sql.c_str());
  std::string out;
  if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0) out = PQgetvalue(r, 0, 0);
  PQclear(r);
  return out;
}

// What the server's processes used: CPU seconds (the postmaster, its live children, and the
// children it has reaped) and, per live process, the bytes it read and wrote through the storage
// layer, when the server runs on this machine and its data directory is readable; cpu is -1
// otherwise. Backends that exit between two samples are counted in CPU once the postmaster reaps
// them; their I/O is not (the sink's and this benchmark's connections, the checkpointer and the
// background writer live throughout, autovacuum's workers do not).
struct ServerUsage {
  double cpu = -1;
  std::map<long, bench::IoBytes> io;  // by pid
};

// The I/O of `after`'s processes since `before`: a process sampled in both counts its growth, one
// started since counts whole; one that exited in between counts nothing (its counters are gone),
// rather than taking its earlier total off the others'.
bench::IoBytes IoSince(const ServerUsage& before, const ServerUsage& after) {
  bench::IoBytes d;
  for (const auto& [pid, io] : after.io) {
    const auto it = before.io.find(pid);
    const bench::IoBytes base = it == before.io.end() ? bench::IoBytes{} : it->second;
    d.read += io.read - base.read;
    d.written += io.written - base.written;
  }
  return d;
}
ServerUsage PgServerUsage(PGconn* c) {
  static const std::string data_dir = PgValue(c, "SHOW data_directory");
  ServerUsage usage;
  if (data_dir.empty()) return usage;
  std::ifstream pidfile(data_dir + "/postmaster.pid");
  long postmaster = 0;
  if (!(pidfile >> postmaster) || postmaster <= 0) return usage;
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  // Fields after the command's closing parenthesis: state(3) ppid(4) ... utime(14) stime(15)
  // cutime(16) cstime(17).
  auto read = [&](const fs::path& stat, long* ppid, double* own, double* reaped) {
    std::ifstream in(stat);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');
    if (close == std::string::npos) return false;
    std::istringstream fields(text.substr(close + 2));
    std::string f;
    std::vector<std::string> v;
    while (fields >> f && v.size() < 15) v.push_back(f);
    if (v.size() < 15) return false;
    *ppid = std::atol(v[1].c_str());
    *own = (std::atof(v[11].c_str()) + std::atof(v[12].c_str())) / tick;
    *reaped = (std::atof(v[13].c_str()) + std::atof(v[14].c_str())) / tick;
    return true;
  };
  const fs::path postmaster_dir = fs::path("/proc") / std::to_string(postmaster);
  long ppid = 0;
  double own = 0, reaped = 0;
  if (!read(postmaster_dir / "stat", &ppid, &own, &reaped)) return usage;
  double total = own + reaped;
  usage.io[postmaster] = bench::ProcessIo(postmaster_dir);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    long parent = 0;
    double child_own = 0, child_reaped = 0;
    if (read(entry.path() / "stat", &parent, &child_own, &child_reaped) && parent == postmaster) {
      total += child_own + child_reaped;
      usage.io[std::atol(name.c_str())] = bench::ProcessIo(entry.path());
    }
  }
  usage.cpu = total;
  return usage;
}

struct PgGrowing {
  std::unique_ptr<pipeline::Sink> sink;
  std::unique_ptr<Stream> stream;
  PgConn admin;  // the benchmark's own connection: sizes, server CPU, queries
  uint64_t rows = 0;
  uint64_t first = 0;  // the rows the table held at the start (ATFILL_SCALE_PG_KEEP)
  double seconds = 0;
  bool stopped = false;
};

PgGrowing& PgTable() {
  static PgGrowing g;
  return g;
}

Status PgStart(PgGrowing* g) {
  g->admin = PgConnect();
  if (g->admin == nullptr) return Status::Unavailable("cannot connect to ATFILL_SCALE_PG");
  const std::string schema = "\"" + PgSchema() + "\"";
  uint64_t first = 0;
  const bool keep = bench::EnvUint("ATFILL_SCALE_PG_KEEP", 0) != 0;
  if (keep) {
    const std::string held =
        PgValue(g->admin.get(), "SELECT count(*) FROM " + schema + ".atfill_record_rows");
    if (held.empty()) {
      return Status::NotFound("ATFILL_SCALE_PG_KEEP: schema " + schema +
                              " holds no record table to keep");
    }
    first = std::strtoull(held.c_str(), nullptr, 10);
  } else {
    ATFILL_RETURN_IF_ERROR(PgExec(
        g->admin.get(), "DROP SCHEMA IF EXISTS " + schema + " CASCADE; CREATE SCHEMA " + schema));
  }
  if (const char* setup = std::getenv("ATFILL_SCALE_PG_SETUP_SQL");
      !keep && setup != nullptr && *setup) {
    std::ifstream in(setup);
    std::stringstream sql;
    sql << in.rdbuf();
    ATFILL_RETURN_IF_ERROR(PgExec(
        g->admin.get(), "SET search_path = " + schema + "; " + sql.str() + "; RESET search_path"));
  }
  sinks::PostgresSinkOptions options;
  options.conninfo = PgConninfo();
  options.schema = PgSchema();
  ATFILL_ASSIGN_OR_RETURN(g->sink, sinks::OpenPostgresSink(options));
  g->stream = std::make_unique<Stream>(Cfg().accounts, /*repo_order=*/false, 11, first);
  g->rows = first;
  g->first = first;
  return Status::OK();
}

// Bytes of the record table, its indexes and TOAST, its partitions' included.
double PgRecordBytes(PGconn* c) {
  const std::string table = "\"" + PgSchema() + "\".atfill_record_rows";
  const std::string v = PgValue(c,
                                "SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) FROM "
                                "pg_partition_tree('" +
                                    table + "')), pg_total_relation_size('" + table + "'))");
  return v.empty() ? 0 : std::atof(v.c_str());
}

void BM_PgInterleaved(benchmark::State& state) {
  PgGrowing& g = PgTable();
  if (g.stopped) return state.SkipWithError("stopped (ATFILL_SCALE_MAX_SECONDS or an error)");
  if (g.sink == nullptr) {
    if (Status st = PgStart(&g); !st.ok()) {
      g.stopped = true;
      return state.SkipWithError(st.ToString().c_str());
    }
  }
  const uint64_t rows = std::min(Cfg().window, Cfg().rows - (g.rows - g.first));
  for (auto _ : state) {
    bench::ResetPeakRss();
    Span span;
    const ServerUsage server0 = PgServerUsage(g.admin.get());
    Status st = WriteRows(g.sink.get(), g.stream.get(), rows, &span);
    const ServerUsage server1 = PgServerUsage(g.admin.get());
    if (!st.ok()) {
      g.stopped = true;
      return state.SkipWithError(st.ToString().c_str());
    }
    g.rows += rows;
    g.seconds += span.seconds;
    state.SetIterationTime(span.seconds);
    const double n = static_cast<double>(rows);
    state.counters["rows_total"] = static_cast<double>(g.rows);
    state.counters["cpu_s"] = span.cpu;
    double cpu = span.cpu;
    if (server0.cpu >= 0 && server1.cpu >= 0) {
      state.counters["server_cpu_s"] = server1.cpu - server0.cpu;
      cpu += server1.cpu - server0.cpu;
      const bench::IoBytes io = IoSince(server0, server1);
      state.counters["server_read_bytes_per_event"] = io.read / n;
      state.counters["server_written_bytes_per_event"] = io.written / n;
    }
    state.counters["cpu_us_per_event"] = cpu * 1e6 / n;
    state.counters["peak_rss_mb"] = static_cast<double>(bench::StatusKb("VmHWM")) / 1024.0;
    state.counters["db_bytes_per_record"] =
        PgRecordBytes(g.admin.get()) / static_cast<double>(g.rows);
    state.counters["avg_body_bytes"] = static_cast<double>(span.body_bytes) / n;
  }
  state.SetItemsProcessed(static_cast<int64_t>(rows * state.iterations()));
  if (Cfg().max_seconds > 0 && g.seconds >= Cfg().max_seconds) g.stopped = true;
}

void BM_PgQuery(benchmark::State& state) {
  const PgQuery& q = kPgQueries[static_cast<size_t>(state.range(0))];
  PgGrowing& g = PgTable();
  g.sink.reset();  // the writes are over; the queries read what was committed
  if (g.admin == nullptr) return state.SkipWithError("no table was written");
  PgConn c = PgConnect();
  if (c == nullptr) return state.SkipWithError("cannot connect");
  const std::string schema = "\"" + PgSchema() + "\"";
  // Statistics as autovacuum would have them by now, and the session as the reader's.
  (void)PgExec(c.get(), "ANALYZE " + schema + ".atfill_record_rows; ANALYZE " + schema +
                            ".atfill_dids; ANALYZE " + schema + ".atfill_collections");
  (void)PgExec(c.get(), "SET search_path = " + schema + "; SET jit = off");
  // A DID and a like key of it that exist: the newest like.
  std::string did, rkey;
  {
    PGresult* r = PQexec(c.get(),
                         "SELECT did, rkey FROM atfill_records WHERE collection = "
                         "'app.bsky.feed.like' ORDER BY created_at DESC LIMIT 1");
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
      did = PQgetvalue(r, 0, 0);
      rkey = PQgetvalue(r, 0, 1);
    }
    PQclear(r);
  }
  if (did.empty()) return state.SkipWithError("no like in the table");
  // A collection newest first reads posts (15% of the rows); the others a like of the DID.
  const std::string collection =
      q.binds == std::string("c") ? "app.bsky.feed.post" : "app.bsky.feed.like";
  std::vector<const char*> bound;
  for (const char* b = q.binds; *b != '\0'; ++b) {
    bound.push_back(*b == 'd' ? did.c_str() : *b == 'c' ? collection.c_str() : rkey.c_str());
  }
  const int n_params = static_cast<int>(bound.size());
  PGresult* prepared = PQprepare(c.get(), "q", q.sql, 0, nullptr);
  const bool ok = PQresultStatus(prepared) == PGRES_COMMAND_OK;
  const std::string error = PQresultErrorMessage(prepared);
  PQclear(prepared);
  if (!ok) return state.SkipWithError(error.c_str());
  int64_t returned = 0;
  for (auto _ : state) {
    PGresult* r = PQexecPrepared(c.get(), "q", n_params, bound.data(), nullptr, nullptr, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
      state.SkipWithError(PQresultErrorMessage(r));
      PQclear(r);
      break;
    }
    returned += PQntuples(r);
    PQclear(r);
  }
  state.counters["rows_returned"] =
      static_cast<double>(returned) / static_cast<double>(std::max<int64_t>(1, state.iterations()));
  state.counters["table_rows"] = static_cast<double>(g.rows);
  state.SetLabel(q.name);
}

}  // namespace atfill::scale
