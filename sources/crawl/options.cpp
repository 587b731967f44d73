#include "sources/crawl/options.hpp"

#include <algorithm>

#include "atproto/syntax.hpp"
#include "base/strings.hpp"

namespace atfill::sources {

std::string_view DiscoveryName(Discovery d) {
  switch (d) {
    case Discovery::kListReposByCollection:
      return "listReposByCollection";
    case Discovery::kListRepos:
      return "listRepos";
    case Discovery::kDidList:
      return "dids";
  }
  return "?";
}

std::string_view FetchModeName(FetchMode m) {
  return m == FetchMode::kGetRepo ? "getRepo" : "listRecords";
}

Result<Discovery> ParseDiscovery(std::string_view text) {
  for (Discovery d :
       {Discovery::kListReposByCollection, Discovery::kListRepos, Discovery::kDidList}) {
    if (text == DiscoveryName(d)) return d;
  }
  return Status::Invalid("unknown discovery " + QuoteForMessage(text) +
                         " (expected listReposByCollection, listRepos or dids)");
}

Result<FetchMode> ParseFetchMode(std::string_view text) {
  if (text == "listRecords") return FetchMode::kListRecords;
  if (text == "getRepo") return FetchMode::kGetRepo;
  return Status::Invalid("unknown fetch mode " + QuoteForMessage(text) +
                         " (expected listRecords or getRepo)");
}

CrawlOptions::CrawlOptions() {
  // More hosts than max_in_flight / max_per_host (64): a host fetching its last units empties its
  // slots one by one while it still counts as a host with transfers running, and with exactly 64
  // the other hosts could not take those slots over (the crawl bench's timeline: ~165 of the 192
  // slots busy with 64 hosts, ~178 with 96).
  http.max_hosts = 96;
  http.max_per_host = 3;
  resolver_http.max_hosts = 64;
  resolver_http.max_per_host = 32;
  resolver_http.max_in_flight = 256;
}

Status CrawlOptions::Validate() const {
  if (collections.empty()) return Status::Invalid("crawl: collections: at least one is needed");
  for (const auto& c : collections) {
    if (!atproto::Nsid::Parse(c).ok()) {
      return Status::Invalid("crawl: collections: " + QuoteForMessage(c) + " is not an NSID");
    }
  }
  if (discovery == Discovery::kDidList) {
    if (dids.empty()) return Status::Invalid("crawl: dids: an account backfill needs DIDs");
    for (const auto& d : dids) {
      if (!atproto::Did::Parse(d).ok()) {
        return Status::Invalid("crawl: dids: " + QuoteForMessage(d) + " is not a DID");
      }
    }
  } else if (relay_url.rfind("http://", 0) != 0 && relay_url.rfind("https://", 0) != 0) {
    return Status::Invalid("crawl: relay: " + QuoteForMessage(relay_url) +
                           " is not an http(s) URL");
  }
  auto range = [](const char* name, uint64_t v, uint64_t lo, uint64_t hi) {
    if (v < lo || v > hi) {
      return Status::Invalid(std::string("crawl: ") + name + ": " + std::to_string(v) +
                             " is out of range " + std::to_string(lo) + ".." + std::to_string(hi));
    }
    return Status::OK();
  };
  ATFILL_RETURN_IF_ERROR(range("list_repos_limit", list_repos_limit, 1, 1000));
  ATFILL_RETURN_IF_ERROR(range("list_records_limit", list_records_limit, 1, 100));
  ATFILL_RETURN_IF_ERROR(range("discovery_window", discovery_window, 1, 100'000'000));
  ATFILL_RETURN_IF_ERROR(range("max_active_units", max_active_units, 0, 1'000'000));
  ATFILL_RETURN_IF_ERROR(range("unit_attempts", unit_attempts, 1, 100));
  ATFILL_RETURN_IF_ERROR(range("retry_delay_ms",
                               static_cast<uint64_t>(std::max<int64_t>(retry_delay_ms, -1)), 0,
                               3'600'000));
  ATFILL_RETURN_IF_ERROR(
      range("tick_ms", static_cast<uint64_t>(std::max<int64_t>(tick_ms, 0)), 1, 60'000));
  ATFILL_RETURN_IF_ERROR(range("recent_repos", recent_repos, 1, 1'000'000));
  ATFILL_RETURN_IF_ERROR(resolver.Validate());
  ATFILL_RETURN_IF_ERROR(http.Validate());
  return resolver_http.Validate();
}

}  // namespace atfill::sources
