// String patterns: matches that may run long run in a private Lua state the watchdog can interrupt
// (PatternGuard, OnPatternSignal); short ones run directly; gmatch, gsub and string.rep.
#include "stages/script/lua_worker.hpp"

namespace atfill::stages::lua {

namespace {

// Trivial and zero-initialised: no TLS wrapper, so the handler may touch it.
thread_local PatternGuard t_pattern_guard;

}  // namespace

[[noreturn]] void JumpOutOfPatternState() {
  PatternGuard& g = t_pattern_guard;
  sigjmp_buf* jump = g.jump;
  g.jump = nullptr;
  g.pending = 0;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  siglongjmp(*jump, 1);
}

extern "C" void OnPatternSignal(int /*sig*/) {
  PatternGuard& g = t_pattern_guard;
  if (g.jump == nullptr) return;  // late: the call already left the pattern state
  if (g.in_malloc != 0) {
    g.pending = 1;
    return;
  }
  JumpOutOfPatternState();
}

void InstallPatternSignal() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_handler = OnPatternSignal;
    sigemptyset(&action.sa_mask);
    // SA_NODEFER: the handler leaves by siglongjmp without restoring the mask (that would cost a
    // system call on every pattern call), so the signal must not be blocked while it runs.
    action.sa_flags = SA_RESTART | SA_NODEFER;
    sigaction(kPatternSignal, &action, nullptr);
  });
}

void* PatternAllocUnguarded(PatternHeap* h, void* ptr, size_t osize, size_t nsize) {
  using Block = PatternHeap::Block;
  const size_t old = ptr == nullptr ? 0 : osize;
  Block* b = ptr == nullptr ? nullptr : static_cast<Block*>(ptr) - 1;
  if (nsize == 0) {
    if (b != nullptr) {
      PatternHeap::Unlink(b);
      std::free(b);
      h->used -= old;
    }
    return nullptr;
  }
  if (nsize > old && nsize - old > h->limit - h->used) return nullptr;
  if (b != nullptr) PatternHeap::Unlink(b);
  auto* moved = static_cast<Block*>(std::realloc(b, sizeof(Block) + nsize));
  if (moved == nullptr) {
    if (b != nullptr) h->Link(b);
    return nullptr;
  }
  h->Link(moved);
  h->used = h->used - old + nsize;
  return moved + 1;
}

void* PatternAlloc(void* ud, void* ptr, size_t osize, size_t nsize) {
  PatternGuard& g = t_pattern_guard;
  g.in_malloc = 1;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  void* p = PatternAllocUnguarded(static_cast<PatternHeap*>(ud), ptr, osize, nsize);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  g.in_malloc = 0;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  if (g.pending != 0 && g.jump != nullptr) JumpOutOfPatternState();
  return p;
}

bool SmallMatch(size_t n, const char* p, size_t plen, bool plain, bool anchorable) {
  const double positions = static_cast<double>(n) + 1;
  int q = 0;
  bool specials = false;
  for (size_t i = 0; i < plen; ++i) {
    switch (p[i]) {
      case '*':
      case '+':
      case '-':
      case '?':
        ++q;
        specials = true;
        break;
      case '%':
        specials = true;
        if (i + 1 < plen && (p[i + 1] == 'b' || (p[i + 1] >= '0' && p[i + 1] <= '9'))) ++q;
        break;
      case '^':
      case '$':
      case '.':
      case '[':
      case ']':
      case '(':
      case ')':
        specials = true;
        break;
      default:
        break;
    }
  }
  double steps = static_cast<double>(plen) + 1;
  if (plain || !specials) return steps * positions <= kDirectMatchSteps;
  // The matcher's own recursion limit must stay out of reach too ("pattern too complex").
  if (q > 64) return false;
  const int powers = q + (anchorable && plen > 0 && p[0] == '^' ? 1 : 2);
  for (int k = 0; k < powers; ++k) {
    steps *= positions;
    if (steps > kDirectMatchSteps) return false;
  }
  return true;
}

PatternCall FindFrom(const char* s, size_t len, const char* p, size_t plen, lua_Integer init) {
  PatternCall call;
  call.op = PatternOp::kFind;
  call.subject = s;
  call.subject_size = len;
  call.pattern = p;
  call.pattern_size = plen;
  call.init = init;
  return call;
}

lua_Integer StartPosition(lua_Integer pos, size_t len) {
  if (pos > 0) return pos;
  if (pos == 0) return 1;
  if (pos < -static_cast<lua_Integer>(len)) return 1;
  return static_cast<lua_Integer>(len) + pos + 1;
}

// ---- pattern matching --------------------------------------------------------------------------

int LuaWorker::OpenPatternLibrary(lua_State* P) {
  LuaWorker* self = Self(P);
  luaL_requiref(P, LUA_STRLIBNAME, luaopen_string, 0);
  const int lib = lua_gettop(P);
  for (int i = 0; i < 3; ++i) {
    lua_getfield(P, lib, kPatternOpNames[i]);
    self->p_fn_refs_[i] = luaL_ref(P, LUA_REGISTRYINDEX);
  }
  for (CachedString& cached : self->cache_) {
    lua_pushboolean(P, 0);
    cached.p_ref = luaL_ref(P, LUA_REGISTRYINDEX);
  }
  return 0;
}

bool LuaWorker::OpenPatternState() {
  p_heap_.limit = program_->options.memory_limit_bytes;
  P_ = lua_newstate(PatternAlloc, &p_heap_);
  if (P_ == nullptr) {
    p_heap_.FreeAll();
    return false;
  }
  *static_cast<LuaWorker**>(lua_getextraspace(P_)) = this;
  lua_pushcfunction(P_, OpenPatternLibrary);
  if (lua_pcall(P_, 0, 0, 0) != LUA_OK) {
    DiscardPatternState();
    return false;
  }
  return true;
}

void LuaWorker::DiscardPatternState() {
  // Not lua_close: after an interruption the state may be half-way through anything. Its memory
  // is all on the heap's list, and nothing outside it points in (no finalizers, no userdata).
  P_ = nullptr;
  p_heap_.FreeAll();
  for (CachedString& cached : cache_) {
    cached.data = nullptr;
    cached.size = 0;
  }
}

int LuaWorker::PatternTrampoline(lua_State* P) {
  auto* call = static_cast<PatternCall*>(lua_touserdata(P, 1));
  LuaWorker* self = Self(P);
  lua_settop(P, 0);
  lua_rawgeti(P, LUA_REGISTRYINDEX, self->p_fn_refs_[static_cast<int>(call->op)]);
  const char* texts[2] = {call->subject, call->pattern};
  const size_t sizes[2] = {call->subject_size, call->pattern_size};
  for (int k = 0; k < 2; ++k) {
    if (call->cached[k]) {
      lua_rawgeti(P, LUA_REGISTRYINDEX, self->cache_[k].p_ref);
    } else {
      lua_pushlstring(P, texts[k], sizes[k]);
      lua_pushvalue(P, -1);
      lua_rawseti(P, LUA_REGISTRYINDEX, self->cache_[k].p_ref);
      call->stored[k] = true;
    }
  }
  int args = 3;
  switch (call->op) {
    case PatternOp::kFind:
      lua_pushinteger(P, call->init);
      lua_pushboolean(P, call->plain ? 1 : 0);
      args = 4;
      break;
    case PatternOp::kMatch:
      lua_pushinteger(P, call->init);
      args = 3;
      break;
    case PatternOp::kGsub:
      lua_pushlstring(P, call->repl, call->repl_size);
      lua_pushinteger(P, call->max_n);
      args = 4;
      break;
  }
  lua_call(P, args, LUA_MULTRET);
  return lua_gettop(P);
}

int LuaWorker::RunPattern(lua_State* L, int subject, int pattern, PatternCall* call) {
  if (P_ == nullptr && !OpenPatternState()) {
    return luaL_error(L, "%s: not enough memory for the pattern state", ScriptName());
  }
  call->cached[0] = cache_[0].data == call->subject && cache_[0].size == call->subject_size;
  call->cached[1] = cache_[1].data == call->pattern && cache_[1].size == call->pattern_size;
  lua_settop(P_, 0);
  lua_pushcfunction(P_, PatternTrampoline);
  lua_pushlightuserdata(P_, call);
  PatternGuard& guard = t_pattern_guard;
  sigjmp_buf jump;
  if (sigsetjmp(jump, 0) != 0) {
    // The watchdog's signal: the pattern state is abandoned as it is.
    slot_.deadline_ns.store(0, std::memory_order_relaxed);
    DiscardPatternState();
    RaiseTimeout(L, kPatternFunctionNames[static_cast<int>(call->op)]);
  }
  slot_.thread.store(pthread_self(), std::memory_order_relaxed);
  slot_.deadline_ns.store(deadline_ns_, std::memory_order_release);
  guard.jump = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const int rc = lua_pcall(P_, 1, LUA_MULTRET, 0);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  guard.jump = nullptr;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  guard.pending = 0;
  slot_.deadline_ns.store(0, std::memory_order_relaxed);
  const int indexes[2] = {subject, pattern};
  for (int k = 0; k < 2; ++k) {
    if (!call->stored[k]) continue;
    cache_[k].data = k == 0 ? call->subject : call->pattern;
    cache_[k].size = k == 0 ? call->subject_size : call->pattern_size;
    lua_pushvalue(L, indexes[k]);
    lua_rawseti(L, LUA_REGISTRYINDEX, cache_[k].m_ref);
  }
  if (rc == LUA_OK) return lua_gettop(P_);
  if (rc == LUA_ERRMEM) {
    lua_settop(P_, 0);
    return luaL_error(L, "not enough memory in string.%s (the script's memory limit is %I bytes)",
                      kPatternOpNames[static_cast<int>(call->op)],
                      static_cast<lua_Integer>(p_heap_.limit));
  }
  // The pattern library's own errors ("malformed pattern ..."), as they would read in L: there
  // they carry the position of the caller, which the pattern state does not know.
  size_t n = 0;
  const char* message = lua_tolstring(P_, -1, &n);
  if (message == nullptr) {
    lua_settop(P_, 0);
    return luaL_error(L, "string.%s failed", kPatternOpNames[static_cast<int>(call->op)]);
  }
  luaL_where(L, 1);
  lua_pushlstring(L, message, n);
  lua_settop(P_, 0);
  lua_concat(L, 2);
  return lua_error(L);
}

int LuaWorker::PushPatternResults(lua_State* L, int first, int last) {
  const int count = last - first + 1;
  if (count > 0) luaL_checkstack(L, count, "too many captures");
  for (int i = first; i <= last; ++i) {
    switch (lua_type(P_, i)) {
      case LUA_TNUMBER:
        lua_pushinteger(L, lua_tointeger(P_, i));
        break;
      case LUA_TSTRING: {
        size_t n = 0;
        const char* s = lua_tolstring(P_, i, &n);
        lua_pushlstring(L, s, n);
        break;
      }
      default:
        lua_pushnil(L);
        break;
    }
  }
  lua_settop(P_, 0);
  return std::max(count, 0);
}

int LuaWorker::FindOrMatch(lua_State* L, PatternOp op) {
  LuaWorker* self = Self(L);
  PatternCall call;
  call.op = op;
  call.subject = luaL_checklstring(L, 1, &call.subject_size);
  call.pattern = luaL_checklstring(L, 2, &call.pattern_size);
  call.init = luaL_optinteger(L, 3, 1);
  call.plain = op == PatternOp::kFind && lua_toboolean(L, 4) != 0;
  if (SmallMatch(call.subject_size, call.pattern, call.pattern_size, call.plain, true)) {
    return self->CallLibrary(L, kPatternFunctionNames[static_cast<int>(op)], false);
  }
  const int n = self->RunPattern(L, 1, 2, &call);
  return self->PushPatternResults(L, 1, n);
}

int LuaWorker::CallLibrary(lua_State* L, const char* what, bool has_replacement) {
  const int args = lua_gettop(L);
  // A copy of gsub's replacement closure at the bottom, to look at once the call failed.
  if (has_replacement) {
    lua_pushvalue(L, 3);
    lua_insert(L, 1);
  }
  const int base = has_replacement ? 1 : 0;
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, base + 1);
  const int rc = lua_pcall(L, args, LUA_MULTRET, 0);
  if (rc == LUA_OK) return lua_gettop(L) - base;
  if (has_replacement) {
    lua_getupvalue(L, 1, 3);
    const bool replacement_failed = lua_toboolean(L, -1) != 0;
    lua_pop(L, 1);
    if (replacement_failed) {
      // The script's replacement raised it: as it was.
      lua_getupvalue(L, 1, 2);
      return lua_error(L);
    }
  }
  if (rc == LUA_ERRMEM) {
    if (alloc_.timed_out) RaiseTimeout(L, what);
    return luaL_error(L, "not enough memory in %s (the script's memory limit is %I bytes)", what,
                      static_cast<lua_Integer>(alloc_.limit));
  }
  if (lua_type(L, -1) != LUA_TSTRING) return lua_error(L);
  // The pattern library's messages carry their caller's position, here this wrapper's (none).
  luaL_where(L, 1);
  lua_insert(L, -2);
  lua_concat(L, 2);
  return lua_error(L);
}

// The library's gsub calls this for each match on the direct path; upvalues: the script's
// replacement (function or table), then the error it raised and whether it did.
int LuaWorker::GsubReplace(lua_State* L) {
  const int args = lua_gettop(L);
  int rc = LUA_OK;
  if (lua_type(L, lua_upvalueindex(1)) == LUA_TTABLE) {
    // A table is indexed by the first capture (or the whole match), as the library does.
    lua_settop(L, 1);
    lua_pushcfunction(L, IndexFirst);
    lua_insert(L, 1);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 2);
    rc = lua_pcall(L, 2, 1, 0);
  } else {
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    rc = lua_pcall(L, args, 1, 0);
  }
  if (rc == LUA_OK) return 1;
  lua_pushvalue(L, -1);
  lua_replace(L, lua_upvalueindex(2));
  lua_pushboolean(L, 1);
  lua_replace(L, lua_upvalueindex(3));
  return lua_error(L);
}

int LuaWorker::IndexFirst(lua_State* L) {
  lua_gettable(L, 1);
  return 1;
}

int LuaWorker::StringFind(lua_State* L) { return FindOrMatch(L, PatternOp::kFind); }
int LuaWorker::StringMatch(lua_State* L) { return FindOrMatch(L, PatternOp::kMatch); }

// gmatch over find: the iterator keeps the subject, the pattern, where to look next and where the
// last match ended (a match may not be empty there, as in the string library).
int LuaWorker::StringGmatch(lua_State* L) {
  size_t len = 0;
  size_t plen = 0;
  luaL_checklstring(L, 1, &len);
  const char* p = luaL_checklstring(L, 2, &plen);
  const lua_Integer init_arg = luaL_optinteger(L, 3, 1);
  if (SmallMatch(len, p, plen, false, false)) {
    // The whole iteration is within the bound: the library's own iterator.
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
  }
  lua_Integer init = StartPosition(init_arg, len);
  if (init > static_cast<lua_Integer>(len) + 1) init = static_cast<lua_Integer>(len) + 1;
  lua_settop(L, 2);
  if (plen > 0 && p[0] == '^') {
    // In gmatch a leading '^' is no anchor but the character; find needs it escaped.
    lua_pushliteral(L, "%");
    lua_pushvalue(L, 2);
    lua_concat(L, 2);
    lua_replace(L, 2);
  }
  lua_pushinteger(L, init - 1);  // where to look next, from 0
  lua_pushinteger(L, -1);        // where the last match ended: none yet
  lua_pushcclosure(L, GmatchStep, 4);
  return 1;
}

int LuaWorker::GmatchStep(lua_State* L) {
  LuaWorker* self = Self(L);
  size_t len = 0;
  size_t plen = 0;
  const char* s = lua_tolstring(L, lua_upvalueindex(1), &len);
  const char* p = lua_tolstring(L, lua_upvalueindex(2), &plen);
  lua_Integer pos = lua_tointeger(L, lua_upvalueindex(3));
  const lua_Integer last = lua_tointeger(L, lua_upvalueindex(4));
  while (pos <= static_cast<lua_Integer>(len)) {
    PatternCall call = FindFrom(s, len, p, plen, pos + 1);
    const int n = self->RunPattern(L, lua_upvalueindex(1), lua_upvalueindex(2), &call);
    if (n < 2 || lua_type(self->P_, 1) != LUA_TNUMBER) break;
    const lua_Integer start = lua_tointeger(self->P_, 1) - 1;
    const lua_Integer end = lua_tointeger(self->P_, 2);
    if (end == last) {
      // Empty, where the last match ended: not a match; look from the next character.
      lua_settop(self->P_, 0);
      pos = start + 1;
      continue;
    }
    lua_pushinteger(L, end);
    lua_replace(L, lua_upvalueindex(3));
    lua_pushinteger(L, end);
    lua_replace(L, lua_upvalueindex(4));
    if (n == 2) {
      lua_settop(self->P_, 0);
      lua_pushlstring(L, s + start, static_cast<size_t>(end - start));
      return 1;
    }
    return self->PushPatternResults(L, 3, n);
  }
  if (self->P_ != nullptr) lua_settop(self->P_, 0);
  lua_pushinteger(L, static_cast<lua_Integer>(len) + 1);
  lua_replace(L, lua_upvalueindex(3));
  return 0;
}

// gsub: a replacement string runs whole in the pattern state; a function or table replacement
// runs Lua code, which must not run inside the pattern state, so the matches are found there one
// find at a time and replaced here.
int LuaWorker::StringGsub(lua_State* L) {
  LuaWorker* self = Self(L);
  size_t len = 0;
  size_t plen = 0;
  const char* s = luaL_checklstring(L, 1, &len);
  const char* p = luaL_checklstring(L, 2, &plen);
  const int tr = lua_type(L, 3);
  const lua_Integer max_n = luaL_optinteger(L, 4, static_cast<lua_Integer>(len) + 1);
  luaL_argexpected(
      L, tr == LUA_TNUMBER || tr == LUA_TSTRING || tr == LUA_TFUNCTION || tr == LUA_TTABLE, 3,
      "string/function/table");
  if (SmallMatch(len, p, plen, false, true)) {
    const bool replacement = tr == LUA_TFUNCTION || tr == LUA_TTABLE;
    if (replacement) {
      lua_pushvalue(L, 3);
      lua_pushnil(L);
      lua_pushboolean(L, 0);
      lua_pushcclosure(L, GsubReplace, 3);
      lua_replace(L, 3);
    }
    return self->CallLibrary(L, "string.gsub", replacement);
  }
  if (tr == LUA_TNUMBER || tr == LUA_TSTRING) {
    PatternCall call;
    call.op = PatternOp::kGsub;
    call.subject = s;
    call.subject_size = len;
    call.pattern = p;
    call.pattern_size = plen;
    call.repl = lua_tolstring(L, 3, &call.repl_size);
    call.max_n = max_n;
    const int n = self->RunPattern(L, 1, 2, &call);
    return self->PushPatternResults(L, 1, n);
  }
  const bool anchor = plen > 0 && p[0] == '^';
  lua_settop(L, 3);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_Integer pos = 0;     // where to look next, from 0
  lua_Integer copied = 0;  // the subject is in the buffer up to here
  lua_Integer last = -1;   // where the last match ended
  lua_Integer count = 0;
  while (count < max_n) {
    PatternCall call = FindFrom(s, len, p, plen, pos + 1);
    const int n = self->RunPattern(L, 1, 2, &call);
    if (n < 2 || lua_type(self->P_, 1) != LUA_TNUMBER) {
      lua_settop(self->P_, 0);
      break;
    }
    const lua_Integer start = lua_tointeger(self->P_, 1) - 1;
    const lua_Integer end = lua_tointeger(self->P_, 2);
    if (end == last) {
      // Empty, where the last match ended: not a match.
      lua_settop(self->P_, 0);
      if (anchor || start >= static_cast<lua_Integer>(len)) break;
      pos = start + 1;
      continue;
    }
    ++count;
    luaL_addlstring(&b, s + copied, static_cast<size_t>(start - copied));
    // The replacement's arguments: the captures, or the whole match when there are none.
    lua_pushvalue(L, 3);
    int args = 1;
    if (n == 2) {
      lua_settop(self->P_, 0);
      lua_pushlstring(L, s + start, static_cast<size_t>(end - start));
    } else {
      args = self->PushPatternResults(L, 3, n);
    }
    if (tr == LUA_TFUNCTION) {
      lua_call(L, args, 1);
    } else {
      // A table is indexed by the first capture (or the whole match).
      lua_pop(L, args - 1);
      lua_gettable(L, -2);
      lua_remove(L, -2);
    }
    if (!lua_toboolean(L, -1)) {
      lua_pop(L, 1);
      luaL_addlstring(&b, s + start, static_cast<size_t>(end - start));
    } else if (!lua_isstring(L, -1)) {
      return luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
    } else {
      luaL_addvalue(&b);
    }
    copied = pos = last = end;
    if (anchor) break;
  }
  luaL_addlstring(&b, s + copied, len - static_cast<size_t>(copied));
  luaL_pushresult(&b);
  lua_pushinteger(L, count);
  return 2;
}

// string.rep(s, n [, sep]) filled by doubling copies: the library's own loop copies s once per
// repetition (a million memcpy calls for string.rep("x", 1e6)) and spins on empty strings.
int LuaWorker::StringRep(lua_State* L) {
  size_t l = 0;
  size_t lsep = 0;
  const char* s = luaL_checklstring(L, 1, &l);
  const lua_Integer n = luaL_checkinteger(L, 2);
  const char* sep = luaL_optlstring(L, 3, "", &lsep);
  if (n <= 0 || (l == 0 && lsep == 0)) {
    lua_pushliteral(L, "");
    return 1;
  }
  // n copies of s and n - 1 of sep: n units of s+sep, less one sep. The library's bound on the
  // result: INT_MAX bytes.
  constexpr size_t kMaxSize = static_cast<size_t>(INT_MAX);
  const size_t unit = l + lsep;
  if (unit < l || unit > kMaxSize / static_cast<uint64_t>(n)) {
    return luaL_error(L, "resulting string too large");
  }
  const size_t total = static_cast<size_t>(n) * unit - lsep;
  luaL_Buffer b;
  char* out = luaL_buffinitsize(L, &b, total);
  std::memcpy(out, s, l);
  size_t filled = l;
  if (filled < total) {
    std::memcpy(out + filled, sep, lsep);
    filled += lsep;
  }
  // The text is periodic (period s+sep): its first part copied onto the next, doubling.
  while (filled < total) {
    const size_t chunk = std::min(filled, total - filled);
    std::memcpy(out + filled, out, chunk);
    filled += chunk;
  }
  luaL_pushresultsize(&b, total);
  return 1;
}

}  // namespace atfill::stages::lua
