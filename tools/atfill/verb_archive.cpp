// atfill archive write CONFIG DIR FILE...: keeps a Jetstream v2 archive of one's own, `.jss`
// segments written from Jetstream event files, which a replay (`[archive] dir`) reads back.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sources/archive_writer.hpp"
#include "sources/event_file.hpp"
#include "sources/jetstream_frames.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/cli.hpp"

namespace atfill::cli {
namespace {

int Fail(const std::string& msg, int code) {
  std::fprintf(stderr, "atfill archive: %s\n", msg.c_str());
  return code;
}

constexpr const char* kUsage =
    "usage: atfill archive write CONFIG DIR FILE... [--rows-per-block N] [--segment-kb N]";

}  // namespace

int RunArchive(std::span<char* const> args) {
  if (args.empty() || std::string_view(args[0]) != "write") return Fail(kUsage, kExitUsage);
  std::vector<std::string> positional;
  sources::ArchiveWriterOptions options;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (a == "--rows-per-block" || a == "--segment-kb") {
      if (i + 1 >= args.size()) return Fail(std::string(a) + " needs a value", kExitUsage);
      char* end = nullptr;
      const unsigned long long v = std::strtoull(args[++i], &end, 10);
      if (end == args[i] || *end != '\0') {
        return Fail(std::string(a) + ": '" + args[i] + "' is not a number", kExitUsage);
      }
      if (a == "--rows-per-block") {
        options.rows_per_block = static_cast<uint32_t>(std::min<unsigned long long>(v, UINT32_MAX));
      } else {
        options.segment_bytes = static_cast<uint64_t>(v) << 10;
      }
    } else if (a.starts_with("--")) {
      return Fail("unknown option " + std::string(a), kExitUsage);
    } else {
      positional.emplace_back(a);
    }
  }
  if (positional.size() < 2) return Fail(kUsage, kExitUsage);
  auto config = LoadAppConfig(positional[0]);
  if (!config.ok()) return Fail(config.status().message(), kExitUsage);
  const std::string dir = positional[1];
  if (positional.size() == 2) {
    return Fail("give the event files to archive (writing from a live Jetstream is not built yet)",
                kExitUsage);
  }
  if (Status s = options.Validate(); !s.ok()) return Fail(s.message(), kExitUsage);
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
