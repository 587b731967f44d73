#include "tests/common/test_util.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace atfill::testing {

std::filesystem::path SharedDir() {
  if (const char* env = std::getenv("ATFILL_SHARED"); env != nullptr && *env != '\0') return env;
  return ATFILL_DEFAULT_SHARED_DIR;
}

bool SharedRequired() {
  const char* env = std::getenv("ATFILL_REQUIRE_SHARED");
  return env != nullptr && std::string(env) == "1";
}

bool SharedAvailable(const std::filesystem::path& relative, std::filesystem::path* out) {
  *out = SharedDir() / relative;
  if (std::filesystem::exists(*out)) return true;
  std::fprintf(stderr,
               "\n*** THIRD-PARTY TEST DATA NOT FOUND: %s\n*** Set ATFILL_SHARED to the folder "
               "holding vectors/ and protocols/. This test does not run.\n\n",
               out->c_str());
  return false;
}

std::string ReadFileOrDie(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WaitUntil(const std::function<bool()>& condition, std::chrono::milliseconds timeout,
               std::chrono::milliseconds max_step) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto step = std::chrono::milliseconds(1);
  for (;;) {
    if (condition()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(step, deadline - now));
    step = std::min(step * 2, max_step);
  }
}

}  // namespace atfill::testing
