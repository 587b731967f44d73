#include "sources/archive/archive_fill.hpp"

#include <algorithm>

#include "state/kv_store.hpp"

namespace atfill::sources {

Result<ArchiveFillReport> ArchiveEventFiles(const EventFileOptions& files, ArchiveWriter& writer,
                                            const ArchiveNote& note) {
  ATFILL_ASSIGN_OR_RETURN(auto source, EventFileSource::Open(files));
  ATFILL_RETURN_IF_ERROR(source->Seek(""));
  ArchiveFillReport report;
  const uint64_t first_seq = writer.next_seq();
  pipeline::EventChunk chunk;
  while (true) {
    chunk.raw.clear();
    ATFILL_ASSIGN_OR_RETURN(bool more, source->Read(&chunk));
    if (!more) break;
    std::string_view raw = chunk.raw;
    uint64_t line = chunk.raw_first_position - 1;
    while (!raw.empty()) {
      size_t nl = raw.find('\n');
      if (nl == std::string_view::npos) nl = raw.size();
      const std::string_view text = raw.substr(0, nl);
      raw.remove_prefix(std::min(nl + 1, raw.size()));
      ++line;
      if (text.empty()) continue;
      JetstreamFrame frame;
      std::string kind;
      Status s = DecodeJetstreamV1(text, text.size(), pipeline::Origin::kReplay, &frame, &kind);
      if (s.ok()) s = writer.Append(frame.payload, frame.time_us).status();
      if (!s.ok()) {
        ++report.skipped;
        if (note) {
          note("line " + std::to_string(line) + " skipped (" +
               (kind.empty() ? std::string("bad_event") : kind) + "): " + s.message());
        }
      }
    }
  }
  ATFILL_RETURN_IF_ERROR(writer.Finish());
  report.rows = writer.rows_written();
  if (report.rows > 0) {
    report.first_seq = first_seq;
    report.last_seq = first_seq + report.rows - 1;
  }
  return report;
}

Status ArchiveStream(JetstreamOptions live, ArchiveWriter& writer,
                     const std::function<bool()>& stop, const ArchiveNote& note,
                     ArchiveFillReport* out) {
  const uint64_t after = writer.next_seq() - 1;
  if (after > 0) live.start_seq = 0;  // the archive's newest seq decides
  // The archive is the stream's cursor: the source's own state is not kept.
  auto kv = state::NewMemoryKvStore();
  ATFILL_ASSIGN_OR_RETURN(auto source, JetstreamSource::Create(live, kv.get()));
  ATFILL_RETURN_IF_ERROR(source->Seek(after > 0 ? std::to_string(after) : ""));
  ArchiveFillReport& report = *out;
  report = {};
  report.last_seq = after;
  Status failed = Status::OK();
  pipeline::EventChunk chunk;
  while (failed.ok() && !(stop && stop())) {
    chunk = pipeline::EventChunk();
    auto more = source->Read(&chunk);
    if (!more.ok()) {
      failed = more.status();
      break;
    }
    source->DecodeFrames(&chunk, [&](JetstreamFrame& frame) {
      if (frame.seq != 0 && frame.seq <= report.last_seq) return;  // written already
      auto seq = writer.Append(frame.payload, frame.time_us, frame.seq);
      if (!seq.ok()) {
        ++report.skipped;
        if (note) {
          note("seq " + std::to_string(frame.seq) + " skipped: " + seq.status().message());
        }
        return;
      }
      if (*seq == 0) return;  // an info or error frame
      if (report.first_seq == 0 && after > 0 && *seq > after + 1 && live.collections.empty() &&
          live.dids.empty() && note) {
        // An unfiltered stream numbers every event: the host no longer kept these.
        note("gap: the host no longer keeps seqs " + std::to_string(after + 1) + ".." +
             std::to_string(*seq - 1) + " (after the archive's newest, " + std::to_string(after) +
             "); the archive goes on from seq " + std::to_string(*seq) + " without them");
      }
      if (report.first_seq == 0) report.first_seq = *seq;
      report.last_seq = *seq;
      ++report.rows;
    });
    for (const auto& e : chunk.errors) {
      ++report.skipped;
      if (note) note(e.kind + " " + e.key + ": " + e.message);
    }
    if (!*more) break;
  }
  Status sealed = writer.Finish();
  ATFILL_RETURN_IF_ERROR(failed);
  return sealed;
}

}  // namespace atfill::sources
