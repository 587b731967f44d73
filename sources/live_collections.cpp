#include "sources/live_collections.hpp"

#include <algorithm>
#include <iterator>
#include <set>
#include <utility>

#include "atproto/syntax.hpp"
#include "base/strings.hpp"
#include "pipeline/components.hpp"

namespace atfill::sources {
namespace {

constexpr const char* kSavedKey = "live/collections";
constexpr const char* kConfigKey = "live/collections_config";

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// What `to` adds to `from` and what it removes (both sorted).
std::pair<std::vector<std::string>, std::vector<std::string>> Difference(
    const std::vector<std::string>& from, const std::vector<std::string>& to) {
  std::vector<std::string> added, removed;
  std::set_difference(to.begin(), to.end(), from.begin(), from.end(), std::back_inserter(added));
  std::set_difference(from.begin(), from.end(), to.begin(), to.end(), std::back_inserter(removed));
  return {std::move(added), std::move(removed)};
}

Status CheckName(const std::string& c) {
  const bool prefix = c.size() > 2 && c.compare(c.size() - 2, 2, ".*") == 0;
  if (prefix || atproto::Nsid::Parse(c).ok()) return Status::OK();
  return Status::Invalid("collections: " + QuoteForMessage(c) +
                         " is neither an NSID nor a prefix ending in .*");
}

}  // namespace

LiveCollections::LiveCollections(state::KvStore* kv, std::vector<std::string> config)
    : kv_(kv), current_(Sorted(config)), config_(Sorted(std::move(config))) {}

Result<CollectionChange> LiveCollections::Load() {
  std::lock_guard<std::mutex> lock(mu_);
  CollectionChange none;
  if (loaded_) {
    none.now = current_;
    return none;
  }
  ATFILL_ASSIGN_OR_RETURN(auto saved, kv_->Get(state::Family::kMeta, kSavedKey));
  ATFILL_ASSIGN_OR_RETURN(auto followed, kv_->Get(state::Family::kMeta, kConfigKey));
  loaded_ = true;
  if (!saved || !followed) {
    none.now = current_;
    return none;
  }
  const std::vector<std::string> config = config_;
  current_ = Sorted(pipeline::SplitLines(*saved));
  config_ = Sorted(pipeline::SplitLines(*followed));
  if (config == config_) {
    none.now = current_;
    return none;
  }
  auto [add, remove] = Difference(config_, config);
  return ApplyLocked(add, remove, &config);
}

std::vector<std::string> LiveCollections::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

Result<CollectionChange> LiveCollections::Apply(const std::vector<std::string>& add,
                                                const std::vector<std::string>& remove) {
  std::lock_guard<std::mutex> lock(mu_);
  return ApplyLocked(add, remove, nullptr);
}

Result<CollectionChange> LiveCollections::Reload(const std::vector<std::string>& config) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::vector<std::string> now = Sorted(config);
  auto [add, remove] = Difference(config_, now);
  return ApplyLocked(add, remove, &now);
}

Result<CollectionChange> LiveCollections::ApplyLocked(const std::vector<std::string>& add,
                                                      const std::vector<std::string>& remove,
                                                      const std::vector<std::string>* config) {
  for (const auto& c : add) ATFILL_RETURN_IF_ERROR(CheckName(c));
  for (const auto& c : remove) ATFILL_RETURN_IF_ERROR(CheckName(c));
  CollectionChange change;
  if (current_.empty() && (!add.empty() || !remove.empty())) {
    return Status::Invalid(
        "the live consumer takes every collection ([live] collections is empty), so none can be "
        "added or removed; list the collections in [live] collections first");
  }
  std::set<std::string> set(current_.begin(), current_.end());
  std::set<std::string> asked;
  for (const auto& c : add) {
    if (set.insert(c).second) change.added.push_back(c);
    asked.insert(c);
  }
  for (const auto& c : remove) {
    if (asked.count(c) != 0) {
      return Status::Invalid("collections: " + QuoteForMessage(c) + " is both added and removed");
    }
    if (set.erase(c) != 0) change.removed.push_back(c);
  }
  if (set.empty()) {
    return Status::Invalid(
        "the change would leave the live consumer no collection (an empty filter takes every "
        "collection); add one before removing the last");
  }
  change.now.assign(set.begin(), set.end());
  std::vector<std::string> followed = config != nullptr ? *config : config_;
  if (!change.changed() && followed == config_) return change;
  state::WriteBatch batch;
  batch.Put(state::Family::kMeta, kSavedKey, pipeline::JoinLines(change.now));
  batch.Put(state::Family::kMeta, kConfigKey, pipeline::JoinLines(followed));
  ATFILL_RETURN_IF_ERROR(kv_->Write(batch));
  current_ = change.now;
  config_ = std::move(followed);
  if (change.changed() && listener_) {
    // The set is saved: a consumer that fails to switch now takes it at its next start.
    Status st = listener_(current_);
    if (!st.ok()) return st.WithContext("the running live consumer did not take the change");
  }
  return change;
}

uint64_t LiveCollections::Listen(Listener listener, Waiter applied) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(listener);
  applied_ = std::move(applied);
  return ++token_;
}

void LiveCollections::Unlisten(uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  if (token != token_) return;
  listener_ = nullptr;
  applied_ = nullptr;
}

Status LiveCollections::WaitApplied(std::chrono::milliseconds timeout) {
  Waiter applied;
  {
    std::lock_guard<std::mutex> lock(mu_);
    applied = applied_;
  }
  // Outside the lock: the consumer's commits do not need it, a change made meanwhile waits.
  return applied ? applied(timeout) : Status::OK();
}

}  // namespace atfill::sources
