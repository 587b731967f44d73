// Shared by the state tests: a fresh temp directory per test, the two KvStore backends for the
// conformance suites, and child processes (this test binary re-executed) for lock and crash tests.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <string>

#include "state/kv_store.hpp"

namespace atfill::state::testing {

// A new empty directory under /tmp, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

struct MemoryBackend {
  static constexpr bool kPersistent = false;
  static Result<std::unique_ptr<KvStore>> Open(const std::filesystem::path&) {
    return NewMemoryKvStore();
  }
};

struct RocksDbBackend {
  static constexpr bool kPersistent = true;
  static Result<std::unique_ptr<KvStore>> Open(const std::filesystem::path& dir) {
    RocksDbOptions options;
    options.path = (dir / "state").string();
    return OpenRocksDb(options);
  }
};

using Backends = ::testing::Types<MemoryBackend, RocksDbBackend>;

struct BackendNames {
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, MemoryBackend> ? "Memory" : "RocksDb";
  }
};

// One store per test, in its own temp directory.
template <typename Backend>
class StoreFixture : public ::testing::Test {
 protected:
  void SetUp() override { OpenStore(); }
  void TearDown() override { store_.reset(); }
  void OpenStore() {
    auto opened = Backend::Open(dir_.path());
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    store_ = std::move(opened).value();
  }
  KvStore& kv() { return *store_; }

  TempDir dir_;
  std::unique_ptr<KvStore> store_;
};

// This test binary started again in a child role (see state_test_util.cpp), with its stdin and
// stdout on pipes.
class Child {
 public:
  // Roles: "hold" opens `dir`, prints "ready", and holds it until stdin closes; "open" tries to
  // open `dir` and prints "ok" or "error <message>"; "crash_writer" commits numbered batches
  // forever, printing each number after its Write returns (arg "sync" or "nosync").
  static std::unique_ptr<Child> Spawn(const std::string& role, const std::string& dir,
                                      const std::string& arg = "");
  ~Child();
  pid_t pid() const { return pid_; }
  // The next reply line of the child (lines gtest itself prints are skipped), without the
  // newline; empty on EOF. Fails the test if nothing arrives within a minute.
  std::string ReadLine();
  void CloseStdin();
  void Kill(int signal);
  // Waits for the child and returns the raw waitpid status.
  int Wait();

 private:
  pid_t pid_ = -1;
  int in_fd_ = -1;
  int out_fd_ = -1;
  bool waited_ = false;
};

}  // namespace atfill::state::testing
