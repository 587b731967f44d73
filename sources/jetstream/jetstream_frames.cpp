#include "sources/jetstream/jetstream_frames.hpp"

#include <simdjson.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "atproto/json_check.hpp"
#include "atproto/syntax.hpp"
#include "atproto/tid.hpp"
#include "base/encoding.hpp"

namespace atfill::sources {
namespace {

namespace od = simdjson::ondemand;
using pipeline::AccountEvent;
using pipeline::Operation;
using pipeline::RecordEvent;
using simdjson::error_code;

static_assert(kJsonPadding == simdjson::SIMDJSON_PADDING);

constexpr std::string_view kPayloadTypePrefix = "network.bsky.jetstream.subscribeEvents#";
constexpr uint32_t kZstdFrameMagic = 0xFD2FB528;

std::string_view TrimRight(std::string_view s) {
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

uint32_t LoadLe32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

Status Fail(std::string* kind, std::string_view k, std::string message) {
  if (kind != nullptr) kind->assign(k);
  return Status::Invalid(std::move(message));
}

// One JSON text being decoded: the thread's parser, the bytes it reads, and how to name the
// frame in errors.
class JsonFrame {
 public:
  JsonFrame(std::string_view text, size_t readable) : size_(text.size()) {
    thread_local od::parser parser;
    thread_local std::string padded;
    if (readable >= text.size() + kJsonPadding) {
      base_ = text.data();
      start_ = parser.iterate(text.data(), text.size(), readable).get(doc_);
    } else {
      // simdjson reads up to kJsonPadding bytes past the text.
      padded.assign(text);
      padded.reserve(text.size() + kJsonPadding);
      base_ = padded.data();
      start_ = parser.iterate(padded.data(), padded.size(), padded.capacity()).get(doc_);
    }
  }

  od::document& doc() { return doc_; }
  error_code start_error() const { return start_; }

  // "frame of N bytes"
  std::string Name() const { return "frame of " + std::to_string(size_) + " bytes"; }
  // " at byte K" where the parser stopped, or "" when it cannot tell.
  std::string Offset() {
    const char* loc = nullptr;
    if (start_ != simdjson::SUCCESS) return "";  // no document to ask
    if (doc_.current_location().get(loc) != simdjson::SUCCESS || loc < base_ ||
        loc > base_ + size_) {
      return "";
    }
    return " at byte " + std::to_string(loc - base_);
  }
  // True when something follows the top-level value.
  bool HasTrailing() {
    const char* loc = nullptr;
    return doc_.current_location().get(loc) == simdjson::SUCCESS;
  }

 private:
  size_t size_;
  const char* base_ = nullptr;
  od::document doc_;
  error_code start_ = simdjson::SUCCESS;
};

// A wrong JSON type or an out-of-range number, as opposed to broken JSON.
bool IsTypeError(error_code e) {
  return e == simdjson::INCORRECT_TYPE || e == simdjson::NUMBER_OUT_OF_RANGE;
}

// Visits every token of `value` (atproto/json_check.hpp): On Demand only matches the brackets of
// a value it skips, so a frame (and the record body in it) would otherwise be taken with a stray
// byte or a bad literal inside a value no field reads. Deeper than simdjson's own limit is an
// error.
error_code CheckJson(od::value value, size_t depth) {
  bool too_deep = false;
  if (auto e = atproto::CheckJsonValue(value, depth, simdjson::DEFAULT_MAX_DEPTH, &too_deep)) {
    return e;
  }
  return too_deep ? simdjson::DEPTH_ERROR : simdjson::SUCCESS;
}

// A record object: its exact text (from '{' to '}') and its top-level createdAt string, read in
// one pass that checks the syntax of every value in it.
error_code ReadRecord(od::value value, od::document& doc, std::string_view* raw,
                      std::string_view* created_at) {
  const std::string_view token = value.raw_json_token();
  od::object obj;
  if (auto e = value.get_object().get(obj)) return e;
  bool too_deep = false;
  if (auto e =
          atproto::CheckRecordObject(obj, simdjson::DEFAULT_MAX_DEPTH, created_at, &too_deep)) {
    return e;
  }
  if (too_deep) return simdjson::DEPTH_ERROR;
  // The parser now stands on the token after the record's closing brace.
  const char* end = nullptr;
  if (auto e = doc.current_location().get(end)) return e;
  *raw = TrimRight(std::string_view(token.data(), static_cast<size_t>(end - token.data())));
  return simdjson::SUCCESS;
}

// The commit fields both versions share (v1 nests them in "commit", v2 puts them in the payload).
struct CommitFields {
  std::string_view rev, op, collection, rkey, cid, record, created_at;
  bool has_rev = false, has_cid = false, has_record = false;
};

// Reads `key` into *c when it is a commit field; *matched says whether it was.
error_code ReadCommitField(std::string_view key, od::value value, od::document& doc,
                           CommitFields* c, bool* matched) {
  *matched = true;
  if (key == "rev") {
    c->has_rev = true;
    return value.get_string().get(c->rev);
  }
  if (key == "operation") return value.get_string().get(c->op);
  if (key == "collection") return value.get_string().get(c->collection);
  if (key == "rkey") return value.get_string().get(c->rkey);
  if (key == "cid") {
    c->has_cid = true;
    return value.get_string().get(c->cid);
  }
  if (key == "record") {
    c->has_record = true;
    return ReadRecord(value, doc, &c->record, &c->created_at);
  }
  *matched = false;
  return CheckJson(value, 1);
}

// A wrapped com.atproto.sync.subscribeRepos event (#identity, #account, #sync).
struct Upstream {
  bool present = false;
  std::string_view handle, status, rev, blocks;
  int64_t seq = 0;
  bool active = true;
  bool has_blocks = false;
  bool blocks_shape_ok = true;
};

// {"$bytes": "<base64>"} and nothing else.
error_code ReadBytesObject(od::value value, std::string_view* b64, bool* shape_ok) {
  od::object obj;
  if (auto e = value.get_object().get(obj)) return e;
  size_t fields = 0;
  bool found = false;
  for (auto field : obj) {
    std::string_view key;
    if (auto e = field.unescaped_key().get(key)) return e;
    ++fields;
    od::value v;
    if (auto e = field.value().get(v)) return e;
    if (key == "$bytes") {
      found = true;
      if (auto e = v.get_string().get(*b64)) return e;
    } else if (auto e = CheckJson(v, 1)) {
      return e;
    }
  }
  *shape_ok = found && fields == 1;
  return simdjson::SUCCESS;
}

error_code ReadUpstream(od::value value, Upstream* u, std::string_view* failed) {
  od::object obj;
  if (auto e = value.get_object().get(obj)) return e;
  u->present = true;
  for (auto field : obj) {
    std::string_view key;
    if (auto e = field.unescaped_key().get(key)) return e;
    od::value v;
    if (auto e = field.value().get(v)) return e;
    error_code e = simdjson::SUCCESS;
    if (key == "handle") {
      e = v.get_string().get(u->handle);
    } else if (key == "status") {
      e = v.get_string().get(u->status);
    } else if (key == "rev") {
      e = v.get_string().get(u->rev);
    } else if (key == "seq") {
      e = v.get_int64().get(u->seq);
    } else if (key == "active") {
      e = v.get_bool().get(u->active);
    } else if (key == "blocks") {
      u->has_blocks = true;
      e = ReadBytesObject(v, &u->blocks, &u->blocks_shape_ok);
    } else {
      e = CheckJson(v, 1);
    }
    if (e) {
      *failed = key;
      return e;
    }
  }
  return simdjson::SUCCESS;
}

// Names an event frame in error sentences ("frame seq 7: ..."); the text is built only for an
// error.
struct Who {
  std::string_view label;
  uint64_t value = 0;
  bool negative = false;  // value holds the two's complement of a negative int64
  std::string Say(std::string_view rest) const {
    std::string out(label);
    out += ' ';
    out += negative ? std::to_string(static_cast<int64_t>(value)) : std::to_string(value);
    out += ": ";
    out += rest;
    return out;
  }
};

// Checks the commit fields and fills *r (did, origin and position are the caller's). `missing`
// is the error kind for an absent required field; v2 also requires rev.
Status BuildRecord(const CommitFields& c, bool v2, const Who& who, RecordEvent* r,
                   std::string* kind) {
  const std::string_view missing = v2 ? "missing_field" : "bad_event";
  if (c.op == "create") {
    r->operation = Operation::kCreate;
  } else if (c.op == "update") {
    r->operation = Operation::kUpdate;
  } else if (c.op == "delete") {
    r->operation = Operation::kDelete;
  } else {
    return Fail(kind, "unknown_operation",
                who.Say("unknown commit operation '") + std::string(c.op) + "'");
  }
  if (Status s = atproto::ValidateNsid(c.collection); !s.ok()) {
    return Fail(kind, "invalid_collection",
                who.Say("collection '") + std::string(c.collection) + "': " + s.message());
  }
  if (Status s = atproto::ValidateRecordKey(c.rkey); !s.ok()) {
    return Fail(kind, "invalid_rkey",
                who.Say("rkey '") + std::string(c.rkey) + "': " + s.message());
  }
  if (v2 && !c.has_rev) return Fail(kind, missing, who.Say("commit has no rev"));
  if (!c.rev.empty() || v2) {
    if (Status s = atproto::ValidateTid(c.rev); !s.ok()) {
      return Fail(kind, "invalid_rev", who.Say("rev '") + std::string(c.rev) + "': " + s.message());
    }
  }
  if (r->operation != Operation::kDelete) {
    if (!c.has_record) return Fail(kind, missing, who.Say("create/update without a record"));
    if (v2 && !c.has_cid) return Fail(kind, missing, who.Say("create/update without a cid"));
    auto cid = atproto::Cid::Parse(c.cid);
    if (!cid.ok()) {
      return Fail(kind, "invalid_cid",
                  who.Say("cid '") + std::string(c.cid) + "': " + cid.status().message());
    }
    r->cid = *cid;
    r->body.assign(c.record);
    r->created_at.assign(c.created_at);
  }
  r->collection.assign(c.collection);
  r->rkey.assign(c.rkey);
  r->rev.assign(c.rev);
  return Status::OK();
}

AccountEvent MakeAccount(std::string_view did, const Upstream& u, int64_t time_us) {
  AccountEvent a;
  a.did.assign(did);
  a.active = u.active;
  a.status = u.status.empty()
                 ? (u.active ? pipeline::AccountStatus::kActive : pipeline::AccountStatus::kOther)
                 : pipeline::ParseAccountStatus(u.status);
  a.seq = u.seq;
  a.time_us = time_us;
  return a;
}

Status JsonError(JsonFrame& json, std::string* kind, error_code err) {
  return Fail(
      kind, "bad_json",
      json.Name() + " is not valid JSON" + json.Offset() + ": " + simdjson::error_message(err));
}

// A field that failed to read: a wrong type is `type_kind`, anything else broken JSON.
Status FieldError(JsonFrame& json, std::string* kind, std::string_view type_kind,
                  std::string_view field, error_code err) {
  if (!IsTypeError(err)) return JsonError(json, kind, err);
  return Fail(kind, type_kind,
              json.Name() + ": field '" + std::string(field) + "'" + json.Offset() + ": " +
                  simdjson::error_message(err));
}

// Reads a frame's top-level object field by field: `read(key, value, &failed)` reads one field
// and returns its error (naming in *failed the inner field it failed on, if not the key itself:
// `field_kind` then); broken JSON is bad_json, and no bytes may follow the object.
template <typename ReadField>
Status ReadTopObject(JsonFrame& json, std::string* error_kind, std::string_view field_kind,
                     ReadField read) {
  if (json.start_error()) return JsonError(json, error_kind, json.start_error());
  od::object top;
  if (auto e = json.doc().get_object().get(top)) {
    if (e == simdjson::INCORRECT_TYPE) {
      return Fail(error_kind, "bad_json", json.Name() + " is not a JSON object");
    }
    return JsonError(json, error_kind, e);
  }
  for (auto field : top) {
    std::string_view key;
    if (auto e = field.unescaped_key().get(key)) return JsonError(json, error_kind, e);
    od::value value;
    if (auto e = field.value().get(value)) return JsonError(json, error_kind, e);
    std::string_view failed;
    if (error_code e = read(key, value, &failed)) {
      return FieldError(json, error_kind, field_kind, failed.empty() ? key : failed, e);
    }
  }
  if (json.HasTrailing()) {
    return Fail(error_kind, "bad_json", json.Name() + ": trailing bytes after the JSON object");
  }
  return Status::OK();
}

// Every field of a v2 payload, whatever its $type (the type is checked after the scan, so key
// order does not matter).
struct PayloadFields {
  std::string_view type, did, time, name, message;
  uint64_t seq = 0;
  bool has_type = false, has_seq = false, has_time = false, has_did = false, has_name = false;
  CommitFields commit;
  Upstream identity, account, sync;
};

error_code ReadPayload(od::value value, od::document& doc, PayloadFields* p,
                       std::string_view* failed) {
  od::object obj;
  if (auto e = value.get_object().get(obj)) {
    *failed = "payload";
    return e;
  }
  for (auto field : obj) {
    std::string_view key;
    if (auto e = field.unescaped_key().get(key)) return e;
    od::value v;
    if (auto e = field.value().get(v)) return e;
    error_code e = simdjson::SUCCESS;
    bool matched = false;
    auto text = [&v](bool* has, std::string_view* out) {
      *has = true;
      return v.get_string().get(*out);
    };
    if (key == "$type") {
      e = text(&p->has_type, &p->type);
    } else if (key == "seq") {
      p->has_seq = true;
      e = v.get_uint64().get(p->seq);
    } else if (key == "did") {
      e = text(&p->has_did, &p->did);
    } else if (key == "time") {
      e = text(&p->has_time, &p->time);
    } else if (key == "name") {
      e = text(&p->has_name, &p->name);
    } else if (key == "message") {
      e = v.get_string().get(p->message);
    } else if (key == "identity") {
      e = ReadUpstream(v, &p->identity, failed);
    } else if (key == "account") {
      e = ReadUpstream(v, &p->account, failed);
    } else if (key == "sync") {
      e = ReadUpstream(v, &p->sync, failed);
    } else {
      e = ReadCommitField(key, v, doc, &p->commit, &matched);
    }
    if (e) {
      if (failed->empty()) *failed = key;
      return e;
    }
  }
  return simdjson::SUCCESS;
}

}  // namespace

std::string_view FrameKindName(FrameKind kind) {
  switch (kind) {
    case FrameKind::kCommit:
      return "commit";
    case FrameKind::kAccount:
      return "account";
    case FrameKind::kIdentity:
      return "identity";
    case FrameKind::kSync:
      return "sync";
    case FrameKind::kInfo:
      return "info";
    case FrameKind::kError:
      return "error";
  }
  return "unknown";
}

std::optional<pipeline::Event> JetstreamFrame::TakeEvent() {
  if (auto* r = std::get_if<RecordEvent>(&payload)) return pipeline::Event(std::move(*r));
  if (auto* a = std::get_if<AccountEvent>(&payload)) return pipeline::Event(std::move(*a));
  if (auto* s = std::get_if<SyncMarker>(&payload)) {
    AccountEvent a;
    a.did = std::move(s->did);
    a.resync = true;
    a.seq = s->upstream_seq;
    a.time_us = time_us;
    a.position = seq;
    return pipeline::Event(std::move(a));
  }
  return std::nullopt;
}

Status DecodeJetstreamV2(std::string_view text, size_t readable, pipeline::Origin origin,
                         JetstreamFrame* frame, std::string* error_kind) {
  JsonFrame json(text, readable);
  std::string_view envelope_type, error_name, error_message;
  bool has_envelope_type = false, has_payload = false, has_error_name = false;
  PayloadFields p;
  const Status top =
      ReadTopObject(json, error_kind, "bad_frame",
                    [&](std::string_view key, od::value value, std::string_view* failed_at) {
                      error_code e = simdjson::SUCCESS;
                      std::string_view failed;
                      if (key == "$type") {
                        has_envelope_type = true;
                        e = value.get_string().get(envelope_type);
                      } else if (key == "payload") {
                        has_payload = true;
                        e = ReadPayload(value, json.doc(), &p, &failed);
                      } else if (key == "error") {
                        has_error_name = true;
                        e = value.get_string().get(error_name);
                      } else if (key == "message") {
                        e = value.get_string().get(error_message);
                      } else {
                        e = CheckJson(value, 1);
                      }
                      *failed_at = failed;
                      return e;
                    });
  if (!top.ok()) return top;

  if (!has_envelope_type) return Fail(error_kind, "bad_frame", json.Name() + " has no $type");
  if (envelope_type == "error") {
    if (!has_error_name) {
      return Fail(error_kind, "missing_field", json.Name() + ": error frame has no error name");
    }
    frame->payload = StreamError{std::string(error_name), std::string(error_message)};
    frame->seq = 0;
    frame->time_us = 0;
    return Status::OK();
  }
  if (envelope_type != "message") {
    return Fail(error_kind, "unknown_type",
                json.Name() + ": unknown frame $type '" + std::string(envelope_type) + "'");
  }
  if (!has_payload) return Fail(error_kind, "bad_frame", json.Name() + ": message has no payload");
  if (!p.has_type) return Fail(error_kind, "bad_frame", json.Name() + ": payload has no $type");
  std::string_view fragment;
  if (p.type.starts_with(kPayloadTypePrefix)) fragment = p.type.substr(kPayloadTypePrefix.size());
  const bool known = fragment == "commit" || fragment == "identity" || fragment == "account" ||
                     fragment == "sync" || fragment == "info";
  if (!known) {
    return Fail(error_kind, "unknown_type",
                json.Name() + ": unknown payload $type '" + std::string(p.type) + "'");
  }
  if (fragment == "info") {
    if (!p.has_name) return Fail(error_kind, "missing_field", json.Name() + ": #info has no name");
    frame->payload = StreamInfo{std::string(p.name), std::string(p.message)};
    frame->seq = 0;
    frame->time_us = 0;
    return Status::OK();
  }

  // Event frames: seq, time and did first, so later errors can name the seq.
  if (!p.has_seq) {
    return Fail(error_kind, "missing_field",
                json.Name() + ": #" + std::string(fragment) + " has no seq");
  }
  const Who who{"frame seq", p.seq};
  if (p.seq == 0) return Fail(error_kind, "bad_seq", who.Say("seq 0 is not an event position"));
  if (!p.has_time) return Fail(error_kind, "missing_field", who.Say("event has no time"));
  auto time = atproto::Datetime::Parse(p.time);
  if (!time.ok()) {
    return Fail(error_kind, "bad_time",
                who.Say("time '") + std::string(p.time) + "': " + time.status().message());
  }
  if (!p.has_did) return Fail(error_kind, "missing_field", who.Say("event has no did"));
  if (Status s = atproto::ValidateDid(p.did); !s.ok()) {
    return Fail(error_kind, "invalid_did",
                who.Say("did '") + std::string(p.did) + "': " + s.message());
  }
  const int64_t time_us = time->unix_micros();

  if (fragment == "commit") {
    RecordEvent r;
    ATFILL_RETURN_IF_ERROR(BuildRecord(p.commit, /*v2=*/true, who, &r, error_kind));
    r.did.assign(p.did);
    r.origin = origin;
    r.position = p.seq;
    frame->payload = std::move(r);
  } else if (fragment == "account") {
    if (!p.account.present) {
      return Fail(error_kind, "missing_field", who.Say("#account has no account object"));
    }
    AccountEvent a = MakeAccount(p.did, p.account, time_us);
    a.origin = origin;
    a.position = p.seq;
    frame->payload = std::move(a);
  } else if (fragment == "identity") {
    if (!p.identity.present) {
      return Fail(error_kind, "missing_field", who.Say("#identity has no identity object"));
    }
    frame->payload =
        IdentityChange{std::string(p.did), std::string(p.identity.handle), p.identity.seq};
  } else {
    if (!p.sync.present) {
      return Fail(error_kind, "missing_field", who.Say("#sync has no sync object"));
    }
    if (!p.sync.blocks_shape_ok) {
      return Fail(error_kind, "bad_frame",
                  who.Say("#sync blocks is not an object holding only \"$bytes\""));
    }
    if (!p.sync.rev.empty()) {
      if (Status s = atproto::ValidateTid(p.sync.rev); !s.ok()) {
        return Fail(error_kind, "invalid_rev",
                    who.Say("#sync rev '") + std::string(p.sync.rev) + "': " + s.message());
      }
    }
    SyncMarker sync;
    if (p.sync.has_blocks) {
      auto blocks = Base64Decode(p.sync.blocks);
      if (!blocks.ok()) {
        return Fail(error_kind, "bad_base64",
                    who.Say("#sync blocks are not base64: ") + blocks.status().message());
      }
      sync.blocks = std::move(*blocks);
    }
    sync.did.assign(p.did);
    sync.rev.assign(p.sync.rev);
    sync.upstream_seq = p.sync.seq;
    frame->payload = std::move(sync);
  }
  frame->seq = p.seq;
  frame->time_us = time_us;
  return Status::OK();
}

Status DecodeJetstreamV1(std::string_view text, size_t readable, pipeline::Origin origin,
                         JetstreamFrame* frame, std::string* error_kind) {
  JsonFrame json(text, readable);
  std::string_view did, kind;
  int64_t time_us = 0;
  uint64_t cursor = 0;
  bool has_commit = false;
  CommitFields commit;
  Upstream account, identity;
  const Status top =
      ReadTopObject(json, error_kind, "bad_event",
                    [&](std::string_view key, od::value value, std::string_view* failed_at) {
                      error_code e = simdjson::SUCCESS;
                      std::string_view failed;
                      if (key == "did") {
                        e = value.get_string().get(did);
                      } else if (key == "time_us") {
                        e = value.get_int64().get(time_us);
                      } else if (key == "cursor") {
                        e = value.get_uint64().get(cursor);
                      } else if (key == "kind") {
                        e = value.get_string().get(kind);
                      } else if (key == "commit") {
                        has_commit = true;
                        od::object obj;
                        e = value.get_object().get(obj);
                        if (!e) {
                          for (auto cf : obj) {
                            std::string_view ck;
                            if ((e = cf.unescaped_key().get(ck))) break;
                            od::value cv;
                            if ((e = cf.value().get(cv))) break;
                            bool matched = false;
                            if ((e = ReadCommitField(ck, cv, json.doc(), &commit, &matched))) {
                              failed = ck;
                              break;
                            }
                          }
                        }
                      } else if (key == "account") {
                        e = ReadUpstream(value, &account, &failed);
                      } else if (key == "identity") {
                        e = ReadUpstream(value, &identity, &failed);
                      } else {
                        e = CheckJson(value, 1);
                      }
                      *failed_at = failed;
                      return e;
                    });
  if (!top.ok()) return top;
  const Who who = cursor != 0 ? Who{"event cursor", cursor}
                              : Who{"event time_us", static_cast<uint64_t>(time_us), time_us < 0};
  if (did.empty()) return Fail(error_kind, "bad_event", who.Say("event has no did"));
  if (Status s = atproto::ValidateDid(did); !s.ok()) {
    return Fail(error_kind, "invalid_did",
                who.Say("did '") + std::string(did) + "': " + s.message());
  }
  const uint64_t position =
      cursor != 0 ? cursor : static_cast<uint64_t>(std::max<int64_t>(0, time_us));
  if (kind == "commit") {
    if (!has_commit)
      return Fail(error_kind, "bad_event", who.Say("commit event has no commit object"));
    RecordEvent r;
    ATFILL_RETURN_IF_ERROR(BuildRecord(commit, /*v2=*/false, who, &r, error_kind));
    r.did.assign(did);
    r.origin = origin;
    r.position = position;
    frame->payload = std::move(r);
  } else if (kind == "account") {
    if (!account.present) {
      return Fail(error_kind, "bad_event", who.Say("account event has no account object"));
    }
    AccountEvent a = MakeAccount(did, account, time_us);
    a.origin = origin;
    a.position = position;
    frame->payload = std::move(a);
  } else if (kind == "identity") {
    // The identity object is informational; an event without one still names the DID.
    frame->payload = IdentityChange{std::string(did), std::string(identity.handle), identity.seq};
  } else {
    return Fail(error_kind, "unknown_kind",
                who.Say("unknown event kind '") + std::string(kind) + "'");
  }
  frame->seq = cursor;
  frame->time_us = time_us;
  return Status::OK();
}

// --- zstd ---

ZstdDictionary::~ZstdDictionary() {
  if (ddict_ != nullptr) ZSTD_freeDDict(ddict_);
}

Result<std::shared_ptr<const ZstdDictionary>> ZstdDictionary::Load(ByteView bytes) {
  const std::string name = "zstd dictionary of " + std::to_string(bytes.size()) + " bytes";
  if (bytes.size() < 8) {
    return Status::Invalid(name +
                           " is too short: it must start with a 4-byte magic and a 4-byte ID");
  }
  const uint32_t magic = LoadLe32(bytes.data());
  if (magic != kMagic) {
    char found[16];
    std::snprintf(found, sizeof(found), "0x%08X", magic);
    return Status::Invalid(name + " does not start with the magic 0xEC30A437 (found " + found +
                           ")");
  }
  const uint32_t id = LoadLe32(bytes.data() + 4);
  if (id == 0) return Status::Invalid(name + " has ID 0, which zstd reserves for 'no dictionary'");
  auto dict = std::shared_ptr<ZstdDictionary>(new ZstdDictionary());
  dict->bytes_.assign(bytes.begin(), bytes.end());
  dict->id_ = id;
  dict->ddict_ = ZSTD_createDDict(dict->bytes_.data(), dict->bytes_.size());
  if (dict->ddict_ == nullptr) {
    return Status::Invalid(name + " (ID " + std::to_string(id) +
                           "): libzstd refused its entropy tables");
  }
  if (ZSTD_getDictID_fromDDict(dict->ddict_) != id) {
    return Status::Invalid(name + ": libzstd reads ID " +
                           std::to_string(ZSTD_getDictID_fromDDict(dict->ddict_)) +
                           ", the header says " + std::to_string(id));
  }
  return std::shared_ptr<const ZstdDictionary>(std::move(dict));
}

Result<ZstdFrameDecoder> ZstdFrameDecoder::Create(std::shared_ptr<const ZstdDictionary> dictionary,
                                                  size_t max_output) {
  constexpr size_t kLargestCap = size_t{1} << 31;
  if (max_output == 0 || max_output > kLargestCap) {
    return Status::Invalid("zstd frame cap " + std::to_string(max_output) + " is outside 1.." +
                           std::to_string(kLargestCap) + " bytes");
  }
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  if (dctx == nullptr)
    return Status::ResourceExhausted("cannot create a zstd decompression context");
  // A streamed frame (no content size in its header) may not ask for a window larger than the
  // cap (or 1 MiB for small caps): zstd allocates the window before producing a byte.
  int window_log = 20;
  while (window_log < 31 && (size_t{1} << window_log) < max_output) ++window_log;
  ZSTD_DCtx_setParameter(dctx, ZSTD_d_windowLogMax, window_log);
  return ZstdFrameDecoder(std::move(dictionary), max_output, dctx);
}

ZstdFrameDecoder::ZstdFrameDecoder(ZstdFrameDecoder&& other) noexcept
    : dictionary_(std::move(other.dictionary_)),
      max_output_(other.max_output_),
      dctx_(std::exchange(other.dctx_, nullptr)) {}

ZstdFrameDecoder& ZstdFrameDecoder::operator=(ZstdFrameDecoder&& other) noexcept {
  if (this != &other) {
    if (dctx_ != nullptr) ZSTD_freeDCtx(dctx_);
    dictionary_ = std::move(other.dictionary_);
    max_output_ = other.max_output_;
    dctx_ = std::exchange(other.dctx_, nullptr);
  }
  return *this;
}

ZstdFrameDecoder::~ZstdFrameDecoder() {
  if (dctx_ != nullptr) ZSTD_freeDCtx(dctx_);
}

Status ZstdFrameDecoder::Decompress(ByteView frame, std::string* out, std::string* error_kind) {
  const std::string name = "zstd frame of " + std::to_string(frame.size()) + " bytes";
  auto corrupt = [&](const std::string& why) {
    if (error_kind != nullptr) *error_kind = "bad_zstd";
    return Status::Corrupt(name + " " + why);
  };
  auto too_large = [&](const std::string& size) {
    if (error_kind != nullptr) *error_kind = "frame_too_large";
    return Status::OutOfRange(name + " decompresses to " + size + ", over the cap of " +
                              std::to_string(max_output_) + " bytes");
  };
  const uint32_t have = dictionary_ ? dictionary_->id() : 0;
  auto wrong_dictionary = [&](uint32_t wanted) {
    if (error_kind != nullptr) *error_kind = "wrong_dictionary";
    return Status::Invalid(
        name + " was compressed with dictionary " +
        (wanted != 0 ? std::to_string(wanted) : std::string("(unnamed)")) + "; this decoder has " +
        (have != 0 ? "dictionary " + std::to_string(have) : std::string("none")));
  };
  // Errors from libzstd itself.
  auto zstd_error = [&](size_t code) {
    switch (ZSTD_getErrorCode(code)) {
      case ZSTD_error_dictionary_wrong:
        return wrong_dictionary(ZSTD_getDictID_fromFrame(frame.data(), frame.size()));
      case ZSTD_error_frameParameter_windowTooLarge:
        return too_large("a window larger than the cap");
      case ZSTD_error_checksum_wrong:
        return corrupt("fails its content checksum");
      default:
        return corrupt(std::string("is damaged: ") + ZSTD_getErrorName(code));
    }
  };

  if (frame.size() < 4 || LoadLe32(frame.data()) != kZstdFrameMagic) {
    return corrupt("does not start with the zstd frame magic");
  }
  const size_t frame_size = ZSTD_findFrameCompressedSize(frame.data(), frame.size());
  if (ZSTD_isError(frame_size)) {
    return corrupt(std::string("is not a complete frame: ") + ZSTD_getErrorName(frame_size));
  }
  if (frame_size != frame.size()) {
    return corrupt("holds " + std::to_string(frame.size() - frame_size) +
                   " bytes after its end (one frame per message)");
  }
  const uint32_t wanted = ZSTD_getDictID_fromFrame(frame.data(), frame.size());
  if (wanted != 0 && wanted != have) return wrong_dictionary(wanted);
  ZSTD_DDict* ddict = dictionary_ ? dictionary_->ddict_ : nullptr;

  const unsigned long long content = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (content == ZSTD_CONTENTSIZE_ERROR) return corrupt("has a malformed header");
  if (content != ZSTD_CONTENTSIZE_UNKNOWN) {
    if (content > max_output_) return too_large(std::to_string(content) + " bytes");
    const size_t size = static_cast<size_t>(content);
    out->clear();
    out->reserve(size + kJsonPadding);
    out->resize(size);
    const size_t got =
        ZSTD_decompress_usingDDict(dctx_, out->data(), size, frame.data(), frame.size(), ddict);
    if (ZSTD_isError(got)) return zstd_error(got);
    if (got != size) {
      return corrupt("decompressed to " + std::to_string(got) + " bytes, its header says " +
                     std::to_string(size));
    }
    return Status::OK();
  }

  // No content size in the header: stream into a buffer that grows up to one byte past the cap.
  ZSTD_DCtx_reset(dctx_, ZSTD_reset_session_only);
  if (size_t r = ZSTD_DCtx_refDDict(dctx_, ddict); ZSTD_isError(r)) return zstd_error(r);
  ZSTD_inBuffer in{frame.data(), frame.size(), 0};
  size_t produced = 0;
  size_t capacity = std::min(max_output_ + 1, std::max<size_t>(4096, frame.size() * 4));
  out->clear();
  for (;;) {
    out->resize(capacity);
    ZSTD_outBuffer ob{out->data(), capacity, produced};
    const size_t in_before = in.pos;
    const size_t r = ZSTD_decompressStream(dctx_, &ob, &in);
    if (ZSTD_isError(r)) return zstd_error(r);
    const bool progressed = ob.pos != produced || in.pos != in_before;
    produced = ob.pos;
    if (produced > max_output_) return too_large("more than the cap");
    if (r == 0) break;
    if (produced == capacity) {
      capacity = std::min(max_output_ + 1, capacity * 2);
    } else if (in.pos == in.size || !progressed) {
      return corrupt("is truncated");
    }
  }
  out->resize(produced);
  out->reserve(produced + kJsonPadding);
  return Status::OK();
}

}  // namespace atfill::sources
