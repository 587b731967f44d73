// atfill jobs | job | pause | resume | cancel: looking at jobs and steering them.
#include <cinttypes>
#include <cstdio>
#include <map>
#include <string>

#include "base/json_writer.hpp"
#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"
#include "pipeline/job_details.hpp"
#include "state/error_log.hpp"
#include "state/failed_blocks.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/atfill/job_run.hpp"
#include "tools/atfill/job_view.hpp"

namespace atfill::cli {
namespace {

struct JobArgs {
  std::string config;
  uint64_t id = 0;
  bool json = false;
  bool batches = false;
  bool errors = false;
  bool hosts = false;
  bool recent = false;
};

int Fail(std::string_view verb, const std::string& msg, int code) {
  std::fprintf(stderr, "atfill %.*s: %s\n", static_cast<int>(verb.size()), verb.data(),
               msg.c_str());
  return code;
}

// Parses CONFIG [ID] and the flags the verb allows; returns an exit code on error, -1 when fine.
int ParseArgs(std::string_view verb, std::span<char* const> args, bool want_id,
              std::initializer_list<std::string_view> flags, JobArgs* out) {
  CLI::App app{"", "atfill " + std::string(verb)};
  PrepareVerbApp(app);
  app.add_option("CONFIG", out->config, "the config file")->required();
  if (want_id) {
    app.add_option("ID", out->id, "the job's id")->required()->check(PositiveInteger("a job id"));
  }
  const std::pair<std::string_view, bool*> known[] = {{"--json", &out->json},
                                                      {"--batches", &out->batches},
                                                      {"--errors", &out->errors},
                                                      {"--hosts", &out->hosts},
                                                      {"--recent", &out->recent}};
  for (const auto& [name, flag] : known) {
    if (std::find(flags.begin(), flags.end(), name) != flags.end()) {
      app.add_flag(std::string(name), *flag);
    }
  }
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  return -1;
}

std::string Percent(const state::JobRecord& job, int64_t now) {
  const auto p = pipeline::DeriveProgress(job, now);
  if (p.percent < 0) return "-";
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.1f%%", p.percent);
  return buf;
}

}  // namespace

int RunJobs(std::span<char* const> args) {
  JobArgs a;
  if (int rc = ParseArgs("jobs", args, false, {"--json"}, &a); rc >= 0) return rc;
  auto config = LoadAppConfig(a.config);
  if (!config.ok()) return Fail("jobs", config.status().message(), kExitUsage);
  auto st = OpenStateForRead(*config);
  if (!st.ok()) return Fail("jobs", st.status().message(), kExitIo);
  auto jobs = st->jobs->List();
  if (!jobs.ok()) return Fail("jobs", jobs.status().message(), kExitIo);
  const int64_t now = pipeline::NowMicros();
  if (a.json) {
    std::string out = "[";
    for (size_t i = 0; i < jobs->size(); ++i) {
      out += (i ? "," : "") + JobJson((*jobs)[i], now);
    }
    std::printf("%s]\n", out.c_str());
    return kExitOk;
  }
  std::printf("%-5s %-8s %-11s %-24s %7s %14s %12s %10s %-4s %s\n", "ID", "KIND", "STATUS", "STAGE",
              "DONE", "RECORDS", "ERRORS", "REC/S", "BY", "UPDATED");
  for (const auto& j : *jobs) {
    const auto p = pipeline::DeriveProgress(j, now);
    std::printf("%-5" PRIu64 " %-8s %-11s %-24s %7s %14s %12s %10.0f %-4s %s\n", j.id,
                j.kind.c_str(), std::string(state::JobStatusName(j.status)).c_str(),
                std::string(state::JobStageName(j.stage)).c_str(), Percent(j, now).c_str(),
                FormatCount(j.counters.records_written).c_str(),
                FormatCount(j.counters.failed_records).c_str(), p.records_per_s,
                j.started_by.c_str(), FormatTime(j.updated_us).c_str());
  }
  if (jobs->empty()) std::printf("(no jobs yet)\n");
  for (const auto& j : *jobs) {
    if (!j.waiting.empty()) {
      std::printf("job %" PRIu64 " waits since %s: %s\n", j.id,
                  FormatTime(j.waiting_since_us).c_str(), j.waiting.sentence.c_str());
    }
  }
  if (st->read_only) std::printf("(read-only view: another atfill process holds the state)\n");
  return kExitOk;
}

namespace {

// What `atfill job` shows of one job, read once.
struct JobShown {
  pipeline::JobDetails details;
  // What the network reported of its accounts, and of repos whose chain broke, is listed apart
  // from the errors (state::IsOutcomeKind).
  std::map<std::string, uint64_t> errors, accounts, resyncs;
  std::vector<state::BatchAudit> audit;      // with --batches
  std::vector<state::ErrorEntry> error_log;  // with --errors
};

void WriteJobJson(const JobArgs& a, const JobShown& s, int64_t now) {
  const pipeline::JobDetails& d = s.details;
  JsonWriter w;
  w.BeginObject().Key("job").Raw(JobJson(d.job, now));
  w.Key("errors_by_kind").BeginObject();
  for (const auto& [k, v] : s.errors) w.Key(k).Uint(v);
  w.EndObject();
  w.Key("outcomes_by_kind").BeginObject();
  for (const auto* outcomes : {&s.accounts, &s.resyncs}) {
    for (const auto& [k, v] : *outcomes) w.Key(k).Uint(v);
  }
  w.EndObject();
  if (a.batches) {
    w.Key("batches").BeginArray();
    for (const auto& b : s.audit) {
      w.BeginObject().Key("batch").Uint(b.batch_no).Key("from").String(b.first_position);
      w.Key("to").String(b.last_position).Key("count").Uint(b.count);
      w.Key("failures").Uint(b.failures).Key("duration_us").Int(b.duration_us);
      w.Key("attempts").Uint(b.attempts).Key("committed_at").String(FormatTime(b.committed_at_us));
      w.EndObject();
    }
    w.EndArray();
  }
  if (a.errors) {
    w.Key("errors").BeginArray();
    for (const auto& e : s.error_log) {
      w.BeginObject().Key("kind").String(e.kind).Key("key").String(e.key);
      w.Key("message").String(e.message).Key("attempts").Uint(e.attempts);
      w.Key("resolved").Bool(e.resolved).EndObject();
    }
    w.EndArray();
  }
  if (a.hosts) {
    w.Key("hosts").BeginArray();
    for (const auto& h : d.hosts) {
      w.BeginObject().Key("host").String(h.host).Key("units").Uint(h.units);
      w.Key("done").Uint(h.done).Key("errors").Uint(h.errors).Key("records").Uint(h.records);
      w.EndObject();
    }
    w.EndArray();
  }
  if (a.recent) {
    w.Key("recent").BeginArray();
    for (const auto& r : d.recent) {
      w.BeginObject().Key("did").String(r.did).Key("host").String(r.host);
      w.Key("rev").String(r.rev).Key("records").Uint(r.records).Key("outcome").String(r.outcome);
      w.Key("fetched_at").String(FormatTime(r.fetched_at_us)).EndObject();
    }
    w.EndArray();
  }
  w.EndObject();
  std::printf("%s\n", w.str().c_str());
}

// Status, progress, times, counters and parameters.
void PrintJobHead(const state::JobRecord& j, int64_t now) {
  const auto p = pipeline::DeriveProgress(j, now);
  std::printf("job %" PRIu64 " (%s), started by %s\n", j.id, j.kind.c_str(), j.started_by.c_str());
  std::printf("  status      %s / %s\n", std::string(state::JobStatusName(j.status)).c_str(),
              std::string(state::JobStageName(j.stage)).c_str());
  if (!j.waiting.empty()) {
    std::printf("  waiting     %s since %s: %s\n", j.waiting.code.c_str(),
                FormatTime(j.waiting_since_us).c_str(), j.waiting.sentence.c_str());
  }
  if (!j.stop_reason.empty()) {
    std::printf("  stopped     %s: %s\n", j.stop_reason.code.c_str(),
                j.stop_reason.sentence.c_str());
  }
  std::printf("  progress    %s, %.0f records/s, %.0f events/s%s\n", Percent(j, now).c_str(),
              p.records_per_s, p.events_per_s,
              p.eta_s >= 0 && j.status == state::JobStatus::kRunning
                  ? (", ETA " + FormatDuration(p.eta_s)).c_str()
                  : "");
  std::printf("  times       created %s, started %s, updated %s, finished %s\n",
              FormatTime(j.created_us).c_str(), FormatTime(j.started_us).c_str(),
              FormatTime(j.updated_us).c_str(), FormatTime(j.finished_us).c_str());
  const auto& c = j.counters;
  std::printf("  counters    events_read %s, records %s, written %s, failed %s, bytes %s\n",
              FormatCount(c.events_read).c_str(), FormatCount(c.total_records).c_str(),
              FormatCount(c.records_written).c_str(), FormatCount(c.failed_records).c_str(),
              FormatCount(c.bytes).c_str());
  if (c.total_repos != 0) {
    std::printf("  repos       total %s, resolved %s, processed %s\n",
                FormatCount(c.total_repos).c_str(), FormatCount(c.resolved_repos).c_str(),
                FormatCount(c.processed_repos).c_str());
  }
  for (const auto& [k, v] : c.extra) std::printf("  %-11s %s\n", k.c_str(), FormatCount(v).c_str());
  for (const auto& [k, v] : j.params) {
    std::string shown = v;
    for (auto& ch : shown) ch = ch == '\n' ? ' ' : ch;
    std::printf("  param       %s = %s\n", k.c_str(), shown.c_str());
  }
}

// The errors by kind, then the outcomes the network reported, each group under its heading.
void PrintErrorCounts(const JobArgs& a, const JobShown& s) {
  auto counts = [](const std::map<std::string, uint64_t>& by_kind) {
    for (const auto& [k, v] : by_kind)
      std::printf("    %-22s %s\n", k.c_str(), FormatCount(v).c_str());
  };
  std::printf("  errors      %s\n", s.errors.empty() ? "none" : "");
  counts(s.errors);
  const char* listed = a.errors ? "" : "; listed by --errors";
  if (!s.accounts.empty()) {
    std::printf(
        "  unavailable accounts (deactivated, taken down, suspended or gone; not errors%s)\n",
        listed);
    counts(s.accounts);
  }
  if (!s.resyncs.empty()) {
    std::printf("  repo resyncs (chains that broke, and their resyncs; not errors%s)\n", listed);
    counts(s.resyncs);
  }
}

// A replay's archive blocks still failed (atfill retry-failed reads them again).
void PrintFailedBlocks(state::KvStore& kv, uint64_t job) {
  state::FailedBlocks failed(kv);
  size_t shown = 0, total = 0;
  std::string lines;
  Status s = failed.Scan(job, [&](const state::FailedBlock& b) {
    ++total;
    if (shown < 20) {
      ++shown;
      lines += "    " + b.block_id + "  " + b.reason + "\n";
    }
    return true;
  });
  if (!s.ok()) {
    std::printf("  failed blocks: cannot be read: %s\n", s.message().c_str());
    return;
  }
  std::printf("  failed blocks %s%s\n%s", total == 0 ? "none" : FormatCount(total).c_str(),
              total > shown ? (" (first " + std::to_string(shown) + " shown)").c_str() : "",
              lines.c_str());
}

// The tables the flags ask for: batches, the error log, hosts, recent repos.
void PrintJobTables(const JobArgs& a, const JobShown& s) {
  if (a.batches) {
    std::printf("\n  %-8s %-28s %-28s %8s %8s %10s %8s\n", "BATCH", "FROM", "TO", "COUNT", "FAILED",
                "MS", "ATTEMPTS");
    for (const auto& b : s.audit) {
      std::printf("  %-8" PRIu64 " %-28s %-28s %8" PRIu64 " %8" PRIu64 " %10.1f %8u\n", b.batch_no,
                  b.first_position.c_str(), b.last_position.c_str(), b.count, b.failures,
                  static_cast<double>(b.duration_us) / 1000.0, b.attempts);
    }
    if (s.audit.empty()) {
      std::printf("  (no batch audit: set [jobs] record_batches = true in the config)\n");
    }
  }
  if (a.errors) {
    std::printf("\n");
    for (const auto& e : s.error_log) {
      std::printf("  %-18s %-40s %s%s\n", e.kind.c_str(), e.key.c_str(), e.message.c_str(),
                  e.attempts > 1 ? (" (x" + std::to_string(e.attempts) + ")").c_str() : "");
    }
  }
  if (a.hosts) {
    std::printf("\n  %-44s %8s %8s %8s %10s\n", "PDS", "UNITS", "DONE", "ERRORS", "RECORDS");
    for (const auto& h : s.details.hosts) {
      std::printf("  %-44s %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %10" PRIu64 "\n", h.host.c_str(),
                  h.units, h.done, h.errors, h.records);
    }
  }
  if (a.recent) {
    std::printf("\n  %-20s %-34s %-34s %8s %s\n", "FETCHED", "DID", "PDS", "RECORDS", "OUTCOME");
    for (const auto& r : s.details.recent) {
      std::printf("  %-20s %-34s %-34s %8" PRIu64 " %s\n", FormatTime(r.fetched_at_us).c_str(),
                  r.did.c_str(), r.host.c_str(), r.records, r.outcome.c_str());
    }
  }
}

}  // namespace

int RunJob(std::span<char* const> args) {
  JobArgs a;
  if (int rc = ParseArgs("job", args, true,
                         {"--json", "--batches", "--errors", "--hosts", "--recent"}, &a);
      rc >= 0) {
    return rc;
  }
  auto config = LoadAppConfig(a.config);
  if (!config.ok()) return Fail("job", config.status().message(), kExitUsage);
  auto st = OpenStateForRead(*config);
  if (!st.ok()) return Fail("job", st.status().message(), kExitIo);
  auto details =
      pipeline::JobDetailsReader(st->kv.get(), st->jobs.get(), st->errors.get()).Get(a.id);
  if (!details.ok()) {
    const bool missing = details.status().code() == StatusCode::kNotFound;
    return Fail("job", details.status().message(), missing ? kExitUsage : kExitIo);
  }
  JobShown shown;
  shown.details = std::move(*details);
  for (const auto& [k, v] : shown.details.errors_by_kind) {
    auto& group = !state::IsOutcomeKind(k)  ? shown.errors
                  : k == "repo_unavailable" ? shown.accounts
                                            : shown.resyncs;
    group[k] = v;
  }
  if (a.batches) {
    auto listed = st->jobs->ListBatchAudit(a.id, 0, SIZE_MAX);
    if (!listed.ok()) return Fail("job", listed.status().message(), kExitIo);
    shown.audit = std::move(*listed);
  }
  if (a.errors) {
    auto listed = st->errors->List(a.id, 0, UINT64_MAX);
    if (!listed.ok()) return Fail("job", listed.status().message(), kExitIo);
    shown.error_log = std::move(*listed);
  }
  const int64_t now = pipeline::NowMicros();
  if (a.json) {
    WriteJobJson(a, shown, now);
    return kExitOk;
  }
  const state::JobRecord& j = shown.details.job;
  PrintJobHead(j, now);
  PrintErrorCounts(a, shown);
  if (j.params.count("source") && j.params.at("source") == "replay") {
    PrintFailedBlocks(*st->kv, j.id);
  }
  PrintJobTables(a, shown);
  if (st->read_only) std::printf("(read-only view: another atfill process holds the state)\n");
  return kExitOk;
}

namespace {

// pause and cancel: ask the process running the job, or, when none does, set the job's status.
int Steer(std::string_view verb, std::span<char* const> args, pipeline::StopKind kind) {
  JobArgs a;
  if (int rc = ParseArgs(verb, args, true, {}, &a); rc >= 0) return rc;
  auto config = LoadAppConfig(a.config);
  if (!config.ok()) return Fail(verb, config.status().message(), kExitUsage);
  const char* what = kind == pipeline::StopKind::kPause ? "pause" : "cancel";
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) {
    if (st.status().code() != StatusCode::kUnavailable) {
      return Fail(verb, st.status().message(), kExitIo);
    }
    // Another process runs jobs from this state: hand it the request.
    if (Status s = pipeline::JobController::WriteRequest(pipeline::RequestsDir(config->settings),
                                                         a.id, what);
        !s.ok()) {
      return Fail(verb, s.message(), kExitIo);
    }
    std::printf("asked the running atfill to %s job %" PRIu64 " at its next checkpoint (%s)\n",
                what, a.id, st.status().message().c_str());
    return kExitOk;
  }
  auto job = st->jobs->Get(a.id);
  if (!job.ok()) return Fail(verb, job.status().message(), kExitUsage);
  if (job->status == state::JobStatus::kCompleted || job->status == state::JobStatus::kCancelled) {
    return Fail(verb,
                "job " + std::to_string(a.id) + " is already " +
                    std::string(state::JobStatusName(job->status)),
                kExitInputInvalid);
  }
  if (kind == pipeline::StopKind::kPause && job->status == state::JobStatus::kPaused) {
    std::printf("job %" PRIu64 " is already paused\n", a.id);
    return kExitOk;
  }
  // No process runs it, so both phases happen here.
  const int64_t now = pipeline::NowMicros();
  job->updated_us = now;
  if (kind == pipeline::StopKind::kPause) {
    job->status = state::JobStatus::kPaused;
    job->stop_reason = {"paused", "paused on request while no process was running it"};
  } else {
    job->status = state::JobStatus::kCancelled;
    job->stage = state::JobStage::kCancelled;
    job->finished_us = now;
    job->stop_reason = {"cancelled", "cancelled on request"};
  }
  state::WriteBatch batch;
  Status s = st->jobs->Put(&batch, *job);
  if (s.ok()) s = st->kv->Write(batch);
  if (!s.ok()) return Fail(verb, s.message(), kExitIo);
  std::printf("job %" PRIu64 " %s\n", a.id, std::string(state::JobStatusName(job->status)).c_str());
  return kExitOk;
}

}  // namespace

int RunPause(std::span<char* const> args) {
  return Steer("pause", args, pipeline::StopKind::kPause);
}
int RunCancel(std::span<char* const> args) {
  return Steer("cancel", args, pipeline::StopKind::kCancel);
}

int RunResume(std::span<char* const> args) {
  JobArgs a;
  if (int rc = ParseArgs("resume", args, true, {}, &a); rc >= 0) return rc;
  auto config = LoadAppConfig(a.config);
  if (!config.ok()) return Fail("resume", config.status().message(), kExitUsage);
  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail("resume", st.status().message(), kExitIo);
  auto job = st->jobs->Get(a.id);
  if (!job.ok()) return Fail("resume", job.status().message(), kExitUsage);
  if (job->status == state::JobStatus::kCompleted || job->status == state::JobStatus::kCancelled) {
    return Fail("resume",
                "job " + std::to_string(a.id) + " is " +
                    std::string(state::JobStatusName(job->status)) + "; there is nothing to resume",
                kExitInputInvalid);
  }
  if (job->kind != "backfill" && job->kind != "ingest") {
    return Fail("resume",
                "job " + std::to_string(a.id) + " is a " + job->kind +
                    " job; this atfill resumes ingest and backfill jobs only",
                kExitUsage);
  }
  if (auto swept = st->tombstones->Sweep(pipeline::NowMicros()); !swept.ok()) {
    return Fail("resume", "sweeping tombstones: " + swept.status().message(), kExitIo);
  }
  std::fprintf(stderr, "atfill resume: resuming %s job %" PRIu64 " (%s)\n", job->kind.c_str(),
               job->id, std::string(state::JobStatusName(job->status)).c_str());
  const int rc = RunInForeground("resume", *config, *st, *job);
  RestoreSignals();
  return rc;
}

}  // namespace atfill::cli
