// The replay source's private state (sources/archive/replay.hpp): its sweeps, the window of
// blocks asked for, the account sweep's markers and refolds. Not for use outside replay.cpp.
#pragma once

#include "sources/archive/replay.hpp"

namespace atfill::sources {

// What the source keeps between its calls (the header's ReplaySource forwards to it).
struct ReplaySource::Impl {
  Impl(Archive* archive, ReplayOptions options, uint64_t job, state::KvStore* kv);

  Status Seek(const std::string& resume_cursor);
  Result<bool> Read(pipeline::EventChunk* chunk);
  void Decode(pipeline::EventChunk* chunk) const;
  std::string Describe() const;
  void Committed(uint64_t through_seq);
  ReplayStats stats() const;

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

}  // namespace atfill::sources
