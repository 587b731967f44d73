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
  uint64_t tip() const { return tip_; }
  ReplayStats stats() const;
  // The seq the account sweep starts from (0 = the whole archive; set once it began).
  uint64_t account_sweep_start() const { return account_start_; }

  static constexpr const char* kStopFailedInARow = "archive_failed_blocks";

 private:
  enum class Sweep : uint8_t { kRecords, kAccounts, kDone };
  struct Io;       // where the archive's answers land (shared with its callbacks)
  struct Fetch;    // one block asked for
  struct Refold;   // a killed account's later rows being read again
  struct Marking;  // an account-sweep block being applied
  // Asks for the next plan page of the sweep (or of `refold`).
  void StartPlan(Refold* refold);
  // Takes the plan page that arrived into the sweep's plan; Unavailable when it did not advance.
  Status TakePlan(Plan plan);
  // Keeps the sweep's window full: asks for blocks after the last one asked for (and for plan
  // pages) until `prefetch_blocks` are in flight or the sweep's plan is used up (ended_).
  // An error is kept: every later call returns it.
  Status Fill();
  Status FillWindow();
  // Asks the archive for one block; the answer lands in the returned Fetch.
  std::shared_ptr<Fetch> Ask(const SegmentInfo& segment, const PlannedBlock& block, uint64_t after,
                             uint64_t through);
  // Waits at most tick_ms for `ready` (checked under the Io lock); false when it did not come.
  bool Await(const std::function<bool()>& ready);
  bool Arrived(const Fetch& fetch) const;
  // Sets `chunk` to a tick and returns true (Read's answer while it waits).
  static bool Tick(pipeline::EventChunk* chunk);
  // The sweep's next block in plan order once its frame is in: kBlock sets *fetch and *frame
  // (the failure streak counted, the next request started), kWait when nothing came within
  // tick_ms (Read returns a tick), kEnd when the sweep's plan is used up.
  enum class Next { kBlock, kWait, kEnd };
  Result<Next> TakeNext(std::shared_ptr<Fetch>* fetch, Result<std::string>* frame);
  Result<bool> ReadRecords(pipeline::EventChunk* chunk);
  Result<bool> ReadAccounts(pipeline::EventChunk* chunk);
  // The account sweep's start (ListSegments for the tail); false while the listing is awaited.
  bool StartAccounts();
  // Applies the marking block's rows from where it stopped into building_; false when it stopped
  // at a kill (a refold began).
  Result<bool> ApplyMarkers();
  // Advances the refold; true when it is complete (its rows are in building_).
  Result<bool> StepRefold();
  // Records a failed block in the chunk (state, error log, counter), once per block.
  void RecordFailure(pipeline::EventChunk* chunk, const std::string& block_id,
                     const std::string& kind, const std::string& message) const;
  bool KnownFailed(const std::string& block_id) const;
  // A block recorded as failed was read and decoded now: it leaves the job's failed list.
  void ClearFailure(pipeline::EventChunk* chunk, const std::string& block_id) const;
  std::string CursorText(uint64_t seq) const;

  Archive* archive_;
  ReplayOptions options_;
  uint64_t job_;
  state::KvStore* kv_;
  mutable state::FailedBlocks failed_;

  Sweep sweep_ = Sweep::kRecords;
  uint64_t tip_ = 0;
  uint64_t done_seq_ = 0;  // rows at or below it (in this sweep) are applied or handed out
  uint64_t account_start_ = 0;
  bool planned_ = false;
  bool announce_tip_ = false;  // the tip was just pinned: the next chunk adds it to the job
  Plan plan_;
  size_t plan_segment_ = 0;
  size_t plan_block_ = 0;
  // The window: blocks asked for, in sweep order, and the seq through which they were asked.
  std::shared_ptr<Io> io_;
  std::deque<std::shared_ptr<Fetch>> window_;
  uint64_t asked_seq_ = 0;
  bool ended_ = false;  // every block of the sweep was asked for
  Status fill_error_;
  std::shared_ptr<std::optional<Result<Plan>>> plan_pending_;
  std::shared_ptr<std::optional<Result<std::vector<SegmentInfo>>>> list_pending_;
  // The account sweep's block being applied, its chunk, and the refold it waits for.
  std::unique_ptr<Marking> marking_;
  pipeline::EventChunk building_;
  std::unique_ptr<Refold> refold_;
  uint32_t failed_in_a_row_ = 0;
  std::set<std::string> only_blocks_;
  // Chunks handed out so far, and the seq of the last records-sweep chunk (the account sweep
  // waits until it is committed: it reads which DIDs hold records from state).
  uint64_t chunks_out_ = 0;
  std::optional<uint64_t> last_records_chunk_;
  std::atomic<uint64_t> committed_{0};
  std::atomic<bool> any_committed_{false};
  // Committed() notifies the account sweep's wait for the records sweep.
  std::mutex commit_mu_;
  std::condition_variable commit_cv_;
  bool seal_asked_ = false;  // the chunk that seals the records sweep's last batch went out
  std::set<std::string> refolded_;

  mutable std::mutex stats_mu_;
  mutable ReplayStats stats_;
  mutable std::set<std::string> failed_ids_;  // under stats_mu_
  // Hashes of the accounts whose "holds records" key this run wrote.
  static constexpr size_t kSeenDidsCap = 4'000'000;
  mutable std::mutex seen_mu_;
  mutable std::unordered_set<uint64_t> seen_dids_;
};

// State keys of a replay job (family kQueue): the DIDs that wrote records (with the seq of the
// first record a chunk saw), and the DIDs whose rows after a kill marker were replayed again.
std::string ReplayDidKey(uint64_t job, std::string_view did);
std::string ReplayRefoldKey(uint64_t job, std::string_view did);

}  // namespace atfill::sources
