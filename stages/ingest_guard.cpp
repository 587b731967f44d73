#include "stages/ingest_guard.hpp"

#include <algorithm>
#include <memory>
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

struct GuardState : pipeline::TransformState {
  // Tombstones decided by chunks that are not committed yet; nullopt marks a lifted one.
  std::unordered_map<std::string, state::RecordTombstone> records;
  std::unordered_map<std::string, std::optional<state::AccountTombstone>> accounts;

  // What is in state, so most events need no lookup: a filter over record tombstone URIs and the
  // DIDs with an account tombstone (both confirmed against state before refusing, since a sweep
  // may have removed the tombstone since). Loaded at the first chunk.
  bool loaded = false;
  std::unique_ptr<BloomFilter> stored_records;
  std::unordered_set<std::string> stored_accounts;

  void Clear() {
    records.clear();
    accounts.clear();
  }
};

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

IngestGuard::IngestGuard(state::Tombstones* tombstones, std::function<int64_t()> now_us)
    : tombstones_(tombstones),
      now_us_(now_us ? std::move(now_us) : std::function<int64_t()>(pipeline::NowMicros)) {}

std::unique_ptr<pipeline::TransformState> IngestGuard::NewState() const {
  return std::make_unique<GuardState>();
}

Status IngestGuard::Process(pipeline::TransformState* base, pipeline::EventChunk* chunk) const {
  auto* st = static_cast<GuardState*>(base);
  if (!st->loaded) ATFILL_RETURN_IF_ERROR(Load(tombstones_, st));
  auto& events = chunk->events;
  size_t keep = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    bool refuse = false;
    if (auto* r = std::get_if<RecordEvent>(&events[i])) {
      std::string uri = r->Uri();
      if (r->operation == Operation::kDelete) {
        st->records[std::move(uri)] = state::RecordTombstone{r->rev, now_us_()};
      } else {
        // Account tombstone first: a purged account takes no writes until it is active again.
        std::optional<state::AccountTombstone> account;
        if (auto it = st->accounts.find(r->did); it != st->accounts.end()) {
          account = it->second;
        } else if (st->stored_accounts.count(r->did) != 0) {
          ATFILL_ASSIGN_OR_RETURN(account, tombstones_->GetAccount(r->did));
        }
        if (account) {
          refuse = true;
        } else {
          std::optional<state::RecordTombstone> tomb;
          if (auto it = st->records.find(uri); it != st->records.end()) {
            tomb = it->second;
          } else if (st->stored_records->MayContain(uri)) {
            ATFILL_ASSIGN_OR_RETURN(tomb, tombstones_->GetRecord(uri));
          }
          // TIDs sort as strings in time order.
          refuse = tomb && (r->rev.empty() || r->rev <= tomb->rev);
        }
      }
    } else if (auto* a = std::get_if<AccountEvent>(&events[i])) {
      if (pipeline::StatusPurgesRecords(a->status)) {
        st->accounts[a->did] =
            state::AccountTombstone{std::string(pipeline::AccountStatusName(a->status)), now_us_()};
      } else if (a->active) {
        st->accounts[a->did] = std::nullopt;
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
  return Status::OK();
}

Status IngestGuard::PrepareCommit(pipeline::TransformState* base, state::WriteBatch* batch) const {
  auto* st = static_cast<GuardState*>(base);
  for (const auto& [uri, tomb] : st->records) tombstones_->PutRecord(batch, uri, tomb);
  for (const auto& [did, tomb] : st->accounts) {
    if (tomb) {
      tombstones_->PutAccount(batch, did, *tomb);
    } else {
      tombstones_->RemoveAccount(batch, did);
    }
  }
  return Status::OK();
}

void IngestGuard::OnCommitted(pipeline::TransformState* base, bool durable) const {
  auto* st = static_cast<GuardState*>(base);
  // Durable: state now holds what the overlay held, and the filters learn it. Not durable: the
  // run ends and the chunks will be read again, so the overlay must not outlive them either way.
  if (durable && st->loaded) {
    for (const auto& [uri, tomb] : st->records) st->stored_records->Add(uri);
    for (const auto& [did, tomb] : st->accounts) {
      if (tomb) {
        st->stored_accounts.insert(did);
      } else {
        st->stored_accounts.erase(did);
      }
    }
  }
  st->Clear();
}

}  // namespace atfill::stages
