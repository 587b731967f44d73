#include "state/repo_chains.hpp"

namespace atfill::state {
namespace {

constexpr Family kFamily = Family::kCursors;
constexpr std::string_view kPrefix = "rc/";
constexpr std::string_view kInactivePrefix = "ri/";

std::string Key(std::string_view did, std::string_view prefix = kPrefix) {
  std::string k(prefix);
  k += did;
  return k;
}

Result<RepoChain> Parse(std::string_view did, std::string_view value) {
  const size_t a = value.find('\0');
  const size_t b = a == std::string_view::npos ? a : value.find('\0', a + 1);
  const std::string_view flags = b == std::string_view::npos ? "" : value.substr(b + 1);
  if (b == std::string_view::npos || (flags != "" && flags != "d")) {
    return Status::Corrupt("the commit chain of " + std::string(did) + " is not rev, data, flags");
  }
  return RepoChain{std::string(value.substr(0, a)), std::string(value.substr(a + 1, b - a - 1)),
                   flags == "d"};
}

}  // namespace

std::string_view ChainVerdictName(ChainVerdict verdict) {
  switch (verdict) {
    case ChainVerdict::kApply:
      return "apply";
    case ChainVerdict::kStale:
      return "stale";
    case ChainVerdict::kDesync:
      return "desync";
  }
  return "?";
}

ChainVerdict JudgeCommit(const std::optional<RepoChain>& last, std::string_view rev,
                         std::string_view prev_data, std::string* why) {
  auto say = [why](ChainVerdict v, std::string text) {
    if (why != nullptr) *why = std::move(text);
    return v;
  };
  if (!last) return ChainVerdict::kApply;
  if (last->desynchronized) {
    return say(ChainVerdict::kDesync, "the repo awaits a resync (its chain broke earlier)");
  }
  if (rev <= last->rev) {
    return say(ChainVerdict::kStale,
               "rev " + std::string(rev) + " is not after the applied rev " + last->rev);
  }
  if (prev_data.empty()) {
    return say(ChainVerdict::kDesync, "the commit of rev " + std::string(rev) +
                                          " has no prevData to link it to the applied rev " +
                                          last->rev);
  }
  if (prev_data != last->data) {
    return say(ChainVerdict::kDesync, "the commit of rev " + std::string(rev) + " has prevData " +
                                          std::string(prev_data) + ", not the data " + last->data +
                                          " of the applied rev " + last->rev);
  }
  return ChainVerdict::kApply;
}

Result<std::optional<RepoChain>> RepoChains::Get(std::string_view did) const {
  ATFILL_ASSIGN_OR_RETURN(auto value, kv_.Get(kFamily, Key(did)));
  if (!value) return std::optional<RepoChain>();
  ATFILL_ASSIGN_OR_RETURN(RepoChain chain, Parse(did, *value));
  return std::optional<RepoChain>(std::move(chain));
}

void RepoChains::Set(WriteBatch* batch, std::string_view did, const RepoChain& chain) const {
  std::string value = chain.rev;
  value.push_back('\0');
  value += chain.data;
  value.push_back('\0');
  if (chain.desynchronized) value.push_back('d');
  batch->Put(kFamily, Key(did), value);
}

void RepoChains::Remove(WriteBatch* batch, std::string_view did) const {
  batch->Delete(kFamily, Key(did));
}

Status RepoChains::ScanDesynchronized(
    const std::function<bool(std::string_view, const RepoChain&)>& fn) const {
  Status bad;
  ATFILL_RETURN_IF_ERROR(kv_.Scan(kFamily, kPrefix, [&](std::string_view key, std::string_view v) {
    const std::string_view did = key.substr(kPrefix.size());
    auto chain = Parse(did, v);
    if (!chain.ok()) {
      bad = chain.status();
      return false;
    }
    return !chain->desynchronized || fn(did, *chain);
  }));
  return bad;
}

void RepoChains::SetInactive(WriteBatch* batch, std::string_view did,
                             std::string_view status) const {
  batch->Put(kFamily, Key(did, kInactivePrefix), status);
}

void RepoChains::ClearInactive(WriteBatch* batch, std::string_view did) const {
  batch->Delete(kFamily, Key(did, kInactivePrefix));
}

Status RepoChains::ScanInactive(
    const std::function<bool(std::string_view, std::string_view)>& fn) const {
  return kv_.Scan(kFamily, kInactivePrefix, [&](std::string_view key, std::string_view v) {
    return fn(key.substr(kInactivePrefix.size()), v);
  });
}

}  // namespace atfill::state
