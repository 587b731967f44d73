// The lexicon documents added while atfill runs (POST /admin/lexicons), and with [lexicons]
// use_network those accounts published, kept so that a restart validates with them again. Keyed
// by NSID in the meta family ("lexicon/<nsid>", "lexicon-published/<nsid>").
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

  struct Published {
    std::string nsid;
    std::string did;  // the account that published it
    std::string document;
  };
  Status PutPublished(const Published& lexicon);
  Status DeletePublished(std::string_view nsid);
  Result<std::vector<Published>> ListPublished() const;

 private:
  KvStore& kv_;
};

}  // namespace atfill::state
