// The created and updated records of a file of Jetstream v1 event lines (the production corpus
// and the golden captures in ../shared), for tests that check every real record.
#pragma once

#include <simdjson.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace atfill::testing {

// Calls fn(commit) with each create or update commit object of `path`, parsed with `parser`
// (valid until the next line).
template <typename Fn>
void ForEachRecordCommit(const std::filesystem::path& path, simdjson::dom::parser& parser,
                         Fn&& fn) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    simdjson::dom::element event;
    if (parser.parse(line).get(event) != simdjson::SUCCESS) continue;
    simdjson::dom::element commit;
    if (event["commit"].get(commit) != simdjson::SUCCESS) continue;
    std::string_view op;
    if (commit["operation"].get_string().get(op) != simdjson::SUCCESS) continue;
    if (op != "create" && op != "update") continue;
    fn(commit);
  }
}

}  // namespace atfill::testing
