// The launcher's config file: TOML parsed once into each component's typed options. Every key is
// documented in docs/config.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"
#include "pipeline/shard.hpp"
#include "sinks/postgres_sink.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/crawl/crawl_source.hpp"
#include "sources/event_file.hpp"
#include "sources/jetstream.hpp"
#include "sources/replay.hpp"
#include "stages/account_check.hpp"
#include "stages/script.hpp"
#include "state/error_log.hpp"
#include "state/kv_store.hpp"
#include "state/tombstones.hpp"
#include "tools/atfill/admin/admin_server.hpp"

namespace atfill::cli {

struct AppConfig {
  std::string path;                     // the config file
  state::RocksDbOptions state;          // [state]
  std::string sink = "sqlite";          // [sink] kind
  sinks::SqliteSinkOptions sqlite;      // [sink.sqlite]
  sinks::PostgresSinkOptions postgres;  // [sink.postgres]
  pipeline::EngineOptions engine;       // [engine]
  // [engine] shard = "i/n" (or --shard i/n, which wins): this process owns the DIDs of shard i;
  // copied into crawl and replay, and every job's graph starts with a pipeline::ShardFilter.
  pipeline::Shard shard;
  sources::EventFileOptions files;  // [files] (paths come from the command line)
  sources::CrawlOptions crawl;      // [crawl], [resolver], [net]
  sources::JetstreamOptions live;   // [live] (no hosts: no live consumer)
  // [live] allow_private_endpoints: the account check may reach PDSs that DID documents place on
  // loopback or private addresses (as [crawl] allow_private_endpoints). The hosts themselves
  // are always reached.
  bool live_allow_private_endpoints = false;
  // [crawl] source: where a backfill of collections reads from: "crawl" (every PDS), "replay"
  // (the Jetstream archive; never falls back) or "auto" (replay when an archive is configured and
  // answers, else crawl). Account backfills (given DIDs) always crawl.
  std::string backfill_source = "crawl";
  // [archive] url: a Jetstream v2 archive's host (its XRPC API), or dir: a local directory of .jss
  // segments (dir wins when both are set). key (or the environment's ATFILL_ARCHIVE_KEY): the
  // archive's bearer key, sent to it alone.
  std::string archive_url;
  std::string archive_dir;
  std::string archive_key;
  // [archive] retry_delays_ms: the waits before each retry of an archive request answered with a
  // 5xx or not at all (one entry per retry, milliseconds; [] = never retry); unset = HttpArchive's
  // default (6 retries over about 30 s).
  std::optional<std::vector<int64_t>> archive_retry_delays_ms;
  // [archive] replay_dir (default "<state dir>/replay"), spool_segments (default true): segments
  // an archive URL plans whole are downloaded there and read as they arrive
  // (HttpArchiveOptions::spool_dir); false reads every block with getBlock.
  std::string archive_replay_dir;
  bool archive_spool_segments = true;
  uint64_t archive_spool_chunk_kb = 8192;  // [archive] spool_chunk_kb: getSegment range size
  sources::ReplayOptions replay;           // [archive] replay_marker_tail_hours, max_block_mb, ...
  // [crawl] batch_records, batch_ms, batch_chunks: a crawl's batches, larger than [engine]'s: the
  // record key leads with the collection and record key, so a crawl's keys (each account's whole
  // history) land all over it, and fewer, larger commits write each touched index page once for
  // more records (bench/scale_bench BM_RepoOrder with ATFILL_SCALE_BATCH; docs/performance.md).
  pipeline::BatcherOptions crawl_batch{
      .max_events = 50'000, .max_delay_ms = 1000, .max_chunks = 128};
  // [crawl] bulk_load: a crawl alone into an empty SQLite table loads it with the key by account
  // and builds the final indexes when it ends (sinks::SqliteSinkOptions::bulk_load). Not with a
  // live consumer beside it, and never for a replay, whose accounts interleave.
  bool crawl_bulk_load = true;
  // [archive] batch_records, batch_ms, batch_chunks: a replay's batches (sources::kReplayBatch).
  pipeline::BatcherOptions replay_batch = sources::kReplayBatch;
  // [archive] sqlite_wal_mb: the SQLite sink's wal_autocheckpoint during a replay job.
  int64_t replay_sqlite_wal_bytes = sources::kReplaySqliteWalBytes;
  // [live] check_deleted_accounts, account_check_timeout_ms: ask the PDS before purging a
  // deleted account (stages/account_check.hpp).
  bool check_deleted_accounts = true;
  // [live] batch_records, batch_ms, batch_chunks: the live consumer's batches, larger than
  // [engine]'s: the stream interleaves accounts, so each commit rewrites pages all over the index,
  // and fewer, larger commits cost less per event (bench/live_bench, docs/performance.md).
  pipeline::BatcherOptions live_batch{
      .max_events = 50'000, .max_delay_ms = 1000, .max_chunks = 128};
  stages::AccountCheckOptions account_check;
  bool verify_cids = true;  // [stages] verify_cids
  // [scripts] fail_open, instruction_budget, memory_mb, attempts, and [scripts.collections]
  // (collection = "script.lua"): the Lua record scripts run after CID verification (read_record
  // is bound to the configured sink when a job runs).
  stages::ScriptOptions scripts;
  pipeline::JobOptions jobs;           // [jobs]
  state::ErrorLogOptions error_log;    // [jobs] error_log_cap
  state::TombstoneOptions tombstones;  // [tombstones]
  double progress_interval_s = 10;     // [progress] interval_s (plain log lines)
  // [admin] address, port, token (or the environment's ATFILL_ADMIN_TOKEN): `atfill run` serves
  // the admin API and dashboard when port is set (0 = a free port, printed at start).
  bool admin_enabled = false;
  admin::AdminServerOptions admin;
  // [jobs] backfill_retention_days: the per-repo details and leftover queue of backfill jobs
  // finished longer ago are deleted by a daily task of `atfill run` (at its start, then every
  // 24 h); 0 keeps them forever. Fractions of a day are allowed.
  double backfill_retention_days = 28;
};

// Where a replay reads: the archive directory (absolute) or URL; empty when none is configured.
std::string ArchiveLocation(const AppConfig& config);

// A --shard given on the command line: LoadAppConfig uses it instead of [engine] shard.
void SetShardOverride(pipeline::Shard shard);

// Loads and validates CONFIG. Relative paths are relative to the config file's folder.
Result<AppConfig> LoadAppConfig(const std::string& path);

}  // namespace atfill::cli
