// The lexicon documents added while atfill runs (POST /admin/lexicons), kept so that a restart
// validates with them again. Keyed by NSID in the meta family ("lexicon/<nsid>").
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "state/kv_store.hpp"

namespace atfill::state {

class LexiconStore {
 public:
  explicit LexiconStore(KvStore& kv) : kv_(kv) {}

  Status Put(std::string_view nsid, std::string_view document);
  Status Delete(std::string_view nsid);
  // (NSID, document) pairs in NSID order.
  Result<std::vector<std::pair<std::string, std::string>>> List() const;

 private:
  KvStore& kv_;
};

}  // namespace atfill::state
