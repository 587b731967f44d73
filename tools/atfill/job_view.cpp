#include "tools/atfill/job_view.hpp"

#include <cinttypes>
#include <cstdio>
#include <ctime>

#include "base/json_writer.hpp"
#include "pipeline/engine.hpp"
#include "pipeline/job.hpp"
#include "tools/atfill/admin/admin_server.hpp"

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

std::string FormatTime(int64_t unix_us) { return admin::FormatTime(unix_us); }

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
  if (!job.waiting.empty()) {
    // The rate decays while nothing commits; say why, and for how long, on the line people watch.
    line += " | waiting " + FormatDuration((now_us - job.waiting_since_us) / 1000000) + ": " +
            job.waiting.sentence;
  }
  if (auto it = job.counters.extra.find("refused"); it != job.counters.extra.end()) {
    line += " | " + FormatCount(it->second) + " refused";
  }
  if (job.counters.extra.contains("lexicon_valid") ||
      job.counters.extra.contains("lexicon_invalid") ||
      job.counters.extra.contains("lexicon_unknown")) {
    // Lexicon validation ([lexicons]): what matched, what did not, what had no lexicon.
    line += " | lexicons: " + FormatCount(extra("lexicon_valid")) + " valid, " +
            FormatCount(extra("lexicon_invalid")) + " invalid, " +
            FormatCount(extra("lexicon_unknown")) + " unknown";
  }
  if (const auto protocol = job.params.find("protocol");
      protocol != job.params.end() && protocol->second == "firehose") {
    // The relay firehose: what verification refused, and the repos whose chain broke.
    line += " | " + FormatCount(extra("firehose_verified")) + " verified, " +
            FormatCount(extra("firehose_refused")) + " refused commits";
    line += " | " + FormatCount(extra("firehose_desync")) + " desync, " +
            FormatCount(extra("firehose_resynced")) + " resynced, " +
            FormatCount(extra("firehose_failed")) + " resyncs failed";
  }
  return line;
}

std::string JobJson(const state::JobRecord& job, int64_t now_us) {
  // One rendering for the CLI and the admin API, so the two agree field for field.
  return admin::JobJson(job, now_us);
}

ProgressReporter::ProgressReporter(SnapshotFn snapshot, double interval_s, bool terminal)
    : snapshot_(std::move(snapshot)), interval_s_(interval_s), terminal_(terminal) {}

ProgressReporter::~ProgressReporter() { Stop(); }

void ProgressReporter::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void ProgressReporter::Stop(const state::JobRecord* last) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
    if (last != nullptr) last_ = *last;
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
    const std::string line =
        ProgressLine(stopping && last_ ? *last_ : snapshot_(), pipeline::NowMicros());
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
