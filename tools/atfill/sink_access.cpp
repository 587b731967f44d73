#include "tools/atfill/sink_access.hpp"

#include <mutex>
#include <regex>

#include "sinks/postgres_reader.hpp"
#include "sinks/postgres_sink.hpp"
#include "sinks/sqlite_reader.hpp"
#include "sinks/sqlite_sink.hpp"

namespace atfill::cli {

namespace {

bool IsPostgres(const AppConfig& config) { return config.sink == "postgres"; }

sinks::PostgresReaderOptions ReaderOptions(const AppConfig& config) {
  sinks::PostgresReaderOptions o;
  o.conninfo = config.postgres.conninfo;
  o.schema = config.postgres.schema;
  o.connect_timeout_ms = config.postgres.connect_timeout_ms;
  return o;
}

}  // namespace

Result<std::unique_ptr<pipeline::Sink>> OpenConfiguredSink(const AppConfig& config) {
  if (IsPostgres(config)) return sinks::OpenPostgresSink(config.postgres);
  return sinks::OpenSqliteSink(config.sqlite);
}

std::string SinkLocation(const AppConfig& config) {
  if (!IsPostgres(config)) return config.sink + ":" + config.sqlite.path;
  // Never a password in job parameters or messages: key=value form and URI form.
  std::string where =
      std::regex_replace(config.postgres.conninfo,
                         std::regex(R"(password\s*=\s*('([^'\\]|\\.)*'|\S*))"), "password=***");
  where = std::regex_replace(where, std::regex(R"(^(postgres(ql)?://[^:@/]*):[^@/]*@)"), "$1:***@");
  return "postgres:" + where +
         (config.postgres.schema == "public" ? "" : " schema=" + config.postgres.schema);
}

std::function<Result<bool>(const std::string& did, const std::string& collection)> SinkHoldsRecords(
    const AppConfig& config) {
  if (IsPostgres(config)) return sinks::PostgresHoldsRecords(ReaderOptions(config));
  return sinks::SqliteHoldsRecords(config.sqlite.path);
}

std::function<Result<std::optional<std::string>>(std::string_view uri)> SinkRecordReader(
    const AppConfig& config) {
  if (IsPostgres(config)) return sinks::PostgresRecordReader(ReaderOptions(config));
  struct Shared {
    std::mutex mu;
    std::string path;
    std::unique_ptr<sinks::SqliteReader> reader;
  };
  auto shared = std::make_shared<Shared>();
  shared->path = config.sqlite.path;
  return [shared](std::string_view uri) -> Result<std::optional<std::string>> {
    std::lock_guard<std::mutex> lock(shared->mu);
    if (shared->reader == nullptr) {
      auto opened = sinks::SqliteReader::Open(shared->path);
      if (!opened.ok()) {
        // A database not created yet holds nothing.
        if (opened.status().code() == StatusCode::kNotFound) return std::optional<std::string>();
        return opened.status();
      }
      shared->reader = std::move(*opened);
    }
    ATFILL_ASSIGN_OR_RETURN(auto row, shared->reader->Get(uri));
    if (!row) return std::optional<std::string>();
    return std::optional<std::string>(std::move(row->record));
  };
}

}  // namespace atfill::cli
