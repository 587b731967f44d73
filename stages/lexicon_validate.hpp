// Lexicon validation: each created or updated record is checked against its collection's lexicon
// (atproto/lexicon.hpp). A record that fails is a `lexicon_invalid` error (its URI, the path and
// the reason) and, in reject mode, is not written; a record of a collection with no lexicon passes.
// Each chunk adds its counts to the job's counters lexicon_valid, lexicon_invalid and
// lexicon_unknown.
//
// It runs right after CID verification, before a script rewrites the record. When the CID is
// verified, CidVerify runs the check on the document it parsed (one parse a record); the
// LexiconValidate stage parses the record itself where CIDs are not verified.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "atproto/lexicon.hpp"
#include "pipeline/transform.hpp"

namespace atfill::stages {

enum class LexiconMode : uint8_t { kOff, kLog, kReject };
// "off", "log", "reject"
Result<LexiconMode> ParseLexiconMode(std::string_view text);
std::string_view LexiconModeName(LexiconMode mode);

// The catalog records are validated against. Replaced whole when lexicons are added or removed
// while jobs run; each chunk validates against the catalog it took at its start. Thread-safe.
class LexiconRegistry {
 public:
  LexiconRegistry() : catalog_(std::make_shared<atproto::LexiconCatalog>()) {}
  explicit LexiconRegistry(atproto::LexiconCatalog catalog)
      : catalog_(std::make_shared<atproto::LexiconCatalog>(std::move(catalog))) {}

  std::shared_ptr<const atproto::LexiconCatalog> catalog() const {
    std::lock_guard lock(mu_);
    return catalog_;
  }
  void Set(atproto::LexiconCatalog catalog) {
    auto next = std::make_shared<const atproto::LexiconCatalog>(std::move(catalog));
    std::lock_guard lock(mu_);
    catalog_ = std::move(next);
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const atproto::LexiconCatalog> catalog_;
};

// The verdict's consequences for one chunk, shared by CidVerify and LexiconValidate.
class LexiconCheck {
 public:
  LexiconCheck(std::shared_ptr<const LexiconRegistry> registry, LexiconMode mode)
      : registry_(std::move(registry)), mode_(mode) {}

  std::shared_ptr<const atproto::LexiconCatalog> catalog() const { return registry_->catalog(); }

  struct Tally {
    int64_t valid = 0;
    int64_t invalid = 0;
    int64_t unknown = 0;
  };
  // Counts `verdict` and, for an invalid record, logs it in the chunk; false when the record is
  // not to be written.
  bool Apply(const pipeline::RecordEvent& record, const atproto::LexiconVerdict& verdict,
             pipeline::EventChunk* chunk, Tally* tally) const;
  // The chunk's counts into its counters.
  static void Count(const Tally& tally, pipeline::EventChunk* chunk);

 private:
  std::shared_ptr<const LexiconRegistry> registry_;
  LexiconMode mode_;
};

// The stage for jobs that do not verify CIDs. Stateless and thread-safe.
class LexiconValidate : public pipeline::Transform {
 public:
  explicit LexiconValidate(LexiconCheck check) : check_(std::move(check)) {}
  std::string_view name() const override { return "lexicon_validate"; }
  Status Process(pipeline::TransformState* state, pipeline::EventChunk* chunk) const override;

 private:
  LexiconCheck check_;
};

}  // namespace atfill::stages
