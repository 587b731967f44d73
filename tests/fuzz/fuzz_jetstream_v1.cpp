// Jetstream v1 /subscribe events: the input, and each of its lines, is one event text, decoded
// copied and in place; see jetstream_checks.hpp.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tests/fuzz/jetstream_checks.hpp"

// Each line of the shared captures (production Jetstream v1 output) becomes a seed of its own:
// whole, they are inputs of up to 84 KB that fuzz a hundred times slower.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  for (const char* file : {"internal/subscribe/testdata/golden_v1.jsonl",
                           "internal/corpus/testdata/expected_v1.jsonl"}) {
    const auto text = atfill::fuzz::ReadSharedFile(file);
    if (!text) continue;
    const std::string prefix = std::string_view(file).find("golden") != std::string_view::npos
                                   ? "golden_v1_"
                                   : "expected_v1_";
    size_t i = 0;
    atfill::fuzz::ForEachLine(*text, [&](std::string_view line) {
      atfill::fuzz::WriteSeed(prefix + std::to_string(i++) + ".json", line);
    });
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  atfill::fuzz::DecodeBothWays(text, /*v2=*/false);
  if (text.find('\n') == std::string_view::npos) return 0;
  atfill::fuzz::ForEachLine(
      text, [](std::string_view line) { atfill::fuzz::DecodeBothWays(line, /*v2=*/false); });
  return 0;
}
