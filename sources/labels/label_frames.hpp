// Frames of com.atproto.label.subscribeLabels: each WebSocket message is two DAG-CBOR items back
// to back, a header {op, t} and a body:
//   op 1, t "#labels"  body {seq, labels: [label...]}
//   op 1, t "#info"    body {name, message?} (name "OutdatedCursor": the cursor is older than the
//                      labeler's history; the stream goes on from its oldest label)
//   op -1              body {error, message?}: the labeler ends the stream
// A label is a map {ver, src, uri, cid?, val, neg?, cts, exp?, sig}, signed by the labeler's
// #atproto_label key: the signature is ECDSA over SHA-256 of the DAG-CBOR of those fields but
// `sig` (the atproto labels spec: the schema's fields only, ver included, no `$type` nor any
// other field the label carries; such fields are accepted and ignored).
//
// Every decoder here turns bad input into an error, never a crash: a frame it cannot read is a
// Status naming the reason; a label it cannot accept is a LabelError with a kind for the log:
//   bad_label      a field missing or of the wrong type, a datetime or DID that does not parse
//   bad_version    ver missing or not 1 (the spec's label object requires it; version 1 is the
//                  only one there is)
//   wrong_source   src is not the labeler the stream belongs to
//   bad_signature  no sig, or sig does not verify with the labeler's key
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "atproto/crypto.hpp"
#include "atproto/value.hpp"
#include "base/bytes.hpp"
#include "base/status.hpp"
#include "pipeline/label.hpp"

namespace atfill::sources {

// A label as it came, with the bytes its signature covers.
struct RawLabel {
  pipeline::Label label;
  Bytes sig;
  Bytes signed_bytes;  // DAG-CBOR of the label's schema fields without `sig`
};

struct LabelError {
  std::string kind;     // see the header comment
  std::string key;      // "seq N label I" or the label's uri
  std::string message;  // a sentence
};

struct LabelFrame {
  enum class Kind : uint8_t { kLabels, kInfo, kError, kUnknown };
  Kind kind = Kind::kUnknown;
  std::string type;  // the header's t ("#labels"...); empty for an error frame
  int64_t seq = 0;   // kLabels
  std::vector<RawLabel> labels;
  std::vector<LabelError> errors;  // labels of this frame that could not be read
  std::string name;                // kInfo: name; kError: error
  std::string message;             // kInfo and kError: message (may be empty)
};

// Decodes one message. Invalid or Corrupt, naming the reason, when it is not a header and a body
// of the shapes above (a #labels body without seq, labels that are not an array...). Labels that
// are not well-formed maps of the fields above go to frame.errors; the rest to frame.labels.
Result<LabelFrame> DecodeLabelFrame(ByteView message);

// Checks `raw` came from `labeler` and is signed by `key`: OK, or the LabelError of its refusal.
Status VerifyLabel(const RawLabel& raw, const std::string& labeler, const atproto::PublicKey& key,
                   std::string* kind);

// The DAG-CBOR of a label map (ver 1, without sig when `sig` is empty): what a labeler signs and
// sends (simnet and tests).
Bytes EncodeLabel(const pipeline::Label& label, ByteView sig);
// A #labels frame (header and body) with `labels` already encoded by EncodeLabel.
Bytes EncodeLabelsFrame(int64_t seq, const std::vector<Bytes>& labels);
// An #info frame, and an error frame.
Bytes EncodeInfoFrame(const std::string& name, const std::string& message);
Bytes EncodeErrorFrame(const std::string& error, const std::string& message);

}  // namespace atfill::sources
