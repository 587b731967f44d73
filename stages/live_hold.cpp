#include "stages/live_hold.hpp"

#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "pipeline/engine.hpp"

namespace atfill::stages {
namespace {

// What one batch changed: the repos it held events of (one entry per event) and released.
struct BatchHolds {
  std::vector<std::string> held;
  std::vector<std::string> released;
};

struct HoldState : pipeline::TransformState {
  std::mutex mu;  // Process/SealBatch (ordered node) against OnCommitted (sink node)
  state::WriteBatch pending;
  BatchHolds current;
  std::deque<BatchHolds> sealed;
  // Held events per repo whose state write is not durable yet: such a repo is not released
  // until it is (the release reads held events back from state).
  std::unordered_map<std::string, uint32_t> inflight;
  // Repos released by a batch not yet durable: their events pass.
  std::unordered_set<std::string> releasing;
  uint64_t last_order = 0;
  // No crawl runs and the last look found nothing held.
  bool drained = false;
};

struct Candidate {
  std::string did;
  state::HoldCheckpoint checkpoint;
};

}  // namespace

LiveHold::LiveHold(state::LiveHolds* holds, LiveHoldOptions options)
    : holds_(holds), options_(std::move(options)) {
  if (!options_.backfill_running) options_.backfill_running = [] { return false; };
  if (!options_.hold_all) options_.hold_all = [] { return false; };
  if (!options_.clock) {
    options_.clock = [] { return static_cast<uint64_t>(pipeline::NowMicros()); };
  }
  if (options_.max_releases_per_chunk == 0) options_.max_releases_per_chunk = 1;
}

std::unique_ptr<pipeline::TransformState> LiveHold::NewState() const {
  return std::make_unique<HoldState>();
}

Status LiveHold::Process(pipeline::TransformState* state, pipeline::EventChunk* chunk) const {
  auto& s = static_cast<HoldState&>(*state);
  std::lock_guard<std::mutex> lock(s.mu);
  const bool hold_all = options_.hold_all();
  const bool running = hold_all || options_.backfill_running();
  if (running) s.drained = false;

  // 1. Repos whose hold ends: checkpointed with no unit left, or every held repo once no crawl
  // runs.
  std::vector<Candidate> candidates;
  auto eligible = [&](std::string_view did) {
    const std::string d(did);
    return s.releasing.count(d) == 0 && s.inflight.count(d) == 0;
  };
  Status inner = Status::OK();
  if (running) {
    ATFILL_RETURN_IF_ERROR(holds_->ScanCheckpoints([&](std::string_view did, std::string_view rev) {
      if (!eligible(did)) return true;
      auto left = holds_->Unfinished(did);
      if (!left.ok()) {
        inner = left.status();
        return false;
      }
      if (*left > 0) return true;  // another unit of the repo is still queued
      candidates.push_back({std::string(did), state::HoldCheckpoint::Parse(rev)});
      return candidates.size() < options_.max_releases_per_chunk;
    }));
  } else if (!s.drained) {
    bool skipped = false;
    std::unordered_set<std::string> seen;
    ATFILL_RETURN_IF_ERROR(holds_->ScanHeldRepos([&](std::string_view did) {
      if (!eligible(did)) {
        skipped = true;
        return true;
      }
      if (!seen.emplace(did).second) return true;  // marked and holding events: listed twice
      auto rev = holds_->Checkpoint(did);
      if (!rev.ok()) {
        inner = rev.status();
        return false;
      }
      candidates.push_back({std::string(did), state::HoldCheckpoint::Parse(rev->value_or(""))});
      return candidates.size() < options_.max_releases_per_chunk;
    }));
    if (candidates.empty() && !skipped) s.drained = true;
  }
  ATFILL_RETURN_IF_ERROR(inner);

  std::vector<pipeline::Event> released;
  int64_t dropped = 0;
  int64_t unwanted = 0;
  for (const auto& c : candidates) {
    std::vector<uint64_t> orders;
    ATFILL_RETURN_IF_ERROR(holds_->ScanHeld(c.did, [&](uint64_t order, std::string_view bytes) {
      orders.push_back(order);
      auto event = pipeline::DecodeEvent(bytes);
      if (!event.ok()) {
        chunk->errors.push_back({"bad_held_event", c.did, event.status().message()});
        ++dropped;
        return true;
      }
      if (const auto* r = std::get_if<pipeline::RecordEvent>(&*event);
          r != nullptr && options_.consumes && !options_.consumes(r->collection)) {
        ++unwanted;  // its collection was removed while it was held
        return true;
      }
      if (const auto* r = std::get_if<pipeline::RecordEvent>(&*event);
          r != nullptr && !c.checkpoint.rev.empty() && !r->rev.empty() &&
          r->rev <= c.checkpoint.rev && c.checkpoint.Covers(r->collection)) {
        ++dropped;  // the fetched repo at the checkpoint already has it
        return true;
      }
      released.push_back(std::move(*event));
      return true;
    }));
    holds_->Release(&s.pending, c.did, orders);
    s.releasing.insert(c.did);
    s.current.released.push_back(c.did);
  }
  if (!candidates.empty()) {
    chunk->counters.emplace_back("live_holds_released", static_cast<int64_t>(candidates.size()));
  }
  if (!released.empty()) {
    chunk->counters.emplace_back("live_released", static_cast<int64_t>(released.size()));
  }
  if (dropped > 0) chunk->counters.emplace_back("live_hold_dropped", dropped);
  if (unwanted > 0) chunk->counters.emplace_back("live_unwanted", unwanted);

  // 2. This chunk's events of repos being backfilled are held.
  int64_t held = 0;
  // Once no crawl runs, repos still held (past this chunk's releases) keep holding until theirs.
  if ((running || !s.drained) && !chunk->events.empty()) {
    std::unordered_map<std::string, bool> hold;  // per repo, for this chunk
    std::vector<pipeline::Event> kept;
    kept.reserve(chunk->events.size());
    for (auto& e : chunk->events) {
      const std::string& did = pipeline::DidOf(e);
      auto it = hold.find(did);
      if (it == hold.end()) {
        bool h = false;
        if (s.releasing.count(did) == 0) {
          if (hold_all || s.inflight.count(did) != 0) {
            h = true;
          } else {
            ATFILL_ASSIGN_OR_RETURN(int64_t left, holds_->Unfinished(did));
            if (left > 0) {
              h = true;
            } else {
              // Checkpointed but not released yet (its release waits for earlier holds).
              ATFILL_ASSIGN_OR_RETURN(auto ckpt, holds_->Checkpoint(did));
              h = ckpt.has_value();
            }
          }
        }
        it = hold.emplace(did, h).first;
      }
      if (!it->second) {
        kept.push_back(std::move(e));
        continue;
      }
      s.last_order = std::max(s.last_order + 1, options_.clock());
      holds_->Hold(&s.pending, did, s.last_order, pipeline::EncodeEvent(e));
      ++s.inflight[did];
      s.current.held.push_back(did);
      ++held;
    }
    chunk->events = std::move(kept);
  }
  if (held > 0) chunk->counters.emplace_back("live_held", held);
  if (!released.empty()) {
    // Held events come before the repo's later ones.
    released.insert(released.end(), std::make_move_iterator(chunk->events.begin()),
                    std::make_move_iterator(chunk->events.end()));
    chunk->events = std::move(released);
  }
  return Status::OK();
}

Status LiveHold::SealBatch(pipeline::TransformState* state, state::WriteBatch* batch) const {
  auto& s = static_cast<HoldState&>(*state);
  std::lock_guard<std::mutex> lock(s.mu);
  batch->Append(s.pending);
  s.pending.Clear();
  s.sealed.push_back(std::move(s.current));
  s.current = {};
  return Status::OK();
}

void LiveHold::OnCommitted(pipeline::TransformState* state, bool /*durable*/) const {
  auto& s = static_cast<HoldState&>(*state);
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.sealed.empty()) return;
  BatchHolds done = std::move(s.sealed.front());
  s.sealed.pop_front();
  for (const auto& did : done.held) {
    auto it = s.inflight.find(did);
    if (it != s.inflight.end() && --it->second == 0) s.inflight.erase(it);
  }
  for (const auto& did : done.released) s.releasing.erase(did);
}

}  // namespace atfill::stages
