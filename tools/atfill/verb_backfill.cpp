// atfill backfill CONFIG [--collection NSID]... [--did DID]... [--mode listRecords|getRepo]:
// the crawl as a job (discover, resolve, fetch, verify, write), resumable.
// atfill run CONFIG: resumes every unfinished job after a restart.
#include <cinttypes>
#include <cstdio>
#include <filesystem>

#include "pipeline/job.hpp"
#include "pipeline/run.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/crawl.hpp"
#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/atfill/job_run.hpp"
#include "tools/atfill/state_access.hpp"
#include "tools/atfill/verb_backfill.hpp"

namespace atfill::cli {
namespace {

int Fail(const char* verb, const std::string& msg, int code) {
  std::fprintf(stderr, "atfill %s: %s\n", verb, msg.c_str());
  return code;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : "\n") + s;
  return out;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t nl = s.find('\n', start);
    if (nl == std::string::npos) nl = s.size();
    if (nl > start) out.push_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

// A job's crawl: the config's network settings with the job's own targets.
Result<sources::CrawlOptions> CrawlOfJob(const AppConfig& config, state::JobRecord& job) {
  sources::CrawlOptions crawl = config.crawl;
  crawl.relay_url = job.params["relay"];
  ATFILL_ASSIGN_OR_RETURN(crawl.discovery, sources::ParseDiscovery(job.params["discovery"]));
  ATFILL_ASSIGN_OR_RETURN(crawl.mode, sources::ParseFetchMode(job.params["mode"]));
  crawl.collections = Split(job.params["collections"]);
  crawl.dids = Split(job.params["dids"]);
  return crawl;
}

int RunBackfillJob(const char* verb, const AppConfig& config, OpenedState& st,
                   state::JobRecord job) {
  auto crawl = CrawlOfJob(config, job);
  if (!crawl.ok())
    return Fail(verb, "job " + std::to_string(job.id) + ": " + crawl.status().message(),
                kExitUsage);
  auto sink = sinks::OpenSqliteSink(config.sqlite);
  if (!sink.ok()) return Fail(verb, sink.status().message(), kExitIo);
  auto source = sources::CrawlSource::Create(*crawl, job.id, st.kv.get());
  if (!source.ok()) return Fail(verb, source.status().message(), kExitUsage);
  stages::CidVerify verify;
  stages::IngestGuard guard(st.tombstones.get());
  ForegroundJob run;
  run.verb = verb;
  run.config = &config;
  run.state = &st;
  run.job = std::move(job);
  run.source = source->get();
  if (config.verify_cids) run.transforms.push_back(&verify);
  run.transforms.push_back(&guard);
  run.sink = sink->get();
  run.cursor_name = "job/" + std::to_string(run.job.id) + "/crawl";
  run.read_noun = "records fetched";
  return RunInForeground(run);
}

template <typename T>
bool TakeValue(std::span<char* const> args, size_t* i, T* out) {
  if (*i + 1 >= args.size()) return false;
  *out = args[++*i];
  return true;
}

}  // namespace

int RunBackfill(std::span<char* const> args) {
  std::vector<std::string> positional, collections, dids;
  std::string mode, discovery, relay;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    bool ok = true;
    if (a == "--collection") {
      std::string v;
      ok = TakeValue(args, &i, &v);
      collections.push_back(v);
    } else if (a == "--did") {
      std::string v;
      ok = TakeValue(args, &i, &v);
      dids.push_back(v);
    } else if (a == "--mode") {
      ok = TakeValue(args, &i, &mode);
    } else if (a == "--discovery") {
      ok = TakeValue(args, &i, &discovery);
    } else if (a == "--relay") {
      ok = TakeValue(args, &i, &relay);
    } else if (a.starts_with("--")) {
      return Fail("backfill", "unknown option " + std::string(a), kExitUsage);
    } else {
      positional.emplace_back(a);
    }
    if (!ok) return Fail("backfill", std::string(a) + " needs a value", kExitUsage);
  }
  if (positional.size() != 1) {
    return Fail("backfill",
                "usage: atfill backfill CONFIG [--collection NSID]... [--did DID]... "
                "[--mode listRecords|getRepo]",
                kExitUsage);
  }
  auto config = LoadAppConfig(positional[0]);
  if (!config.ok()) return Fail("backfill", config.status().message(), kExitUsage);
  sources::CrawlOptions crawl = config->crawl;
  if (!collections.empty()) crawl.collections = collections;
  if (!dids.empty()) {
    crawl.dids = dids;
    crawl.discovery = sources::Discovery::kDidList;
  }
  if (!relay.empty()) crawl.relay_url = relay;
  if (!mode.empty()) {
    auto m = sources::ParseFetchMode(mode);
    if (!m.ok()) return Fail("backfill", "--mode: " + m.status().message(), kExitUsage);
    crawl.mode = *m;
  }
  if (!discovery.empty()) {
    auto d = sources::ParseDiscovery(discovery);
    if (!d.ok()) return Fail("backfill", "--discovery: " + d.status().message(), kExitUsage);
    crawl.discovery = *d;
  }
  if (crawl.discovery != sources::Discovery::kDidList) crawl.dids.clear();
  if (Status s = crawl.Validate(); !s.ok()) {
    return Fail("backfill", config->path + ": " + s.message(), kExitUsage);
  }

  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail("backfill", st.status().message(), kExitIo);
  const int64_t now = pipeline::NowMicros();
  if (auto swept = st->tombstones->Sweep(now); !swept.ok()) {
    return Fail("backfill", "sweeping tombstones: " + swept.status().message(), kExitIo);
  }
  // The same targets resume the unfinished job that crawls them.
  state::JobRecord prototype;
  prototype.kind = "backfill";
  prototype.stage = state::JobStage::kDiscovering;
  prototype.created_us = now;
  prototype.started_by = "cli";
  prototype.params = {{"config", std::filesystem::absolute(config->path).string()},
                      {"relay", crawl.relay_url},
                      {"discovery", std::string(sources::DiscoveryName(crawl.discovery))},
                      {"mode", std::string(sources::FetchModeName(crawl.mode))},
                      {"collections", Join(crawl.collections)},
                      {"dids", Join(crawl.dids)},
                      {"sink", config->sink + ":" + config->sqlite.path}};
  bool resumed = false;
  auto job = pipeline::FindOrCreateJob(
      st->jobs.get(), prototype, {"relay", "discovery", "mode", "collections", "dids"}, &resumed);
  if (!job.ok()) return Fail("backfill", job.status().message(), kExitIo);
  if (resumed) {
    std::fprintf(stderr, "atfill backfill: resuming job %" PRIu64 " (%s)\n", job->id,
                 std::string(state::JobStatusName(job->status)).c_str());
  } else {
    std::fprintf(
        stderr, "atfill backfill: job %" PRIu64 " crawls %zu collection(s) (%s, %s) into %s\n",
        job->id, crawl.collections.size(),
        std::string(sources::DiscoveryName(crawl.discovery)).c_str(),
        std::string(sources::FetchModeName(crawl.mode)).c_str(), job->params["sink"].c_str());
  }
  const int rc = RunBackfillJob("backfill", *config, *st, *job);
  RestoreSignals();
  return rc;
}

int ResumeBackfill(const std::string& config_path, uint64_t id) {
  auto config = LoadAppConfig(config_path);
  if (!config.ok()) return Fail("resume", config.status().message(), kExitUsage);
  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail("resume", st.status().message(), kExitIo);
  auto job = st->jobs->Get(id);
  if (!job.ok()) return Fail("resume", job.status().message(), kExitUsage);
  const int rc = RunBackfillJob("resume", *config, *st, *job);
  RestoreSignals();
  return rc;
}

// Jobs a restart should pick up: interrupted ones (running, pausing), ones that paused because
// work was left (not on request), and cancellations to finish.
bool ShouldResume(const state::JobRecord& j) {
  switch (j.status) {
    case state::JobStatus::kRunning:
    case state::JobStatus::kPausing:
      return true;
    case state::JobStatus::kPaused:
      return j.stop_reason.code != "paused";
    default:
      return false;
  }
}

int RunRun(std::span<char* const> args) {
  if (args.size() != 1 || std::string_view(args[0]).starts_with("--")) {
    return Fail("run", "usage: atfill run CONFIG", kExitUsage);
  }
  const std::string config_path = args[0];
  auto config = LoadAppConfig(config_path);
  if (!config.ok()) return Fail("run", config.status().message(), kExitUsage);
  std::vector<state::JobRecord> todo;
  {
    auto st = OpenStateForWrite(*config);
    if (!st.ok()) return Fail("run", st.status().message(), kExitIo);
    auto all = st->jobs->List();
    if (!all.ok()) return Fail("run", all.status().message(), kExitIo);
    for (auto& j : *all) {
      if (j.status == state::JobStatus::kCancelling) {
        // Its process died before the cancellation finished: finish it.
        j.status = state::JobStatus::kCancelled;
        j.stage = state::JobStage::kCancelled;
        j.stop_reason = {"cancelled", "cancelled on request"};
        j.finished_us = pipeline::NowMicros();
        state::WriteBatch b;
        if (Status s = st->jobs->Put(&b, j); !s.ok()) return Fail("run", s.message(), kExitIo);
        if (Status s = st->kv->Write(b); !s.ok()) return Fail("run", s.message(), kExitIo);
        continue;
      }
      if (ShouldResume(j) && (j.kind == "backfill" || j.kind == "ingest")) todo.push_back(j);
      if (j.kind == "live" && !state::IsTerminal(j.status)) {
        // The live job is run below (when configured), not resumed as a backfill.
        continue;
      }
    }
  }
  std::sort(todo.begin(), todo.end(),
            [](const state::JobRecord& a, const state::JobRecord& b) { return a.id < b.id; });
  int worst = kExitOk;
  if (todo.empty()) std::fprintf(stderr, "atfill run: no unfinished job to resume\n");
  for (const auto& j : todo) {
    std::fprintf(stderr, "atfill run: resuming %s job %" PRIu64 " (%s)\n", j.kind.c_str(), j.id,
                 std::string(state::JobStatusName(j.status)).c_str());
    std::string id = std::to_string(j.id);
    std::string cfg = config_path;
    std::vector<char*> argv = {cfg.data(), id.data()};
    const int rc = RunResume(argv);
    worst = std::max(worst, rc);
    if (rc == kExitStopped) return worst;  // paused or cancelled by the user: stop here
  }
  if (config->live.hosts.empty()) return worst;
  // Then keep the database current from the Jetstream.
  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail("run", st.status().message(), kExitIo);
  const int rc = RunLive(*config, *st);
  RestoreSignals();
  return std::max(worst, rc);
}

Result<std::vector<std::string>> UnfinishedBackfillCollections(OpenedState& st) {
  ATFILL_ASSIGN_OR_RETURN(auto jobs, st.jobs->List());
  std::vector<std::string> out;
  for (const auto& j : jobs) {
    if (j.kind != "backfill" || state::IsTerminal(j.status)) continue;
    auto it = j.params.find("collections");
    std::vector<std::string> collections =
        it == j.params.end() ? std::vector<std::string>{} : Split(it->second);
    if (collections.empty()) return std::vector<std::string>{"*"};
    out.insert(out.end(), collections.begin(), collections.end());
  }
  return out;
}

}  // namespace atfill::cli
