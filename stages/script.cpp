#include "stages/script.hpp"

#include <pthread.h>
#include <simdjson.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <csetjmp>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <lua.hpp>

#include "atproto/syntax.hpp"
#include "base/json_writer.hpp"
#include "base/strings.hpp"
#include "pipeline/delay_queue.hpp"

// Lua reports errors with longjmp (the Debian library is built as C), which skips C++
// destructors. So every function Lua calls, and every stretch of C++ that calls a Lua function
// able to raise (anything that allocates), holds no object with a destructor on its stack: text
// goes through the worker's member buffers, and C++ calls that build strings (a CID's text, the
// record reader) finish in their own scope before Lua is called again.

namespace atfill::stages {
namespace {

// The clock of the call deadlines: the kernel's coarse monotonic clock, a few times cheaper to
// read than the precise one (every call reads it; script_bench BM_PassThrough), at a resolution
// of a few milliseconds.
int64_t SteadyNanos() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The signal that interrupts a pattern match past its deadline. SIGURG: ignored by default, so a
// stray one is harmless, and nothing else in atfill uses it.
constexpr int kPatternSignal = SIGURG;

// Interrupts pattern matches that run past their call's deadline. Each worker has a Slot; while
// its thread is inside a pattern call the slot holds the deadline, and every tick the watchdog
// signals the threads whose deadline has passed (again each tick, until they leave the call).
class PatternWatchdog {
 public:
  struct Slot {
    std::atomic<int64_t> deadline_ns{0};  // 0: not in a pattern call
    std::atomic<pthread_t> thread{};
  };

  explicit PatternWatchdog(std::chrono::nanoseconds tick) : tick_(tick) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~PatternWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  PatternWatchdog(const PatternWatchdog&) = delete;
  PatternWatchdog& operator=(const PatternWatchdog&) = delete;

  // Thread-safe. A removed slot is never signalled again (its thread may be gone afterwards).
  void Add(Slot* slot) {
    std::lock_guard<std::mutex> lock(mu_);
    slots_.push_back(slot);
  }
  void Remove(Slot* slot) {
    std::lock_guard<std::mutex> lock(mu_);
    slots_.erase(std::remove(slots_.begin(), slots_.end(), slot), slots_.end());
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, tick_, [this] { return done_; })) {
      const int64_t now = SteadyNanos();
      for (Slot* slot : slots_) {
        const int64_t deadline = slot->deadline_ns.load(std::memory_order_acquire);
        if (deadline != 0 && now > deadline) {
          pthread_kill(slot->thread.load(std::memory_order_relaxed), kPatternSignal);
        }
      }
    }
  }

  const std::chrono::nanoseconds tick_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot*> slots_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace

// How far a chunk got, kept while it waits for a retry.
struct ScriptStage::Progress {
  size_t next = 0;                      // the event being run
  size_t keep = 0;                      // events kept so far, moved to the front
  int attempt = 1;                      // of the event being run
  std::chrono::microseconds wait{0};    // before its next retry
  std::chrono::microseconds waited{0};  // by this chunk so far
  int64_t changed = 0, script_dropped = 0, errors = 0, retries = 0;
  bool resumed = false;  // the chunk came back after a wait: it ends through `done`
};

struct ScriptStage::Program {
  struct Script {
    std::string collection;
    std::string origin;      // the file path, or "inline:<collection>"
    std::string chunk_name;  // "@" + origin: Lua then names it like a file in messages
    std::string text;
  };
  ScriptOptions options;
  std::vector<Script> scripts;
  // Transparent hashing: lookups by string_view without building a string.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, size_t, Hash, std::equal_to<>> index;
  std::shared_ptr<PatternWatchdog> watchdog;
  // Retry backoffs wait here, off the workers.
  std::unique_ptr<pipeline::DelayQueue> delays;
  // The chunks waiting for a retry, and where each goes on.
  mutable std::mutex progress_mu;
  mutable std::unordered_map<const pipeline::EventChunk*, Progress> progress;

  static constexpr size_t kNone = static_cast<size_t>(-1);
  size_t Find(std::string_view collection) const {
    auto it = index.find(collection);
    return it == index.end() ? kNone : it->second;
  }
};

namespace {

using pipeline::Operation;
using pipeline::RecordEvent;
namespace dom = simdjson::dom;

// JSON nesting the decoder accepts and the encoder writes (atproto allows 128, not counting
// $link and $bytes objects). The encoder's bound also stops tables that contain themselves.
constexpr size_t kMaxDepth = 256;
constexpr size_t kMinMemory = size_t{256} << 10;
constexpr const char* kEncodeRecord = "event.record";

// Instructions between two looks at the clock (the hook's period): tens of microseconds of Lua.
constexpr int kHookPeriod = 10000;
// Allocations at least this big always look at the clock; smaller ones every kAllocsPerCheck.
constexpr size_t kTimedAllocBytes = size_t{64} << 10;
constexpr uint32_t kAllocsPerCheck = 1024;

struct Allocator {
  size_t used = 0;
  size_t limit = 0;
  // The call's deadline (steady-clock ns), 0 outside calls. Once passed, timed_out stays set and
  // every growing allocation fails until the call ends.
  int64_t deadline_ns = 0;
  uint32_t since_check = 0;
  bool timed_out = false;
};

// lua_Alloc with a cap and the call's deadline: a request past either returns nullptr, which Lua
// turns into a "not enough memory" error (after an emergency collection; the message then says
// which it was). Shrinking never fails. The clock is read on large allocations, the ones a memory
// bomb makes, and now and then on small ones.
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

// ---- the pattern state's interruption -----------------------------------------------------------
//
// A pattern match (lstrlib's matcher) runs no VM instructions and allocates nothing while it
// backtracks, so neither the hook nor the allocator can stop it, and a thread cannot be stopped
// from outside. So the matches run in a private Lua state that holds nothing but the string
// library and copies of the strings, and that nothing else ever points into: when the watchdog's
// signal finds the thread inside that state, the handler jumps back to where the call entered it
// (siglongjmp), abandoning the state in whatever shape it was, and its memory is freed block by
// block from the allocator's own list, without asking Lua. The one place a jump must not land is
// the C library's malloc (its locks): the allocator marks itself and takes a pending jump on the
// way out. The script's own state is never interrupted, only told the call failed.

struct PatternGuard {
  sigjmp_buf* volatile jump;        // set while this thread is inside the pattern state
  volatile sig_atomic_t in_malloc;  // inside PatternAlloc: do not jump now
  volatile sig_atomic_t pending;    // the signal came during PatternAlloc
};
// Trivial and zero-initialised: no TLS wrapper, so the handler may touch it.
thread_local PatternGuard t_pattern_guard;

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

// The pattern state's allocator: every block carries a header linking it into a list, so an
// abandoned state's memory can be freed without Lua; a cap like the script state's.
struct PatternHeap {
  struct alignas(16) Block {
    Block* prev;
    Block* next;
  };
  Block head{&head, &head};
  size_t used = 0;
  size_t limit = 0;

  void Link(Block* b) {
    b->prev = &head;
    b->next = head.next;
    head.next->prev = b;
    head.next = b;
  }
  static void Unlink(Block* b) {
    b->prev->next = b->next;
    b->next->prev = b->prev;
  }
  void FreeAll() {
    for (Block* b = head.next; b != &head;) {
      Block* next = b->next;
      std::free(b);
      b = next;
    }
    head.prev = head.next = &head;
    used = 0;
  }
};

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

enum class PatternOp : uint8_t { kFind, kMatch, kGsub };
constexpr const char* kPatternOpNames[] = {"find", "match", "gsub"};
constexpr const char* kPatternFunctionNames[] = {"string.find", "string.match", "string.gsub"};
// Loop steps between two looks at the clock in table.move, insert and remove (about a
// millisecond's work).
constexpr lua_Integer kTableSlice = lua_Integer{1} << 16;
// Matcher steps at most for a match to run directly in the script's state (a few milliseconds).
constexpr double kDirectMatchSteps = 1e6;

// Whether a match of pattern p over n bytes is sure to end within kDirectMatchSteps: then it runs
// in the script's own state, with the library's function, and the pattern state's round trip is
// saved. The bound: each quantified item ("*", "+", "-", "?") may retry the rest of the pattern
// at every position, any step may scan the subject (an expansion, %b, a back-reference), and an
// unanchored search starts at every position: (n+1)^(q+2) * (len(p)+1), one power less anchored.
// Quantifier characters are counted wherever they are (in sets, after '%'), which only
// overestimates. A plain search compares the pattern at every position: (n+1) * (len(p)+1).
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

// What one pattern call hands to the pattern state (no Lua value crosses between the states).
struct PatternCall {
  PatternOp op = PatternOp::kFind;
  const char* subject = nullptr;
  size_t subject_size = 0;
  // Per string (0 the subject, 1 the pattern): the pattern state's cache slot already holds it,
  // and (out) the call put it there.
  bool cached[2] = {false, false};
  bool stored[2] = {false, false};
  const char* pattern = nullptr;
  size_t pattern_size = 0;
  lua_Integer init = 1;  // find, match
  bool plain = false;    // find
  const char* repl = nullptr;
  size_t repl_size = 0;
  lua_Integer max_n = 0;  // gsub
};

// A find of pattern `p` in subject `s` from 1-based position `init`: gmatch and gsub step along
// the subject with these.
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

// Where a relative start position (1-based, negative from the end) falls, as the string library
// counts it.
lua_Integer StartPosition(lua_Integer pos, size_t len) {
  if (pos > 0) return pos;
  if (pos == 0) return 1;
  if (pos < -static_cast<lua_Integer>(len)) return 1;
  return static_cast<lua_Integer>(len) + pos + 1;
}

enum class Outcome : uint8_t { kKeep, kChanged, kDrop, kError };

// The upvalues of the event's closures (RunRecord, FieldsIndex, EventNewIndex, EventPairs): the
// event's two tables, then the strings they use, interned once so that a call neither hashes nor
// compares text (rawequal on interned strings compares pointers).
constexpr const char* kRunStrings[] = {"did",    "collection", "rkey", "operation", "origin",
                                       "rev",    "uri",        "cid",  "record",    "create",
                                       "update", "delete",     "live", "crawl",     "replay"};
enum RunUpvalue : int {
  kUpFields = 1,
  kUpProxy,
  kUpDid,
  kUpCollection,
  kUpRkey,
  kUpOperation,
  kUpOrigin,
  kUpRev,
  kUpUri,
  kUpCid,
  kUpRecord,
  kUpCreate,
  kUpUpdate,
  kUpDelete,
  kUpLive,
  kUpCrawl,
  kUpReplay,
  kUpCount = kUpReplay,
};
static_assert(kUpCount == 2 + static_cast<int>(std::size(kRunStrings)));
enum class LoadPhase : uint8_t { kCompile, kRun, kNoRecord };

// Integral doubles inside int64 become integers, as JSON writers often emit 1.0 or 1e2.
bool DoubleToInteger(double d, int64_t* out) {
  if (!std::isfinite(d) || d != std::trunc(d)) return false;
  if (d < -9223372036854775808.0 || d >= 9223372036854775808.0) return false;
  *out = static_cast<int64_t>(d);
  return true;
}

// A JSON string literal (base/json_writer.hpp, kMinimal: copies unescaped runs in one go).
void AppendEscaped(std::string_view s, std::string* out) { AppendJsonString(s, out); }

bool ValidUtf8(const char* s, size_t n) {
  // Most strings are ASCII: checked here without simdjson's dispatch.
  unsigned char any = 0;
  for (size_t i = 0; i < n; ++i) any |= static_cast<unsigned char>(s[i]);
  return any < 0x80 || simdjson::validate_utf8(s, n);
}

void AppendInteger(int64_t v, std::string* out) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, r.ptr);
}

// One Lua state and what a call needs around it. Owned by one worker thread.
class LuaWorker final : public pipeline::TransformState {
 public:
  explicit LuaWorker(const ScriptStage::Program* program)
      : program_(program), watchdog_(program->watchdog) {
    if (watchdog_ != nullptr) watchdog_->Add(&slot_);
    // Sets the depth limit. On failure parse() allocates on demand (with simdjson's own depth
    // limit) or reports the failure like any parse error.
    const simdjson::error_code err = parser_.allocate(4096, kMaxDepth);
    static_cast<void>(err);
  }
  ~LuaWorker() override {
    if (watchdog_ != nullptr) watchdog_->Remove(&slot_);
    DiscardPatternState();
    if (L_ != nullptr) lua_close(L_);
  }
  LuaWorker(const LuaWorker&) = delete;
  LuaWorker& operator=(const LuaWorker&) = delete;

  Status Init();
  const Status& init_status() const { return init_status_; }

  // One attempt of script `script` on `event`. kChanged leaves the new body in *encoded() and its
  // createdAt in created_at(); kError leaves the message in error().
  Outcome Run(size_t script, const RecordEvent& event);
  std::string* encoded() { return &encoded_; }
  const std::string& created_at() const { return created_at_; }
  const std::string& error() const { return error_; }

 private:
  static LuaWorker* Self(lua_State* L) { return *static_cast<LuaWorker**>(lua_getextraspace(L)); }

  // Protected entry points (called through lua_pcall).
  static int OpenSandbox(lua_State* L);
  static int LoadScript(lua_State* L);
  static int RunRecord(lua_State* L);
  static int ClearEvent(lua_State* L);
  // Hooks and the functions scripts reach.
  static void LimitHook(lua_State* L, lua_Debug* ar);
  static int StringFind(lua_State* L);
  static int StringMatch(lua_State* L);
  static int StringGmatch(lua_State* L);
  static int GmatchStep(lua_State* L);
  static int StringGsub(lua_State* L);
  static int StringRep(lua_State* L);
  static int TableMove(lua_State* L);
  static int TableInsert(lua_State* L);
  static int TableRemove(lua_State* L);
  // Runs in the pattern state.
  static int OpenPatternLibrary(lua_State* P);
  static int PatternTrampoline(lua_State* P);
  static int FieldsIndex(lua_State* L);
  static int EventNewIndex(lua_State* L);
  static int EventPairs(lua_State* L);
  static int FieldsNext(lua_State* L);
  static int Refuse(lua_State* L);
  static int RefuseLibrary(lua_State* L);
  static int Silent(lua_State* L);
  static int SafeSetMetatable(lua_State* L);
  static int GetRecord(lua_State* L);
  static int JsonDecode(lua_State* L);
  static int JsonEncode(lua_State* L);
  static int MakeArray(lua_State* L);

  const char* ScriptName() const { return program_->scripts[script_].origin.c_str(); }
  std::string StatusMessage(int rc);
  std::string TimeoutMessage() const;
  // Starts the limits of one call (or one script's load): budget, hook and deadline.
  void StartLimits();

  // The pattern state (see "the pattern state's interruption" above). RunPattern runs `call`
  // there and leaves its results on that state's stack (returning how many); it raises in L on
  // the pattern library's errors and when the call's deadline passes. `subject` and `pattern` are
  // the indexes in L of those strings (kept referenced while the pattern state caches copies).
  bool OpenPatternState();
  void DiscardPatternState();
  int RunPattern(lua_State* L, int subject, int pattern, PatternCall* call);
  // Pushes on L the pattern state's results first..last, then clears that stack; returns the count.
  int PushPatternResults(lua_State* L, int first, int last);
  // `what` names the function the time ran out in ("string.find").
  [[noreturn]] void RaiseTimeout(lua_State* L, const char* what);
  void CheckDeadline(lua_State* L, const char* what) {
    if (SteadyNanos() > deadline_ns_) RaiseTimeout(L, what);
  }
  void PushWhere(lua_State* L);
  static int FindOrMatch(lua_State* L, PatternOp op);
  // The direct path: the library's function (upvalue 1 of the running wrapper) on the arguments
  // L holds, its errors raised as they would be raised from the script.
  int CallLibrary(lua_State* L, const char* what, bool has_replacement);
  static int GsubReplace(lua_State* L);
  static int IndexFirst(lua_State* L);

  // JSON text -> DOM in parser_; false with the reason in *error.
  bool Parse(std::string_view text, dom::element* root, const char** error);
  // The text JSON `e` re-encodes to by EncodeValue's rules (sorted keys, integers); false when
  // it cannot be (a non-integer number).
  bool Canonical(dom::element e, size_t depth, std::string* out);
  bool CanonicalArray(dom::array array, size_t depth, std::string* out);
  bool CanonicalObject(dom::object object, size_t depth, std::string* out);
  // Pushes `e` as a Lua value; `array_mt` is the absolute index of the array metatable.
  void PushJson(lua_State* L, dom::element e, int array_mt);
  void PushArray(lua_State* L, dom::array array, int array_mt);
  void PushObject(lua_State* L, dom::object object, int array_mt);
  // Parses `text` and pushes it, or raises "<what>: invalid JSON: ...".
  void PushParsed(lua_State* L, std::string_view text, const char* what);

  // Lua value at `idx` -> JSON appended to out_; raises (naming the path below `what`) on a
  // value JSON cannot hold.
  void EncodeValue(lua_State* L, int idx, size_t depth);
  void EncodeTable(lua_State* L, int idx, size_t depth);
  [[noreturn]] void EncodeFail(lua_State* L, const char* reason);

  const ScriptStage::Program* program_;
  Allocator alloc_;
  lua_State* L_ = nullptr;
  Status init_status_;
  int budget_ = 0;
  int64_t timeout_ns_ = 0;
  int64_t timeout_ms_ = 0;

  // The pattern state, and its copies of the last call's subject and pattern (a gsub or gmatch
  // finds over one subject many times; patterns are mostly literals). The originals stay
  // referenced in L_'s registry (m_ref), so that their address remains their identity.
  lua_State* P_ = nullptr;
  PatternHeap p_heap_;
  int p_fn_refs_[3] = {LUA_NOREF, LUA_NOREF, LUA_NOREF};
  struct CachedString {
    const char* data = nullptr;
    size_t size = 0;
    int p_ref = LUA_NOREF;
    int m_ref = LUA_NOREF;
  };
  CachedString cache_[2];
  std::shared_ptr<PatternWatchdog> watchdog_;
  PatternWatchdog::Slot slot_;

  int run_ref_ = LUA_NOREF;
  int fields_ref_ = LUA_NOREF;
  int array_mt_ref_ = LUA_NOREF;
  int env_mt_ref_ = LUA_NOREF;
  std::vector<int> record_refs_;
  size_t loading_ = 0;
  LoadPhase load_phase_ = LoadPhase::kCompile;

  // The call in progress.
  const RecordEvent* event_ = nullptr;
  size_t script_ = 0;
  // The limit the call ran into (then the hook raises on every instruction, so a script's pcall
  // cannot swallow it and carry on).
  enum class Limit : uint8_t { kNone, kBudget, kTime };
  Limit limit_hit_ = Limit::kNone;
  int64_t deadline_ns_ = 0;
  int64_t instructions_left_ = 0;
  int hook_count_ = 0;
  // Bit k set: the fields table holds the entry of upvalue k (made or set during the call).
  uint32_t made_fields_ = 0;
  bool decoded_ = false;  // event.record was decoded; canonical_ holds the original's encoding
  bool canonical_ok_ = false;
  Outcome outcome_ = Outcome::kKeep;

  // Buffers kept across calls (their capacity is reused).
  dom::parser parser_;
  std::unique_ptr<char[]> padded_;
  size_t padded_capacity_ = 0;
  std::vector<std::pair<std::string_view, dom::element>> dom_entries_;
  // An object's keys while they are sorted, each with the stack slot holding its value.
  struct KeyRef {
    std::string_view key;
    int slot;
  };
  std::vector<KeyRef> keys_;
  // The encoder's path for error messages: a key, or an array index when key is null.
  struct PathPart {
    const char* key;
    size_t key_size;
    lua_Integer index;
  };
  std::vector<PathPart> path_;
  const char* encode_what_ = "";
  bool capture_created_at_ = false;
  std::string* out_ = nullptr;
  std::string encoded_;
  std::string canonical_;
  std::string created_at_;
  std::string scratch_;
  std::string error_;
};

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

// The table library's rule for its list argument: a table, or a value whose metatable has the
// fields the function uses (__index to read, __newindex to write, __len for the length).
void CheckListLike(lua_State* L, int arg, bool read, bool write, bool length) {
  if (lua_type(L, arg) == LUA_TTABLE) return;
  if (lua_getmetatable(L, arg) != 0) {
    bool ok = true;
    for (const auto& [wanted, field] :
         {std::pair{read, "__index"}, std::pair{write, "__newindex"}, std::pair{length, "__len"}}) {
      if (!wanted) continue;
      const bool present = lua_getfield(L, -1, field) != LUA_TNIL;
      lua_pop(L, 1);
      ok = ok && present;
    }
    lua_pop(L, 1);
    if (ok) return;
  }
  luaL_checktype(L, arg, LUA_TTABLE);
}

// table.move, insert and remove are atfill's own: the library's loops run in C, and moving nils
// (table.move({}, 1, 1e15, 2), or a __len that reports 1e15) they neither run an instruction nor
// allocate, so one call could run for ever. These do the same element by element, in the same
// order, with the library's checks and messages, and look at the clock every kTableSlice steps.
int LuaWorker::TableMove(lua_State* L) {
  LuaWorker* self = Self(L);
  const lua_Integer f = luaL_checkinteger(L, 2);
  const lua_Integer e = luaL_checkinteger(L, 3);
  const lua_Integer t = luaL_checkinteger(L, 4);
  const int dest = lua_isnoneornil(L, 5) ? 1 : 5;
  CheckListLike(L, 1, true, false, false);
  CheckListLike(L, dest, false, true, false);
  if (e >= f) {
    luaL_argcheck(L, f > 0 || e < LUA_MAXINTEGER + f, 3, "too many elements to move");
    const lua_Integer n = e - f;  // elements, less one
    luaL_argcheck(L, t <= LUA_MAXINTEGER - n, 4, "destination wrap around");
    // Upwards unless the ranges overlap with the destination above the source, in one table.
    const bool upwards = t > e || t <= f || (dest != 1 && !lua_compare(L, 1, dest, LUA_OPEQ));
    for (lua_Integer k = 0; k <= n; ++k) {
      const lua_Integer i = upwards ? k : n - k;
      lua_geti(L, 1, f + i);
      lua_seti(L, dest, t + i);
      if ((k & (kTableSlice - 1)) == kTableSlice - 1) self->CheckDeadline(L, "table.move");
    }
  }
  lua_pushvalue(L, dest);
  return 1;
}

int LuaWorker::TableInsert(lua_State* L) {
  LuaWorker* self = Self(L);
  CheckListLike(L, 1, true, true, true);
  const lua_Integer end = luaL_len(L, 1) + 1;  // the first free position
  lua_Integer pos = end;
  switch (lua_gettop(L)) {
    case 2:
      break;
    case 3: {
      pos = luaL_checkinteger(L, 2);
      // Unsigned: also refuses pos < 1.
      luaL_argcheck(L, static_cast<lua_Unsigned>(pos) - 1u < static_cast<lua_Unsigned>(end), 2,
                    "position out of bounds");
      for (lua_Integer i = end; i > pos; --i) {
        lua_geti(L, 1, i - 1);
        lua_seti(L, 1, i);
        if (((end - i) & (kTableSlice - 1)) == kTableSlice - 1) {
          self->CheckDeadline(L, "table.insert");
        }
      }
      break;
    }
    default:
      return luaL_error(L, "wrong number of arguments to 'insert'");
  }
  lua_seti(L, 1, pos);
  return 0;
}

int LuaWorker::TableRemove(lua_State* L) {
  LuaWorker* self = Self(L);
  CheckListLike(L, 1, true, true, true);
  const lua_Integer size = luaL_len(L, 1);
  lua_Integer pos = luaL_optinteger(L, 2, size);
  if (pos != size) {
    // Also pos == size + 1, and 0 for an empty list. (Argument #1 in the message, as the
    // library says it.)
    luaL_argcheck(L, static_cast<lua_Unsigned>(pos) - 1u <= static_cast<lua_Unsigned>(size), 1,
                  "position out of bounds");
  }
  lua_geti(L, 1, pos);  // the result
  for (const lua_Integer first = pos; pos < size; ++pos) {
    lua_geti(L, 1, pos + 1);
    lua_seti(L, 1, pos);
    if (((pos - first) & (kTableSlice - 1)) == kTableSlice - 1) {
      self->CheckDeadline(L, "table.remove");
    }
  }
  lua_pushnil(L);
  lua_seti(L, 1, pos);
  return 1;
}

int LuaWorker::Refuse(lua_State* L) {
  return luaL_error(L, "%s is not available in atfill scripts",
                    lua_tostring(L, lua_upvalueindex(1)));
}

int LuaWorker::RefuseLibrary(lua_State* L) {
  const char* library = lua_tostring(L, lua_upvalueindex(1));
  if (lua_type(L, 2) == LUA_TSTRING) {
    return luaL_error(L, "%s.%s is not available in atfill scripts (no %s library)", library,
                      lua_tostring(L, 2), library);
  }
  return luaL_error(L, "the %s library is not available in atfill scripts", library);
}

int LuaWorker::Silent(lua_State* /*L*/) { return 0; }

// setmetatable without __gc: finalizers would run script code at arbitrary moments (inside
// another record's call, or while atfill decodes JSON).
int LuaWorker::SafeSetMetatable(lua_State* L) {
  const int t = lua_type(L, 2);
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_argexpected(L, t == LUA_TNIL || t == LUA_TTABLE, 2, "nil or table");
  if (t == LUA_TTABLE) {
    lua_pushliteral(L, "__gc");
    if (lua_rawget(L, 2) != LUA_TNIL) {
      return luaL_error(L, "__gc metamethods are not available in atfill scripts");
    }
    lua_pop(L, 1);
  }
  if (luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL) {
    return luaL_error(L, "cannot change a protected metatable");
  }
  lua_settop(L, 2);
  lua_setmetatable(L, 1);
  return 1;
}

// The iterator pairs(event) returns; the fields table is its upvalue, not a value the script
// could keep.
int LuaWorker::FieldsNext(lua_State* L) {
  lua_settop(L, 2);
  if (lua_next(L, lua_upvalueindex(kUpFields)) != 0) return 2;
  lua_pushnil(L);
  return 1;
}

// __index of the fields table: makes a field on its first read in a call and keeps it there
// (the key is one of the interned upvalue strings, so the comparisons are pointer compares).
int LuaWorker::FieldsIndex(lua_State* L) {
  LuaWorker* self = Self(L);
  const RecordEvent* event = self->event_;
  if (event == nullptr) return 0;
  int field = 0;
  for (int k = kUpDid; k <= kUpRecord; ++k) {
    if (lua_rawequal(L, 2, lua_upvalueindex(k))) {
      field = k;
      break;
    }
  }
  const auto push_string = [&](const std::string& s) { lua_pushlstring(L, s.data(), s.size()); };
  switch (field) {
    case kUpDid:
      push_string(event->did);
      break;
    case kUpCollection:
      push_string(event->collection);
      break;
    case kUpRkey:
      push_string(event->rkey);
      break;
    case kUpOperation:
      lua_pushvalue(L, lua_upvalueindex(event->operation == Operation::kCreate   ? kUpCreate
                                        : event->operation == Operation::kUpdate ? kUpUpdate
                                                                                 : kUpDelete));
      break;
    case kUpOrigin:
      lua_pushvalue(L, lua_upvalueindex(event->origin == pipeline::Origin::kLive    ? kUpLive
                                        : event->origin == pipeline::Origin::kCrawl ? kUpCrawl
                                                                                    : kUpReplay));
      break;
    case kUpRev:
      if (event->rev.empty()) return 0;
      push_string(event->rev);
      break;
    case kUpUri:
      self->scratch_ = event->Uri();
      push_string(self->scratch_);
      break;
    case kUpCid:
      if (!event->cid.valid()) return 0;
      self->scratch_ = event->cid.ToString();
      push_string(self->scratch_);
      break;
    case kUpRecord: {
      if (event->operation == Operation::kDelete) return 0;
      dom::element root;
      const char* error = nullptr;
      if (!self->Parse(event->body, &root, &error)) {
        return luaL_error(L, "event.record is not valid JSON: %s", error);
      }
      self->canonical_.clear();
      self->dom_entries_.clear();
      self->canonical_ok_ = self->Canonical(root, 0, &self->canonical_);
      self->decoded_ = true;
      lua_rawgeti(L, LUA_REGISTRYINDEX, self->array_mt_ref_);
      self->PushJson(L, root, lua_gettop(L));
      break;
    }
    default:
      return 0;
  }
  lua_pushvalue(L, 2);
  lua_pushvalue(L, -2);
  lua_rawset(L, 1);
  self->made_fields_ |= 1u << field;
  return 1;
}

int LuaWorker::EventNewIndex(lua_State* L) {
  LuaWorker* self = Self(L);
  if (lua_rawequal(L, 2, lua_upvalueindex(kUpRecord))) {
    if (self->event_ != nullptr && self->event_->operation == Operation::kDelete) {
      return luaL_error(L, "event.record cannot be set on a delete");
    }
    const int t = lua_type(L, 3);
    if (t != LUA_TTABLE && t != LUA_TNIL) {
      return luaL_error(L, "event.record must be a table (got a %s)", lua_typename(L, t));
    }
    lua_settop(L, 3);
    lua_rawset(L, lua_upvalueindex(kUpFields));
    self->made_fields_ |= 1u << kUpRecord;
    return 0;
  }
  for (int k = kUpDid; k < kUpRecord; ++k) {
    if (lua_rawequal(L, 2, lua_upvalueindex(k))) {
      return luaL_error(L, "event.%s is read-only (only event.record can be changed)",
                        lua_tostring(L, 2));
    }
  }
  if (lua_type(L, 2) == LUA_TSTRING) {
    return luaL_error(L, "event has no field '%s' (only event.record can be changed)",
                      lua_tostring(L, 2));
  }
  return luaL_error(L, "event fields are read-only (only event.record can be changed)");
}

// pairs(event) lists every field, so they are all made first.
int LuaWorker::EventPairs(lua_State* L) {
  const int fields = lua_upvalueindex(kUpFields);
  for (int k = kUpDid; k <= kUpRecord; ++k) {
    lua_pushvalue(L, lua_upvalueindex(k));
    lua_gettable(L, fields);
    lua_pop(L, 1);
  }
  lua_pushvalue(L, fields);
  lua_pushcclosure(L, FieldsNext, 1);
  lua_pushnil(L);
  lua_pushnil(L);
  return 3;
}

int LuaWorker::GetRecord(lua_State* L) {
  LuaWorker* self = Self(L);
  size_t n = 0;
  const char* uri = luaL_checklstring(L, 1, &n);
  const auto& reader = self->program_->options.read_record;
  if (!reader) return luaL_error(L, "atfill.get_record: no record reader is configured");
  // The reader's result lives only in this scope; what Lua needs is copied to members first.
  bool found = false;
  bool failed = false;
  {
    try {
      auto result = reader(std::string_view(uri, n));
      if (!result.ok()) {
        failed = true;
        self->scratch_ = result.status().ToString();
      } else if (result->has_value()) {
        found = true;
        self->scratch_ = std::move(**result);
      }
    } catch (const std::exception& e) {
      failed = true;
      self->scratch_ = e.what();
    } catch (...) {
      failed = true;
      self->scratch_ = "the record reader threw an unknown exception";
    }
  }
  if (failed) return luaL_error(L, "atfill.get_record: %s", self->scratch_.c_str());
  // The reader cannot be interrupted (the sink's own timeouts bound it); a call it kept past the
  // deadline fails once it returns.
  self->CheckDeadline(L, "atfill.get_record");
  if (!found) return 0;
  // scratch_ is not touched again until the push copies what it needs.
  self->PushParsed(L, self->scratch_, "atfill.get_record");
  return 1;
}

int LuaWorker::JsonDecode(lua_State* L) {
  size_t n = 0;
  const char* text = luaL_checklstring(L, 1, &n);
  Self(L)->PushParsed(L, std::string_view(text, n), "atfill.json_decode");
  return 1;
}

int LuaWorker::JsonEncode(lua_State* L) {
  LuaWorker* self = Self(L);
  luaL_checkany(L, 1);
  lua_settop(L, 1);
  self->scratch_.clear();
  self->out_ = &self->scratch_;
  self->path_.clear();
  self->keys_.clear();
  self->encode_what_ = "atfill.json_encode: value";
  self->capture_created_at_ = false;
  self->EncodeValue(L, 1, 0);
  lua_pushlstring(L, self->scratch_.data(), self->scratch_.size());
  return 1;
}

int LuaWorker::MakeArray(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  lua_rawgeti(L, LUA_REGISTRYINDEX, Self(L)->array_mt_ref_);
  lua_setmetatable(L, 1);
  return 1;
}

// ---- JSON --------------------------------------------------------------------------------------

bool LuaWorker::Parse(std::string_view text, dom::element* root, const char** error) {
  const size_t need = text.size() + simdjson::SIMDJSON_PADDING;
  if (padded_capacity_ < need) {
    const size_t capacity = std::max(need, padded_capacity_ * 2);
    // Zeroed once, so the padding simdjson may read is never uninitialised memory.
    padded_ = std::make_unique<char[]>(capacity);
    padded_capacity_ = capacity;
  }
  std::memcpy(padded_.get(), text.data(), text.size());
  auto parsed = parser_.parse(padded_.get(), text.size(), false);
  if (parsed.error() != simdjson::SUCCESS) {
    *error = simdjson::error_message(parsed.error());
    return false;
  }
  *root = parsed.value_unsafe();
  return true;
}

void LuaWorker::PushParsed(lua_State* L, std::string_view text, const char* what) {
  dom::element root;
  const char* error = nullptr;
  if (!Parse(text, &root, &error)) luaL_error(L, "%s: invalid JSON: %s", what, error);
  lua_rawgeti(L, LUA_REGISTRYINDEX, array_mt_ref_);
  const int mt = lua_gettop(L);
  PushJson(L, root, mt);
  lua_remove(L, mt);
}

void LuaWorker::PushArray(lua_State* L, dom::array array, int array_mt) {
  lua_createtable(L, static_cast<int>(std::min<size_t>(array.size(), INT_MAX)), 0);
  lua_pushvalue(L, array_mt);
  lua_setmetatable(L, -2);
  lua_Integer i = 0;
  for (dom::element item : array) {
    PushJson(L, item, array_mt);
    lua_rawseti(L, -2, ++i);
  }
}

void LuaWorker::PushObject(lua_State* L, dom::object object, int array_mt) {
  lua_createtable(L, 0, static_cast<int>(std::min<size_t>(object.size(), INT_MAX)));
  for (dom::key_value_pair field : object) {
    lua_pushlstring(L, field.key.data(), field.key.size());
    PushJson(L, field.value, array_mt);
    lua_rawset(L, -3);
  }
}

void LuaWorker::PushJson(lua_State* L, dom::element e, int array_mt) {
  luaL_checkstack(L, 4, "JSON nesting");
  switch (e.type()) {
    case dom::element_type::ARRAY:
      PushArray(L, e.get_array().value_unsafe(), array_mt);
      return;
    case dom::element_type::OBJECT:
      PushObject(L, e.get_object().value_unsafe(), array_mt);
      return;
    case dom::element_type::INT64:
      lua_pushinteger(L, e.get_int64().value_unsafe());
      return;
    case dom::element_type::UINT64:
      // Past int64: kept as a float, which the encoder refuses.
      lua_pushnumber(L, static_cast<lua_Number>(e.get_uint64().value_unsafe()));
      return;
    case dom::element_type::DOUBLE: {
      const double d = e.get_double().value_unsafe();
      int64_t i = 0;
      if (DoubleToInteger(d, &i)) {
        lua_pushinteger(L, i);
      } else {
        lua_pushnumber(L, d);
      }
      return;
    }
    case dom::element_type::STRING: {
      std::string_view s = e.get_string().value_unsafe();
      lua_pushlstring(L, s.data(), s.size());
      return;
    }
    case dom::element_type::BOOL:
      lua_pushboolean(L, e.get_bool().value_unsafe() ? 1 : 0);
      return;
    case dom::element_type::NULL_VALUE:
      lua_pushlightuserdata(L, nullptr);
      return;
  }
  lua_pushnil(L);
}

bool LuaWorker::CanonicalArray(dom::array array, size_t depth, std::string* out) {
  out->push_back('[');
  bool first = true;
  for (dom::element item : array) {
    if (!first) out->push_back(',');
    first = false;
    if (!Canonical(item, depth + 1, out)) return false;
  }
  out->push_back(']');
  return true;
}

bool LuaWorker::CanonicalObject(dom::object object, size_t depth, std::string* out) {
  const size_t base = dom_entries_.size();
  for (dom::key_value_pair field : object) dom_entries_.emplace_back(field.key, field.value);
  std::sort(dom_entries_.begin() + static_cast<ptrdiff_t>(base), dom_entries_.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  out->push_back('{');
  for (size_t i = base; i < dom_entries_.size(); ++i) {
    if (i != base) out->push_back(',');
    const auto entry = dom_entries_[i];
    AppendEscaped(entry.first, out);
    out->push_back(':');
    if (!Canonical(entry.second, depth + 1, out)) return false;
  }
  out->push_back('}');
  dom_entries_.resize(base);
  return true;
}

bool LuaWorker::Canonical(dom::element e, size_t depth, std::string* out) {
  switch (e.type()) {
    case dom::element_type::ARRAY:
      return CanonicalArray(e.get_array().value_unsafe(), depth, out);
    case dom::element_type::OBJECT:
      return CanonicalObject(e.get_object().value_unsafe(), depth, out);
    case dom::element_type::INT64:
      AppendInteger(e.get_int64().value_unsafe(), out);
      return true;
    case dom::element_type::UINT64:
      return false;
    case dom::element_type::DOUBLE: {
      int64_t i = 0;
      if (!DoubleToInteger(e.get_double().value_unsafe(), &i)) return false;
      AppendInteger(i, out);
      return true;
    }
    case dom::element_type::STRING:
      AppendEscaped(e.get_string().value_unsafe(), out);
      return true;
    case dom::element_type::BOOL:
      out->append(e.get_bool().value_unsafe() ? "true" : "false");
      return true;
    case dom::element_type::NULL_VALUE:
      out->append("null");
      return true;
  }
  return false;
}

void LuaWorker::EncodeFail(lua_State* L, const char* reason) {
  scratch_.assign(encode_what_);
  for (const PathPart& part : path_) {
    if (part.key != nullptr) {
      scratch_.push_back('.');
      scratch_.append(part.key, part.key_size);
    } else {
      scratch_.push_back('[');
      AppendInteger(part.index, &scratch_);
      scratch_.push_back(']');
    }
  }
  luaL_error(L, "%s: %s", scratch_.c_str(), reason);
  std::abort();  // luaL_error does not return
}

void LuaWorker::EncodeValue(lua_State* L, int idx, size_t depth) {
  std::string& out = *out_;
  switch (lua_type(L, idx)) {
    case LUA_TNIL:
      out.append("null");
      return;
    case LUA_TBOOLEAN:
      out.append(lua_toboolean(L, idx) ? "true" : "false");
      return;
    case LUA_TLIGHTUSERDATA:
      if (lua_touserdata(L, idx) == nullptr) {
        out.append("null");
        return;
      }
      EncodeFail(L, "cannot encode a userdata as JSON");
    case LUA_TNUMBER: {
      int64_t i = 0;
      if (lua_isinteger(L, idx)) {
        i = lua_tointeger(L, idx);
      } else if (!DoubleToInteger(lua_tonumber(L, idx), &i)) {
        EncodeFail(L, lua_pushfstring(L,
                                      "%f is not an integer (atproto data has no floating-point "
                                      "numbers; use math.floor or //)",
                                      lua_tonumber(L, idx)));
      }
      AppendInteger(i, &out);
      return;
    }
    case LUA_TSTRING: {
      size_t n = 0;
      const char* s = lua_tolstring(L, idx, &n);
      if (!ValidUtf8(s, n)) EncodeFail(L, "string is not valid UTF-8");
      AppendEscaped(std::string_view(s, n), &out);
      return;
    }
    case LUA_TTABLE:
      EncodeTable(L, idx, depth);
      return;
    default:
      EncodeFail(L, lua_pushfstring(L, "cannot encode a %s as JSON", luaL_typename(L, idx)));
  }
}

void LuaWorker::EncodeTable(lua_State* L, int idx, size_t depth) {
  if (depth >= kMaxDepth + 1) {
    EncodeFail(L, "tables nest too deep for JSON (does a table contain itself?)");
  }
  // A table reached many times over (t = {t, t} nested 40 deep) makes text that grows
  // exponentially, outside the Lua allocator: bounded by the memory cap and the deadline.
  if (out_->size() > alloc_.limit) {
    EncodeFail(L, "the JSON text is larger than the script's memory limit");
  }
  CheckDeadline(L, encode_what_ == kEncodeRecord ? "encoding event.record" : "atfill.json_encode");
  idx = lua_absindex(L, idx);
  luaL_checkstack(L, 4, "JSON nesting");
  std::string& out = *out_;
  bool is_array = false;
  if (lua_getmetatable(L, idx) != 0) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, array_mt_ref_);
    is_array = lua_rawequal(L, -1, -2) != 0;
    lua_pop(L, 2);
  }
  lua_Integer count = 0;
  if (!is_array) {
    // Classify: string keys only -> object; keys 1..n only -> array; nothing -> {}.
    size_t strings = 0;
    lua_Integer integers = 0;
    lua_Integer max_integer = 0;
    bool other = false;
    const size_t base = keys_.size();
    const int top = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
      if (lua_type(L, -2) == LUA_TSTRING) {
        // The value stays on the stack, below the key lua_next needs: no lookup when writing.
        size_t n = 0;
        const char* k = lua_tolstring(L, -2, &n);
        lua_insert(L, -2);
        keys_.push_back({std::string_view(k, n), lua_gettop(L) - 1});
        ++strings;
        luaL_checkstack(L, 3, "JSON object");
        continue;
      }
      if (lua_isinteger(L, -2) && lua_tointeger(L, -2) > 0) {
        ++integers;
        max_integer = std::max(max_integer, lua_tointeger(L, -2));
      } else {
        other = true;
      }
      lua_pop(L, 1);
    }
    if (other || (strings > 0 && integers > 0) || (integers > 0 && max_integer != integers)) {
      keys_.resize(base);
      EncodeFail(L,
                 "table is neither an array (keys 1..n) nor an object (string keys); use "
                 "atfill.array for arrays");
    }
    if (integers == 0) {
      std::sort(keys_.begin() + static_cast<ptrdiff_t>(base), keys_.end(),
                [](const KeyRef& a, const KeyRef& b) { return a.key < b.key; });
      out.push_back('{');
      for (size_t i = base; i < keys_.size(); ++i) {
        const std::string_view key = keys_[i].key;
        const int slot = keys_[i].slot;
        if (i != base) out.push_back(',');
        if (!ValidUtf8(key.data(), key.size())) {
          EncodeFail(L, "key is not valid UTF-8");
        }
        AppendEscaped(key, &out);
        out.push_back(':');
        path_.push_back({key.data(), key.size(), 0});
        if (depth == 0 && capture_created_at_ && key == "createdAt" &&
            lua_type(L, slot) == LUA_TSTRING) {
          size_t n = 0;
          const char* s = lua_tolstring(L, slot, &n);
          created_at_.assign(s, n);
        }
        EncodeValue(L, slot, depth + 1);
        path_.pop_back();
      }
      out.push_back('}');
      keys_.resize(base);
      lua_settop(L, top);
      return;
    }
    count = integers;
  } else {
    count = static_cast<lua_Integer>(lua_rawlen(L, idx));
  }
  out.push_back('[');
  for (lua_Integer i = 1; i <= count; ++i) {
    if (i != 1) out.push_back(',');
    path_.push_back({nullptr, 0, i});
    lua_rawgeti(L, idx, i);
    EncodeValue(L, -1, depth + 1);
    lua_pop(L, 1);
    path_.pop_back();
  }
  out.push_back(']');
}

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

}  // namespace

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
  // A failure stays in the worker: Process reports it.
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
