#include "tests/state/state_test_util.hpp"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "state/kv_store.hpp"

extern char** environ;

namespace atfill::state::testing {
namespace {

constexpr const char* kRoleVar = "ATFILL_STATE_TEST_ROLE";
constexpr const char* kDirVar = "ATFILL_STATE_TEST_DIR";
constexpr const char* kArgVar = "ATFILL_STATE_TEST_ARG";

// gtest prints its own lines on stdout too; the child's replies carry this mark.
constexpr std::string_view kReplyMark = "atfill-child: ";

void Say(const std::string& line) {
  const std::string text = std::string(kReplyMark) + line + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(STDOUT_FILENO, text.data() + done, text.size() - done);
    if (n <= 0) _exit(3);
    done += static_cast<size_t>(n);
  }
}

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n') c = ' ';
  }
  return s;
}

[[noreturn]] void RunHold(const std::string& dir) {
  RocksDbOptions options;
  options.path = dir;
  auto store = OpenRocksDb(options);
  if (!store.ok()) {
    Say("error " + OneLine(store.status().ToString()));
    _exit(2);
  }
  Say("ready");
  char c;
  while (read(STDIN_FILENO, &c, 1) > 0) {
  }
  store->reset();
  _exit(0);
}

[[noreturn]] void RunOpen(const std::string& dir) {
  RocksDbOptions options;
  options.path = dir;
  auto store = OpenRocksDb(options);
  Say(store.ok() ? std::string("ok") : "error " + OneLine(store.status().ToString()));
  if (store.ok()) store->reset();
  _exit(0);
}

[[noreturn]] void RunCrashWriter(const std::string& dir, bool sync) {
  RocksDbOptions options;
  options.path = dir;
  options.sync = sync;
  auto opened = OpenRocksDb(options);
  if (!opened.ok()) {
    Say("error " + OneLine(opened.status().ToString()));
    _exit(2);
  }
  KvStore& kv = **opened;
  const std::string filler(512, 'x');
  uint64_t first = 1;
  auto last = kv.Get(Family::kCursors, "crash-last");
  if (last.ok() && last->has_value()) first = std::stoull(**last) + 1;
  for (uint64_t i = first;; ++i) {
    WriteBatch batch;
    const std::string value = std::to_string(i) + "/" + filler;
    for (int f = 0; f < kFamilyCount; ++f) {
      batch.Put(static_cast<Family>(f), "crash/" + std::to_string(1000000000 + i), value);
    }
    batch.Add(Family::kQueue, "crash-count", 1);
    batch.Put(Family::kCursors, "crash-last", std::to_string(i));
    if (auto st = kv.Write(batch); !st.ok()) {
      Say("error " + OneLine(st.ToString()));
      _exit(2);
    }
    Say(std::to_string(i));
  }
}

// Runs inside RUN_ALL_TESTS, after every static object (RocksDB's included) is constructed; in
// a child started by Child::Spawn it plays its role and exits without running any test.
class ChildRoleEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* role = getenv(kRoleVar);
    if (role == nullptr) return;
    const std::string dir = getenv(kDirVar) ? getenv(kDirVar) : "";
    const std::string arg = getenv(kArgVar) ? getenv(kArgVar) : "";
    const std::string r = role;
    if (r == "hold") RunHold(dir);
    if (r == "open") RunOpen(dir);
    if (r == "crash_writer") RunCrashWriter(dir, arg == "sync");
    Say("error unknown role " + r);
    _exit(2);
  }
};

[[maybe_unused]] ::testing::Environment* const kChildRole =
    ::testing::AddGlobalTestEnvironment(new ChildRoleEnvironment);

}  // namespace

TempDir::TempDir() {
  std::string pattern = "/tmp/atfill-state-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed: " << std::strerror(errno);
  }
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::unique_ptr<Child> Child::Spawn(const std::string& role, const std::string& dir,
                                    const std::string& arg) {
  int to_child[2];
  int from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return nullptr;
  }
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.starts_with("ATFILL_STATE_TEST_")) continue;
    env_strings.emplace_back(entry);
  }
  env_strings.push_back(std::string(kRoleVar) + "=" + role);
  env_strings.push_back(std::string(kDirVar) + "=" + dir);
  env_strings.push_back(std::string(kArgVar) + "=" + arg);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  std::vector<char*> argv = {exe.data(), nullptr};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
  for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) {
    posix_spawn_file_actions_addclose(&actions, fd);
  }
  auto child = std::unique_ptr<Child>(new Child());
  const int rc =
      posix_spawn(&child->pid_, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(to_child[0]);
  close(from_child[1]);
  child->in_fd_ = to_child[1];
  child->out_fd_ = from_child[0];
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn: " << std::strerror(rc);
    child->pid_ = -1;
    child->waited_ = true;
  }
  return child;
}

Child::~Child() {
  if (in_fd_ >= 0) close(in_fd_);
  if (!waited_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
}

std::string Child::ReadLine() {
  while (true) {
    std::string line;
    bool eof = false;
    while (true) {
      pollfd p{out_fd_, POLLIN, 0};
      const int ready = poll(&p, 1, 60000);
      if (ready <= 0) {
        ADD_FAILURE() << "no output from child " << pid_ << " within 60 s";
        return "";
      }
      char c;
      const ssize_t n = read(out_fd_, &c, 1);
      if (n <= 0) {
        eof = true;
        break;
      }
      if (c == '\n') break;
      line.push_back(c);
    }
    if (line.starts_with(kReplyMark)) return line.substr(kReplyMark.size());
    if (eof) return "";
  }
}

void Child::CloseStdin() {
  if (in_fd_ >= 0) close(in_fd_);
  in_fd_ = -1;
}

void Child::Kill(int signal) {
  if (pid_ > 0 && !waited_) kill(pid_, signal);
}

int Child::Wait() {
  int status = 0;
  if (!waited_ && pid_ > 0) {
    waitpid(pid_, &status, 0);
    waited_ = true;
  }
  return status;
}

}  // namespace atfill::state::testing
