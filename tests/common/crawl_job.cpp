#include "tests/common/crawl_job.hpp"

#include <gtest/gtest.h>

#include "pipeline/run.hpp"
#include "sinks/sqlite_sink.hpp"
#include "stages/cid_verify.hpp"
#include "stages/ingest_guard.hpp"
#include "state/tombstones.hpp"

namespace atfill::testing {

CrawlJobRun RunCrawlJob(const std::filesystem::path& state_dir, const std::string& db,
                        const sources::CrawlOptions& options, const std::string& job_name,
                        const std::function<void(state::KvStore&)>& prepare) {
  CrawlJobRun out;
  auto kv = state::OpenRocksDb({.path = state_dir.string()});
  EXPECT_TRUE(kv.ok()) << kv.status().ToString();
  if (!kv.ok()) return out;
  if (prepare) prepare(**kv);
  sinks::SqliteSinkOptions sink_options;
  sink_options.path = db;
  auto sink = sinks::OpenSqliteSink(sink_options);
  EXPECT_TRUE(sink.ok()) << sink.status().ToString();
  if (!sink.ok()) return out;
  state::Tombstones tombstones(**kv);
  stages::CidVerify verify;
  stages::IngestGuard guard(&tombstones);
  pipeline::RunOptions run;
  run.job_name = job_name;
  run.engine.batch.max_delay_ms = 50;
  sources::CrawlSource* made = nullptr;
  auto job = pipeline::RunAsJob(
      [&](const state::JobRecord& j) -> Result<std::unique_ptr<pipeline::Source>> {
        ATFILL_ASSIGN_OR_RETURN(auto s, sources::CrawlSource::Create(options, j.id, kv->get()));
        made = s.get();
        return std::unique_ptr<pipeline::Source>(std::move(s));
      },
      "backfill", {&verify, &guard}, sink->get(), kv->get(), run);
  EXPECT_TRUE(job.ok()) << job.status().ToString();
  if (!job.ok()) return out;
  out.job = *job;
  if (made != nullptr) out.stats = made->stats();
  state::ErrorLog errors(**kv);
  auto kinds = errors.CountsByKind(job->id);
  auto listed = errors.List(job->id, 0, 100);
  state::CrawlLog log(**kv);
  auto recent = log.Recent(job->id);
  auto hosts = log.Hosts(job->id);
  EXPECT_TRUE(kinds.ok() && listed.ok() && recent.ok() && hosts.ok());
  if (kinds.ok()) out.error_kinds = std::move(*kinds);
  if (listed.ok()) out.errors = std::move(*listed);
  if (recent.ok()) out.recent = std::move(*recent);
  if (hosts.ok()) out.hosts = std::move(*hosts);
  sink->reset();
  auto rows = sinks::ReadAllRecords(db);
  EXPECT_TRUE(rows.ok()) << rows.status().ToString();
  if (rows.ok()) out.rows = std::move(*rows);
  return out;
}

std::string KindCounts(const std::map<std::string, uint64_t>& kinds) {
  std::string s;
  for (const auto& [k, n] : kinds) s += k + "=" + std::to_string(n) + " ";
  return s;
}

std::string Describe(const CrawlJobRun& run) {
  std::string s = "job " + std::string(state::JobStatusName(run.job.status)) + " (" +
                  run.job.stop_reason.code + ": " + run.job.stop_reason.sentence +
                  "); errors: " + KindCounts(run.error_kinds);
  for (size_t i = 0; i < run.errors.size() && i < 5; ++i) {
    s += "\n  " + run.errors[i].kind + " " + run.errors[i].key + ": " + run.errors[i].message;
  }
  return s;
}

}  // namespace atfill::testing
