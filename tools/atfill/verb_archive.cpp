// atfill archive write CONFIG DIR FILE... | --live: keeps a Jetstream v2 archive of one's own,
// `.jss` segments written from Jetstream event files or from [live]'s host, which a replay
// (`[archive] dir`) reads back.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sources/archive_writer.hpp"
#include "sources/event_file.hpp"
#include "sources/jetstream.hpp"
#include "sources/jetstream_frames.hpp"
#include "state/kv_store.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/atfill/job_run.hpp"

namespace atfill::cli {
namespace {

int Fail(const std::string& msg, int code) {
  std::fprintf(stderr, "atfill archive: %s\n", msg.c_str());
  return code;
}

constexpr const char* kUsage =
    "usage: atfill archive write CONFIG DIR (FILE... | --live) [--rows-per-block N] "
    "[--segment-kb N]";

// The stream of [live]'s host into `dir`, each row under the host's own seq, until the stream
// goes quiet ([live] idle_exit_ms) or SIGINT/SIGTERM. The archive is its own cursor: a run
// continues after its newest sealed seq (the open segment of a killed run is written again).
int WriteLive(const AppConfig& config, const std::string& dir,
              const sources::ArchiveWriterOptions& options) {
  if (config.live.hosts.empty()) return Fail("--live needs [live] hosts", kExitUsage);
  auto writer = sources::ArchiveWriter::Open(dir, options);
  if (!writer.ok()) return Fail(writer.status().message(), kExitIo);
  const uint64_t after = (*writer)->next_seq() - 1;
  sources::JetstreamOptions live = config.live;
  if (after > 0) live.start_seq = 0;  // the archive's newest seq decides
  auto kv = state::NewMemoryKvStore();
  auto source = sources::JetstreamSource::Create(live, kv.get());
  if (!source.ok()) return Fail(source.status().message(), kExitUsage);
  if (Status s = (*source)->Seek(after > 0 ? std::to_string(after) : ""); !s.ok()) {
    return Fail(s.message(), kExitIo);
  }
  std::fprintf(stderr, "atfill archive: writing the stream of %s to %s %s\n",
               live.hosts.front().c_str(), dir.c_str(),
               after > 0            ? ("after seq " + std::to_string(after)).c_str()
               : live.start_seq > 0 ? ("from seq " + std::to_string(live.start_seq)).c_str()
                                    : "from the live tip");
  CatchStopSignals();
  uint64_t rows = 0, bad = 0, first = 0, last = after;
  Status failed = Status::OK();
  pipeline::EventChunk chunk;
  while (failed.ok() && !StopSignalled()) {
    chunk = pipeline::EventChunk();
    auto more = (*source)->Read(&chunk);
    if (!more.ok()) {
      failed = more.status();
      break;
    }
    (*source)->DecodeFrames(&chunk, [&](sources::JetstreamFrame& frame) {
      if (!failed.ok() || (frame.seq != 0 && frame.seq <= last)) return;  // written already
      auto seq = (*writer)->Append(frame.payload, frame.time_us, frame.seq);
      if (!seq.ok()) {
        if (++bad <= 10) {
          std::fprintf(stderr, "atfill archive: seq %" PRIu64 " skipped: %s\n", frame.seq,
                       seq.status().message().c_str());
        }
        return;
      }
      if (*seq == 0) return;  // an info or error frame
      if (first == 0 && after > 0 && *seq > after + 1 && live.collections.empty() &&
          live.dids.empty()) {
        // An unfiltered stream numbers every event: the host no longer kept these.
        std::fprintf(stderr,
                     "atfill archive: gap: the host no longer keeps seqs %" PRIu64 "..%" PRIu64
                     " (after the archive's newest, %" PRIu64
                     "); the archive goes on from seq %" PRIu64 " without them\n",
                     after + 1, *seq - 1, after, *seq);
      }
      if (first == 0) first = *seq;
      last = *seq;
      ++rows;
    });
    for (const auto& e : chunk.errors) {
      if (++bad <= 10) {
        std::fprintf(stderr, "atfill archive: %s %s: %s\n", e.kind.c_str(), e.key.c_str(),
                     e.message.c_str());
      }
    }
    if (!*more) break;
  }
  RestoreSignals();
  Status sealed = (*writer)->Finish();
  std::fprintf(stderr,
               "atfill archive: wrote %" PRIu64 " rows (seq %" PRIu64 "..%" PRIu64 ") in %" PRIu64
               " segment(s) to %s; %" PRIu64 " event(s) skipped\n",
               rows, first, last, (*writer)->segments_written(), dir.c_str(), bad);
  if (!failed.ok()) return Fail(failed.message(), kExitIo);
  if (!sealed.ok()) return Fail(sealed.message(), kExitIo);
  return kExitOk;
}

}  // namespace

int RunArchive(std::span<char* const> args) {
  if (args.empty() || std::string_view(args[0]) != "write") return Fail(kUsage, kExitUsage);
  std::vector<std::string> positional;
  sources::ArchiveWriterOptions options;
  bool live = false;
  uint64_t segment_kb = options.segment_bytes >> 10;
  CLI::App app{"", "atfill archive write"};
  PrepareVerbApp(app);
  app.add_option("ARGS", positional, "the config, the archive folder, the event files");
  app.add_option("--rows-per-block", options.rows_per_block)->check(PositiveInteger("a row count"));
  app.add_option("--segment-kb", segment_kb)->check(PositiveInteger("a size in KiB"));
  app.add_flag("--live", live);
  if (auto rc = ParseVerbArgs(app, args.subspan(1))) return *rc;
  options.segment_bytes = segment_kb << 10;
  if (positional.size() < 2) return Fail(kUsage, kExitUsage);
  auto config = LoadAppConfig(positional[0]);
  if (!config.ok()) return Fail(config.status().message(), kExitUsage);
  const std::string dir = positional[1];
  if (Status s = options.Validate(); !s.ok()) return Fail(s.message(), kExitUsage);
  if (live) {
    if (positional.size() > 2) return Fail("--live takes no event files", kExitUsage);
    return WriteLive(*config, dir, options);
  }
  if (positional.size() == 2) return Fail("give the event files to archive, or --live", kExitUsage);
  sources::EventFileOptions files = config->files;
  files.paths.assign(positional.begin() + 2, positional.end());
  auto source = sources::EventFileSource::Open(files);
  if (!source.ok()) return Fail(source.status().message(), kExitIo);
  if (Status s = (*source)->Seek(""); !s.ok()) return Fail(s.message(), kExitIo);
  auto writer = sources::ArchiveWriter::Open(dir, options);
  if (!writer.ok()) return Fail(writer.status().message(), kExitIo);
  const uint64_t first_seq = (*writer)->next_seq();
  uint64_t bad = 0;
  pipeline::EventChunk chunk;
  while (true) {
    chunk.raw.clear();
    auto more = (*source)->Read(&chunk);
    if (!more.ok()) return Fail(more.status().message(), kExitIo);
    if (!*more) break;
    std::string_view raw = chunk.raw;
    uint64_t line = chunk.raw_first_position - 1;
    while (!raw.empty()) {
      size_t nl = raw.find('\n');
      if (nl == std::string_view::npos) nl = raw.size();
      const std::string_view text = raw.substr(0, nl);
      raw.remove_prefix(std::min(nl + 1, raw.size()));
      ++line;
      if (text.empty()) continue;
      sources::JetstreamFrame frame;
      std::string kind;
      Status s =
          sources::DecodeJetstreamV1(text, text.size(), pipeline::Origin::kReplay, &frame, &kind);
      if (s.ok()) s = (*writer)->Append(frame.payload, frame.time_us).status();
      if (!s.ok()) {
        if (++bad <= 10) {
          std::fprintf(stderr, "atfill archive: line %" PRIu64 " skipped (%s): %s\n", line,
                       kind.empty() ? "bad_event" : kind.c_str(), s.message().c_str());
        }
      }
    }
  }
  if (Status s = (*writer)->Finish(); !s.ok()) return Fail(s.message(), kExitIo);
  const uint64_t rows = (*writer)->rows_written();
  std::fprintf(stderr,
               "atfill archive: wrote %" PRIu64 " rows (seq %" PRIu64 "..%" PRIu64 ") in %" PRIu64
               " segment(s) to %s; %" PRIu64 " line(s) skipped\n",
               rows, first_seq, first_seq + rows - (rows > 0 ? 1 : 0),
               (*writer)->segments_written(), dir.c_str(), bad);
  return bad > 0 ? kExitInputInvalid : kExitOk;
}

}  // namespace atfill::cli
