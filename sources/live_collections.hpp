// The live consumer's collections while atfill runs. They start as [live] collections and change
// at run time: POST /admin/collections, or `atfill run` reloading its config on SIGHUP. The set is
// saved in state, so a restart keeps it; with it is saved the config's set it last followed, so a
// config edited while atfill was stopped is applied at the next start as a reload would.
//
// A change reaches the running consumer (JetstreamSource::SetCollections) through the listener
// the live job's plan registers; the caller starts the backfills of added collections.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "state/kv_store.hpp"

namespace atfill::sources {

struct CollectionChange {
  std::vector<std::string> added;    // not in the set before, in the order asked
  std::vector<std::string> removed;  // in the set before
  std::vector<std::string> now;      // the set after, sorted
  bool changed() const { return !added.empty() || !removed.empty(); }
};

class LiveCollections {
 public:
  // `config`: [live] collections (empty: every collection, which cannot change at run time).
  // `kv` must outlive this object.
  LiveCollections(state::KvStore* kv, std::vector<std::string> config);

  // Reads the saved set (once; later calls return at once). When the config's set differs from
  // the one the saved set last followed, that difference is applied (as Reload) and returned, so
  // the caller backfills what was added while atfill was stopped.
  Result<CollectionChange> Load();

  // The set now, sorted (the config's before Load).
  std::vector<std::string> Current() const;

  // Adds and removes NSIDs; Invalid (nothing changes) for a name that is not an NSID or a
  // ".*" prefix, for a change of "every collection", or for a change that leaves no collection.
  // Saved before the listener hears of it.
  Result<CollectionChange> Apply(const std::vector<std::string>& add,
                                 const std::vector<std::string>& remove);

  // The config's [live] collections read again: what it adds or removes since the config last
  // applied is applied to the set (changes made over the admin API in between stay).
  Result<CollectionChange> Reload(const std::vector<std::string>& config);

  // The running consumer: called with the new set after each change. One at a time; Listen
  // returns a token for Unlisten.
  using Listener = std::function<Status(const std::vector<std::string>&)>;
  // `applied`: waits until nothing received before the last change can still land.
  using Waiter = std::function<Status(std::chrono::milliseconds timeout)>;
  uint64_t Listen(Listener listener, Waiter applied = nullptr);
  void Unlisten(uint64_t token);

  // Waits until the running consumer can no longer write events of a collection removed by the
  // last change (at once when none runs); Unavailable after `timeout`.
  Status WaitApplied(std::chrono::milliseconds timeout);

 private:
  Result<CollectionChange> ApplyLocked(const std::vector<std::string>& add,
                                       const std::vector<std::string>& remove,
                                       const std::vector<std::string>* config);

  state::KvStore* kv_;
  mutable std::mutex mu_;
  std::vector<std::string> current_;
  std::vector<std::string> config_;  // the config's set the current one last followed
  bool loaded_ = false;
  uint64_t token_ = 0;
  Listener listener_;
  Waiter applied_;
};

}  // namespace atfill::sources
