// The sinks' part of the component registry (pipeline/components.hpp): [sink] kind, [sink.sqlite]
// and [sink.postgres] into SinkSettings, and the sink kinds "sqlite" and "postgres" with their
// locations and readers (a dry run's hint gives the dry-run sink).
#pragma once

#include <string>

#include "pipeline/components.hpp"
#include "sinks/postgres_sink.hpp"
#include "sinks/sqlite_sink.hpp"

namespace atfill::sinks {

struct SinkSettings {
  std::string kind = "sqlite";   // [sink] kind: "sqlite" or "postgres"
  SqliteSinkOptions sqlite;      // [sink.sqlite] (path defaults to "atfill.db" beside the config)
  PostgresSinkOptions postgres;  // [sink.postgres]
};

void Register(pipeline::Components& components);

}  // namespace atfill::sinks
