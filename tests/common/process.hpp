// Running atfill (and other programs) as child processes in tests: real exits, real signals.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace atfill::testing {

struct ProcessResult {
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
  std::string out;     // stdout
  std::string err;     // stderr
};

// A started child; its stdout/stderr go to files in `dir`.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::filesystem::path& dir);
  ~Child();
  pid_t pid() const { return pid_; }
  // Where its stderr goes (readable while it runs).
  const std::filesystem::path& err_path() const { return err_path_; }
  // Sends `sig`; true when the child was still there to receive it.
  bool Kill(int sig);
  // Waits at most `timeout`; on timeout kills it with SIGKILL and says so in err.
  ProcessResult Wait(std::chrono::milliseconds timeout = std::chrono::seconds(120));
  // True while it has not exited (reaps it if it has).
  bool Running();

 private:
  pid_t pid_ = -1;
  std::filesystem::path out_path_;
  std::filesystem::path err_path_;
  bool reaped_ = false;
  int status_ = 0;
};

// Starts and waits.
ProcessResult RunProcess(const std::vector<std::string>& argv, const std::filesystem::path& dir,
                         std::chrono::milliseconds timeout = std::chrono::seconds(120));

// A fresh empty directory under the system temp folder, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

void WriteFile(const std::filesystem::path& path, const std::string& text);

}  // namespace atfill::testing
