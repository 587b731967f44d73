// Replay: a backfill read from a Jetstream v2 archive instead of a crawl (SPEC §3.6, §5).
//
// Two sweeps. The records sweep replays the job's collections from the archive's start to its
// sealed tip, pinned when the job starts: one chunk per planned block, decompressed, decoded and
// filtered exactly (the planner over-selects) on the engine's decode threads; every commit row
// becomes a RecordEvent (CID computed from the stored DAG-CBOR, body its atproto JSON) that goes
// through the same stages as a crawled record. Each DID that wrote a record is remembered in
// state. The account sweep then reads the account and sync markers of
// those DIDs, from the segment that ends within `marker_tail_hours` of the newest one (0: the whole
// archive). Markers apply as of their own time: a kill (a #sync, or an inactive account whose
// status purges records) is applied, then that DID's rows after the marker (found through the
// blocks' DID blooms) are replayed again in order, commits and markers, so the account keeps what
// it wrote later and loses only what it held then; its later markers in the sweep are skipped.
//
// A block that arrives but does not decode is recorded as a failed block (state::FailedBlocks,
// kind "bad_block" in the error log) and skipped; one the archive does not deliver is recorded as
// well ("archive_block"), and after `max_failed_in_a_row` of those in a row the job stops. The
// cursor passes an undelivered block only with the next delivered one, so a stopped job reads the
// streak again when it resumes; a failed block read on a later run leaves the job's list.
//
// Resume cursor: "records <tip> <seq>", "accounts <tip> <start> <seq>": every row at or below
// seq of that sweep has been applied; the tip and the account sweep's start are kept.
//
// I/O. The source asks the archive through its Start forms (Archive::StartPlanSnapshot,
// StartGetBlock, StartListSegments): it keeps `prefetch_blocks` block requests in flight ahead of
// the block it reads (and the next plan page once the current one is issued), so a block's round
// trip starts while earlier blocks are decoded and written; while blocks fail in a row it asks one
// at a time. Read waits only for an answer already
// asked for, and at most `tick_ms`: then it returns a tick chunk (Source's contract for network
// sources), so retries, Retry-After, throttling and quota pacing run on the archive's I/O loop and
// never in Read. A refold (a killed account's later rows) is asked for the same way; the chunk of
// the block that holds the kill is handed out once its refold is in. Over a local archive the
// Start forms answer at once from files, and Read reads them (local input).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include <deque>

#include "base/status.hpp"
#include "pipeline/batcher.hpp"
#include "pipeline/shard.hpp"
#include "pipeline/source.hpp"
#include "sources/archive/archive.hpp"
#include "state/failed_blocks.hpp"
#include "state/kv_store.hpp"

namespace atfill::sources {

// The batch limits a replay runs with (atfill's [archive] batch_* defaults): larger than the
// engine's. Chosen under schema version 1, whose key led with the account, so that each commit
// rewrote an index page per account it touched; under version 2 the SQLite sink's CPU per record
// measured the same from 5,000 to 200,000 events, and fewer commits mean fewer cursor writes
// (bench/replay_bench; docs/performance.md has the measured sizes).
inline constexpr pipeline::BatcherOptions kReplayBatch{
    .max_events = 100'000, .max_delay_ms = 2000, .max_chunks = 64};

// The SQLite sink's WAL checkpoint size during a replay (atfill's [archive] sqlite_wal_mb default;
// [sink.sqlite] wal_autocheckpoint_mb, 128 MiB, is every other job's). Chosen under schema
// version 1, when each transaction rewrote index pages all over the table and a larger WAL let a
// checkpoint copy each such page once for several transactions; under version 2, 128 MiB measured
// the same (bench/replay_bench; the sizes tried are in docs/performance.md).
inline constexpr int64_t kReplaySqliteWalBytes = int64_t{512} << 20;

struct ReplayOptions {
  // The job's collections (NSIDs or "prefix.*"); empty = every collection.
  std::vector<std::string> collections;
  // This process's shard of the DID space (--shard i/n): rows and markers of DIDs another shard
  // owns are skipped.
  pipeline::Shard shard;
  // The account sweep starts at the segment that ends within this many hours of the newest one;
  // 0 sweeps the whole archive.
  double marker_tail_hours = 12;
  // Run the account sweep after the records sweep.
  bool accounts = true;
  // Largest decompressed block accepted (bytes); a larger one is a failed block.
  uint64_t max_block_bytes = uint64_t{256} << 20;
  // Blocks in a row the archive fails to deliver before the job stops.
  uint32_t max_failed_in_a_row = 16;
  // Only these blocks ("<segment name>/<block index>"), for retry-failed; empty = the plan's.
  std::vector<std::string> only_blocks;
  // The job whose failed blocks these are: each one read and decoded now leaves its failed list
  // (in the chunk's state writes). 0 = none.
  uint64_t retry_of = 0;
  // A window of the archive, (after_seq, before_seq] (0: its start, its sealed tip): a live
  // stream's gap. Both sweeps cover the window; with `all_markers` the account sweep applies
  // every account's markers in it (as the stream would have), not only those of accounts that
  // wrote records in the replay. A window's kill markers remove only the rows older than their
  // time (AccountEvent::purge_before_rev): the live stream beside it may have written later ones.
  uint64_t after_seq = 0;
  uint64_t before_seq = 0;
  bool all_markers = false;
  // Block requests kept in flight ahead of the block being read; the frames that arrived wait in
  // memory, so at most this many are held at once. 1..256.
  uint32_t prefetch_blocks = 8;
  // Longest a Read waits for an answer already asked for before it returns a tick chunk,
  // milliseconds; 1..10000.
  int64_t tick_ms = 100;
  Status Validate() const;
};

struct ReplayStats {
  uint64_t blocks = 0;
  uint64_t failed_blocks = 0;
  uint64_t rows = 0;
  uint64_t bytes = 0;
  uint64_t refolded_dids = 0;
};

class ReplaySource : public pipeline::Source {
 public:
  // `archive` and `kv` must outlive the source; `job` keys its state.
  ReplaySource(Archive* archive, ReplayOptions options, uint64_t job, state::KvStore* kv);
  ~ReplaySource() override;

  Status Seek(const std::string& resume_cursor) override;
  Result<bool> Read(pipeline::EventChunk* chunk) override;
  void Decode(pipeline::EventChunk* chunk) const override;
  std::string Describe() const override;
  void Committed(uint64_t through_seq) override;

  // The pinned sealed tip (0 before the first plan).
  uint64_t tip() const;
  ReplayStats stats() const;
  // The seq the account sweep starts from (0 = the whole archive; set once it began).
  uint64_t account_sweep_start() const;

  static constexpr const char* kStopFailedInARow = "archive_failed_blocks";

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// State keys of a replay job (family kQueue): the DIDs that wrote records (with the seq of the
// first record a chunk saw), and the DIDs whose rows after a kill marker were replayed again.
std::string ReplayDidKey(uint64_t job, std::string_view did);
std::string ReplayRefoldKey(uint64_t job, std::string_view did);

}  // namespace atfill::sources
