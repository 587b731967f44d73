// Relay firehose frames (sources::DecodeFirehoseFrame, and PeekFirehoseFrame, whose head must be
// the decoded frame's when both read it) and the sync 1.1 commit verifier
// (VerifyFirehoseCommit, VerifyFirehoseSync): on any bytes, an error with a kind and a sentence,
// never a crash. A decoded commit is verified with its repo's key when the shared capture has the
// DID's document (so mutations of real frames reach the signature and the MST inversion), and its
// blocks are also read without hash checks and the ops inverted on them with MstEditor, so that
// the editor meets node bytes no hash would let through. Seeds: ours, and each frame of the shared
// relay capture (frames.bin.zst, written to the work folder at start).
#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "atproto/mst_edit.hpp"
#include "sources/crawl/resolver.hpp"
#include "sources/firehose/firehose_frames.hpp"
#include "sources/jetstream/jetstream_frames.hpp"
#include "tests/fuzz/fuzz_util.hpp"

namespace {

namespace atproto = atfill::atproto;
namespace sources = atfill::sources;
using atfill::fuzz::Check;

std::map<std::string, atproto::PublicKey>& Keys() {
  static std::map<std::string, atproto::PublicKey> keys;
  return keys;
}

const atproto::PublicKey& FallbackKey() {
  static const atproto::PublicKey key = [] {
    atfill::Bytes scalar(32, 0x11);
    return atproto::PrivateKey::FromBytes(atproto::KeyType::kSecp256k1, scalar)->public_key();
  }();
  return key;
}

std::string Unzstd(const std::string& packed) {
  auto decoder = sources::ZstdFrameDecoder::Create(nullptr, 64u << 20);
  std::string out, kind;
  Check(decoder.ok() && decoder->Decompress(atfill::AsBytes(packed), &out, &kind).ok(),
        "the shared capture decompresses");
  return out;
}

// The ops inverted onto the frame's blocks read without hash checks; any outcome but a crash.
void InvertUnchecked(const sources::FirehoseCommit& commit) {
  atproto::CarLimits limits;
  limits.verify_hashes = false;
  auto reader = atproto::CarReader::Open(commit.blocks, limits);
  if (!reader.ok()) return;
  atproto::BlockStore blocks;
  if (!atproto::LoadCarBlocks(&*reader, &blocks).ok()) return;
  const auto block = blocks.Get(commit.commit);
  if (!block) return;
  auto signed_commit = atproto::DecodeCommit(*block);
  if (!signed_commit.ok()) return;
  auto editor = atproto::MstEditor::Open(&blocks, signed_commit->data);
  if (!editor.ok()) return;
  for (const sources::FirehoseOp& op : commit.ops) {
    (void)editor->Get(op.path);
    if (op.action == sources::FirehoseAction::kCreate) {
      (void)editor->Delete(op.path);
    } else if (op.prev) {
      (void)editor->Put(op.path, *op.prev);
    }
  }
  (void)editor->Root();
}

}  // namespace

// Each frame of the shared capture becomes a seed in the work folder, and each DID document of
// the capture gives its repo's key.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto frames = atfill::fuzz::ReadSharedFile("internal/corpus/testdata/frames.bin.zst");
  auto docs = atfill::fuzz::ReadSharedFile("internal/corpus/testdata/did_docs.json.zst");
  if (!frames || !docs) return 0;
  const std::string raw = Unzstd(*frames);
  for (size_t pos = 0, i = 0; pos + 4 <= raw.size(); ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(raw.data() + pos);
    const uint32_t len = p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24;
    pos += 4;
    Check(len <= raw.size() - pos, "the shared capture's frames are whole");
    atfill::fuzz::WriteSeed("relay_frame_" + std::to_string(i) + ".cbor", raw.substr(pos, len));
    pos += len;
  }
  simdjson::dom::parser parser;
  simdjson::dom::object object;
  Check(parser.parse(simdjson::padded_string(Unzstd(*docs))).get(object) == simdjson::SUCCESS,
        "the shared DID documents are an object");
  for (auto [did, doc] : object) {
    const sources::ResolveOutcome out =
        sources::ParseDidDocument(did, simdjson::minify(doc), sources::ResolverOptions{}, 0);
    if (!out.ok()) continue;
    auto key = atproto::PublicKey::FromMultibase(out.doc->signing_key);
    if (key.ok()) Keys().emplace(std::string(did), *key);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sources::FirehoseFrame frame;
  std::string kind;
  sources::FirehoseHead head;
  const bool peeked = sources::PeekFirehoseFrame({data, size}, &head);
  const atfill::Status decoded = sources::DecodeFirehoseFrame({data, size}, &frame, &kind);
  if (peeked && decoded.ok()) {
    Check(head.kind == frame.kind() && head.seq == frame.seq() && head.did == frame.did(),
          "the head read is the decoded frame's");
  }
  if (!decoded.ok()) {
    Check(!kind.empty() && !decoded.message().empty(), "a refused frame has a kind and a reason");
    return 0;
  }
  Check(frame.kind() >= sources::FirehoseKind::kInfo || frame.seq() > 0,
        "an event frame has a positive seq");
  if (auto* commit = std::get_if<sources::FirehoseCommit>(&frame.payload)) {
    const auto it = Keys().find(commit->repo);
    const atproto::PublicKey& key = it != Keys().end() ? it->second : FallbackKey();
    sources::VerifiedCommit verified;
    const atfill::Status s = sources::VerifyFirehoseCommit(*commit, key, &verified, &kind);
    if (!s.ok()) {
      Check(!kind.empty() && !s.message().empty(), "a refused commit has a kind and a reason");
    } else {
      Check(verified.ops.size() == commit->ops.size(), "every op of a verified commit is kept");
      Check(verified.commit.did == commit->repo, "the verified commit is the repo's");
      std::vector<atfill::pipeline::Event> events;
      kind.clear();
      const atfill::Status e = sources::FirehoseCommitEvents(
          *commit, verified, atfill::pipeline::Origin::kLive, &events, &kind);
      Check(e.ok() ? events.size() == commit->ops.size() : kind == "bad_record",
            "a verified commit gives one event per op, or a bad record");
    }
    InvertUnchecked(*commit);
  } else if (auto* sync = std::get_if<sources::FirehoseSync>(&frame.payload)) {
    const auto it = Keys().find(sync->did);
    atproto::Commit signed_commit;
    const atfill::Status s = sources::VerifyFirehoseSync(
        *sync, it != Keys().end() ? it->second : FallbackKey(), &signed_commit, &kind);
    Check(s.ok() ? signed_commit.did == sync->did : !kind.empty(),
          "a sync is verified for its DID or refused with a kind");
  }
  return 0;
}
