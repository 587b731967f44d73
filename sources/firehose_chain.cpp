#include "sources/firehose_chain.hpp"

#include <utility>

namespace atfill::sources {

FirehoseChain::FirehoseChain(const state::RepoChains* chains, FirehoseChainOptions options)
    : chains_(chains), options_(std::move(options)) {}

Result<std::optional<state::RepoChain>> FirehoseChain::Link(std::string_view did) const {
  if (auto it = pending_.find(did); it != pending_.end()) {
    return std::optional<state::RepoChain>(it->second.link);
  }
  return chains_->Get(did);
}

void FirehoseChain::SetLink(std::string_view did, state::RepoChain link,
                            pipeline::EventChunk* chunk) {
  chains_->Set(&chunk->state_writes, did, link);
  pending_[std::string(did)] = {std::move(link), chunk->seq};
}

void FirehoseChain::Desync(std::string_view did, std::string why, pipeline::EventChunk* chunk) {
  auto link = Link(did);
  state::RepoChain broken = link.ok() && link->has_value() ? **link : state::RepoChain{};
  broken.desynchronized = true;
  SetLink(did, std::move(broken), chunk);
  held_[std::string(did)];
  chunk->counters.emplace_back("firehose_desync", 1);
  chunk->errors.push_back({"repo_desync", std::string(did), std::move(why) + "; resyncing it"});
}

Status FirehoseChain::Judge(const FirehoseCommit& frame, std::string data,
                            std::vector<pipeline::Event> events, pipeline::EventChunk* chunk,
                            bool* resync) {
  auto hold = [&](std::deque<Held>& held) {
    held.push_back({frame, std::move(data), std::move(events)});
    // The frame's blocks are not needed again: the events hold what the commit wrote.
    held.back().frame.blocks.clear();
    if (held.size() > options_.max_held_per_repo) held.pop_front();
  };
  if (auto it = held_.find(frame.repo); it != held_.end()) {
    hold(it->second);
    return Status::OK();
  }
  ATFILL_ASSIGN_OR_RETURN(std::optional<state::RepoChain> link, Link(frame.repo));
  std::string why;
  const std::string prev_data = frame.prev_data ? frame.prev_data->ToString() : "";
  switch (state::JudgeCommit(link, frame.rev, prev_data, &why)) {
    case state::ChainVerdict::kApply:
      for (pipeline::Event& e : events) chunk->events.push_back(std::move(e));
      SetLink(frame.repo, {frame.rev, std::move(data), false}, chunk);
      chunk->counters.emplace_back("firehose_applied", 1);
      break;
    case state::ChainVerdict::kStale:
      chunk->counters.emplace_back("firehose_stale", 1);
      break;
    case state::ChainVerdict::kDesync:
      // A repo a previous run left desynchronized is resynced without a second report.
      if (!link || !link->desynchronized) {
        Desync(frame.repo, "commit seq " + std::to_string(frame.seq) + ": " + why, chunk);
      }
      hold(held_[frame.repo]);
      *resync = true;
      break;
  }
  return Status::OK();
}

Status FirehoseChain::Commit(const FirehoseCommit& frame, const VerifiedCommit& verified,
                             pipeline::EventChunk* chunk, bool* resync) {
  *resync = false;
  std::vector<pipeline::Event> events;
  std::string kind;
  if (Status s = FirehoseCommitEvents(frame, verified, pipeline::Origin::kLive, &events, &kind);
      !s.ok()) {
    // A record that cannot be indexed leaves the repo behind its chain: the resync brings it.
    chunk->errors.push_back({kind, frame.repo, s.message()});
    if (!held_.contains(frame.repo)) {
      Desync(frame.repo, "commit seq " + std::to_string(frame.seq) + " could not be applied",
             chunk);
      *resync = true;
    }
    return Status::OK();
  }
  std::erase_if(events, [&](const pipeline::Event& e) {
    return !pipeline::CollectionMatches(std::get<pipeline::RecordEvent>(e).collection,
                                        options_.collections);
  });
  return Judge(frame, verified.commit.data.ToString(), std::move(events), chunk, resync);
}

Status FirehoseChain::Sync(const FirehoseSync& frame, pipeline::EventChunk* chunk, bool* resync) {
  *resync = false;
  if (held_.contains(frame.did)) return Status::OK();
  Desync(frame.did, "#sync seq " + std::to_string(frame.seq) + " at rev " + frame.rev, chunk);
  *resync = true;
  return Status::OK();
}

Status FirehoseChain::Resynced(std::string_view did, FetchedRepo repo, pipeline::EventChunk* chunk,
                               bool* resync) {
  *resync = false;
  chunk->events.push_back(pipeline::ResyncMarker(did, options_.collections, repo.rev));
  for (pipeline::RecordEvent& r : repo.records) {
    r.origin = pipeline::Origin::kLive;
    chunk->events.push_back(std::move(r));
  }
  SetLink(did, {repo.rev, std::move(repo.data), false}, chunk);
  chunk->counters.emplace_back("firehose_resynced", 1);
  std::deque<Held> held;
  if (auto it = held_.find(did); it != held_.end()) {
    held = std::move(it->second);
    held_.erase(it);
  }
  for (Held& h : held) {
    bool again = false;
    ATFILL_RETURN_IF_ERROR(Judge(h.frame, std::move(h.data), std::move(h.events), chunk, &again));
    *resync = *resync || again;
  }
  return Status::OK();
}

void FirehoseChain::ResyncFailed(std::string_view did, std::string_view why,
                                 pipeline::EventChunk* chunk) {
  chunk->counters.emplace_back("firehose_failed", 1);
  chunk->errors.push_back(
      {"resync_failed", std::string(did), std::string(why) + "; the repo stays desynchronized"});
}

void FirehoseChain::Committed(uint64_t through_seq) {
  std::erase_if(pending_, [&](const auto& p) { return p.second.chunk_seq <= through_seq; });
}

}  // namespace atfill::sources
