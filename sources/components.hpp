// The sources' part of the component registry (pipeline/components.hpp): [files], [crawl],
// [resolver], [net], [live], [labels] and [archive] into SourceSettings, and the sources a job's
// kind runs: "crawl" and "replay" (backfill jobs), "files" (ingest jobs) and "jetstream" (the live
// consumer, with its gap replays and the way its account check asks PDSs). Also what creates
// backfill jobs: the choice between a crawl and an archive replay, and the job that retries a
// replay's failed blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.hpp"
#include "pipeline/components.hpp"
#include "sources/archive/archive.hpp"
#include "sources/archive/replay.hpp"
#include "sources/crawl/crawl_source.hpp"
#include "sources/files/event_file.hpp"
#include "sources/firehose/firehose.hpp"
#include "sources/jetstream/jetstream.hpp"
#include "sources/labels/labeler.hpp"
#include "sources/live_collections.hpp"
#include "sources/verify/verify_source.hpp"
#include "sources/verify_schedule.hpp"

namespace atfill::sources {

// The process's LiveCollections, made on first use (it needs the state).
struct LiveCollectionsSlot {
  std::mutex mu;
  std::unique_ptr<LiveCollections> collections;
};

struct SourceSettings {
  EventFileOptions files;  // [files] (paths come from each job)
  CrawlOptions crawl;      // [crawl], [resolver], [net]
  JetstreamOptions live;   // [live] (no hosts: no live consumer)
  // [live] protocol = "firehose": the hosts are relays (or PDSs) whose
  // com.atproto.sync.subscribeRepos the live consumer reads, verifying every commit
  // (sources/firehose/firehose.hpp), instead of Jetstreams. live.protocol is then left at auto.
  bool live_firehose = false;
  // [live] max_resyncs_in_flight, resync_retry_ms, max_waiting_mb: the firehose's own options
  // (with protocol = "firehose"); the rest of it is made from `live` and `crawl` when planned.
  FirehoseOptions firehose;
  LabelerOptions labels;  // [labels] (no labelers: no label subscription)
  // [live] allow_private_endpoints: the account check may reach PDSs that DID documents place on
  // loopback or private addresses (as [crawl] allow_private_endpoints). The hosts themselves
  // are always reached.
  bool live_allow_private_endpoints = false;
  // [live] check_deleted_accounts: ask the PDS before purging a deleted account
  // (stages/account_check.hpp).
  bool check_deleted_accounts = true;
  // [live] batch_records, batch_ms, batch_chunks: the live consumer's batches, larger than
  // [engine]'s: the stream interleaves accounts, so each commit rewrites pages all over the index,
  // and fewer, larger commits cost less per event (bench/live_bench, docs/performance.md).
  pipeline::BatcherOptions live_batch{
      .max_events = 50'000, .max_delay_ms = 1000, .max_chunks = 128};
  // [files] batch_records, batch_ms, batch_chunks: an ingest's batches, larger than [engine]'s:
  // an event file is a backlog whose accounts interleave, and fewer, larger commits write the
  // by-account index's newest block once for more events (docs/performance.md, "The settings that
  // matter"). At most batch_chunks chunks of [files] chunk_lines are in a batch.
  pipeline::BatcherOptions files_batch{
      .max_events = 50'000, .max_delay_ms = 1000, .max_chunks = 64};
  // [files] sqlite_wal_mb: the SQLite sink's wal_autocheckpoint during an ingest, as a replay's:
  // a batch of interleaved accounts writes about as much WAL as the default cap, so at that cap the
  // writer would wait for a checkpoint after nearly every batch (docs/performance.md).
  int64_t files_sqlite_wal_bytes = kReplaySqliteWalBytes;
  // [crawl] source: where a backfill of collections reads from: "crawl" (every PDS), "replay"
  // (the Jetstream archive; never falls back) or "auto" (replay when an archive is configured and
  // answers, else crawl). Account backfills (given DIDs) always crawl.
  std::string backfill_source = "crawl";
  // [crawl] batch_records, batch_ms, batch_chunks: a crawl's batches, larger than [engine]'s: a
  // crawl's keys (each account's whole history) land all over the record key, and fewer, larger
  // commits write each touched index page once for more records (docs/performance.md).
  pipeline::BatcherOptions crawl_batch{
      .max_events = 50'000, .max_delay_ms = 1000, .max_chunks = 128};
  // [crawl] bulk_load: a crawl alone into an empty SQLite table loads it with the key by account
  // and builds the final indexes when it ends (sinks::SqliteSinkOptions::bulk_load). Not with a
  // live consumer beside it, and never for a replay, whose accounts interleave.
  bool crawl_bulk_load = true;
  // [archive] url: a Jetstream v2 archive's host (its XRPC API), or dir: a local directory of .jss
  // segments (dir wins when both are set). key (or the environment's ATFILL_ARCHIVE_KEY): the
  // archive's bearer key, sent to it alone.
  std::string archive_url;
  std::string archive_dir;
  std::string archive_key;
  // [archive] retry_delays_ms: the waits before each retry of an archive request answered with a
  // 5xx or not at all (one entry per retry, milliseconds; [] = never retry); unset = HttpArchive's
  // default.
  std::optional<std::vector<int64_t>> archive_retry_delays_ms;
  // [archive] replay_dir (default "<state dir>/replay"), spool_segments (default true): segments
  // an archive URL plans whole are downloaded there and read as they arrive
  // (HttpArchiveOptions::spool_dir); false reads every block with getBlock.
  std::string archive_replay_dir;
  bool archive_spool_segments = true;
  uint64_t archive_spool_chunk_kb = 8192;  // [archive] spool_chunk_kb: getSegment range size
  ReplayOptions replay;                    // [archive] replay_marker_tail_hours, max_block_mb...
  // [archive] batch_records, batch_ms, batch_chunks: a replay's batches.
  pipeline::BatcherOptions replay_batch = kReplayBatch;
  // [archive] sqlite_wal_mb: the SQLite sink's wal_autocheckpoint during a replay job.
  int64_t replay_sqlite_wal_bytes = kReplaySqliteWalBytes;
  // [verify] every_hours, repair, collections: the verify jobs `atfill run` starts.
  VerifyScheduleOptions verify;
  // The live consumer's collections as they change at run time (shared by copies of these
  // settings; see LiveCollectionsOf).
  std::shared_ptr<LiveCollectionsSlot> live_collections = std::make_shared<LiveCollectionsSlot>();
};

void Register(pipeline::Components& components);

// Where a replay reads: the archive directory (absolute) or URL; empty when none is configured.
std::string ArchiveLocation(const SourceSettings& settings);

// The archive at `location`: a URL (the archive XRPC API, with the settings' key) or a directory.
// `probe` shortens the retries (the question "is there an archive?").
Result<std::unique_ptr<Archive>> OpenArchive(const SourceSettings& settings,
                                             const std::string& location, bool probe = false);

// The live consumer's collections for this process and state: [live] collections, or the set
// saved by changes made at run time. Made (and loaded) on the first call; later calls return the
// same object. `loaded`, when given, receives what the first load applied: the difference of a
// config edited while atfill was stopped (the caller backfills what it added).
Result<LiveCollections*> LiveCollectionsOf(const pipeline::Environment& env,
                                           CollectionChange* loaded = nullptr);

// The live consumer's cursor: "SEQ:TIME_US" of the last applied event.
inline constexpr const char* kLiveCursor = "live/jetstream";
// The firehose consumer's cursor: "SEQ:TIME_US", the relay's seq of the applied watermark and
// the relay's time of that frame.
inline constexpr const char* kFirehoseCursor = "live/firehose";

// The live consumer as its state shows it: the newest live job and its cursor.
struct LiveView {
  std::optional<state::JobRecord> job;  // nullopt: no live job has run on this state
  uint64_t seq = 0;                     // the applied watermark (v2 seq, or v1 time_us)
  int64_t witnessed_us = 0;             // event time of the newest applied event; 0 = none yet
};
Result<LiveView> ReadLiveView(const pipeline::Environment& env);

// The ingest job of event `files` (absolute paths), writing nothing with `dry_run`: the
// unfinished one that reads the same files, or a new one. Sweeps the tombstones first.
Result<state::JobRecord> FindOrCreateIngestJob(const pipeline::Environment& env,
                                               const std::vector<std::string>& files, bool dry_run,
                                               const std::string& started_by, bool* resumed);

// The live consumer's job ([live]): the one this state has (its cursor continues), or a new one.
Result<state::JobRecord> FindOrCreateLiveJob(const pipeline::Environment& env,
                                             const std::string& started_by);

// What a backfill asks for; empty fields take the settings' ([crawl], [crawl] source).
struct BackfillTargets {
  std::vector<std::string> collections;
  std::vector<std::string> dids;  // non-empty: an account backfill of these DIDs
  std::string mode;               // listRecords | getRepo
  std::string discovery;          // listReposByCollection | listRepos | dids
  std::string relay;
  std::string source;  // crawl | auto | replay
};

// The crawl options and the source ("crawl" or "replay") a backfill of `targets` runs with;
// Invalid with the reason when the settings cannot serve it. With source auto, asks the archive
// whether it answers.
Result<std::pair<CrawlOptions, std::string>> PlanBackfill(const pipeline::Environment& env,
                                                          const BackfillTargets& targets);

struct BackfillJob {
  state::JobRecord job;
  bool resumed = false;  // the unfinished job with these targets, not a new one
  CrawlOptions crawl;    // what it crawls (its collections, for a replay too)
};
// The job that backfills `crawl` from `source` ("crawl" or "replay"): the unfinished one with the
// same targets, or a new one, started by `started_by` ("cli", "api"...). Sweeps the tombstones
// first.
Result<BackfillJob> FindOrCreateBackfill(const pipeline::Environment& env,
                                         const CrawlOptions& crawl, const std::string& source,
                                         const std::string& started_by);
// PlanBackfill, then FindOrCreateBackfill.
Result<BackfillJob> CreateBackfill(const pipeline::Environment& env, const BackfillTargets& targets,
                                   const std::string& started_by);

// A new verify job of `targets` (a verify is never resumed by the same command: it checks the
// repos as they are now), started by `started_by` ("cli", "schedule"...). Sweeps the tombstones
// first.
Result<state::JobRecord> CreateVerifyJob(const pipeline::Environment& env,
                                         const VerifyTargets& targets,
                                         const std::string& started_by);

// The job that retries replay job `id`'s failed blocks (the unfinished one, or a new one):
// Unsupported when `id` is not a replay, NotFound when it has no failed block.
Result<state::JobRecord> CreateRetryJob(const pipeline::Environment& env, uint64_t id,
                                        const std::string& started_by, bool* resumed);

}  // namespace atfill::sources
