#include "sources/crawl/crawl_impl.hpp"

#include "net/xrpc_error.hpp"
#include "pipeline/job.hpp"
#include "state/error_log.hpp"

namespace atfill::sources {

void CrawlSource::Impl::FinishUnit(Unit& u, EventChunk* chunk, const std::string& error_kind,
                                   const std::string& message, bool decode_reports) {
  queue.Finish(&chunk->state_writes, job, state::WorkUnit{u.position, u.id, ""});
  if (options.hold_live) holds.MarkFinished(&chunk->state_writes, u.did);
  chunk->counters.emplace_back("units_finished", 1);
  chunk->counters.emplace_back(pipeline::kProcessedRepos, 1);
  chunk->counters.emplace_back(pipeline::kInputDone, 1);
  ++stats.units_finished;
  // A unit an earlier run deferred has now reached its outcome (logged below if it is an
  // error): its deferral no longer stands. Only units queued before this run can have one, so
  // a fresh crawl asks the error log nothing.
  if (u.position <= resume_upto) chunk->resolved_errors.push_back({"unit_deferred", UnitKey(u)});
  if (!error_kind.empty()) {
    chunk->errors.push_back({error_kind, UnitKey(u), message});
    if (state::IsOutcomeKind(error_kind)) {
      chunk->counters.emplace_back("units_unavailable", 1);
      ++stats.units_unavailable;
    } else {
      chunk->counters.emplace_back("units_failed", 1);
      ++stats.units_failed;
    }
  }
  // A host's units are counted as they end (with done or errors; Decode adds those for a
  // repo CAR), so a unit that was resolved, then interrupted and resolved again after a
  // restart counts once.
  if (!u.pds.empty()) {
    log.AddHost(&chunk->state_writes, job, u.pds, 1, !decode_reports && error_kind.empty() ? 1 : 0,
                !decode_reports && !error_kind.empty() ? 1 : 0, 0);
  }
  if (!decode_reports) {
    state::RecentRepo recent;
    recent.seq = ++recent_seq;
    recent.did = u.did;
    recent.host = u.pds;
    recent.records = u.records;
    recent.outcome = error_kind.empty() ? "ok" : error_kind;
    recent.fetched_at_us = pipeline::NowMicros();
    log.PutRecent(&chunk->state_writes, job, recent, options.recent_repos);
  }
  scheduler.Drop(u.position);
  finishing.emplace_back(chunks_returned, u.id);
  units.erase(u.position);
}

void CrawlSource::Impl::ForgetCommittedFinishes() {
  const int64_t through = committed_seq.load(std::memory_order_acquire);
  while (!finishing.empty() && static_cast<int64_t>(finishing.front().first) <= through) {
    ids.erase(finishing.front().second);
    finishing.pop_front();
  }
}

void CrawlSource::Impl::RetryOrDefer(Unit& u, EventChunk* chunk, const std::string& kind,
                                     const std::string& message) {
  if (++u.attempts < options.unit_attempts) {
    ++stats.retries;
    scheduler.Delay(u.position, SteadyMs() + options.retry_delay_ms);
    return;
  }
  scheduler.Drop(u.position);
  ++deferred;
  ++stats.units_deferred;
  last_deferred = UnitKey(u) + ": " + message;
  chunk->errors.push_back({"unit_deferred", UnitKey(u),
                           kind + " after " + std::to_string(u.attempts) +
                               " tries; the unit stays queued for the next run: " + message});
  chunk->counters.emplace_back("units_deferred", 1);
  units.erase(u.position);  // its id stays in `ids`: not queued twice in this run
}

void CrawlSource::Impl::HandleResolved(Completion& c, EventChunk* chunk) {
  const std::vector<uint64_t> group = scheduler.Resolved(c.did);
  ResolveOutcome& o = c.outcome;
  std::string host;
  if (o.ok()) {
    std::string pds = o.doc->pds_endpoint;
    while (!pds.empty() && pds.back() == '/') pds.pop_back();
    Result<std::string> key = net::HostKey(pds);
    host = key.ok() ? *key : pds;
    o.doc->pds_endpoint = std::move(pds);
  }
  int64_t ended = 0;  // units whose resolution ended: to a PDS or with a final error
  for (uint64_t pos : group) {
    auto it = units.find(pos);
    if (it == units.end()) continue;
    Unit& u = it->second;
    if (o.ok() || !o.retryable) ++ended;
    if (!o.ok()) {
      if (o.retryable) {
        RetryOrDefer(u, chunk, o.error_kind, o.message);
      } else {
        FinishUnit(u, chunk, o.error_kind, o.message, false);
      }
      continue;
    }
    u.pds = o.doc->pds_endpoint;
    u.signing_key = o.doc->signing_key;
    scheduler.Ready(u.position, host);
  }
  if (ended != 0) chunk->counters.emplace_back(pipeline::kResolvedRepos, ended);
}

void CrawlSource::Impl::HandleFetched(Completion& c, EventChunk* chunk) {
  auto it = units.find(c.unit);
  if (it == units.end()) return;
  Unit& u = it->second;
  Result<net::HttpResponse>& r = *c.response;
  if (!r.ok()) {
    const Status& s = r.status();
    switch (s.code()) {
      case StatusCode::kCancelled:
        scheduler.Drop(u.position);
        return;
      case StatusCode::kInvalid:
        FinishUnit(u, chunk, "bad_endpoint",
                   "PDS " + u.pds + " of " + u.did + " refused: " + s.message(), false);
        return;
      case StatusCode::kResourceExhausted:
        FinishUnit(u, chunk, "response_too_large",
                   "PDS " + u.pds + " answer for " + u.did + ": " + s.message(), false);
        return;
      default:
        RetryOrDefer(u, chunk, "fetch_failed",
                     "PDS " + u.pds + " for " + u.did + ": " + s.message());
        return;
    }
  }
  net::HttpResponse& resp = *r;
  if (resp.status != 200) {
    const net::XrpcError e = net::ParseXrpcError(resp);
    const std::string what = "PDS " + u.pds + " answered HTTP " + std::to_string(resp.status) +
                             (e.error.empty() ? "" : " " + e.error) +
                             (e.message.empty() ? "" : " (" + Truncated(e.message) + ")") +
                             " for " + u.did;
    if (net::IsAccountStateXrpcError(resp.status, e)) {
      FinishUnit(u, chunk, "repo_unavailable", what, false);
    } else if (net::IsFinalXrpcError(resp.status, e) ||
               (resp.status >= 400 && resp.status < 500 && resp.status != 408 &&
                resp.status != 429 && u.attempts + 1 >= options.unit_attempts)) {
      FinishUnit(u, chunk, "fetch_rejected", what, false);
    } else {
      RetryOrDefer(u, chunk, "fetch_failed", what);
    }
    return;
  }
  chunk->bytes_read += resp.body.size();
  if (options.mode == FetchMode::kGetRepo && !u.since.empty()) {
    // An answer since the stored rev: read here, because one that cannot settle the repo is
    // fetched again whole (a unit's next fetch is decided on this thread).
    RepoFailure failure = RepoFailure::kNone;
    auto diff = ReadRepoDiff(u.did, u.signing_key, resp.body, u.stored, options.collections,
                             options.limits, &failure);
    if (!diff.ok()) {
      std::string kind(RepoFailureKind(failure));
      FinishUnit(u, chunk, kind.empty() ? "bad_repo" : kind, diff.status().message(), false);
      return;
    }
    if (diff->needs_full) {
      chunk->counters.emplace_back("repos_incremental_refetched", 1);
      u.whole = true;
      u.since.clear();
      u.stored.clear();
      SubmitFetch(u);
      return;
    }
    FetchedResponses& out = Responses(chunk);
    out.bytes += resp.body.size();
    out.items.push_back({FetchedResponse::Kind::kRepo, u.did, "", u.pds, u.signing_key,
                         ++recent_seq, "", std::make_shared<RepoDiff>(std::move(*diff)), false});
    FinishUnit(u, chunk, "", "", true);
    return;
  }
  if (options.mode == FetchMode::kGetRepo) {
    FetchedResponses& out = Responses(chunk);
    out.bytes += resp.body.size();
    out.items.push_back({FetchedResponse::Kind::kRepo, u.did, "", u.pds, u.signing_key,
                         ++recent_seq, std::move(resp.body), nullptr, u.whole});
    FinishUnit(u, chunk, "", "", true);
    return;
  }
  PageScan scan = ScanRecordsPage(parser, resp.body);
  if (!scan.ok) {
    FinishUnit(
        u, chunk, "bad_response",
        "PDS " + u.pds + " listRecords for " + u.did + " " + u.collection + ": " + scan.error,
        false);
    return;
  }
  u.records += scan.count;
  if (scan.count > 0) {
    FetchedResponses& out = Responses(chunk);
    out.bytes += resp.body.size();
    out.items.push_back({FetchedResponse::Kind::kRecordsPage, u.did, u.collection, u.pds, "", 0,
                         std::move(resp.body), nullptr, false});
  }
  if (scan.count == 0 || scan.cursor.empty() || scan.cursor == u.page_cursor) {
    FinishUnit(u, chunk, "", "", false);
    return;
  }
  u.page_cursor = std::move(scan.cursor);
  u.attempts = 0;
  SubmitFetch(u);
}

}  // namespace atfill::sources
