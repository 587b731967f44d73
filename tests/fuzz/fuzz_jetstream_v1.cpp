// Jetstream v1 /subscribe events: the input, and each of its lines, is one event text (so the
// shared .jsonl captures are seeds as they are), decoded copied and in place; see
// jetstream_checks.hpp.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tests/fuzz/jetstream_checks.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  atfill::fuzz::DecodeBothWays(text, /*v2=*/false);
  if (text.find('\n') == std::string_view::npos) return 0;
  atfill::fuzz::ForEachLine(
      text, [](std::string_view line) { atfill::fuzz::DecodeBothWays(line, /*v2=*/false); });
  return 0;
}
