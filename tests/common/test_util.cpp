#include "tests/common/test_util.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

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

}  // namespace atfill::testing
