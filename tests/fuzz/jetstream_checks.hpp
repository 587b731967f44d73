// What every decoded Jetstream frame must satisfy, shared by the v1, v2 and zstd targets: the
// decoder gives the same answer whether it parses a copy or the caller's padded buffer in place,
// an error always has a kind and a sentence, and a frame it accepts carries only valid
// identifiers and, for a create or update, a record body that is one JSON object.
#pragma once

#include <string>
#include <string_view>
#include <variant>

#include "atproto/syntax.hpp"
#include "atproto/tid.hpp"
#include "sources/jetstream/jetstream_frames.hpp"
#include "tests/fuzz/fuzz_util.hpp"

namespace atfill::fuzz {

// A text form of everything a decoded frame carries, to compare two decodes.
inline std::string Describe(const sources::JetstreamFrame& f) {
  std::string out(sources::FrameKindName(f.kind()));
  out += " seq=" + std::to_string(f.seq) + " time=" + std::to_string(f.time_us);
  std::visit(
      [&](const auto& p) {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, pipeline::RecordEvent>) {
          out += " " + p.did + " " + p.collection + " " + p.rkey +
                 " op=" + std::to_string(static_cast<int>(p.operation)) + " rev=" + p.rev +
                 " cid=" + (p.cid.valid() ? p.cid.ToString() : "") + " created=" + p.created_at +
                 " pos=" + std::to_string(p.position) + " body=" + p.body;
        } else if constexpr (std::is_same_v<T, pipeline::AccountEvent>) {
          out += " " + p.did + " active=" + std::to_string(p.active) +
                 " status=" + std::to_string(static_cast<int>(p.status)) +
                 " upstream=" + std::to_string(p.seq) + " t=" + std::to_string(p.time_us) +
                 " pos=" + std::to_string(p.position);
        } else if constexpr (std::is_same_v<T, sources::IdentityChange>) {
          out +=
              " " + p.did + " handle=" + p.handle + " upstream=" + std::to_string(p.upstream_seq);
        } else if constexpr (std::is_same_v<T, sources::SyncMarker>) {
          out += " " + p.did + " rev=" + p.rev + " blocks=" + std::to_string(p.blocks.size()) +
                 " upstream=" + std::to_string(p.upstream_seq);
        } else {
          out += " " + p.name + " " + p.message;
        }
      },
      f.payload);
  return out;
}

// Checks one accepted frame.
inline void CheckFrame(const sources::JetstreamFrame& f, bool v2) {
  if (const auto* r = std::get_if<pipeline::RecordEvent>(&f.payload)) {
    Check(atproto::ValidateDid(r->did).ok(), "commit did is a DID");
    Check(atproto::ValidateNsid(r->collection).ok(), "commit collection is an NSID");
    Check(atproto::ValidateRecordKey(r->rkey).ok(), "commit rkey is a record key");
    Check(r->rev.empty() ? !v2 : atproto::ValidateTid(r->rev).ok(), "commit rev is a TID");
    if (r->operation == pipeline::Operation::kDelete) {
      Check(r->body.empty(), "a delete carries no record");
    } else {
      Check(r->cid.valid(), "a create/update carries a CID");
      Check(r->body.starts_with('{') && r->body.ends_with('}'), "record body is an object");
      Check(IsJson(r->body), "record body is valid JSON");
    }
  } else if (const auto* a = std::get_if<pipeline::AccountEvent>(&f.payload)) {
    Check(atproto::ValidateDid(a->did).ok(), "account did is a DID");
  } else if (const auto* i = std::get_if<sources::IdentityChange>(&f.payload)) {
    Check(atproto::ValidateDid(i->did).ok(), "identity did is a DID");
  } else if (const auto* s = std::get_if<sources::SyncMarker>(&f.payload)) {
    Check(v2, "#sync is v2 only");
    Check(atproto::ValidateDid(s->did).ok(), "sync did is a DID");
  } else {
    Check(v2, "info and error frames are v2 only");
    Check(f.seq == 0 && f.time_us == 0, "info and error frames carry no position");
  }
  if (v2 && f.kind() <= sources::FrameKind::kSync) Check(f.seq != 0, "v2 events have a seq");
  sources::JetstreamFrame copy = f;
  (void)copy.TakeEvent();
}

// Decodes `text` as the live source does for a text message (readable 0: the decoder copies it)
// and as it does for a decompressed one (parsed in place in a padded buffer); both must agree.
inline void DecodeBothWays(std::string_view text, bool v2) {
  sources::JetstreamFrame copied, in_place;
  std::string kind_copied, kind_in_place;
  auto decode = [&](std::string_view t, size_t readable, sources::JetstreamFrame* frame,
                    std::string* kind) {
    return v2 ? sources::DecodeJetstreamV2(t, readable, pipeline::Origin::kLive, frame, kind)
              : sources::DecodeJetstreamV1(t, readable, pipeline::Origin::kLive, frame, kind);
  };
  const Status a = decode(text, 0, &copied, &kind_copied);
  std::string buffer;
  buffer.reserve(text.size() + sources::kJsonPadding);
  buffer.assign(text);
  const Status b = decode(buffer, buffer.capacity(), &in_place, &kind_in_place);
  Check(a.ToString() == b.ToString() && kind_copied == kind_in_place,
        "copied and in-place decodes fail alike");
  if (!a.ok()) {
    Check(!kind_copied.empty(), "an error has a kind");
    Check(!a.message().empty(), "an error has a sentence");
    return;
  }
  Check(Describe(copied) == Describe(in_place), "copied and in-place decodes agree");
  Check(IsJson(text), "an accepted frame is valid JSON");
  CheckFrame(copied, v2);
}

}  // namespace atfill::fuzz
