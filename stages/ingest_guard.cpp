#include "stages/ingest_guard.hpp"

#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <variant>

#include "base/bloom_filter.hpp"
#include "pipeline/engine.hpp"

namespace atfill::stages {
namespace {

using pipeline::AccountEvent;
using pipeline::Operation;
using pipeline::RecordEvent;

// Process and SealBatch run on the engine's ordered node; OnCommitted on its sink node, possibly
// at the same time, so everything here is under `mu`.
struct GuardState : pipeline::TransformState {
  std::mutex mu;
  // Tombstones decided by chunks whose batch is not durable yet, with the batch (generation) that
  // last set each; nullopt marks a lifted account tombstone.
  template <typename T>
  struct Pending {
    T value;
    uint64_t generation;
  };
  std::unordered_map<std::string, Pending<state::RecordTombstone>> records;
  std::unordered_map<std::string, Pending<std::optional<state::AccountTombstone>>> accounts;
  // The batch Process is filling, and the sealed batches waiting to be durable, oldest first.
  uint64_t generation = 0;
  std::deque<uint64_t> sealed;

  // What is in state, so most events need no lookup: a filter over record tombstone URIs and the
  // DIDs with an account tombstone (both confirmed against state before refusing, since a sweep
  // may have removed the tombstone since). Loaded at the first chunk.
  bool loaded = false;
  std::unique_ptr<BloomFilter> stored_records;
  uint64_t stored_record_count = 0;  // keys added to stored_records
  std::unordered_set<std::string> stored_accounts;

  // Under a DeleteTombstoneRule: "did\ncollection" of the creates and updates this run let
  // through, so deletes in batches the sink has not committed yet still find them (bounded: when
  // full it starts again, and the sink answers for what is committed).
  std::unordered_set<std::string> created;
};

constexpr size_t kMaxCreatedPairs = 1'000'000;

Status Load(state::Tombstones* tombstones, GuardState* st) {
  uint64_t count = 0;
  ATFILL_RETURN_IF_ERROR(tombstones->ForEachRecord([&](std::string_view) {
    ++count;
    return true;
  }));
  // Room to grow: new tombstones join the filter as they commit.
  st->stored_records = std::make_unique<BloomFilter>(std::max<uint64_t>(count * 2, 1 << 20));
  ATFILL_RETURN_IF_ERROR(tombstones->ForEachRecord([&](std::string_view uri) {
    st->stored_records->Add(uri);
    ++st->stored_record_count;
    return true;
  }));
  ATFILL_RETURN_IF_ERROR(tombstones->ForEachAccount([&](std::string_view did) {
    st->stored_accounts.emplace(did);
    return true;
  }));
  st->loaded = true;
  return Status::OK();
}

}  // namespace

IngestGuard::IngestGuard(state::Tombstones* tombstones, std::function<int64_t()> now_us,
                         std::optional<DeleteTombstoneRule> rule)
    : tombstones_(tombstones),
      now_us_(now_us ? std::move(now_us) : std::function<int64_t()>(pipeline::NowMicros)),
      rule_(std::move(rule)) {}

std::unique_ptr<pipeline::TransformState> IngestGuard::NewState() const {
  return std::make_unique<GuardState>();
}

Status IngestGuard::Process(pipeline::TransformState* base, pipeline::EventChunk* chunk) const {
  auto* st = static_cast<GuardState*>(base);
  std::lock_guard<std::mutex> lock(st->mu);
  if (!st->loaded) ATFILL_RETURN_IF_ERROR(Load(tombstones_, st));
  auto& events = chunk->events;
  size_t keep = 0;
  int64_t skipped = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    bool refuse = false;
    if (auto* r = std::get_if<RecordEvent>(&events[i])) {
      if (r->operation == Operation::kDelete) {
        bool leave = true;
        if (rule_) {
          leave =
              st->created.count(r->did + '\n' + r->collection) != 0 ||
              (!rule_->always.empty() && pipeline::CollectionMatches(r->collection, rule_->always));
          if (!leave && rule_->sink_holds) {
            const Result<bool> holds = rule_->sink_holds(r->did, r->collection);
            leave = !holds.ok() || *holds;
          }
        }
        if (leave) {
          st->records[r->Uri()] = {state::RecordTombstone{r->rev, now_us_()}, st->generation};
        } else {
          ++skipped;
        }
      } else {
        // Account tombstone first: a purged account takes no writes until it is active again.
        std::optional<state::AccountTombstone> account;
        if (auto it = st->accounts.find(r->did); it != st->accounts.end()) {
          account = it->second.value;
        } else if (st->stored_accounts.count(r->did) != 0) {
          ATFILL_ASSIGN_OR_RETURN(account, tombstones_->GetAccount(r->did));
        }
        if (account) {
          refuse = true;
        } else {
          // With no record tombstone anywhere (a load of creates), nothing to look up.
          std::optional<state::RecordTombstone> tomb;
          if (!st->records.empty() || st->stored_record_count != 0) {
            const std::string uri = r->Uri();
            if (auto it = st->records.find(uri); it != st->records.end()) {
              tomb = it->second.value;
            } else if (st->stored_records->MayContain(uri)) {
              ATFILL_ASSIGN_OR_RETURN(tomb, tombstones_->GetRecord(uri));
            }
          }
          // TIDs sort as strings in time order.
          refuse = tomb && (r->rev.empty() || r->rev <= tomb->rev);
        }
        if (rule_ && !refuse) {
          if (st->created.size() >= kMaxCreatedPairs) st->created.clear();
          st->created.insert(r->did + '\n' + r->collection);
        }
      }
    } else if (auto* a = std::get_if<AccountEvent>(&events[i])) {
      if (a->resync) {
        // A resync replaces records; it says nothing about the account's status.
      } else if (pipeline::StatusPurgesRecords(a->status)) {
        st->accounts[a->did] = {
            state::AccountTombstone{std::string(pipeline::AccountStatusName(a->status)), now_us_()},
            st->generation};
      } else if (a->active) {
        st->accounts[a->did] = {std::nullopt, st->generation};
      }
    }
    if (refuse) {
      ++chunk->refused;
    } else {
      if (keep != i) events[keep] = std::move(events[i]);
      ++keep;
    }
  }
  events.resize(keep);
  if (skipped != 0) chunk->counters.emplace_back("tombstones_skipped", skipped);
  return Status::OK();
}

Status IngestGuard::SealBatch(pipeline::TransformState* base, state::WriteBatch* batch) const {
  auto* st = static_cast<GuardState*>(base);
  std::lock_guard<std::mutex> lock(st->mu);
  // Only what this batch set: a value a later batch sets is written with that batch.
  for (const auto& [uri, p] : st->records) {
    if (p.generation == st->generation) tombstones_->PutRecord(batch, uri, p.value);
  }
  for (const auto& [did, p] : st->accounts) {
    if (p.generation != st->generation) continue;
    if (p.value) {
      tombstones_->PutAccount(batch, did, *p.value);
    } else {
      tombstones_->RemoveAccount(batch, did);
    }
  }
  st->sealed.push_back(st->generation++);
  return Status::OK();
}

void IngestGuard::OnCommitted(pipeline::TransformState* base, bool durable) const {
  auto* st = static_cast<GuardState*>(base);
  std::lock_guard<std::mutex> lock(st->mu);
  if (st->sealed.empty()) return;
  const uint64_t generation = st->sealed.front();
  st->sealed.pop_front();
  if (!durable) return;  // the run ends; the chunks will be read again
  // State now holds this batch's tombstones: the filters learn them, and entries no later batch
  // changed leave the overlay.
  for (auto it = st->records.begin(); it != st->records.end();) {
    if (it->second.generation <= generation) {
      if (st->loaded) {
        st->stored_records->Add(it->first);
        ++st->stored_record_count;
      }
      it = st->records.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = st->accounts.begin(); it != st->accounts.end();) {
    if (it->second.generation <= generation) {
      if (it->second.value) {
        st->stored_accounts.insert(it->first);
      } else {
        st->stored_accounts.erase(it->first);
      }
      it = st->accounts.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace atfill::stages
