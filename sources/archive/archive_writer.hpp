// Keeps a Jetstream v2 archive of one's own: events appended as `.jss` rows to sealed segments in
// a directory (SPEC §4), which LocalArchive (and any Jetstream-compatible reader) reads back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/status.hpp"
#include "sources/archive/jss.hpp"
#include "sources/jetstream/jetstream_frames.hpp"

namespace atfill::sources {

struct ArchiveWriterOptions {
  uint32_t rows_per_block = 4096;
  // A segment is sealed once its blocks reach this many bytes (compressed), as Jetstream rotates
  // at about 256 MiB.
  uint64_t segment_bytes = uint64_t{256} << 20;
  int zstd_level = 3;
  Status Validate() const;
};

// Appends after the directory's newest segment (new index, seq after its max_seq). Not
// thread-safe.
class ArchiveWriter {
 public:
  static Result<std::unique_ptr<ArchiveWriter>> Open(const std::string& dir,
                                                     ArchiveWriterOptions options = {});
  ~ArchiveWriter();

  // Appends one event: a commit as a Create/Update/Delete row (the record's JSON stored as its
  // DAG-CBOR), an account as an #account marker, an identity as an #identity marker, a #sync as a
  // Sync row. `witnessed_at` is the event's time (unix µs). Other frames (info, errors) are
  // ignored. Returns the seq given to the row, or 0 when nothing was written.
  Result<uint64_t> Append(const JetstreamFrame::Payload& event, int64_t witnessed_at);
  // The same with the row's seq given (a host's own numbering, kept by an archive of its live
  // stream): it must be past every seq written; 0 takes the next one as above.
  Result<uint64_t> Append(const JetstreamFrame::Payload& event, int64_t witnessed_at, uint64_t seq);
  // Seals the open segment (if it has rows).
  Status Finish();

  uint64_t next_seq() const { return next_seq_; }
  uint64_t segments_written() const { return segments_written_; }
  uint64_t rows_written() const { return rows_written_; }

 private:
  ArchiveWriter(std::string dir, ArchiveWriterOptions options)
      : dir_(std::move(dir)), options_(options) {}
  Status AppendRow(const jss::Row& row);

  std::string dir_;
  ArchiveWriterOptions options_;
  uint64_t next_index_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t segments_written_ = 0;
  uint64_t rows_written_ = 0;
  std::optional<jss::SegmentWriter> open_;
};

}  // namespace atfill::sources
