// The commit chain of each repo a verifying live source (the relay firehose) applies: the rev and
// the MST root (data CID) of the last commit applied, and whether the repo is desynchronized (its
// chain broke, so its commits wait until a resync from getRepo sets a new link).
//
// Layout (cursors family): "rc/" + did -> rev "\0" data CID (text) "\0" flags ("d" when
// desynchronized). Writes go into a caller's batch, so a link moves with the records it covers.
// "ri/" + did -> the account status ("deactivated", "takendown"...) of a desynchronized repo
// whose account is not active: its resync waits until the account is active again, across runs.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.hpp"
#include "state/kv_store.hpp"

namespace atfill::state {

struct RepoChain {
  std::string rev;   // the last applied commit's rev (a TID)
  std::string data;  // its MST root CID, as text
  bool desynchronized = false;

  friend bool operator==(const RepoChain&, const RepoChain&) = default;
};

enum class ChainVerdict : uint8_t {
  kApply,   // the commit follows the last applied one (or the repo has no link yet)
  kStale,   // its rev is not newer than the last applied one: already applied (a redelivery)
  kDesync,  // the chain broke (or the repo awaits a resync): resync the repo
};
std::string_view ChainVerdictName(ChainVerdict verdict);

// The verdict for a commit of `rev` whose prevData is `prev_data` (CID text; empty when the
// commit has none), after `last`. *why (when set) receives a sentence for kStale and kDesync.
// Pure and thread-safe. TIDs sort as text, so revs compare as strings.
ChainVerdict JudgeCommit(const std::optional<RepoChain>& last, std::string_view rev,
                         std::string_view prev_data, std::string* why = nullptr);

// Stateless over a KvStore it does not own; thread-safe as the store is.
class RepoChains {
 public:
  explicit RepoChains(KvStore& kv) : kv_(kv) {}

  // nullopt when no commit of the repo was applied. Corrupt naming the DID when the stored value
  // is not what Set wrote.
  Result<std::optional<RepoChain>> Get(std::string_view did) const;
  void Set(WriteBatch* batch, std::string_view did, const RepoChain& chain) const;
  void Remove(WriteBatch* batch, std::string_view did) const;
  // Calls fn(did, chain) for every desynchronized repo, in DID order, until it returns false
  // (a restart resumes their resyncs).
  Status ScanDesynchronized(
      const std::function<bool(std::string_view, const RepoChain&)>& fn) const;

  // The account of a desynchronized repo is not active (`status` says how) / is active again.
  void SetInactive(WriteBatch* batch, std::string_view did, std::string_view status) const;
  void ClearInactive(WriteBatch* batch, std::string_view did) const;
  // Calls fn(did, status) for every account SetInactive marked, in DID order, until it returns
  // false.
  Status ScanInactive(const std::function<bool(std::string_view, std::string_view)>& fn) const;

 private:
  KvStore& kv_;
};

}  // namespace atfill::state
