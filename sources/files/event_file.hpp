// Jetstream v1 events as JSON lines from files (plain or zstd-compressed): saved dumps, tests,
// benchmarks. Its cursor is the position after the last applied line.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "pipeline/source.hpp"

namespace atfill::sources {

struct EventFileOptions {
  // Files read in order, as one stream.
  std::vector<std::string> paths;
  // Lines per chunk handed to the graph.
  uint32_t chunk_lines = 1024;
  // A line longer than this is an error for that line (bytes).
  uint32_t max_line_bytes = 4 * 1024 * 1024;
  pipeline::Origin origin = pipeline::Origin::kReplay;
  Status Validate() const;
};

// Read() is serial; Decode() runs on many chunks at once. The resume cursor is
// "<file index>:<byte offset>:<line number>", the byte offset counted in the uncompressed text,
// so a zstd file resumes by decompressing up to it.
class EventFileSource : public pipeline::Source {
 public:
  static Result<std::unique_ptr<EventFileSource>> Open(EventFileOptions options);
  ~EventFileSource() override;

  Status Seek(const std::string& resume_cursor) override;
  Result<bool> Read(pipeline::EventChunk* chunk) override;
  void Decode(pipeline::EventChunk* chunk) const override;
  std::string Describe() const override;

  // Bytes of all files (compressed size for zstd files), for progress.
  uint64_t total_bytes() const { return total_bytes_; }
  // Bytes of input read so far (compressed size for zstd files). Thread-safe: progress views
  // call it while the engine reads.
  uint64_t consumed_bytes() const { return consumed_.load(std::memory_order_relaxed); }

 private:
  class Reader;
  explicit EventFileSource(EventFileOptions options);
  Status OpenFile(size_t index);

  EventFileOptions options_;
  uint64_t total_bytes_ = 0;
  uint64_t done_files_bytes_ = 0;
  size_t file_index_ = 0;
  uint64_t offset_ = 0;  // uncompressed bytes of the current file consumed
  uint64_t line_ = 0;    // lines consumed across all files
  std::unique_ptr<Reader> reader_;
  std::atomic<uint64_t> consumed_{0};
  std::string carry_;     // bytes read ahead of the lines handed out
  size_t carry_pos_ = 0;  // where the unconsumed part of carry_ starts
};

// Parses one Jetstream v1 JSON line. Returns true and sets *event for commit and account events;
// returns false for events that carry nothing to apply (identity); an error for bad input, with
// *kind set to a short error kind ("bad_json", "bad_event", "invalid_did", ...).
Result<bool> ParseJetstreamLine(std::string_view line, pipeline::Origin origin, uint64_t position,
                                pipeline::Event* event, std::string* kind);

}  // namespace atfill::sources
