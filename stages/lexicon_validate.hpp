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
#include <set>
#include <string>
#include <string_view>

#include "atproto/lexicon.hpp"
#include "pipeline/transform.hpp"
#include "state/lexicon_store.hpp"

namespace atfill::stages {

enum class LexiconMode : uint8_t { kOff, kLog, kReject };
// "off", "log", "reject"
Result<LexiconMode> ParseLexiconMode(std::string_view text);
std::string_view LexiconModeName(LexiconMode mode);

// The catalog records are validated against: the documents of [lexicons] dirs, and those added
// while atfill runs (POST /admin/lexicons), which are kept in state so that a restart has them
// too. Replaced whole when a document is added or removed; each chunk validates against the
// catalog it took at its start. Thread-safe.
class LexiconRegistry {
 public:
  LexiconRegistry();
  // The config's documents (each checked when it was added to `documents`).
  explicit LexiconRegistry(atproto::LexiconCatalog::Builder documents);
  // A catalog made elsewhere (tests, programs that embed the library); nothing is kept in state.
  explicit LexiconRegistry(atproto::LexiconCatalog catalog);

  std::shared_ptr<const atproto::LexiconCatalog> catalog() const;
  void Set(atproto::LexiconCatalog catalog);

  // Adds the documents kept in `store`, once: later calls return at once.
  Status LoadKept(state::LexiconStore& store);

  struct Added {
    std::string nsid;
    bool record = false;    // it defines a record type
    bool replaced = false;  // a document of that NSID was there before
  };
  // One document added at run time (checked first: Invalid names the reason), kept in `store`.
  Result<Added> Add(std::string_view document, state::LexiconStore& store);
  // Removes a document added at run time. NotFound when there is none; Invalid for one of the
  // config's dirs (remove it there).
  Status Remove(std::string_view nsid, state::LexiconStore& store);

  struct Entry {
    std::string nsid;
    bool record = false;
    bool from_config = false;
  };
  // Every document, in NSID order.
  std::vector<Entry> List() const;

 private:
  Status Rebuild();  // mu_ held

  mutable std::mutex mu_;
  std::shared_ptr<const atproto::LexiconCatalog> catalog_;
  atproto::LexiconCatalog::Builder documents_;  // every document
  std::set<std::string, std::less<>> from_config_;
  bool loaded_kept_ = false;
  bool fixed_ = false;  // made from a catalog: nothing to rebuild from
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
