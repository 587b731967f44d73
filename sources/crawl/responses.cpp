#include "sources/crawl/responses.hpp"
#include <algorithm>

#include <utility>

#include "pipeline/engine.hpp"
#include "sources/crawl/fetcher.hpp"

namespace atfill::sources {

PageScan ScanRecordsPage(simdjson::ondemand::parser& parser, std::string& body) {
  PageScan scan;
  body.reserve(body.size() + simdjson::SIMDJSON_PADDING);
  simdjson::padded_string_view view(body.data(), body.size(), body.capacity());
  simdjson::ondemand::document doc;
  if (parser.iterate(view).get(doc) != simdjson::SUCCESS) {
    scan.error = "the listRecords answer is not JSON";
    return scan;
  }
  simdjson::ondemand::object obj;
  if (doc.get_object().get(obj) != simdjson::SUCCESS) {
    scan.error = "the listRecords answer is not a JSON object";
    return scan;
  }
  bool has_records = false;
  for (auto field : obj) {
    std::string_view key;
    if (field.unescaped_key().get(key) != simdjson::SUCCESS) {
      scan.error = "the listRecords answer is not valid JSON";
      return scan;
    }
    if (key == "records") {
      simdjson::ondemand::array arr;
      if (field.value().get_array().get(arr) != simdjson::SUCCESS) {
        scan.error = "the listRecords answer's records is not an array";
        return scan;
      }
      size_t n = 0;
      if (arr.count_elements().get(n) != simdjson::SUCCESS) {
        scan.error = "the listRecords answer's records array is not valid JSON";
        return scan;
      }
      scan.count = n;
      has_records = true;
    } else if (key == "cursor") {
      std::string_view cursor;
      if (field.value().get_string().get(cursor) == simdjson::SUCCESS) {
        scan.cursor = std::string(cursor);
      }
    }
  }
  if (!has_records) {
    scan.error = "the listRecords answer has no records array";
    return scan;
  }
  scan.ok = true;
  return scan;
}

std::string RepoRevCursor(std::string_view did) { return "repo-rev/" + std::string(did); }

std::string RepoRevValue(std::string_view rev, std::vector<std::string> collections) {
  std::sort(collections.begin(), collections.end());
  std::string out(rev);
  out += '\t';
  for (size_t i = 0; i < collections.size(); ++i) {
    if (i) out += ',';
    out += collections[i];
  }
  return out;
}

std::string RepoRevFor(std::string_view value, const std::vector<std::string>& collections) {
  const size_t tab = value.find('\t');
  if (tab == std::string_view::npos || tab == 0) return "";
  std::vector<std::string_view> had;
  for (std::string_view rest = value.substr(tab + 1); !rest.empty();) {
    const size_t comma = rest.find(',');
    had.push_back(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  for (const std::string& c : collections) {
    if (std::find(had.begin(), had.end(), c) == had.end()) return "";
  }
  return std::string(value.substr(0, tab));
}

void ResponseDecoder::Decode(const FetchedResponses& in, pipeline::EventChunk* chunk) const {
  for (const FetchedResponse& r : in.items) {
    if (r.kind == FetchedResponse::Kind::kRecordsPage) {
      auto page = ParseListRecordsPage(r.did, r.collection, r.body, options->limits);
      if (!page.ok()) {
        chunk->errors.push_back(
            {"bad_response", "at://" + r.did + "/" + r.collection, page.status().message()});
        log->AddHost(&chunk->state_writes, job, r.pds, 0, 0, 1, 0);
        continue;
      }
      chunk->units_read += page->records.size() + page->errors.size();
      for (auto& e : page->errors) chunk->errors.push_back(std::move(e));
      log->AddHost(&chunk->state_writes, job, r.pds, 0, 0, 0,
                   static_cast<int64_t>(page->records.size()));
      for (auto& rec : page->records) {
        rec.position = chunk->seq;
        chunk->events.emplace_back(std::move(rec));
      }
      continue;
    }
    // A repo CAR: all of its records, or none when it does not verify.
    state::RecentRepo recent;
    recent.seq = r.recent_seq;
    recent.did = r.did;
    recent.host = r.pds;
    recent.fetched_at_us = pipeline::NowMicros();
    if (r.diff) {
      // Read has checked the commit and compared the answer with the stored repo.
      const RepoDiff& d = *r.diff;
      chunk->units_read += d.events.size() + d.errors.size();
      for (const auto& e : d.errors) chunk->errors.push_back(e);
      log->AddHost(&chunk->state_writes, job, r.pds, 0, 1, 0,
                   static_cast<int64_t>(d.events.size()));
      recent.rev = d.unchanged ? "" : d.rev;
      if (options->hold_live && !d.unchanged) {
        holds->SetCheckpointRev(&chunk->state_writes, r.did, d.rev, options->collections);
      }
      if (!d.unchanged) {
        cursors->Set(&chunk->state_writes, RepoRevCursor(r.did),
                     RepoRevValue(d.rev, options->collections));
      }
      recent.records = d.events.size();
      recent.outcome = d.unchanged ? "unchanged" : "ok";
      log->PutRecent(&chunk->state_writes, job, recent, options->recent_repos);
      chunk->counters.emplace_back("repos_incremental", 1);
      for (const auto& e : d.events) {
        pipeline::RecordEvent rec = e;
        rec.position = chunk->seq;
        chunk->events.emplace_back(std::move(rec));
      }
      continue;
    }
    RepoFailure failure = RepoFailure::kNone;
    auto repo = ReadRepoRecords(r.did, r.signing_key, r.body, options->collections, options->limits,
                                &failure);
    if (!repo.ok()) {
      std::string kind_name(RepoFailureKind(failure));
      if (kind_name.empty()) kind_name = "bad_repo";
      chunk->errors.push_back({kind_name, r.did, repo.status().message()});
      chunk->counters.emplace_back("units_failed", 1);
      log->AddHost(&chunk->state_writes, job, r.pds, 0, 0, 1, 0);
      recent.outcome = kind_name;
      log->PutRecent(&chunk->state_writes, job, recent, options->recent_repos);
      continue;
    }
    chunk->units_read += repo->records.size() + repo->errors.size();
    for (auto& e : repo->errors) chunk->errors.push_back(std::move(e));
    log->AddHost(&chunk->state_writes, job, r.pds, 0, 1, 0,
                 static_cast<int64_t>(repo->records.size()));
    recent.rev = repo->rev;
    if (options->hold_live) {
      holds->SetCheckpointRev(&chunk->state_writes, r.did, repo->rev, options->collections);
    }
    if (options->incremental) {
      cursors->Set(&chunk->state_writes, RepoRevCursor(r.did),
                   RepoRevValue(repo->rev, options->collections));
    }
    recent.records = repo->records.size();
    recent.outcome = "ok";
    log->PutRecent(&chunk->state_writes, job, recent, options->recent_repos);
    if (r.replaces_stored) {
      pipeline::AccountEvent marker =
          pipeline::ResyncMarker(r.did, options->collections, repo->rev);
      marker.origin = pipeline::Origin::kCrawl;
      marker.position = chunk->seq;
      chunk->events.emplace_back(std::move(marker));
    }
    for (auto& rec : repo->records) {
      rec.position = chunk->seq;
      chunk->events.emplace_back(std::move(rec));
    }
  }
}

}  // namespace atfill::sources
