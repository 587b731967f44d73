#include "stages/components.hpp"

#include <optional>

#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
#include "stages/live_hold.hpp"
#include "state/live_holds.hpp"

namespace atfill::stages {
namespace {

// [lexicons] dirs and mode; the documents are loaded and checked here, so a bad one stops the
// config with its file and reason. The registry is made even without dirs: lexicons may be added
// while `atfill run` runs.
Status ReadLexicons(pipeline::ConfigFile& file, LexiconSettings* out) {
  std::vector<std::string> dirs;
  ATFILL_RETURN_IF_ERROR(file.ReadPathList("lexicons.dirs", &dirs));
  std::string mode(LexiconModeName(out->mode));
  ATFILL_RETURN_IF_ERROR(file.ReadEnum("lexicons.mode", &mode, {"reject", "log", "off"}));
  out->mode = *ParseLexiconMode(mode);
  ATFILL_RETURN_IF_ERROR(file.ReadBool("lexicons.use_network", &out->use_network));
  atproto::LexiconCatalog::Builder documents;
  for (const std::string& dir : dirs) {
    if (Status s = documents.AddPath(dir); !s.ok()) {
      return s.WithContext(file.Where("lexicons.dirs"));
    }
  }
  out->dirs = std::move(dirs);
  out->registry = std::make_shared<LexiconRegistry>(std::move(documents));
  return Status::OK();
}

Status ReadStageConfig(pipeline::ConfigFile& file, pipeline::Settings& settings) {
  StageSettings& c = settings.Mutable<StageSettings>();
  ATFILL_RETURN_IF_ERROR(file.ReadBool("stages.verify_cids", &c.verify_cids));
  ScriptOptions& sc = c.scripts;
  ATFILL_RETURN_IF_ERROR(file.ReadPathTable("scripts.collections", &sc.scripts));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("scripts.fail_open", &sc.fail_open));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("scripts.instruction_budget", &sc.instruction_budget, 1000, INT32_MAX));
  int64_t script_mb = static_cast<int64_t>(sc.memory_limit_bytes >> 20);
  ATFILL_RETURN_IF_ERROR(file.ReadInt("scripts.memory_mb", &script_mb, 1, 65536));
  sc.memory_limit_bytes = static_cast<size_t>(script_mb) << 20;
  ATFILL_RETURN_IF_ERROR(file.ReadUint("scripts.attempts", &sc.max_attempts, 1, 100));
  int64_t call_timeout_ms = sc.call_timeout.count();
  ATFILL_RETURN_IF_ERROR(file.ReadInt("scripts.call_timeout_ms", &call_timeout_ms, 10, 3'600'000));
  sc.call_timeout = std::chrono::milliseconds(call_timeout_ms);
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("live.account_check_timeout_ms", &c.account_check.timeout_ms, 1, 600'000));
  if (Status s = sc.Validate(); !s.ok()) return s.WithContext(file.source_name() + ": [scripts]");
  return ReadLexicons(file, &c.lexicons);
}

const StageSettings& Of(const pipeline::Environment& env) {
  return env.settings->Get<StageSettings>();
}

// The lexicon check, unless it is turned off; the lexicons added at run time and kept in state
// join the config's first.
Result<std::optional<LexiconCheck>> LexiconCheckOf(const pipeline::Environment& env) {
  const LexiconSettings& l = Of(env).lexicons;
  if (l.registry == nullptr || l.mode == LexiconMode::kOff) return std::optional<LexiconCheck>();
  if (env.kv != nullptr) {
    if (l.use_network) ATFILL_RETURN_IF_ERROR(l.registry->UseNetwork(env.kv));
    state::LexiconStore kept(*env.kv);
    ATFILL_RETURN_IF_ERROR(l.registry->LoadKept(kept));
  }
  return std::optional<LexiconCheck>(LexiconCheck(l.registry, l.mode));
}

// CID verification; with lexicons, it also reaches each record's lexicon verdict on the same
// parse of the record.
Status AddCidVerify(const pipeline::Environment& env, pipeline::PlanDraft& draft) {
  if (!Of(env).verify_cids) return Status::OK();
  ATFILL_ASSIGN_OR_RETURN(auto check, LexiconCheckOf(env));
  draft.plan->stages.cid_verify = draft.Keep(check ? std::make_unique<CidVerify>(std::move(*check))
                                                   : std::make_unique<CidVerify>());
  return Status::OK();
}

// Lexicon validation on its own, for jobs that do not verify CIDs.
Status AddLexiconValidate(const pipeline::Environment& env, pipeline::PlanDraft& draft) {
  if (Of(env).verify_cids) return Status::OK();
  ATFILL_ASSIGN_OR_RETURN(auto check, LexiconCheckOf(env));
  if (check) {
    draft.plan->stages.lexicon = draft.Keep(std::make_unique<LexiconValidate>(std::move(*check)));
  }
  return Status::OK();
}

Status AddScript(const pipeline::Environment& env, pipeline::PlanDraft& draft) {
  if (Of(env).scripts.scripts.empty()) return Status::OK();
  ScriptOptions options = Of(env).scripts;
  options.read_record = draft.readers.record;
  auto made = ScriptStage::Create(std::move(options));
  if (!made.ok()) return Status::Invalid(env.settings->path + ": " + made.status().message());
  draft.plan->stages.script = draft.Keep(std::move(*made));
  return Status::OK();
}

// Where the job's source offers a way to ask an account's PDS (the live consumer's), an account
// the stream calls deleted is confirmed before it is purged.
Status AddAccountCheck(const pipeline::Environment& env, pipeline::PlanDraft& draft) {
  if (draft.account_status == nullptr) return Status::OK();
  draft.plan->stages.account_check =
      draft.Keep(std::make_unique<AccountCheck>(draft.account_status, Of(env).account_check));
  return Status::OK();
}

// The live consumer's events of repos a crawl beside it has queued wait for the repo's
// checkpoint (and what an earlier run held is applied); while a gap replay runs beside it, every
// event waits in state, then applies on top of the gap.
Status AddLiveHold(const pipeline::Environment& env, pipeline::PlanDraft& draft) {
  if (draft.job->kind != "live") return Status::OK();
  auto* holds = draft.Keep(std::make_unique<state::LiveHolds>(*env.kv));
  LiveHoldOptions options;
  options.backfill_running = draft.ctx->backfill_running;
  pipeline::JobGroup* gaps = draft.ctx->beside;
  options.hold_all = [gaps] { return gaps != nullptr && gaps->running(); };
  options.consumes = draft.consumes;
  draft.plan->stages.live_hold = draft.Keep(std::make_unique<LiveHold>(holds, options));
  return Status::OK();
}

// The collections the unfinished backfill jobs of this state cover ("*" for one that fetches every
// collection); empty when none is unfinished.
Result<std::vector<std::string>> UnfinishedBackfillCollections(state::JobStore* jobs) {
  ATFILL_ASSIGN_OR_RETURN(auto all, jobs->List());
  std::vector<std::string> out;
  for (const auto& j : all) {
    if (j.kind != "backfill" || state::IsTerminal(j.status)) continue;
    auto it = j.params.find("collections");
    std::vector<std::string> collections =
        pipeline::SplitLines(it == j.params.end() ? std::string() : it->second);
    if (collections.empty()) return std::vector<std::string>{"*"};
    out.insert(out.end(), collections.begin(), collections.end());
  }
  return out;
}

// Every job's writes pass the guard (revs and tombstones). For the live consumer, a record delete
// leaves a tombstone only where a stale create could still arrive: the stream's events wait while
// a gap replay runs (its hold), so none reaches the guard before the gap is written; a gap job
// that stopped unfinished may still bring older creates when it is resumed, so until then every
// delete leaves one, as do deletes in collections an unfinished backfill covers.
Status AddIngestGuard(const pipeline::Environment& env, pipeline::PlanDraft& draft) {
  std::optional<DeleteTombstoneRule> rule;
  if (draft.job->kind == "live") {
    rule.emplace();
    pipeline::JobGroup* gaps = draft.ctx->beside;
    rule->sink_holds = [gaps, holds = draft.readers.holds](
                           const std::string& did, const std::string& collection) -> Result<bool> {
      if (gaps != nullptr && gaps->unfinished()) return true;
      if (!holds) return true;
      return holds(did, collection);
    };
    auto backfills = UnfinishedBackfillCollections(env.jobs);
    if (!backfills.ok()) return Status::IoError(backfills.status().message());
    rule->always = std::move(*backfills);
  }
  draft.plan->stages.ingest_guard =
      draft.Keep(std::make_unique<IngestGuard>(env.tombstones, nullptr, std::move(rule)));
  return Status::OK();
}

}  // namespace

void Register(pipeline::Components& components) {
  components.AddConfigReader(ReadStageConfig);
  components.AddStage("cid_verify", AddCidVerify);
  components.AddStage("lexicon_validate", AddLexiconValidate);
  components.AddStage("script", AddScript);
  components.AddStage("account_check", AddAccountCheck);
  components.AddStage("live_hold", AddLiveHold);
  components.AddStage("ingest_guard", AddIngestGuard);
}

}  // namespace atfill::stages
