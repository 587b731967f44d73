#include "stages/lexicon_validate.hpp"

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

LexiconRegistry::LexiconRegistry(atproto::LexiconCatalog catalog)
    : catalog_(std::make_shared<atproto::LexiconCatalog>(std::move(catalog))), fixed_(true) {}

std::shared_ptr<const atproto::LexiconCatalog> LexiconRegistry::catalog() const {
  std::lock_guard lock(mu_);
  return catalog_;
}

void LexiconRegistry::Set(atproto::LexiconCatalog catalog) {
  auto next = std::make_shared<const atproto::LexiconCatalog>(std::move(catalog));
  std::lock_guard lock(mu_);
  catalog_ = std::move(next);
}

Status LexiconRegistry::Rebuild() {
  ATFILL_ASSIGN_OR_RETURN(atproto::LexiconCatalog built, documents_.Build());
  catalog_ = std::make_shared<const atproto::LexiconCatalog>(std::move(built));
  return Status::OK();
}

Status LexiconRegistry::LoadKept(state::LexiconStore& store) {
  std::lock_guard lock(mu_);
  if (loaded_kept_ || fixed_) return Status::OK();
  ATFILL_ASSIGN_OR_RETURN(auto kept, store.List());
  for (const auto& [nsid, document] : kept) {
    ATFILL_RETURN_IF_ERROR(documents_.Add(document, "the lexicon " + nsid + " kept in state"));
    from_config_.erase(nsid);  // added at run time over the config's: the newer one holds
  }
  loaded_kept_ = true;
  return kept.empty() ? Status::OK() : Rebuild();
}

Result<LexiconRegistry::Added> LexiconRegistry::Add(std::string_view document,
                                                    state::LexiconStore& store) {
  Added added;
  ATFILL_RETURN_IF_ERROR(atproto::CheckLexiconDocument(document, &added.nsid));
  atproto::LexiconCatalog::Builder one;
  ATFILL_RETURN_IF_ERROR(one.Add(document));
  ATFILL_ASSIGN_OR_RETURN(atproto::LexiconCatalog alone, one.Build());
  added.record = alone.HasRecord(added.nsid);
  std::lock_guard lock(mu_);
  if (fixed_) return Status::Unsupported("this catalog was made whole; it takes no documents");
  added.replaced = documents_.Contains(added.nsid);
  ATFILL_RETURN_IF_ERROR(store.Put(added.nsid, document));
  ATFILL_RETURN_IF_ERROR(documents_.Add(document));
  from_config_.erase(added.nsid);
  ATFILL_RETURN_IF_ERROR(Rebuild());
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
    out.push_back({nsid, catalog_->HasRecord(nsid), from_config_.contains(nsid)});
  }
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
  if (mode_ == LexiconMode::kOff) return true;
  chunk->errors.push_back({"lexicon_invalid", record.Uri(),
                           "record does not match its lexicon: " + verdict.Describe() +
                               (mode_ == LexiconMode::kLog ? " (written: mode is log)" : "")});
  return mode_ != LexiconMode::kReject;
}

void LexiconCheck::Count(const Tally& tally, pipeline::EventChunk* chunk) {
  if (tally.valid > 0) chunk->counters.emplace_back("lexicon_valid", tally.valid);
  if (tally.invalid > 0) chunk->counters.emplace_back("lexicon_invalid", tally.invalid);
  if (tally.unknown > 0) chunk->counters.emplace_back("lexicon_unknown", tally.unknown);
}

Status LexiconValidate::Process(pipeline::TransformState* /*state*/,
                                pipeline::EventChunk* chunk) const {
  const auto catalog = check_.catalog();
  if (catalog->size() == 0) return Status::OK();  // no lexicon (yet): nothing to check
  LexiconCheck::Tally tally;
  pipeline::KeepEvents(chunk, [&](const pipeline::Event& event) {
    const auto* record = std::get_if<pipeline::RecordEvent>(&event);
    if (record == nullptr || record->operation == pipeline::Operation::kDelete) return true;
    return check_.Apply(*record,
                        catalog->ValidateJson(record->collection, record->rkey, record->body),
                        chunk, &tally);
  });
  LexiconCheck::Count(tally, chunk);
  return Status::OK();
}

}  // namespace atfill::stages
