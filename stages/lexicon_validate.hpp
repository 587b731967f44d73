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

#include <map>
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

// The record type of the lexicons accounts publish; its record key is the NSID it defines.
inline constexpr std::string_view kLexiconSchemaNsid = "com.atproto.lexicon.schema";
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

  std::shared_ptr<const atproto::LexiconCatalog> catalog() const;

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

  // [lexicons] use_network: the lexicons accounts publish (com.atproto.lexicon.schema records
  // the jobs see) join the catalog, kept in `kv` across restarts. A document of the config or the
  // API of the same NSID wins over a published one; among published ones the last seen wins.
  // Nothing checks that the publisher owns the NSID (that is the NSID's DNS record).
  // Once: later calls return at once. Loads the published lexicons kept in `kv`.
  Status UseNetwork(state::KvStore* kv);
  bool uses_network() const;
  // A com.atproto.lexicon.schema record a job let through: its document (checked first; one that
  // is not a lexicon, or whose id is not its record key, is ignored) joins the catalog. A delete
  // (empty `document`) by its publisher removes it.
  Status SeePublished(std::string_view did, std::string_view nsid, std::string_view document);

  struct Entry {
    std::string nsid;
    bool record = false;
    bool from_config = false;
    std::string published_by;  // the publisher's DID, for a document from the network
  };
  // Every document, in NSID order.
  std::vector<Entry> List() const;

 private:
  Status Rebuild();  // mu_ held

  mutable std::mutex mu_;
  std::shared_ptr<const atproto::LexiconCatalog> catalog_;
  atproto::LexiconCatalog::Builder documents_;  // the config's and the API's
  state::KvStore* network_kv_ = nullptr;        // set by UseNetwork
  std::map<std::string, state::LexiconStore::Published, std::less<>> published_;
  std::set<std::string, std::less<>> from_config_;
  bool loaded_kept_ = false;
};

// The verdict's consequences for one chunk, shared by CidVerify and LexiconValidate.
class LexiconCheck {
 public:
  LexiconCheck(std::shared_ptr<LexiconRegistry> registry, LexiconMode mode)
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
  // With use_network, a lexicon record the stage lets through (or its delete) reaches the
  // registry; a failure to keep it is an error of the chunk, the record is written all the same.
  void Observe(const pipeline::RecordEvent& record, pipeline::EventChunk* chunk) const;
  // Whether Observe takes published lexicons (use_network).
  bool observes() const { return registry_->uses_network(); }

 private:
  std::shared_ptr<LexiconRegistry> registry_;
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
