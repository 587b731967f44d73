// Jetstream v2 subscribeEvents text frames: the input, and each of its lines, is one frame, decoded
// copied and in place; see jetstream_checks.hpp.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tests/fuzz/jetstream_checks.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  atfill::fuzz::DecodeBothWays(text, /*v2=*/true);
  if (text.find('\n') == std::string_view::npos) return 0;
  atfill::fuzz::ForEachLine(
      text, [](std::string_view line) { atfill::fuzz::DecodeBothWays(line, /*v2=*/true); });
  return 0;
}
