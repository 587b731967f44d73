#include "sources/firehose/firehose_chain.hpp"

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

Status FirehoseChain::Judge(ChainCommit commit, std::vector<pipeline::Event> events,
                            pipeline::EventChunk* chunk, bool* resync) {
  auto hold = [&](std::deque<Held>& held) {
    held.push_back({std::move(commit), std::move(events)});
    if (held.size() > options_.max_held_per_repo) held.pop_front();
  };
  if (auto it = held_.find(commit.repo); it != held_.end()) {
    hold(it->second);
    return Status::OK();
  }
  ATFILL_ASSIGN_OR_RETURN(std::optional<state::RepoChain> link, Link(commit.repo));
  std::string why;
  switch (state::JudgeCommit(link, commit.rev, commit.prev_data, &why)) {
    case state::ChainVerdict::kApply:
      for (pipeline::Event& e : events) chunk->events.push_back(std::move(e));
      SetLink(commit.repo, {commit.rev, std::move(commit.data), false}, chunk);
      chunk->counters.emplace_back("firehose_applied", 1);
      break;
    case state::ChainVerdict::kStale:
      chunk->counters.emplace_back("firehose_stale", 1);
      break;
    case state::ChainVerdict::kDesync: {
      // A repo a previous run left desynchronized is resynced without a second report.
      if (!link || !link->desynchronized) {
        Desync(commit.repo, "commit seq " + std::to_string(commit.seq) + ": " + why, chunk);
      }
      const std::string repo = commit.repo;
      hold(held_[repo]);
      *resync = true;
      break;
    }
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
    chunk->errors.push_back({kind, frame.repo, s.message()});
    Unappliable(frame.repo, frame.seq, chunk, resync);
    return Status::OK();
  }
  std::erase_if(events, [&](const pipeline::Event& e) {
    return !pipeline::CollectionMatches(std::get<pipeline::RecordEvent>(e).collection,
                                        options_.collections);
  });
  ChainCommit c{frame.seq, frame.repo, frame.rev,
                frame.prev_data ? frame.prev_data->ToString() : "",
                verified.commit.data.ToString()};
  return Commit(std::move(c), std::move(events), chunk, resync);
}

Status FirehoseChain::Commit(ChainCommit commit, std::vector<pipeline::Event> events,
                             pipeline::EventChunk* chunk, bool* resync) {
  *resync = false;
  return Judge(std::move(commit), std::move(events), chunk, resync);
}

void FirehoseChain::Unappliable(std::string_view did, int64_t seq, pipeline::EventChunk* chunk,
                                bool* resync) {
  *resync = false;
  // A record that cannot be indexed leaves the repo behind its chain: the resync brings it.
  if (held_.contains(did)) return;
  Desync(did, "commit seq " + std::to_string(seq) + " could not be applied", chunk);
  *resync = true;
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
  std::vector<pipeline::Event> events;
  events.reserve(repo.records.size() + 1);
  events.push_back(pipeline::ResyncMarker(did, options_.collections, repo.rev));
  for (pipeline::RecordEvent& r : repo.records) {
    r.origin = pipeline::Origin::kLive;
    events.push_back(std::move(r));
  }
  return Resynced(did, std::move(repo.rev), std::move(repo.data), std::move(events), chunk, resync);
}

Status FirehoseChain::Resynced(std::string_view did, std::string rev, std::string data,
                               std::vector<pipeline::Event> events, pipeline::EventChunk* chunk,
                               bool* resync) {
  *resync = false;
  for (pipeline::Event& e : events) chunk->events.push_back(std::move(e));
  SetLink(did, {std::move(rev), std::move(data), false}, chunk);
  chunk->counters.emplace_back("firehose_resynced", 1);
  std::deque<Held> held;
  if (auto it = held_.find(did); it != held_.end()) {
    held = std::move(it->second);
    held_.erase(it);
  }
  for (Held& h : held) {
    bool again = false;
    ATFILL_RETURN_IF_ERROR(Judge(std::move(h.commit), std::move(h.events), chunk, &again));
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
