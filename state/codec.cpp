#include "state/codec.hpp"

#include <limits>

namespace atfill::state::codec {

void AppendBe64(std::string* out, uint64_t value) {
  for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<char>(value >> shift));
}

void AppendOrderedI64(std::string* out, int64_t value) {
  AppendBe64(out, static_cast<uint64_t>(value) ^ (uint64_t{1} << 63));
}

bool ReadBe64(std::string_view in, size_t pos, uint64_t* value) {
  if (pos > in.size() || in.size() - pos < 8) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(in[pos + i]);
  *value = v;
  return true;
}

int64_t OrderedToI64(uint64_t ordered) {
  return static_cast<int64_t>(ordered ^ (uint64_t{1} << 63));
}

std::string KeyWithId(std::string_view prefix, uint64_t id) {
  std::string key(prefix);
  AppendBe64(&key, id);
  return key;
}

void AppendVarint64(std::string* out, uint64_t value) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

bool ReadVarint64(std::string_view in, size_t* pos, uint64_t* value) {
  uint64_t v = 0;
  for (int i = 0; i < 10; ++i) {
    if (*pos >= in.size()) return false;
    const auto byte = static_cast<uint8_t>(in[(*pos)++]);
    // The tenth byte carries bit 63 only.
    if (i == 9 && byte > 1) return false;
    v |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
    if ((byte & 0x80) == 0) {
      *value = v;
      return true;
    }
  }
  return false;
}

namespace {

uint64_t ZigZag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
int64_t UnZigZag(uint64_t v) { return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1); }

void AppendHeader(std::string* out, uint32_t tag, size_t length) {
  AppendVarint64(out, tag);
  AppendVarint64(out, length);
}

}  // namespace

void RecordWriter::Uint(uint32_t tag, uint64_t value) {
  std::string payload;
  AppendVarint64(&payload, value);
  Str(tag, payload);
}

void RecordWriter::Int(uint32_t tag, int64_t value) { Uint(tag, ZigZag(value)); }

void RecordWriter::Str(uint32_t tag, std::string_view value) {
  AppendHeader(&out_, tag, value.size());
  out_.append(value);
}

void RecordWriter::StrPair(uint32_t tag, std::string_view key, std::string_view value) {
  std::string payload;
  AppendVarint64(&payload, key.size());
  payload.append(key);
  payload.append(value);
  Str(tag, payload);
}

void RecordWriter::StrUint(uint32_t tag, std::string_view key, uint64_t value) {
  std::string payload;
  AppendVarint64(&payload, value);
  StrPair(tag, key, payload);
}

Status Field::Error(std::string_view problem) const {
  return Status::Corrupt(std::string(what_) + ": field " + std::to_string(tag_) + " at byte " +
                         std::to_string(offset_) + ": " + std::string(problem));
}

Result<uint64_t> Field::Uint() const {
  size_t pos = 0;
  uint64_t v = 0;
  if (!ReadVarint64(payload_, &pos, &v) || pos != payload_.size()) {
    return Error("not a single varint");
  }
  return v;
}

Result<uint32_t> Field::Uint32() const {
  ATFILL_ASSIGN_OR_RETURN(uint64_t v, Uint());
  if (v > std::numeric_limits<uint32_t>::max()) return Error("value exceeds 32 bits");
  return static_cast<uint32_t>(v);
}

Result<int64_t> Field::Int() const {
  ATFILL_ASSIGN_OR_RETURN(uint64_t v, Uint());
  return UnZigZag(v);
}

Result<bool> Field::Bool() const {
  ATFILL_ASSIGN_OR_RETURN(uint64_t v, Uint());
  if (v > 1) return Error("boolean is neither 0 nor 1");
  return v == 1;
}

Status Field::StrPair(std::string* key, std::string* value) const {
  size_t pos = 0;
  uint64_t len = 0;
  if (!ReadVarint64(payload_, &pos, &len) || len > payload_.size() - pos) {
    return Error("pair key length runs past the field");
  }
  *key = std::string(payload_.substr(pos, len));
  *value = std::string(payload_.substr(pos + len));
  return Status::OK();
}

Status Field::StrUint(std::string* key, uint64_t* value) const {
  std::string raw;
  ATFILL_RETURN_IF_ERROR(StrPair(key, &raw));
  size_t pos = 0;
  if (!ReadVarint64(raw, &pos, value) || pos != raw.size()) {
    return Error("pair value is not a single varint");
  }
  return Status::OK();
}

Status ReadRecord(std::string_view bytes, uint8_t version, std::string_view what,
                  const std::function<Status(const Field&)>& fn) {
  if (bytes.empty()) return Status::Corrupt(std::string(what) + ": empty value");
  const auto got = static_cast<uint8_t>(bytes[0]);
  if (got != version) {
    return Status::Corrupt(std::string(what) + ": unknown encoding version " + std::to_string(got) +
                           " at byte 0 (expected " + std::to_string(version) + ")");
  }
  size_t pos = 1;
  while (pos < bytes.size()) {
    const size_t start = pos;
    uint64_t tag = 0;
    uint64_t length = 0;
    if (!ReadVarint64(bytes, &pos, &tag) || tag == 0) {
      return Status::Corrupt(std::string(what) + ": bad field tag at byte " +
                             std::to_string(start));
    }
    if (!ReadVarint64(bytes, &pos, &length) || length > bytes.size() - pos) {
      return Status::Corrupt(std::string(what) + ": field " + std::to_string(tag) + " at byte " +
                             std::to_string(start) + " has a length running past the end (" +
                             std::to_string(bytes.size()) + " bytes)");
    }
    ATFILL_RETURN_IF_ERROR(fn(Field(what, tag, bytes.substr(pos, length), start)));
    pos += length;
  }
  return Status::OK();
}

}  // namespace atfill::state::codec
