#include "stages/lexicon_validate.hpp"

#include <algorithm>

namespace atfill::stages {

Result<LexiconMode> ParseLexiconMode(std::string_view text) {
  if (text == "off") return LexiconMode::kOff;
  if (text == "log") return LexiconMode::kLog;
  if (text == "reject") return LexiconMode::kReject;
  return Status::Invalid("lexicon mode must be \"reject\", \"log\" or \"off\", not \"" +
                         std::string(text) + "\"");
}

std::string_view LexiconModeName(LexiconMode mode) {
  switch (mode) {
    case LexiconMode::kOff:
      return "off";
    case LexiconMode::kLog:
      return "log";
    case LexiconMode::kReject:
      return "reject";
  }
  return "?";
}

LexiconRegistry::LexiconRegistry() : catalog_(std::make_shared<atproto::LexiconCatalog>()) {}

LexiconRegistry::LexiconRegistry(atproto::LexiconCatalog::Builder documents)
    : documents_(std::move(documents)) {
  for (const auto& [nsid, text] : documents_.documents()) from_config_.insert(nsid);
  auto built = documents_.Build();
  catalog_ = std::make_shared<atproto::LexiconCatalog>(built.ok() ? std::move(*built)
                                                                  : atproto::LexiconCatalog());
}

std::shared_ptr<const atproto::LexiconCatalog> LexiconRegistry::catalog() const {
  std::lock_guard lock(mu_);
  return catalog_;
}

Status LexiconRegistry::Rebuild() {
  atproto::LexiconCatalog::Builder all = documents_;
  for (const auto& [nsid, p] : published_) {
    if (!documents_.Contains(nsid)) ATFILL_RETURN_IF_ERROR(all.Add(p.document));
  }
  ATFILL_ASSIGN_OR_RETURN(atproto::LexiconCatalog built, all.Build());
  catalog_ = std::make_shared<const atproto::LexiconCatalog>(std::move(built));
  return Status::OK();
}

Status LexiconRegistry::LoadKept(state::LexiconStore& store) {
  std::lock_guard lock(mu_);
  if (loaded_kept_) return Status::OK();
  ATFILL_ASSIGN_OR_RETURN(auto kept, store.List());
  for (const auto& [nsid, document] : kept) {
    ATFILL_RETURN_IF_ERROR(documents_.Add(document, "the lexicon " + nsid + " kept in state"));
    from_config_.erase(nsid);  // added at run time over the config's: the newer one holds
  }
  loaded_kept_ = true;
  return kept.empty() ? Status::OK() : Rebuild();
}

Status LexiconRegistry::UseNetwork(state::KvStore* kv) {
  std::lock_guard lock(mu_);
  if (network_kv_ != nullptr) return Status::OK();
  ATFILL_ASSIGN_OR_RETURN(auto published, state::LexiconStore(*kv).ListPublished());
  network_kv_ = kv;
  for (auto& p : published) {
    std::string nsid = p.nsid;
    published_.insert_or_assign(std::move(nsid), std::move(p));
  }
  return published_.empty() ? Status::OK() : Rebuild();
}

bool LexiconRegistry::uses_network() const {
  std::lock_guard lock(mu_);
  return network_kv_ != nullptr;
}

Status LexiconRegistry::SeePublished(std::string_view did, std::string_view nsid,
                                     std::string_view document) {
  if (!document.empty()) {
    std::string id;
    if (!atproto::CheckLexiconDocument(document, &id).ok() || id != nsid) return Status::OK();
  }
  std::lock_guard lock(mu_);
  if (network_kv_ == nullptr) return Status::OK();
  state::LexiconStore store(*network_kv_);
  if (document.empty()) {
    auto it = published_.find(nsid);
    // Only its publisher's delete takes it out.
    if (it == published_.end() || it->second.did != did) return Status::OK();
    ATFILL_RETURN_IF_ERROR(store.DeletePublished(nsid));
    published_.erase(it);
  } else {
    state::LexiconStore::Published p{std::string(nsid), std::string(did), std::string(document)};
    ATFILL_RETURN_IF_ERROR(store.PutPublished(p));
    published_.insert_or_assign(std::string(nsid), std::move(p));
  }
  return documents_.Contains(nsid) ? Status::OK() : Rebuild();
}

Result<LexiconRegistry::Added> LexiconRegistry::Add(std::string_view document,
                                                    state::LexiconStore& store) {
  Added added;
  ATFILL_RETURN_IF_ERROR(atproto::CheckLexiconDocument(document, &added.nsid));
  std::lock_guard lock(mu_);
  added.replaced = documents_.Contains(added.nsid);
  ATFILL_RETURN_IF_ERROR(store.Put(added.nsid, document));
  ATFILL_RETURN_IF_ERROR(documents_.Add(document));
  from_config_.erase(added.nsid);
  ATFILL_RETURN_IF_ERROR(Rebuild());
  added.record = catalog_->HasRecord(added.nsid);
  return added;
}

Status LexiconRegistry::Remove(std::string_view nsid, state::LexiconStore& store) {
  std::lock_guard lock(mu_);
  if (from_config_.contains(nsid)) {
    return Status::Invalid("the lexicon " + std::string(nsid) +
                           " comes from [lexicons] dirs; remove it there");
  }
  if (!documents_.Contains(nsid)) {
    return Status::NotFound("no lexicon " + std::string(nsid) + " was added");
  }
  ATFILL_RETURN_IF_ERROR(store.Delete(nsid));
  documents_.Remove(nsid);
  return Rebuild();
}

std::vector<LexiconRegistry::Entry> LexiconRegistry::List() const {
  std::lock_guard lock(mu_);
  std::vector<Entry> out;
  for (const auto& [nsid, text] : documents_.documents()) {
    out.push_back({nsid, catalog_->HasRecord(nsid), from_config_.contains(nsid), {}});
  }
  for (const auto& [nsid, p] : published_) {
    if (!documents_.Contains(nsid)) out.push_back({nsid, catalog_->HasRecord(nsid), false, p.did});
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.nsid < b.nsid; });
  return out;
}

bool LexiconCheck::Apply(const pipeline::RecordEvent& record,
                         const atproto::LexiconVerdict& verdict, pipeline::EventChunk* chunk,
                         Tally* tally) const {
  switch (verdict.outcome) {
    case atproto::LexiconVerdict::Outcome::kValid:
      ++tally->valid;
      return true;
    case atproto::LexiconVerdict::Outcome::kUnknown:
      ++tally->unknown;
      return true;
    case atproto::LexiconVerdict::Outcome::kInvalid:
      break;
  }
  ++tally->invalid;
  chunk->errors.push_back({"lexicon_invalid", record.Uri(),
                           "record does not match its lexicon: " + verdict.Describe() +
                               (mode_ == LexiconMode::kLog ? " (written: mode is log)" : "")});
  return mode_ != LexiconMode::kReject;
}

void LexiconCheck::Observe(const pipeline::RecordEvent& record, pipeline::EventChunk* chunk) const {
  if (record.collection != kLexiconSchemaNsid || !registry_->uses_network()) return;
  const bool deleted = record.operation == pipeline::Operation::kDelete;
  if (Status s = registry_->SeePublished(record.did, record.rkey,
                                         deleted ? std::string_view() : record.body);
      !s.ok()) {
    chunk->errors.push_back(
        {"lexicon_not_kept", record.Uri(), "the published lexicon was not kept: " + s.message()});
  }
}

void LexiconCheck::Count(const Tally& tally, pipeline::EventChunk* chunk) {
  if (tally.valid > 0) chunk->counters.emplace_back("lexicon_valid", tally.valid);
  if (tally.invalid > 0) chunk->counters.emplace_back("lexicon_invalid", tally.invalid);
  if (tally.unknown > 0) chunk->counters.emplace_back("lexicon_unknown", tally.unknown);
}

Status LexiconValidate::Process(pipeline::TransformState* /*state*/,
                                pipeline::EventChunk* chunk) const {
  const auto catalog = check_.catalog();
  // No lexicon (yet): nothing to check, unless published ones are taken.
  if (catalog->size() == 0 && !check_.observes()) return Status::OK();
  LexiconCheck::Tally tally;
  pipeline::KeepEvents(chunk, [&](const pipeline::Event& event) {
    const auto* record = std::get_if<pipeline::RecordEvent>(&event);
    if (record == nullptr) return true;
    if (record->operation != pipeline::Operation::kDelete &&
        !check_.Apply(*record,
                      catalog->ValidateJson(record->collection, record->rkey, record->body), chunk,
                      &tally)) {
      return false;
    }
    check_.Observe(*record, chunk);
    return true;
  });
  LexiconCheck::Count(tally, chunk);
  return Status::OK();
}

}  // namespace atfill::stages
