// The label sinks (pipeline/label.hpp) of SQLite and PostgreSQL: labels and negations from
// labelers stored in
//   atfill_label_rows(uri, src, val, cid, cts, cts_us, exp, exp_us, indexed_at, neg)
// primary key (uri, src, val), the newest by cts of each, read through the view
//   atfill_labels(src, uri, cid, val, neg, cts, exp)
// which leaves out negations and the labels whose exp has passed (at the time of the query), so
// `neg` in the view is always false. cts and exp are the labeler's text; cts_us and exp_us the
// same instants in unix microseconds; indexed_at when atfill wrote the row.
//
// SQLite: the tables are created at open by their own idempotent statements (CREATE ... IF NOT
// EXISTS), outside the record tables' versioned schema, in the database of [sink.sqlite] path; a
// table made before neg existed gets the column at open. PostgreSQL: schema versions 4 and 6
// (sinks/postgres_schema.hpp), migrated at open.
#pragma once

#include <memory>

#include "base/status.hpp"
#include "pipeline/label.hpp"
#include "sinks/postgres_sink.hpp"
#include "sinks/sqlite_sink.hpp"

namespace atfill::sinks {

// Opens the database of `options.path` (WAL mode, its busy timeout) and creates the label
// tables when missing. The other options are the record sink's and are not used.
Result<std::unique_ptr<pipeline::LabelSink>> OpenSqliteLabelSink(const SqliteSinkOptions& options);

// Connects within connect_timeout_ms and migrates the schema (versions 4 and 6: the label tables).
// A lost connection fails that batch as Unavailable; the next WriteLabels reconnects.
Result<std::unique_ptr<pipeline::LabelSink>> OpenPostgresLabelSink(
    const PostgresSinkOptions& options);

}  // namespace atfill::sinks
