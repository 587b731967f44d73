#include "state/lexicon_store.hpp"

namespace atfill::state {
namespace {

constexpr std::string_view kPrefix = "lexicon/";

std::string Key(std::string_view nsid) { return std::string(kPrefix) + std::string(nsid); }

}  // namespace

Status LexiconStore::Put(std::string_view nsid, std::string_view document) {
  WriteBatch batch;
  batch.Put(Family::kMeta, Key(nsid), document);
  return kv_.Write(batch);
}

Status LexiconStore::Delete(std::string_view nsid) {
  WriteBatch batch;
  batch.Delete(Family::kMeta, Key(nsid));
  return kv_.Write(batch);
}

Result<std::vector<std::pair<std::string, std::string>>> LexiconStore::List() const {
  std::vector<std::pair<std::string, std::string>> out;
  ATFILL_RETURN_IF_ERROR(
      kv_.Scan(Family::kMeta, kPrefix, [&](std::string_view key, std::string_view value) {
        out.emplace_back(std::string(key.substr(kPrefix.size())), std::string(value));
        return true;
      }));
  return out;
}

}  // namespace atfill::state
