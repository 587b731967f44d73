// Internal to sinks/: the PostgreSQL schema and its versioned migrations.
//
// Version 1 (every name in the configured schema, "public" by default):
//   atfill_schema_version(version)           one row: the schema version of these tables
//   atfill_dids(id, did)                     interned DIDs (bigint identity)
//   atfill_collections(id, nsid)             interned collection NSIDs (integer identity)
//   atfill_record_rows(did_id, collection_id, rkey, cid, rev, indexed_at, created_at, record)
//       primary key (did_id, collection_id, rkey); rev and created_at NULL when unknown;
//       indexed_at in unix microseconds; record is the JSON text exactly as received (text, not
//       jsonb, so the bytes stay exact)
//   atfill_records                           the view raw SQL reads (see postgres_sink.hpp)
// Version 2: the index atfill_record_rows_by_created on (collection_id, created_at).
// Version 3: atfill_record_rows.collection (the NSID) and its (collection, created_at) index.
// Version 4: atfill_label_rows(uri, src, val, cid, cts, cts_us, exp, exp_us, indexed_at), primary
//   key (uri, src, val), and the view atfill_labels(src, uri, cid, val, neg, cts, exp) of the
//   labels not expired.
// Version 5: the record table keyed by (collection_id, rkey, did_id), did_epoch and
//   atfill_record_epochs (see postgres_schema.cpp).
// Version 6: atfill_label_rows.neg: a negation is a row (with its cts) the view leaves out.
// Text that is compared or sorted (did, nsid, rkey, rev) uses the "C" collation: byte order, as
// SQLite compares, whatever the database's locale.
#pragma once

#include <libpq-fe.h>

#include <functional>
#include <string>
#include <string_view>

#include "base/status.hpp"

namespace atfill::sinks::pg {

// The schema's name quoted for SQL text ("public" -> "\"public\"").
std::string QualifiedName(const std::string& schema, const char* table);

// The version of the atfill tables in `schema`: 0 when there are none yet. A version row missing
// or duplicated is Corrupt.
Result<int> ReadSchemaVersion(PGconn* conn, const std::string& schema);

// Brings the tables in `schema` to kPostgresSchemaVersion (creating the schema itself when it does
// not exist), applying each migration N -> N+1 in order in one transaction that holds an advisory
// lock, so that several processes opening one database at once serialise here and exactly one
// creates the tables. Tables written by a newer atfill are Unsupported and left untouched.
// Another process's migration is waited for however long it takes (a large table's upgrade takes
// minutes or hours). `log`, when set, is told in one line each: that wait, an upgrade of tables
// that already existed before it runs (not their creation), and its end with its time.
Status MigrateSchema(PGconn* conn, const std::string& schema,
                     const std::function<void(std::string_view line)>& log = {});

// Fails unless the tables are exactly at kPostgresSchemaVersion (readers never migrate).
Status CheckSchemaCurrent(PGconn* conn, const std::string& schema);

}  // namespace atfill::sinks::pg
