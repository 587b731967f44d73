#include "sources/components.hpp"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "net/http_client.hpp"
#include "pipeline/run.hpp"
#include "sources/archive/archive_http.hpp"
#include "sources/crawl/pds_account_status.hpp"
#include "sources/crawl/resolver.hpp"
#include "state/resolver_cache.hpp"

namespace atfill::sources {

std::string ArchiveLocation(const SourceSettings& settings) {
  if (!settings.archive_dir.empty()) {
    return std::filesystem::absolute(settings.archive_dir).string();
  }
  return settings.archive_url;
}

Result<std::unique_ptr<Archive>> OpenArchive(const SourceSettings& settings,
                                             const std::string& location, bool probe) {
  if (location.starts_with("http://") || location.starts_with("https://")) {
    HttpArchiveOptions o;
    o.base_url = location;
    o.key = settings.archive_key;
    // [archive] url, or the archive of one of [live]'s hosts: the operator's, so reached
    // wherever it points (loopback and private networks included).
    o.allow_private_addresses = true;
    o.user_agent = settings.crawl.http.user_agent;
    if (settings.archive_spool_segments) o.spool_dir = settings.archive_replay_dir;
    o.spool_chunk_bytes = settings.archive_spool_chunk_kb << 10;
    if (settings.archive_retry_delays_ms) o.retry_delays_ms = *settings.archive_retry_delays_ms;
    if (probe) {
      o.retry_delays_ms = {250, 750};
      o.unavailable_retries = 1;
      o.max_throttled_ms = 10'000;
      o.connect_timeout_ms = 5'000;
      o.request_timeout_ms = 15'000;
    }
    ATFILL_ASSIGN_OR_RETURN(auto archive, HttpArchive::Open(std::move(o)));
    return std::unique_ptr<Archive>(std::move(archive));
  }
  ATFILL_ASSIGN_OR_RETURN(auto archive, LocalArchive::Open(location));
  return std::unique_ptr<Archive>(std::move(archive));
}

namespace {

// The record type of the lexicons accounts publish (its record key is the NSID it defines).
constexpr const char* kLexiconSchemaNsid = "com.atproto.lexicon.schema";

using pipeline::ConfigFile;

// [archive] retry_delays_ms: ConfigFile reads no integer list, so the elements are read one by one
// ("key[0]", ...). The string-list read marks the key itself read; it succeeds only on an empty
// array.
Status ReadRetryDelays(ConfigFile& file, std::optional<std::vector<int64_t>>* out) {
  const std::string key = "archive.retry_delays_ms";
  if (!file.Has(key)) return Status::OK();
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
  *out = std::move(delays);
  return Status::OK();
}

Status ReadArchive(ConfigFile& file, const pipeline::CoreSettings& core, SourceSettings& c) {
  ATFILL_RETURN_IF_ERROR(file.ReadPath("archive.dir", &c.archive_dir));
  ATFILL_RETURN_IF_ERROR(file.ReadString("archive.url", &c.archive_url));
  ATFILL_RETURN_IF_ERROR(file.ReadString("archive.key", &c.archive_key));
  c.archive_replay_dir = core.state.path + "/replay";
  ATFILL_RETURN_IF_ERROR(file.ReadPath("archive.replay_dir", &c.archive_replay_dir));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("archive.spool_segments", &c.archive_spool_segments));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("archive.spool_chunk_kb", &c.archive_spool_chunk_kb, 1, 1 << 20));
  if (const char* key = std::getenv("ATFILL_ARCHIVE_KEY"); key != nullptr && *key != '\0') {
    c.archive_key = key;
  }
  if (!c.archive_url.empty() && !c.archive_url.starts_with("http://") &&
      !c.archive_url.starts_with("https://")) {
    return Status::Invalid(file.source_name() + ": [archive] url '" + c.archive_url +
                           "' is not an http:// or https:// address");
  }
  ATFILL_RETURN_IF_ERROR(ReadRetryDelays(file, &c.archive_retry_delays_ms));
  ATFILL_RETURN_IF_ERROR(file.ReadDouble("archive.replay_marker_tail_hours",
                                         &c.replay.marker_tail_hours, 0, 24.0 * 365 * 100));
  int64_t block_mb = static_cast<int64_t>(c.replay.max_block_bytes >> 20);
  ATFILL_RETURN_IF_ERROR(file.ReadInt("archive.max_block_mb", &block_mb, 1, 4096));
  c.replay.max_block_bytes = static_cast<uint64_t>(block_mb) << 20;
  ATFILL_RETURN_IF_ERROR(pipeline::ReadBatchOptions(file, "archive", &c.replay_batch));
  int64_t replay_wal_mb = c.replay_sqlite_wal_bytes >> 20;
  ATFILL_RETURN_IF_ERROR(file.ReadInt("archive.sqlite_wal_mb", &replay_wal_mb, 1, 65536));
  c.replay_sqlite_wal_bytes = replay_wal_mb << 20;
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("archive.prefetch_blocks", &c.replay.prefetch_blocks, 1, 256));
  return file.ReadUint("archive.max_failed_in_a_row", &c.replay.max_failed_in_a_row, 1, 1'000'000);
}

Status ReadCrawl(ConfigFile& file, SourceSettings& c) {
  CrawlOptions& k = c.crawl;
  ATFILL_RETURN_IF_ERROR(file.ReadString("crawl.relay", &k.relay_url));
  std::string discovery(DiscoveryName(k.discovery));
  ATFILL_RETURN_IF_ERROR(
      file.ReadEnum("crawl.discovery", &discovery, {"listReposByCollection", "listRepos", "dids"}));
  k.discovery = *ParseDiscovery(discovery);
  std::string mode(FetchModeName(k.mode));
  ATFILL_RETURN_IF_ERROR(file.ReadEnum("crawl.mode", &mode, {"listRecords", "getRepo"}));
  k.mode = *ParseFetchMode(mode);
  ATFILL_RETURN_IF_ERROR(file.ReadStringList("crawl.collections", &k.collections));
  ATFILL_RETURN_IF_ERROR(
      file.ReadEnum("crawl.source", &c.backfill_source, {"crawl", "auto", "replay"}));
  ATFILL_RETURN_IF_ERROR(pipeline::ReadBatchOptions(file, "crawl", &c.crawl_batch));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("crawl.bulk_load", &c.crawl_bulk_load));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("crawl.incremental", &c.crawl.incremental));
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
  k.resolver_http.connect_timeout_ms = k.http.connect_timeout_ms;
  return Status::OK();
}

Status ReadLive(ConfigFile& file, SourceSettings& c) {
  JetstreamOptions& l = c.live;
  ATFILL_RETURN_IF_ERROR(file.ReadStringList("live.hosts", &l.hosts));
  std::string protocol(JetstreamProtocolName(l.protocol));
  ATFILL_RETURN_IF_ERROR(
      file.ReadEnum("live.protocol", &protocol, {"auto", "v2", "v1", "firehose"}));
  c.live_firehose = protocol == "firehose";
  l.protocol = c.live_firehose ? JetstreamProtocol::kAuto : *ParseJetstreamProtocol(protocol);
  FirehoseOptions& f = c.firehose;
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("live.max_resyncs_in_flight", &f.max_resyncs_in_flight, 1, 10'000));
  ATFILL_RETURN_IF_ERROR(file.ReadInt("live.resync_retry_ms", &f.resync_retry_ms, 1, 86'400'000));
  // Verification runs on the engine's workers ([engine] workers); the key of configs written for
  // the firehose's own verify threads is still taken.
  uint32_t verify_threads = 0;
  ATFILL_RETURN_IF_ERROR(file.ReadUint("live.verify_threads", &verify_threads, 1, 64));
  uint64_t waiting_mb = f.max_waiting_bytes >> 20;
  ATFILL_RETURN_IF_ERROR(file.ReadUint("live.max_waiting_mb", &waiting_mb, 1, 1'000'000));
  f.max_waiting_bytes = waiting_mb << 20;
  ATFILL_RETURN_IF_ERROR(file.ReadStringList("live.collections", &l.collections));
  // [lexicons] track_network: the live consumer also takes the lexicons the network publishes
  // (their records land as any other; the sinks' atfill_lexicons view names them).
  bool track_lexicons = false;
  ATFILL_RETURN_IF_ERROR(file.ReadBool("lexicons.track_network", &track_lexicons));
  if (track_lexicons && !pipeline::CollectionMatches(kLexiconSchemaNsid, l.collections)) {
    l.collections.emplace_back(kLexiconSchemaNsid);
  }
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
  auto& reconnect = l.websocket.reconnect;
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("live.reconnect_base_ms", &reconnect.base_backoff_ms, 1, 3'600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("live.reconnect_max_ms", &reconnect.max_backoff_ms, 1, 3'600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("live.failover_after", &reconnect.failures_before_failover, 1, 1000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("live.idle_timeout_ms", &l.websocket.idle_timeout_ms, 0, 3'600'000));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("live.check_deleted_accounts", &c.check_deleted_accounts));
  return pipeline::ReadBatchOptions(file, "live", &c.live_batch);
}

// [labels]: the labelers followed beside the live consumer (sources/labels/labeler.hpp). Their DID
// documents come from [resolver]'s PLC directory, over [net]'s HTTP settings.
Status ReadLabels(ConfigFile& file, SourceSettings& c) {
  LabelerOptions& l = c.labels;
  ATFILL_RETURN_IF_ERROR(file.ReadStringList("labels.labelers", &l.labelers));
  ATFILL_RETURN_IF_ERROR(file.ReadUint("labels.batch_labels", &l.batch_labels, 1, 1'000'000));
  ATFILL_RETURN_IF_ERROR(file.ReadInt("labels.batch_ms", &l.batch_ms, 1, 3'600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("labels.max_pending_labels", &l.max_pending_labels, 1, 100'000'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadBool("labels.allow_private_endpoints", &l.allow_private_endpoints));
  ATFILL_RETURN_IF_ERROR(file.ReadInt("labels.idle_exit_ms", &l.idle_exit_ms, 0, 86'400'000));
  ATFILL_RETURN_IF_ERROR(file.ReadInt("labels.idle_timeout_ms", &l.idle_timeout_ms, 0, 3'600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("labels.reconnect_base_ms", &l.reconnect.base_backoff_ms, 1, 3'600'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadInt("labels.reconnect_max_ms", &l.reconnect.max_backoff_ms, 1, 3'600'000));
  l.resolver = c.crawl.resolver;
  l.http = c.crawl.resolver_http;
  if (Status s = l.Validate(); !s.ok()) return s.WithContext(file.source_name());
  return Status::OK();
}

// [verify]: the verify jobs `atfill run` starts on its own (sources/verify_schedule.hpp).
Status ReadVerify(ConfigFile& file, SourceSettings& c) {
  VerifyScheduleOptions& v = c.verify;
  // Fractions allowed (0.5 = every 30 minutes); the smallest is a few seconds, for tests.
  ATFILL_RETURN_IF_ERROR(file.ReadDouble("verify.every_hours", &v.every_hours, 0, 24.0 * 366));
  ATFILL_RETURN_IF_ERROR(file.ReadBool("verify.repair", &v.targets.repair));
  ATFILL_RETURN_IF_ERROR(file.ReadStringList("verify.collections", &v.targets.collections));
  if (v.every_hours > 0 && v.every_hours * 3600 < 1) {
    return Status::Invalid(file.source_name() +
                           ": [verify] every_hours must be 0 (off) or at least 1 second");
  }
  return Status::OK();
}

Status ReadSourceConfig(ConfigFile& file, pipeline::Settings& settings) {
  SourceSettings& c = settings.Mutable<SourceSettings>();
  ATFILL_RETURN_IF_ERROR(file.ReadUint("files.chunk_lines", &c.files.chunk_lines, 1, 1'000'000));
  ATFILL_RETURN_IF_ERROR(
      file.ReadUint("files.max_line_bytes", &c.files.max_line_bytes, 64, 1 << 30));
  ATFILL_RETURN_IF_ERROR(pipeline::ReadBatchOptions(file, "files", &c.files_batch));
  int64_t files_wal_mb = c.files_sqlite_wal_bytes >> 20;
  ATFILL_RETURN_IF_ERROR(file.ReadInt("files.sqlite_wal_mb", &files_wal_mb, 1, 65536));
  c.files_sqlite_wal_bytes = files_wal_mb << 20;
  ATFILL_RETURN_IF_ERROR(ReadCrawl(file, c));
  ATFILL_RETURN_IF_ERROR(ReadArchive(file, settings.Get<pipeline::CoreSettings>(), c));
  ATFILL_RETURN_IF_ERROR(ReadLive(file, c));
  ATFILL_RETURN_IF_ERROR(ReadLabels(file, c));
  ATFILL_RETURN_IF_ERROR(ReadVerify(file, c));
  const std::string& path = file.source_name();
  if (Status s = c.files_batch.Validate(); !s.ok()) return s.WithContext(path + ": [files]");
  if (Status s = c.live_batch.Validate(); !s.ok()) return s.WithContext(path + ": [live]");
  if (Status s = c.crawl_batch.Validate(); !s.ok()) return s.WithContext(path + ": [crawl]");
  if (Status s = c.replay.Validate(); !s.ok()) return s.WithContext(path + ": [archive]");
  if (Status s = c.replay_batch.Validate(); !s.ok()) return s.WithContext(path + ": [archive]");
  if (c.backfill_source == "replay" && c.archive_dir.empty() && c.archive_url.empty()) {
    return Status::Invalid(
        path + ": [crawl] source = \"replay\" needs an archive: set [archive] url or dir");
  }
  return Status::OK();
}

const SourceSettings& Of(const pipeline::Environment& env) {
  return env.settings->Get<SourceSettings>();
}
const pipeline::Shard& ShardOf(const pipeline::Environment& env) {
  return env.settings->Get<pipeline::CoreSettings>().shard;
}

// What the factories return for a job this build or config cannot run (the launcher's usage
// exit), as opposed to what was unavailable (its I/O exit).
Status Unrunnable(const state::JobRecord& job, const Status& s) {
  return Status::Invalid("job " + std::to_string(job.id) + ": " + s.message());
}

// A replay job: the job's collections read from its archive (sources/archive/replay.hpp).
Status PlanReplay(const pipeline::Environment& env, pipeline::PlanDraft& draft) {
  const SourceSettings& settings = Of(env);
  state::JobRecord& job = *draft.job;
  auto archive = OpenArchive(settings, draft.Param("archive"));
  if (!archive.ok()) {
    return Status::IoError("job " + std::to_string(job.id) + ": " + archive.status().message());
  }
  Archive* reader = draft.Keep(std::move(*archive));
  ReplayOptions options = settings.replay;
  options.shard = ShardOf(env);
  options.collections = pipeline::SplitLines(draft.Param("collections"));
  options.only_blocks = pipeline::SplitLines(draft.Param("blocks"));
  options.after_seq = std::strtoull(draft.Param("after_seq").c_str(), nullptr, 10);
  options.before_seq = std::strtoull(draft.Param("before_seq").c_str(), nullptr, 10);
  options.all_markers = draft.Param("gap") == "1";
  if (!draft.Param("retry_of").empty()) {
    options.retry_of = std::strtoull(draft.Param("retry_of").c_str(), nullptr, 10);
  }
  // A replay checkpoints the SQLite WAL less often than other jobs ([archive] sqlite_wal_mb).
  draft.sink_hints.wal_autocheckpoint_bytes = settings.replay_sqlite_wal_bytes;
  draft.plan->source = draft.Keep(std::make_unique<ReplaySource>(reader, options, job.id, env.kv));
  draft.plan->cursor_name = "job/" + std::to_string(job.id) + "/replay";
  draft.plan->batch = settings.replay_batch;
  draft.plan->after = [reader, env](const state::JobRecord&) {
    if (const auto* http = dynamic_cast<const HttpArchive*>(reader)) {
      const HttpArchiveStats s = http->stats();
      char line[320];
      std::snprintf(line, sizeof(line),
                    "atfill: archive: %" PRIu64 " requests (%" PRIu64 " retried, %" PRIu64
                    " throttled), %.1f MB, %" PRIu64 " segments spooled (%" PRIu64
                    " blocks read from them, %" PRIu64 " spool failures)",
                    s.requests, s.retries, s.throttled, static_cast<double>(s.bytes) / 1e6,
                    s.spooled_segments, s.spooled_blocks, s.spool_failures);
      env.Log(line);
    }
  };
  return Status::OK();
}

// A crawl job: the settings' network options with the job's own targets.
Status PlanCrawl(const pipeline::Environment& env, pipeline::PlanDraft& draft) {
  const SourceSettings& settings = Of(env);
  state::JobRecord& job = *draft.job;
  CrawlOptions crawl = settings.crawl;
  crawl.shard = ShardOf(env);
  crawl.relay_url = draft.Param("relay");
  auto discovery = ParseDiscovery(draft.Param("discovery"));
  if (!discovery.ok()) return Unrunnable(job, discovery.status());
  crawl.discovery = *discovery;
  auto mode = ParseFetchMode(draft.Param("mode"));
  if (!mode.ok()) return Unrunnable(job, mode.status());
  crawl.mode = *mode;
  crawl.collections = pipeline::SplitLines(draft.Param("collections"));
  crawl.dids = pipeline::SplitLines(draft.Param("dids"));
  crawl.hold_live = draft.ctx->hold_live;
  draft.sink_hints.bulk_load = settings.crawl_bulk_load && !draft.ctx->hold_live;
  auto source = CrawlSource::Create(crawl, job.id, env.kv,
                                    env.components->Readers(*env.settings).repo_records);
  if (!source.ok()) return Status::Invalid(source.status().message());
  draft.plan->source = draft.Keep(std::move(*source));
  draft.plan->cursor_name = "job/" + std::to_string(job.id) + "/crawl";
  draft.plan->batch = settings.crawl_batch;
  return Status::OK();
}

// A verify job: the repos it names (or every stored one) compared with their PDSs, and repaired
// when asked (sources/verify/verify_source.hpp), over the [crawl] network options.
Status PlanVerify(const pipeline::Environment& env, pipeline::PlanDraft& draft) {
  const SourceSettings& settings = Of(env);
  state::JobRecord& job = *draft.job;
  VerifyOptions options;
  options.net = settings.crawl;
  options.dids = pipeline::SplitLines(draft.Param("dids"));
  options.collections = pipeline::SplitLines(draft.Param("collections"));
  options.repair = draft.Param("repair") == "true";
  auto source =
      VerifySource::Create(std::move(options), env.components->Readers(*env.settings), env.kv);
  if (!source.ok()) return Unrunnable(job, source.status());
  draft.plan->source = draft.Keep(std::move(*source));
  draft.plan->cursor_name = "job/" + std::to_string(job.id) + "/verify";
  return Status::OK();
}

// An ingest job: its event files, into the sink (or the dry-run sink).
Status PlanFiles(const pipeline::Environment& env, pipeline::PlanDraft& draft) {
  state::JobRecord& job = *draft.job;
  draft.sink_hints.dry_run = draft.Param("dry_run") == "true";
  EventFileOptions options = Of(env).files;
  options.paths = pipeline::SplitLines(draft.Param("files"));
  auto source = EventFileSource::Open(options);
  if (!source.ok()) return Status::IoError(source.status().message());
  job.counters.extra[pipeline::kInputTotal] = (*source)->total_bytes();
  draft.plan->source = draft.Keep(std::move(*source));
  draft.plan->cursor_name = "job/" + std::to_string(job.id) + "/file";
  draft.plan->batch = Of(env).files_batch;
  draft.sink_hints.wal_autocheckpoint_bytes = Of(env).files_sqlite_wal_bytes;
  return Status::OK();
}

// The archive XRPC base of a Jetstream host ("ws://h:1/" -> "http://h:1"); empty for another
// scheme.
std::string ArchiveOfHost(const std::string& host) {
  std::string location;
  if (host.starts_with("ws://")) location = "http://" + host.substr(5);
  if (host.starts_with("wss://")) location = "https://" + host.substr(6);
  while (!location.empty() && location.back() == '/') location.pop_back();
  return location;
}

// A gap of the live consumer (JetstreamOptions::gap_replay): a CursorTooOld becomes a replay job
// of the stream's gap, (last seq, the archive's sealed tip], from [archive] url or dir, else the
// host's own archive (its ws:// address as http://), run in `gaps` beside the consumer.
Result<JetstreamOptions::GapReplay> StartGapReplay(const pipeline::Environment& env,
                                                   pipeline::JobGroup& gaps, uint64_t last_seq,
                                                   const std::string& host) {
  const SourceSettings& settings = Of(env);
  std::string location = ArchiveLocation(settings);
  if (location.empty()) location = ArchiveOfHost(host);  // the host serves its own archive
  if (location.empty()) return Status::Invalid("no archive is configured ([archive] url or dir)");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  ATFILL_ASSIGN_OR_RETURN(auto archive, OpenArchive(settings, location, /*probe=*/true));
  ATFILL_ASSIGN_OR_RETURN(LiveCollections * collections, LiveCollectionsOf(env));
  const std::vector<std::string> now = collections->Current();
  PlanRequest request;
  request.collections = now;
  request.after_seq = last_seq;
  auto plan = archive->PlanSnapshot(request);
  if (!plan.ok()) return plan.status().WithContext("planning the gap at " + location);
  if (std::chrono::steady_clock::now() > deadline) {
    return Status::Unavailable("the archive " + location + " took more than 30 s to plan the gap");
  }
  if (plan->sealed_tip <= last_seq) {
    return Status::NotFound("the archive " + location + " has sealed nothing after seq " +
                            std::to_string(last_seq));
  }
  state::JobRecord job =
      pipeline::NewJobRecord("backfill", state::JobStage::kReplaying, "live gap");
  job.params = {{"config", std::filesystem::absolute(env.settings->path).string()},
                {"source", "replay"},
                {"archive", location},
                {"collections", pipeline::JoinLines(now)},
                {"after_seq", std::to_string(last_seq)},
                {"before_seq", std::to_string(plan->sealed_tip)},
                {"gap", "1"},
                {"sink", env.components->SinkLocation(*env.settings)}};
  ATFILL_ASSIGN_OR_RETURN(job, env.jobs->Create(job));
  char line[512];
  std::snprintf(line, sizeof(line),
                "atfill run: the stream's gap after seq %" PRIu64 " is replayed by job %" PRIu64
                " from %s (through seq %" PRIu64 ")",
                last_seq, job.id, location.c_str(), plan->sealed_tip);
  env.Log(line);
  // Before the stream resumes past the gap: its events are held from now on.
  ATFILL_RETURN_IF_ERROR(gaps.Start({job}));
  return JetstreamOptions::GapReplay{plan->sealed_tip, job.id};
}

// The account check asks PDSs with the crawl's resolver settings ([resolver], [net]).
Status AddAccountStatus(const pipeline::Environment& env, pipeline::PlanDraft& draft) {
  const SourceSettings& settings = Of(env);
  net::HttpClientOptions http = settings.crawl.resolver_http;
  ResolverOptions resolver = settings.crawl.resolver;
  const bool loopback = settings.live_allow_private_endpoints ||
                        settings.crawl.allow_loopback_endpoints ||
                        settings.crawl.allow_private_endpoints;
  http.allow_private_addresses = loopback;
  resolver.allow_loopback_endpoints = loopback;
  resolver.allow_private_endpoints =
      settings.live_allow_private_endpoints || settings.crawl.allow_private_endpoints;
  auto started = net::HttpClient::Start(http);
  if (!started.ok()) return Status::Invalid(started.status().message());
  // Made in this order, released in the reverse: the cache outlives the client's callbacks.
  auto* cache = draft.Keep(std::make_unique<state::ResolverCache>(*env.kv));
  auto* client = draft.Keep(std::move(*started));
  auto* resolve = draft.Keep(std::make_unique<DidResolver>(client, cache, resolver));
  draft.account_status = draft.Keep(std::make_unique<PdsAccountStatus>(resolve, client));
  return Status::OK();
}

// The live consumer with [live] protocol = "firehose": a relay firehose, every commit verified,
// into the sink.
Status PlanFirehose(const pipeline::Environment& env, pipeline::PlanDraft& draft) {
  const SourceSettings& settings = Of(env);
  const JetstreamOptions& live = settings.live;
  FirehoseOptions o = settings.firehose;
  o.hosts = live.hosts;
  ATFILL_ASSIGN_OR_RETURN(LiveCollections * collections, LiveCollectionsOf(env));
  o.collections = collections->Current();
  o.dids = live.dids;
  o.start_seq = live.start_seq;
  o.max_message_bytes = live.max_message_bytes;
  o.max_buffered_bytes = live.max_buffered_bytes;
  o.chunk_messages = live.chunk_messages;
  o.tick_ms = live.tick_ms;
  o.idle_exit_ms = live.idle_exit_ms;
  o.websocket = live.websocket;
  o.limits = settings.crawl.limits;
  // Keys and PDSs come from DID documents, so their endpoints are checked as the crawl's are.
  o.http = settings.crawl.resolver_http;
  o.resolver = settings.crawl.resolver;
  const bool loopback = settings.live_allow_private_endpoints ||
                        settings.crawl.allow_loopback_endpoints ||
                        settings.crawl.allow_private_endpoints;
  o.http.allow_private_addresses = loopback;
  o.resolver.allow_loopback_endpoints = loopback;
  o.resolver.allow_private_endpoints =
      settings.live_allow_private_endpoints || settings.crawl.allow_private_endpoints;
  auto source = FirehoseSource::Create(std::move(o), env.kv);
  if (!source.ok()) return Status::Invalid(source.status().message());
  FirehoseSource* stream = draft.Keep(std::move(*source));
  draft.plan->source = stream;
  // Changes made while it runs reach it, as they reach a Jetstream; released before the source.
  const uint64_t token = collections->Listen(
      [stream](const std::vector<std::string>& now) { return stream->SetCollections(now); },
      [stream](std::chrono::milliseconds timeout) { return stream->WaitFilterApplied(timeout); });
  draft.consumes = [stream](std::string_view c) { return stream->Consumes(c); };
  draft.plan->keep.push_back(std::shared_ptr<void>(
      nullptr, [collections, token](void*) { collections->Unlisten(token); }));
  if (settings.check_deleted_accounts) ATFILL_RETURN_IF_ERROR(AddAccountStatus(env, draft));
  draft.plan->cursor_name = kFirehoseCursor;
  draft.plan->batch = settings.live_batch;
  draft.plan->after = [stream, env](const state::JobRecord&) {
    const FirehoseStats s = stream->stats();
    char line[512];
    std::snprintf(line, sizeof(line),
                  "atfill run: live: firehose %s, %" PRIu64 " connection(s), %" PRIu64
                  " failed, last seq %" PRIu64 ", %" PRIu64 " commit(s) verified, %" PRIu64
                  " refused, %" PRIu64 " resync(s) started, %" PRIu64
                  " repo(s) desynchronized, %" PRIu64 " waiting for their account to be active",
                  s.host.c_str(), s.connections, s.connection_failures, s.last_seq, s.verified,
                  s.refused, s.resyncs_started, s.desynchronized, s.inactive);
    env.Log(line);
    if (!s.last_error.empty()) env.Log("atfill run: live: last connection error: " + s.last_error);
  };
  return Status::OK();
}

// The live consumer ([live]): a Jetstream into the sink.
Status PlanJetstream(const pipeline::Environment& env, pipeline::PlanDraft& draft) {
  const SourceSettings& settings = Of(env);
  if (settings.live_firehose) return PlanFirehose(env, draft);
  // With [crawl] source = auto or replay, a cursor below the host's floor (CursorTooOld) becomes a
  // replay job of the gap, run beside this consumer.
  pipeline::JobGroup* gaps = draft.ctx->beside;
  JetstreamOptions live = settings.live;
  ATFILL_ASSIGN_OR_RETURN(LiveCollections * collections, LiveCollectionsOf(env));
  live.collections = collections->Current();
  if (settings.backfill_source != "crawl" && gaps != nullptr) {
    live.gap_replay = [env, gaps](uint64_t last_seq, const std::string& host) {
      return StartGapReplay(env, *gaps, last_seq, host);
    };
  }
  auto source = JetstreamSource::Create(live, env.kv);
  if (!source.ok()) return Status::Invalid(source.status().message());
  JetstreamSource* stream = draft.Keep(std::move(*source));
  draft.plan->source = stream;
  // Changes made while it runs reach it; released before the source.
  const uint64_t token = collections->Listen(
      [stream](const std::vector<std::string>& now) { return stream->SetCollections(now); },
      [stream](std::chrono::milliseconds timeout) { return stream->WaitFilterApplied(timeout); });
  draft.consumes = [stream](std::string_view c) { return stream->Consumes(c); };
  draft.plan->keep.push_back(std::shared_ptr<void>(
      nullptr, [collections, token](void*) { collections->Unlisten(token); }));
  if (settings.check_deleted_accounts) ATFILL_RETURN_IF_ERROR(AddAccountStatus(env, draft));
  draft.plan->cursor_name = kLiveCursor;
  draft.plan->batch = settings.live_batch;
  draft.plan->after = [stream, env](const state::JobRecord&) {
    const auto s = stream->stats();
    char line[640];
    std::snprintf(
        line, sizeof(line),
        "atfill run: live: %s via %s, %" PRIu64 " connection(s) in %" PRIu64 " attempt(s), %" PRIu64
        " failed, last seq %" PRIu64 ", %" PRIu64 " v1 fallback(s), %" PRIu64
        " cursor(s) too old, %" PRIu64 " gap(s) replayed from the archive",
        s.host.c_str(), s.protocol.c_str(), s.connections, s.attempts, s.connection_failures,
        s.last_seq, s.v1_fallbacks, s.cursor_too_old, s.gap_replays);
    env.Log(line);
    if (!s.last_error.empty()) env.Log("atfill run: live: last connection error: " + s.last_error);
  };
  return Status::OK();
}

}  // namespace

Result<LiveCollections*> LiveCollectionsOf(const pipeline::Environment& env,
                                           CollectionChange* loaded) {
  const SourceSettings& settings = Of(env);
  LiveCollectionsSlot& slot = *settings.live_collections;
  std::lock_guard<std::mutex> lock(slot.mu);
  if (slot.collections == nullptr) {
    auto made = std::make_unique<LiveCollections>(env.kv, settings.live.collections);
    ATFILL_ASSIGN_OR_RETURN(CollectionChange change, made->Load());
    if (loaded != nullptr) *loaded = std::move(change);
    slot.collections = std::move(made);
  }
  return slot.collections.get();
}

void Register(pipeline::Components& components) {
  components.AddConfigReader(ReadSourceConfig);
  components.AddSource("crawl", PlanCrawl);
  components.AddSource("replay", PlanReplay);
  components.AddSource("files", PlanFiles);
  components.AddSource("jetstream", PlanJetstream);
  components.AddJobKind("backfill", "crawl");
  components.AddJobKind("ingest", "files");
  components.AddJobKind("live", "jetstream");
  components.AddSource("verify", PlanVerify);
  components.AddJobKind("verify", "verify");
}

}  // namespace atfill::sources
