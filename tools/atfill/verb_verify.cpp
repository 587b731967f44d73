// atfill verify CONFIG [--did DID]... [--collection NSID]... [--repair] [--json]: compares the
// stored records of each repo with the signed repo its PDS serves
// (sources/verify/verify_source.hpp), as a job, and prints what differs.
#include <cinttypes>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "atproto/syntax.hpp"
#include "base/json_writer.hpp"
#include "pipeline/job.hpp"
#include "tools/atfill/app_config.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"
#include "tools/atfill/job_run.hpp"

namespace atfill::cli {
namespace {

int Fail(const std::string& msg, int code) {
  std::fprintf(stderr, "atfill verify: %s\n", msg.c_str());
  return code;
}

uint64_t Counter(const state::JobRecord& job, const char* name) {
  auto it = job.counters.extra.find(name);
  return it == job.counters.extra.end() ? 0 : static_cast<uint64_t>(it->second);
}

// The differences' words on the command line.
const std::map<std::string, std::string>& DiffNames() {
  static const std::map<std::string, std::string> kNames = {
      {sources::kVerifyMissing, "missing"},
      {sources::kVerifyExtra, "extra"},
      {sources::kVerifyDifferent, "different"}};
  return kNames;
}

void PrintJson(const state::JobRecord& job, const std::vector<state::ErrorEntry>& entries) {
  std::string out = "{\"job\":" + std::to_string(job.id) + ",\"status\":";
  AppendJsonString(state::JobStatusName(job.status), &out);
  out += ",\"repair\":";
  out += job.params.count("repair") && job.params.at("repair") == "true" ? "true" : "false";
  for (const char* name :
       {sources::kVerifyReposChecked, sources::kVerifyReposDiffering, sources::kVerifyReposFailed,
        sources::kVerifyRecords, sources::kVerifyMissing, sources::kVerifyExtra,
        sources::kVerifyDifferent, sources::kVerifyRepairs}) {
    // "verify_missing" -> "missing": the counters without their prefix.
    out += ",\"" + std::string(name + 7) + "\":" + std::to_string(Counter(job, name));
  }
  out += ",\"differences\":[";
  bool first = true;
  for (const state::ErrorEntry& e : entries) {
    auto name = DiffNames().find(e.kind);
    if (name == DiffNames().end()) continue;
    if (!first) out += ',';
    first = false;
    out += "{\"kind\":";
    AppendJsonString(name->second, &out);
    out += ",\"uri\":";
    AppendJsonString(e.key, &out);
    out += ",\"message\":";
    AppendJsonString(e.message, &out);
    out += '}';
  }
  out += "],\"errors\":[";
  first = true;
  for (const state::ErrorEntry& e : entries) {
    if (DiffNames().count(e.kind)) continue;
    if (!first) out += ',';
    first = false;
    out += "{\"kind\":";
    AppendJsonString(e.kind, &out);
    out += ",\"key\":";
    AppendJsonString(e.key, &out);
    out += ",\"message\":";
    AppendJsonString(e.message, &out);
    out += '}';
  }
  out += "]}\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

int RunVerify(std::span<char* const> args) {
  std::string config_path;
  sources::VerifyTargets targets;
  bool json = false;
  CLI::App app{"", "atfill verify"};
  PrepareVerbApp(app);
  app.add_option("CONFIG", config_path, "the config file")->required();
  app.add_option("--did", targets.dids);
  app.add_option("--collection", targets.collections);
  app.add_flag("--repair", targets.repair);
  app.add_flag("--json", json);
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  for (const std::string& did : targets.dids) {
    if (Status s = atproto::ValidateDid(did); !s.ok()) {
      return Fail("--did " + did + ": " + s.message(), kExitUsage);
    }
  }
  for (const std::string& c : targets.collections) {
    const std::string nsid = c.ends_with(".*") ? c.substr(0, c.size() - 2) + ".x" : c;
    if (Status s = atproto::ValidateNsid(nsid); !s.ok()) {
      return Fail("--collection " + c + ": " + s.message(), kExitUsage);
    }
  }
  auto config = LoadAppConfig(config_path);
  if (!config.ok()) return Fail(config.status().message(), kExitUsage);
  CatchStopSignals();
  auto st = OpenStateForWrite(*config);
  if (!st.ok()) return Fail(st.status().message(), kExitIo);
  auto job = sources::CreateVerifyJob(EnvOf(*config, *st), targets, "cli");
  if (!job.ok()) return Fail(job.status().message(), kExitIo);
  std::fprintf(stderr, "atfill verify: job %" PRIu64 " compares %s%s with their PDSs%s\n", job->id,
               targets.dids.empty() ? "every stored repo"
                                    : (std::to_string(targets.dids.size()) + " repo(s)").c_str(),
               targets.collections.empty() ? "" : " (the given collections)",
               targets.repair ? " and repairs the differences" : "");
  Result<pipeline::JobOutcome> outcome = RunAndReport("verify", *config, *st, std::move(*job));
  RestoreSignals();
  if (!outcome.ok()) return ExitCodeOf(outcome);
  const state::JobRecord& done = outcome->job;
  auto entries = st->errors->List(done.id, 0, st->errors->options().max_entries_per_job);
  if (!entries.ok()) return Fail(entries.status().message(), kExitIo);
  if (json) {
    PrintJson(done, *entries);
  } else {
    for (const state::ErrorEntry& e : *entries) {
      auto name = DiffNames().find(e.kind);
      if (name == DiffNames().end()) {
        std::printf("error %s %s: %s\n", e.kind.c_str(), e.key.c_str(), e.message.c_str());
      } else {
        std::printf("%s %s: %s\n", name->second.c_str(), e.key.c_str(), e.message.c_str());
      }
    }
  }
  std::fprintf(stderr,
               "atfill verify: %" PRIu64 " repo(s) checked, %" PRIu64 " with differences, %" PRIu64
               " could not be checked; %" PRIu64 " record(s) compared: %" PRIu64
               " missing, %" PRIu64 " extra, %" PRIu64 " with another CID%s\n",
               Counter(done, sources::kVerifyReposChecked),
               Counter(done, sources::kVerifyReposDiffering),
               Counter(done, sources::kVerifyReposFailed), Counter(done, sources::kVerifyRecords),
               Counter(done, sources::kVerifyMissing), Counter(done, sources::kVerifyExtra),
               Counter(done, sources::kVerifyDifferent),
               targets.repair ? ("; " + std::to_string(Counter(done, sources::kVerifyRepairs)) +
                                 " repair write(s) through the ingest path")
                                    .c_str()
                              : "");
  return ExitCodeOf(outcome);
}

}  // namespace atfill::cli
