#include "tools/atfill/job_view.hpp"

#include <cinttypes>
#include <cstdio>
#include <ctime>

#include "base/json_writer.hpp"
#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"

namespace atfill::cli {

std::string FormatCount(uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string FormatDuration(int64_t s) {
  if (s < 0) return "?";
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%" PRId64 ":%02d:%02d", s / 3600,
                  static_cast<int>(s / 60 % 60), static_cast<int>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%d:%02d", static_cast<int>(s / 60), static_cast<int>(s % 60));
  }
  return buf;
}

std::string FormatTime(int64_t unix_us) {
  if (unix_us <= 0) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_us / 1'000'000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

namespace {

std::string Rate(double per_s) {
  char buf[32];
  if (per_s >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.2fM", per_s / 1e6);
  } else if (per_s >= 1e4) {
    std::snprintf(buf, sizeof(buf), "%.0fk", per_s / 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f", per_s);
  }
  return buf;
}

}  // namespace

std::string ProgressLine(const state::JobRecord& job, int64_t now_us) {
  const auto p = pipeline::DeriveProgress(job, now_us);
  std::string line = "job " + std::to_string(job.id) + " " + job.kind + " " +
                     std::string(state::JobStatusName(job.status)) + "/" +
                     std::string(state::JobStageName(job.stage));
  if (p.percent >= 0) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), " %.1f%%", p.percent);
    line += buf;
  }
  const auto extra = [&](const char* name) -> uint64_t {
    auto it = job.counters.extra.find(name);
    return it == job.counters.extra.end() ? 0 : it->second;
  };
  const auto source = job.params.find("source");
  if (source != job.params.end() && source->second == "replay") {
    // An archive replay: where it is in the archive's seqs, what it downloaded, what failed.
    line += " | seq " + FormatCount(extra(pipeline::kInputDone)) + " of " +
            FormatCount(extra(pipeline::kInputTotal));
    char mb[32];
    std::snprintf(mb, sizeof(mb), "%.1f MB", static_cast<double>(job.counters.bytes) / 1e6);
    line += " | " + std::string(mb) + " read";
    line += " | " + FormatCount(extra("failed_blocks")) + " failed blocks";
  } else {
    line += " | " + FormatCount(job.counters.events_read) + " events";
  }
  line += " | " + FormatCount(job.counters.records_written) + " written";
  line += " | " + Rate(p.records_per_s) + " rec/s";
  if (p.eta_s >= 0 && job.status == state::JobStatus::kRunning) {
    line += " | ETA " + FormatDuration(p.eta_s);
  }
  line += " | " + FormatCount(job.counters.failed_records) + " errors";
  if (auto it = job.counters.extra.find("refused"); it != job.counters.extra.end()) {
    line += " | " + FormatCount(it->second) + " refused";
  }
  return line;
}

std::string JobJson(const state::JobRecord& job, int64_t now_us) {
  const auto p = pipeline::DeriveProgress(job, now_us);
  JsonWriter w;
  w.BeginObject();
  w.Key("id").Uint(job.id).Key("kind").String(job.kind);
  w.Key("status").String(state::JobStatusName(job.status));
  w.Key("stage").String(state::JobStageName(job.stage));
  w.Key("started_by").String(job.started_by);
  w.Key("created_at").String(FormatTime(job.created_us));
  w.Key("started_at").String(FormatTime(job.started_us));
  w.Key("updated_at").String(FormatTime(job.updated_us));
  w.Key("finished_at").String(FormatTime(job.finished_us));
  w.Key("heartbeat_at").String(FormatTime(job.heartbeat_us));
  w.Key("counters").BeginObject();
  const auto& c = job.counters;
  w.Key("total_repos").Uint(c.total_repos).Key("resolved_repos").Uint(c.resolved_repos);
  w.Key("processed_repos").Uint(c.processed_repos).Key("total_records").Uint(c.total_records);
  w.Key("records_written").Uint(c.records_written).Key("failed_records").Uint(c.failed_records);
  w.Key("bytes").Uint(c.bytes).Key("events_read").Uint(c.events_read);
  for (const auto& [k, v] : c.extra) w.Key(k).Uint(v);
  w.EndObject();
  w.Key("progress").BeginObject();
  if (p.percent >= 0) {
    w.Key("percent").Double(p.percent);
  } else {
    w.Key("percent").Null();
  }
  w.Key("records_per_s").Double(p.records_per_s).Key("events_per_s").Double(p.events_per_s);
  if (p.eta_s >= 0) {
    w.Key("eta_s").Int(p.eta_s);
  } else {
    w.Key("eta_s").Null();
  }
  w.EndObject();
  w.Key("stop_reason");
  if (job.stop_reason.empty()) {
    w.Null();
  } else {
    w.BeginObject().Key("code").String(job.stop_reason.code);
    w.Key("sentence").String(job.stop_reason.sentence).EndObject();
  }
  w.Key("params").BeginObject();
  for (const auto& [k, v] : job.params) w.Key(k).String(v);
  w.EndObject();
  w.EndObject();
  return w.Take();
}

ProgressReporter::ProgressReporter(SnapshotFn snapshot, double interval_s, bool terminal)
    : snapshot_(std::move(snapshot)), interval_s_(interval_s), terminal_(terminal) {}

ProgressReporter::~ProgressReporter() { Stop(); }

void ProgressReporter::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void ProgressReporter::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ProgressReporter::Loop() {
  const auto period = terminal_
                          ? std::chrono::milliseconds(500)
                          : std::chrono::milliseconds(static_cast<int64_t>(interval_s_ * 1000));
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    const bool stopping = cv_.wait_for(lock, period, [this] { return stop_; });
    const std::string line = ProgressLine(snapshot_(), pipeline::NowMicros());
    if (terminal_) {
      // \r and "erase to end of line" redraw one status line in place.
      std::fprintf(stderr, "\r\x1b[K%s%s", line.c_str(), stopping ? "\n" : "");
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
    if (stopping) return;
  }
}

}  // namespace atfill::cli
