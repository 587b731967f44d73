#include "tests/common/crawl_job.hpp"

#include <gtest/gtest.h>

#include "tests/common/job_harness.hpp"

namespace atfill::testing {

CrawlJobRun RunCrawlJob(const std::filesystem::path& state_dir, const std::string& db,
                        const sources::CrawlOptions& options, const std::string& job_name,
                        const std::function<void(state::KvStore&)>& prepare) {
  CrawlJobRun out;
  std::unique_ptr<sources::CrawlSource> made;
  SourceJobRun run = RunSourceJob(
      state_dir, db, "backfill", job_name,
      [&](state::KvStore& kv,
          const state::JobRecord& j) -> Result<std::unique_ptr<pipeline::Source>> {
        ATFILL_ASSIGN_OR_RETURN(made, sources::CrawlSource::Create(options, j.id, &kv));
        return Borrow(made.get());
      },
      prepare,
      [&](state::KvStore& kv, const state::JobRecord& job) {
        if (made != nullptr) out.stats = made->stats();
        made.reset();  // while the state store is still open
        state::CrawlLog log(kv);
        auto recent = log.Recent(job.id);
        auto hosts = log.Hosts(job.id);
        EXPECT_TRUE(recent.ok() && hosts.ok());
        if (recent.ok()) out.recent = std::move(*recent);
        if (hosts.ok()) out.hosts = std::move(*hosts);
      });
  out.job = std::move(run.job);
  out.error_kinds = std::move(run.error_kinds);
  out.errors = std::move(run.errors);
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
