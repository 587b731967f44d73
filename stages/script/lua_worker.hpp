// The script stage's private parts (stages/script/script.hpp), shared by its files:
//   sandbox.cpp   the Lua state, its sandboxed libraries, the memory cap and the call deadline
//   patterns.cpp  string patterns run in a private state the watchdog can interrupt
//   library.cpp   atfill's own table and string functions, the event's fields, get_record
//   json.cpp      the bridge between Lua values and atproto JSON
//   stage.cpp     one record's call, and the stage (retries, fail_open, counters)
// Not for use outside stages/script/.
#pragma once

#include "stages/script/script.hpp"

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
namespace lua {

// The clock of the call deadlines: the kernel's coarse monotonic clock, a few times cheaper to
// read than the precise one (every call reads it; script_bench BM_PassThrough), at a resolution
// of a few milliseconds.
inline int64_t SteadyNanos() {
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

}  // namespace lua

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
  std::shared_ptr<lua::PatternWatchdog> watchdog;
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

namespace lua {

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
void* LimitedAlloc(void* ud, void* ptr, size_t osize, size_t nsize);

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

[[noreturn]] void JumpOutOfPatternState();

extern "C" void OnPatternSignal(int /*sig*/);

void InstallPatternSignal();

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

void* PatternAllocUnguarded(PatternHeap* h, void* ptr, size_t osize, size_t nsize);

void* PatternAlloc(void* ud, void* ptr, size_t osize, size_t nsize);

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
bool SmallMatch(size_t n, const char* p, size_t plen, bool plain, bool anchorable);

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
PatternCall FindFrom(const char* s, size_t len, const char* p, size_t plen, lua_Integer init);

// Where a relative start position (1-based, negative from the end) falls, as the string library
// counts it.
lua_Integer StartPosition(lua_Integer pos, size_t len);

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
bool DoubleToInteger(double d, int64_t* out);

// A JSON string literal (base/json_writer.hpp, kMinimal: copies unescaped runs in one go).
void AppendEscaped(std::string_view s, std::string* out);

bool ValidUtf8(const char* s, size_t n);

void AppendInteger(int64_t v, std::string* out);

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

}  // namespace lua
}  // namespace atfill::stages
