#include "sources/event_file.hpp"

#include <simdjson.h>
#include <zstd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "atproto/syntax.hpp"
#include "atproto/tid.hpp"

namespace atfill::sources {
namespace {

using pipeline::AccountEvent;
using pipeline::Event;
using pipeline::Operation;
using pipeline::RecordEvent;
namespace od = simdjson::ondemand;

constexpr size_t kReadBlock = 1 << 20;

std::string_view TrimRight(std::string_view s) {
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

bool IsBlank(std::string_view s) { return TrimRight(s).empty(); }

Status BadEvent(std::string* kind, std::string_view k, std::string msg) {
  *kind = std::string(k);
  return Status::Invalid(std::move(msg));
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
      auto parsed = ParseJetstreamLine(line, options_.origin, line_no, &event, &kind);
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
  thread_local od::parser parser;
  thread_local std::string padded;
  // The line is copied into a padded buffer: simdjson reads up to SIMDJSON_PADDING bytes past it.
  padded.assign(line);
  padded.reserve(line.size() + simdjson::SIMDJSON_PADDING);
  od::document doc;
  if (parser.iterate(padded.data(), padded.size(), padded.capacity()).get(doc) !=
      simdjson::SUCCESS) {
    return BadEvent(kind, "bad_json", "not valid JSON");
  }
  od::object top;
  if (doc.get_object().get(top) != simdjson::SUCCESS) {
    return BadEvent(kind, "bad_json", "not a JSON object");
  }
  std::string_view did, ev_kind, rev, op, collection, rkey, record, cid, status;
  int64_t time_us = 0, seq = 0;
  bool active = true, has_commit = false, has_account = false, has_record = false;
  for (auto field : top) {
    std::string_view key;
    if (field.unescaped_key().get(key) != simdjson::SUCCESS) {
      return BadEvent(kind, "bad_json", "not valid JSON");
    }
    auto value = field.value();
    simdjson::error_code err = simdjson::SUCCESS;
    if (key == "did") {
      err = value.get_string().get(did);
    } else if (key == "time_us") {
      err = value.get_int64().get(time_us);
    } else if (key == "kind") {
      err = value.get_string().get(ev_kind);
    } else if (key == "commit") {
      has_commit = true;
      od::object commit;
      err = value.get_object().get(commit);
      if (err) break;
      for (auto cf : commit) {
        std::string_view ck;
        if ((err = cf.unescaped_key().get(ck))) break;
        auto cv = cf.value();
        if (ck == "rev") {
          err = cv.get_string().get(rev);
        } else if (ck == "operation") {
          err = cv.get_string().get(op);
        } else if (ck == "collection") {
          err = cv.get_string().get(collection);
        } else if (ck == "rkey") {
          err = cv.get_string().get(rkey);
        } else if (ck == "cid") {
          err = cv.get_string().get(cid);
        } else if (ck == "record") {
          od::object rec;
          if ((err = cv.get_object().get(rec))) break;
          std::string_view raw;
          if ((err = rec.raw_json().get(raw))) break;
          record = TrimRight(raw);
          has_record = true;
        }
        if (err) break;
      }
    } else if (key == "account") {
      has_account = true;
      od::object account;
      err = value.get_object().get(account);
      if (err) break;
      for (auto af : account) {
        std::string_view ak;
        if ((err = af.unescaped_key().get(ak))) break;
        auto av = af.value();
        if (ak == "active") {
          err = av.get_bool().get(active);
        } else if (ak == "status") {
          err = av.get_string().get(status);
        } else if (ak == "seq") {
          err = av.get_int64().get(seq);
        }
        if (err) break;
      }
    }
    if (err) {
      return BadEvent(kind, "bad_event",
                      "field '" + std::string(key) + "': " + simdjson::error_message(err));
    }
  }
  // After the object, the document is out of tokens unless something follows it.
  const char* trailing = nullptr;
  if (doc.current_location().get(trailing) == simdjson::SUCCESS) {
    return BadEvent(kind, "bad_json", "trailing characters after the JSON object");
  }
  if (did.empty()) return BadEvent(kind, "bad_event", "event has no did");
  if (Status s = atproto::ValidateDid(did); !s.ok()) {
    return BadEvent(kind, "invalid_did", "did '" + std::string(did) + "': " + s.message());
  }

  if (ev_kind == "commit") {
    if (!has_commit) return BadEvent(kind, "bad_event", "commit event has no commit object");
    RecordEvent r;
    if (op == "create") {
      r.operation = Operation::kCreate;
    } else if (op == "update") {
      r.operation = Operation::kUpdate;
    } else if (op == "delete") {
      r.operation = Operation::kDelete;
    } else {
      return BadEvent(kind, "unknown_operation",
                      "unknown commit operation '" + std::string(op) + "'");
    }
    if (Status s = atproto::ValidateNsid(collection); !s.ok()) {
      return BadEvent(kind, "invalid_collection",
                      "collection '" + std::string(collection) + "': " + s.message());
    }
    if (Status s = atproto::ValidateRecordKey(rkey); !s.ok()) {
      return BadEvent(kind, "invalid_rkey", "rkey '" + std::string(rkey) + "': " + s.message());
    }
    if (!rev.empty()) {
      if (Status s = atproto::ValidateTid(rev); !s.ok()) {
        return BadEvent(kind, "invalid_rev", "rev '" + std::string(rev) + "': " + s.message());
      }
    }
    if (r.operation != Operation::kDelete) {
      if (!has_record) return BadEvent(kind, "bad_event", "create/update without a record");
      auto parsed_cid = atproto::Cid::Parse(cid);
      if (!parsed_cid.ok()) {
        return BadEvent(kind, "invalid_cid",
                        "cid '" + std::string(cid) + "': " + parsed_cid.status().message());
      }
      r.cid = *parsed_cid;
      r.body.assign(record);
      // createdAt is copied for the sink's created_at column; a second look at the record only
      // when the key is there at all.
      if (record.find("\"createdAt\"") != std::string_view::npos) {
        thread_local od::parser rec_parser;
        thread_local std::string rec_padded;
        rec_padded.assign(record);
        rec_padded.reserve(record.size() + simdjson::SIMDJSON_PADDING);
        od::document rdoc;
        std::string_view created;
        if (rec_parser.iterate(rec_padded.data(), rec_padded.size(), rec_padded.capacity())
                    .get(rdoc) == simdjson::SUCCESS &&
            rdoc["createdAt"].get_string().get(created) == simdjson::SUCCESS) {
          r.created_at.assign(created);
        }
      }
    }
    r.did.assign(did);
    r.collection.assign(collection);
    r.rkey.assign(rkey);
    r.rev.assign(rev);
    r.origin = origin;
    r.position = position;
    *event = std::move(r);
    return true;
  }
  if (ev_kind == "account") {
    if (!has_account) return BadEvent(kind, "bad_event", "account event has no account object");
    AccountEvent a;
    a.did.assign(did);
    a.active = active;
    a.status = status.empty()
                   ? (active ? pipeline::AccountStatus::kActive : pipeline::AccountStatus::kOther)
                   : pipeline::ParseAccountStatus(status);
    a.seq = seq;
    a.time_us = time_us;
    a.origin = origin;
    a.position = position;
    *event = std::move(a);
    return true;
  }
  if (ev_kind == "identity") return false;
  return BadEvent(kind, "unknown_kind", "unknown event kind '" + std::string(ev_kind) + "'");
}

}  // namespace atfill::sources
