#include "tools/atfill/app_config.hpp"

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "pipeline/config.hpp"

namespace atfill::cli {

std::string ArchiveLocation(const AppConfig& config) {
  if (!config.archive_dir.empty()) return std::filesystem::absolute(config.archive_dir).string();
  return config.archive_url;
}

namespace {

// [section] batch_records, batch_ms, batch_chunks.
Status ReadBatch(pipeline::ConfigFile& file, const std::string& section,
                 pipeline::BatcherOptions* b) {
  ATFILL_RETURN_IF_ERROR(file.ReadUint(section + ".batch_records", &b->max_events, 1, 1'000'000));
  ATFILL_RETURN_IF_ERROR(file.ReadInt(section + ".batch_ms", &b->max_delay_ms, 0, 600'000));
  return file.ReadUint(section + ".batch_chunks", &b->max_chunks, 1, 100'000);
}

std::optional<pipeline::Shard>& ShardOverride() {
  static std::optional<pipeline::Shard> shard;
  return shard;
}

}  // namespace

void SetShardOverride(pipeline::Shard shard) { ShardOverride() = shard; }

Result<AppConfig> LoadAppConfig(const std::string& path) {
  ATFILL_ASSIGN_OR_RETURN(pipeline::ConfigFile file, pipeline::ConfigFile::Load(path));
  AppConfig c;
  c.path = path;
  c.state.path = "atfill-state";
  c.sqlite.path = "atfill.db";
  // Relative defaults resolve against the config's folder, like configured paths.
  ATFILL_RETURN_IF_ERROR(file.ReadPath("state.dir", &c.state.path));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("state.sync", &c.state.sync));
  ATFILL_RETURN_IF_ERROR(file.ReadEnum("sink.kind", &c.sink, {"sqlite", "postgres"}));
  auto& pg = c.postgres;
  ATFILL_RETURN_IF_ERROR(file.ReadString("sink.postgres.conninfo", &pg.conninfo));
  ATFILL_RETURN_IF_ERROR(file.ReadString("sink.postgres.schema", &pg.schema));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("sink.postgres.connect_timeout_ms", &pg.connect_timeout_ms, 1, 3'600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("sink.postgres.lock_timeout_ms", &pg.lock_timeout_ms, 1, 3'600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("sink.postgres.conflict_retries", &pg.conflict_retries, 0, 1000));
  ATFILL_RETURN_IF_ERROR(file.ReadPath("sink.sqlite.path", &c.sqlite.path));
  std::string sync = "normal";
  ATFILL_RETURN_IF_ERROR(file.ReadEnum("sink.sqlite.synchronous", &sync, {"normal", "full"}));
  c.sqlite.synchronous =
      sync == "full" ? sinks::SqliteSynchronous::kFull : sinks::SqliteSynchronous::kNormal;
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("sink.sqlite.busy_timeout_ms", &c.sqlite.busy_timeout_ms, 0, 3'600'000));
  int64_t cache_mb = c.sqlite.cache_bytes >> 20;
  ATFILL_RETURN_IF_ERROR(file.ReadInt("sink.sqlite.cache_mb", &cache_mb, 1, 65536));
  c.sqlite.cache_bytes = cache_mb << 20;
  int64_t wal_mb = c.sqlite.wal_autocheckpoint_bytes >> 20;
  ATFILL_RETURN_IF_ERROR(file.ReadInt("sink.sqlite.wal_autocheckpoint_mb", &wal_mb, 1, 65536));
  c.sqlite.wal_autocheckpoint_bytes = wal_mb << 20;
  ATFILL_RETURN_IF_ERROR(
      file.ReadBool("sink.sqlite.background_checkpoint", &c.sqlite.background_checkpoint));

  auto& e = c.engine;
  ATFILL_RETURN_IF_ERROR(ReadBatch(file, "engine", &e.batch));
  ATFILL_RETURN_IF_ERROR(file.ReadUint("engine.workers", &e.workers, 0, 1024));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("engine.max_chunks_in_flight", &e.max_chunks_in_flight, 0, 1'000'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("engine.sink_retry_initial_ms", &e.sink_retry.initial_delay_ms, 1, 600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("engine.sink_retry_max_ms", &e.sink_retry.max_delay_ms, 1, 3'600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("engine.sink_retry_max_attempts", &e.sink_retry.max_attempts, 0, 1'000'000));
  std::string shard;
  ATFILL_RETURN_IF_ERROR(file.ReadString("engine.shard", &shard));
  if (!shard.empty()) {
    auto parsed = pipeline::Shard::Parse(shard);
    if (!parsed.ok()) return parsed.status().WithContext(file.Where("engine.shard"));
    c.shard = *parsed;
  }
  if (ShardOverride()) c.shard = *ShardOverride();

  ATFILL_RETURN_IF_ERROR(file.ReadUint("files.chunk_lines", &c.files.chunk_lines, 1, 1'000'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("files.max_line_bytes", &c.files.max_line_bytes, 64, 1 << 30));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("stages.verify_cids", &c.verify_cids));
  auto& sc = c.scripts;
  ATFILL_RETURN_IF_ERROR(file.ReadPathTable("scripts.collections", &sc.scripts));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("scripts.fail_open", &sc.fail_open));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("scripts.instruction_budget", &sc.instruction_budget, 1000, INT32_MAX));
  int64_t script_mb = static_cast<int64_t>(sc.memory_limit_bytes >> 20);
  ATFILL_RETURN_IF_ERROR(file.ReadInt("scripts.memory_mb", &script_mb, 1, 65536));
  sc.memory_limit_bytes = static_cast<size_t>(script_mb) << 20;
  ATFILL_RETURN_IF_ERROR(file.ReadUint("scripts.attempts", &sc.max_attempts, 1, 100));
  int64_t call_timeout_ms = sc.call_timeout.count();
  ATFILL_RETURN_IF_ERROR(file.ReadInt("scripts.call_timeout_ms", &call_timeout_ms, 10, 3'600'000));
  sc.call_timeout = std::chrono::milliseconds(call_timeout_ms);

  auto& k = c.crawl;
  ATFILL_RETURN_IF_ERROR(file.ReadString("crawl.relay", &k.relay_url));
  std::string discovery(sources::DiscoveryName(k.discovery));
  ATFILL_RETURN_IF_ERROR(
      file.ReadEnum("crawl.discovery", &discovery, {"listReposByCollection", "listRepos", "dids"}));
  k.discovery = *sources::ParseDiscovery(discovery);
  std::string mode(sources::FetchModeName(k.mode));
  ATFILL_RETURN_IF_ERROR(file.ReadEnum("crawl.mode", &mode, {"listRecords", "getRepo"}));
  k.mode = *sources::ParseFetchMode(mode);
  ATFILL_RETURN_IF_ERROR(file.ReadStringList("crawl.collections", &k.collections));
  ATFILL_RETURN_IF_ERROR(
      file.ReadEnum("crawl.source", &c.backfill_source, {"crawl", "auto", "replay"}));
  ATFILL_RETURN_IF_ERROR(file.ReadPath("archive.dir", &c.archive_dir));
  ATFILL_RETURN_IF_ERROR(file.ReadString("archive.url", &c.archive_url));
  ATFILL_RETURN_IF_ERROR(file.ReadString("archive.key", &c.archive_key));
  c.archive_replay_dir = c.state.path + "/replay";
  ATFILL_RETURN_IF_ERROR(file.ReadPath("archive.replay_dir", &c.archive_replay_dir));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("archive.spool_segments", &c.archive_spool_segments));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("archive.spool_chunk_kb", &c.archive_spool_chunk_kb, 1, 1 << 20));
  if (const char* key = std::getenv("ATFILL_ARCHIVE_KEY"); key != nullptr && *key != '\0') {
    c.archive_key = key;
  }
  if (!c.archive_url.empty() && !c.archive_url.starts_with("http://") &&
      !c.archive_url.starts_with("https://")) {
    return Status::Invalid(path + ": [archive] url '" + c.archive_url +
                           "' is not an http:// or https:// address");
  }
  if (file.Has("archive.retry_delays_ms")) {
    // ConfigFile reads no integer list: the elements are read one by one ("key[0]", ...). The
    // string-list read marks the key itself read; it succeeds only on an empty array.
    const std::string key = "archive.retry_delays_ms";
    std::vector<std::string> strings;
    const bool empty = file.ReadStringList(key, &strings).ok() && strings.empty();
    if (!empty && !file.Has(key + "[0]")) {
      return Status::Invalid(file.Where(key) + " must be an array of integers (milliseconds)");
    }
    std::vector<int64_t> delays;
    for (size_t i = 0; file.Has(key + "[" + std::to_string(i) + "]"); ++i) {
      if (i == 100) return Status::Invalid(file.Where(key) + " holds more than 100 delays");
      int64_t ms = 0;
      ATFILL_RETURN_IF_ERROR(file.ReadInt(key + "[" + std::to_string(i) + "]", &ms, 0, 86'400'000));
      delays.push_back(ms);
    }
    c.archive_retry_delays_ms = std::move(delays);
  }
  ATFILL_RETURN_IF_ERROR(file.ReadDouble("archive.replay_marker_tail_hours",
                                         &c.replay.marker_tail_hours, 0, 24.0 * 365 * 100));
  int64_t block_mb = static_cast<int64_t>(c.replay.max_block_bytes >> 20);
  ATFILL_RETURN_IF_ERROR(file.ReadInt("archive.max_block_mb", &block_mb, 1, 4096));
  c.replay.max_block_bytes = static_cast<uint64_t>(block_mb) << 20;
  ATFILL_RETURN_IF_ERROR(ReadBatch(file, "archive", &c.replay_batch));
  ATFILL_RETURN_IF_ERROR(ReadBatch(file, "crawl", &c.crawl_batch));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("crawl.bulk_load", &c.crawl_bulk_load));
  int64_t replay_wal_mb = c.replay_sqlite_wal_bytes >> 20;
  ATFILL_RETURN_IF_ERROR(file.ReadInt("archive.sqlite_wal_mb", &replay_wal_mb, 1, 65536));
  c.replay_sqlite_wal_bytes = replay_wal_mb << 20;
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("archive.max_failed_in_a_row", &c.replay.max_failed_in_a_row, 1, 1'000'000));
  ATFILL_RETURN_IF_ERROR(file.ReadStringList("crawl.dids", &k.dids));
  ATFILL_RETURN_IF_ERROR(file.ReadUint("crawl.list_repos_limit", &k.list_repos_limit, 1, 1000));
  ATFILL_RETURN_IF_ERROR(file.ReadUint("crawl.list_records_limit", &k.list_records_limit, 1, 100));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("crawl.discovery_window", &k.discovery_window, 1, 100'000'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("crawl.max_active_units", &k.max_active_units, 0, 1'000'000));
  ATFILL_RETURN_IF_ERROR(file.ReadUint("crawl.unit_attempts", &k.unit_attempts, 1, 100));
  ATFILL_RETURN_IF_ERROR(file.ReadInt("crawl.retry_delay_ms", &k.retry_delay_ms, 0, 3'600'000));
  ATFILL_RETURN_IF_ERROR(file.ReadUint("crawl.recent_repos", &k.recent_repos, 1, 1'000'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("crawl.max_record_bytes", &k.limits.max_record_bytes, 64, 1 << 30));
  ATFILL_RETURN_IF_ERROR(
      file.ReadBool("crawl.allow_loopback_endpoints", &k.allow_loopback_endpoints));
  ATFILL_RETURN_IF_ERROR(
      file.ReadBool("crawl.allow_private_endpoints", &k.allow_private_endpoints));
  ATFILL_RETURN_IF_ERROR(file.ReadString("resolver.plc", &k.resolver.plc_url));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("resolver.cache_ttl_s", &k.resolver.cache_ttl_s, 0, 365 * 86'400));
  ATFILL_RETURN_IF_ERROR(file.ReadInt("resolver.timeout_ms", &k.resolver.timeout_ms, 100, 600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("resolver.max_in_flight", &k.resolver_http.max_per_host, 1, 1000));
  ATFILL_RETURN_IF_ERROR(file.ReadUint("net.max_hosts", &k.http.max_hosts, 1, 100'000));
  ATFILL_RETURN_IF_ERROR(file.ReadUint("net.per_host", &k.http.max_per_host, 1, 1000));
  ATFILL_RETURN_IF_ERROR(file.ReadUint("net.max_in_flight", &k.http.max_in_flight, 1, 100'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("net.connect_timeout_ms", &k.http.connect_timeout_ms, 100, 600'000));
  ATFILL_RETURN_IF_ERROR(file.ReadInt("net.timeout_ms", &k.http.timeout_ms, 100, 3'600'000));
  int64_t max_response_mb = static_cast<int64_t>(k.http.max_response_bytes >> 20);
  ATFILL_RETURN_IF_ERROR(file.ReadInt("net.max_response_mb", &max_response_mb, 1, 65536));
  k.http.max_response_bytes = static_cast<uint64_t>(max_response_mb) << 20;
  ATFILL_RETURN_IF_ERROR(file.ReadUint("net.retries", &k.http.retry.max_attempts, 1, 100));
  ATFILL_RETURN_IF_ERROR(file.ReadInt("net.host_down_ms", &k.http.host_down_ms, 0, 86'400'000));
  ATFILL_RETURN_IF_ERROR(file.ReadString("net.user_agent", &k.http.user_agent));
  k.resolver_http.user_agent = k.http.user_agent;

  auto& l = c.live;
  ATFILL_RETURN_IF_ERROR(file.ReadStringList("live.hosts", &l.hosts));
  std::string protocol(sources::JetstreamProtocolName(l.protocol));
  ATFILL_RETURN_IF_ERROR(file.ReadEnum("live.protocol", &protocol, {"auto", "v2", "v1"}));
  l.protocol = *sources::ParseJetstreamProtocol(protocol);
  ATFILL_RETURN_IF_ERROR(file.ReadStringList("live.collections", &l.collections));
  ATFILL_RETURN_IF_ERROR(file.ReadStringList("live.dids", &l.dids));
  ATFILL_RETURN_IF_ERROR(file.ReadUint("live.start_seq", &l.start_seq, 0, INT64_MAX));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("live.compress", &l.compress));
  ATFILL_RETURN_IF_ERROR(file.ReadPath("live.v1_dictionary", &l.v1_dictionary_path));
  int64_t message_mb = static_cast<int64_t>(l.max_message_bytes >> 20);
  ATFILL_RETURN_IF_ERROR(file.ReadInt("live.max_message_mb", &message_mb, 1, 1024));
  l.max_message_bytes = static_cast<uint64_t>(message_mb) << 20;
  int64_t buffered_mb = static_cast<int64_t>(l.max_buffered_bytes >> 20);
  ATFILL_RETURN_IF_ERROR(file.ReadInt("live.max_buffered_mb", &buffered_mb, 1, 65536));
  l.max_buffered_bytes = static_cast<uint64_t>(buffered_mb) << 20;
  ATFILL_RETURN_IF_ERROR(file.ReadUint("live.chunk_messages", &l.chunk_messages, 1, 1'000'000));
  ATFILL_RETURN_IF_ERROR(file.ReadInt("live.idle_exit_ms", &l.idle_exit_ms, 0, 86'400'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadBool("live.allow_private_endpoints", &c.live_allow_private_endpoints));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("live.reconnect_base_ms", &l.websocket.reconnect.base_backoff_ms, 1, 3'600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("live.reconnect_max_ms", &l.websocket.reconnect.max_backoff_ms, 1, 3'600'000));
  ATFILL_RETURN_IF_ERROR(file.ReadUint("live.failover_after",
                                       &l.websocket.reconnect.failures_before_failover, 1, 1000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("live.idle_timeout_ms", &l.websocket.idle_timeout_ms, 0, 3'600'000));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("live.check_deleted_accounts", &c.check_deleted_accounts));
  ATFILL_RETURN_IF_ERROR(ReadBatch(file, "live", &c.live_batch));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("live.account_check_timeout_ms", &c.account_check.timeout_ms, 1, 600'000));
  k.resolver_http.connect_timeout_ms = k.http.connect_timeout_ms;
  ATFILL_RETURN_IF_ERROR(file.ReadBool("jobs.record_batches", &c.jobs.record_batches));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("jobs.error_log_cap", &c.error_log.max_entries_per_job, 1, 100'000'000));
  int64_t retention_hours = c.tombstones.retention_us / 3'600'000'000;
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("tombstones.retention_hours", &retention_hours, 1, 24 * 365 * 10));
  c.tombstones.retention_us = retention_hours * 3'600'000'000;
  ATFILL_RETURN_IF_ERROR(
      file.ReadDouble("progress.interval_s", &c.progress_interval_s, 0.1, 86'400));
  ATFILL_RETURN_IF_ERROR(
      file.ReadDouble("jobs.backfill_retention_days", &c.backfill_retention_days, 0, 36'500));
  c.admin_enabled = file.Has("admin.port");
  ATFILL_RETURN_IF_ERROR(file.ReadString("admin.address", &c.admin.address));
  ATFILL_RETURN_IF_ERROR(file.ReadUint("admin.port", &c.admin.port, 0, 65535));
  ATFILL_RETURN_IF_ERROR(file.ReadString("admin.token", &c.admin.token));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("admin.sse_interval_ms", &c.admin.sse_interval_ms, 10, 60'000));
  if (c.admin.token.empty()) {
    if (const char* token = std::getenv("ATFILL_ADMIN_TOKEN")) c.admin.token = token;
  }
  ATFILL_RETURN_IF_ERROR(file.Finish());
  c.crawl.shard = c.shard;
  c.replay.shard = c.shard;

  // Cross-field rules; the message names the section.
  if (Status s = c.engine.Validate(); !s.ok()) return s.WithContext(path + ": [engine]");
  if (Status s = c.live_batch.Validate(); !s.ok()) return s.WithContext(path + ": [live]");
  if (Status s = c.crawl_batch.Validate(); !s.ok()) return s.WithContext(path + ": [crawl]");
  if (Status s = c.sqlite.Validate(); !s.ok()) return s.WithContext(path + ": [sink.sqlite]");
  if (Status s = c.postgres.Validate(); !s.ok()) return s.WithContext(path + ": [sink.postgres]");
  if (Status s = c.state.Validate(); !s.ok()) return s.WithContext(path + ": [state]");
  if (Status s = c.error_log.Validate(); !s.ok()) return s.WithContext(path + ": [jobs]");
  if (Status s = c.tombstones.Validate(); !s.ok()) return s.WithContext(path + ": [tombstones]");
  if (Status s = c.replay.Validate(); !s.ok()) return s.WithContext(path + ": [archive]");
  if (Status s = c.scripts.Validate(); !s.ok()) return s.WithContext(path + ": [scripts]");
  if (c.admin_enabled) {
    if (c.admin.token.empty()) {
      return Status::Invalid(path +
                             ": [admin] needs a token (token = \"...\" or the environment's "
                             "ATFILL_ADMIN_TOKEN): the admin API never runs open");
    }
    if (Status s = c.admin.Validate(); !s.ok()) return s.WithContext(path + ": [admin]");
  }
  if (Status s = c.replay_batch.Validate(); !s.ok()) return s.WithContext(path + ": [archive]");
  if (c.backfill_source == "replay" && c.archive_dir.empty() && c.archive_url.empty()) {
    return Status::Invalid(
        path + ": [crawl] source = \"replay\" needs an archive: set [archive] url or dir");
  }
  return c;
}

}  // namespace atfill::cli
