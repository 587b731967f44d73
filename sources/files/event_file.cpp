#include "sources/files/event_file.hpp"

#include <simdjson.h>
#include <zstd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "sources/jetstream/jetstream_frames.hpp"

namespace atfill::sources {
namespace {

using pipeline::Event;

constexpr size_t kReadBlock = 1 << 20;

std::string_view TrimRight(std::string_view s) {
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

bool IsBlank(std::string_view s) { return TrimRight(s).empty(); }

// A v1 line as an event positioned at `position` (its line number); false for identity events,
// which carry nothing to apply. `readable` is as for DecodeJetstreamV1.
Result<bool> ParseLine(std::string_view line, size_t readable, pipeline::Origin origin,
                       uint64_t position, Event* event, std::string* kind) {
  JetstreamFrame frame;
  ATFILL_RETURN_IF_ERROR(DecodeJetstreamV1(line, readable, origin, &frame, kind));
  auto taken = frame.TakeEvent();
  if (!taken) return false;
  std::visit([position](auto& e) { e.position = position; }, *taken);
  *event = std::move(*taken);
  return true;
}

}  // namespace

// A byte stream over one file, plain or zstd.
class EventFileSource::Reader {
 public:
  static Result<std::unique_ptr<Reader>> Open(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
      return Status::IoError("cannot open " + path + ": " + std::strerror(errno));
    }
    auto reader = std::unique_ptr<Reader>(new Reader(f, path));
    uint8_t magic[4] = {};
    const size_t n = std::fread(magic, 1, 4, f);
    std::rewind(f);
    if (n == 4 && magic[0] == 0x28 && magic[1] == 0xB5 && magic[2] == 0x2F && magic[3] == 0xFD) {
      reader->zstd_ = ZSTD_createDStream();
      if (reader->zstd_ == nullptr) return Status::Internal("cannot create a zstd stream");
      ZSTD_initDStream(reader->zstd_);
      reader->in_buf_.resize(ZSTD_DStreamInSize());
    }
    return reader;
  }
  ~Reader() {
    if (zstd_ != nullptr) ZSTD_freeDStream(zstd_);
    std::fclose(file_);
  }

  // Appends up to `max` bytes to *out; 0 at the end of the file.
  Result<size_t> ReadSome(std::string* out, size_t max) {
    const size_t old = out->size();
    out->resize(old + max);
    char* dst = out->data() + old;
    size_t got = 0;
    if (zstd_ == nullptr) {
      got = std::fread(dst, 1, max, file_);
      if (got == 0 && std::ferror(file_)) {
        out->resize(old);
        return Status::IoError("reading " + path_ + ": " + std::strerror(errno));
      }
    } else {
      ZSTD_outBuffer ob{dst, max, 0};
      while (ob.pos == 0) {
        if (in_.pos == in_.size) {
          const size_t n = std::fread(in_buf_.data(), 1, in_buf_.size(), file_);
          if (n == 0) {
            if (std::ferror(file_)) {
              out->resize(old);
              return Status::IoError("reading " + path_ + ": " + std::strerror(errno));
            }
            if (!frame_done_) {
              out->resize(old);
              return Status::Corrupt(path_ + ": zstd stream is truncated");
            }
            break;
          }
          in_ = ZSTD_inBuffer{in_buf_.data(), n, 0};
        }
        const size_t r = ZSTD_decompressStream(zstd_, &ob, &in_);
        if (ZSTD_isError(r)) {
          out->resize(old);
          return Status::Corrupt(path_ + ": zstd: " + ZSTD_getErrorName(r));
        }
        frame_done_ = (r == 0);
      }
      got = ob.pos;
    }
    out->resize(old + got);
    return got;
  }

  bool compressed() const { return zstd_ != nullptr; }

  // Plain files only: continue reading at `offset`.
  Status SeekPlain(uint64_t offset) {
    if (::fseeko(file_, static_cast<off_t>(offset), SEEK_SET) != 0) {
      return Status::IoError("seeking in " + path_ + ": " + std::strerror(errno));
    }
    return Status::OK();
  }

  // Compressed bytes consumed (file bytes for plain files).
  uint64_t consumed() const {
    const long pos = std::ftell(file_);
    if (pos < 0) return 0;
    return static_cast<uint64_t>(pos) - (in_.size - in_.pos);
  }

 private:
  Reader(FILE* f, std::string path) : file_(f), path_(std::move(path)) {}
  FILE* file_;
  std::string path_;
  ZSTD_DStream* zstd_ = nullptr;
  std::vector<char> in_buf_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  bool frame_done_ = true;
};

Status EventFileOptions::Validate() const {
  if (paths.empty()) return Status::Invalid("event file source needs at least one file");
  if (chunk_lines == 0) return Status::Invalid("chunk_lines must be at least 1");
  if (max_line_bytes < 64) return Status::Invalid("max_line_bytes must be at least 64");
  return Status::OK();
}

EventFileSource::EventFileSource(EventFileOptions options) : options_(std::move(options)) {}
EventFileSource::~EventFileSource() = default;

Result<std::unique_ptr<EventFileSource>> EventFileSource::Open(EventFileOptions options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  auto source = std::unique_ptr<EventFileSource>(new EventFileSource(std::move(options)));
  for (const auto& path : source->options_.paths) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) return Status::IoError("cannot read " + path + ": " + ec.message());
    source->total_bytes_ += size;
  }
  return source;
}

Status EventFileSource::OpenFile(size_t index) {
  file_index_ = index;
  offset_ = 0;
  carry_.clear();
  carry_pos_ = 0;
  reader_.reset();
  if (index >= options_.paths.size()) return Status::OK();
  ATFILL_ASSIGN_OR_RETURN(reader_, Reader::Open(options_.paths[index]));
  return Status::OK();
}

Status EventFileSource::Seek(const std::string& resume_cursor) {
  done_files_bytes_ = 0;
  line_ = 0;
  if (resume_cursor.empty()) return OpenFile(0);
  uint64_t parts[3] = {};
  const char* p = resume_cursor.data();
  const char* end = p + resume_cursor.size();
  for (int i = 0; i < 3; ++i) {
    auto [next, ec] = std::from_chars(p, end, parts[i]);
    if (ec != std::errc() || (i < 2 && (next == end || *next != ':')) || (i == 2 && next != end)) {
      return Status::Invalid("event file cursor '" + resume_cursor +
                             "' is not <file>:<offset>:<line>");
    }
    p = next + 1;
  }
  if (parts[0] > options_.paths.size()) {
    return Status::Invalid("event file cursor '" + resume_cursor + "' names file " +
                           std::to_string(parts[0]) + " of " +
                           std::to_string(options_.paths.size()));
  }
  for (size_t i = 0; i < parts[0]; ++i) {
    std::error_code ec;
    done_files_bytes_ += std::filesystem::file_size(options_.paths[i], ec);
  }
  ATFILL_RETURN_IF_ERROR(OpenFile(parts[0]));
  line_ = parts[2];
  consumed_.store(done_files_bytes_, std::memory_order_relaxed);
  // A plain file seeks to the offset; a zstd stream has no index, so it is decompressed up to it.
  if (reader_ && !reader_->compressed() && parts[1] > 0) {
    std::error_code ec;
    if (parts[1] > std::filesystem::file_size(options_.paths[file_index_], ec) || ec) {
      return Status::Invalid("event file cursor '" + resume_cursor + "' is past the end of " +
                             options_.paths[file_index_]);
    }
    ATFILL_RETURN_IF_ERROR(reader_->SeekPlain(parts[1]));
    offset_ = parts[1];
  }
  std::string skip;
  while (offset_ < parts[1] && reader_) {
    skip.clear();
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kReadBlock, parts[1] - offset_));
    ATFILL_ASSIGN_OR_RETURN(size_t got, reader_->ReadSome(&skip, want));
    if (got == 0) {
      return Status::Invalid("event file cursor '" + resume_cursor + "' is past the end of " +
                             options_.paths[file_index_]);
    }
    offset_ += got;
  }
  return Status::OK();
}

Result<bool> EventFileSource::Read(pipeline::EventChunk* chunk) {
  // carry_[carry_pos_..] holds bytes read past the last complete line.
  while (reader_) {
    chunk->raw.clear();
    chunk->raw_first_position = line_ + 1;
    uint32_t lines = 0;
    bool eof = false;
    // An oversized line is an error for that line, not the run; an empty line stands in for it so
    // Decode's line numbers stay right.
    auto too_long = [&](uint32_t index) {
      chunk->errors.push_back(
          {"line_too_long", "line " + std::to_string(line_ + index + 1),
           "line is longer than " + std::to_string(options_.max_line_bytes) + " bytes"});
      chunk->raw.push_back('\n');
    };
    while (lines < options_.chunk_lines) {
      const size_t nl = carry_.find('\n', carry_pos_);
      if (nl != std::string::npos && nl - carry_pos_ > options_.max_line_bytes) {
        too_long(lines);
        offset_ += nl + 1 - carry_pos_;
        carry_pos_ = nl + 1;
        ++lines;
        continue;
      }
      if (nl != std::string::npos) {
        chunk->raw.append(carry_, carry_pos_, nl + 1 - carry_pos_);
        offset_ += nl + 1 - carry_pos_;
        carry_pos_ = nl + 1;
        ++lines;
        continue;
      }
      const size_t partial = carry_.size() - carry_pos_;
      if (partial > options_.max_line_bytes) {
        // No newline yet and already too long: skip the line to its end.
        too_long(lines);
        offset_ += partial;
        carry_.clear();
        carry_pos_ = 0;
        for (;;) {
          ATFILL_ASSIGN_OR_RETURN(size_t got, reader_->ReadSome(&carry_, kReadBlock));
          if (got == 0) {
            eof = true;
            break;
          }
          const size_t pos = carry_.find('\n');
          if (pos != std::string::npos) {
            offset_ += pos + 1;
            carry_pos_ = pos + 1;
            break;
          }
          offset_ += carry_.size();
          carry_.clear();
        }
        ++lines;
        if (eof) break;
        continue;
      }
      if (eof) break;
      // Need more bytes: drop what was consumed, then read.
      carry_.erase(0, carry_pos_);
      carry_pos_ = 0;
      ATFILL_ASSIGN_OR_RETURN(size_t got, reader_->ReadSome(&carry_, kReadBlock));
      if (got == 0) {
        eof = true;
        if (carry_.empty()) break;
        // The last line of a file need not end with a newline; that newline is not in the file.
        carry_.push_back('\n');
        offset_ -= 1;
      }
    }
    line_ += lines;
    chunk->units_read = lines;
    const bool file_done = eof && carry_pos_ >= carry_.size();
    if (file_done) {
      done_files_bytes_ += reader_->consumed();
      ATFILL_RETURN_IF_ERROR(OpenFile(file_index_ + 1));
    }
    consumed_.store(done_files_bytes_ + (reader_ ? reader_->consumed() : 0),
                    std::memory_order_relaxed);
    if (lines > 0) {
      chunk->bytes_read = chunk->raw.size();
      chunk->input_done = consumed_.load(std::memory_order_relaxed);
      chunk->resume_cursor =
          std::to_string(file_index_) + ":" + std::to_string(offset_) + ":" + std::to_string(line_);
      chunk->raw.reserve(chunk->raw.size() + simdjson::SIMDJSON_PADDING);
      return true;
    }
  }
  return false;
}

std::string EventFileSource::Describe() const {
  std::string out = "event file";
  if (options_.paths.size() == 1) return out + " " + options_.paths[0];
  return out + "s (" + std::to_string(options_.paths.size()) + ")";
}

void EventFileSource::Decode(pipeline::EventChunk* chunk) const {
  const std::string& raw = chunk->raw;
  uint64_t line_no = chunk->raw_first_position;
  size_t start = 0;
  std::string kind;
  chunk->events.reserve(chunk->units_read);
  while (start < raw.size()) {
    size_t nl = raw.find('\n', start);
    if (nl == std::string::npos) nl = raw.size();
    const std::string_view line(raw.data() + start, nl - start);
    if (!IsBlank(line)) {
      Event event;
      // Parsed in place: Read() left kJsonPadding spare bytes after the chunk.
      auto parsed =
          ParseLine(line, raw.capacity() - start, options_.origin, line_no, &event, &kind);
      if (!parsed.ok()) {
        chunk->errors.push_back(
            {kind, "line " + std::to_string(line_no), parsed.status().message()});
      } else if (*parsed) {
        chunk->events.push_back(std::move(event));
      }
    }
    start = nl + 1;
    ++line_no;
  }
}

Result<bool> ParseJetstreamLine(std::string_view line, pipeline::Origin origin, uint64_t position,
                                Event* event, std::string* kind) {
  return ParseLine(line, 0, origin, position, event, kind);
}

}  // namespace atfill::sources
