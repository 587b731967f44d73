// Filling a Jetstream v2 archive (sources/archive/archive_writer.hpp) from event files or from a
// live stream: what `atfill archive write` does, for any program.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "base/status.hpp"
#include "sources/archive/archive_writer.hpp"
#include "sources/files/event_file.hpp"
#include "sources/jetstream/jetstream.hpp"

namespace atfill::sources {

struct ArchiveFillReport {
  uint64_t rows = 0;       // rows appended
  uint64_t skipped = 0;    // events or lines that could not be archived (each told to `note`)
  uint64_t first_seq = 0;  // of the rows appended (0: none)
  uint64_t last_seq = 0;
};

// Told of each event skipped, and of a gap in a live stream, as a sentence; may be empty.
using ArchiveNote = std::function<void(std::string_view sentence)>;

// Appends the events of Jetstream v1 JSON-lines files (`files.paths`, plain or zstd) to `writer`
// after its newest row, then seals the open segment. A line that is not an event is skipped and
// told to `note` ("line 7 skipped (bad_json): ..."); a file that cannot be read is the error.
Result<ArchiveFillReport> ArchiveEventFiles(const EventFileOptions& files, ArchiveWriter& writer,
                                            const ArchiveNote& note);

// Appends the stream of `live`'s host to `writer`, each row under the host's own seq, until the
// stream ends (idle_exit_ms) or `stop` answers true, then seals the open segment. The archive is
// its own cursor: a run continues after its newest seq (the open segment of a killed run is
// written again). A connection that fails for good is the error; what was appended is sealed and
// counted in `report` either way.
Status ArchiveStream(JetstreamOptions live, ArchiveWriter& writer,
                     const std::function<bool()>& stop, const ArchiveNote& note,
                     ArchiveFillReport* report);

}  // namespace atfill::sources
