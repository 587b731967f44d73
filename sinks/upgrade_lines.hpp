// Internal to sinks/: the lines a sink says while a job waits for an upgrade of its tables (both
// schema modules say them alike; docs/guide.md shows them).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>

namespace atfill::sinks {

// "atfill: KIND: upgrading WHERE from schema version FROM to TO (ROWS), in one transaction".
inline std::string UpgradingLine(std::string_view kind, std::string_view where, int from, int to,
                                 std::string_view rows) {
  return "atfill: " + std::string(kind) + ": upgrading " + std::string(where) +
         " from schema version " + std::to_string(from) + " to " + std::to_string(to) + " (" +
         std::string(rows) + "), in one transaction";
}

// The time since `start`, "12.3 s".
inline std::string SecondsSince(std::chrono::steady_clock::time_point start) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return text;
}

// "atfill: KIND: upgraded WHERE to schema version TO in 12.3 s".
inline std::string UpgradedLine(std::string_view kind, std::string_view where, int to,
                                std::chrono::steady_clock::time_point start) {
  return "atfill: " + std::string(kind) + ": upgraded " + std::string(where) +
         " to schema version " + std::to_string(to) + " in " + SecondsSince(start);
}

}  // namespace atfill::sinks
