// Lua 5.4 record scripts: one script per collection may rewrite, keep or drop each record event of
// that collection (creates, updates and deletes, from every source). docs/scripts.md is the
// user's reference; this header is the contract for the engine.
//
// A script is a Lua file that defines a global `function record(event)`. The file runs once per
// Lua state when the state is made, in its own global environment; `record` then runs once per
// event. `event` is a read-only table except for `event.record`, reused from call to call, whose
// fields are made on first read (a script pays only for what it reads):
//
//   did, collection, rkey, uri   strings
//   operation                    "create" | "update" | "delete"
//   origin                       "live" | "crawl" | "replay"
//   cid                          the CID the source stated (string); nil for deletes
//   rev                          the commit's revision (TID); nil when the source gives none
//   record                       the record as a Lua table decoded from its JSON (decoded on first
//                                access); nil for deletes. The only field a script may assign.
//
// `record` returns the event it was given to keep it (the body is re-encoded when the record was
// changed, and stays byte-for-byte the received text otherwise), nil or false to drop it (not an
// error), or raises an error: the event is retried, then written to the chunk's errors (kind
// "script_error") and dropped, or kept unchanged when `fail_open` is set.
//
// Sandbox: base (without dofile, loadfile, load, collectgarbage; print is silent; setmetatable
// refuses __gc), string (without dump), table, math and utf8; no io, os, package, debug or
// coroutine, and touching any of them raises an error naming what is refused. Each call has an
// instruction budget and a wall-clock limit; each Lua state a memory cap. The global table `atfill`
// holds the helpers: get_record(uri), json_decode(text), json_encode(value), array(table) and null.
//
// The wall-clock limit also covers the library functions whose running time the other limits do
// not bound. string.find, match, gmatch and gsub run the library's function directly when a bound
// on the match's work is small (~1e6 matcher steps); other matches run in a second, private Lua
// state per worker (with its own memory cap, the same size), which a watchdog thread interrupts (a
// signal to the worker's thread) when a call runs past its limit; that state is then thrown away
// whole and made anew on the next pattern call. string.rep, table.move, table.insert and
// table.remove are atfill's own (same results and messages; no per-copy loop, a look at the clock
// as they go). The process handles SIGURG for this once a stage exists.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.hpp"
#include "pipeline/transform.hpp"

namespace atfill::stages {

struct ScriptOptions {
  // Collection NSID -> path of the Lua file run for that collection's record events. Files are
  // read once, by ScriptStage::Create.
  std::map<std::string, std::string> scripts;
  // Collection NSID -> Lua source text, for scripts that do not live in a file (tests, embedded
  // defaults). Error messages name them "inline:<collection>". A collection is in one map only.
  std::map<std::string, std::string> sources;
  // Lua VM instructions one call of `record` may run (a hook counts them), 1..INT_MAX. Time spent
  // inside one library call (a string pattern match, string.rep) is not counted.
  uint64_t instruction_budget = 1'000'000;
  // Wall-clock time one call of `record` (and the load of a script) may take, C functions
  // included, 10 ms..1 h. A call past it fails like any other error (retried, then logged). Checked
  // every 10,000 instructions, on allocations, and by the watchdog for pattern matches (which then
  // stop within a tenth of the limit, at most 100 ms late).
  std::chrono::milliseconds call_timeout{1000};
  // Bytes each Lua state may allocate (the state itself, scripts, their data), >= 256 KiB. An
  // allocation past it fails the call with Lua's "not enough memory"; the state stays usable.
  size_t memory_limit_bytes = size_t{64} << 20;
  // Tries per record: the first, then retries after an error (default: up to 3 retries), >= 1.
  int max_attempts = 4;
  // Wait before the first retry, doubling for each next one; 0 = retry at once.
  std::chrono::microseconds retry_backoff{1000};
  // Most waiting for retries one chunk does in total: once spent, the remaining retries of that
  // chunk run without waiting. The waits happen off the flow-graph workers (the chunk is handed
  // off and comes back when its wait is over).
  std::chrono::microseconds max_backoff_per_chunk{10000};
  // After the last attempt fails, the record is logged in the chunk's errors and then dropped
  // (false, fail closed) or kept as received (true, fail open).
  bool fail_open = false;
  // Backend of atfill.get_record(uri): the previously indexed record's JSON for an AT URI, or
  // nullopt when there is none. Called from several worker threads at once: must be thread-safe.
  // May be empty: get_record then raises "no record reader is configured". An error it returns
  // is raised in the script (and so retried).
  std::function<Result<std::optional<std::string>>(std::string_view uri)> read_record;

  Status Validate() const;
};

// Unordered and asynchronous: runs on several chunks at once, each worker with its own Lua state
// (NewState); a chunk whose record waits before a retry is handed off for the wait and resumed on
// whichever worker is free. Events of collections without a script and account events are left
// untouched. Counters
// (when non-zero): script_changed (bodies rewritten), script_dropped (records the script
// dropped), script_errors (records whose last attempt failed), script_retries (attempts after
// a failure).
class ScriptStage : public pipeline::AsyncTransform {
 public:
  // Reads the files, checks the options and compiles every script once in a throwaway Lua state:
  // a script that does not compile, fails while loading or defines no global function `record`
  // is an Invalid error naming the file and carrying Lua's message.
  static Result<std::unique_ptr<ScriptStage>> Create(ScriptOptions options);
  ~ScriptStage() override;

  std::string_view name() const override { return "script"; }
  // A fresh Lua state with every script loaded. Thread-safe (each call builds its own state).
  // When the state cannot be built, the returned state holds the error and Start reports it.
  std::unique_ptr<pipeline::TransformState> NewState() const override;
  // `state` must come from this stage's NewState and be used by one thread at a time. Returns
  // false when the chunk is done; true when a retry's backoff is due: the chunk waits on the
  // stage's delay queue, then `done.Again()` asks for Start to be called on it again, which goes
  // on where it stopped. Fails (through `done`, at once) only for a state that could not be
  // built.
  bool Start(pipeline::TransformState* state, pipeline::EventChunk* chunk, bool again,
             Done done) const override;

  // Whether `collection` has a script.
  bool HasScript(std::string_view collection) const;

  // The per-stage data every worker reads (options and script texts); defined in script.cpp.
  struct Program;
  struct Progress;

 private:
  explicit ScriptStage(std::shared_ptr<const Program> program);
  std::shared_ptr<const Program> program_;
};

}  // namespace atfill::stages
