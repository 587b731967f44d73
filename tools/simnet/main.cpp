// build/simnet: serve a simulated atproto network, or print its ground truth.
//
//   simnet serve [options] [--duration-s N] [--truth-out FILE]
//     prints RELAY_URL=, PLC_URL=, PORT= lines (and JETSTREAM_URL= with a Jetstream), then serves
//     until SIGINT/SIGTERM or the duration (default 3600 s) elapses; prints request counters to
//     stderr on exit.
//     --jetstream-truth-out FILE writes the Jetstream's ground truth ("uri<TAB>cid" per live
//     record); --jetstream-v1-dict-out FILE / --jetstream-v2-dict-out FILE its dictionaries.
//   simnet truth [options] [--with-faults]
//     prints "uri<TAB>cid" per live record, sorted (a third column names the record's faults).
//     did:web DIDs name the port: pass the --port `serve` used, or use serve --truth-out.
//
// Generation options: --seed N --accounts N --pds N --collections a,b --min-records N
// --max-records N --distribution uniform|log --did-web-share X --deactivated-share X
// --takendown-share X --latency-ms N --port N --threads N --timeout-hold-ms N --faults SPEC.
// Jetstream options (jetstream.localhost; on when --jetstream-events N > 0): --jetstream-rate X
// (events/s, 0 = all published at start) --jetstream-published N --jetstream-retention N
// --jetstream-burst-every N --jetstream-burst-size N --jetstream-interval-us N
// --jetstream-disconnect-after N --jetstream-disconnect-probability X --jetstream-max-queue N
// --jetstream-send-buffer N --jetstream-false-deletes X (share of #account deleted events the
// account's PDS contradicts).
// Archive options (archive.localhost; on with --archive-dir DIR; prints ARCHIVE_URL=):
// --archive-from-jetstream (write the Jetstream log into DIR first) --archive-from-repos (write
// every active account's repo into DIR first, as Jetstream stores backfilled repos; before the
// log when both are given) --archive-rows-per-block N
// --archive-segment-bytes N --archive-max-plan-entries N --archive-max-list-page N
// --archive-key KEY (required Bearer key) --archive-quota BYTES_PER_S --archive-absent 404|501.
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "tools/simnet/jetstream.hpp"
#include "tools/simnet/simnet.hpp"

namespace {

using atfill::Result;
using atfill::Status;
using atfill::simnet::SimnetOptions;

int Usage() {
  std::fputs(
      "usage: simnet serve|truth [--seed N] [--accounts N] [--pds N] [--collections a,b]\n"
      "         [--min-records N] [--max-records N] [--distribution uniform|log]\n"
      "         [--did-web-share X] [--deactivated-share X] [--takendown-share X]\n"
      "         [--latency-ms N] [--port N] [--threads N] [--timeout-hold-ms N] [--faults SPEC]\n"
      "         [--jetstream-events N] [--jetstream-rate X] [--jetstream-published N]\n"
      "         [--jetstream-retention N] [--jetstream-burst-every N] [--jetstream-burst-size N]\n"
      "         [--jetstream-interval-us N] [--jetstream-disconnect-after N]\n"
      "         [--jetstream-disconnect-probability X] [--jetstream-max-queue N]\n"
      "         [--jetstream-send-buffer N] [--jetstream-false-deletes X]\n"
      "         [--archive-dir DIR] [--archive-from-jetstream] [--archive-from-repos]\n"
      "         [--archive-rows-per-block N]\n"
      "         [--archive-segment-bytes N] [--archive-max-plan-entries N]\n"
      "         [--archive-max-list-page N] [--archive-key KEY] [--archive-quota N]\n"
      "         [--archive-absent 404|501]\n"
      "       serve: [--duration-s N] [--truth-out FILE] [--jetstream-truth-out FILE]\n"
      "              [--jetstream-v1-dict-out FILE] [--jetstream-v2-dict-out FILE]\n"
      "       truth: [--with-faults]\n",
      stderr);
  return 2;
}

struct Cli {
  std::string verb;
  SimnetOptions options;
  int64_t duration_s = 3600;
  std::string truth_out;
  std::string jetstream_truth_out;
  std::string jetstream_dict_out[2];  // v1, v2
  bool with_faults = false;
};

// The command line, declared on CLI11: every option writes its SimnetOptions field directly.
Status ParseArgs(int argc, char** argv, Cli* cli) {
  SimnetOptions& o = cli->options;
  auto& j = o.jetstream;
  auto& a = o.archive;
  CLI::App app{"a simulated atproto network on loopback", "simnet"};
  app.set_help_flag();  // Usage() is the help
  app.add_option("VERB", cli->verb)->required()->check(CLI::IsMember({"serve", "truth"}));
  app.add_flag("--with-faults", cli->with_faults);
  app.add_flag("--archive-from-jetstream", a.from_jetstream);
  app.add_flag("--archive-from-repos", a.from_repos);
  app.add_option("--seed", o.seed);
  app.add_option("--accounts", o.accounts);
  app.add_option("--pds", o.pds_hosts);
  app.add_option("--min-records", o.min_records);
  app.add_option("--max-records", o.max_records);
  app.add_option("--did-web-share", o.did_web_share);
  app.add_option("--deactivated-share", o.deactivated_share);
  app.add_option("--takendown-share", o.takendown_share);
  app.add_option("--latency-ms", o.latency_ms);
  app.add_option("--port", o.port);
  app.add_option("--threads", o.threads);
  app.add_option("--timeout-hold-ms", o.timeout_hold_ms);
  app.add_option("--oversize-bytes", o.oversize_record_bytes);
  app.add_option("--duration-s", cli->duration_s)->check(CLI::PositiveNumber);
  app.add_option("--truth-out", cli->truth_out);
  app.add_option("--jetstream-truth-out", cli->jetstream_truth_out);
  app.add_option("--jetstream-v1-dict-out", cli->jetstream_dict_out[0]);
  app.add_option("--jetstream-v2-dict-out", cli->jetstream_dict_out[1]);
  app.add_option("--jetstream-events", j.events);
  app.add_option("--jetstream-rate", j.events_per_second);
  app.add_option("--jetstream-published", j.published_at_start);
  app.add_option("--jetstream-retention", j.retention_events);
  app.add_option("--jetstream-burst-every", j.burst_every);
  app.add_option("--jetstream-burst-size", j.burst_size);
  app.add_option("--jetstream-interval-us", j.interval_us);
  app.add_option("--jetstream-disconnect-after", j.disconnect_after_frames);
  app.add_option("--jetstream-disconnect-probability", j.disconnect_probability);
  app.add_option("--jetstream-false-deletes", j.false_delete_share);
  app.add_option("--jetstream-max-queue", j.max_send_queue);
  app.add_option("--jetstream-send-buffer", j.send_buffer_bytes);
  app.add_option("--archive-dir", a.dir);
  app.add_option("--archive-rows-per-block", a.rows_per_block);
  app.add_option("--archive-segment-bytes", a.segment_bytes);
  app.add_option("--archive-max-plan-entries", a.max_plan_entries);
  app.add_option("--archive-max-list-page", a.max_list_page);
  app.add_option("--archive-key", a.faults.required_key);
  app.add_option("--archive-quota", a.faults.quota_bytes_per_second);
  app.add_option("--archive-absent", a.faults.no_archive_status);
  std::string distribution;
  app.add_option("--distribution", distribution)->check(CLI::IsMember({"uniform", "log"}));
  std::vector<std::string> collections;
  app.add_option("--collections", collections)->delimiter(',');
  std::string faults;
  app.add_option("--faults", faults);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return Status::Invalid(e.what());
  }
  if (!distribution.empty()) {
    o.distribution = distribution == "uniform"
                         ? atfill::simnet::RecordCountDistribution::kUniform
                         : atfill::simnet::RecordCountDistribution::kLogUniform;
  }
  if (!collections.empty()) o.collections = std::move(collections);
  if (!faults.empty()) {
    Result<std::vector<atfill::simnet::FaultRule>> rules = atfill::simnet::ParseFaultSpec(faults);
    if (!rules.ok()) return rules.status().WithContext("--faults");
    o.faults = std::move(*rules);
  }
  return o.Validate();
}

Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return Status::IoError("cannot write " + path + ": " + std::strerror(errno));
  return Status::OK();
}

int Serve(const Cli& cli) {
  // Many keep-alive connections (hundreds of hosts x a few each) need descriptors.
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
  // Blocked before any thread starts, so only sigtimedwait below receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Result<std::unique_ptr<atfill::simnet::Simnet>> net = atfill::simnet::Simnet::Start(cli.options);
  if (!net.ok()) {
    std::fprintf(stderr, "simnet: %s\n", net.status().ToString().c_str());
    return 1;
  }
  if (!cli.truth_out.empty()) {
    Result<atfill::simnet::GroundTruth> truth = (*net)->Truth();
    Status written = truth.ok() ? WriteFile(cli.truth_out, truth->ToTsv(false)) : truth.status();
    if (!written.ok()) {
      std::fprintf(stderr, "simnet: %s\n", written.ToString().c_str());
      return 1;
    }
  }
  if ((*net)->jetstream() != nullptr) {
    Status written = Status::OK();
    if (!cli.jetstream_truth_out.empty()) {
      Result<atfill::simnet::JetstreamTruth> truth = (*net)->JetstreamGroundTruth();
      written = truth.ok() ? WriteFile(cli.jetstream_truth_out, truth->ToTsv()) : truth.status();
    }
    for (int v = 0; v < 2 && written.ok(); ++v) {
      if (cli.jetstream_dict_out[v].empty()) continue;
      written = WriteFile(cli.jetstream_dict_out[v],
                          std::string(atfill::AsChars((*net)->jetstream_dictionary(v + 1))));
    }
    if (!written.ok()) {
      std::fprintf(stderr, "simnet: %s\n", written.ToString().c_str());
      return 1;
    }
  }
  std::printf("RELAY_URL=%s\nPLC_URL=%s\nPORT=%u\n", (*net)->relay_url().c_str(),
              (*net)->plc_url().c_str(), static_cast<unsigned>((*net)->port()));
  if ((*net)->jetstream() != nullptr) {
    std::printf("JETSTREAM_URL=%s\n", (*net)->jetstream_url().c_str());
  }
  if (!(*net)->archive_url().empty()) {
    std::printf("ARCHIVE_URL=%s\n", (*net)->archive_url().c_str());
  }
  std::fflush(stdout);

  timespec wait{};
  wait.tv_sec = cli.duration_s;
  const int got = sigtimedwait(&signals, nullptr, &wait);
  (*net)->Stop();
  const atfill::simnet::SimnetStats s = (*net)->stats();
  std::fprintf(
      stderr,
      "simnet: %s; connections=%llu requests=%llu ok=%llu client_errors=%llu "
      "rate_limited=%llu server_errors=%llu timeouts=%llu truncated=%llu "
      "repos_built=%llu jetstream_connections=%llu jetstream_frames=%llu "
      "jetstream_disconnects=%llu jetstream_slow_drops=%llu\n",
      got > 0 ? "signalled" : "duration elapsed", static_cast<unsigned long long>(s.connections),
      static_cast<unsigned long long>(s.requests), static_cast<unsigned long long>(s.ok),
      static_cast<unsigned long long>(s.client_errors),
      static_cast<unsigned long long>(s.rate_limited),
      static_cast<unsigned long long>(s.server_errors), static_cast<unsigned long long>(s.timeouts),
      static_cast<unsigned long long>(s.truncated), static_cast<unsigned long long>(s.repos_built),
      static_cast<unsigned long long>(s.jetstream_connections),
      static_cast<unsigned long long>(s.jetstream_frames),
      static_cast<unsigned long long>(s.jetstream_disconnects),
      static_cast<unsigned long long>(s.jetstream_slow_drops));
  return 0;
}

int Truth(const Cli& cli) {
  Result<std::unique_ptr<atfill::simnet::Network>> net =
      atfill::simnet::Network::Generate(cli.options, cli.options.port);
  Result<atfill::simnet::GroundTruth> truth =
      net.ok() ? (*net)->Truth() : Result<atfill::simnet::GroundTruth>(net.status());
  if (!truth.ok()) {
    std::fprintf(stderr, "simnet: %s\n", truth.status().ToString().c_str());
    return 1;
  }
  const std::string tsv = truth->ToTsv(cli.with_faults);
  std::fwrite(tsv.data(), 1, tsv.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Cli cli;
  if (Status st = ParseArgs(argc, argv, &cli); !st.ok()) {
    std::fprintf(stderr, "simnet: %s\n", st.ToString().c_str());
    return Usage();
  }
  return cli.verb == "serve" ? Serve(cli) : Truth(cli);
}
