// atfill backfill CONFIG [--collection NSID]... [--did DID]... [--mode listRecords|getRepo]:
// the crawl as a job (discover, resolve, fetch, verify, write), resumable.
// atfill run CONFIG: resumes every unfinished job after a restart, and follows [labels]' labelers.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <thread>

#include "pipeline/job.hpp"
#include "pipeline/run.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/atfill/job_run.hpp"
#include "tools/atfill/run_admin.hpp"
#include "tools/atfill/run_collections.hpp"
#include "tools/atfill/verb_backfill.hpp"

namespace atfill::cli {
namespace {

int Fail(const char* verb, const std::string& msg, int code) {
  std::fprintf(stderr, "atfill %s: %s\n", verb, msg.c_str());
  return code;
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

}  // namespace

Result<state::JobRecord> CreateBackfill(const AppConfig& config, OpenedState& st,
                                        const sources::BackfillTargets& targets,
                                        const std::string& started_by) {
  ATFILL_ASSIGN_OR_RETURN(auto made,
                          sources::CreateBackfill(EnvOf(config, st), targets, started_by));
  // Only `atfill run` (its admin API and its collection reloads included) creates backfills this
  // way, so its lines say "atfill run" whoever asked; `started_by` is what the job records.
  AnnounceBackfill("run", made.crawl, made.job, made.resumed);
  return made.job;
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
  // Planned before the state opens: a backfill the config cannot serve is a usage error.
  pipeline::Environment unopened;
  unopened.components = &LauncherComponents();
  unopened.settings = &config->settings;
  auto planned =
      sources::PlanBackfill(unopened, {collections, dids, mode, discovery, relay, source});
  if (!planned.ok()) return Fail("backfill", planned.status().message(), kExitUsage);

  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail("backfill", st.status().message(), kExitIo);
  auto made =
      sources::FindOrCreateBackfill(EnvOf(*config, *st), planned->first, planned->second, "cli");
  if (!made.ok()) return Fail("backfill", made.status().message(), kExitIo);
  AnnounceBackfill("backfill", made->crawl, made->job, made->resumed);
  const int rc = RunInForeground("backfill", *config, *st, made->job);
  RestoreSignals();
  return rc;
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
  auto job = sources::CreateRetryJob(EnvOf(*config, *st), id, "cli", &resumed);
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
  std::fprintf(stderr,
               "atfill retry-failed: %s job %" PRIu64
               " fetching the %zu failed block(s) of job %" PRIu64
               ", then the account events of the accounts they hold records of\n",
               resumed ? "resuming" : "started", job->id,
               pipeline::SplitLines(job->params["blocks"]).size(), id);
  const int rc = RunInForeground("retry-failed", *config, *st, *job);
  RestoreSignals();
  return rc;
}

namespace {

// Stops the label subscriptions and prints how each labeler's ended; the exit code of that
// (kExitIo when the subscriptions failed, else kExitStopped: they only end when asked or idle).
int StopLabels(sources::LabelThread& labels) {
  auto outcome = labels.Stop();
  if (!outcome.ok()) {
    std::fprintf(stderr, "atfill run: labels: %s\n", outcome.status().message().c_str());
    return kExitIo;
  }
  for (const auto& [did, s] : outcome->labelers) {
    std::fprintf(stderr,
                 "atfill run: labels from %s: %" PRIu64 " frames, %" PRIu64 " labels (%" PRIu64
                 " stored, %" PRIu64 " negations stored, %" PRIu64
                 " older than the stored one), %" PRIu64 " refused, %" PRIu64
                 " bad frames, %" PRIu64 " connection errors, cursor %" PRIu64 "\n",
                 did.c_str(), s.frames, s.labels, s.stored, s.negated, s.stale, s.refused,
                 s.bad_frames, s.connection_errors, s.applied_seq);
  }
  return kExitStopped;
}

// The label subscriptions alone (no [live] hosts): until Ctrl-C or [labels] idle_exit_ms.
int FollowLabels(sources::LabelThread& labels) {
  while (!StopSignalled() && !labels.done()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int rc = StopLabels(labels);
  RestoreSignals();
  return rc;
}

// The verify schedule alone (no [live] hosts, no labelers): until Ctrl-C.
int FollowSchedule(sources::VerifySchedule& verify) {
  while (!StopSignalled()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  verify.Stop();
  RestoreSignals();
  return kExitStopped;
}

}  // namespace

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
  const bool live = !config->sources().live.hosts.empty();
  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail("run", st.status().message(), kExitIo);
  pipeline::JobController& controller = ControllerOf(*config, *st);
  auto unfinished = controller.Recover();
  if (!unfinished.ok()) return Fail("run", unfinished.status().message(), kExitIo);
  // [labels]: the labelers' subscriptions run on a thread of their own for as long as this verb
  // (its destructor stops them, writing what they hold first).
  std::unique_ptr<sources::LabelThread> labels;
  if (!config->sources().labels.labelers.empty()) {
    auto started = sources::LabelThread::Start(EnvOf(*config, *st), config->sources().labels);
    if (!started.ok()) return Fail("run", started.status().message(), kExitIo);
    labels = std::move(*started);
  }
  // [verify] every_hours: verify jobs of the stored repos, on a thread of their own beside the
  // rest, for as long as this verb runs (its destructor waits for a job in progress, which a
  // Ctrl-C pauses).
  std::unique_ptr<sources::VerifySchedule> verify;
  if (config->sources().verify.every_hours > 0) {
    verify = std::make_unique<sources::VerifySchedule>(
        EnvOf(*config, *st), config->sources().verify,
        [&](state::JobRecord job) { return RunAndReport("verify", *config, *st, std::move(job)); });
    verify->Start();
  }
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
    const pipeline::Environment env = EnvOf(*config, *st);
    auto planned = sources::PlanBackfill(env, {});
    if (!planned.ok()) return Fail("run", "--backfill: " + planned.status().message(), kExitUsage);
    auto made = sources::FindOrCreateBackfill(env, planned->first, planned->second, "cli");
    if (!made.ok()) return Fail("run", made.status().message(), kExitIo);
    AnnounceBackfill("run", made->crawl, made->job, made->resumed);
    const state::JobRecord* job = &made->job;
    const bool listed = std::any_of(beside.begin(), beside.end(),
                                    [&](const state::JobRecord& j) { return j.id == job->id; });
    if (!listed) beside.push_back(*job);
    if (!live) {
      const int rc = RunInForeground("run", *config, *st, *job);
      RestoreSignals();
      return std::max(worst, rc);
    }
  }
  if (!live && labels) return std::max(worst, FollowLabels(*labels));
  if (!live && verify) return std::max(worst, FollowSchedule(*verify));
  if (!live) return worst;
  // The backfills run on a thread of their own while this one keeps the database current from
  // the Jetstream, holding the live events of each repo until the crawl has written it. Those of
  // collections added on SIGHUP run in a group of their own beside it.
  pipeline::JobGroup added(&controller, [&](state::JobRecord job, const pipeline::JobContext& ctx) {
    return RunAndReport("run", *config, *st, std::move(job), ctx);
  });
  RuntimeCollections collections(*config, *st, [&added](state::JobRecord job) {
    pipeline::JobContext ctx;
    ctx.hold_live = true;
    static_cast<void>(added.Start({std::move(job)}, ctx));  // refused only once closed
  });
  if (auto started = collections.Start(); !started.ok()) {
    return Fail("run", "[live] collections: " + started.status().message(), kExitUsage);
  }
  collections.WatchReloads();
  int backfill_rc = kExitOk;
  int rc = RunLive(*config, *st, nullptr, nullptr, beside, &backfill_rc, &added);
  collections.Stop();
  added.Close();
  added.Wait();
  // The labels stop with the live consumer; only their failure changes the exit code.
  if (labels && StopLabels(*labels) == kExitIo) rc = std::max(rc, kExitIo);
  RestoreSignals();
  return std::max({worst, rc, backfill_rc});
}

}  // namespace atfill::cli
