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

#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <string_view>

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

template <typename T>
bool ParseNumber(std::string_view text, T* out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
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

Status ParseArgs(int argc, char** argv, Cli* cli) {
  if (argc < 2) return Status::Invalid("missing verb (serve or truth)");
  cli->verb = argv[1];
  if (cli->verb != "serve" && cli->verb != "truth") {
    return Status::Invalid("unknown verb \"" + cli->verb + "\"");
  }
  SimnetOptions& o = cli->options;
  for (int i = 2; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--with-faults") {
      cli->with_faults = true;
      continue;
    }
    if (flag == "--archive-from-jetstream") {
      o.archive.from_jetstream = true;
      continue;
    }
    if (flag == "--archive-from-repos") {
      o.archive.from_repos = true;
      continue;
    }
    if (i + 1 >= argc) return Status::Invalid(std::string(flag) + " needs a value");
    const std::string_view value = argv[++i];
    bool ok = true;
    uint32_t u32 = 0;
    if (flag == "--seed") {
      ok = ParseNumber(value, &o.seed);
    } else if (flag == "--accounts") {
      ok = ParseNumber(value, &o.accounts);
    } else if (flag == "--pds") {
      ok = ParseNumber(value, &o.pds_hosts);
    } else if (flag == "--min-records") {
      ok = ParseNumber(value, &o.min_records);
    } else if (flag == "--max-records") {
      ok = ParseNumber(value, &o.max_records);
    } else if (flag == "--did-web-share") {
      ok = ParseNumber(value, &o.did_web_share);
    } else if (flag == "--deactivated-share") {
      ok = ParseNumber(value, &o.deactivated_share);
    } else if (flag == "--takendown-share") {
      ok = ParseNumber(value, &o.takendown_share);
    } else if (flag == "--latency-ms") {
      ok = ParseNumber(value, &o.latency_ms);
    } else if (flag == "--port") {
      ok = ParseNumber(value, &o.port);
    } else if (flag == "--threads") {
      ok = ParseNumber(value, &o.threads);
    } else if (flag == "--timeout-hold-ms") {
      ok = ParseNumber(value, &o.timeout_hold_ms);
    } else if (flag == "--oversize-bytes") {
      ok = ParseNumber(value, &u32);
      o.oversize_record_bytes = u32;
    } else if (flag == "--duration-s") {
      ok = ParseNumber(value, &cli->duration_s) && cli->duration_s > 0;
    } else if (flag == "--truth-out") {
      cli->truth_out = value;
    } else if (flag == "--jetstream-truth-out") {
      cli->jetstream_truth_out = value;
    } else if (flag == "--jetstream-v1-dict-out") {
      cli->jetstream_dict_out[0] = value;
    } else if (flag == "--jetstream-v2-dict-out") {
      cli->jetstream_dict_out[1] = value;
    } else if (flag == "--jetstream-events") {
      ok = ParseNumber(value, &o.jetstream.events);
    } else if (flag == "--jetstream-rate") {
      ok = ParseNumber(value, &o.jetstream.events_per_second);
    } else if (flag == "--jetstream-published") {
      uint64_t n = 0;
      ok = ParseNumber(value, &n);
      o.jetstream.published_at_start = n;
    } else if (flag == "--jetstream-retention") {
      ok = ParseNumber(value, &o.jetstream.retention_events);
    } else if (flag == "--jetstream-burst-every") {
      ok = ParseNumber(value, &o.jetstream.burst_every);
    } else if (flag == "--jetstream-burst-size") {
      ok = ParseNumber(value, &o.jetstream.burst_size);
    } else if (flag == "--jetstream-interval-us") {
      ok = ParseNumber(value, &o.jetstream.interval_us);
    } else if (flag == "--jetstream-disconnect-after") {
      ok = ParseNumber(value, &o.jetstream.disconnect_after_frames);
    } else if (flag == "--jetstream-disconnect-probability") {
      ok = ParseNumber(value, &o.jetstream.disconnect_probability);
    } else if (flag == "--jetstream-false-deletes") {
      ok = ParseNumber(value, &o.jetstream.false_delete_share);
    } else if (flag == "--jetstream-max-queue") {
      ok = ParseNumber(value, &o.jetstream.max_send_queue);
    } else if (flag == "--jetstream-send-buffer") {
      ok = ParseNumber(value, &o.jetstream.send_buffer_bytes);
    } else if (flag == "--archive-dir") {
      o.archive.dir = value;
    } else if (flag == "--archive-rows-per-block") {
      ok = ParseNumber(value, &o.archive.rows_per_block);
    } else if (flag == "--archive-segment-bytes") {
      ok = ParseNumber(value, &o.archive.segment_bytes);
    } else if (flag == "--archive-max-plan-entries") {
      ok = ParseNumber(value, &o.archive.max_plan_entries);
    } else if (flag == "--archive-max-list-page") {
      ok = ParseNumber(value, &o.archive.max_list_page);
    } else if (flag == "--archive-key") {
      o.archive.faults.required_key = value;
    } else if (flag == "--archive-quota") {
      ok = ParseNumber(value, &o.archive.faults.quota_bytes_per_second);
    } else if (flag == "--archive-absent") {
      ok = ParseNumber(value, &o.archive.faults.no_archive_status);
    } else if (flag == "--distribution") {
      ok = value == "uniform" || value == "log";
      o.distribution = value == "uniform" ? atfill::simnet::RecordCountDistribution::kUniform
                                          : atfill::simnet::RecordCountDistribution::kLogUniform;
    } else if (flag == "--collections") {
      o.collections.clear();
      std::string_view rest = value;
      while (!rest.empty()) {
        const size_t comma = rest.find(',');
        o.collections.emplace_back(rest.substr(0, comma));
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
      }
    } else if (flag == "--faults") {
      Result<std::vector<atfill::simnet::FaultRule>> rules = atfill::simnet::ParseFaultSpec(value);
      if (!rules.ok()) return rules.status().WithContext("--faults");
      o.faults = std::move(*rules);
    } else {
      return Status::Invalid("unknown option " + std::string(flag));
    }
    if (!ok) {
      return Status::Invalid(std::string(flag) + ": bad value \"" + std::string(value) + "\"");
    }
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
