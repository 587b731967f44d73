// The Lua state: its sandboxed libraries, the script loaded, the memory cap (LimitedAlloc) and the
// instruction budget and call deadline (LimitHook).
#include "stages/script/lua_worker.hpp"

namespace atfill::stages::lua {

void* LimitedAlloc(void* ud, void* ptr, size_t osize, size_t nsize) {
  auto* a = static_cast<Allocator*>(ud);
  // With ptr == nullptr, osize is the kind of object being made, not a size.
  const size_t old = ptr == nullptr ? 0 : osize;
  if (nsize == 0) {
    std::free(ptr);
    a->used -= old;
    return nullptr;
  }
  if (nsize > old) {
    if (nsize - old > a->limit - a->used || a->timed_out) return nullptr;
    if (a->deadline_ns != 0 && (nsize >= kTimedAllocBytes || ++a->since_check >= kAllocsPerCheck)) {
      a->since_check = 0;
      if (SteadyNanos() > a->deadline_ns) {
        a->timed_out = true;
        return nullptr;
      }
    }
  }
  void* p = std::realloc(ptr, nsize);
  if (p == nullptr) return nullptr;
  a->used = a->used - old + nsize;
  return p;
}

// ---- setup -------------------------------------------------------------------------------------

Status LuaWorker::Init() {
  const ScriptOptions& opt = program_->options;
  budget_ = static_cast<int>(opt.instruction_budget);
  timeout_ms_ = opt.call_timeout.count();
  timeout_ns_ = timeout_ms_ * 1'000'000;
  alloc_.limit = opt.memory_limit_bytes;
  L_ = lua_newstate(LimitedAlloc, &alloc_);
  if (L_ == nullptr) {
    init_status_ = Status::ResourceExhausted("cannot create a Lua state within memory_limit_bytes");
    return init_status_;
  }
  *static_cast<LuaWorker**>(lua_getextraspace(L_)) = this;
  record_refs_.assign(program_->scripts.size(), LUA_NOREF);
  keys_.reserve(64);
  path_.reserve(32);
  dom_entries_.reserve(64);

  lua_pushcfunction(L_, OpenSandbox);
  int rc = lua_pcall(L_, 0, 0, 0);
  if (rc != LUA_OK) {
    init_status_ = Status::ResourceExhausted("cannot set up the Lua sandbox: " + StatusMessage(rc));
    lua_settop(L_, 0);
    return init_status_;
  }
  for (size_t i = 0; i < program_->scripts.size(); ++i) {
    const auto& script = program_->scripts[i];
    loading_ = i;
    script_ = i;
    StartLimits();
    lua_pushcfunction(L_, LoadScript);
    rc = lua_pcall(L_, 0, 0, 0);
    const bool timed_out = limit_hit_ == Limit::kTime || alloc_.timed_out;
    if (rc == LUA_OK && !timed_out) continue;
    const std::string message = rc == LUA_OK ? TimeoutMessage() : StatusMessage(rc);
    alloc_.deadline_ns = 0;
    alloc_.timed_out = false;
    lua_settop(L_, 0);
    const std::string what = "script for " + script.collection + " (" + script.origin + ")";
    switch (load_phase_) {
      case LoadPhase::kCompile:
        init_status_ = Status::Invalid(what + " does not compile: " + message);
        break;
      case LoadPhase::kRun:
        init_status_ = Status::Invalid(what + " failed while loading: " + message);
        break;
      case LoadPhase::kNoRecord:
        init_status_ = Status::Invalid(what + " does not define a global function record(event)");
        break;
    }
    return init_status_;
  }
  lua_settop(L_, 0);
  alloc_.deadline_ns = 0;
  // Calls leave short-lived garbage (event strings, decoded records): the generational
  // collector handles that with less work than the incremental one.
  lua_gc(L_, LUA_GCGEN, 0, 0);
  return init_status_;
}

int LuaWorker::OpenSandbox(lua_State* L) {
  LuaWorker* self = Self(L);
  luaL_requiref(L, LUA_GNAME, luaopen_base, 1);
  luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 1);
  luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 1);
  luaL_requiref(L, LUA_MATHLIBNAME, luaopen_math, 1);
  luaL_requiref(L, LUA_UTF8LIBNAME, luaopen_utf8, 1);
  lua_settop(L, 0);
  lua_pushglobaltable(L);
  const int g = lua_gettop(L);

  // Functions that would reach files, compile code or steer the collector: stubs that say so.
  for (const char* name :
       {"dofile", "loadfile", "load", "loadstring", "require", "collectgarbage", "module"}) {
    lua_pushstring(L, name);
    lua_pushcclosure(L, Refuse, 1);
    lua_setfield(L, g, name);
  }
  lua_getfield(L, g, "string");
  lua_pushliteral(L, "string.dump");
  lua_pushcclosure(L, Refuse, 1);
  lua_setfield(L, -2, "dump");
  // Pattern matching in the pattern state, under the deadline; string.rep without a loop per copy.
  const std::pair<const char*, lua_CFunction> string_functions[] = {{"find", StringFind},
                                                                    {"match", StringMatch},
                                                                    {"gmatch", StringGmatch},
                                                                    {"gsub", StringGsub},
                                                                    {"rep", StringRep}};
  for (const auto& [name, fn] : string_functions) {
    // The library's function is upvalue 1 (the direct path for small matches).
    lua_getfield(L, -1, name);
    lua_pushcclosure(L, fn, 1);
    lua_setfield(L, -2, name);
  }
  lua_pop(L, 1);
  // The table functions whose loops can run without end (see TableMove).
  lua_getfield(L, g, "table");
  const std::pair<const char*, lua_CFunction> table_functions[] = {
      {"move", TableMove}, {"insert", TableInsert}, {"remove", TableRemove}};
  for (const auto& [name, fn] : table_functions) {
    lua_pushcfunction(L, fn);
    lua_setfield(L, -2, name);
  }
  lua_pop(L, 1);
  for (CachedString& cached : self->cache_) {
    lua_pushboolean(L, 0);
    cached.m_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  // Libraries not loaded: tables whose every field raises an error naming the library.
  for (const char* name : {"io", "os", "package", "debug", "coroutine"}) {
    lua_newtable(L);
    lua_createtable(L, 0, 3);
    lua_pushstring(L, name);
    lua_pushcclosure(L, RefuseLibrary, 1);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "__index");
    lua_setfield(L, -2, "__newindex");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, -2);
    lua_setfield(L, g, name);
  }
  lua_pushcfunction(L, Silent);
  lua_setfield(L, g, "print");
  lua_pushcfunction(L, Silent);
  lua_setfield(L, g, "warn");
  lua_pushcfunction(L, SafeSetMetatable);
  lua_setfield(L, g, "setmetatable");

  // Decoded JSON arrays carry this metatable so they encode as arrays even when empty.
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "atfill.array");
  lua_setfield(L, -2, "__name");
  self->array_mt_ref_ = luaL_ref(L, LUA_REGISTRYINDEX);

  lua_createtable(L, 0, 6);
  lua_pushcfunction(L, GetRecord);
  lua_setfield(L, -2, "get_record");
  lua_pushcfunction(L, JsonDecode);
  lua_setfield(L, -2, "json_decode");
  lua_pushcfunction(L, JsonEncode);
  lua_setfield(L, -2, "json_encode");
  lua_pushcfunction(L, MakeArray);
  lua_setfield(L, -2, "array");
  lua_pushlightuserdata(L, nullptr);
  lua_setfield(L, -2, "null");
  lua_setfield(L, g, "atfill");

  // Each script's globals live in its own table, reading through to the shared ones.
  lua_createtable(L, 0, 1);
  lua_pushvalue(L, g);
  lua_setfield(L, -2, "__index");
  self->env_mt_ref_ = luaL_ref(L, LUA_REGISTRYINDEX);

  // The event: an empty proxy whose reads go to `fields` and whose writes are checked. Both
  // tables are reused for every call of this state; `fields` never reaches the script. Its
  // entries are made on first read (FieldsIndex), so a call pays only for the fields it reads.
  lua_createtable(L, 0, 10);  // fields
  const int fields = lua_gettop(L);
  lua_newtable(L);  // proxy
  const int proxy = lua_gettop(L);
  // Pushes `fn` as a closure over the event machinery (the RunUpvalue layout).
  const auto push_closure = [&](lua_CFunction fn) {
    lua_pushvalue(L, fields);
    lua_pushvalue(L, proxy);
    for (const char* name : kRunStrings) lua_pushstring(L, name);
    lua_pushcclosure(L, fn, kUpCount);
  };
  lua_createtable(L, 0, 2);
  push_closure(FieldsIndex);
  lua_setfield(L, -2, "__index");
  lua_pushliteral(L, "atfill event");
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, fields);
  lua_createtable(L, 0, 4);
  lua_pushvalue(L, fields);
  lua_setfield(L, -2, "__index");
  push_closure(EventNewIndex);
  lua_setfield(L, -2, "__newindex");
  push_closure(EventPairs);
  lua_setfield(L, -2, "__pairs");
  lua_pushliteral(L, "atfill event");
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, proxy);
  lua_pushvalue(L, fields);
  self->fields_ref_ = luaL_ref(L, LUA_REGISTRYINDEX);
  push_closure(RunRecord);
  self->run_ref_ = luaL_ref(L, LUA_REGISTRYINDEX);
  return 0;
}

int LuaWorker::LoadScript(lua_State* L) {
  LuaWorker* self = Self(L);
  const auto& script = self->program_->scripts[self->loading_];
  self->load_phase_ = LoadPhase::kCompile;
  // Mode "t": a precompiled (binary) chunk is refused.
  if (luaL_loadbufferx(L, script.text.data(), script.text.size(), script.chunk_name.c_str(), "t") !=
      LUA_OK) {
    return lua_error(L);
  }
  const int chunk = lua_gettop(L);
  lua_createtable(L, 0, 4);
  const int env = lua_gettop(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, self->env_mt_ref_);
  lua_setmetatable(L, env);
  lua_pushvalue(L, env);
  // A main chunk's only upvalue is _ENV.
  lua_setupvalue(L, chunk, 1);
  self->load_phase_ = LoadPhase::kRun;
  lua_pushvalue(L, chunk);
  lua_call(L, 0, 0);
  self->load_phase_ = LoadPhase::kNoRecord;
  lua_pushliteral(L, "record");
  lua_rawget(L, env);
  if (lua_type(L, -1) != LUA_TFUNCTION) {
    lua_pushliteral(L, "no function record");
    return lua_error(L);
  }
  self->record_refs_[self->loading_] = luaL_ref(L, LUA_REGISTRYINDEX);
  return 0;
}

std::string LuaWorker::StatusMessage(int rc) {
  std::string message;
  if (lua_type(L_, -1) == LUA_TSTRING) {
    size_t n = 0;
    const char* s = lua_tolstring(L_, -1, &n);
    message.assign(s, n);
  } else {
    // Not converted: that could run the script's __tostring or allocate outside protection.
    message = std::string("(error object is a ") + luaL_typename(L_, -1) + " value)";
  }
  if (rc == LUA_ERRMEM && alloc_.timed_out) return TimeoutMessage();
  if (rc == LUA_ERRMEM) {
    // Lua's message carries no position; name the script at least.
    if (script_ < program_->scripts.size()) message = std::string(ScriptName()) + ": " + message;
    message += " (the script's memory limit is " + std::to_string(alloc_.limit) + " bytes)";
  }
  return message;
}

// For a deadline seen where no position is known (an allocation, or a script that caught the
// error and returned).
std::string LuaWorker::TimeoutMessage() const {
  std::string message = script_ < program_->scripts.size() ? ScriptName() : "script";
  return message + ": script exceeded its wall-clock limit (" + std::to_string(timeout_ms_) +
         " ms)";
}

void LuaWorker::StartLimits() {
  deadline_ns_ = SteadyNanos() + timeout_ns_;
  alloc_.deadline_ns = deadline_ns_;
  alloc_.timed_out = false;
  alloc_.since_check = 0;
  limit_hit_ = Limit::kNone;
  instructions_left_ = budget_;
  hook_count_ = std::min(budget_, kHookPeriod);
  // Setting the hook also restarts its count.
  lua_sethook(L_, LimitHook, LUA_MASKCOUNT, hook_count_);
}

// ---- the sandbox's functions -------------------------------------------------------------------

// Runs every kHookPeriod instructions (the last period cut to end exactly at the budget): counts
// the budget down and looks at the clock.
void LuaWorker::LimitHook(lua_State* L, lua_Debug* ar) {
  LuaWorker* self = Self(L);
  if (self->limit_hit_ == Limit::kNone) {
    self->instructions_left_ -= self->hook_count_;
    if (self->instructions_left_ <= 0) {
      self->limit_hit_ = Limit::kBudget;
    } else if (SteadyNanos() > self->deadline_ns_) {
      self->limit_hit_ = Limit::kTime;
    } else {
      if (self->instructions_left_ < self->hook_count_) {
        self->hook_count_ = static_cast<int>(self->instructions_left_);
        lua_sethook(L, LimitHook, LUA_MASKCOUNT, self->hook_count_);
      }
      return;
    }
    // From now on every instruction raises again, so a script's pcall cannot swallow the error
    // and carry on.
    lua_sethook(L, LimitHook, LUA_MASKCOUNT, 1);
  }
  lua_getinfo(L, "Sl", ar);
  if (self->limit_hit_ == Limit::kBudget) {
    lua_pushfstring(L, "%s:%d: script exceeded its instruction budget (%I instructions)",
                    ar->short_src, ar->currentline, static_cast<lua_Integer>(self->budget_));
  } else {
    lua_pushfstring(L, "%s:%d: script exceeded its wall-clock limit (%I ms)", ar->short_src,
                    ar->currentline, static_cast<lua_Integer>(self->timeout_ms_));
  }
  lua_error(L);
}

void LuaWorker::RaiseTimeout(lua_State* L, const char* what) {
  limit_hit_ = Limit::kTime;
  lua_sethook(L, LimitHook, LUA_MASKCOUNT, 1);
  PushWhere(L);
  lua_pushfstring(L, "script exceeded its wall-clock limit (%I ms) in %s",
                  static_cast<lua_Integer>(timeout_ms_), what);
  lua_concat(L, 2);
  lua_error(L);
  std::abort();  // lua_error does not return
}

// "chunk:line: " of the Lua code that called the running C function, as luaL_error writes it; the
// script's name when a C function called it (pcall(string.find, ...)).
void LuaWorker::PushWhere(lua_State* L) {
  luaL_where(L, 1);
  if (lua_rawlen(L, -1) == 0) {
    lua_pop(L, 1);
    lua_pushfstring(L, "%s: ", ScriptName());
  }
}

}  // namespace atfill::stages::lua
