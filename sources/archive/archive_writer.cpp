#include "sources/archive/archive_writer.hpp"

#include <ctime>
#include <filesystem>

#include "atproto/cbor.hpp"
#include "atproto/json.hpp"
#include "atproto/value.hpp"
#include "sources/archive/archive.hpp"

namespace atfill::sources {
namespace {

using atproto::Value;

// RFC 3339 UTC with six fractional digits, as Jetstream writes times.
std::string Rfc3339(int64_t unix_us) {
  const time_t secs = static_cast<time_t>(unix_us / 1'000'000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  const size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  char frac[16];
  std::snprintf(frac, sizeof(frac), ".%06dZ", static_cast<int>(unix_us % 1'000'000));
  return std::string(buf, n) + frac;
}

Bytes Cbor(Value::Map map) {
  Value v = Value::MakeMap(std::move(map));
  v.Canonicalize();
  return atproto::EncodeCbor(v);
}

}  // namespace

Status ArchiveWriterOptions::Validate() const {
  if (rows_per_block < 1 || rows_per_block > 262'144) {
    return Status::Invalid("rows_per_block must be between 1 and 262144");
  }
  if (segment_bytes < 1) return Status::Invalid("segment size must be at least 1 byte");
  return Status::OK();
}

Result<std::unique_ptr<ArchiveWriter>> ArchiveWriter::Open(const std::string& dir,
                                                           ArchiveWriterOptions options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("creating archive directory " + dir + ": " + ec.message());
  std::unique_ptr<ArchiveWriter> w(new ArchiveWriter(dir, options));
  ATFILL_ASSIGN_OR_RETURN(auto archive, LocalArchive::Open(dir));
  ATFILL_ASSIGN_OR_RETURN(auto segments, archive->ListSegments());
  if (!segments.empty()) {
    w->next_index_ = segments.back().index + 1;
    w->next_seq_ = segments.back().max_seq + 1;
  }
  return w;
}

ArchiveWriter::~ArchiveWriter() = default;

Status ArchiveWriter::AppendRow(const jss::Row& row) {
  if (!open_) {
    const std::string path = (std::filesystem::path(dir_) / jss::SegmentName(next_index_)).string();
    jss::SegmentWriterOptions o;
    o.rows_per_block = options_.rows_per_block;
    o.zstd_level = options_.zstd_level;
    ATFILL_ASSIGN_OR_RETURN(auto writer, jss::SegmentWriter::Create(path, o));
    open_.emplace(std::move(writer));
  }
  ATFILL_RETURN_IF_ERROR(open_->Append(row));
  ++rows_written_;
  if (open_->bytes_written() >= options_.segment_bytes) return Finish();
  return Status::OK();
}

Status ArchiveWriter::Finish() {
  if (!open_) return Status::OK();
  if (open_->rows() == 0) {
    open_.reset();
    return Status::OK();
  }
  Status s = open_->Seal();
  open_.reset();
  ATFILL_RETURN_IF_ERROR(s);
  ++next_index_;
  ++segments_written_;
  return Status::OK();
}

Result<uint64_t> ArchiveWriter::Append(const JetstreamFrame::Payload& event, int64_t witnessed_at) {
  return Append(event, witnessed_at, 0);
}

Result<uint64_t> ArchiveWriter::Append(const JetstreamFrame::Payload& event, int64_t witnessed_at,
                                       uint64_t seq) {
  if (seq != 0 && seq < next_seq_) {
    return Status::Invalid("seq " + std::to_string(seq) + " is not past the archive's last (" +
                           std::to_string(next_seq_ - 1) + ")");
  }
  const uint64_t at = seq != 0 ? seq : next_seq_;
  jss::Row row;
  row.seq = at;
  row.witnessed_at = witnessed_at;
  Bytes payload;
  if (const auto* r = std::get_if<pipeline::RecordEvent>(&event)) {
    row.did = r->did;
    row.collection = r->collection;
    row.rkey = r->rkey;
    row.rev = r->rev;
    switch (r->operation) {
      case pipeline::Operation::kCreate:
        row.kind = jss::Kind::kCreate;
        break;
      case pipeline::Operation::kUpdate:
        row.kind = jss::Kind::kUpdate;
        break;
      case pipeline::Operation::kDelete:
        row.kind = jss::Kind::kDelete;
        break;
    }
    if (r->operation != pipeline::Operation::kDelete) {
      ATFILL_RETURN_IF_ERROR(atproto::JsonToCbor(r->body, &payload)
                                 .WithContext("record " + r->Uri() + " is not atproto JSON"));
    }
  } else if (const auto* a = std::get_if<pipeline::AccountEvent>(&event)) {
    row.did = a->did;
    if (a->resync) {
      row.kind = jss::Kind::kSync;
      payload = Cbor({{"did", Value::String(a->did)},
                      {"seq", Value::Int(a->seq)},
                      {"time", Value::String(Rfc3339(witnessed_at))},
                      {"rev", Value::String("")},
                      {"blocks", Value::BytesValue({})}});
    } else {
      row.kind = jss::Kind::kAccount;
      Value::Map m{{"did", Value::String(a->did)},
                   {"seq", Value::Int(a->seq)},
                   {"time", Value::String(Rfc3339(witnessed_at))},
                   {"active", Value::Bool(a->active)}};
      if (!a->active || a->status != pipeline::AccountStatus::kActive) {
        m.emplace_back("status",
                       Value::String(std::string(pipeline::AccountStatusName(a->status))));
      }
      payload = Cbor(std::move(m));
    }
  } else if (const auto* id = std::get_if<IdentityChange>(&event)) {
    row.did = id->did;
    row.kind = jss::Kind::kIdentity;
    Value::Map m{{"did", Value::String(id->did)},
                 {"seq", Value::Int(id->upstream_seq)},
                 {"time", Value::String(Rfc3339(witnessed_at))}};
    if (!id->handle.empty()) m.emplace_back("handle", Value::String(id->handle));
    payload = Cbor(std::move(m));
  } else if (const auto* sync = std::get_if<SyncMarker>(&event)) {
    row.did = sync->did;
    row.kind = jss::Kind::kSync;
    row.rev = sync->rev;
    payload = Cbor({{"did", Value::String(sync->did)},
                    {"seq", Value::Int(sync->upstream_seq)},
                    {"time", Value::String(Rfc3339(witnessed_at))},
                    {"rev", Value::String(sync->rev)},
                    {"blocks", Value::BytesValue(sync->blocks)}});
  } else {
    return uint64_t{0};
  }
  row.payload = payload;
  ATFILL_RETURN_IF_ERROR(jss::ValidateRow(row));
  ATFILL_RETURN_IF_ERROR(AppendRow(row));
  next_seq_ = at + 1;
  return at;
}

}  // namespace atfill::sources
