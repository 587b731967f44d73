#include "state/lexicon_store.hpp"

namespace atfill::state {
namespace {

constexpr std::string_view kPrefix = "lexicon/";
constexpr std::string_view kPublishedPrefix = "lexicon-published/";

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

Status LexiconStore::PutPublished(const Published& lexicon) {
  WriteBatch batch;
  // The DID, a newline, the document (a DID holds no newline).
  batch.Put(Family::kMeta, std::string(kPublishedPrefix) + lexicon.nsid,
            lexicon.did + "\n" + lexicon.document);
  return kv_.Write(batch);
}

Status LexiconStore::DeletePublished(std::string_view nsid) {
  WriteBatch batch;
  batch.Delete(Family::kMeta, std::string(kPublishedPrefix) + std::string(nsid));
  return kv_.Write(batch);
}

Result<std::vector<LexiconStore::Published>> LexiconStore::ListPublished() const {
  std::vector<Published> out;
  Status bad;
  ATFILL_RETURN_IF_ERROR(
      kv_.Scan(Family::kMeta, kPublishedPrefix, [&](std::string_view key, std::string_view value) {
        const size_t nl = value.find('\n');
        if (nl == std::string_view::npos) {
          bad = Status::Corrupt("the published lexicon " + std::string(key) + " has no DID");
          return false;
        }
        out.push_back({std::string(key.substr(kPublishedPrefix.size())),
                       std::string(value.substr(0, nl)), std::string(value.substr(nl + 1))});
        return true;
      }));
  ATFILL_RETURN_IF_ERROR(bad);
  return out;
}

}  // namespace atfill::state
