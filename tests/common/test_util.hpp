// Helpers shared by the test programs: the third-party data folder and file reading.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>

namespace atfill::testing {

// The folder holding vectors/ and protocols/ (../shared beside the checkout by default; the
// ATFILL_SHARED environment variable overrides it).
std::filesystem::path SharedDir();

// A path below SharedDir(). When the folder is missing the calling test stops: it fails when
// ATFILL_REQUIRE_SHARED=1 (as in CI), otherwise it is skipped with a loud message naming the path.
// Use through ATFILL_SHARED_PATH so the test body returns.
bool SharedAvailable(const std::filesystem::path& relative, std::filesystem::path* out);
// True when ATFILL_REQUIRE_SHARED=1: missing third-party data is then a failure.
bool SharedRequired();

std::string ReadFileOrDie(const std::filesystem::path& path);

// A gate on a condition the code under test offers no hook to wait on (a file appearing, a row
// count, an endpoint's answer, another process's progress): checks `condition` until it holds or
// `timeout` has passed, and says which. The checks start 1 ms apart and spread to `max_step`.
bool WaitUntil(const std::function<bool()>& condition, std::chrono::milliseconds timeout,
               std::chrono::milliseconds max_step = std::chrono::milliseconds(20));

}  // namespace atfill::testing

// Sets `var` (a std::filesystem::path) to SharedDir()/relative, or ends the test as described.
#define ATFILL_SHARED_PATH(var, relative)                                 \
  std::filesystem::path var;                                              \
  if (!::atfill::testing::SharedAvailable((relative), &var)) {            \
    if (::atfill::testing::SharedRequired()) FAIL() << "missing " << var; \
    GTEST_SKIP() << "third-party data missing: " << var;                  \
  }
