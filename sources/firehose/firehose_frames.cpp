#include "sources/firehose/firehose_frames.hpp"

#include <cstdint>
#include <set>
#include <type_traits>
#include <utility>

#include "atproto/cbor.hpp"
#include "atproto/mst.hpp"
#include "atproto/mst_edit.hpp"
#include "atproto/syntax.hpp"
#include "atproto/tid.hpp"
#include "atproto/value.hpp"

namespace atfill::sources {
namespace {

using atproto::Cid;
using atproto::Value;

Status Fail(std::string* kind, std::string_view k, Status status) {
  if (kind != nullptr) kind->assign(k);
  return status;
}

// Reads the body's fields, naming the frame in every error: "#commit seq 7 of did:plc:x".
class Body {
 public:
  // `owned`, when given, is `body` itself, which Bytes may move from.
  Body(const Value& body, std::string_view type, std::string* kind, Value* owned = nullptr)
      : body_(body), name_(type), kind_(kind), owned_(owned) {}

  void Named(int64_t seq, std::string_view did) {
    name_ += " seq " + std::to_string(seq);
    if (!did.empty()) name_ += " of " + std::string(did);
  }
  const std::string& name() const { return name_; }
  std::string* kind() const { return kind_; }

  Status Error(std::string_view kind, std::string what) const {
    return Fail(kind_, kind, Status::Invalid("firehose " + name_ + ": " + what));
  }

  // The field, nullptr when absent (or null and `null_is_absent`); a required one that is
  // absent is missing_field.
  Result<const Value*> Field(std::string_view key, bool required, bool null_is_absent = true) {
    const Value* v = body_.Find(key);
    if (v != nullptr && null_is_absent && v->is_null()) v = nullptr;
    if (v == nullptr && required) {
      return Error("missing_field", "lacks the field '" + std::string(key) + "'");
    }
    return v;
  }
  Status Typed(const Value* v, Value::Kind want, std::string_view key, const char* what) const {
    if (v != nullptr && v->kind() != want) {
      return Error("bad_frame", "the field '" + std::string(key) + "' is not " + what);
    }
    return Status::OK();
  }
  Status String(std::string_view key, bool required, std::string* out) {
    ATFILL_ASSIGN_OR_RETURN(const Value* v, Field(key, required));
    ATFILL_RETURN_IF_ERROR(Typed(v, Value::Kind::kString, key, "text"));
    if (v != nullptr) *out = v->as_string();
    return Status::OK();
  }
  Status Int(std::string_view key, bool required, int64_t* out) {
    ATFILL_ASSIGN_OR_RETURN(const Value* v, Field(key, required));
    ATFILL_RETURN_IF_ERROR(Typed(v, Value::Kind::kInt, key, "an integer"));
    if (v != nullptr) *out = v->as_int();
    return Status::OK();
  }
  Status Bool(std::string_view key, bool required, bool* out) {
    ATFILL_ASSIGN_OR_RETURN(const Value* v, Field(key, required));
    ATFILL_RETURN_IF_ERROR(Typed(v, Value::Kind::kBool, key, "a boolean"));
    if (v != nullptr) *out = v->as_bool();
    return Status::OK();
  }
  Status Link(std::string_view key, bool required, std::optional<Cid>* out) {
    ATFILL_ASSIGN_OR_RETURN(const Value* v, Field(key, required));
    ATFILL_RETURN_IF_ERROR(Typed(v, Value::Kind::kLink, key, "a CID link"));
    if (v != nullptr) *out = v->as_link();
    return Status::OK();
  }
  // Moves the bytes out when the body is owned (a commit's blocks: up to 2 MB), else copies.
  Status Bytes(std::string_view key, atfill::Bytes* out) {
    ATFILL_ASSIGN_OR_RETURN(const Value* v, Field(key, true));
    ATFILL_RETURN_IF_ERROR(Typed(v, Value::Kind::kBytes, key, "bytes"));
    if (owned_ == nullptr) {
      *out = v->as_bytes();
      return Status::OK();
    }
    for (auto& [name, field] : owned_->as_map()) {
      if (&field == v) *out = std::move(field.as_bytes());
    }
    return Status::OK();
  }

  // seq (> 0) and the DID in `did_key`, which also name the frame from here on.
  Status SeqAndDid(std::string_view did_key, int64_t* seq, std::string* did) {
    ATFILL_RETURN_IF_ERROR(Int("seq", true, seq));
    ATFILL_RETURN_IF_ERROR(String(did_key, true, did));
    Named(*seq, atproto::ValidateDid(*did).ok() ? std::string_view(*did) : "");
    if (*seq <= 0) return Error("bad_seq", "seq " + std::to_string(*seq) + " is not positive");
    if (Status s = atproto::ValidateDid(*did); !s.ok()) return Error("invalid_did", s.message());
    return Status::OK();
  }
  Status Rev(std::string_view key, bool required, std::string* rev) {
    ATFILL_RETURN_IF_ERROR(String(key, required, rev));
    if (rev->empty() && !required) return Status::OK();
    if (Status s = atproto::ValidateTid(*rev); !s.ok()) {
      return Error("invalid_rev", "'" + std::string(key) + "': " + s.message());
    }
    return Status::OK();
  }

 private:
  const Value& body_;
  std::string name_;
  std::string* kind_;
  Value* owned_;
};

Status DecodeOp(Body* body, const Value& value, size_t index, FirehoseOp* op) {
  const std::string where = "op " + std::to_string(index);
  if (value.kind() != Value::Kind::kMap) return body->Error("bad_frame", where + " is not a map");
  Body fields(value, body->name() + " " + where, body->kind());
  std::string action;
  ATFILL_RETURN_IF_ERROR(fields.String("action", true, &action));
  ATFILL_RETURN_IF_ERROR(fields.String("path", true, &op->path));
  ATFILL_RETURN_IF_ERROR(fields.Link("cid", false, &op->cid));
  ATFILL_RETURN_IF_ERROR(fields.Link("prev", false, &op->prev));
  if (action == "create") {
    op->action = FirehoseAction::kCreate;
  } else if (action == "update") {
    op->action = FirehoseAction::kUpdate;
  } else if (action == "delete") {
    op->action = FirehoseAction::kDelete;
  } else {
    return body->Error("unknown_action", where + " has action \"" + action + "\"");
  }
  if (op->action != FirehoseAction::kDelete && !op->cid) {
    return body->Error("bad_frame", where + " (" + action + ") has no record CID");
  }
  Status path = atproto::ValidateMstKey(op->path);
  if (path.ok()) {
    const size_t slash = op->path.find('/');
    path = atproto::ValidateNsid(std::string_view(op->path).substr(0, slash));
    if (path.ok()) path = atproto::ValidateRecordKey(std::string_view(op->path).substr(slash + 1));
  }
  if (!path.ok()) return body->Error("invalid_path", where + ": " + path.message());
  return Status::OK();
}

Status DecodeCommit(Body* body, FirehoseCommit* c) {
  ATFILL_RETURN_IF_ERROR(body->SeqAndDid("repo", &c->seq, &c->repo));
  ATFILL_RETURN_IF_ERROR(body->Rev("rev", true, &c->rev));
  ATFILL_RETURN_IF_ERROR(body->Rev("since", false, &c->since));
  std::optional<Cid> commit;
  ATFILL_RETURN_IF_ERROR(body->Link("commit", true, &commit));
  c->commit = *commit;
  ATFILL_RETURN_IF_ERROR(body->Link("prevData", false, &c->prev_data));
  ATFILL_RETURN_IF_ERROR(body->Bool("tooBig", false, &c->too_big));
  ATFILL_RETURN_IF_ERROR(body->Bool("rebase", false, &c->rebase));
  ATFILL_RETURN_IF_ERROR(body->String("time", true, &c->time));
  ATFILL_ASSIGN_OR_RETURN(const Value* ops, body->Field("ops", true));
  ATFILL_RETURN_IF_ERROR(body->Typed(ops, Value::Kind::kArray, "ops", "an array"));
  c->ops.resize(ops->as_array().size());
  for (size_t i = 0; i < c->ops.size(); ++i) {
    ATFILL_RETURN_IF_ERROR(DecodeOp(body, ops->as_array()[i], i, &c->ops[i]));
  }
  return body->Bytes("blocks", &c->blocks);
}

Status DecodeBody(Body* body, std::string_view type, FirehoseFrame* frame) {
  if (type == "#commit") {
    frame->payload.emplace<FirehoseCommit>();
    return DecodeCommit(body, &std::get<FirehoseCommit>(frame->payload));
  }
  if (type == "#sync") {
    auto& s = frame->payload.emplace<FirehoseSync>();
    ATFILL_RETURN_IF_ERROR(body->SeqAndDid("did", &s.seq, &s.did));
    ATFILL_RETURN_IF_ERROR(body->Rev("rev", true, &s.rev));
    ATFILL_RETURN_IF_ERROR(body->String("time", true, &s.time));
    return body->Bytes("blocks", &s.blocks);
  }
  if (type == "#identity") {
    auto& i = frame->payload.emplace<FirehoseIdentity>();
    ATFILL_RETURN_IF_ERROR(body->SeqAndDid("did", &i.seq, &i.did));
    ATFILL_RETURN_IF_ERROR(body->String("handle", false, &i.handle));
    return body->String("time", true, &i.time);
  }
  if (type == "#account") {
    auto& a = frame->payload.emplace<FirehoseAccount>();
    ATFILL_RETURN_IF_ERROR(body->SeqAndDid("did", &a.seq, &a.did));
    ATFILL_RETURN_IF_ERROR(body->Bool("active", true, &a.active));
    ATFILL_RETURN_IF_ERROR(body->String("status", false, &a.status));
    return body->String("time", true, &a.time);
  }
  auto& info = frame->payload.emplace<FirehoseInfo>();
  ATFILL_RETURN_IF_ERROR(body->String("name", true, &info.name));
  return body->String("message", false, &info.message);
}

// The kind a failed MST read or edit gives: a node not at hand, or a malformed one.
Status MstFail(std::string* kind, const std::string& name, const Status& s) {
  const bool missing = s.code() == StatusCode::kNotFound;
  return Fail(kind, missing ? "incomplete_proof" : "bad_mst",
              Status::Invalid("firehose " + name + ": " + s.message()));
}

// The CAR's blocks into *blocks, and the signed commit `commit_cid` checked against `did`, `rev`
// and `key`.
Status VerifySigned(ByteView car, const Cid& commit_cid, std::string_view did, std::string_view rev,
                    const atproto::PublicKey& key, const std::string& name,
                    atproto::BlockStore* blocks, atproto::Commit* commit, std::string* kind) {
  auto invalid = [&](std::string_view k, std::string what) {
    return Fail(kind, k, Status::Invalid("firehose " + name + ": " + what));
  };
  auto reader = atproto::CarReader::Open(car);
  if (!reader.ok()) return invalid("bad_car", "blocks: " + reader.status().message());
  if (auto loaded = atproto::LoadCarBlocks(&*reader, blocks); !loaded.ok()) {
    return invalid("bad_car", "blocks: " + loaded.status().message());
  }
  const std::optional<ByteView> block = blocks->Get(commit_cid);
  if (!block) return invalid("no_commit_block", "no block for commit " + commit_cid.ToString());
  Bytes unsigned_bytes;
  auto decoded = atproto::DecodeCommit(*block, &unsigned_bytes);
  if (!decoded.ok()) return invalid("bad_commit", "commit: " + decoded.status().message());
  if (decoded->did != did) {
    return invalid("bad_commit", "the commit is signed for " + decoded->did);
  }
  if (decoded->rev != rev) {
    return invalid("bad_commit",
                   "the commit has rev " + decoded->rev + ", the frame " + std::string(rev));
  }
  if (Status s = key.Verify(unsigned_bytes, decoded->sig); !s.ok()) {
    return invalid("bad_signature", "the commit signature does not verify with " + key.ToDidKey() +
                                        ": " + s.message());
  }
  *commit = std::move(*decoded);
  return Status::OK();
}

}  // namespace

std::string_view FirehoseKindName(FirehoseKind kind) {
  switch (kind) {
    case FirehoseKind::kCommit:
      return "commit";
    case FirehoseKind::kSync:
      return "sync";
    case FirehoseKind::kIdentity:
      return "identity";
    case FirehoseKind::kAccount:
      return "account";
    case FirehoseKind::kInfo:
      return "info";
    case FirehoseKind::kError:
      return "error";
  }
  return "unknown";
}

int64_t FirehoseFrame::seq() const {
  return std::visit(
      [](const auto& p) -> int64_t {
        if constexpr (requires { p.seq; }) {
          return p.seq;
        } else {
          return 0;
        }
      },
      payload);
}

std::string_view FirehoseFrame::did() const {
  return std::visit(
      [](const auto& p) -> std::string_view {
        if constexpr (requires { p.repo; }) {
          return p.repo;
        } else if constexpr (requires { p.did; }) {
          return p.did;
        } else {
          return {};
        }
      },
      payload);
}

Status DecodeFirehoseFrame(ByteView bytes, FirehoseFrame* frame, std::string* error_kind) {
  const std::string size = "frame of " + std::to_string(bytes.size()) + " bytes";
  if (bytes.size() > kMaxFirehoseFrameBytes) {
    return Fail(error_kind, "bad_frame",
                Status::OutOfRange("firehose " + size + " exceeds the limit of " +
                                   std::to_string(kMaxFirehoseFrameBytes)));
  }
  atproto::CborLimits limits;
  limits.max_bytes = kMaxFirehoseFrameBytes;
  size_t header_bytes = 0;
  auto header = atproto::DecodeCborPrefix(bytes, &header_bytes, limits);
  if (!header.ok()) {
    return Fail(error_kind, "bad_cbor",
                Status::Invalid("firehose " + size + ": header: " + header.status().message()));
  }
  auto body = atproto::DecodeCbor(bytes.subspan(header_bytes), limits);
  if (!body.ok()) {
    return Fail(error_kind, "bad_cbor",
                Status::Invalid("firehose " + size + ": body: " + body.status().message()));
  }
  const Value* op = header->Find("op");
  const Value* t = header->Find("t");
  auto bad_header = [&](std::string what) {
    return Fail(error_kind, "bad_header", Status::Invalid("firehose " + size + ": " + what));
  };
  if (op == nullptr || op->kind() != Value::Kind::kInt) {
    return bad_header("the header has no integer 'op'");
  }
  if (body->kind() != Value::Kind::kMap) return bad_header("the body is not a map");
  if (op->as_int() == -1) {
    Body fields(*body, "error frame", error_kind);
    auto& error = frame->payload.emplace<FirehoseError>();
    ATFILL_RETURN_IF_ERROR(fields.String("error", true, &error.name));
    return fields.String("message", false, &error.message);
  }
  if (op->as_int() != 1) return bad_header("the header has op " + std::to_string(op->as_int()));
  if (t == nullptr || t->kind() != Value::Kind::kString) {
    return bad_header("the header has no text 't'");
  }
  const std::string& type = t->as_string();
  if (type != "#commit" && type != "#sync" && type != "#identity" && type != "#account" &&
      type != "#info") {
    return Fail(error_kind, "unknown_type",
                Status::Unsupported("firehose " + size + ": unknown message type \"" +
                                    type.substr(0, 64) + "\""));
  }
  Body fields(*body, type, error_kind, &*body);
  return DecodeBody(&fields, type, frame);
}

bool PeekFirehoseFrame(ByteView bytes, FirehoseHead* head) {
  if (bytes.size() > kMaxFirehoseFrameBytes) return false;
  atproto::CborReader c(bytes);
  uint8_t major = 0;
  uint64_t n = 0;
  if (!c.Head(&major, &n) || major != 5) return false;
  bool op_one = false;
  std::string_view type;
  for (uint64_t i = 0; i < n; ++i) {
    std::string_view key;
    if (!c.Text(&key)) return false;
    if (key == "op") {
      uint64_t v = 0;
      if (!c.Head(&major, &v)) return false;
      op_one = major == 0 && v == 1;
    } else if (key == "t") {
      if (!c.Text(&type)) return false;
    } else if (!c.Skip()) {
      return false;
    }
  }
  if (!op_one) return false;
  if (type == "#commit") {
    head->kind = FirehoseKind::kCommit;
  } else if (type == "#sync") {
    head->kind = FirehoseKind::kSync;
  } else if (type == "#identity") {
    head->kind = FirehoseKind::kIdentity;
  } else if (type == "#account") {
    head->kind = FirehoseKind::kAccount;
  } else {
    return false;
  }
  const std::string_view did_key = head->kind == FirehoseKind::kCommit ? "repo" : "did";
  if (!c.Head(&major, &n) || major != 5) return false;
  bool seq = false, did = false;
  head->time.clear();
  for (uint64_t i = 0; i < n; ++i) {
    std::string_view key, text;
    if (!c.Text(&key)) return false;
    if (key == "seq") {
      uint64_t v = 0;
      if (!c.Head(&major, &v) || major != 0 || v == 0 || v > INT64_MAX) return false;
      head->seq = static_cast<int64_t>(v);
      seq = true;
    } else if (key == did_key) {
      if (!c.Text(&text)) return false;
      head->did.assign(text);
      did = true;
    } else if (key == "time") {
      if (!c.Text(&text)) return false;
      head->time.assign(text);
    } else if (!c.Skip()) {
      return false;
    }
  }
  return seq && did && c.pos() == bytes.size();
}

Status VerifyFirehoseCommit(const FirehoseCommit& frame, const atproto::PublicKey& key,
                            VerifiedCommit* out, std::string* error_kind) {
  const std::string name = "#commit seq " + std::to_string(frame.seq) + " of " + frame.repo;
  auto invalid = [&](std::string_view k, std::string what) {
    return Fail(error_kind, k, Status::Invalid("firehose " + name + ": " + what));
  };
  *out = VerifiedCommit();
  if (frame.too_big) return invalid("too_big", "tooBig: its blocks are incomplete");
  ATFILL_RETURN_IF_ERROR(VerifySigned(frame.blocks, frame.commit, frame.repo, frame.rev, key, name,
                                      &out->blocks, &out->commit, error_kind));
  out->ops.reserve(frame.ops.size());
  std::set<std::string_view> paths;
  for (const FirehoseOp& op : frame.ops) {
    const std::string where = "op on " + op.path;
    if (!paths.insert(op.path).second) return invalid("bad_op", "two ops on " + op.path);
    const bool create = op.action == FirehoseAction::kCreate;
    const bool del = op.action == FirehoseAction::kDelete;
    if (create && op.prev) return invalid("bad_op", "the create " + where + " has a prev");
    if (!create && !op.prev) return invalid("bad_op", "the " + where + " has no prev");
    if (del && op.cid) return invalid("bad_op", "the delete " + where + " has a record CID");
    VerifiedOp& v = out->ops.emplace_back();
    v.action = op.action;
    const size_t slash = op.path.find('/');
    v.collection = std::string_view(op.path).substr(0, slash);
    v.rkey = std::string_view(op.path).substr(slash + 1);
    v.cid = op.cid;
    if (!del) {
      const std::optional<ByteView> record = out->blocks.Get(*op.cid);
      if (!record) {
        return invalid("missing_record",
                       "no block for the record " + op.cid->ToString() + " of the " + where);
      }
      v.record = *record;
    }
  }
  auto editor = atproto::MstEditor::Open(&out->blocks, out->commit.data);
  if (!editor.ok()) return MstFail(error_kind, name, editor.status());
  for (const FirehoseOp& op : frame.ops) {
    auto held = editor->Get(op.path);
    if (!held.ok()) return MstFail(error_kind, name, held.status());
    if (*held != op.cid) {
      return invalid("op_mismatch", "the commit's tree holds " +
                                        (*held ? (*held)->ToString() : std::string("nothing")) +
                                        " at " + op.path + ", the op says " +
                                        (op.cid ? op.cid->ToString() : std::string("nothing")));
    }
  }
  // A repo's first commit (no previous rev) inverts onto the empty tree; any other commit must
  // name the tree it follows.
  const bool genesis = !frame.prev_data && frame.since.empty();
  if (!frame.prev_data && !genesis) {
    return invalid("no_prev_data", "no prevData to check the ops against");
  }
  for (const FirehoseOp& op : frame.ops) {
    const Status s = op.action == FirehoseAction::kCreate ? editor->Delete(op.path)
                                                          : editor->Put(op.path, *op.prev);
    if (!s.ok()) return MstFail(error_kind, name, s);
  }
  auto root = editor->Root();
  if (!root.ok()) return MstFail(error_kind, name, root.status());
  if (genesis) {
    atproto::MstEditor empty(&out->blocks);
    auto empty_root = empty.Root();
    if (!empty_root.ok()) return MstFail(error_kind, name, empty_root.status());
    if (*root != *empty_root) {
      return invalid("inversion_mismatch",
                     "the ops of a first commit (no since, no prevData) "
                     "inverted give the tree " +
                         root->ToString() + ", not the empty tree");
    }
    return Status::OK();
  }
  if (*root != *frame.prev_data) {
    return invalid("inversion_mismatch", "the ops inverted give the tree " + root->ToString() +
                                             ", not prevData " + frame.prev_data->ToString());
  }
  return Status::OK();
}

Status VerifyFirehoseSync(const FirehoseSync& frame, const atproto::PublicKey& key,
                          atproto::Commit* commit, std::string* error_kind) {
  const std::string name = "#sync seq " + std::to_string(frame.seq) + " of " + frame.did;
  auto reader = atproto::CarReader::Open(frame.blocks);
  if (!reader.ok() || reader->roots().empty()) {
    return Fail(error_kind, "bad_car",
                Status::Invalid("firehose " + name + ": blocks: " +
                                (reader.ok() ? "no root" : reader.status().message())));
  }
  atproto::BlockStore blocks;
  return VerifySigned(frame.blocks, reader->roots().front(), frame.did, frame.rev, key, name,
                      &blocks, commit, error_kind);
}

Status FirehoseCommitEvents(const FirehoseCommit& frame, const VerifiedCommit& verified,
                            pipeline::Origin origin, std::vector<pipeline::Event>* events,
                            std::string* error_kind) {
  for (const VerifiedOp& op : verified.ops) {
    pipeline::RecordEvent e;
    e.did = frame.repo;
    e.collection = op.collection;
    e.rkey = op.rkey;
    e.operation = op.action == FirehoseAction::kCreate   ? pipeline::Operation::kCreate
                  : op.action == FirehoseAction::kUpdate ? pipeline::Operation::kUpdate
                                                         : pipeline::Operation::kDelete;
    e.rev = frame.rev;
    e.origin = origin;
    e.position = static_cast<uint64_t>(frame.seq);
    if (op.cid) {
      e.cid = *op.cid;
      if (Status s = atproto::CborRecordToJson(op.record, &e.body, &e.created_at); !s.ok()) {
        return Fail(error_kind, "bad_record",
                    Status::Invalid("firehose #commit seq " + std::to_string(frame.seq) + ": " +
                                    e.Uri() + ": " + s.message()));
      }
    }
    events->push_back(std::move(e));
  }
  return Status::OK();
}

namespace {

Value LinkOrNull(const std::optional<Cid>& cid) { return cid ? Value::Link(*cid) : Value::Null(); }

Value::Map BodyOf(const FirehoseFrame::Payload& payload, std::string* type) {
  return std::visit(
      [&](const auto& p) -> Value::Map {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, FirehoseCommit>) {
          *type = "#commit";
          Value::Array ops;
          for (const FirehoseOp& op : p.ops) {
            Value::Map m{
                {"action", Value::String(op.action == FirehoseAction::kCreate   ? "create"
                                         : op.action == FirehoseAction::kUpdate ? "update"
                                                                                : "delete")},
                {"path", Value::String(op.path)},
                {"cid", LinkOrNull(op.cid)}};
            if (op.prev) m.emplace_back("prev", Value::Link(*op.prev));
            ops.push_back(Value::MakeMap(std::move(m)));
          }
          Value::Map m{{"seq", Value::Int(p.seq)},
                       {"repo", Value::String(p.repo)},
                       {"rev", Value::String(p.rev)},
                       {"since", p.since.empty() ? Value::Null() : Value::String(p.since)},
                       {"commit", Value::Link(p.commit)},
                       {"blocks", Value::BytesValue(p.blocks)},
                       {"ops", Value::MakeArray(std::move(ops))},
                       {"blobs", Value::MakeArray()},
                       {"rebase", Value::Bool(p.rebase)},
                       {"tooBig", Value::Bool(p.too_big)},
                       {"time", Value::String(p.time)}};
          if (p.prev_data) m.emplace_back("prevData", Value::Link(*p.prev_data));
          return m;
        } else if constexpr (std::is_same_v<T, FirehoseSync>) {
          *type = "#sync";
          return {{"seq", Value::Int(p.seq)},
                  {"did", Value::String(p.did)},
                  {"rev", Value::String(p.rev)},
                  {"blocks", Value::BytesValue(p.blocks)},
                  {"time", Value::String(p.time)}};
        } else if constexpr (std::is_same_v<T, FirehoseIdentity>) {
          *type = "#identity";
          Value::Map m{{"seq", Value::Int(p.seq)},
                       {"did", Value::String(p.did)},
                       {"time", Value::String(p.time)}};
          if (!p.handle.empty()) m.emplace_back("handle", Value::String(p.handle));
          return m;
        } else if constexpr (std::is_same_v<T, FirehoseAccount>) {
          *type = "#account";
          Value::Map m{{"seq", Value::Int(p.seq)},
                       {"did", Value::String(p.did)},
                       {"active", Value::Bool(p.active)},
                       {"time", Value::String(p.time)}};
          if (!p.status.empty()) m.emplace_back("status", Value::String(p.status));
          return m;
        } else if constexpr (std::is_same_v<T, FirehoseInfo>) {
          *type = "#info";
          Value::Map m{{"name", Value::String(p.name)}};
          if (!p.message.empty()) m.emplace_back("message", Value::String(p.message));
          return m;
        } else {
          type->clear();
          Value::Map m{{"error", Value::String(p.name)}};
          if (!p.message.empty()) m.emplace_back("message", Value::String(p.message));
          return m;
        }
      },
      payload);
}

}  // namespace

Bytes EncodeFirehoseFrame(const FirehoseFrame& frame) {
  std::string type;
  Value body = Value::MakeMap(BodyOf(frame.payload, &type));
  Value header = type.empty() ? Value::MakeMap({{"op", Value::Int(-1)}})
                              : Value::MakeMap({{"op", Value::Int(1)}, {"t", Value::String(type)}});
  header.Canonicalize();
  body.Canonicalize();
  Bytes out = atproto::EncodeCbor(header);
  atproto::EncodeCbor(body, &out);
  return out;
}

Result<FirehoseCommit> BuildFirehoseCommit(std::string_view did, std::string_view rev,
                                           std::string_view since,
                                           std::map<std::string, Bytes>* records,
                                           const std::vector<RepoWrite>& writes,
                                           const atproto::PrivateKey& key, int64_t seq) {
  auto tree = [](const std::map<std::string, Bytes>& recs, atproto::BlockStore* store) {
    std::vector<atproto::MstEntry> entries;
    entries.reserve(recs.size());
    for (const auto& [path, block] : recs) {
      entries.push_back({path, Cid::Compute(Cid::Codec::kDagCbor, block)});
    }
    return atproto::BuildMst(entries, store);
  };
  atproto::BlockStore before_store;
  ATFILL_ASSIGN_OR_RETURN(Cid before, tree(*records, &before_store));
  FirehoseCommit c;
  c.seq = seq;
  c.repo = std::string(did);
  c.rev = std::string(rev);
  c.since = std::string(since);
  c.prev_data = before;
  c.time = "2024-01-01T00:00:00.000Z";
  std::set<std::string_view> paths;
  for (const RepoWrite& w : writes) {
    if (!paths.insert(w.path).second) return Status::Invalid("two writes on " + w.path);
    auto it = records->find(w.path);
    const bool present = it != records->end();
    if (present == (w.action == FirehoseAction::kCreate)) {
      return Status::Invalid("a write does not fit the repo at " + w.path);
    }
    FirehoseOp op{w.action, w.path, std::nullopt, std::nullopt};
    if (present) op.prev = Cid::Compute(Cid::Codec::kDagCbor, it->second);
    if (w.action == FirehoseAction::kDelete) {
      records->erase(it);
    } else {
      op.cid = Cid::Compute(Cid::Codec::kDagCbor, w.record);
      (*records)[w.path] = w.record;
    }
    c.ops.push_back(std::move(op));
  }
  atproto::BlockStore after_store;
  ATFILL_ASSIGN_OR_RETURN(Cid after, tree(*records, &after_store));
  atproto::Commit commit;
  commit.did = std::string(did);
  commit.data = after;
  commit.rev = std::string(rev);
  ATFILL_ASSIGN_OR_RETURN(Bytes commit_block, atproto::SignCommit(&commit, key));
  c.commit = Cid::Compute(Cid::Codec::kDagCbor, commit_block);
  std::vector<Cid> proof;
  for (const RepoWrite& w : writes) {
    ATFILL_RETURN_IF_ERROR(atproto::MstCoveringProof(after_store, after, w.path, &proof));
  }
  atproto::CarWriter car(std::vector<Cid>{c.commit});
  ATFILL_RETURN_IF_ERROR(car.Add(c.commit, commit_block));
  for (const Cid& cid : proof) ATFILL_RETURN_IF_ERROR(car.Add(cid, *after_store.Get(cid)));
  for (const RepoWrite& w : writes) {
    if (w.action != FirehoseAction::kDelete)
      ATFILL_RETURN_IF_ERROR(car.AddBlock(w.record).status());
  }
  c.blocks = car.TakeBytes();
  return c;
}

}  // namespace atfill::sources
