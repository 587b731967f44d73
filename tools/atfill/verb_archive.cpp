// atfill archive write CONFIG DIR FILE... | --live: keeps a Jetstream v2 archive of one's own,
// `.jss` segments written from Jetstream event files or from [live]'s host, which a replay
// (`[archive] dir`) reads back.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sources/archive/archive_fill.hpp"
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

// Prints the first few of a run's skipped events.
sources::ArchiveNote Noter() {
  return [printed = 0](std::string_view sentence) mutable {
    const bool gap = sentence.starts_with("gap:");
    if (!gap && ++printed > 10) return;
    std::fprintf(stderr, "atfill archive: %.*s\n", static_cast<int>(sentence.size()),
                 sentence.data());
  };
}

// The stream of [live]'s host into `dir` until the stream goes quiet ([live] idle_exit_ms) or
// SIGINT/SIGTERM (sources::ArchiveStream).
int WriteLive(const AppConfig& config, const std::string& dir,
              const sources::ArchiveWriterOptions& options) {
  const sources::JetstreamOptions& live = config.sources().live;
  if (live.hosts.empty()) return Fail("--live needs [live] hosts", kExitUsage);
  auto writer = sources::ArchiveWriter::Open(dir, options);
  if (!writer.ok()) return Fail(writer.status().message(), kExitIo);
  const uint64_t after = (*writer)->next_seq() - 1;
  std::fprintf(stderr, "atfill archive: writing the stream of %s to %s %s\n",
               live.hosts.front().c_str(), dir.c_str(),
               after > 0            ? ("after seq " + std::to_string(after)).c_str()
               : live.start_seq > 0 ? ("from seq " + std::to_string(live.start_seq)).c_str()
                                    : "from the live tip");
  CatchStopSignals();
  sources::ArchiveFillReport r;
  Status s = sources::ArchiveStream(live, **writer, StopSignalled, Noter(), &r);
  RestoreSignals();
  std::fprintf(stderr,
               "atfill archive: wrote %" PRIu64 " rows (seq %" PRIu64 "..%" PRIu64 ") in %" PRIu64
               " segment(s) to %s; %" PRIu64 " event(s) skipped\n",
               r.rows, r.first_seq, r.last_seq, (*writer)->segments_written(), dir.c_str(),
               r.skipped);
  return s.ok() ? kExitOk : Fail(s.message(), kExitIo);
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
  sources::EventFileOptions files = config->sources().files;
  files.paths.assign(positional.begin() + 2, positional.end());
  auto writer = sources::ArchiveWriter::Open(dir, options);
  if (!writer.ok()) return Fail(writer.status().message(), kExitIo);
  const uint64_t first_seq = (*writer)->next_seq();
  auto r = sources::ArchiveEventFiles(files, **writer, Noter());
  if (!r.ok()) return Fail(r.status().message(), kExitIo);
  std::fprintf(stderr,
               "atfill archive: wrote %" PRIu64 " rows (seq %" PRIu64 "..%" PRIu64 ") in %" PRIu64
               " segment(s) to %s; %" PRIu64 " line(s) skipped\n",
               r->rows, first_seq, first_seq + r->rows - (r->rows > 0 ? 1 : 0),
               (*writer)->segments_written(), dir.c_str(), r->skipped);
  return r->skipped > 0 ? kExitInputInvalid : kExitOk;
}

}  // namespace atfill::cli
