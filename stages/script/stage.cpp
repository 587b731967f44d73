// One record's call (LuaWorker::Run) and the stage around it: workers made per thread, records
// run in turn, retries with backoff off the workers, fail_open, and the counters (script.hpp).
#include "stages/script/lua_worker.hpp"

namespace atfill::stages {
namespace lua {

// ---- one call ----------------------------------------------------------------------------------

int LuaWorker::RunRecord(lua_State* L) {
  LuaWorker* self = Self(L);
  const RecordEvent& event = *self->event_;
  const int fields = lua_upvalueindex(kUpFields);
  const int proxy = lua_upvalueindex(kUpProxy);
  // Forget the fields the previous call made: they are made again from this event when read.
  for (int k = kUpDid; self->made_fields_ != 0 && k <= kUpRecord; ++k) {
    if ((self->made_fields_ & (1u << k)) == 0) continue;
    lua_pushvalue(L, lua_upvalueindex(k));
    lua_pushnil(L);
    lua_rawset(L, fields);
    self->made_fields_ &= ~(1u << k);
  }
  self->decoded_ = false;

  lua_rawgeti(L, LUA_REGISTRYINDEX, self->record_refs_[self->script_]);
  lua_pushvalue(L, proxy);
  lua_call(L, 1, 1);
  if (!lua_toboolean(L, -1)) {
    self->outcome_ = Outcome::kDrop;
    return 0;
  }
  if (!lua_rawequal(L, -1, proxy)) {
    return luaL_error(L,
                      "%s: record() must return the event it was given, or nil to drop the "
                      "record (it returned a %s)",
                      self->ScriptName(), luaL_typename(L, -1));
  }
  self->outcome_ = Outcome::kKeep;
  if (event.operation == Operation::kDelete) return 0;
  lua_pushvalue(L, lua_upvalueindex(kUpRecord));
  if (lua_rawget(L, fields) != LUA_TTABLE) return 0;  // never read nor set: unchanged
  const int record = lua_gettop(L);

  self->encoded_.clear();
  self->created_at_.clear();
  self->out_ = &self->encoded_;
  self->path_.clear();
  self->keys_.clear();
  self->encode_what_ = kEncodeRecord;
  self->capture_created_at_ = true;
  self->EncodeValue(L, record, 0);
  if (self->encoded_.empty() || self->encoded_.front() != '{') {
    return luaL_error(L, "%s: event.record must be a JSON object, not an array",
                      self->ScriptName());
  }
  if (!self->decoded_) {
    // Set without being read: compare against the original's encoding all the same.
    dom::element root;
    const char* error = nullptr;
    self->canonical_.clear();
    self->dom_entries_.clear();
    self->canonical_ok_ =
        self->Parse(event.body, &root, &error) && self->Canonical(root, 0, &self->canonical_);
  }
  if (!self->canonical_ok_ || self->encoded_ != self->canonical_) {
    self->outcome_ = Outcome::kChanged;
  }
  return 0;
}

int LuaWorker::ClearEvent(lua_State* L) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, Self(L)->fields_ref_);
  lua_pushliteral(L, "record");
  lua_pushnil(L);
  lua_rawset(L, -3);
  return 0;
}

Outcome LuaWorker::Run(size_t script, const RecordEvent& event) {
  event_ = &event;
  script_ = script;
  outcome_ = Outcome::kKeep;
  lua_settop(L_, 0);
  StartLimits();
  lua_rawgeti(L_, LUA_REGISTRYINDEX, run_ref_);
  const int rc = lua_pcall(L_, 0, 0, 0);
  // A call past its deadline fails even when the script caught the error and returned.
  const bool timed_out = limit_hit_ == Limit::kTime || alloc_.timed_out;
  if (rc == LUA_OK && !timed_out) {
    alloc_.deadline_ns = 0;
    event_ = nullptr;
    return outcome_;
  }
  error_ = rc == LUA_OK ? TimeoutMessage() : StatusMessage(rc);
  alloc_.deadline_ns = 0;
  alloc_.timed_out = false;
  event_ = nullptr;
  lua_settop(L_, 0);
  if (rc == LUA_ERRMEM) {
    // Let the failed call's data go now (the event may still hold its record), so the next
    // call starts with the memory it had before.
    lua_pushcfunction(L_, ClearEvent);
    if (lua_pcall(L_, 0, 0, 0) != LUA_OK) lua_settop(L_, 0);
    lua_gc(L_, LUA_GCCOLLECT);
  }
  return Outcome::kError;
}

}  // namespace lua

using namespace lua;  // the worker and the limits it runs under

// ---- the stage ---------------------------------------------------------------------------------

Status ScriptOptions::Validate() const {
  for (const auto* map : {&scripts, &sources}) {
    for (const auto& [collection, value] : *map) {
      Status st = atproto::ValidateNsid(collection);
      if (!st.ok()) return st.WithContext("script collection " + QuoteForMessage(collection));
      if (map == &scripts && value.empty()) {
        return Status::Invalid("script for " + collection + " has an empty path");
      }
    }
  }
  for (const auto& [collection, text] : sources) {
    if (scripts.count(collection) != 0) {
      return Status::Invalid("collection " + collection + " has both a script file and a source");
    }
  }
  if (instruction_budget == 0 || instruction_budget > static_cast<uint64_t>(INT_MAX)) {
    return Status::OutOfRange("script instruction_budget must be between 1 and " +
                              std::to_string(INT_MAX));
  }
  if (call_timeout < std::chrono::milliseconds(10) || call_timeout > std::chrono::hours(1)) {
    return Status::OutOfRange("script call_timeout must be between 10 ms and 1 hour");
  }
  if (memory_limit_bytes < kMinMemory) {
    return Status::OutOfRange("script memory_limit_bytes must be at least " +
                              std::to_string(kMinMemory));
  }
  if (max_attempts < 1) return Status::OutOfRange("script max_attempts must be at least 1");
  if (retry_backoff.count() < 0 || max_backoff_per_chunk.count() < 0) {
    return Status::OutOfRange("script retry backoff must not be negative");
  }
  return Status::OK();
}

ScriptStage::ScriptStage(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
ScriptStage::~ScriptStage() = default;

Result<std::unique_ptr<ScriptStage>> ScriptStage::Create(ScriptOptions options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  auto program = std::make_shared<Program>();
  for (const auto& [collection, path] : options.scripts) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return Status::IoError("cannot read the script for " + collection + ": " + path);
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad()) return Status::IoError("cannot read the script for " + collection + ": " + path);
    program->scripts.push_back({collection, path, "@" + path, text.str()});
  }
  for (const auto& [collection, text] : options.sources) {
    const std::string origin = "inline:" + collection;
    program->scripts.push_back({collection, origin, "@" + origin, text});
  }
  for (size_t i = 0; i < program->scripts.size(); ++i) {
    program->index.emplace(program->scripts[i].collection, i);
  }
  program->options = std::move(options);
  InstallPatternSignal();
  // A tenth of the limit between looks: a match is stopped at most that late (and 100 ms).
  const auto tick = std::clamp<std::chrono::nanoseconds>(program->options.call_timeout / 10,
                                                         std::chrono::milliseconds(1),
                                                         std::chrono::milliseconds(100));
  program->watchdog = std::make_shared<PatternWatchdog>(tick);
  if (program->options.max_attempts > 1 && program->options.retry_backoff.count() > 0 &&
      program->options.max_backoff_per_chunk >= program->options.retry_backoff) {
    program->delays = std::make_unique<pipeline::DelayQueue>();
  }
  // Compile and load everything once, so a broken script is a config error before the run.
  LuaWorker probe(program.get());
  ATFILL_RETURN_IF_ERROR(probe.Init());
  return std::unique_ptr<ScriptStage>(new ScriptStage(std::move(program)));
}

std::unique_ptr<pipeline::TransformState> ScriptStage::NewState() const {
  auto worker = std::make_unique<LuaWorker>(program_.get());
  // A failure stays in the worker: Start reports it (the stage is asynchronous).
  (void)worker->Init();
  return worker;
}

bool ScriptStage::HasScript(std::string_view collection) const {
  return program_->Find(collection) != Program::kNone;
}

bool ScriptStage::Start(pipeline::TransformState* state, pipeline::EventChunk* chunk, bool again,
                        Done done) const {
  auto* worker = dynamic_cast<LuaWorker*>(state);
  if (worker == nullptr || !worker->init_status().ok()) {
    done(worker == nullptr ? Status::Internal("script stage: Start needs a state from NewState")
                           : worker->init_status());
    return true;
  }
  const ScriptOptions& opt = program_->options;

  // Where the chunk stands: fresh, or back after a retry's wait.
  Progress p;
  p.wait = opt.retry_backoff;
  {
    // A fresh chunk drops what a run that ended while a chunk at this address waited left.
    std::lock_guard<std::mutex> lock(program_->progress_mu);
    if (auto it = program_->progress.find(chunk); it != program_->progress.end()) {
      if (again) p = it->second;
      program_->progress.erase(it);
    }
  }
  auto& events = chunk->events;
  // Events of one collection come in runs: the last lookup is reused.
  std::string last_collection;
  size_t last_script = Program::kNone;
  bool have_last = false;

  for (; p.next < events.size(); ++p.next) {
    bool kept = true;
    if (auto* record = std::get_if<pipeline::RecordEvent>(&events[p.next])) {
      if (!have_last || record->collection != last_collection) {
        last_collection = record->collection;
        last_script = program_->Find(record->collection);
        have_last = true;
      }
      if (last_script != Program::kNone) {
        Outcome outcome = Outcome::kError;
        for (;; ++p.attempt) {
          outcome = worker->Run(last_script, *record);
          if (outcome != Outcome::kError || p.attempt >= opt.max_attempts) break;
          ++p.retries;
          if (program_->delays && p.wait.count() > 0 &&
              p.waited + p.wait <= opt.max_backoff_per_chunk) {
            // The wait runs on the delay queue; the chunk comes back to this record's next
            // attempt on whichever worker is free.
            const auto wait = p.wait;
            p.waited += p.wait;
            p.wait *= 2;
            ++p.attempt;
            p.resumed = true;
            {
              std::lock_guard<std::mutex> lock(program_->progress_mu);
              program_->progress[chunk] = p;
            }
            program_->delays->After(wait, [done = std::move(done)] { done.Again(); });
            return true;
          }
        }
        // The next record starts over; the chunk's waiting so far still counts.
        p.attempt = 1;
        p.wait = opt.retry_backoff;
        switch (outcome) {
          case Outcome::kKeep:
            break;
          case Outcome::kChanged:
            record->body.swap(*worker->encoded());
            record->created_at = worker->created_at();
            ++p.changed;
            break;
          case Outcome::kDrop:
            kept = false;
            ++p.script_dropped;
            break;
          case Outcome::kError:
            chunk->errors.push_back({"script_error", record->Uri(), worker->error()});
            ++p.errors;
            kept = opt.fail_open;
            break;
        }
      }
    }
    if (kept) {
      if (p.keep != p.next) events[p.keep] = std::move(events[p.next]);
      ++p.keep;
    } else {
      ++chunk->dropped;
    }
  }
  events.resize(p.keep);
  const std::pair<const char*, int64_t> counters[] = {{"script_changed", p.changed},
                                                      {"script_dropped", p.script_dropped},
                                                      {"script_errors", p.errors},
                                                      {"script_retries", p.retries}};
  for (const auto& [name, value] : counters) {
    if (value != 0) chunk->counters.emplace_back(name, value);
  }
  if (p.resumed) {
    done(Status::OK());
    return true;
  }
  return false;
}

}  // namespace atfill::stages
