// atfill backfill CONFIG [--collection NSID]... [--did DID]... [--mode listRecords|getRepo]:
// the crawl as a job (discover, resolve, fetch, verify, write), resumable.
// atfill run CONFIG: resumes every unfinished job after a restart.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>

#include "pipeline/job.hpp"
#include "pipeline/run.hpp"
#include "sources/crawl/crawl_source.hpp"
#include "state/failed_blocks.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/atfill/job_kinds.hpp"
#include "tools/atfill/job_run.hpp"
#include "tools/atfill/run_admin.hpp"
#include "tools/atfill/sink_access.hpp"
#include "tools/atfill/state_access.hpp"
#include "tools/atfill/verb_backfill.hpp"

namespace atfill::cli {
namespace {

int Fail(const char* verb, const std::string& msg, int code) {
  std::fprintf(stderr, "atfill %s: %s\n", verb, msg.c_str());
  return code;
}

// The job that crawls these targets: the unfinished one, or a new one.
Result<state::JobRecord> FindOrCreateBackfillJob(const AppConfig& config, OpenedState& st,
                                                 const sources::CrawlOptions& crawl, bool* resumed,
                                                 const std::string& source = "crawl",
                                                 const std::string& started_by = "cli") {
  const int64_t now = pipeline::NowMicros();
  ATFILL_RETURN_IF_ERROR(st.tombstones->Sweep(now).status().WithContext("sweeping tombstones"));
  // The same targets resume the unfinished job that crawls them.
  state::JobRecord prototype;
  prototype.kind = "backfill";
  prototype.stage = state::JobStage::kDiscovering;
  prototype.created_us = now;
  prototype.started_by = started_by;
  prototype.params = {{"config", std::filesystem::absolute(config.path).string()},
                      {"relay", crawl.relay_url},
                      {"discovery", std::string(sources::DiscoveryName(crawl.discovery))},
                      {"mode", std::string(sources::FetchModeName(crawl.mode))},
                      {"collections", JoinLines(crawl.collections)},
                      {"dids", JoinLines(crawl.dids)},
                      {"sink", SinkLocation(config)}};
  if (source == "replay") {
    // A replay reads the archive, not the relay: its targets are the collections.
    prototype.params.erase("relay");
    prototype.params.erase("discovery");
    prototype.params.erase("mode");
    prototype.params["source"] = "replay";
    prototype.params["archive"] = ArchiveLocation(config);
    prototype.stage = state::JobStage::kReplaying;
  }
  return pipeline::FindOrCreateJob(
      st.jobs.get(), prototype,
      {"source", "archive", "relay", "discovery", "mode", "collections", "dids"}, resumed);
}

void AnnounceBackfill(const char* verb, const sources::CrawlOptions& crawl,
                      const state::JobRecord& job, bool resumed) {
  const auto source = job.params.find("source");
  if (!resumed && source != job.params.end() && source->second == "replay") {
    std::fprintf(stderr,
                 "atfill %s: backfill job %" PRIu64 " replays %zu collection(s) from %s into %s\n",
                 verb, job.id, crawl.collections.size(), job.params.at("archive").c_str(),
                 job.params.count("sink") ? job.params.at("sink").c_str() : "");
    return;
  }
  if (resumed) {
    std::fprintf(stderr, "atfill %s: resuming backfill job %" PRIu64 " (%s)\n", verb, job.id,
                 std::string(state::JobStatusName(job.status)).c_str());
  } else {
    std::fprintf(stderr,
                 "atfill %s: backfill job %" PRIu64 " crawls %zu collection(s) (%s, %s) into %s\n",
                 verb, job.id, crawl.collections.size(),
                 std::string(sources::DiscoveryName(crawl.discovery)).c_str(),
                 std::string(sources::FetchModeName(crawl.mode)).c_str(),
                 job.params.count("sink") ? job.params.at("sink").c_str() : "");
  }
}

// Where a backfill of these targets reads from: "crawl" or "replay" (source is the config's or
// --source's crawl, auto or replay). A replay of given accounts is refused; auto crawls them.
Result<std::string> ChooseSource(const AppConfig& config, const sources::CrawlOptions& crawl,
                                 const std::string& source) {
  if (source != "crawl" && source != "auto" && source != "replay") {
    return Status::Invalid("--source: '" + source + "' is not crawl, auto or replay");
  }
  const bool accounts = crawl.discovery == sources::Discovery::kDidList;
  if (source == "crawl") return std::string("crawl");
  if (accounts) {
    if (source == "replay") {
      return Status::Invalid(
          "a replay cannot backfill given accounts (--did, discovery = \"dids\"): account "
          "backfills always crawl their PDS; use --source crawl");
    }
    return std::string("crawl");
  }
  const std::string location = ArchiveLocation(config);
  if (location.empty()) {
    if (source == "replay") {
      return Status::Invalid(config.path + ": a replay needs an archive: set [archive] url or dir");
    }
    std::fprintf(stderr,
                 "atfill: no archive is configured ([archive] url or dir); the backfill crawls\n");
    return std::string("crawl");
  }
  if (source == "auto") {
    // Is there an archive that answers? A plan of the collections asks (key-gated, like a
    // replay's requests).
    auto archive = OpenArchive(config, location, /*probe=*/true);
    Status answer = archive.status();
    if (archive.ok()) {
      sources::PlanRequest request;
      request.collections = crawl.collections;
      request.markers = false;
      answer = (*archive)->PlanSnapshot(request).status();
    }
    if (!answer.ok()) {
      const bool refused_key = !config.archive_key.empty() &&
                               answer.code() == StatusCode::kInvalid &&
                               answer.message().find("key") != std::string::npos;
      if (refused_key) {
        return Status::Invalid("the archive " + location +
                               " refused the configured key: " + answer.message());
      }
      std::fprintf(stderr, "atfill: no archive to replay from (%s); the backfill crawls\n",
                   answer.message().c_str());
      return std::string("crawl");
    }
  }
  return std::string("replay");
}

}  // namespace

Result<std::pair<sources::CrawlOptions, std::string>> PlanBackfill(const AppConfig& config,
                                                                   const BackfillTargets& t) {
  sources::CrawlOptions crawl = config.crawl;
  if (!t.collections.empty()) crawl.collections = t.collections;
  if (!t.dids.empty()) {
    crawl.dids = t.dids;
    crawl.discovery = sources::Discovery::kDidList;
  }
  if (!t.relay.empty()) crawl.relay_url = t.relay;
  if (!t.mode.empty()) {
    auto m = sources::ParseFetchMode(t.mode);
    if (!m.ok()) return m.status().WithContext("--mode");
    crawl.mode = *m;
  }
  if (!t.discovery.empty()) {
    auto d = sources::ParseDiscovery(t.discovery);
    if (!d.ok()) return d.status().WithContext("--discovery");
    crawl.discovery = *d;
  }
  if (crawl.discovery != sources::Discovery::kDidList) crawl.dids.clear();
  ATFILL_ASSIGN_OR_RETURN(
      std::string chosen,
      ChooseSource(config, crawl, t.source.empty() ? config.backfill_source : t.source));
  if (chosen == "crawl") ATFILL_RETURN_IF_ERROR(crawl.Validate().WithContext(config.path));
  return std::make_pair(std::move(crawl), std::move(chosen));
}

Result<state::JobRecord> CreateBackfill(const AppConfig& config, OpenedState& st,
                                        const BackfillTargets& targets,
                                        const std::string& started_by) {
  ATFILL_ASSIGN_OR_RETURN(auto planned, PlanBackfill(config, targets));
  bool resumed = false;
  ATFILL_ASSIGN_OR_RETURN(auto job, FindOrCreateBackfillJob(config, st, planned.first, &resumed,
                                                            planned.second, started_by));
  AnnounceBackfill(started_by.c_str(), planned.first, job, resumed);
  return job;
}

int RunBackfill(std::span<char* const> args) {
  std::string config_path;
  std::vector<std::string> collections, dids;
  std::string mode, discovery, relay, source;
  CLI::App app{"", "atfill backfill"};
  PrepareVerbApp(app);
  app.add_option("CONFIG", config_path, "the config file")->required();
  app.add_option("--collection", collections);
  app.add_option("--did", dids);
  app.add_option("--mode", mode);
  app.add_option("--discovery", discovery);
  app.add_option("--relay", relay);
  app.add_option("--source", source);
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  auto config = LoadAppConfig(config_path);
  if (!config.ok()) return Fail("backfill", config.status().message(), kExitUsage);
  auto planned = PlanBackfill(*config, {collections, dids, mode, discovery, relay, source});
  if (!planned.ok()) return Fail("backfill", planned.status().message(), kExitUsage);
  const sources::CrawlOptions& crawl = planned->first;
  const std::string* chosen = &planned->second;

  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail("backfill", st.status().message(), kExitIo);
  bool resumed = false;
  auto job = FindOrCreateBackfillJob(*config, *st, crawl, &resumed, *chosen);
  if (!job.ok()) return Fail("backfill", job.status().message(), kExitIo);
  AnnounceBackfill("backfill", crawl, *job, resumed);
  const int rc = RunInForeground("backfill", *config, *st, *job);
  RestoreSignals();
  return rc;
}

Result<state::JobRecord> CreateRetryJob(OpenedState& st, uint64_t id, const std::string& started_by,
                                        bool* resumed) {
  ATFILL_ASSIGN_OR_RETURN(auto original, st.jobs->Get(id));
  if (original.params["source"] != "replay") {
    return Status::Unsupported("job " + std::to_string(id) +
                               " is not a replay job: only archive replays have failed blocks");
  }
  std::vector<std::string> blocks;
  state::FailedBlocks failed(*st.kv);
  ATFILL_RETURN_IF_ERROR(failed.Scan(id, [&](const state::FailedBlock& b) {
    blocks.push_back(b.block_id);
    return true;
  }));
  if (blocks.empty()) {
    return Status::NotFound("job " + std::to_string(id) + " has no failed block");
  }
  state::JobRecord prototype;
  prototype.kind = "backfill";
  prototype.stage = state::JobStage::kRetryingBlocks;
  prototype.created_us = pipeline::NowMicros();
  prototype.started_by = started_by;
  prototype.params = original.params;
  prototype.params["retry_of"] = std::to_string(id);
  prototype.params["blocks"] = JoinLines(blocks);
  return pipeline::FindOrCreateJob(st.jobs.get(), prototype, {"source", "retry_of"}, resumed);
}

int RunRetryFailed(std::span<char* const> args) {
  std::string config_path;
  uint64_t id = 0;
  CLI::App app{"", "atfill retry-failed"};
  PrepareVerbApp(app);
  app.add_option("CONFIG", config_path, "the config file")->required();
  app.add_option("JOB", id, "the replay job's id")->required()->check(PositiveInteger("a job id"));
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  auto config = LoadAppConfig(config_path);
  if (!config.ok()) return Fail("retry-failed", config.status().message(), kExitUsage);
  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail("retry-failed", st.status().message(), kExitIo);
  bool resumed = false;
  auto job = CreateRetryJob(*st, id, "cli", &resumed);
  if (!job.ok()) {
    const bool nothing = job.status().code() == StatusCode::kNotFound &&
                         job.status().message().find("no failed block") != std::string::npos;
    if (nothing) {
      std::fprintf(stderr, "atfill retry-failed: %s\n", job.status().message().c_str());
      return kExitOk;
    }
    return Fail("retry-failed", job.status().message(),
                job.status().code() == StatusCode::kIoError ? kExitIo : kExitUsage);
  }
  std::fprintf(
      stderr,
      "atfill retry-failed: %s job %" PRIu64 " fetching the %zu failed block(s) of job %" PRIu64
      ", then the account events of the accounts they hold records of\n",
      resumed ? "resuming" : "started", job->id, SplitLines(job->params["blocks"]).size(), id);
  const int rc = RunInForeground("retry-failed", *config, *st, *job);
  RestoreSignals();
  return rc;
}

int RunRun(std::span<char* const> args) {
  std::string config_path;
  bool with_backfill = false;
  CLI::App app{"", "atfill run"};
  PrepareVerbApp(app);
  app.add_option("CONFIG", config_path, "the config file")->required();
  app.add_flag("--backfill", with_backfill);
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  auto config = LoadAppConfig(config_path);
  if (!config.ok()) return Fail("run", config.status().message(), kExitUsage);
  const bool live = !config->live.hosts.empty();
  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail("run", st.status().message(), kExitIo);
  pipeline::JobController& controller = ControllerOf(*config, *st);
  auto unfinished = controller.Recover();
  if (!unfinished.ok()) return Fail("run", unfinished.status().message(), kExitIo);
  std::vector<state::JobRecord> todo;
  // With a live consumer (or the admin API), backfills run beside it (its events of repos they
  // crawl are held). The live job is run below (when configured), not resumed.
  std::vector<state::JobRecord> beside;
  for (auto& j : *unfinished) {
    if (j.kind == "backfill" && (live || config->admin_enabled)) {
      beside.push_back(j);
    } else if (j.kind == "backfill" || j.kind == "ingest") {
      todo.push_back(j);
    }
  }
  int worst = kExitOk;
  if (todo.empty() && beside.empty() && !with_backfill) {
    std::fprintf(stderr, "atfill run: no unfinished job to resume\n");
  }
  for (const auto& j : todo) {
    std::fprintf(stderr, "atfill run: resuming %s job %" PRIu64 " (%s)\n", j.kind.c_str(), j.id,
                 std::string(state::JobStatusName(j.status)).c_str());
    const int rc = RunInForeground("resume", *config, *st, j);
    worst = std::max(worst, rc);
    if (rc == kExitStopped) return worst;  // paused or cancelled by the user: stop here
  }
  // With [admin], this process serves the API and dashboard until Ctrl-C (or SIGTERM); backfills
  // (resumed, asked for, or started over the API) run on threads of their own meanwhile.
  if (config->admin_enabled) {
    return std::max(worst, ServeRun(*config, *st, beside, with_backfill));
  }
  if (with_backfill) {
    // The backfill of [crawl]'s targets: the unfinished job that crawls them, or a new one.
    auto chosen = ChooseSource(*config, config->crawl, config->backfill_source);
    if (!chosen.ok()) return Fail("run", "--backfill: " + chosen.status().message(), kExitUsage);
    if (Status s = config->crawl.Validate(); *chosen == "crawl" && !s.ok()) {
      return Fail("run", config->path + ": --backfill: " + s.message(), kExitUsage);
    }
    bool resumed = false;
    auto job = FindOrCreateBackfillJob(*config, *st, config->crawl, &resumed, *chosen);
    if (!job.ok()) return Fail("run", job.status().message(), kExitIo);
    AnnounceBackfill("run", config->crawl, *job, resumed);
    const bool listed = std::any_of(beside.begin(), beside.end(),
                                    [&](const state::JobRecord& j) { return j.id == job->id; });
    if (!listed) beside.push_back(*job);
    if (!live) {
      const int rc = RunInForeground("run", *config, *st, *job);
      RestoreSignals();
      return std::max(worst, rc);
    }
  }
  if (!live) return worst;
  // The backfills run on a thread of their own while this one keeps the database current from
  // the Jetstream, holding the live events of each repo until the crawl has written it.
  int backfill_rc = kExitOk;
  const int rc = RunLive(*config, *st, nullptr, nullptr, beside, &backfill_rc);
  RestoreSignals();
  return std::max({worst, rc, backfill_rc});
}

}  // namespace atfill::cli
