// subscribeLabels frames (sources/labels/label_frames.hpp): any bytes decode to a frame or an
// error, never a crash; every label decoded is checked against a key (which refuses it or not,
// never crashes), and the bytes its signature covers are one DAG-CBOR map without `sig`.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "atproto/cbor.hpp"
#include "atproto/crypto.hpp"
#include "sources/labels/label_frames.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace atfill;
  static const atproto::PublicKey kKey = [] {
    const Bytes scalar(32, 7);
    return atproto::PrivateKey::FromBytes(atproto::KeyType::kSecp256k1, scalar)->public_key();
  }();
  auto frame = sources::DecodeLabelFrame(ByteView(data, size));
  if (!frame.ok()) return 0;
  if (frame->kind != sources::LabelFrame::Kind::kLabels) return 0;
  if (frame->seq < 0) std::abort();
  for (const sources::RawLabel& raw : frame->labels) {
    auto covered = atproto::DecodeCbor(raw.signed_bytes);
    if (!covered.ok() || covered->kind() != atproto::Value::Kind::kMap) std::abort();
    if (covered->Find("sig") != nullptr) std::abort();
    if (raw.label.src.empty() || raw.label.uri.empty() || raw.label.val.empty()) std::abort();
    std::string kind;
    const Status verified = sources::VerifyLabel(raw, raw.label.src, kKey, &kind);
    if (!verified.ok() && kind != "bad_signature") std::abort();
  }
  return 0;
}
