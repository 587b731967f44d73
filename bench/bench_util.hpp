// What the benchmark programs share: a scratch folder per process, and the process's memory and
// CPU as /proc and getrusage report them (Linux).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>

namespace atfill::bench {

// A folder of this process's own under the temp directory ("atfill-<name>-<pid>"), created at the
// first call and removed when the process exits. The first call's `name` names it.
std::filesystem::path WorkDir(std::string_view name);

// A "Vm..." field of /proc/self/status ("VmRSS", "VmHWM") in KiB, or -1 when absent.
int64_t StatusKb(std::string_view field);

// The environment variable `name` as an unsigned number, or `otherwise` when it is unset or empty.
uint64_t EnvUint(const char* name, uint64_t otherwise);

// Resets VmHWM to the current RSS (Linux >= 4.0); false when not permitted.
bool ResetPeakRss();

// The process's user + system CPU time so far (threads that ended included), seconds.
double ProcessCpuSeconds();

// Bytes a process made the storage layer read and write (/proc/<pid>/io read_bytes, write_bytes):
// reads the page cache served are not counted, so they show what a table larger than the memory
// it is given costs. `proc` is "/proc/self" or "/proc/<pid>"; zeros when unreadable.
struct IoBytes {
  double read = 0;
  double written = 0;
};
IoBytes ProcessIo(const std::filesystem::path& proc);

// "INSERT INTO atfill_record_rows(did_id, collection_id, rkey, cid, rev, indexed_at, created_at,
// record) VALUES (?, ...)" with `rows` rows of those 8 parameters, as the benchmarks' bare loops
// write the sink's table.
std::string RecordInsertSql(size_t rows);

// Whether the benchmarks' SQLite sinks compress record bodies: ATFILL_BENCH_SQLITE_COMPRESS=0 or 1,
// else `otherwise` (the sink's default).
bool SqliteCompress(bool otherwise);

// Per live thread id: its name (/proc/self/task/*/comm) and the CPU clock ticks it used so far.
struct ThreadCpu {
  std::string name;
  long ticks = 0;
};
std::map<int, ThreadCpu> ThreadTicks();

}  // namespace atfill::bench
