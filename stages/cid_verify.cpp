#include "stages/cid_verify.hpp"

#include <simdjson.h>

#include <algorithm>

#include "atproto/json.hpp"

namespace atfill::stages {
namespace {

// The lexicon verdict of the record CidOfRecord has parsed.
class LexiconVisitor final : public atproto::ParsedRecordVisitor {
 public:
  explicit LexiconVisitor(const atproto::LexiconCatalog* catalog) : catalog_(catalog) {}

  void Start(const pipeline::RecordEvent* record) {
    record_ = record;
    visited_ = false;
  }
  void Visit(const simdjson::dom::element& body) override {
    verdict_ = catalog_->Validate(record_->collection, record_->rkey, body);
    visited_ = true;
  }
  bool visited() const { return visited_; }
  const atproto::LexiconVerdict& verdict() const { return verdict_; }

 private:
  const atproto::LexiconCatalog* catalog_;
  const pipeline::RecordEvent* record_ = nullptr;
  atproto::LexiconVerdict verdict_;
  bool visited_ = false;
};

}  // namespace

Status CidVerify::Process(pipeline::TransformState* /*state*/, pipeline::EventChunk* chunk) const {
  std::shared_ptr<const atproto::LexiconCatalog> catalog;
  if (lexicons_) catalog = lexicons_->catalog();
  // No lexicon (yet; one may be added while the job runs): the plain CID check.
  if (catalog != nullptr && catalog->size() == 0) catalog.reset();
  LexiconVisitor visitor(catalog.get());
  LexiconCheck::Tally tally;
  pipeline::KeepEvents(chunk, [&](const pipeline::Event& event) {
    const auto* record = std::get_if<pipeline::RecordEvent>(&event);
    if (record == nullptr) return true;
    if (record->operation == pipeline::Operation::kDelete) {
      if (lexicons_) lexicons_->Observe(*record, chunk);
      return true;
    }
    visitor.Start(record);
    auto cid = atproto::CidOfRecord(record->body, catalog ? &visitor : nullptr);
    if (!cid.ok()) {
      chunk->errors.push_back({"bad_record", record->Uri(),
                               "record is not valid atproto data: " + cid.status().message()});
      return false;
    }
    if (*cid != record->cid) {
      chunk->errors.push_back(
          {"cid_mismatch", record->Uri(),
           "record hashes to " + cid->ToString() + ", source said " + record->cid.ToString()});
      return false;
    }
    if (visitor.visited() && !lexicons_->Apply(*record, visitor.verdict(), chunk, &tally)) {
      return false;
    }
    if (lexicons_) lexicons_->Observe(*record, chunk);
    return true;
  });
  if (catalog != nullptr) LexiconCheck::Count(tally, chunk);
  return Status::OK();
}

}  // namespace atfill::stages
