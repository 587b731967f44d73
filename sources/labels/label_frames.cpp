#include "sources/labels/label_frames.hpp"

#include <utility>

#include "atproto/cbor.hpp"
#include "atproto/syntax.hpp"

namespace atfill::sources {
namespace {

using atproto::Value;
using Kind = Value::Kind;

// A text field of `map`: nullptr when absent; *ok false when present but not text.
const std::string* Text(const Value& map, std::string_view key, bool* ok) {
  const Value* v = map.Find(key);
  if (v == nullptr) return nullptr;
  if (v->kind() != Kind::kString) {
    *ok = false;
    return nullptr;
  }
  return &v->as_string();
}

// The fields of a version 1 label, sig aside: the labels spec has the signature cover exactly
// these, so that a `$type` or a field a later schema adds (which a labeler may send and a relay
// may pass along) does not change what was signed.
constexpr std::string_view kSignedFields[] = {"ver", "src", "uri", "cid",
                                              "val", "neg", "cts", "exp"};

// A label map of a #labels body into *out; false with *kind and *why set when it is not one.
bool ReadLabel(const Value& item, RawLabel* out, std::string* kind, std::string* why) {
  *kind = "bad_label";
  if (item.kind() != Kind::kMap) {
    *why = "the label is not a map";
    return false;
  }
  bool ok = true;
  const std::string* src = Text(item, "src", &ok);
  const std::string* uri = Text(item, "uri", &ok);
  const std::string* cid = Text(item, "cid", &ok);
  const std::string* val = Text(item, "val", &ok);
  const std::string* cts = Text(item, "cts", &ok);
  const std::string* exp = Text(item, "exp", &ok);
  if (!ok) {
    *why = "a field of the label is not text (src, uri, cid, val, cts, exp)";
    return false;
  }
  if (src == nullptr || uri == nullptr || val == nullptr || cts == nullptr) {
    *why = "the label lacks one of src, uri, val, cts";
    return false;
  }
  // The spec's label object requires ver (only the Lexicon, which also describes the unsigned
  // labels of API responses, makes it optional), and a signature covers it: a label without it
  // or of another version is not one this reader can check.
  const Value* ver = item.Find("ver");
  if (ver == nullptr || ver->kind() != Kind::kInt || ver->as_int() != 1) {
    *kind = "bad_version";
    *why = ver == nullptr ? "the label has no ver (version 1 labels carry ver 1)"
           : ver->kind() != Kind::kInt
               ? "the label's ver is not an integer"
               : "the label's ver is " + std::to_string(ver->as_int()) + ", not 1";
    return false;
  }
  const Value* neg = item.Find("neg");
  if (neg != nullptr && neg->kind() != Kind::kBool) {
    *why = "the label's neg is not a boolean";
    return false;
  }
  const Value* sig = item.Find("sig");
  if (sig != nullptr && sig->kind() != Kind::kBytes) {
    *why = "the label's sig is not bytes";
    return false;
  }
  if (!atproto::ValidateDid(*src).ok()) {
    *why = "the label's src is not a DID";
    return false;
  }
  if (uri->empty() || val->empty() || val->size() > 128) {
    *why = "the label's uri is empty, or its val is empty or longer than 128 bytes";
    return false;
  }
  auto created = atproto::Datetime::Parse(*cts);
  if (!created.ok()) {
    *why = "the label's cts: " + created.status().message();
    return false;
  }
  pipeline::Label& l = out->label;
  l.src = *src;
  l.uri = *uri;
  l.cid = cid != nullptr ? *cid : "";
  l.val = *val;
  l.neg = neg != nullptr && neg->as_bool();
  l.cts = *cts;
  l.cts_us = created->unix_micros();
  if (exp != nullptr) {
    auto expires = atproto::Datetime::Parse(*exp);
    if (!expires.ok()) {
      *why = "the label's exp: " + expires.status().message();
      return false;
    }
    l.exp = *exp;
    l.exp_us = expires->unix_micros();
  }
  if (sig != nullptr) out->sig = sig->as_bytes();
  // The decoder accepted only canonical DAG-CBOR, so the schema's fields, encoded again, are
  // byte for byte what the labeler signed.
  Value unsigned_map = Value::MakeMap();
  for (std::string_view field : kSignedFields) {
    if (const Value* v = item.Find(field); v != nullptr) {
      unsigned_map.as_map().emplace_back(std::string(field), *v);
    }
  }
  out->signed_bytes = atproto::EncodeCbor(unsigned_map);
  return true;
}

// An #info or error body's name (under `name_key`) and message, when they are text.
void ReadNameAndMessage(const Value& body, std::string_view name_key, LabelFrame* frame) {
  bool ok = true;
  const std::string* name = Text(body, name_key, &ok);
  const std::string* msg = Text(body, "message", &ok);
  frame->name = name != nullptr ? *name : "";
  frame->message = msg != nullptr ? *msg : "";
}

Value Str(std::string s) { return Value::String(std::move(s)); }

Bytes Concat(const Value& header, const Value& body) {
  Bytes out = atproto::EncodeCbor(header);
  atproto::EncodeCbor(body, &out);
  return out;
}

}  // namespace

Result<LabelFrame> DecodeLabelFrame(ByteView message) {
  size_t header_bytes = 0;
  auto header = atproto::DecodeCborPrefix(message, &header_bytes);
  if (!header.ok()) return header.status().WithContext("the frame header");
  if (header->kind() != Kind::kMap) return Status::Invalid("the frame header is not a map");
  const Value* op = header->Find("op");
  if (op == nullptr || op->kind() != Kind::kInt) {
    return Status::Invalid("the frame header has no integer op");
  }
  auto body = atproto::DecodeCbor(message.subspan(header_bytes));
  if (!body.ok()) return body.status().WithContext("the frame body");
  if (body->kind() != Kind::kMap) return Status::Invalid("the frame body is not a map");
  LabelFrame frame;
  bool ok = true;
  if (op->as_int() == -1) {
    frame.kind = LabelFrame::Kind::kError;
    ReadNameAndMessage(*body, "error", &frame);
    return frame;
  }
  if (op->as_int() != 1) {
    return Status::Invalid("the frame header's op is " + std::to_string(op->as_int()) +
                           ", not 1 or -1");
  }
  const std::string* type = Text(*header, "t", &ok);
  if (type == nullptr) return Status::Invalid("the frame header has no text t");
  frame.type = *type;
  if (frame.type == "#info") {
    frame.kind = LabelFrame::Kind::kInfo;
    ReadNameAndMessage(*body, "name", &frame);
    return frame;
  }
  if (frame.type != "#labels") return frame;  // a type this reader does not know: skipped
  frame.kind = LabelFrame::Kind::kLabels;
  const Value* seq = body->Find("seq");
  if (seq == nullptr || seq->kind() != Kind::kInt || seq->as_int() < 0) {
    return Status::Invalid("the #labels body has no non-negative integer seq");
  }
  frame.seq = seq->as_int();
  const Value* labels = body->Find("labels");
  if (labels == nullptr || labels->kind() != Kind::kArray) {
    return Status::Invalid("the #labels body of seq " + std::to_string(frame.seq) +
                           " has no labels array");
  }
  size_t index = 0;
  for (const Value& item : labels->as_array()) {
    RawLabel raw;
    std::string kind;
    std::string why;
    if (ReadLabel(item, &raw, &kind, &why)) {
      frame.labels.push_back(std::move(raw));
    } else {
      frame.errors.push_back(LabelError{
          kind, "seq " + std::to_string(frame.seq) + " label " + std::to_string(index), why});
    }
    ++index;
  }
  return frame;
}

Status VerifyLabel(const RawLabel& raw, const std::string& labeler, const atproto::PublicKey& key,
                   std::string* kind) {
  if (raw.label.src != labeler) {
    *kind = "wrong_source";
    return Status::Invalid("the label's src " + raw.label.src + " is not the labeler " + labeler);
  }
  if (raw.sig.empty()) {
    *kind = "bad_signature";
    return Status::Invalid("the label carries no sig");
  }
  if (Status st = key.Verify(raw.signed_bytes, raw.sig); !st.ok()) {
    *kind = "bad_signature";
    return Status::Invalid("the label's signature does not verify with " + labeler +
                           "'s #atproto_label key: " + st.message());
  }
  return Status::OK();
}

Bytes EncodeLabel(const pipeline::Label& label, ByteView sig) {
  Value::Map m = {{"ver", Value::Int(1)},
                  {"src", Str(label.src)},
                  {"uri", Str(label.uri)},
                  {"val", Str(label.val)},
                  {"cts", Str(label.cts)}};
  if (!label.cid.empty()) m.emplace_back("cid", Str(label.cid));
  if (label.neg) m.emplace_back("neg", Value::Bool(true));
  if (!label.exp.empty()) m.emplace_back("exp", Str(label.exp));
  if (!sig.empty()) m.emplace_back("sig", Value::BytesValue(Bytes(sig.begin(), sig.end())));
  return atproto::EncodeCbor(Value::MakeMap(std::move(m)));
}

Bytes EncodeLabelsFrame(int64_t seq, const std::vector<Bytes>& labels) {
  Value::Array items;
  for (const Bytes& b : labels) {
    auto v = atproto::DecodeCbor(b);
    items.push_back(v.ok() ? std::move(*v) : Value());
  }
  return Concat(
      Value::MakeMap({{"op", Value::Int(1)}, {"t", Str("#labels")}}),
      Value::MakeMap({{"seq", Value::Int(seq)}, {"labels", Value::MakeArray(std::move(items))}}));
}

Bytes EncodeInfoFrame(const std::string& name, const std::string& message) {
  Value::Map body = {{"name", Str(name)}};
  if (!message.empty()) body.emplace_back("message", Str(message));
  return Concat(Value::MakeMap({{"op", Value::Int(1)}, {"t", Str("#info")}}),
                Value::MakeMap(std::move(body)));
}

Bytes EncodeErrorFrame(const std::string& error, const std::string& message) {
  Value::Map body = {{"error", Str(error)}};
  if (!message.empty()) body.emplace_back("message", Str(message));
  return Concat(Value::MakeMap({{"op", Value::Int(-1)}}), Value::MakeMap(std::move(body)));
}

}  // namespace atfill::sources
