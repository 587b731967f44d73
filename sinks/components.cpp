#include "sinks/components.hpp"

#include <regex>

#include "sinks/dry_run_sink.hpp"
#include "sinks/label_sinks.hpp"
#include "sinks/postgres_reader.hpp"
#include "sinks/purge.hpp"
#include "sinks/sqlite_reader.hpp"

namespace atfill::sinks {
namespace {

// A backend's repo reader as pipeline::SinkReaders::repo_records.
std::function<Result<std::vector<pipeline::StoredRecord>>(const std::string& did)> StoredRecords(
    std::function<Result<std::vector<RepoRecordKey>>(const std::string& did)> repo) {
  return [repo = std::move(repo)](
             const std::string& did) -> Result<std::vector<pipeline::StoredRecord>> {
    ATFILL_ASSIGN_OR_RETURN(auto rows, repo(did));
    std::vector<pipeline::StoredRecord> out;
    out.reserve(rows.size());
    for (auto& r : rows) {
      out.push_back(
          {std::move(r.collection), std::move(r.rkey), std::move(r.cid), std::move(r.rev)});
    }
    return out;
  };
}

Status ReadSinkConfig(pipeline::ConfigFile& file, pipeline::Settings& settings) {
  SinkSettings& c = settings.Mutable<SinkSettings>();
  c.sqlite.path = "atfill.db";
  ATFILL_RETURN_IF_ERROR(file.ReadEnum("sink.kind", &c.kind, {"sqlite", "postgres"}));
  PostgresSinkOptions& pg = c.postgres;
  ATFILL_RETURN_IF_ERROR(file.ReadString("sink.postgres.conninfo", &pg.conninfo));
  ATFILL_RETURN_IF_ERROR(file.ReadString("sink.postgres.schema", &pg.schema));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("sink.postgres.connect_timeout_ms", &pg.connect_timeout_ms, 1, 3'600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("sink.postgres.lock_timeout_ms", &pg.lock_timeout_ms, 1, 3'600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("sink.postgres.conflict_retries", &pg.conflict_retries, 0, 1000));
  SqliteSinkOptions& sq = c.sqlite;
  ATFILL_RETURN_IF_ERROR(file.ReadPath("sink.sqlite.path", &sq.path));
  std::string sync = "normal";
  ATFILL_RETURN_IF_ERROR(file.ReadEnum("sink.sqlite.synchronous", &sync, {"normal", "full"}));
  sq.synchronous = sync == "full" ? SqliteSynchronous::kFull : SqliteSynchronous::kNormal;
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("sink.sqlite.busy_timeout_ms", &sq.busy_timeout_ms, 0, 3'600'000));
  int64_t cache_mb = sq.cache_bytes >> 20;
  ATFILL_RETURN_IF_ERROR(file.ReadInt("sink.sqlite.cache_mb", &cache_mb, 1, 65536));
  sq.cache_bytes = cache_mb << 20;
  int64_t wal_mb = sq.wal_autocheckpoint_bytes >> 20;
  ATFILL_RETURN_IF_ERROR(file.ReadInt("sink.sqlite.wal_autocheckpoint_mb", &wal_mb, 1, 65536));
  sq.wal_autocheckpoint_bytes = wal_mb << 20;
  ATFILL_RETURN_IF_ERROR(
      file.ReadBool("sink.sqlite.background_checkpoint", &sq.background_checkpoint));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("sink.sqlite.compress", &sq.compress));
  const std::string& path = file.source_name();
  if (Status s = sq.Validate(); !s.ok()) return s.WithContext(path + ": [sink.sqlite]");
  if (Status s = pg.Validate(); !s.ok()) return s.WithContext(path + ": [sink.postgres]");
  return Status::OK();
}

PostgresReaderOptions ReaderOptions(const PostgresSinkOptions& pg) {
  PostgresReaderOptions o;
  o.conninfo = pg.conninfo;
  o.schema = pg.schema;
  o.connect_timeout_ms = pg.connect_timeout_ms;
  return o;
}

pipeline::Components::SinkKind Sqlite() {
  pipeline::Components::SinkKind k;
  k.open = [](const pipeline::Settings& settings,
              const pipeline::SinkHints& hints) -> Result<std::unique_ptr<pipeline::Sink>> {
    if (hints.dry_run) return NewDryRunSink();
    SqliteSinkOptions options = settings.Get<SinkSettings>().sqlite;
    options.bulk_load = hints.bulk_load;
    options.log = hints.log;
    if (hints.wal_autocheckpoint_bytes) {
      options.wal_autocheckpoint_bytes = *hints.wal_autocheckpoint_bytes;
    }
    return OpenSqliteSink(options);
  };
  k.location = [](const pipeline::Settings& settings) {
    return "sqlite:" + settings.Get<SinkSettings>().sqlite.path;
  };
  k.open_labels = [](const pipeline::Settings& settings) {
    return OpenSqliteLabelSink(settings.Get<SinkSettings>().sqlite);
  };
  k.readers = [](const pipeline::Settings& settings) {
    const std::string& path = settings.Get<SinkSettings>().sqlite.path;
    return pipeline::SinkReaders{
        SqliteHoldsRecords(path), SqliteRecordReader(path),
        [path](const std::string& collection) { return SqlitePurgeCollection(path, collection); },
        SqliteDidsReader(path), StoredRecords(SqliteRepoRecordsReader(path))};
  };
  return k;
}

pipeline::Components::SinkKind Postgres() {
  pipeline::Components::SinkKind k;
  k.open = [](const pipeline::Settings& settings,
              const pipeline::SinkHints& hints) -> Result<std::unique_ptr<pipeline::Sink>> {
    if (hints.dry_run) return NewDryRunSink();
    PostgresSinkOptions options = settings.Get<SinkSettings>().postgres;
    options.log = hints.log;
    return OpenPostgresSink(options);
  };
  k.open_labels = [](const pipeline::Settings& settings) {
    return OpenPostgresLabelSink(settings.Get<SinkSettings>().postgres);
  };
  k.location = [](const pipeline::Settings& settings) {
    const PostgresSinkOptions& pg = settings.Get<SinkSettings>().postgres;
    // Never a password in job parameters or messages: key=value form and URI form.
    std::string where = std::regex_replace(
        pg.conninfo, std::regex(R"(password\s*=\s*('([^'\\]|\\.)*'|\S*))"), "password=***");
    where =
        std::regex_replace(where, std::regex(R"(^(postgres(ql)?://[^:@/]*):[^@/]*@)"), "$1:***@");
    return "postgres:" + where + (pg.schema == "public" ? "" : " schema=" + pg.schema);
  };
  k.readers = [](const pipeline::Settings& settings) {
    const PostgresReaderOptions o = ReaderOptions(settings.Get<SinkSettings>().postgres);
    return pipeline::SinkReaders{
        PostgresHoldsRecords(o), PostgresRecordReader(o),
        [o](const std::string& collection) { return PostgresPurgeCollection(o, collection); },
        PostgresDidsReader(o), StoredRecords(PostgresRepoRecordsReader(o))};
  };
  return k;
}

}  // namespace

void Register(pipeline::Components& components) {
  components.AddConfigReader(ReadSinkConfig);
  components.AddSinkKind("sqlite", Sqlite());
  components.AddSinkKind("postgres", Postgres());
  components.SetSinkChooser(
      [](const pipeline::Settings& settings) { return settings.Get<SinkSettings>().kind; });
}

}  // namespace atfill::sinks
