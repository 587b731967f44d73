// Jetstream frames: the v2 `network.bsky.jetstream.subscribeEvents` messages, the v1 `/subscribe`
// JSON events, and the zstd dictionary compression both streams use (SPEC.md in
// ../shared/protocols/jetstream: §1.2, §1.4, §2.3, §2.4).
//
// Every decoder here turns bad input into an error, never a crash: a Status (Invalid for JSON,
// Corrupt for zstd bytes, OutOfRange for a size cap) whose sentence names the frame (its seq
// when one was read, else its size and the byte offset of the fault), and a short error kind for
// the job's error log:
//   bad_json          not one JSON object (syntax, truncation, trailing bytes)
//   bad_frame         v2: no or wrong envelope, a field of the wrong JSON type, a bad `$bytes`
//   bad_event         v1: a missing or mistyped field
//   unknown_type      v2: an envelope or payload `$type` this decoder does not know
//   unknown_kind      v1: a `kind` this decoder does not know
//   missing_field     v2: a field the lexicon requires is absent (seq, did, time, rev, ...)
//   bad_seq           v2: seq 0
//   bad_time          v2: `time` is not an RFC 3339 datetime
//   invalid_did, invalid_collection, invalid_rkey, invalid_rev, invalid_cid, unknown_operation
//   bad_base64        v2 #sync: `blocks` is not base64
//   bad_zstd, wrong_dictionary, frame_too_large   (ZstdFrameDecoder)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "base/bytes.hpp"
#include "base/status.hpp"
#include "pipeline/event.hpp"

struct ZSTD_DCtx_s;
struct ZSTD_DDict_s;

namespace atfill::sources {

// Bytes the JSON parser may read past the end of a text (simdjson's padding). A caller whose
// buffer has this many readable bytes after the text passes `readable >= size + kJsonPadding`
// and the text is parsed in place; otherwise it is copied once into a per-thread buffer.
inline constexpr size_t kJsonPadding = 64;

// #identity: a handle or DID document change. It changes no record; its seq still advances the
// cursor.
struct IdentityChange {
  std::string did;
  std::string handle;        // empty when absent
  int64_t upstream_seq = 0;  // the relay's seq, 0 when absent
};

// #sync (v2 only): the repo's commit chain broke; consumers resync the repo. `blocks` is the CAR
// the relay sent (empty for Jetstream's synthetic re-download marker).
struct SyncMarker {
  std::string did;
  std::string rev;  // empty when absent
  Bytes blocks;
  int64_t upstream_seq = 0;
};

// #info (v2): advisory, e.g. OutdatedCursor. Carries no seq.
struct StreamInfo {
  std::string name;
  std::string message;  // empty when absent
};

// An error frame (v2): terminal, the server closes the connection after it. Carries no seq.
struct StreamError {
  std::string name;  // ConsumerTooSlow, InternalError, ...
  std::string message;
};

enum class FrameKind : uint8_t { kCommit, kAccount, kIdentity, kSync, kInfo, kError };
std::string_view FrameKindName(FrameKind kind);

// One decoded frame of either stream version.
struct JetstreamFrame {
  // In FrameKind order. Commits are RecordEvents (body = the `record` JSON exactly as received,
  // created_at = its top-level createdAt string), accounts AccountEvents (seq and active/status
  // are the wrapped relay event's, time_us the frame's display time). Both take `origin` from
  // the decode call and position = `seq` (v1 without a cursor: time_us).
  using Payload = std::variant<pipeline::RecordEvent, pipeline::AccountEvent, IdentityChange,
                               SyncMarker, StreamInfo, StreamError>;
  Payload payload;
  // Jetstream's own seq: the v2 payload `seq`, the v1 `cursor`. 0 when the frame has none (info
  // and error frames; v1 servers that send no cursor).
  uint64_t seq = 0;
  // Display time in unix microseconds: v2 `time`, v1 `time_us`; 0 for info and error frames.
  int64_t time_us = 0;

  FrameKind kind() const { return static_cast<FrameKind>(payload.index()); }
  // True when `seq` is a resume position: an event frame (commit, account, identity, sync) that
  // carries a seq.
  bool advances_cursor() const { return seq != 0 && kind() <= FrameKind::kSync; }
  // Moves a commit's or account's event out for the pipeline, and a #sync as a resync
  // AccountEvent (every collection; the caller narrows it); nullopt for the other kinds.
  std::optional<pipeline::Event> TakeEvent();
};

// Decodes one v2 subscribeEvents text frame:
//   {"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#<kind>",...}}
//   {"$type":"error","error":NAME,"message"?:TEXT}
// Unknown fields are ignored; required fields are checked as the lexicon states them. *frame is
// unspecified after an error.
Status DecodeJetstreamV2(std::string_view text, size_t readable, pipeline::Origin origin,
                         JetstreamFrame* frame, std::string* error_kind);
inline Status DecodeJetstreamV2(std::string_view text, JetstreamFrame* frame,
                                std::string* error_kind) {
  return DecodeJetstreamV2(text, 0, pipeline::Origin::kLive, frame, error_kind);
}

// Decodes one v1 /subscribe event: {"did","time_us","cursor"?,"kind":"commit|identity|account",
// ...}. `seq` is the cursor when present.
Status DecodeJetstreamV1(std::string_view text, size_t readable, pipeline::Origin origin,
                         JetstreamFrame* frame, std::string* error_kind);
inline Status DecodeJetstreamV1(std::string_view text, JetstreamFrame* frame,
                                std::string* error_kind) {
  return DecodeJetstreamV1(text, 0, pipeline::Origin::kLive, frame, error_kind);
}

// A zstd dictionary as getZstdDictionary serves it (or the v1 one shipped with clients): a
// structured dictionary, magic 0xEC30A437 then its ID (u32 LE) in bytes 4..7. Immutable and
// shareable between threads; its decompression tables are built once at Load.
class ZstdDictionary {
 public:
  static constexpr uint32_t kMagic = 0xEC30A437;

  // Invalid when the bytes are shorter than 8, the magic or the ID (0) is wrong, or libzstd
  // refuses the tables.
  static Result<std::shared_ptr<const ZstdDictionary>> Load(ByteView bytes);
  ~ZstdDictionary();
  ZstdDictionary(const ZstdDictionary&) = delete;
  ZstdDictionary& operator=(const ZstdDictionary&) = delete;

  uint32_t id() const { return id_; }
  // The dictionary as loaded (what an encoder would use).
  ByteView bytes() const { return bytes_; }

 private:
  friend class ZstdFrameDecoder;
  ZstdDictionary() = default;
  Bytes bytes_;
  uint32_t id_ = 0;
  ZSTD_DDict_s* ddict_ = nullptr;
};

// Decompresses messages that are each one standalone zstd frame, with or without a dictionary.
// One per thread: not thread-safe, but several decoders may share one dictionary.
class ZstdFrameDecoder {
 public:
  // The reference client's read limit.
  static constexpr size_t kDefaultMaxOutput = 32u << 20;

  // `dictionary` may be null for frames compressed without one. `max_output` caps the
  // decompressed size of each frame (at least 1).
  static Result<ZstdFrameDecoder> Create(std::shared_ptr<const ZstdDictionary> dictionary,
                                         size_t max_output = kDefaultMaxOutput);
  ZstdFrameDecoder(ZstdFrameDecoder&& other) noexcept;
  ZstdFrameDecoder& operator=(ZstdFrameDecoder&& other) noexcept;
  ZstdFrameDecoder(const ZstdFrameDecoder&) = delete;
  ZstdFrameDecoder& operator=(const ZstdFrameDecoder&) = delete;
  ~ZstdFrameDecoder();

  // Replaces *out with the decompressed bytes of `frame`, which must be exactly one zstd frame.
  // *out keeps at least kJsonPadding bytes of spare capacity, so the text decoders can parse it
  // in place (pass out->capacity() as `readable`). Errors: bad_zstd (Corrupt: not a zstd frame,
  // truncated, trailing bytes, damaged data or checksum), wrong_dictionary (Invalid: the frame
  // names another dictionary ID, or one when the decoder has none), frame_too_large
  // (OutOfRange: more than max_output bytes, checked before decompressing when the frame states
  // its size). *out is unspecified after an error.
  Status Decompress(ByteView frame, std::string* out, std::string* error_kind);

  const ZstdDictionary* dictionary() const { return dictionary_.get(); }
  size_t max_output() const { return max_output_; }

 private:
  ZstdFrameDecoder(std::shared_ptr<const ZstdDictionary> dictionary, size_t max_output,
                   ZSTD_DCtx_s* dctx)
      : dictionary_(std::move(dictionary)), max_output_(max_output), dctx_(dctx) {}
  std::shared_ptr<const ZstdDictionary> dictionary_;
  size_t max_output_ = 0;
  ZSTD_DCtx_s* dctx_ = nullptr;
};

}  // namespace atfill::sources
