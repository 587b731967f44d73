#include "sources/crawl/discovery.hpp"

#include "base/strings.hpp"
#include "net/xrpc_error.hpp"
#include "sources/crawl/fetcher.hpp"

namespace atfill::sources {

namespace {
constexpr std::string_view kCursorDone = "done";
constexpr std::string_view kCursorNext = "next:";
}  // namespace

std::string CrawlCursorName(uint64_t job_id, std::string_view listing) {
  return "crawl/" + std::to_string(job_id) + "/" + std::string(listing);
}

std::string Truncated(std::string_view s, size_t n) {
  return s.size() <= n ? std::string(s) : std::string(s.substr(0, n)) + "...";
}

RepoDiscovery::RepoDiscovery(const CrawlOptions* options, uint64_t job, state::Cursors* cursors)
    : options_(options), job_(job), cursors_(cursors) {}

Status RepoDiscovery::Load() {
  listings_.clear();
  index_ = 0;
  switch (options_->discovery) {
    case Discovery::kListReposByCollection:
      for (const auto& c : options_->collections) listings_.emplace_back().name = c;
      break;
    case Discovery::kListRepos:
      listings_.emplace_back().name = "listRepos";
      break;
    case Discovery::kDidList:
      listings_.emplace_back().name = "dids";
      break;
  }
  for (auto& l : listings_) {
    ATFILL_ASSIGN_OR_RETURN(auto saved, cursors_->Get(CrawlCursorName(job_, l.name)));
    if (!saved) continue;
    if (*saved == kCursorDone) {
      l.done = true;
    } else if (saved->rfind(kCursorNext, 0) == 0) {
      l.cursor = saved->substr(kCursorNext.size());
    } else {
      return Status::Corrupt("crawl cursor " + CrawlCursorName(job_, l.name) + ": " +
                             QuoteForMessage(*saved) + " is not a listing cursor");
    }
  }
  return Status::OK();
}

bool RepoDiscovery::Active() const {
  for (const auto& l : listings_) {
    if (!l.done && !l.stalled) return true;
  }
  return false;
}

bool RepoDiscovery::InFlight() const {
  for (const auto& l : listings_) {
    if (l.in_flight) return true;
  }
  return false;
}

Result<std::optional<RepoDiscovery::PageRequest>> RepoDiscovery::Next(
    int64_t now_ms, const std::function<bool()>& has_room, const QueueDid& queue,
    pipeline::EventChunk* chunk) {
  std::optional<PageRequest> out;
  while (index_ < listings_.size() && (listings_[index_].done || listings_[index_].stalled)) {
    ++index_;
  }
  if (index_ >= listings_.size()) return out;
  Listing& l = listings_[index_];
  if (l.in_flight || l.not_before_ms > now_ms) return out;
  if (!has_room()) return out;
  const std::string cursor_name = CrawlCursorName(job_, l.name);
  if (options_->discovery == Discovery::kDidList) {
    // The list is the listing: queue a window's worth at a time, the index as the cursor.
    const std::vector<std::string>& dids = options_->dids;
    size_t next = l.cursor.empty() ? 0 : std::stoull(l.cursor);
    while (next < dids.size() && has_room()) {
      ATFILL_RETURN_IF_ERROR(queue(dids[next], ""));
      ++next;
    }
    if (next >= dids.size()) {
      l.done = true;
      cursors_->Set(&chunk->state_writes, cursor_name, kCursorDone);
    } else {
      l.cursor = std::to_string(next);
      cursors_->Set(&chunk->state_writes, cursor_name, std::string(kCursorNext) + l.cursor);
    }
    return out;
  }
  PageRequest& p = out.emplace();
  p.listing = index_;
  p.request.trusted_endpoint = true;  // [crawl] relay: the operator's, reached wherever it points
  p.request.url = options_->discovery == Discovery::kListRepos
                      ? ListReposUrl(options_->relay_url, options_->list_repos_limit, l.cursor)
                      : ListReposByCollectionUrl(options_->relay_url, l.name,
                                                 options_->list_repos_limit, l.cursor);
  l.in_flight = true;
  return out;
}

Status RepoDiscovery::HandleAnswer(size_t listing, Result<net::HttpResponse>& r, int64_t now_ms,
                                   const QueueDid& queue, pipeline::EventChunk* chunk) {
  Listing& l = listings_[listing];
  l.in_flight = false;
  std::string failure;
  if (!r.ok()) {
    if (r.status().code() == StatusCode::kCancelled) return Status::OK();
    failure = r.status().message();
  } else if (r->status != 200) {
    const net::XrpcError e = net::ParseXrpcError(*r);
    failure = "HTTP " + std::to_string(r->status) + (e.error.empty() ? "" : " " + e.error) +
              (e.message.empty() ? "" : ": " + e.message);
  }
  if (failure.empty()) {
    auto page = options_->discovery == Discovery::kListRepos ? ParseListRepos(r->body)
                                                             : ParseListReposByCollection(r->body);
    if (!page.ok()) {
      failure = page.status().message();
    } else {
      ++pages_;
      if (!l.answered) {
        // A listing that stalled in an earlier run answers now.
        chunk->resolved_errors.push_back({"listing_failed", l.name});
        l.answered = true;
      }
      l.attempts = 0;
      for (auto& e : page->errors) chunk->errors.push_back(std::move(e));
      uint64_t inactive = 0;
      const bool by_collection = options_->discovery == Discovery::kListReposByCollection;
      for (const auto& repo : page->repos) {
        if (!repo.active) {
          ++inactive;
          continue;
        }
        ATFILL_RETURN_IF_ERROR(queue(repo.did, by_collection ? std::string_view(l.name) : ""));
      }
      chunk->counters.emplace_back("repos_listed", static_cast<int64_t>(page->repos.size()));
      if (inactive != 0) {
        chunk->counters.emplace_back("repos_inactive_skipped", static_cast<int64_t>(inactive));
      }
      const std::string name = CrawlCursorName(job_, l.name);
      if (page->cursor.empty() || page->repos.empty()) {
        l.done = true;
        cursors_->Set(&chunk->state_writes, name, kCursorDone);
      } else {
        l.cursor = page->cursor;
        cursors_->Set(&chunk->state_writes, name, std::string(kCursorNext) + l.cursor);
      }
      return Status::OK();
    }
  }
  // The listing is tried again after a delay; out of tries it stalls and the job pauses.
  l.last_error = failure;
  if (++l.attempts >= options_->unit_attempts) {
    l.stalled = true;
    chunk->errors.push_back({"listing_failed", l.name,
                             "listing " + l.name + " at " + options_->relay_url + " failed " +
                                 std::to_string(l.attempts) + " times: " + Truncated(failure)});
  } else {
    l.not_before_ms = now_ms + options_->retry_delay_ms;
    ++retries_;
  }
  return Status::OK();
}

}  // namespace atfill::sources
