// The whole process a user runs: `atfill ingest` with the default config, started as its own
// process, on Jetstream events from 1,000,000 accounts drawn at random (a stream's order), one
// process per window of events into one table that grows window by window. Per window: events/s,
// the process's user and system CPU and the bytes it made the disk read and write per event
// (wait4's rusage), and its peak RSS (its VmHWM). In the same run, on the same events, the SQLite
// sink alone (SqliteSink::Write in 50,000-event batches, as scale_bench writes) into a table of its
// own that grows in step, so what the process adds shows as a ratio (vs_sink); and first, 1,000,000
// events in repo order (10,000 accounts in runs of 100) through the launcher into an empty table,
// the easy order the interleaved windows are held against (vs_repo).
//
// The events are gen-events' (3% updates, 1% deletes, ~400 B bodies), one generator for the
// whole run, so later windows update and delete records earlier windows created.
//
// Before them, `atfill run` with [live] following a simnet Jetstream (in this process) from the
// first of the events it published before the launcher started (BM_LauncherRunCatchUp).
//
//   ATFILL_LAUNCHER_ROWS     events in all (default 10,000,000)
//   ATFILL_LAUNCHER_WINDOW   events per process (default 1,000,000)
//   ATFILL_LAUNCHER_ACCOUNTS accounts of the interleaved events (default 1,000,000)
//   ATFILL_LAUNCHER_SINK=0   skips the sink-alone runs
//   ATFILL_LAUNCHER_LIVE_EVENTS  events of the Jetstream backlog (default 300,000)
//   ATFILL_LAUNCHER_BIN      the launcher (default: the one this build made)
//   ATFILL_LAUNCHER_LEXICONS=0  skips the runs with and without lexicon validation
//                            (BM_LauncherLexicons; the atproto lexicons from $ATFILL_SHARED)
//
//   build/bench/launcher_bench                                     (Release build)
//   ATFILL_LAUNCHER_ROWS=1000000 build/bench/launcher_bench        (what the test suite runs)
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.hpp"
#include "bench/jetstream_backlog.hpp"
#include "pipeline/event.hpp"
#include "sinks/sqlite_sink.hpp"
#include "sources/files/event_file.hpp"
#include "tools/gen/event_gen.hpp"
#include "tools/simnet/simnet.hpp"

extern char** environ;

namespace atfill {
namespace {

namespace fs = std::filesystem;

using bench::EnvUint;

struct Config {
  uint64_t rows = EnvUint("ATFILL_LAUNCHER_ROWS", 10'000'000);
  uint64_t window = EnvUint("ATFILL_LAUNCHER_WINDOW", 1'000'000);
  uint32_t accounts = static_cast<uint32_t>(EnvUint("ATFILL_LAUNCHER_ACCOUNTS", 1'000'000));
  bool sink = EnvUint("ATFILL_LAUNCHER_SINK", 1) != 0;
  std::string bin = std::getenv("ATFILL_LAUNCHER_BIN") != nullptr
                        ? std::getenv("ATFILL_LAUNCHER_BIN")
                        : ATFILL_LAUNCHER_DEFAULT_BIN;
};

const Config& Cfg() {
  static const Config c;
  return c;
}

fs::path Dir() { return bench::WorkDir("launcher-bench"); }

// Set when a run failed: the program then exits 1, so the test suite's run of it fails.
bool failed = false;
void Fail(benchmark::State& state, const std::string& why) {
  failed = true;
  state.SkipWithError(why.c_str());
}

gen::EventGenOptions Events(uint32_t dids, uint32_t run_length, uint64_t seed) {
  gen::EventGenOptions o;
  o.seed = seed;
  o.dids = dids;
  o.update_ratio = 0.03;
  o.delete_ratio = 0.01;
  o.body_bytes = 400;
  o.run_length = run_length;
  return o;
}

// The next `count` lines of `g` into `path`.
bool WriteWindow(gen::EventGenerator* g, uint64_t count, const fs::path& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  std::string buf;
  for (uint64_t i = 0; i < count; ++i) {
    buf += g->Next();
    buf += '\n';
    if (buf.size() >= (1 << 20)) {
      out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
      buf.clear();
    }
  }
  out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
  return out.good();
}

// A launcher config as the README's minimal one, in `dir`, and `extra` after it.
fs::path WriteConfig(const fs::path& dir, const std::string& extra = "") {
  fs::create_directories(dir);
  const fs::path path = dir / "atfill.toml";
  std::ofstream(path) << "[state]\ndir = \"atfill-state\"\n[sink.sqlite]\npath = \"atfill.db\"\n"
                      << extra;
  return path;
}

// The atproto lexicons (../shared/lexicons, or $ATFILL_SHARED/lexicons).
fs::path LexiconsDir() {
  const char* shared = std::getenv("ATFILL_SHARED");
  return fs::path(shared != nullptr ? shared : ATFILL_SOURCE_DIR "/../shared") / "lexicons";
}

struct ProcessRun {
  std::string error;  // empty when the run did what was asked
  double wall_s = 0;
  double user_s = 0;
  double sys_s = 0;
  double peak_rss_mb = 0;
  double read_bytes = 0;
  double written_bytes = 0;
};

double Seconds(const timeval& t) {
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
}

// `atfill ARGS...` as a child process, its output to `log`; `ok_exit` is the exit code of a run
// that did what was asked.
ProcessRun RunLauncher(const std::vector<std::string>& launcher_args, const fs::path& log,
                       int ok_exit = 0) {
  ProcessRun run;
  // What earlier steps wrote (the events, the other table) is on the disk before the clock starts,
  // so the kernel's writeback of it does not compete with this run for the disk.
  ::sync();
  std::vector<std::string> args = {Cfg().bin};
  args.insert(args.end(), launcher_args.begin(), launcher_args.end());
  std::string what = "atfill";
  for (const std::string& a : launcher_args) what += " " + a;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    run.error = "cannot start " + Cfg().bin + ": " + std::strerror(rc);
    return run;
  }
  int status = 0;
  rusage usage{};
  // The peak RSS is read from the child's own VmHWM while it runs: wait4's ru_maxrss counts the
  // memory of the process that spawned it too (the kernel keeps the larger of the image before
  // and after exec), and this process holds the generator's state and the other table's sink.
  int64_t hwm_kb = 0;
  const std::string status_path = "/proc/" + std::to_string(pid) + "/status";
  for (;;) {
    const pid_t done = ::wait4(pid, &status, WNOHANG, &usage);
    if (done == pid) break;
    if (done < 0) {
      run.error = std::string("wait4: ") + std::strerror(errno);
      return run;
    }
    std::ifstream proc(status_path);
    for (std::string line; std::getline(proc, line);) {
      if (line.rfind("VmHWM:", 0) == 0)
        hwm_kb = std::max<int64_t>(hwm_kb, std::atoll(line.c_str() + 6));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  run.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != ok_exit) {
    // The log goes with the scratch folder at exit: its end is kept in the error.
    std::ifstream in(log, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.size() > 600) text = "..." + text.substr(text.size() - 600);
    run.error = what + " " +
                (WIFEXITED(status) ? "exited with " + std::to_string(WEXITSTATUS(status))
                                   : "was killed by signal " + std::to_string(WTERMSIG(status))) +
                "; it said: " + text;
    return run;
  }
  run.user_s = Seconds(usage.ru_utime);
  run.sys_s = Seconds(usage.ru_stime);
  run.peak_rss_mb = static_cast<double>(hwm_kb) / 1024.0;
  // Blocks of 512 bytes the storage layer read and wrote for it (/proc/<pid>/io's read_bytes and
  // write_bytes): reads the page cache served are not counted.
  run.read_bytes = static_cast<double>(usage.ru_inblock) * 512;
  run.written_bytes = static_cast<double>(usage.ru_oublock) * 512;
  return run;
}

ProcessRun RunIngest(const fs::path& config, const fs::path& file, const fs::path& log) {
  return RunLauncher({"ingest", config.string(), file.string()}, log);
}

void ReportProcess(benchmark::State& state, const ProcessRun& run, uint64_t events) {
  const double n = static_cast<double>(events);
  state.counters["events_per_s"] = n / run.wall_s;
  state.counters["user_s"] = run.user_s;
  state.counters["sys_s"] = run.sys_s;
  state.counters["cpu_us_per_event"] = (run.user_s + run.sys_s) * 1e6 / n;
  state.counters["peak_rss_mb"] = run.peak_rss_mb;
  state.counters["read_B_per_event"] = run.read_bytes / n;
  state.counters["written_B_per_event"] = run.written_bytes / n;
}

double& RepoRate() {
  static double rate = 0;
  return rate;
}

void BM_LauncherRepoOrder(benchmark::State& state) {
  const uint64_t events = std::min<uint64_t>(1'000'000, Cfg().rows);
  const fs::path dir = Dir() / "repo";
  const fs::path file = Dir() / "repo.jsonl";
  gen::EventGenerator g(Events(10'000, 100, 7));
  if (!WriteWindow(&g, events, file)) return Fail(state, "cannot write the events");
  const fs::path config = WriteConfig(dir);
  for (auto _ : state) {
    const ProcessRun run = RunIngest(config, file, dir / "ingest.log");
    if (!run.error.empty()) return Fail(state, run.error);
    state.SetIterationTime(run.wall_s);
    ReportProcess(state, run, events);
    RepoRate() = static_cast<double>(events) / run.wall_s;
  }
  fs::remove(file);
  fs::remove_all(dir);
  state.SetItemsProcessed(static_cast<int64_t>(events * state.iterations()));
}

// Lexicon validation's cost to the whole process: the same 1,000,000 interleaved events (or
// ATFILL_LAUNCHER_ROWS when fewer), each run into an empty table, without [lexicons] and with the
// atproto lexicons (reject mode), alternately (off, on, off, on); vs_off is the second "on" run's
// rate over the second "off" run's.
double& LexiconsOffRate() {
  static double rate = 0;
  return rate;
}

void BM_LauncherLexicons(benchmark::State& state) {
  const bool on = state.range(0) != 0;
  const uint64_t events = std::min<uint64_t>(1'000'000, Cfg().rows);
  const fs::path file = Dir() / "lexicons.jsonl";
  if (!fs::exists(file)) {
    gen::EventGenerator g(Events(Cfg().accounts, 1, 13));
    if (!WriteWindow(&g, events, file)) return Fail(state, "cannot write the events");
  }
  if (on && !fs::is_directory(LexiconsDir())) {
    return Fail(state, "no lexicons at " + LexiconsDir().string());
  }
  const fs::path dir = Dir() / (on ? "lexicons-on" : "lexicons-off");
  for (auto _ : state) {
    fs::remove_all(dir);
    const fs::path config = WriteConfig(
        dir, on ? "[lexicons]\ndirs = [\"" + LexiconsDir().string() + "\"]\n" : std::string());
    const ProcessRun run = RunIngest(config, file, dir / "ingest.log");
    if (!run.error.empty()) return Fail(state, run.error);
    state.SetIterationTime(run.wall_s);
    ReportProcess(state, run, events);
    const double rate = static_cast<double>(events) / run.wall_s;
    if (!on) LexiconsOffRate() = rate;
    if (on && LexiconsOffRate() > 0) state.counters["vs_off"] = rate / LexiconsOffRate();
  }
  fs::remove_all(dir);
  state.SetItemsProcessed(static_cast<int64_t>(events * state.iterations()));
}

// The table both the launcher and the sink alone grow, window by window.
struct Growing {
  std::unique_ptr<gen::EventGenerator> events;
  fs::path config;
  fs::path sink_path;  // the sink-alone table; empty with ATFILL_LAUNCHER_SINK=0
  uint64_t rows = 0;
  bool stopped = false;
};

Growing& Table() {
  static Growing g;
  return g;
}

// The SQLite sink alone on the events of `file`, in 50,000-event batches, opened and closed as a
// launcher run opens and closes it (the close waits for the last checkpoint, which would otherwise
// go on beside the next launcher run): the seconds and CPU of the open, the Write calls and the
// close; parsing the lines is not counted.
struct SinkSpan {
  double seconds = 0;
  double cpu = 0;
};
Status WriteAlone(const fs::path& path, const fs::path& file, SinkSpan* span) {
  ::sync();  // as before a launcher run
  std::unique_ptr<pipeline::Sink> sink;
  auto timed = [&](auto&& fn) -> Status {
    const double cpu0 = bench::ProcessCpuSeconds();
    const auto t0 = std::chrono::steady_clock::now();
    Status st = fn();
    span->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    span->cpu += bench::ProcessCpuSeconds() - cpu0;
    return st;
  };
  ATFILL_RETURN_IF_ERROR(timed([&]() -> Status {
    sinks::SqliteSinkOptions o;
    o.path = path.string();
    o.wal_autocheckpoint_bytes = int64_t{512} << 20;  // as an ingest's: [files] sqlite_wal_mb
    ATFILL_ASSIGN_OR_RETURN(sink, sinks::OpenSqliteSink(o));
    return Status::OK();
  }));
  std::ifstream in(file, std::ios::binary);
  std::string line;
  std::vector<pipeline::Event> batch;
  uint64_t line_no = 0;
  auto flush = [&]() -> Status {
    Status st = timed([&] { return sink->Write(batch).status(); });
    batch.clear();
    return st;
  };
  while (std::getline(in, line)) {
    pipeline::Event event;
    std::string kind;
    auto parsed =
        sources::ParseJetstreamLine(line, pipeline::Origin::kReplay, ++line_no, &event, &kind);
    if (!parsed.ok()) return parsed.status();
    if (*parsed) batch.push_back(std::move(event));
    if (batch.size() == 50'000) ATFILL_RETURN_IF_ERROR(flush());
  }
  if (!batch.empty()) ATFILL_RETURN_IF_ERROR(flush());
  return timed([&] {
    sink.reset();
    return Status::OK();
  });
}

void BM_LauncherInterleaved(benchmark::State& state) {
  Growing& g = Table();
  if (g.stopped) return Fail(state, "stopped after an earlier window's error");
  if (g.events == nullptr) {
    g.events = std::make_unique<gen::EventGenerator>(Events(Cfg().accounts, 1, 11));
    g.config = WriteConfig(Dir() / "interleaved");
    if (Cfg().sink) g.sink_path = Dir() / "sink-alone.db";
  }
  const uint64_t events = std::min(Cfg().window, Cfg().rows - g.rows);
  const fs::path file = Dir() / "window.jsonl";
  if (!WriteWindow(g.events.get(), events, file)) {
    g.stopped = true;
    return Fail(state, "cannot write the events");
  }
  for (auto _ : state) {
    const ProcessRun run = RunIngest(g.config, file, g.config.parent_path() / "ingest.log");
    if (!run.error.empty()) {
      g.stopped = true;
      return Fail(state, run.error);
    }
    state.SetIterationTime(run.wall_s);
    ReportProcess(state, run, events);
    const double rate = static_cast<double>(events) / run.wall_s;
    g.rows += events;
    state.counters["rows_total"] = static_cast<double>(g.rows);
    if (RepoRate() > 0) state.counters["vs_repo"] = rate / RepoRate();
    if (!g.sink_path.empty()) {
      SinkSpan span;
      if (Status s = WriteAlone(g.sink_path, file, &span); !s.ok()) {
        g.stopped = true;
        return Fail(state, s.ToString());
      }
      const double sink_rate = static_cast<double>(events) / span.seconds;
      state.counters["sink_events_per_s"] = sink_rate;
      state.counters["sink_cpu_us_per_event"] = span.cpu * 1e6 / static_cast<double>(events);
      state.counters["vs_sink"] = rate / sink_rate;
    }
  }
  fs::remove(file);
  state.SetItemsProcessed(static_cast<int64_t>(events * state.iterations()));
}

// `atfill run` catching up a Jetstream backlog: simnet (in this process, as live_bench runs it)
// publishes ATFILL_LAUNCHER_LIVE_EVENTS events (default 300,000) of 2,000 accounts before the
// launcher starts; `atfill run` with [live] following it from seq 1, the default protocol (v2,
// zstd) and account checks, ends once the stream has been quiet for idle_exit_ms, which the
// figures leave out.
constexpr int64_t kLiveIdleMs = 1000;

void BM_LauncherRunCatchUp(benchmark::State& state) {
  const uint64_t events = EnvUint("ATFILL_LAUNCHER_LIVE_EVENTS", 300'000);
  auto net = simnet::Simnet::Start(bench::JetstreamBacklog(events, 0));
  if (!net.ok()) return Fail(state, net.status().ToString());
  const fs::path dir = Dir() / "run";
  fs::create_directories(dir);
  const fs::path config = dir / "atfill.toml";
  std::ofstream(config) << "[state]\ndir = \"atfill-state\"\n[sink.sqlite]\npath = \"atfill.db\"\n"
                        << "[resolver]\nplc = \"" << (*net)->plc_url() << "\"\n"
                        << "[live]\nhosts = [\"" << (*net)->jetstream_url() << "\"]\n"
                        << "allow_private_endpoints = true\nstart_seq = 1\n"
                        << "idle_exit_ms = " << kLiveIdleMs << "\n";
  for (auto _ : state) {
    // Exit 4: the job paused when the stream went quiet.
    ProcessRun run = RunLauncher({"run", config.string()}, dir / "run.log", 4);
    if (!run.error.empty()) return Fail(state, run.error);
    run.wall_s -= static_cast<double>(kLiveIdleMs) / 1000.0;
    state.SetIterationTime(run.wall_s);
    ReportProcess(state, run, events);
  }
  net->reset();
  fs::remove_all(dir);
  state.SetItemsProcessed(static_cast<int64_t>(events * state.iterations()));
}

void Register() {
  benchmark::RegisterBenchmark("BM_LauncherRunCatchUp", BM_LauncherRunCatchUp)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("BM_LauncherRepoOrder", BM_LauncherRepoOrder)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kSecond);
  if (EnvUint("ATFILL_LAUNCHER_LEXICONS", 1) != 0) {
    for (int round = 0; round < 2; ++round) {
      for (int on = 0; on < 2; ++on) {
        benchmark::RegisterBenchmark(on != 0 ? "BM_LauncherLexicons/on" : "BM_LauncherLexicons/off",
                                     BM_LauncherLexicons)
            ->Arg(on)
            ->Iterations(1)
            ->UseManualTime()
            ->Unit(benchmark::kSecond);
      }
    }
  }
  const uint64_t windows = (Cfg().rows + Cfg().window - 1) / std::max<uint64_t>(1, Cfg().window);
  for (uint64_t w = 1; w <= windows; ++w) {
    const uint64_t upto = std::min(Cfg().rows, w * Cfg().window);
    benchmark::RegisterBenchmark(("BM_LauncherInterleaved/rows:" + std::to_string(upto)).c_str(),
                                 BM_LauncherInterleaved)
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kSecond);
  }
}

}  // namespace
}  // namespace atfill

int main(int argc, char** argv) {
  atfill::Register();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return atfill::failed ? 1 : 0;
}
