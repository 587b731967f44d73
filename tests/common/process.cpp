#include "tests/common/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

namespace atfill::testing {
namespace {

std::string Slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::atomic<int> g_child_counter{0};

}  // namespace

Child::Child(const std::vector<std::string>& argv, const std::filesystem::path& dir) {
  const int n = g_child_counter.fetch_add(1);
  out_path_ = dir / ("child" + std::to_string(n) + ".out");
  err_path_ = dir / ("child" + std::to_string(n) + ".err");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    const int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in = ::open("/dev/null", O_RDONLY);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::dup2(in, 0);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
}

Child::~Child() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
  }
}

bool Child::Kill(int sig) {
  if (reaped_ || pid_ <= 0) return false;
  if (!Running()) return false;
  return ::kill(pid_, sig) == 0;
}

bool Child::Running() {
  if (reaped_) return false;
  const pid_t r = ::waitpid(pid_, &status_, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    return false;
  }
  return true;
}

ProcessResult Child::Wait(std::chrono::milliseconds timeout) {
  ProcessResult result;
  bool timed_out = false;
  if (!reaped_) {
    // A pidfd becomes readable when the child exits: one bounded wait, no polling.
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    if (fd < 0) {
      std::fprintf(stderr, "[test harness] pidfd_open(%d): %s\n", static_cast<int>(pid_),
                   std::strerror(errno));
      std::abort();
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{fd, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
      if (r < 0 && errno == EINTR) continue;
      break;
    }
    ::close(fd);
    if (::waitpid(pid_, &status_, WNOHANG) != pid_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status_, 0);
      timed_out = true;
    }
    reaped_ = true;
  }
  if (WIFEXITED(status_)) result.exit_code = WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) result.signal = WTERMSIG(status_);
  result.out = Slurp(out_path_);
  result.err = Slurp(err_path_);
  if (timed_out) result.err += "\n[test harness: killed after the timeout]";
  return result;
}

ProcessResult RunProcess(const std::vector<std::string>& argv, const std::filesystem::path& dir,
                         std::chrono::milliseconds timeout) {
  Child child(argv, dir);
  return child.Wait(timeout);
}

TempDir::TempDir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() /
          ("atfill-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

}  // namespace atfill::testing
