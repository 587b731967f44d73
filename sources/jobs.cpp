// Creating jobs (sources/components.hpp): the choice between a crawl and an archive replay, the
// job of a backfill's targets, the live consumer's job, and the job that retries a replay's failed
// blocks.
#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "pipeline/run.hpp"
#include "sources/components.hpp"
#include "state/cursors.hpp"
#include "state/failed_blocks.hpp"

namespace atfill::sources {
namespace {

// Where a backfill of these targets reads from: "crawl" or "replay" (`source` is the settings' or
// the caller's crawl, auto or replay). A replay of given accounts is refused; auto crawls them.
Result<std::string> ChooseSource(const pipeline::Environment& env, const CrawlOptions& crawl,
                                 const std::string& source) {
  const SourceSettings& settings = env.settings->Get<SourceSettings>();
  if (source != "crawl" && source != "auto" && source != "replay") {
    return Status::Invalid("--source: '" + source + "' is not crawl, auto or replay");
  }
  const bool accounts = crawl.discovery == Discovery::kDidList;
  if (source == "crawl") return std::string("crawl");
  if (accounts) {
    if (source == "replay") {
      return Status::Invalid(
          "a replay cannot backfill given accounts (--did, discovery = \"dids\"): account "
          "backfills always crawl their PDS; use --source crawl");
    }
    return std::string("crawl");
  }
  const std::string location = ArchiveLocation(settings);
  if (location.empty()) {
    if (source == "replay") {
      return Status::Invalid(env.settings->path +
                             ": a replay needs an archive: set [archive] url or dir");
    }
    env.Log("atfill: no archive is configured ([archive] url or dir); the backfill crawls");
    return std::string("crawl");
  }
  if (source == "auto") {
    // Is there an archive that answers? A plan of the collections asks (key-gated, like a
    // replay's requests).
    auto archive = OpenArchive(settings, location, /*probe=*/true);
    Status answer = archive.status();
    if (archive.ok()) {
      PlanRequest request;
      request.collections = crawl.collections;
      request.markers = false;
      answer = (*archive)->PlanSnapshot(request).status();
    }
    if (!answer.ok()) {
      const bool refused_key = !settings.archive_key.empty() &&
                               answer.code() == StatusCode::kInvalid &&
                               answer.message().find("key") != std::string::npos;
      if (refused_key) {
        return Status::Invalid("the archive " + location +
                               " refused the configured key: " + answer.message());
      }
      env.Log("atfill: no archive to replay from (" + answer.message() + "); the backfill crawls");
      return std::string("crawl");
    }
  }
  return std::string("replay");
}

}  // namespace

Result<std::pair<CrawlOptions, std::string>> PlanBackfill(const pipeline::Environment& env,
                                                          const BackfillTargets& t) {
  const SourceSettings& settings = env.settings->Get<SourceSettings>();
  CrawlOptions crawl = settings.crawl;
  if (!t.collections.empty()) crawl.collections = t.collections;
  if (!t.dids.empty()) {
    crawl.dids = t.dids;
    crawl.discovery = Discovery::kDidList;
  }
  if (!t.relay.empty()) crawl.relay_url = t.relay;
  if (!t.mode.empty()) {
    auto m = ParseFetchMode(t.mode);
    if (!m.ok()) return m.status().WithContext("--mode");
    crawl.mode = *m;
  }
  if (!t.discovery.empty()) {
    auto d = ParseDiscovery(t.discovery);
    if (!d.ok()) return d.status().WithContext("--discovery");
    crawl.discovery = *d;
  }
  if (crawl.discovery != Discovery::kDidList) crawl.dids.clear();
  ATFILL_ASSIGN_OR_RETURN(
      std::string chosen,
      ChooseSource(env, crawl, t.source.empty() ? settings.backfill_source : t.source));
  if (chosen == "crawl") ATFILL_RETURN_IF_ERROR(crawl.Validate().WithContext(env.settings->path));
  return std::make_pair(std::move(crawl), std::move(chosen));
}

Result<BackfillJob> FindOrCreateBackfill(const pipeline::Environment& env,
                                         const CrawlOptions& crawl, const std::string& source,
                                         const std::string& started_by) {
  const int64_t now = pipeline::NowMicros();
  ATFILL_RETURN_IF_ERROR(env.tombstones->Sweep(now).status().WithContext("sweeping tombstones"));
  // The same targets resume the unfinished job that crawls them.
  state::JobRecord prototype =
      pipeline::NewJobRecord("backfill", state::JobStage::kDiscovering, started_by, now);
  prototype.params = {{"config", std::filesystem::absolute(env.settings->path).string()},
                      {"relay", crawl.relay_url},
                      {"discovery", std::string(DiscoveryName(crawl.discovery))},
                      {"mode", std::string(FetchModeName(crawl.mode))},
                      {"collections", pipeline::JoinLines(crawl.collections)},
                      {"dids", pipeline::JoinLines(crawl.dids)},
                      {"sink", env.components->SinkLocation(*env.settings)}};
  if (source == "replay") {
    // A replay reads the archive, not the relay: its targets are the collections.
    prototype.params.erase("relay");
    prototype.params.erase("discovery");
    prototype.params.erase("mode");
    prototype.params["source"] = "replay";
    prototype.params["archive"] = ArchiveLocation(env.settings->Get<SourceSettings>());
    prototype.stage = state::JobStage::kReplaying;
  }
  BackfillJob out;
  out.crawl = crawl;
  ATFILL_ASSIGN_OR_RETURN(
      out.job, pipeline::FindOrCreateJob(
                   env.jobs, prototype,
                   {"source", "archive", "relay", "discovery", "mode", "collections", "dids"},
                   &out.resumed));
  return out;
}

Result<BackfillJob> CreateBackfill(const pipeline::Environment& env, const BackfillTargets& targets,
                                   const std::string& started_by) {
  ATFILL_ASSIGN_OR_RETURN(auto planned, PlanBackfill(env, targets));
  return FindOrCreateBackfill(env, planned.first, planned.second, started_by);
}

Result<state::JobRecord> FindOrCreateIngestJob(const pipeline::Environment& env,
                                               const std::vector<std::string>& files, bool dry_run,
                                               const std::string& started_by, bool* resumed) {
  const int64_t now = pipeline::NowMicros();
  ATFILL_RETURN_IF_ERROR(env.tombstones->Sweep(now).status().WithContext("sweeping tombstones"));
  // The same files (and mode) resume the unfinished job that read them.
  state::JobRecord prototype =
      pipeline::NewJobRecord("ingest", state::JobStage::kReplaying, started_by, now);
  prototype.params = {{"config", std::filesystem::absolute(env.settings->path).string()},
                      {"files", pipeline::JoinLines(files)},
                      {"dry_run", dry_run ? "true" : "false"},
                      {"sink", dry_run ? "dry-run" : env.components->SinkLocation(*env.settings)}};
  return pipeline::FindOrCreateJob(env.jobs, prototype, {"files", "dry_run"}, resumed);
}

Result<state::JobRecord> CreateVerifyJob(const pipeline::Environment& env,
                                         const VerifyTargets& targets,
                                         const std::string& started_by) {
  const int64_t now = pipeline::NowMicros();
  ATFILL_RETURN_IF_ERROR(env.tombstones->Sweep(now).status().WithContext("sweeping tombstones"));
  // Unless told otherwise, the collections the config indexes: what the table is meant to hold
  // ([crawl] and [live] collections); every collection when the config names none.
  std::vector<std::string> collections = targets.collections;
  if (collections.empty()) {
    const SourceSettings& settings = env.settings->Get<SourceSettings>();
    collections = settings.crawl.collections;
    for (const std::string& c : settings.live.collections) {
      if (std::find(collections.begin(), collections.end(), c) == collections.end()) {
        collections.push_back(c);
      }
    }
  }
  state::JobRecord job =
      pipeline::NewJobRecord("verify", state::JobStage::kResolvingAndFetching, started_by, now);
  job.params = {{"config", std::filesystem::absolute(env.settings->path).string()},
                {"dids", pipeline::JoinLines(targets.dids)},
                {"collections", pipeline::JoinLines(collections)},
                {"repair", targets.repair ? "true" : "false"},
                {"sink", env.components->SinkLocation(*env.settings)}};
  return env.jobs->Create(std::move(job));
}

Result<LiveView> ReadLiveView(const pipeline::Environment& env) {
  LiveView view;
  ATFILL_ASSIGN_OR_RETURN(auto jobs, env.jobs->List());
  for (auto& j : jobs) {
    if (j.kind == "live" && (!view.job || j.id > view.job->id)) view.job = std::move(j);
  }
  state::Cursors cursors(*env.kv);
  const bool firehose = env.settings->Get<SourceSettings>().live_firehose;
  ATFILL_ASSIGN_OR_RETURN(auto cursor, cursors.Get(firehose ? kFirehoseCursor : kLiveCursor));
  if (cursor) {
    // "SEQ:TIME_US"
    view.seq = std::strtoull(cursor->c_str(), nullptr, 10);
    const size_t colon = cursor->find(':');
    if (colon != std::string::npos) {
      view.witnessed_us = std::strtoll(cursor->c_str() + colon + 1, nullptr, 10);
    }
  }
  return view;
}

Result<state::JobRecord> FindOrCreateLiveJob(const pipeline::Environment& env,
                                             const std::string& started_by) {
  const JetstreamOptions& live = env.settings->Get<SourceSettings>().live;
  state::JobRecord prototype =
      pipeline::NewJobRecord("live", state::JobStage::kReplaying, started_by);
  prototype.params = {{"hosts", pipeline::JoinLines(live.hosts)},
                      {"protocol", env.settings->Get<SourceSettings>().live_firehose
                                       ? std::string("firehose")
                                       : std::string(JetstreamProtocolName(live.protocol))},
                      {"sink", env.components->SinkLocation(*env.settings)}};
  bool resumed = false;
  return pipeline::FindOrCreateJob(env.jobs, prototype, {}, &resumed);
}

Result<state::JobRecord> CreateRetryJob(const pipeline::Environment& env, uint64_t id,
                                        const std::string& started_by, bool* resumed) {
  ATFILL_ASSIGN_OR_RETURN(auto original, env.jobs->Get(id));
  if (original.params["source"] != "replay") {
    return Status::Unsupported("job " + std::to_string(id) +
                               " is not a replay job: only archive replays have failed blocks");
  }
  std::vector<std::string> blocks;
  state::FailedBlocks failed(*env.kv);
  ATFILL_RETURN_IF_ERROR(failed.Scan(id, [&](const state::FailedBlock& b) {
    blocks.push_back(b.block_id);
    return true;
  }));
  if (blocks.empty()) {
    return Status::NotFound("job " + std::to_string(id) + " has no failed block");
  }
  state::JobRecord prototype =
      pipeline::NewJobRecord("backfill", state::JobStage::kRetryingBlocks, started_by);
  prototype.params = original.params;
  prototype.params["retry_of"] = std::to_string(id);
  prototype.params["blocks"] = pipeline::JoinLines(blocks);
  return pipeline::FindOrCreateJob(env.jobs, prototype, {"source", "retry_of"}, resumed);
}

}  // namespace atfill::sources
