// The getRepo?since half of the crawl's repo reading (sources/crawl/repo_diff.hpp).
#include "sources/crawl/repo_diff.hpp"

#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "atproto/car.hpp"
#include "atproto/cbor.hpp"
#include "atproto/mst.hpp"
#include "base/bytes.hpp"

namespace atfill::sources {
namespace {

// An MST has at most 129 layers (key heights 0..128); a deeper chain of nodes is malformed.
constexpr int kMaxMstDepth = 130;

// True when `car` is a CAR header followed by no block: the answer to since=<head>.
bool HeaderOnly(std::string_view car) {
  auto reader = atproto::CarReader::Open(AsBytes(car));
  if (!reader.ok()) return false;
  atproto::CarBlock block;
  auto more = reader->Next(&block);
  return more.ok() && !*more;
}

enum class Presence : uint8_t { kPresent, kAbsent, kUnchangedSubtree };

struct Found {
  Presence presence = Presence::kAbsent;
  // kUnchangedSubtree: the subtree's layer and the keys around it (the keys of a greater height
  // nearest to it; empty = no bound).
  int layer = 0;
  std::string lo, hi;
};

// The nodes of the new tree the answer holds, each decoded once.
using Nodes = std::unordered_map<atproto::Cid, atproto::MstNode>;

// Whether `key` is in the tree at `root` as far as `nodes` tell. A node of layer L
// holds the keys of height L, its subtrees those below: so a key is absent when the walk meets a
// node of its own layer (or one below its height) without it, or an empty place; when the walk
// needs a node the answer lacks, the key's place is a subtree unchanged since REV.
Result<Found> Lookup(const Nodes& nodes, const atproto::Cid& root, std::string_view key) {
  const int height = atproto::MstKeyHeight(key);
  atproto::Cid at = root;
  Found out;
  int layer = -1;  // of the node `at`, once known (its parent's minus one)
  for (int depth = 0; depth <= kMaxMstDepth; ++depth) {
    auto it = nodes.find(at);
    if (it == nodes.end()) {
      out.presence = Presence::kUnchangedSubtree;
      out.layer = layer;
      return out;
    }
    const atproto::MstNode& node = it->second;
    if (node.entries.empty()) {
      // The empty tree, or a node standing for a layer with no key on the way down.
      if (!node.left || (layer >= 0 && height >= layer)) return out;
      at = *node.left;
      if (layer >= 0) --layer;
      continue;
    }
    const int node_layer = atproto::MstKeyHeight(node.entries.front().key);
    std::optional<atproto::Cid> next = node.left;
    for (const atproto::MstNode::Entry& e : node.entries) {
      if (e.key == key) {
        out.presence = Presence::kPresent;
        return out;
      }
      if (e.key > key) {
        out.hi = e.key;
        break;
      }
      out.lo = e.key;
      next = e.tree;
    }
    if (height >= node_layer || !next) return out;
    at = *next;
    layer = node_layer - 1;
  }
  return Status::Invalid("nodes nest deeper than an MST can");
}

}  // namespace

Result<RepoDiff> ReadRepoDiff(std::string_view did, std::string_view signing_key,
                              std::string_view car, std::span<const pipeline::StoredRecord> stored,
                              const std::vector<std::string>& collections,
                              const FetchLimits& limits, RepoFailure* failure) {
  RepoFailure ignored;
  RepoFailure& why = failure != nullptr ? *failure : ignored;
  why = RepoFailure::kNone;
  RepoDiff out;
  if (HeaderOnly(car)) {
    out.unchanged = true;
    return out;
  }
  ATFILL_ASSIGN_OR_RETURN(atproto::RepoReader reader,
                          OpenSignedRepo(did, signing_key, car, limits, &why));
  const atproto::Commit& commit = reader.commit();
  const atproto::BlockStore& blocks = reader.blocks();
  out.rev = commit.rev;
  out.commit_cid = reader.commit_cid().ToString();
  out.data_cid = commit.data.ToString();
  const auto bad_repo = [&](const Status& s) {
    why = RepoFailure::kBadRepo;
    return Status(s.code(), "repo " + std::string(did) + ": its MST from commit " + out.commit_cid +
                                " is malformed: " + s.message());
  };

  // The keys of the nodes the answer holds: the new tree's, where it changed since REV.
  std::map<std::string, atproto::Cid> held;
  Nodes nodes;
  std::function<Status(const atproto::Cid&, int)> walk = [&](const atproto::Cid& cid,
                                                             int depth) -> Status {
    auto block = blocks.Get(cid);
    if (!block) return Status::OK();  // unchanged since REV
    if (depth > kMaxMstDepth) return Status::Invalid("nodes nest deeper than an MST can");
    if (nodes.count(cid)) return Status::Invalid("node " + cid.ToString() + " is linked twice");
    ++out.nodes_read;
    ATFILL_ASSIGN_OR_RETURN(atproto::MstNode decoded, atproto::DecodeMstNode(*block));
    const atproto::MstNode& node = nodes.emplace(cid, std::move(decoded)).first->second;
    if (node.left) ATFILL_RETURN_IF_ERROR(walk(*node.left, depth + 1));
    for (const atproto::MstNode::Entry& e : node.entries) {
      held[e.key] = e.value;
      if (e.tree) ATFILL_RETURN_IF_ERROR(walk(*e.tree, depth + 1));
    }
    return Status::OK();
  };
  if (Status s = walk(commit.data, 0); !s.ok()) return bad_repo(s);

  std::map<std::string, const pipeline::StoredRecord*> by_key;
  for (const pipeline::StoredRecord& s : stored) by_key[s.collection + "/" + s.rkey] = &s;
  const auto uri = [&](std::string_view key) {
    return "at://" + std::string(did) + "/" + std::string(key);
  };

  std::vector<pipeline::RecordEvent> deletes;
  // Stored keys the new tree lacks (by key, their height), and the stored keys found under a
  // subtree unchanged since REV.
  std::map<std::string, int> absent;
  for (const auto& [key, cid] : held) {
    const size_t slash = key.find('/');
    if (slash == std::string::npos) continue;  // DecodeMstNode accepts only collection/rkey keys
    const std::string collection = key.substr(0, slash);
    if (!pipeline::CollectionMatches(collection, collections)) continue;
    auto was = by_key.find(key);
    const bool stored_here = was != by_key.end();
    if (stored_here && was->second->cid == cid.ToString()) continue;
    auto block = blocks.Get(cid);
    if (!block) {
      out.needs_full = true;
      continue;
    }
    if (block->size() > limits.max_record_bytes) {
      out.errors.push_back({"oversize_record", uri(key),
                            "record block is " + std::to_string(block->size()) +
                                " bytes, more than the limit of " +
                                std::to_string(limits.max_record_bytes)});
      continue;
    }
    pipeline::RecordEvent r;
    if (Status st = atproto::CborRecordToJson(*block, &r.body, &r.created_at); !st.ok()) {
      out.errors.push_back(
          {"bad_record", uri(key), "record block " + cid.ToString() + ": " + st.message()});
      continue;
    }
    if (r.body.size() > limits.max_record_bytes) {
      out.errors.push_back({"oversize_record", uri(key),
                            "record is " + std::to_string(r.body.size()) +
                                " bytes of JSON, more than the limit of " +
                                std::to_string(limits.max_record_bytes)});
      continue;
    }
    r.did.assign(did);
    r.collection = collection;
    r.rkey = key.substr(slash + 1);
    r.operation = stored_here ? pipeline::Operation::kUpdate : pipeline::Operation::kCreate;
    r.cid = cid;
    r.rev = commit.rev;
    r.origin = pipeline::Origin::kCrawl;
    out.events.push_back(std::move(r));
  }
  // Every stored key is looked up, of every collection, so that the subtrees' places below are
  // judged with all the keys the table holds; only the wanted collections' deletes are made.
  std::map<std::string, Found> unchanged;  // stored keys under a subtree unchanged since REV
  for (const auto& [key, s] : by_key) {
    if (held.count(key)) continue;
    Result<Found> found = Lookup(nodes, commit.data, key);
    if (!found.ok()) return bad_repo(found.status());
    if (found->presence == Presence::kUnchangedSubtree) unchanged.emplace(key, *found);
    if (found->presence != Presence::kAbsent) continue;
    absent[key] = atproto::MstKeyHeight(key);
    if (!pipeline::CollectionMatches(s->collection, collections)) continue;
    pipeline::RecordEvent d;
    d.did.assign(did);
    d.collection = s->collection;
    d.rkey = s->rkey;
    d.operation = pipeline::Operation::kDelete;
    d.rev = commit.rev;
    d.origin = pipeline::Origin::kCrawl;
    deletes.push_back(std::move(d));
  }
  // A key x under an unchanged subtree S (layer L, between the keys lo and hi of a greater
  // height) is in S unless S sat in another segment of that place at REV: the segments were
  // split by keys of a height above L that are gone now (absent, between lo and hi), and every
  // key of the segments other than S's is gone. So x may be gone only when beyond such a key,
  // on the side away from x, there is a stored key under S too, or a range of keys the table may
  // not hold (another collection, or no bound): then the answer cannot tell, and the whole repo
  // is needed.
  const auto collection_of = [](std::string_view k) { return k.substr(0, k.find('/')); };
  for (const auto& [x, f] : unchanged) {
    if (!pipeline::CollectionMatches(collection_of(x), collections)) continue;
    auto y = f.lo.empty() ? absent.begin() : absent.upper_bound(f.lo);
    for (; y != absent.end() && (f.hi.empty() || y->first < f.hi); ++y) {
      if (f.layer >= 0 && y->second <= f.layer) continue;
      // The side of y away from x: (y, hi) when x < y, else (lo, y).
      const bool right = x < y->first;
      const std::string_view bound = right ? std::string_view(f.hi) : std::string_view(f.lo);
      bool open = bound.empty() || collection_of(bound) != collection_of(x) ||
                  collection_of(y->first) != collection_of(x);
      if (!open) {
        auto z = right ? unchanged.upper_bound(y->first) : unchanged.upper_bound(f.lo);
        const std::string& end = right ? f.hi : y->first;
        open =
            z != unchanged.end() && z->first < end && z->second.lo == f.lo && z->second.hi == f.hi;
      }
      if (open) {
        out.needs_full = true;
        break;
      }
    }
    if (out.needs_full) break;
  }
  for (auto& d : deletes) out.events.push_back(std::move(d));
  return out;
}

}  // namespace atfill::sources
