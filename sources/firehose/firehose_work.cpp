// The firehose's work on the engine's threads: Decode on the workers (frames decoded and verified,
// resync answers read) and the chain stage on the ordered node (sources/firehose/firehose.hpp).
#include <utility>

#include "atproto/car.hpp"
#include "pipeline/event.hpp"
#include "sources/crawl/fetcher.hpp"
#include "sources/firehose/firehose_impl.hpp"

namespace atfill::sources {

void FirehoseSource::Impl::Refuse(const FirehoseHead& h, const std::string& kind,
                                  const std::string& message, pipeline::EventChunk* chunk) const {
  refused.fetch_add(1);
  chunk->counters.emplace_back("firehose_refused", 1);
  chunk->counters.emplace_back("firehose_refused_" + kind, 1);
  chunk->errors.push_back({kind, FrameKey(h.seq, h.did),
                           std::string(FirehoseKindName(h.kind)) + " refused: " + message});
}

void FirehoseSource::Impl::RetryLater(const std::string& did) const {
  std::shared_ptr<Shared> sh = shared;
  http->After(options.resync_retry_ms, [sh, did] {
    {
      std::lock_guard<std::mutex> lock(sh->mu);
      sh->retries.push_back(did);
    }
    sh->cv.notify_one();
  });
}

void FirehoseSource::Impl::CountResyncFailed(const std::string& did, const std::string& why,
                                             pipeline::EventChunk* chunk) {
  chunk->counters.emplace_back("firehose_failed", 1);
  chunk->errors.push_back({"resync_failed", did, why + "; the repo stays desynchronized"});
}

void FirehoseSource::Impl::DecodeRepo(Item& item, const std::vector<std::string>& wanted,
                                      Payload* payload, pipeline::EventChunk* chunk) const {
  const std::string& did = item.head.did;
  RepoFailure failure = RepoFailure::kNone;
  auto repo =
      ReadRepoRecords(did, item.key->signing_key, item.bytes, wanted, options.limits, &failure);
  if (!repo.ok()) {
    CountResyncFailed(did, repo.status().message(), chunk);
    RetryLater(did);
    return;
  }
  for (auto& e : repo->errors) chunk->errors.push_back(std::move(e));
  chunk->events.push_back(pipeline::ResyncMarker(did, wanted, repo->rev));
  for (pipeline::RecordEvent& r : repo->records) {
    r.origin = pipeline::Origin::kLive;
    r.position = 0;
    chunk->events.push_back(std::move(r));
  }
  Unit u;
  u.kind = Unit::Kind::kResync;
  u.commit.repo = did;
  u.commit.rev = std::move(repo->rev);
  u.commit.data = std::move(repo->data_cid);
  payload->units.push_back(std::move(u));
}

void FirehoseSource::Impl::DecodeFrame(Item& item, const std::vector<std::string>& wanted,
                                       Payload* payload, pipeline::EventChunk* chunk) const {
  const FirehoseHead& h = item.head;
  Unit u;
  u.commit.repo = h.did;
  u.commit.seq = h.seq;
  if (item.account) {
    chunk->events.push_back(std::move(*item.account));
    payload->units.push_back(std::move(u));  // kPass
    return;
  }
  FirehoseFrame frame;
  std::string kind;
  if (Status st = DecodeFirehoseFrame(AsBytes(item.bytes), &frame, &kind); !st.ok()) {
    chunk->counters.emplace_back("firehose_bad_frames", 1);
    chunk->errors.push_back(
        {kind.empty() ? "bad_frame" : kind, FrameKey(h.seq, h.did), st.message()});
    ++chunk->dropped;
    return;
  }
  if (auto* s = std::get_if<FirehoseSync>(&frame.payload)) {
    atproto::Commit commit;
    if (Status st = VerifyFirehoseSync(*s, item.key->key, &commit, &kind); !st.ok()) {
      Refuse(h, kind.empty() ? "bad_commit" : kind, st.message(), chunk);
      return;
    }
    u.kind = Unit::Kind::kSync;
    u.commit.rev = s->rev;
    payload->units.push_back(std::move(u));
    return;
  }
  auto* c = std::get_if<FirehoseCommit>(&frame.payload);
  if (c == nullptr) return;  // Read routes only commits, syncs and accounts here
  u.commit.rev = c->rev;
  if (c->too_big) {
    // Its blocks are incomplete by design: the repo is fetched whole instead.
    u.kind = Unit::Kind::kSync;
    payload->units.push_back(std::move(u));
    return;
  }
  VerifiedCommit v;
  if (Status st = VerifyFirehoseCommit(*c, item.key->key, &v, &kind); !st.ok()) {
    Refuse(h, kind.empty() ? "bad_commit" : kind, st.message(), chunk);
    return;
  }
  verified.fetch_add(1);
  chunk->counters.emplace_back("firehose_verified", 1);
  const size_t first = chunk->events.size();
  if (Status st = FirehoseCommitEvents(*c, v, pipeline::Origin::kLive, &chunk->events, &kind);
      !st.ok()) {
    chunk->events.resize(first);
    chunk->errors.push_back({kind, c->repo, st.message()});
    u.kind = Unit::Kind::kUnappliable;
    payload->units.push_back(std::move(u));
    return;
  }
  // The firehose carries every collection: the others are dropped here.
  auto kept = chunk->events.begin() + static_cast<std::ptrdiff_t>(first);
  for (auto e = kept; e != chunk->events.end(); ++e) {
    if (pipeline::CollectionMatches(std::get<pipeline::RecordEvent>(*e).collection, wanted)) {
      if (e != kept) *kept = std::move(*e);
      ++kept;
    }
  }
  chunk->events.erase(kept, chunk->events.end());
  u.kind = Unit::Kind::kCommit;
  u.commit.prev_data = c->prev_data ? c->prev_data->ToString() : "";
  u.commit.data = v.commit.data.ToString();
  payload->units.push_back(std::move(u));
}

Status FirehoseSource::Impl::Judge(pipeline::EventChunk* chunk) {
  auto* payload = dynamic_cast<Payload*>(chunk->payload.get());
  if (payload == nullptr || payload->units.empty()) return Status::OK();
  std::vector<pipeline::Event> in = std::move(chunk->events);
  chunk->events.clear();
  chunk->events.reserve(in.size());
  size_t next = 0;
  auto take = [&](const std::string& did, uint64_t position) {
    std::vector<pipeline::Event> out;
    while (next < in.size() && pipeline::PositionOf(in[next]) == position &&
           pipeline::DidOf(in[next]) == did) {
      out.push_back(std::move(in[next++]));
    }
    return out;
  };
  std::deque<std::pair<std::string, bool>> news;
  {
    std::lock_guard<std::mutex> lock(chain_mu);
    for (Unit& u : payload->units) {
      const std::string did = u.commit.repo;
      const auto seq = static_cast<uint64_t>(u.commit.seq);
      bool resync = false;
      switch (u.kind) {
        case Unit::Kind::kCommit: {
          std::vector<pipeline::Event> events = take(did, seq);
          ATFILL_RETURN_IF_ERROR(
              chain->Commit(std::move(u.commit), std::move(events), chunk, &resync));
          break;
        }
        case Unit::Kind::kUnappliable:
          chain->Unappliable(did, u.commit.seq, chunk, &resync);
          break;
        case Unit::Kind::kSync: {
          FirehoseSync s;
          s.seq = u.commit.seq;
          s.did = did;
          s.rev = u.commit.rev;
          ATFILL_RETURN_IF_ERROR(chain->Sync(s, chunk, &resync));
          break;
        }
        case Unit::Kind::kResync: {
          std::vector<pipeline::Event> events = take(did, 0);
          ATFILL_RETURN_IF_ERROR(chain->Resynced(did, std::move(u.commit.rev),
                                                 std::move(u.commit.data), std::move(events), chunk,
                                                 &resync));
          news.emplace_back(did, false);
          break;
        }
        case Unit::Kind::kPass:
          for (pipeline::Event& e : take(did, seq)) chunk->events.push_back(std::move(e));
          break;
      }
      if (resync) news.emplace_back(did, true);
    }
    desynchronized_now = chain->desynchronized();
  }
  // Nothing else is expected; whatever it is, it is not lost.
  for (; next < in.size(); ++next) chunk->events.push_back(std::move(in[next]));
  payload->units.clear();
  if (!news.empty()) {
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      for (auto& n : news) shared->chain_news.push_back(std::move(n));
    }
    shared->cv.notify_one();
  }
  return Status::OK();
}

void FirehoseSource::Decode(pipeline::EventChunk* chunk) const {
  auto* payload = dynamic_cast<Impl::Payload*>(chunk->payload.get());
  if (payload == nullptr) return;
  const std::vector<std::string>& wanted = *payload->collections;
  for (Impl::Item& item : payload->items) {
    if (item.repo) {
      impl_->DecodeRepo(item, wanted, payload, chunk);
    } else {
      impl_->DecodeFrame(item, wanted, payload, chunk);
    }
    item.bytes = std::string();  // released as soon as it is read
  }
  payload->items.clear();
}

}  // namespace atfill::sources
