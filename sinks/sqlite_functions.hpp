// The SQL functions of an atfill SQLite database, registered on every connection atfill opens
// (the sink's, the readers', the checkpointer's) and, for the sqlite3 shell and other SQLite
// programs, by the loadable extension built beside the sinks (build/sinks/libatfill_sqlite_ext;
// `.load` it, see docs/queries.md):
//
//   atfill_json(record)  the exact JSON text of a value of atfill_record_rows.record: the value
//                        itself when it is text (a row stored uncompressed), else the body of the
//                        zstd frame it holds, decompressed with the dictionary of atfill_dicts the
//                        frame names. A blob that is not such a frame, or names a dictionary the
//                        database does not hold, is an SQL error naming the reason.
//   atfill_cid(cid)      the text form ("bafyrei...") of a value of atfill_record_rows.cid: the
//                        value itself when it is text, else that of the binary CID it holds
//                        (atproto::Cid's; any other blob is an SQL error naming the reason).
//
// The atfill_records view calls both once the database holds a compressed row (see
// sqlite_schema.hpp), so a connection without them cannot read the view of such a database.
#pragma once

#include <sqlite3.h>

namespace atfill::sinks {

// Registers the functions above on `db`; SQLITE_OK or the code of the failure. Each connection
// gets its own decoder state (decompression context, the dictionaries it has loaded), freed with
// the connection; a connection is used by one thread at a time, as SQLite requires of NOMUTEX
// connections.
int RegisterSqliteFunctions(sqlite3* db);

}  // namespace atfill::sinks
