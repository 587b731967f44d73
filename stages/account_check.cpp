#include "stages/account_check.hpp"

#include <memory>
#include <utility>
#include <vector>

namespace atfill::stages {

using pipeline::AccountEvent;
using pipeline::AccountStatus;
using pipeline::AccountStatusAnswer;
using Verdict = pipeline::AccountStatusAnswer::Verdict;

Status AccountCheckOptions::Validate() const {
  if (timeout_ms < 1 || timeout_ms > 600'000) {
    return Status::Invalid("account check timeout_ms must be within 1..600000, not " +
                           std::to_string(timeout_ms));
  }
  return Status::OK();
}

AccountCheck::AccountCheck(const pipeline::AccountStatusLookup* lookup, AccountCheckOptions options)
    : lookup_(lookup), options_(options) {}

AccountCheckStats AccountCheck::stats() const {
  return {checks_.load(), refused_.load(), unconfirmed_.load()};
}

// One chunk's questions: the answers land in their slots from the lookup's threads; the last one
// in applies them all to the chunk.
struct AccountCheck::Pending {
  pipeline::EventChunk* chunk = nullptr;
  Done done;
  std::vector<size_t> asked;  // indexes of the deleted accounts' events, in chunk order
  std::vector<AccountStatusAnswer> answers;
  std::atomic<size_t> left{0};
};

bool AccountCheck::Start(pipeline::TransformState*, pipeline::EventChunk* chunk, bool /*again*/,
                         Done done) const {
  std::vector<size_t> asked;
  for (size_t i = 0; i < chunk->events.size(); ++i) {
    const auto* a = std::get_if<AccountEvent>(&chunk->events[i]);
    if (a != nullptr && !a->resync && a->status == AccountStatus::kDeleted) asked.push_back(i);
  }
  if (asked.empty()) return false;
  auto pending = std::make_shared<Pending>();
  pending->chunk = chunk;
  pending->done = std::move(done);
  pending->answers.resize(asked.size());
  pending->left.store(asked.size());
  pending->asked = std::move(asked);
  // Copied first: once the last answer is in, the chunk is no longer ours to read.
  std::vector<std::string> dids;
  for (size_t i : pending->asked) dids.push_back(std::get<AccountEvent>(chunk->events[i]).did);
  for (size_t n = 0; n < dids.size(); ++n) {
    lookup_->Lookup(dids[n], options_.timeout_ms, [this, pending, n](AccountStatusAnswer answer) {
      pending->answers[n] = std::move(answer);
      // acq_rel: the last one sees every other slot written.
      if (pending->left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        Finish(pending.get());
      }
    });
  }
  return true;
}

void AccountCheck::Finish(Pending* pending) const {
  pipeline::EventChunk* chunk = pending->chunk;
  std::vector<pipeline::Event>& events = chunk->events;
  int64_t refused = 0, unconfirmed = 0;
  std::vector<bool> drop(events.size(), false);
  for (size_t n = 0; n < pending->asked.size(); ++n) {
    const AccountStatusAnswer& answer = pending->answers[n];
    const size_t i = pending->asked[n];
    if (answer.verdict == Verdict::kActive) {
      drop[i] = true;
      ++refused;
      const std::string& did = std::get<AccountEvent>(events[i]).did;
      chunk->errors.push_back({"account_status_mismatch", did,
                               "the stream says " + did + " was deleted but " + answer.detail +
                                   "; its records are kept"});
    } else if (answer.verdict == Verdict::kUnknown) {
      ++unconfirmed;
    }
  }
  size_t kept = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    if (drop[i]) continue;
    if (kept != i) events[kept] = std::move(events[i]);
    ++kept;
  }
  events.resize(kept);
  const auto checks = static_cast<int64_t>(pending->asked.size());
  chunk->dropped += static_cast<uint64_t>(refused);
  chunk->counters.emplace_back("account_checks", checks);
  if (refused != 0) chunk->counters.emplace_back("account_purges_refused", refused);
  if (unconfirmed != 0) chunk->counters.emplace_back("account_purges_unconfirmed", unconfirmed);
  checks_ += static_cast<uint64_t>(checks);
  refused_ += static_cast<uint64_t>(refused);
  unconfirmed_ += static_cast<uint64_t>(unconfirmed);
  // Moved out first: `done` gives the chunk back, and `pending` may die with the last callback.
  Done done = std::move(pending->done);
  done(Status::OK());
}

}  // namespace atfill::stages
