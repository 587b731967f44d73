#include "bench/bench_util.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>

namespace atfill::bench {

namespace fs = std::filesystem;

fs::path WorkDir(std::string_view name) {
  // A pointer, never destroyed, so the exit handler can still read it.
  static const fs::path* dir = [name] {
    auto* d = new fs::path(fs::temp_directory_path() /
                           ("atfill-" + std::string(name) + "-" + std::to_string(::getpid())));
    fs::create_directories(*d);
    std::atexit([] {
      std::error_code ignored;
      fs::remove_all(WorkDir(""), ignored);
    });
    return d;
  }();
  return *dir;
}

int64_t StatusKb(std::string_view field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > field.size() && line.compare(0, field.size(), field) == 0 &&
        line[field.size()] == ':') {
      return std::stoll(line.substr(field.size() + 1));
    }
  }
  return -1;
}

uint64_t EnvUint(const char* name, uint64_t otherwise) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return otherwise;
  return std::strtoull(v, nullptr, 10);
}

bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return out.good();
}

double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto sec = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return sec(usage.ru_utime) + sec(usage.ru_stime);
}

IoBytes ProcessIo(const fs::path& proc) {
  IoBytes out;
  std::ifstream in(proc / "io");
  std::string key;
  double value = 0;
  while (in >> key >> value) {
    if (key == "read_bytes:") out.read = value;
    if (key == "write_bytes:") out.written = value;
  }
  return out;
}

std::map<int, ThreadCpu> ThreadTicks() {
  std::map<int, ThreadCpu> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/self/task", ec)) {
    std::ifstream in(e.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 2));
    std::string f;
    long ticks = 0;
    for (int i = 3; i <= 15 && rest >> f; ++i) {
      if (i == 14 || i == 15) ticks += std::stol(f);  // utime, stime
    }
    ThreadCpu cpu;
    cpu.ticks = ticks;
    std::ifstream comm(e.path() / "comm");
    std::getline(comm, cpu.name);
    out[std::stoi(e.path().filename().string())] = std::move(cpu);
  }
  return out;
}

bool SqliteCompress(bool otherwise) {
  const char* v = std::getenv("ATFILL_BENCH_SQLITE_COMPRESS");
  if (v == nullptr || *v == '\0') return otherwise;
  return std::string_view(v) != "0";
}

std::string RecordInsertSql(size_t rows) {
  std::string sql =
      "INSERT INTO atfill_record_rows(did_id, collection_id, rkey, cid, rev, indexed_at, "
      "created_at, record) VALUES ";
  for (size_t k = 0; k < rows; ++k)
    sql += k == 0 ? "(?, ?, ?, ?, ?, ?, ?, ?)" : ", (?, ?, ?, ?, ?, ?, ?, ?)";
  return sql;
}

}  // namespace atfill::bench
