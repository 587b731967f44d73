#include "state/live_holds.hpp"

#include "base/patterns.hpp"
#include "state/codec.hpp"

namespace atfill::state {
namespace {

constexpr Family kFamily = Family::kQueue;

std::string Key(std::string_view tag, std::string_view did) {
  std::string k(tag);
  k += did;
  return k;
}

std::string HeldPrefix(std::string_view did) {
  std::string k = Key("hb", did);
  k.push_back('\0');
  return k;
}

}  // namespace

void LiveHolds::MarkQueued(WriteBatch* batch, std::string_view did) const {
  batch->Add(kFamily, Key("ha", did), 1);
}

void LiveHolds::MarkFinished(WriteBatch* batch, std::string_view did) const {
  batch->Add(kFamily, Key("ha", did), -1);
  batch->Put(kFamily, Key("hc", did), "");
}

void LiveHolds::SetCheckpointRev(WriteBatch* batch, std::string_view did, std::string_view rev,
                                 const std::vector<std::string>& collections) const {
  std::string value(rev);
  for (const auto& c : collections) value += "\n" + c;
  batch->Put(kFamily, Key("hc", did), value);
}

HoldCheckpoint HoldCheckpoint::Parse(std::string_view value) {
  HoldCheckpoint c;
  size_t nl = value.find('\n');
  c.rev = std::string(value.substr(0, nl));
  while (nl != std::string_view::npos) {
    const size_t start = nl + 1;
    nl = value.find('\n', start);
    c.collections.emplace_back(value.substr(start, nl == std::string_view::npos ? nl : nl - start));
  }
  return c;
}

bool HoldCheckpoint::Covers(std::string_view collection) const {
  return MatchesAnyPattern(collections, collection);
}

Result<int64_t> LiveHolds::Unfinished(std::string_view did) const {
  ATFILL_ASSIGN_OR_RETURN(auto v, kv_.Get(kFamily, Key("ha", did)));
  if (!v) return int64_t{0};
  ATFILL_ASSIGN_OR_RETURN(uint64_t n, DecodeCounter(*v, "live hold count of " + std::string(did)));
  return static_cast<int64_t>(n);
}

Result<std::optional<std::string>> LiveHolds::Checkpoint(std::string_view did) const {
  return kv_.Get(kFamily, Key("hc", did));
}

Status LiveHolds::ScanCheckpoints(
    const std::function<bool(std::string_view, std::string_view)>& fn) const {
  return kv_.Scan(kFamily, "hc", [&](std::string_view key, std::string_view value) {
    return fn(key.substr(2), value);
  });
}

Status LiveHolds::ScanHeldRepos(const std::function<bool(std::string_view)>& fn) const {
  // Repos with marks (a crawl that stopped before finishing them) and repos with held events.
  bool go = true;
  ATFILL_RETURN_IF_ERROR(kv_.Scan(kFamily, "ha", [&](std::string_view key, std::string_view) {
    go = fn(key.substr(2));
    return go;
  }));
  if (!go) return Status::OK();
  std::string last;
  return kv_.Scan(kFamily, "hb", [&](std::string_view key, std::string_view) {
    const size_t nul = key.find('\0', 2);
    std::string_view did = key.substr(2, nul == std::string_view::npos ? key.size() : nul - 2);
    if (did == last) return true;
    last = std::string(did);
    return fn(did);
  });
}

void LiveHolds::Hold(WriteBatch* batch, std::string_view did, uint64_t order,
                     std::string_view event) const {
  std::string key = HeldPrefix(did);
  codec::AppendBe64(&key, order);
  batch->Put(kFamily, key, event);
}

Status LiveHolds::ScanHeld(std::string_view did,
                           const std::function<bool(uint64_t, std::string_view)>& fn) const {
  const std::string prefix = HeldPrefix(did);
  Status bad = Status::OK();
  ATFILL_RETURN_IF_ERROR(kv_.Scan(kFamily, prefix, [&](std::string_view key, std::string_view v) {
    uint64_t order = 0;
    if (key.size() != prefix.size() + 8 || !codec::ReadBe64(key, prefix.size(), &order)) {
      bad = Status::Corrupt("a held live event of " + std::string(did) + " has a malformed key");
      return false;
    }
    return fn(order, v);
  }));
  return bad;
}

void LiveHolds::Release(WriteBatch* batch, std::string_view did,
                        const std::vector<uint64_t>& orders) const {
  batch->Delete(kFamily, Key("ha", did));
  batch->Delete(kFamily, Key("hc", did));
  const std::string prefix = HeldPrefix(did);
  for (uint64_t order : orders) {
    std::string key = prefix;
    codec::AppendBe64(&key, order);
    batch->Delete(kFamily, key);
  }
}

}  // namespace atfill::state
